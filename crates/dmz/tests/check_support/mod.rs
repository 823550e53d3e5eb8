//! Test-only in-memory host-managed zoned device (sparse, 4 KiB blocks), with the rules a
//! drive enforces: no I/O across a zone end, sequential writes only at the write pointer,
//! reads past the write pointer return zeros. Shared by the format_* and check_* tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;

use zbd::{Geometry, Result, ZbdError, Zone, ZoneCondition, ZoneOp, ZoneType, ZonedDevice};

pub const B: usize = 4096;

pub struct MemDevice {
    geo: Geometry,
    inner: Mutex<Inner>,
}

struct Inner {
    zones: Vec<Zone>,
    blocks: HashMap<u64, Box<[u8; B]>>,
    flushes: u64,
}

impl MemDevice {
    /// `nr_zones` zones of `zone_blocks` 4 KiB blocks; the first `nr_conv` conventional.
    pub fn new(nr_zones: u32, zone_blocks: u64, nr_conv: u32) -> MemDevice {
        let zs = zone_blocks * B as u64;
        let zones = (0..nr_zones)
            .map(|i| {
                let conv = i < nr_conv;
                Zone {
                    id: i,
                    start: i as u64 * zs,
                    len: zs,
                    capacity: zs,
                    wp: i as u64 * zs,
                    zone_type: if conv {
                        ZoneType::Conventional
                    } else {
                        ZoneType::SeqWriteRequired
                    },
                    cond: if conv {
                        ZoneCondition::NotWp
                    } else {
                        ZoneCondition::Empty
                    },
                }
            })
            .collect();
        MemDevice {
            geo: Geometry {
                zone_size: zs,
                zone_capacity: zs,
                nr_zones,
                block_size: 4096,
                max_open_zones: 0,
                max_active_zones: 0,
            },
            inner: Mutex::new(Inner {
                zones,
                blocks: HashMap::new(),
                flushes: 0,
            }),
        }
    }

    /// The vector device: 24 zones of 64 MiB, 8 conventional.
    pub fn vector() -> MemDevice {
        MemDevice::new(24, 16384, 8)
    }

    /// A small device for fast tests: 16 zones of 1 MiB, 4 conventional.
    pub fn small() -> MemDevice {
        MemDevice::new(16, 256, 4)
    }

    pub fn flushes(&self) -> u64 {
        self.inner.lock().unwrap().flushes
    }

    pub fn set_cond(&self, zone: u32, cond: ZoneCondition) {
        self.inner.lock().unwrap().zones[zone as usize].cond = cond;
    }

    pub fn zone(&self, zone: u32) -> Zone {
        self.inner.lock().unwrap().zones[zone as usize]
    }

    /// Overwrite bytes anywhere, ignoring zone rules (corruption injection).
    pub fn poke(&self, offset: u64, data: &[u8]) {
        let mut g = self.inner.lock().unwrap();
        for (i, &b) in data.iter().enumerate() {
            let off = offset + i as u64;
            let blk = g
                .blocks
                .entry(off / B as u64)
                .or_insert_with(|| Box::new([0; B]));
            blk[(off % B as u64) as usize] = b;
        }
    }

    pub fn peek(&self, offset: u64, len: usize) -> Vec<u8> {
        let g = self.inner.lock().unwrap();
        (0..len as u64)
            .map(|i| {
                let off = offset + i;
                g.blocks
                    .get(&(off / B as u64))
                    .map_or(0, |b| b[(off % B as u64) as usize])
            })
            .collect()
    }

    fn check(&self, g: &Inner, offset: u64, len: usize) -> Result<usize> {
        if !offset.is_multiple_of(B as u64) || !len.is_multiple_of(B) || len == 0 {
            return Err(ZbdError::Invalid(format!("unaligned {offset}+{len}")));
        }
        let z = (offset / self.geo.zone_size) as usize;
        if z >= g.zones.len() || (offset + len as u64 - 1) / self.geo.zone_size != z as u64 {
            return Err(ZbdError::Invalid(format!(
                "{offset}+{len} crosses a zone end"
            )));
        }
        Ok(z)
    }
}

impl ZonedDevice for MemDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn report_zones(&self, first: u32, nr: u32) -> Result<Vec<Zone>> {
        let g = self.inner.lock().unwrap();
        Ok(g.zones
            .iter()
            .skip(first as usize)
            .take(nr as usize)
            .copied()
            .collect())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let g = self.inner.lock().unwrap();
        let z = self.check(&g, offset, buf.len())?;
        let zone = g.zones[z];
        for (i, chunk) in buf.chunks_mut(B).enumerate() {
            let off = offset + (i * B) as u64;
            let past_wp = zone.zone_type.is_sequential() && off >= zone.wp;
            match g.blocks.get(&(off / B as u64)) {
                Some(b) if !past_wp => chunk.copy_from_slice(&b[..]),
                _ => chunk.fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let mut g = self.inner.lock().unwrap();
        let z = self.check(&g, offset, buf.len())?;
        let zone = g.zones[z];
        if matches!(zone.cond, ZoneCondition::Offline | ZoneCondition::ReadOnly) {
            return Err(ZbdError::device("write to unusable zone", libc::EIO));
        }
        if zone.zone_type.is_sequential() && offset != zone.wp {
            return Err(ZbdError::device(
                format!("unaligned write at {offset}, wp {}", zone.wp),
                libc::EIO,
            ));
        }
        for (i, chunk) in buf.chunks(B).enumerate() {
            let mut b = Box::new([0u8; B]);
            b.copy_from_slice(chunk);
            g.blocks.insert(offset / B as u64 + i as u64, b);
        }
        if zone.zone_type.is_sequential() {
            let zw = &mut g.zones[z];
            zw.wp += buf.len() as u64;
            zw.cond = if zw.wp == zw.start + zw.len {
                ZoneCondition::Full
            } else {
                ZoneCondition::ImplicitOpen
            };
        }
        Ok(())
    }

    fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> Result<()> {
        let mut g = self.inner.lock().unwrap();
        let zs = self.geo.zone_blocks();
        let z = g
            .zones
            .get_mut(zone as usize)
            .ok_or_else(|| ZbdError::Invalid(format!("zone {zone}")))?;
        if !z.zone_type.is_sequential() {
            return Err(ZbdError::device(
                "zone op on conventional zone",
                libc::EINVAL,
            ));
        }
        match op {
            ZoneOp::Reset => {
                z.wp = z.start;
                z.cond = ZoneCondition::Empty;
                let first = zone as u64 * zs;
                for b in first..first + zs {
                    g.blocks.remove(&b);
                }
            }
            ZoneOp::Finish => {
                z.wp = z.start + z.len;
                z.cond = ZoneCondition::Full;
            }
            ZoneOp::Open => z.cond = ZoneCondition::ExplicitOpen,
            ZoneOp::Close => {
                z.cond = if z.wp == z.start {
                    ZoneCondition::Empty
                } else {
                    ZoneCondition::Closed
                }
            }
        }
        Ok(())
    }

    fn reset_all(&self) -> Result<()> {
        let seq: Vec<u32> = self
            .report_all()?
            .iter()
            .filter(|z| {
                z.zone_type.is_sequential()
                    && !matches!(z.cond, ZoneCondition::Offline | ZoneCondition::ReadOnly)
            })
            .map(|z| z.id)
            .collect();
        for z in seq {
            self.zone_mgmt(ZoneOp::Reset, z)?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.inner.lock().unwrap().flushes += 1;
        Ok(())
    }

    fn describe(&self) -> String {
        "in-memory test device".into()
    }
}
