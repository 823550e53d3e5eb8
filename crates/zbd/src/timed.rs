//! [`TimedDevice`]: any [`ZonedDevice`] on the `hdd` timing model's clock, for benchmarks
//! that call the device directly (the engine in a host bench): each data call does its I/O
//! on the wrapped device, then blocks until the model says a 7200 rpm SMR drive would have
//! completed it (`frontend::zoned` does the same for `zonedd expose` without blocking a
//! thread). Zone resets discard the zone's data from the model's write cache, as the
//! exposed device does.

use crate::timing::{HddClock, HddReport, ReqKind};
use crate::{Geometry, Member, ReadSource, Result, Zone, ZoneCondition, ZoneOp, ZonedDevice};
use std::sync::Arc;

/// A device whose calls take as long as the model's drive would (see the module docs).
pub struct TimedDevice<D> {
    inner: D,
    clock: Arc<HddClock>,
}

impl<D: ZonedDevice> TimedDevice<D> {
    pub fn new(inner: D, clock: Arc<HddClock>) -> TimedDevice<D> {
        TimedDevice { inner, clock }
    }

    /// The model's counters (seeks, busy time, bytes) so far.
    pub fn report(&self) -> HddReport {
        self.clock.report()
    }

    fn timed(&self, kind: ReqKind, offset: u64, len: u64) {
        let t = self.clock.submit(kind, offset, len);
        self.clock.wait_blocking(t);
    }
}

impl<D: ZonedDevice> ZonedDevice for TimedDevice<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn report_zones(&self, first: u32, nr: u32) -> Result<Vec<Zone>> {
        self.inner.report_zones(first, nr)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)?;
        self.timed(ReqKind::Read, offset, buf.len() as u64);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.inner.write_at(buf, offset)?;
        self.timed(ReqKind::Write, offset, buf.len() as u64);
        Ok(())
    }

    fn writev_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        self.inner.writev_at(bufs, offset)?;
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.timed(ReqKind::Write, offset, len);
        Ok(())
    }

    fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> Result<()> {
        self.inner.zone_mgmt(op, zone)?;
        if op == ZoneOp::Reset {
            let g = self.inner.geometry();
            self.clock.discard(g.zone_start(zone), g.zone_size);
        }
        Ok(())
    }

    fn reset_all(&self) -> Result<()> {
        self.inner.reset_all()?;
        self.clock.discard(0, self.inner.geometry().capacity());
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()?;
        self.timed(ReqKind::Flush, 0, 0);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{} (hdd timing model)", self.inner.describe())
    }

    fn members(&self) -> Vec<Member> {
        self.inner.members()
    }

    fn read_source(&self) -> Option<ReadSource> {
        // Reads through a caller's own ring would skip the model.
        None
    }

    fn set_zone_condition(&self, zone: u32, cond: ZoneCondition) -> Result<()> {
        self.inner.set_zone_condition(zone, cond)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::{HddModel, HddParams};
    use crate::MemDevice;

    /// Data goes through unchanged, and every write is one request the model counted.
    #[test]
    fn passes_data_through_and_counts_each_request() {
        let mem = MemDevice::with_zones(1 << 20, 4, 1).unwrap();
        let bytes = mem.geometry().capacity();
        let clock = Arc::new(HddClock::new(
            HddModel::new(HddParams::default(), bytes).unwrap(),
        ));
        let d = TimedDevice::new(mem, clock);
        let data = vec![7u8; 8192];
        d.write_at(&data, 1 << 20).unwrap();
        d.flush().unwrap();
        let mut back = vec![0u8; 8192];
        d.read_at(&mut back, 1 << 20).unwrap();
        assert_eq!(back, data);
        let r = d.report();
        assert_eq!(r.dirty_bytes, 0, "the flush destaged the write");
        // The write, the flush and the read (served from the media: the flush emptied
        // the cache).
        assert_eq!(r.stats.requests, 3, "{:?}", r.stats);
        assert_eq!(
            (r.stats.flushes, r.stats.cache_hits),
            (1, 0),
            "{:?}",
            r.stats
        );
        assert_eq!(r.stats.destaged_bytes, 8192, "{:?}", r.stats);
    }
}
