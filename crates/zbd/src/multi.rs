//! dm-zoned's multi-device volume as one [`ZonedDevice`]: a regular cache device (member 0,
//! conventional zones, see [`crate::RegularDevice`]) followed by one or more zoned drives,
//! in one zone address space (reference §1.1, §3.5).
//!
//! Member `i` starts at zone `first_zone(i)` = the zones of members `0..i` (the cache
//! device's trailing runt zone included, as the kernel counts it). A zone never spans two
//! members, so every request goes to exactly one member, translated by its zone offset.
//!
//! Flush: each member remembers whether it took a write (or a zone reset) since its last
//! flush; [`ZonedDevice::flush`] flushes exactly those members (in parallel: the first on the
//! caller's thread, each other one on its member's flush thread, started at its first
//! parallel flush and blocked on its channel in between), so after it
//! every completed write on every drive is durable; [`ZonedDevice::flush_member`] flushes
//! one. The engine's one flush point before each metadata commit therefore also flushes the
//! zoned drives its new metadata points into (the kernel flushes only the metadata device,
//! reference §5).
//!
//! Read source: the cache device's, when it has one (an `O_DIRECT` block device), limited to
//! the cache's bytes ([`ReadSource::end`]): the frontend's queue threads then read and write
//! cache zones themselves. Those writes bypass the dirty flags, so a volume that hands out
//! the source flushes its cache device at every [`ZonedDevice::flush`] (where the engine's
//! metadata, always on the cache, has nearly always made it dirty anyway).

use crate::{
    Geometry, Member, ReadSource, Result, ZbdError, Zone, ZoneCondition, ZoneOp, ZonedDevice,
};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::thread::JoinHandle;

/// A flush request to a member's flush thread: where to send the result.
type FlushReply = mpsc::SyncSender<Result<()>>;

/// A member's flush thread: it flushes its member once per request, and ends when its
/// sender is dropped (with the volume).
struct Helper {
    tx: mpsc::Sender<FlushReply>,
    thread: JoinHandle<()>,
}

struct Part {
    dev: Arc<dyn ZonedDevice>,
    first_zone: u32,
    nr_zones: u32,
    /// Wrote or reset since the last successful flush.
    dirty: AtomicBool,
    /// Written through the volume's read source, behind `dirty`'s back: flushed every time.
    unseen_writes: bool,
    /// Held from clearing `dirty` to the end of the device flush, so that a concurrent
    /// flush which finds `dirty` cleared waits for the flush that cleared it instead of
    /// returning before those writes are durable.
    flushing: Mutex<()>,
}

impl Part {
    /// Dirty, or being flushed by another caller (whose flush this one must wait for).
    /// `dirty` is read before the lock: a flush takes the lock before it clears `dirty`, so
    /// "clean and unlocked" means every flush that cleared it has ended.
    fn needs_flush(&self) -> bool {
        self.unseen_writes || self.dirty.load(Ordering::Acquire) || self.flushing.is_locked()
    }
}

/// A cache device and zoned drives as one device (see the module docs).
pub struct MultiDevice {
    parts: Vec<Arc<Part>>,
    /// Each member's flush thread, started at its first parallel flush; `None` inside if it
    /// could not start (the member is then flushed on the caller's thread).
    helpers: Vec<OnceLock<Option<Helper>>>,
    geo: Geometry,
    /// The cache device's read source, up to the end of its last usable zone.
    source: Option<ReadSource>,
}

