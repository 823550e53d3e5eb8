//! Garbage collection, one victim at a time, in the writers and in the background thread
//! (`background.rs`): the victim's live blocks, found through its summary, are copied in
//! logical order into the GC frontier a batch at a time (a paced or background batch with
//! `wlock` released across its device I/O, `copy_released`); once all are copied: flush,
//! `Move` records for the copies still live, `ZoneFree`, log write, flush, and only then the
//! victim's reset.
//!
//! Pacing: below `gc_start_zones` free zones (and when the best victim frees enough: at most
//! `MAX_PACED_RATIO` valid blocks per invalid one), each user write of n blocks owes `n × valid /
//! invalid` blocks of copying (the victim's ratio: GC then frees space as fast as users take it),
//! paid in batches (`gc_batch_blocks`, 256), so a writer waits for at most a batch and a victim's
//! finish, not a whole victim. A frontier that needs a zone below `gc_low_zones` runs GC to
//! completion (`gc_one`).

use std::sync::atomic::Ordering;

use zbd::ZoneOp;

use crate::engine::ids::{Lba, PageId, ZoneId, BLOCK, IO_BATCH_BLOCKS};

use super::layout::{decode_summary, Pba, ENTRIES};
use parking_lot::MutexGuard;

use super::meta::Meta;
use super::record::LogRec;
use super::{EngineError, LogEngine};

/// Most valid blocks per invalid one of a victim that paced GC starts (see
/// [`LogEngine::worth_pacing`]): at 16 a write of n blocks owes at most 16 n blocks of
/// copying, and the victims of a volume at its over-provisioning's steady state (WA 2.5 to
/// 8: 1.5 to 7 valid per invalid) are all below it.
const MAX_PACED_RATIO: f64 = super::zones::MAX_VICTIM_RATIO;

/// The most blocks one of GC's device reads spans, gaps included (4 MiB): what it reads
/// through is read into memory for nothing, so a span stays a few batches long.
const GC_READ_SPAN_BLOCKS: u64 = 4 * IO_BATCH_BLOCKS as u64;

/// A victim being emptied, or a page being compacted (`compact.rs`), owned by the state
/// (`Meta::gc`): one at a time, so that no victim is chosen while copies into the GC
/// frontier are not yet logged (such a zone's valid count does not show them).
pub(crate) struct GcWork {
    source: Source,
    /// The live blocks when the work started, in logical order, and how far the copy went.
    live: Vec<(Lba, Pba)>,
    next: usize,
    /// (logical block, where it was, where it was copied).
    copied: Vec<(Lba, Pba, Pba)>,
    /// Blocks of copying owed per user block written: valid / invalid at the start (0 for a
    /// compaction: writers owe it nothing).
    ratio: f64,
}

/// What a [`GcWork`] copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// Every live block of a full zone, which is then reset.
    Victim(ZoneId),
    /// Every mapped block of an index page, rewritten in logical order (idle compaction).
    Page(PageId),
}

impl GcWork {
    /// A compaction of page `page`, whose mapped blocks are `live`.
    pub(super) fn compaction(page: PageId, live: Vec<(Lba, Pba)>) -> GcWork {
        GcWork {
            source: Source::Page(page),
            live,
            next: 0,
            copied: Vec::new(),
            ratio: 0.0,
        }
    }
}

/// What one step of GC did.
pub(super) enum Step {
    NoVictim,
    Copied(u64),
    Finished,
    /// Another thread is copying a batch with `wlock` released (`Meta::gc_copying`): nothing
    /// done; [`LogEngine::wait_gc_copied`] waits for it.
    Busy,
}

/// Ends a GC batch copied with `wlock` released (`Meta::gc_copying`) when dropped.
struct CopyingGuard<'a>(&'a LogEngine);

impl Drop for CopyingGuard<'_> {
    fn drop(&mut self) {
        self.0.state.lock().gc_copying = None;
        self.0.gc_copied.notify_all();
    }
}

