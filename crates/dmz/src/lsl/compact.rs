//! Idle compaction by logical range (docs/log-layout.md 5.5; docs/design.md, "Log layout"):
//! GC copies a victim's live blocks in logical order, but a victim's blocks are a sparse
//! random subset of the logical space, so data written randomly stays scattered and a
//! sequential read of it seeks for every few blocks. When the volume is idle, the background
//! thread (`background.rs`) rewrites each index page whose mapped blocks form more extents
//! than `compact_min_extents` and than the zones they would span once rewritten, in logical
//! order, into the GC frontier: pages taken in
//! ascending order land one after the other, so the span reads sequentially again.
//!
//! A compaction is a [`GcWork`] whose source is a page: the same batches, the same flush
//! before its `Move` records, the same rule that only copies still mapped where they were are
//! moved. It takes `Meta::gc` like a victim, so no victim is chosen while its copies are not
//! logged. A page is compacted whole or not at all: it starts only when the GC frontier and
//! the free zones above `gc_low_zones` (but one) hold all its blocks (the background thread
//! runs GC first whenever free zones are below `gc_start_zones`), and a page larger than that
//! room at `gc_start_zones` is skipped: compacted in parts, each part's GC would scatter the
//! rest again, without end. Should writers take the room meanwhile, it stops early, logging
//! what it copied, when free zones fall to `gc_low_zones`.

use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;

use crate::engine::ids::{Lba, PageId};

use super::gc::GcWork;
use super::io::Run;
use super::layout::{Layout, Pba};
use super::meta::Meta;
use super::{EngineError, LogEngine};

/// Most blocks a compaction copies under one hold of `wlock`: its blocks lie anywhere, so on
/// a disk each is a seek (a 256-block GC batch of them took about 1.5 s of the hdd model),
/// and a writer arriving while the volume was idle waits for the batch in progress.
pub(super) const COMPACT_BATCH_BLOCKS: usize = 64;

/// Which index pages idle compaction looks at (`LogOptions::compact`, `create --compact`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompactOn {
    /// Pages a read found scattered: a read that needed more device reads than
    /// `compact_min_extents` (LevelDB's seek-triggered compaction is the model). Disk time
    /// and write amplification go only to data that is read in runs; data written and read
    /// at random (a database's, a VM image's) is left where it is, since compaction gives
    /// a one-block read nothing.
    #[default]
    Reads,
    /// Pages user writes and GC copies changed, and at open every page of more than one
    /// extent: data is made sequential again whether it is read or not (the first
    /// sequential read after random writes is then fast too, at the cost of rewriting
    /// everything written at random once).
    Writes,
    /// None: data stays where writes and GC put it.
    Never,
}

/// The index pages to look at when the volume is next idle (which events add pages:
/// [`CompactOn`]), in a bit set scanned in ascending order from a cursor, so that pages
/// compacted one after the other land one after the other.
pub(crate) struct PageSet {
    bits: Vec<u64>,
    nr: u32,
    cursor: u32,
    on: CompactOn,
    /// The block after the last read the engine saw (from any queue), and where on the
    /// device a read of it would go on without a seek: `(end, None)` when that read ended on
    /// blocks never written; `None` before the first read (or after an empty one).
    after_read: Option<(Lba, Option<Pba>)>,
}

impl PageSet {
    pub fn new(nr_pages: u32, on: CompactOn) -> PageSet {
        PageSet {
            bits: vec![0; nr_pages.div_ceil(64) as usize],
            nr: 0,
            cursor: 0,
            on,
            after_read: None,
        }
    }

    /// Mark `p`; whether it was not marked yet.
    pub fn mark(&mut self, p: PageId) -> bool {
        let (w, b) = (p.idx() / 64, p.idx() % 64);
        let new = self.bits[w] & (1 << b) == 0;
        if new {
            self.bits[w] |= 1 << b;
            self.nr += 1;
        }
        new
    }

    /// Mark the pages of blocks `lba..lba + n`; whether one was not marked yet.
    pub fn mark_blocks(&mut self, lba: Lba, n: u32) -> bool {
        if n == 0 {
            return false;
        }
        let first = Layout::page_of(lba).0;
        let last = Layout::page_of(Lba(lba.0 + (n - 1))).0;
        let mut new = false;
        for p in first.0..=last.0 {
            new |= self.mark(PageId(p));
        }
        new
    }

    pub fn on(&self) -> CompactOn {
        self.on
    }

