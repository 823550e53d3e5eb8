//! Reads, writes and discards, and where data goes: the frontier of its class, sealed with
//! its summary when its data part is full, replaced by a free zone (GC first when free zones
//! run low).

use std::sync::atomic::Ordering;

use parking_lot::{ArcMutexGuard, RawMutex};
use zbd::ZoneOp;

use crate::engine::ids::{Lba, ZoneId, BLOCK, IO_BATCH_BLOCKS};

use super::layout::{encode_summary, Pba, ENTRIES};
use super::meta::Meta;
use super::record::{Class, LogRec};
use super::zones::{Slot, ZoneState};
use super::{EngineError, LogEngine};

impl LogEngine {
    /// Read `buf.len()` bytes at `offset`; blocks never written (or discarded) read as zeros
    /// without device I/O.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        let (first, n) = self.range(offset, buf.len())?;
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        // Held until the device reads are done: GC does not reset a zone under them.
        let _r = self.reset.read();
        let runs = {
            let mut st = self.state.lock();
            let runs = self.runs(&mut st, first, n)?;
            self.note_read(&mut st, first, n, &runs);
            runs
        };
        let mut at = 0;
        for run in runs {
            let d = &mut buf[at..at + run.blocks as usize * BLOCK];
            match run.from {
                None => d.fill(0),
                Some(p) => self
                    .dev
                    .read_at(d, p.0 as u64 * BLOCK as u64)
                    .map_err(EngineError::Device)?,
            }
            at += d.len();
        }
        Ok(())
    }

    /// Blocks `first..first + n` as the index has them: runs of blocks never written (or
    /// discarded), and runs contiguous on the device, in logical order.
    pub(super) fn runs(&self, st: &mut Meta, first: u32, n: u32) -> Result<Vec<Run>, EngineError> {
        let mut runs: Vec<Run> = Vec::new();
        for i in 0..n {
            push_run(&mut runs, self.lookup(st, Lba(first + i))?);
        }
        Ok(runs)
    }

    /// [`LogEngine::runs`] without reading a page: `None` when a page is not cached.
    pub(super) fn cached_runs(&self, st: &Meta, first: u32, n: u32) -> Option<Vec<Run>> {
        let mut runs: Vec<Run> = Vec::new();
        for i in 0..n {
            push_run(&mut runs, st.index.peek(Lba(first + i))?);
        }
        Some(runs)
    }

    /// Write `data` at `offset`: appended at a user frontier, logged, and acknowledged once
    /// its log block is written (it survives a daemon crash); with `fua`, flushed too.
    ///
    /// The write holds its frontier's turn from placing its first batch to appending its last
    /// record, and `wlock` only while placing and while appending: writes on other frontiers
    /// place, write their data and log meanwhile (their records then share log blocks). A
    /// frontier is sealed only by its turn's holder, so every block placed in a zone is
    /// logged before the zone is full (and a GC victim).
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), EngineError> {
        let last = self.write_unsynced(offset, data, fua)?;
        self.sync(last)
    }

    /// [`LogEngine::write`] up to its log write: the write may be acknowledged once
    /// [`LogEngine::sync`] of the sequence number returned succeeded (so that the writes a
    /// caller makes one after the other share one log write). With `fua` the write is
    /// durable already.
    pub fn write_unsynced(&self, offset: u64, data: &[u8], fua: bool) -> Result<u64, EngineError> {
        let (first, n) = self.range(offset, data.len())?;
        self.check_failed()?;
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.wait_planned(first, n);
        let last = {
            let (slot, _turn) = self.take_turn();
            let mut done = 0u32;
            let mut last = 0;
            while done < n {
                let k = (n - done).min(IO_BATCH_BLOCKS);
                let lbas: Vec<Lba> = (first + done..first + done + k).map(Lba).collect();
                let (zone, off, k) = {
                    let _w = self.wlock.lock();
                    self.place(slot, &lbas)?
                };
                let buf = &data[done as usize * BLOCK..(done + k) as usize * BLOCK];
                self.dev(self.dev.write_at(buf, self.layout.zone_offset(zone, off)))?;
                let crcs = buf.chunks(BLOCK).map(crc32fast::hash).collect();
                let _w = self.wlock.lock();
                last = self.log_op(LogRec::Append {
                    lba: Lba(first + done),
                    zone,
                    off,
                    crcs,
                })?;
                done += k;
            }
            last
        };
        {
            let mut w = self.wlock.lock();
            self.gc_paced(&mut w, n as u64)?;
        }
        self.stats
            .user_blocks
            .fetch_add(n as u64, Ordering::Relaxed);
        if fua {
            self.sync_all()?;
        }
        Ok(last)
    }

    /// A user frontier's turn: the first free one (so a lone writer keeps one frontier and
    /// its stream stays in one zone), else wait for one, taken in rotation (counted in
    /// `turn_waiters`: a stream's pipeline holding it then ends).
    fn take_turn(&self) -> (Slot, ArcMutexGuard<RawMutex, ()>) {
        for (s, t) in self.turns.iter().enumerate() {
            if let Some(g) = t.try_lock_arc() {
                return (Slot(s), g);
            }
        }
        let s = self.next_turn.fetch_add(1, Ordering::Relaxed) % self.turns.len();
        self.turn_waiters[s].fetch_add(1, Ordering::Relaxed);
        self.stats.turn_waits.fetch_add(1, Ordering::Relaxed);
        let turn = self.turns[s].lock_arc();
        self.turn_waiters[s].fetch_sub(1, Ordering::Relaxed);
        (Slot(s), turn)
    }

    /// Unmap `len` bytes at `offset` (they read as zeros); logged like a write.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), EngineError> {
        let (first, n) = self.range(offset, len as usize)?;
        self.check_failed()?;
        self.stats.discards.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            return Ok(());
        }
        self.wait_planned(first, n);
        let last = {
            let _w = self.wlock.lock();
            self.log_op(LogRec::Trim { lba: Lba(first), n })?
        };
        self.log_sync(last + 1, false).map(|_| ())
    }

    /// Room at `slot`'s frontier for the first blocks of `lbas`: (zone, offset, how many).
    /// The frontier's write pointer moves past them and its summary names them. The caller
    /// holds `wlock` (and, for a user slot, its turn) and writes the data there next.
    pub(super) fn place(
        &self,
        slot: Slot,
        lbas: &[Lba],
    ) -> Result<(ZoneId, u32, u32), EngineError> {
        let data_blocks = self.layout.data_blocks();
        loop {
            let class = {
                let mut st = self.state.lock();
                if let Some(f) = st.zones.frontier(slot) {
                    let room = data_blocks - f.wp;
                    if room > 0 {
                        let k = room.min(lbas.len() as u32);
                        let off = f.wp;
                        for (i, l) in lbas[..k as usize].iter().enumerate() {
                            f.summary[off as usize + i] = Some(*l);
                        }
                        f.wp += k;
                        return Ok((f.zone, off, k));
                    }
                }
                st.zones.class_of(slot)
            };
            self.seal_frontier(slot)?;
            // The zone opened goes to the class's first empty slot: when that is not this
            // one (a slot no write used yet), the loop opens another.
            self.open_frontier(class)?;
        }
    }

    /// Write the summary of `slot`'s full frontier; the zone is then full.
    fn seal_frontier(&self, slot: Slot) -> Result<(), EngineError> {
        let f = {
            let mut st = self.state.lock();
            match st.zones.frontier(slot).take() {
                Some(f) => f,
                None => return Ok(()),
            }
        };
        self.write_summary(f.zone, 0, &f.summary)?;
        self.state.lock().zones.get_mut(f.zone).state = ZoneState::Full;
        Ok(())
    }

    /// Write summary blocks `from..` of `zone` (at the zone's write pointer, after its data
    /// part) from `summary`, the logical block of each data block.
    pub(super) fn write_summary(
        &self,
        zone: ZoneId,
        from: u32,
        summary: &[Option<Lba>],
    ) -> Result<(), EngineError> {
        let l = &self.layout;
        let mut buf = Vec::new();
        for j in from..l.summary_blocks {
            let s = (j as usize * ENTRIES).min(summary.len());
            let e = (s + ENTRIES).min(summary.len());
            buf.extend_from_slice(&encode_summary(zone, j, &summary[s..e])[..]);
        }
        let at = l.zone_offset(zone, l.data_blocks() + from);
        self.dev(self.dev.write_at(&buf, at))
    }

    /// Give an empty slot of `class` a new frontier: a free zone, reset if it holds old data, logged with
    /// `ZoneOpen`. A user frontier runs GC first when free zones are low, and never takes
    /// the GC reserve: ENOSPC once GC frees nothing.
    fn open_frontier(&self, class: Class) -> Result<(), EngineError> {
        if class == Class::User {
            while self.state.lock().zones.nr_free() < self.opts.gc_low_zones {
                if !self.gc_one()? {
                    break;
                }
                self.stats.gc_forced.fetch_add(1, Ordering::Relaxed);
            }
        }
        let (zone, needs_reset) = {
            let st = self.state.lock();
            let reserve = match class {
                Class::User => self.opts.gc_reserve_zones,
                Class::Gc => 0,
            };
            match st.zones.first_free() {
                Some(z) if st.zones.nr_free() > reserve => (z, st.zones.get(z).needs_reset),
                _ => {
                    return Err(EngineError::NoSpace(format!(
                        "no free zone for the {class:?} frontier and GC frees nothing"
                    )))
                }
            }
        };
        if needs_reset {
            // A zone is freed in memory when its `ZoneFree` is appended, durable only once the
            // GC that freed it has synced the log; a failure between the two stops the engine.
            // A writer that passed its check before then must not reset the zone: the
            // metadata on the device still maps its blocks.
            self.check_failed()?;
            let _r = self.reset.write();
            self.dev(self.dev.zone_mgmt(ZoneOp::Reset, zone.0))?;
        }
        self.state.lock().zones.get_mut(zone).needs_reset = false;
        self.log_op(LogRec::ZoneOpen { zone, class })?;
        Ok(())
    }
}