/// The blocks of one GC batch, placed at the GC frontier (`zone` from `off`) under `wlock`,
/// to be read and written there.
struct Batch {
    zone: ZoneId,
    off: u32,
    blocks: Vec<(Lba, Pba)>,
}

impl LogEngine {
    /// Test hook: empty a victim now (the one in progress, else the best), as a frontier
    /// that ran out of free zones does; false when GC can free nothing.
    #[doc(hidden)]
    pub fn debug_gc_one(&self) -> Result<bool, EngineError> {
        self.check_failed()?;
        let _w = self.wlock.lock();
        self.gc_one()
    }

    /// Test hook: threads waiting for a GC batch copied without `wlock`.
    #[doc(hidden)]
    pub fn debug_gc_copy_waiters(&self) -> usize {
        self.gc_copy_waiters.load(Ordering::SeqCst)
    }

    /// Test hook: whether a thread holds `wlock` (one placer, logger or GC step at a time).
    #[doc(hidden)]
    pub fn debug_wlock_held(&self) -> bool {
        self.wlock.is_locked()
    }

    /// Test hook: whether a zone reset holds or waits for `reset` (then no read is planned).
    #[doc(hidden)]
    pub fn debug_reset_pending(&self) -> bool {
        self.reset.is_locked_exclusive()
    }

    /// Empty a victim (the one in progress, else the best): true, or false when no full
    /// zone has an invalid block (GC can free nothing). The caller holds `wlock`.
    pub(super) fn gc_one(&self) -> Result<bool, EngineError> {
        loop {
            match self.gc_step(u64::MAX, None)? {
                Step::NoVictim => return Ok(false),
                Step::Finished => return Ok(true),
                Step::Copied(_) => {}
                // The copier needs `state` only to give the work back: waiting for it
                // with `wlock` held cannot deadlock.
                Step::Busy => self.wait_gc_copied(),
            }
        }
    }