    /// A read of blocks from `first` served by `runs`: whether it continues the read before
    /// it logically but not on the device (a scan that had to seek between two requests,
    /// each perhaps one device read: a stream whose pieces went to several frontiers).
    pub fn scan_jumped(&mut self, first: Lba, n: u32, runs: &[Run]) -> bool {
        let start = runs.first().and_then(|r| r.from);
        let jumped = matches!(
            (self.after_read, start),
            (Some((lba, Some(at))), Some(from)) if lba == first && at != from
        );
        self.after_read = runs.last().map(|r| (Lba(first.0 + n), r.next()));
        jumped
    }

    /// Blocks `lba..lba + n` were written (by a user or a GC copy): marked with
    /// [`CompactOn::Writes`].
    pub fn written(&mut self, lba: Lba, n: u32) {
        if self.on == CompactOn::Writes {
            self.mark_blocks(lba, n);
        }
    }

    /// Page `p` is found scattered at open: marked with [`CompactOn::Writes`].
    pub fn scattered_at_open(&mut self, p: PageId) {
        if self.on == CompactOn::Writes {
            self.mark(p);
        }
    }

    pub fn len(&self) -> u32 {
        self.nr
    }

    /// Mark `p` again as the next page [`PageSet::take_next`] returns.
    fn put_back(&mut self, p: PageId) {
        self.mark(p);
        self.cursor = p.0;
    }

    /// Take the next marked page at or after the cursor (wrapping around).
    pub fn take_next(&mut self) -> Option<PageId> {
        if self.nr == 0 {
            return None;
        }
        let words = self.bits.len();
        let start = self.cursor as usize / 64;
        for k in 0..=words {
            let w = (start + k) % words;
            let mut word = self.bits[w];
            if k == 0 {
                // Bits below the cursor in its own word come last (k == words).
                word &= !0u64 << (self.cursor % 64);
            } else if k == words {
                word = self.bits[w] & !(!0u64 << (self.cursor % 64));
            }
            if word != 0 {
                let b = word.trailing_zeros() as usize;
                self.bits[w] &= !(1 << b);
                self.nr -= 1;
                let p = (w * 64 + b) as u32;
                self.cursor = p + 1;
                if self.cursor as usize >= words * 64 {
                    self.cursor = 0;
                }
                return Some(PageId(p));
            }
        }
        None
    }
}

/// What [`LogEngine::compact_next`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Compaction {
    /// No page is marked.
    Nothing,
    /// A marked page needs compaction, but free zones are too few for it until GC has
    /// restored `gc_start_zones` (it stays marked, next).
    NoRoom,
    /// The pages looked at need nothing; more are marked.
    Scanning,
    /// A page's compaction is in `Meta::gc`.
    Started,
}

impl LogEngine {
    /// A read of blocks `first..first + n` was served by `runs`: with [`CompactOn::Reads`],
    /// one that needed more device reads than `compact_min_extents` (and than one) marks
    /// its pages, and wakes the background thread should it sleep. So does, with
    /// `compact_scans` (a spinning disk), a read that continues the one before it logically
    /// but starts elsewhere on the device: a scan over a stream scattered in pieces of a
    /// request or more (writes in flight together go to several frontiers) needs one device
    /// read per request and would otherwise never mark anything. Whether a marked page is
    /// compacted is decided by its extents ([`LogEngine::compact_next`]). Under `state`.
    pub(super) fn note_read(&self, st: &mut Meta, first: u32, n: u32, runs: &[Run]) {
        if st.compact.on() != CompactOn::Reads {
            return;
        }
        // The option is fixed at open: off, the scan is neither tracked nor looked at.
        let jumped = self.opts.compact_scans && st.compact.scan_jumped(Lba(first), n, runs);
        let device = runs.iter().filter(|r| r.from.is_some()).count() as u32;
        if (jumped || device > self.opts.compact_min_extents.max(1))
            && st.compact.mark_blocks(Lba(first), n)
        {
            self.stats.read_marks.fetch_add(1, Ordering::Relaxed);
            self.nudge(st);
        }
    }

    /// Whether a compaction may take another block of the GC frontier: free zones above
    /// `gc_low_zones`, so that no frontier waits for a whole victim because of it (the
    /// background thread runs GC first whenever they are below `gc_start_zones`).
    pub(super) fn compaction_room(&self, st: &Meta) -> bool {
        st.zones.nr_free() > self.opts.gc_low_zones
    }

    /// The most zones `n` consecutive blocks of a frontier can span: a compacted page is as
    /// many extents (a zone's summary blocks break the run).
    fn zones_spanned(&self, n: u32) -> u32 {
        let data = self.layout.data_blocks();
        match n {
            0 => 0,
            n => 1 + (n - 1).div_ceil(data),
        }
    }