/// The next block of a read: it extends the last run or starts one.
fn push_run(runs: &mut Vec<Run>, p: Option<Pba>) {
    match runs.last_mut() {
        Some(r) if r.next() == p => r.blocks += 1,
        _ => runs.push(Run { from: p, blocks: 1 }),
    }
}

/// Blocks of a read in logical order: `blocks` never written (`from` None), or contiguous on
/// the device from `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Run {
    pub from: Option<Pba>,
    pub blocks: u32,
}

impl Run {
    /// Where the block after the run would be for the run to go on.
    pub(super) fn next(&self) -> Option<Pba> {
        self.from.map(|p| Pba(p.0 + self.blocks))
    }
}

#[cfg(test)]
mod tests {
    use zbd::ZonedDevice;

    use super::super::record::Class;
    use super::super::{test_volume, EngineError, LogEngine, LogOptions};

    /// A zone that a GC freed in memory while the log sync that would make its `ZoneFree`
    /// durable failed (the engine then stops) is not reset by a writer that passed its
    /// failure check before: the metadata on the device still maps its blocks.
    #[test]
    fn a_failed_engine_resets_no_zone() {
        let dev = test_volume();
        let e = LogEngine::open(dev.clone(), LogOptions::default()).unwrap();
        // The state such a GC leaves: the first free zone holds data and awaits its reset.
        let zone = e.state.lock().zones.first_free().unwrap();
        let start = dev.geometry().zone_start(zone.0);
        dev.write_at(&[5u8; 4096], start).unwrap();
        e.state.lock().zones.get_mut(zone).needs_reset = true;
        e.fail(EngineError::Meta("a log write failed".into()));
        assert!(e.open_frontier(Class::User).is_err());
        let wp = dev.report_all().unwrap()[zone.idx()].wp;
        assert_eq!(
            wp,
            start + 4096,
            "zone {zone} was reset after the engine failed"
        );
    }
}