impl MultiDevice {
    /// Composes `cache` (every zone conventional, or offline) and `zoned` (each with
    /// sequential zones, all of one zone size, which must be the cache's zone size).
    pub fn new(cache: Arc<dyn ZonedDevice>, zoned: Vec<Arc<dyn ZonedDevice>>) -> Result<Self> {
        if zoned.is_empty() {
            return Err(ZbdError::Open(
                "a multi-device volume needs at least one zoned drive".into(),
            ));
        }
        let cg = cache.geometry();
        let cache_zones = cache.report_all()?;
        if cache_zones.iter().any(|z| z.zone_type.is_sequential()) {
            return Err(ZbdError::Open(format!(
                "{} is a zoned device: the cache must be a regular device or file",
                cache.describe()
            )));
        }
        let mut geo = Geometry { ..cg };
        // The runt zone at the cache's end is offline: the source stops before it.
        let usable_end = cache_zones
            .iter()
            .filter(|z| z.cond != ZoneCondition::Offline)
            .map(|z| z.start + z.len)
            .max()
            .unwrap_or(0);
        let source = cache
            .read_source()
            .filter(|s| s.direct && s.whole())
            .map(|s| ReadSource {
                end: Some(usable_end),
                seq_writes: false,
                ..s
            });
        let mut parts = vec![Arc::new(Part {
            first_zone: 0,
            nr_zones: cg.nr_zones,
            dev: cache,
            dirty: AtomicBool::new(false),
            unseen_writes: source.is_some(),
            flushing: Mutex::new(()),
        })];
        let mut next = cg.nr_zones;
        for d in zoned {
            let g = d.geometry();
            if g.zone_size != cg.zone_size {
                return Err(ZbdError::Open(format!(
                    "{}: zone size {} bytes differs from the cache's {} (every drive of a \
                     volume needs the same zone size)",
                    d.describe(),
                    g.zone_size,
                    cg.zone_size
                )));
            }
            if !d.report_all()?.iter().any(|z| z.zone_type.is_sequential()) {
                return Err(ZbdError::Open(format!(
                    "{} has no sequential zones: a regular device cannot be a zoned drive \
                     (give it as the cache)",
                    d.describe()
                )));
            }
            geo.zone_capacity = geo.zone_capacity.min(g.zone_capacity);
            geo.block_size = geo.block_size.max(g.block_size);
            geo.max_open_zones = min_limit(geo.max_open_zones, g.max_open_zones);
            geo.max_active_zones = min_limit(geo.max_active_zones, g.max_active_zones);
            let nr = g.nr_zones;
            parts.push(Arc::new(Part {
                first_zone: next,
                nr_zones: nr,
                dev: d,
                dirty: AtomicBool::new(false),
                unseen_writes: false,
                flushing: Mutex::new(()),
            }));
            next = next
                .checked_add(nr)
                .ok_or_else(|| ZbdError::Open("too many zones for 32-bit zone ids".into()))?;
        }
        geo.nr_zones = next;
        let helpers = parts.iter().map(|_| OnceLock::new()).collect();
        Ok(MultiDevice {
            parts,
            helpers,
            geo,
            source,
        })
    }

    /// The member holding zone `zone` and the zone's number on it.
    fn part_of_zone(&self, zone: u32) -> Result<(&Part, u32)> {
        let i = self.parts.partition_point(|p| p.first_zone <= zone);
        match i.checked_sub(1).map(|i| &self.parts[i]) {
            Some(p) if zone < p.first_zone + p.nr_zones => Ok((p, zone - p.first_zone)),
            _ => Err(ZbdError::Invalid(format!("zone {zone} does not exist"))),
        }
    }

    /// The member holding byte `offset` and the offset on it.
    fn part_of(&self, offset: u64) -> Result<(&Part, u64)> {
        let (p, _) = self.part_of_zone(self.geo.zone_of(offset))?;
        Ok((p, offset - self.geo.zone_start(p.first_zone)))
    }

    /// Member `i`'s flush thread, started now if it is not yet.
    fn helper(&self, i: usize) -> Option<&Helper> {
        self.helpers[i]
            .get_or_init(|| {
                let (tx, rx) = mpsc::channel::<FlushReply>();
                let part = Arc::clone(&self.parts[i]);
                let thread = std::thread::Builder::new()
                    .name("zbd-flush".into())
                    .spawn(move || {
                        for reply in rx {
                            // The caller may have gone (it never does before replies).
                            let _ = reply.send(Self::flush_part(&part));
                        }
                    })
                    .ok()?;
                Some(Helper { tx, thread })
            })
            .as_ref()
    }

    fn flush_part(p: &Part) -> Result<()> {
        let _flushing = p.flushing.lock();
        if !p.dirty.swap(false, Ordering::AcqRel) && !p.unseen_writes {
            return Ok(());
        }
        p.dev
            .flush()
            .inspect_err(|_| p.dirty.store(true, Ordering::Release))
    }
}

impl Drop for MultiDevice {
    /// Ends the flush threads and waits for them, so that no member outlives the volume
    /// (a device reopened right after must not find it still open).
    fn drop(&mut self) {
        for h in &mut self.helpers {
            if let Some(Some(h)) = h.take() {
                drop(h.tx);
                let _ = h.thread.join();
            }
        }
    }
}

