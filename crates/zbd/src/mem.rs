//! A RAM-backed host-managed device for fast tests: the same zone rules as
//! [`crate::Emulated`] (shared state machine), no file.
//!
//! A sequential zone keeps its data as one `Vec` from the zone start to the write pointer
//! (writes only append), a conventional zone a sparse map of 4 KiB blocks. A reset frees the
//! zone's memory. [`MemDevice::snapshot`] copies the whole device as it would come back
//! after a power cycle with nothing lost (open zones closed).

use crate::options::EmulateOptions;
use crate::state::{check_io, ZoneStates};
use crate::{Geometry, Result, ZbdError, Zone, ZoneCondition, ZoneOp, ZonedDevice, BLOCK_SIZE};
use parking_lot::Mutex;
use std::collections::HashMap;

#[derive(Clone)]
enum ZoneData {
    /// Bytes from the zone start; never longer than the write pointer.
    Seq(Vec<u8>),
    /// Written blocks by index within the zone.
    Conv(HashMap<u64, Box<[u8]>>),
}

/// A host-managed zoned device in memory.
pub struct MemDevice {
    geo: Geometry,
    nr_conv: u32,
    state: Mutex<ZoneStates>,
    /// Per-zone data; its lock also serialises writes and zone operations on the zone.
    data: Vec<Mutex<ZoneData>>,
}

impl MemDevice {
    /// A device shaped by `opts` (`force` is ignored). Any power-of-two zone size of at
    /// least 4096 bytes is accepted.
    pub fn new(opts: &EmulateOptions) -> Result<MemDevice> {
        let (geo, nr_conv) = opts.geometry(BLOCK_SIZE)?;
        Ok(Self::from_state(ZoneStates::fresh(geo, nr_conv), None))
    }

    /// `nr_zones` zones of `zone_size` bytes, the first `nr_conv` conventional, no
    /// open/active limits.
    pub fn with_zones(zone_size: u64, nr_zones: u32, nr_conv: u32) -> Result<MemDevice> {
        let mut o = EmulateOptions::new(zone_size * nr_zones as u64, zone_size);
        o.conventional = nr_conv;
        o.max_open = 0;
        Self::new(&o)
    }

    fn from_state(state: ZoneStates, data: Option<Vec<ZoneData>>) -> MemDevice {
        let geo = state.geo;
        let nr_conv = state.nr_conv;
        let data = data.unwrap_or_else(|| {
            (0..geo.nr_zones)
                .map(|z| {
                    if z < nr_conv {
                        ZoneData::Conv(HashMap::new())
                    } else {
                        ZoneData::Seq(Vec::new())
                    }
                })
                .collect()
        });
        MemDevice {
            geo,
            nr_conv,
            state: Mutex::new(state),
            data: data.into_iter().map(Mutex::new).collect(),
        }
    }

    /// Number of conventional zones (zones `0..n`).
    pub fn nr_conventional(&self) -> u32 {
        self.nr_conv
    }

    /// A copy of the device as it would be found after a clean power cycle: same data and
    /// write pointers, open zones closed.
    pub fn snapshot(&self) -> MemDevice {
        // Lock every zone so no write is half done, then the state.
        let guards: Vec<_> = self.data.iter().map(|d| d.lock()).collect();
        let st = self.state.lock();
        let state = ZoneStates::new(st.geo, st.nr_conv, st.zones.clone());
        let data = guards.iter().map(|g| (**g).clone()).collect();
        Self::from_state(state, Some(data))
    }

    /// Test hook: force a zone read-only or offline (or back to empty / not-wp).
    pub fn set_condition(&self, zone: u32, cond: ZoneCondition) -> Result<()> {
        let mut d = self.zone_data(zone)?;
        self.state.lock().set_condition(zone, cond)?;
        if cond == ZoneCondition::Empty {
            *d = ZoneData::Seq(Vec::new());
        }
        Ok(())
    }

    fn zone_data(&self, zone: u32) -> Result<parking_lot::MutexGuard<'_, ZoneData>> {
        self.data
            .get(zone as usize)
            .map(|d| d.lock())
            .ok_or_else(|| ZbdError::Invalid(format!("zone {zone} does not exist")))
    }

    fn write_bufs(&self, bufs: &[&[u8]], offset: u64, len: u64) -> Result<()> {
        let z = check_io(&self.geo, offset, len, "write")?;
        if len == 0 {
            return Ok(());
        }
        let rel = offset - self.geo.zone_start(z);
        let mut d = self.data[z as usize].lock();
        self.state.lock().prepare_write(z, rel, len)?;
        match &mut *d {
            ZoneData::Seq(v) => {
                // A finish may have moved the write pointer past the stored bytes; writes
                // only happen at the write pointer of a non-full zone, so `rel` >= len.
                v.resize(rel as usize, 0);
                for b in bufs {
                    v.extend_from_slice(b);
                }
            }
            ZoneData::Conv(map) => {
                let mut blk = rel / BLOCK_SIZE;
                for b in bufs {
                    for chunk in b.chunks(BLOCK_SIZE as usize) {
                        map.insert(blk, chunk.into());
                        blk += 1;
                    }
                }
            }
        }
        self.state.lock().complete_write(z, len);
        Ok(())
    }
}

impl ZonedDevice for MemDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn report_zones(&self, first: u32, nr: u32) -> Result<Vec<Zone>> {
        Ok(self.state.lock().report(first, nr))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        let z = check_io(&self.geo, offset, len, "read")?;
        if len == 0 {
            return Ok(());
        }
        let rel = offset - self.geo.zone_start(z);
        let d = self.data[z as usize].lock();
        let limit = self.state.lock().read_limit(z)?;
        match &*d {
            ZoneData::Seq(v) => {
                let avail = limit.min(v.len() as u64);
                let n = avail.saturating_sub(rel).min(len) as usize;
                if n > 0 {
                    buf[..n].copy_from_slice(&v[rel as usize..rel as usize + n]);
                }
                buf[n..].fill(0);
            }
            ZoneData::Conv(map) => {
                for (i, chunk) in buf.chunks_mut(BLOCK_SIZE as usize).enumerate() {
                    match map.get(&(rel / BLOCK_SIZE + i as u64)) {
                        Some(b) => chunk.copy_from_slice(b),
                        None => chunk.fill(0),
                    }
                }
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_bufs(&[buf], offset, buf.len() as u64)
    }

    fn writev_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.write_bufs(bufs, offset, len)
    }

    fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> Result<()> {
        let mut d = self.zone_data(zone)?;
        let ch = self.state.lock().mgmt(op, zone)?;
        if op == ZoneOp::Reset && !ch.is_empty() {
            *d = ZoneData::Seq(Vec::new());
        }
        Ok(())
    }

    fn reset_all(&self) -> Result<()> {
        let zones = self.state.lock().zones_to_reset();
        for z in zones {
            self.zone_mgmt(ZoneOp::Reset, z)?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "RAM device ({} zones of {})",
            self.geo.nr_zones,
            crate::options::fmt_size(self.geo.zone_size)
        )
    }

    fn set_zone_condition(&self, zone: u32, cond: ZoneCondition) -> Result<()> {
        self.set_condition(zone, cond)
    }
}