    /// Wait until no GC batch is being copied without `wlock` (`Meta::gc_copying`).
    pub(super) fn wait_gc_copied(&self) {
        let mut st = self.state.lock();
        self.gc_copy_waiters.fetch_add(1, Ordering::SeqCst);
        while st.gc_copying.is_some() {
            self.gc_copied.wait(&mut st);
        }
        self.gc_copy_waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// After a user write of `n` blocks (the caller holds `wlock`): when free zones are below
    /// `gc_start_zones` or a victim is in progress, add what the write owes GC and pay it in
    /// whole batches.
    pub(super) fn gc_paced(&self, w: &mut MutexGuard<'_, ()>, n: u64) -> Result<(), EngineError> {
        if !self.gc_owed(&self.state.lock()) {
            return Ok(());
        }
        let gc_busy = self.state.lock().gc_busy();
        if !gc_busy {
            match self.gc_step(0, None) {
                Ok(Step::Copied(_)) => {}
                Ok(Step::NoVictim | Step::Finished | Step::Busy) | Err(EngineError::NoSpace(_)) => {
                    return Ok(())
                }
                Err(e) => return Err(e),
            }
        }
        let mut st = self.state.lock();
        // The work's ratio, also while another thread copies its batch: the write owes it
        // all the same, and pays once the work is back.
        let ratio = st
            .gc
            .as_ref()
            .map(|w| w.ratio)
            .or(st.gc_copying)
            .unwrap_or(0.0);
        st.gc_debt += n as f64 * ratio;
        // A batch, or what is left of the victim when that is less.
        let due = |st: &super::meta::Meta| {
            st.gc
                .as_ref()
                .map_or(0, |w| (w.live.len() - w.next).min(self.batch()))
        };
        while st.gc.is_some() && st.gc_debt >= due(&st).max(1) as f64 {
            drop(st);
            let step = match self.gc_step(self.batch() as u64, Some(&mut *w)) {
                // The write itself is logged: no room for GC now is the forced path's
                // business (it is the one that answers ENOSPC).
                Err(EngineError::NoSpace(_)) => return Ok(()),
                r => r?,
            };
            st = self.state.lock();
            match step {
                Step::Copied(k) => st.gc_debt -= k.max(1) as f64,
                Step::NoVictim | Step::Finished => st.gc_debt = 0.0,
                // Another thread copies a batch now: the debt stays, a later write pays it.
                Step::Busy => return Ok(()),
            }
            self.stats.gc_paced.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether a user write now owes GC copying (`gc_paced` then pays it): a victim is in
    /// progress, or free zones are below `gc_start_zones` and the best victim is worth
    /// starting paced.
    pub(super) fn gc_owed(&self, st: &super::meta::Meta) -> bool {
        st.gc
            .as_ref()
            .is_some_and(|w| matches!(w.source, Source::Victim(_)))
            || st.gc_copying.is_some_and(|r| r > 0.0)
            || (st.zones.nr_free() < self.opts.gc_start_zones && self.worth_pacing(st))
    }

    /// Whether the best victim frees enough to start it paced: a victim whose copy frees
    /// almost nothing (more than [`MAX_PACED_RATIO`] valid blocks per invalid one) would make
    /// every user write pay thousands of blocks of copying (measured: 1 write/s with 64 MiB
    /// zones right after a sequential fill, when the over-provisioning is under one zone).
    /// Such a victim is left to the forced path, which runs when a frontier needs a zone, by
    /// when the writes since have made victims worth copying.
    fn worth_pacing(&self, st: &super::meta::Meta) -> bool {
        self.victim_ratio(st).is_some_and(|r| r <= MAX_PACED_RATIO)
    }

    /// The best victim's valid blocks per invalid one, if there is a victim.
    pub(super) fn victim_ratio(&self, st: &super::meta::Meta) -> Option<f64> {
        let data = self.layout.data_blocks();
        st.zones.pick_victim(st.clock, data).map(|z| {
            let valid = st.zones.info[z.idx()].valid as f64;
            let invalid = (data as f64 - valid).max(1.0);
            valid / invalid
        })
    }

    /// Copy up to `max` blocks of the work in progress (choosing a victim first if none),
    /// finishing it once everything is copied. The caller holds `wlock`; given its guard
    /// (`w`), the step copies one batch and releases `wlock` across that batch's device
    /// reads and write (`copy_released`), so that writers place and log meanwhile. `Busy`
    /// when another step is doing that now.
    pub(super) fn gc_step(
        &self,
        max: u64,
        w: Option<&mut MutexGuard<'_, ()>>,
    ) -> Result<Step, EngineError> {
        let work = {
            let mut st = self.state.lock();
            if st.gc_copying.is_some() {
                return Ok(Step::Busy);
            }
            st.gc.take()
        };
        let mut work = match work {
            Some(w) => w,
            None => match self.start_victim()? {
                Some(w) => w,
                None => return Ok(Step::NoVictim),
            },
        };
        // A compaction's blocks are a seek each on a disk: one batch per step (per hold of
        // `wlock`).
        let max = match work.source {
            Source::Victim(_) => max,
            Source::Page(_) => max.min(super::compact::COMPACT_BATCH_BLOCKS as u64),
        };
        if let Some(w) = w {
            if work.next < work.live.len() && max > 0 {
                return self.copy_released(work, max, w).map(Step::Copied);
            }
        }
        let mut copied = 0;
        while work.next < work.live.len() && copied < max {
            copied += self.copy_batch(&mut work, max - copied)?;
        }
        if work.next < work.live.len() {
            self.state.lock().gc = Some(work);
            return Ok(Step::Copied(copied));
        }
        self.finish(work)?;
        // What writes owed this victim is paid, whichever path finished it.
        self.state.lock().gc_debt = 0.0;
        Ok(Step::Finished)
    }

    /// Blocks per GC copy batch.
    fn batch(&self) -> usize {
        self.opts.gc_batch_blocks.clamp(1, IO_BATCH_BLOCKS) as usize
    }

    /// The best victim and its live blocks, or None.
    fn start_victim(&self) -> Result<Option<GcWork>, EngineError> {
        let victim = {
            let st = self.state.lock();
            st.zones.pick_victim(st.clock, self.layout.data_blocks())
        };
        let Some(victim) = victim else {
            self.stats.gc_no_victim.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        let live: Vec<(Lba, Pba)> = self
            .live_blocks(victim)?
            .into_iter()
            .map(|(lba, off)| (lba, self.layout.pba(victim, off)))
            .collect();
        let invalid = (self.layout.data_blocks() as usize)
            .saturating_sub(live.len())
            .max(1);
        Ok(Some(GcWork {
            source: Source::Victim(victim),
            ratio: live.len() as f64 / invalid as f64,
            live,
            next: 0,
            copied: Vec::new(),
        }))
    }

    /// Copy the next batch of `work` (at most `max` blocks) with `wlock` released across the
    /// device I/O: the batch is chosen and placed under `wlock`, then `Meta::gc_copying`
    /// keeps every other GC step out (`Step::Busy`) while the blocks are read and written,
    /// and the work goes back to `Meta::gc` under `state` alone before `wlock` is taken
    /// again (so a thread that waits for it holding `wlock`, `gc_one`, cannot deadlock).
    /// Nothing is logged here: `finish` logs the copies the index still maps where they
    /// were, so user writes and discards meanwhile need no care; the sources stay readable
    /// (only GC's own `finish` frees a zone) and only GC writes the GC frontier.
    fn copy_released(
        &self,
        mut work: GcWork,
        max: u64,
        w: &mut MutexGuard<'_, ()>,
    ) -> Result<u64, EngineError> {
        let next = work.next;
        let batch = match self.pick_batch(&mut work, max) {
            Ok(b) => b,
            Err(e) => {
                self.state.lock().gc = Some(work);
                return Err(e);
            }
        };
        let Some(batch) = batch else {
            self.state.lock().gc = Some(work);
            return Ok(0);
        };
        self.state.lock().gc_copying = Some(work.ratio);
        // Cleared (and waiters woken) however the closure ends, a panic included: a forced
        // GC waiting with `wlock` held must never wait for good.
        let copying = CopyingGuard(self);
        MutexGuard::unlocked(w, || {
            let r = self.copy_blocks(&batch);
            match r {
                Ok(()) => self.record_batch(&mut work, &batch),
                // Not copied: the batch is picked again (the engine has stopped anyway).
                Err(_) => work.next = next,
            }
            self.state.lock().gc = Some(work);
            drop(copying);
            r.map(|()| batch.blocks.len() as u64)
        })
    }

    /// Copy the next still-live blocks of the work (at most `max`, one batch) to the GC
    /// frontier, `wlock` held throughout. Returns how many were copied.
    fn copy_batch(&self, work: &mut GcWork, max: u64) -> Result<u64, EngineError> {
        let Some(batch) = self.pick_batch(work, max)? else {
            return Ok(0);
        };
        self.copy_blocks(&batch)?;
        self.record_batch(work, &batch);
        Ok(batch.blocks.len() as u64)
    }

    /// The next still-live blocks of the work (at most `max`, one batch), placed at the GC
    /// frontier; `work.next` moves past them. None when nothing is left to copy: a
    /// compaction stops early (the copies so far are logged by `finish`) once free zones
    /// are down to `gc_low_zones`. The caller holds `wlock`.
    fn pick_batch(&self, work: &mut GcWork, max: u64) -> Result<Option<Batch>, EngineError> {
        let limit = max.min(self.batch() as u64) as usize;
        // Positions in `live` of the next entries the index still maps where they were.
        let picks: Vec<usize> = {
            let mut st = self.state.lock();
            if matches!(work.source, Source::Page(_)) && !self.compaction_room(&st) {
                work.next = work.live.len();
                return Ok(None);
            }
            let mut picks = Vec::new();
            for i in work.next..work.live.len() {
                if picks.len() == limit {
                    break;
                }
                let (lba, from) = work.live[i];
                if self.gc_lookup(&mut st, lba)? == Some(from) {
                    picks.push(i);
                }
            }
            picks
        };
        let Some(&last) = picks.last() else {
            work.next = work.live.len();
            return Ok(None);
        };
        let mut blocks: Vec<(Lba, Pba)> = picks.iter().map(|&i| work.live[i]).collect();
        let lbas: Vec<Lba> = blocks.iter().map(|&(l, _)| l).collect();
        let gc_slot = self.state.lock().zones.gc_slot();
        let (zone, off, k) = self.place(gc_slot, &lbas)?;
        blocks.truncate(k as usize);
        work.next = if (k as usize) < picks.len() {
            picks[k as usize]
        } else {
            last + 1
        };
        Ok(Some(Batch { zone, off, blocks }))
    }

    /// Read a placed batch's blocks and write them at its place.
    fn copy_blocks(&self, batch: &Batch) -> Result<(), EngineError> {
        let mut buf = vec![0u8; batch.blocks.len() * BLOCK];
        self.read_blocks(&batch.blocks, &mut buf)?;
        let at = self.layout.zone_offset(batch.zone, batch.off);
        self.dev(self.dev.write_at(&buf, at))
    }

    /// Note a batch's copies in its work (for `finish`) and count them.
    fn record_batch(&self, work: &mut GcWork, batch: &Batch) {
        for (i, &(lba, from)) in batch.blocks.iter().enumerate() {
            let to = self.layout.pba(batch.zone, batch.off + i as u32);
            work.copied.push((lba, from, to));
        }
        let counter = match work.source {
            Source::Victim(_) => &self.stats.gc_blocks,
            Source::Page(_) => &self.stats.compact_blocks,
        };
        counter.fetch_add(batch.blocks.len() as u64, Ordering::Relaxed);
    }

    /// Every live block is copied: flush the copies, log `Move` for those still live; for a
    /// victim, `ZoneFree`, write the log and flush, then reset it; for a compaction, write
    /// the log (its old copies stay until their zones are freed, which syncs it first).
    fn finish(&self, work: GcWork) -> Result<(), EngineError> {
        if matches!(work.source, Source::Victim(_)) || !work.copied.is_empty() {
            // The copies are durable before any record names them (Move is trusted at
            // replay); and for a victim, so are the user writes that invalidated its other
            // blocks before `ZoneFree` can be: were they lost to a power cut after it, replay
            // would drop their `Append`s and map those blocks into a free zone again (the
            // power-cut test fails without it, even for a victim with nothing to copy).
            self.dev_flush()?;
        }
        let moves = {
            let mut st = self.state.lock();
            let mut still: Vec<(Lba, Pba)> = Vec::with_capacity(work.copied.len());
            for &(lba, from, to) in &work.copied {
                if self.gc_lookup(&mut st, lba)? == Some(from) {
                    still.push((lba, to));
                }
            }
            if matches!(work.source, Source::Victim(_)) {
                // A victim's copies join the runs of other pages' blocks: look at those
                // pages again when idle.
                for &(lba, _) in &still {
                    st.compact.written(lba, 1);
                }
            }
            move_records(&self.layout, &still)
        };
        let mut last = None;
        for m in moves {
            last = Some(self.log_op(m)?);
        }
        let victim = match work.source {
            Source::Victim(v) => v,
            Source::Page(_) => {
                self.stats.compact_pages.fetch_add(1, Ordering::Relaxed);
                if let Some(seq) = last {
                    self.log_sync(seq + 1, false)?;
                }
                return Ok(());
            }
        };
        self.log_op(LogRec::ZoneFree { zone: victim })?;
        // ZoneFree durable (and every record naming the victim before it) before the reset.
        self.sync_all()?;
        {
            let _r = self.reset.write();
            self.dev(self.dev.zone_mgmt(ZoneOp::Reset, victim.0))?;
        }
        self.state.lock().zones.get_mut(victim).needs_reset = false;
        self.stats.gc_zones.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The victim's live blocks as (logical block, offset in the victim), in logical order:
    /// its summary's entries that the index still maps there. Should the summary miss some
    /// (the valid count says so: only damaged metadata does that), the index is searched
    /// instead, so GC never frees a zone the index still maps into.
    fn live_blocks(&self, victim: ZoneId) -> Result<Vec<(Lba, u32)>, EngineError> {
        let summary = self.read_summary(victim)?;
        let mut st = self.state.lock();
        let live = self.live_of(&mut st, victim, &summary)?;
        if live.len() as u32 == st.zones.get(victim).valid {
            return Ok(live);
        }
        tracing::warn!(zone = %victim, "zone summary misses live blocks: searching the index");
        self.stats.summary_rebuilds.fetch_add(1, Ordering::Relaxed);
        let rebuilt = st.reverse_map(victim).map_err(|e| self.fail(e))?;
        self.live_of(&mut st, victim, &rebuilt)
    }

    /// The entries of `summary` (the logical block of each data block of `victim`) that the
    /// index still maps there, in logical order.
    fn live_of(
        &self,
        st: &mut MutexGuard<'_, Meta>,
        victim: ZoneId,
        summary: &[Option<Lba>],
    ) -> Result<Vec<(Lba, u32)>, EngineError> {
        let mut v = Vec::new();
        for (off, l) in summary.iter().enumerate() {
            let Some(l) = *l else { continue };
            let off = off as u32;
            if (l.0 as u64) < self.layout.user_blocks
                && self.gc_lookup(st, l)? == Some(self.layout.pba(victim, off))
            {
                v.push((l, off));
            }
        }
        v.sort_unstable();
        v.dedup();
        Ok(v)
    }

    /// `lba`'s location; a page that cannot be read stops the engine.
    pub(super) fn lookup(&self, st: &mut Meta, lba: Lba) -> Result<Option<Pba>, EngineError> {
        st.index.get(lba).map_err(|e| self.fail(e))
    }

    /// [`LogEngine::lookup`] in one of GC's and compaction's loops, which hold `state`
    /// across many lookups: after one that read a page, threads waiting for `state` (reads,
    /// plans) go first, so that a victim's blocks scattered over many pages do not stall
    /// them for every read. Safe because the caller holds `wlock`: no record changes the
    /// index meanwhile.
    pub(super) fn gc_lookup(
        &self,
        st: &mut MutexGuard<'_, Meta>,
        lba: Lba,
    ) -> Result<Option<Pba>, EngineError> {
        let reads = st.index.page_reads();
        let at = self.lookup(st, lba)?;
        if st.index.page_reads() != reads {
            MutexGuard::bump(st);
        }
        Ok(at)
    }

    /// The logical block of each data block of a full zone, from its summary; a summary block
    /// that fails its check (torn by a power cut) is rebuilt from the index.
    fn read_summary(&self, zone: ZoneId) -> Result<Vec<Option<Lba>>, EngineError> {
        let l = &self.layout;
        let mut buf = vec![0u8; l.summary_blocks as usize * BLOCK];
        self.dev(
            self.dev
                .read_at(&mut buf, l.zone_offset(zone, l.data_blocks())),
        )?;
        let mut out = Vec::with_capacity(l.data_blocks() as usize);
        let mut rebuilt: Option<Vec<Option<Lba>>> = None;
        for (j, b) in buf.chunks(BLOCK).enumerate() {
            let n = (l.data_blocks() as usize - j * ENTRIES).min(ENTRIES);
            match decode_summary(zone, j as u32, b) {
                Some(e) => out.extend_from_slice(&e[..n]),
                None => {
                    self.stats.summary_rebuilds.fetch_add(1, Ordering::Relaxed);
                    if rebuilt.is_none() {
                        let r = self.state.lock().reverse_map(zone);
                        rebuilt = Some(r.map_err(|e| self.fail(e))?);
                    }
                    let r = rebuilt.as_ref().expect("rebuilt");
                    out.extend_from_slice(&r[j * ENTRIES..j * ENTRIES + n]);
                }
            }
        }
        Ok(out)
    }

    /// Read the blocks `batch` into `buf` (block i of `buf` from `batch[i]`), in device order:
    /// a victim's blocks are in that order already where it was written sequentially; a
    /// randomly written victim's (GC copies in logical order) and a compacted page's lie
    /// anywhere, and a disk then sweeps once instead of seeking to and fro. Blocks at most
    /// `gc_read_gap_blocks` apart are read with the gap between them in one device read (of
    /// at most `GC_READ_SPAN_BLOCKS`): on a disk, reading a few blocks more costs less than a
    /// rotation's wait for the next one.
    fn read_blocks(&self, batch: &[(Lba, Pba)], buf: &mut [u8]) -> Result<(), EngineError> {
        let mut order: Vec<usize> = (0..batch.len()).collect();
        order.sort_unstable_by_key(|&i| batch[i].1 .0);
        let pba = |k: usize| batch[order[k]].1 .0 as u64;
        let zone = |k: usize| self.layout.zone_of(batch[order[k]].1).0;
        let gap = self.opts.gc_read_gap_blocks as u64;
        let mut scratch = Vec::new();
        let mut k = 0;
        while k < order.len() {
            // A span: blocks `order[k..j]`, each at most `gap` blocks after the one before,
            // all of one zone (what lies between two written blocks of a zone is written;
            // past a zone's end may not be: its summary, another zone's write pointer).
            let mut j = k + 1;
            while j < order.len()
                && pba(j) - pba(j - 1) <= gap + 1
                && pba(j) - pba(k) < GC_READ_SPAN_BLOCKS
                && zone(j) == zone(k)
            {
                j += 1;
            }
            let at = pba(k) * BLOCK as u64;
            let blocks = (pba(j - 1) - pba(k) + 1) as usize;
            let i = order[k];
            if blocks == j - k && order[k..j].windows(2).all(|w| w[1] == w[0] + 1) {
                // Consecutive on the device and in `buf`: read in place.
                self.dev(
                    self.dev
                        .read_at(&mut buf[i * BLOCK..(i + blocks) * BLOCK], at),
                )?;
            } else {
                scratch.resize(blocks * BLOCK, 0);
                self.dev(self.dev.read_at(&mut scratch, at))?;
                for &i in &order[k..j] {
                    let from = (batch[i].1 .0 as u64 - pba(k)) as usize * BLOCK;
                    buf[i * BLOCK..(i + 1) * BLOCK].copy_from_slice(&scratch[from..from + BLOCK]);
                }
            }
            k = j;
        }
        Ok(())
    }
}

/// `Move` records for `copies` (logical block, new place; in logical order): one per run of
/// consecutive logical blocks copied to consecutive blocks of one zone.
fn move_records(l: &super::layout::Layout, copies: &[(Lba, Pba)]) -> Vec<LogRec> {
    let mut moves = Vec::new();
    let mut i = 0;
    while i < copies.len() {
        let mut j = i + 1;
        while j < copies.len()
            && copies[j].0 .0 == copies[j - 1].0 .0 + 1
            && copies[j].1 .0 == copies[j - 1].1 .0 + 1
            && l.zone_of(copies[j].1).0 == l.zone_of(copies[i].1).0
        {
            j += 1;
        }
        let (zone, off) = l.zone_of(copies[i].1);
        moves.push(LogRec::Move {
            lba: copies[i].0,
            n: (j - i) as u32,
            zone,
            off,
        });
        i = j;
    }
    moves
}