    /// Blocks a compaction may copy now with `free` free zones: the GC frontier's room and
    /// that of the free zones above `gc_low_zones` but one.
    fn room_blocks(&self, st: &mut Meta, free: u32) -> u64 {
        let data = self.layout.data_blocks();
        let slot = st.zones.gc_slot();
        let frontier = st.zones.frontier(slot).as_ref().map_or(0, |f| data - f.wp);
        let zones = free.saturating_sub(self.opts.gc_low_zones + 1);
        frontier as u64 + zones as u64 * data as u64
    }

    /// Look at up to `budget` marked pages, in order, and start compacting the first that
    /// needs it: more extents than `compact_min_extents` and than the zones its blocks would
    /// span rewritten. It starts only if the room holds all its blocks; if not, it is put back
    /// when it would fit at `gc_start_zones` free zones ([`Compaction::NoRoom`]), and dropped
    /// (`compact_skipped`) when it would not: compacted in parts, it would only be scattered
    /// again. The caller holds `wlock`.
    pub(super) fn compact_next(&self, budget: u32) -> Result<Compaction, EngineError> {
        let mut st = self.state.lock();
        if st.gc_busy() {
            // A victim started meanwhile (a writer's paced GC): GC goes first.
            return Ok(Compaction::Scanning);
        }
        for _ in 0..budget {
            let Some(p) = st.compact.take_next() else {
                return Ok(Compaction::Nothing);
            };
            let reads = st.index.page_reads();
            let (n, extents) = st.index.page_extents(p).map_err(|e| self.fail(e))?;
            if st.index.page_reads() != reads {
                // As `gc_lookup`: others go first after a page read (`wlock` is held).
                MutexGuard::bump(&mut st);
            }
            if extents <= self.opts.compact_min_extents.max(self.zones_spanned(n)) {
                continue;
            }
            let free = st.zones.nr_free();
            if n as u64 <= self.room_blocks(&mut st, free) {
                let live = st.index.page_blocks(p).map_err(|e| self.fail(e))?;
                st.gc = Some(GcWork::compaction(p, live));
                return Ok(Compaction::Started);
            }
            if n as u64 <= self.room_blocks(&mut st, free.max(self.opts.gc_start_zones)) {
                st.compact.put_back(p);
                return Ok(Compaction::NoRoom);
            }
            self.stats.compact_skipped.fetch_add(1, Ordering::Relaxed);
        }
        Ok(if st.compact.len() == 0 {
            Compaction::Nothing
        } else {
            Compaction::Scanning
        })
    }

    /// Test hook: compact every marked page that needs it now, as an idle volume does
    /// (stopping where free zones run down to `gc_low_zones`; no GC in between). Returns
    /// the pages compacted.
    #[doc(hidden)]
    pub fn debug_compact(&self) -> Result<u64, EngineError> {
        self.check_failed()?;
        let before = self.stats.compact_pages.load(Ordering::Relaxed);
        loop {
            let _w = self.wlock.lock();
            let gc_busy = self.state.lock().gc_busy();
            if !gc_busy && self.compact_next(u32::MAX)? != Compaction::Started {
                break;
            }
            self.gc_one()?;
        }
        Ok(self.stats.compact_pages.load(Ordering::Relaxed) - before)
    }

    /// Test hook: the extents of each mapped page (1: one run on the device).
    #[doc(hidden)]
    pub fn debug_page_extents(&self) -> Vec<u32> {
        let mut st = self.state.lock();
        (0..st.index.nr_pages())
            .map(|p| st.index.page_extents(PageId(p)).expect("readable pages").1)
            .filter(|&e| e > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{CompactOn, PageSet};
    use crate::engine::ids::{Lba, PageId};

    #[test]
    fn pages_come_back_in_ascending_order_from_the_cursor() {
        let mut s = PageSet::new(200, CompactOn::Writes);
        for p in [3, 150, 64, 63, 199] {
            s.mark(PageId(p));
        }
        s.mark(PageId(3));
        assert_eq!(s.len(), 5);
        s.cursor = 64;
        let got: Vec<u32> = std::iter::from_fn(|| s.take_next()).map(|p| p.0).collect();
        assert_eq!(got, vec![64, 150, 199, 3, 63]);
        assert_eq!(s.len(), 0);
        s.mark_blocks(Lba(1019), 2);
        assert_eq!(s.take_next(), Some(PageId(0)));
        assert_eq!(s.take_next(), Some(PageId(1)));
        assert_eq!(s.take_next(), None);
    }
}