/// The tighter of two limits where 0 means none.
fn min_limit(a: u32, b: u32) -> u32 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

fn shift(mut z: Zone, p: &Part, zone_size: u64) -> Zone {
    let base = p.first_zone as u64 * zone_size;
    z.id += p.first_zone;
    z.start += base;
    z.wp += base;
    z
}

impl ZonedDevice for MultiDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn report_zones(&self, first: u32, nr: u32) -> Result<Vec<Zone>> {
        let end = first.saturating_add(nr).min(self.geo.nr_zones);
        let mut out = Vec::with_capacity(end.saturating_sub(first) as usize);
        let mut z = first;
        while z < end {
            let (p, local) = self.part_of_zone(z)?;
            let n = (p.nr_zones - local).min(end - z);
            for zone in p.dev.report_zones(local, n)? {
                out.push(shift(zone, p, self.geo.zone_size));
            }
            z += n;
        }
        Ok(out)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let (p, off) = self.part_of(offset)?;
        p.dev.read_at(buf, off)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let (p, off) = self.part_of(offset)?;
        // Dirty before the write: a flush that starts after the write completes sees it.
        p.dirty.store(true, Ordering::Release);
        p.dev.write_at(buf, off)
    }

    fn writev_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        let (p, off) = self.part_of(offset)?;
        p.dirty.store(true, Ordering::Release);
        p.dev.writev_at(bufs, off)
    }

    fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> Result<()> {
        let (p, local) = self.part_of_zone(zone)?;
        p.dirty.store(true, Ordering::Release);
        p.dev.zone_mgmt(op, local)
    }

    fn reset_all(&self) -> Result<()> {
        for p in &self.parts[1..] {
            p.dirty.store(true, Ordering::Release);
            p.dev.reset_all()?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let dirty: Vec<usize> = (0..self.parts.len())
            .filter(|&i| self.parts[i].needs_flush())
            .collect();
        let Some((&first, others)) = dirty.split_first() else {
            return Ok(());
        };
        // Drives flush in parallel: a flush of an SMR drive can take tens of milliseconds.
        // The others go to their flush threads (a thread started per flush cost more than a
        // memory device's whole flush in the VM), the first is flushed here meanwhile.
        let (reply, results) = mpsc::sync_channel(others.len());
        let mut result = Ok(());
        let mut asked = 0;
        for &i in others {
            match self.helper(i) {
                Some(h) if h.tx.send(reply.clone()).is_ok() => asked += 1,
                _ => result = result.and(Self::flush_part(&self.parts[i])),
            }
        }
        // Only the flush threads hold senders now: one that ends without replying (a panic
        // in a device's flush) ends `recv` with an error instead of a wait without end.
        drop(reply);
        result = Self::flush_part(&self.parts[first]).and(result);
        for _ in 0..asked {
            let r = results.recv().unwrap_or_else(|_| {
                Err(ZbdError::device("a member's flush thread ended", libc::EIO))
            });
            result = result.and(r);
        }
        result
    }

    fn flush_member(&self, index: usize) -> Result<()> {
        let p = self
            .parts
            .get(index)
            .ok_or_else(|| ZbdError::Invalid(format!("member {index} does not exist")))?;
        Self::flush_part(p)
    }

    fn describe(&self) -> String {
        let names: Vec<String> = self.parts[1..].iter().map(|p| p.dev.describe()).collect();
        format!(
            "cache {} + zoned {}",
            self.parts[0].dev.describe(),
            names.join(", ")
        )
    }

    fn members(&self) -> Vec<Member> {
        self.parts
            .iter()
            .enumerate()
            .map(|(i, p)| Member {
                index: i,
                name: p.dev.describe(),
                first_zone: p.first_zone,
                nr_zones: p.nr_zones,
                cache: i == 0,
            })
            .collect()
    }

    fn set_zone_condition(&self, zone: u32, cond: ZoneCondition) -> Result<()> {
        let (p, local) = self.part_of_zone(zone)?;
        p.dev.set_zone_condition(local, cond)
    }

    /// The cache device's, limited to its usable zones (see the module docs). The cache
    /// is member 0, at volume offset 0, so its offsets are the volume's.
    fn read_source(&self) -> Option<ReadSource> {
        self.source
    }
}
