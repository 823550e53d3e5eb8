//! The log-structured layout (issue 14; docs/design.md, "Log layout"; docs/log-layout.md):
//! every write is appended at the write pointer of an open sequential zone (a frontier), a
//! block-granular index finds the newest copy of each logical block, a metadata log in
//! conventional space makes each write durable before it is acknowledged, checkpoints fold
//! the log into the index pages, directory and zone table, and GC empties the zones with the
//! best cost-benefit score into a GC frontier.
//!
//! - [`layout`]: areas and on-disk blocks; [`format`], [`is_log_layout`];
//! - `record`: the log records (the log block header and scan are the v2 engine's,
//!   `engine::meta::log`, with record set version 2);
//! - `meta`: the one owner of the state (index, zones, log buffer) and `Meta::apply`;
//! - `index`: the paged index (directory, page cache, reads of pages from their slots);
//! - [`check`]: `zonedd check` for this layout (what open verifies, reading only);
//! - `io`: reads, writes, discards and frontier placement; `durable`: the log writer (group
//!   commit), flush, write-back of index pages and checkpoint; `gc`: garbage collection; `compact`: idle compaction by
//!   logical range; `background`: the thread that runs both off the request path; `open`:
//!   format, load, replay.
//!
//! Locks, in the order they are taken: `planned` (the blocks of planned writes in flight, `plan`),
//! a user frontier's turn (one write on that frontier at a time, from placing to logging; a planned
//! write's guard holds it from its plan to its completion), then `wlock` (one placer or logger at a
//! time: placing and appending records of writes, discards, GC, checkpoints; not held across a user
//! write's data I/O), then `log_write` (one log writer), then `state`; `reset` (read side held by a
//! read from its index lookup to its device read, and by a planned read until the caller's device
//! reads are done; write side by a zone reset, under `wlock`) is never taken with `state` held.
//! A planned read's holder (a queue thread) blocks meanwhile only on locks whose holders never
//! wait for `reset`: `log_write` and `state` (a blocking flush), `state` and `planned` (plans),
//! the device's zone locks and the pool's lock; so a reset cannot deadlock with it. It may wait
//! longer than the reads, though: while the queue thread is in a blocking flush it reaps no
//! read completion, and the reset (and GC, holding `wlock`) waits for that flush too.
//!
//! The background thread's mutex is innermost (a writer takes it under `state` to wake it).
//!
//! Not in this slice: stream and hot/cold user
//! frontiers (user writes go to any free user frontier).

mod background;
pub mod check;
mod compact;
mod durable;
mod gc;
mod index;
mod io;
pub mod layout;
mod meta;
mod open;
mod plan;
mod record;
mod zones;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};
use zbd::ZonedDevice;

pub use crate::engine::EngineError;
pub use background::Phase;
pub use compact::CompactOn;
pub use layout::{FormatOptions, DEFAULT_USER_FRONTIERS};
pub use open::{debug_reseal, format, is_log_layout};
pub use plan::{LogReadPlan, LogSyncPlan, LogWrite, LogWritePlan};

use layout::Layout;
use meta::Meta;

/// Engine tuning.
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// Below this many free zones, user writes pay GC as they go (see `gc.rs`, pacing).
    pub gc_start_zones: u32,
    /// A frontier that needs a zone with fewer than this many free runs GC to completion.
    pub gc_low_zones: u32,
    /// Free zones only GC may take (so it can always empty a victim); a user write that
    /// would take one gets ENOSPC once GC frees nothing.
    pub gc_reserve_zones: u32,
    /// Most blocks GC copies at once (one device read and write); paced GC pays its debt in
    /// such batches.
    pub gc_batch_blocks: u32,
    /// GC reads two blocks of a batch with one device read when at most this many blocks
    /// lie between them (read for nothing): 0 (the default) reads only consecutive blocks
    /// together, as suits memory and flash; on a disk a few blocks more cost less than the
    /// rotation a second read waits for (`zonedd create` takes `GC_READ_GAP_ROTATIONAL`
    /// when sysfs says the device spins).
    pub gc_read_gap_blocks: u32,
    /// Checkpoint when the current log half is this full (percent), or has no room.
    pub checkpoint_pct: u64,
    /// The background thread (`start_background`) also runs GC below this many free zones
    /// when the best victim is at least half invalid.
    pub gc_high_zones: u32,
    /// The background thread compacts only after this long without a read, write or
    /// discard.
    pub idle_period: Duration,
    /// Idle compaction rewrites an index page whose mapped blocks form more extents than
    /// this (and than the zones they would span rewritten).
    pub compact_min_extents: u32,
    /// Which pages idle compaction looks at: those reads found scattered (the default),
    /// those writes changed, or none.
    pub compact: CompactOn,
    /// With [`CompactOn::Reads`], a read that continues the one before it logically but
    /// starts elsewhere on the device also marks its pages (a stream written in pieces on
    /// several frontiers, scanned one device read per request). Off by default, as suits
    /// memory and flash, where such a scan costs no seek; `zonedd create` turns it on when
    /// sysfs says the device spins.
    pub compact_scans: bool,
    /// Plans of one thread that continue a stream may be placed behind one another at one
    /// user frontier, several in flight there together (`plan::Pipeline`), so that a
    /// stream written at a queue depth above one lands in logical order. It needs the
    /// kernel to keep a zone's writes in the order they were submitted (zone write
    /// plugging, Linux 6.10): off by default; `zonedd create` turns it on there.
    pub stream_pipelines: bool,
    /// Bytes the metadata state may keep resident: the index directory, 5 MiB for the rest
    /// of the state (zone table, frontier summaries, GC's live list: about 4.4 MiB at
    /// 10 TiB), and a cache of index pages in what is left (at least 1 page). The default
    /// holds a 10 TiB volume's metadata in 64 MiB (log-layout.md 5.6).
    pub index_memory: u64,
}

/// `LogOptions::gc_read_gap_blocks` on a spinning disk: 64 blocks (256 KiB) pass under the
/// head in 1.0-1.7 ms at 150-250 MB/s, less than the 4.2 ms half rotation (7,200 rpm) a
/// second read waits for on average.
pub const GC_READ_GAP_ROTATIONAL: u32 = 64;

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            gc_start_zones: 6,
            gc_low_zones: 3,
            gc_reserve_zones: 1,
            gc_batch_blocks: IO_BATCH_BLOCKS,
            gc_read_gap_blocks: 0,
            checkpoint_pct: 90,
            gc_high_zones: 12,
            idle_period: Duration::from_secs(2),
            compact_min_extents: 2,
            compact: CompactOn::Reads,
            compact_scans: false,
            stream_pipelines: false,
            index_memory: 64 << 20,
        }
    }
}

/// Counters and state, for status and tests.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LogStats {
    pub capacity_blocks: u64,
    /// Open zones taking user writes side by side (the superblock's `max_frontiers` - 1).
    pub user_frontiers: u64,
    pub zones_free: u64,
    pub zones_open: u64,
    pub zones_full: u64,
    pub valid_blocks: u64,
    pub user_blocks_written: u64,
    pub gc_blocks_copied: u64,
    pub gc_zones_freed: u64,
    /// Batches of GC copying paid by user writes (pacing), and victims a frontier had to
    /// wait for whole (fewer than `gc_low_zones` free).
    pub gc_paced_batches: u64,
    pub gc_forced_victims: u64,
    pub gc_runs_without_victim: u64,
    pub write_amplification: f64,
    /// Idle compaction: which pages it looks at, pages rewritten in logical order and their
    /// blocks, pages still to look at, and the background thread's phase and wake-ups.
    pub compact_on: CompactOn,
    pub compact_pages: u64,
    pub compact_blocks: u64,
    pub compact_marked_pages: u64,
    /// Fragmented pages left as they are: more blocks than the room GC keeps.
    pub compact_skipped_pages: u64,
    pub background: &'static str,
    pub background_wakeups: u64,
    pub checkpoints: u64,
    pub log_blocks_written: u64,
    pub device_flushes: u64,
    pub reads: u64,
    pub writes: u64,
    pub discards: u64,
    pub flushes: u64,
    /// Writes placed without blocking and written by the caller (the frontend's hop-free
    /// writes, `plan`), and writes through the engine that waited for a planned write over
    /// the same blocks; `planned_groups` counts the plans (a plan places one write, or
    /// several written with one device write: a write group), so that `planned_writes /
    /// planned_groups` is the mean group size.
    pub planned_writes: u64,
    pub planned_groups: u64,
    /// Plans placed behind another plan of the same thread still in flight at the same
    /// frontier, continuing its stream (`LogOptions::stream_pipelines`).
    pub planned_pipelined: u64,
    /// Writes through the engine that found every user frontier's turn taken and waited.
    pub turn_waits: u64,
    pub planned_write_waits: u64,
    /// Summary blocks that failed their CRC and were rebuilt from the index.
    pub summary_rebuilds: u64,
    /// At the last open: records replayed, and `Append` blocks dropped (not on the device).
    pub replayed_records: u64,
    pub replay_dropped_blocks: u64,
    /// The index's resident bytes (directory, cached pages): at most `index_memory` less
    /// 5 MiB, unless more pages are dirty than a write-back has yet cleaned (`zonedd check`,
    /// which never writes back, keeps every page its replay changes).
    pub index_resident_bytes: u64,
    /// Pages the directory stores as one extent (no page is read for them).
    pub index_extent_pages: u64,
    /// Pages cached, and the most the cache holds.
    pub index_cached_pages: u64,
    pub index_cache_pages: u64,
    /// Pages read from their slots (cache misses, and open's one pass over the whole index),
    /// and pages written back between checkpoints.
    pub index_page_reads: u64,
    pub index_pages_written_back: u64,
}

#[derive(Default)]
struct Counters {
    user_blocks: AtomicU64,
    gc_blocks: AtomicU64,
    gc_zones: AtomicU64,
    gc_paced: AtomicU64,
    gc_forced: AtomicU64,
    gc_no_victim: AtomicU64,
    compact_pages: AtomicU64,
    compact_blocks: AtomicU64,
    compact_skipped: AtomicU64,
    /// Reads that marked pages for compaction (activity: a planned read counts in `reads`
    /// only once it completes).
    read_marks: AtomicU64,
    checkpoints: AtomicU64,
    log_blocks: AtomicU64,
    dev_flushes: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    discards: AtomicU64,
    flushes: AtomicU64,
    planned: AtomicU64,
    planned_groups: AtomicU64,
    pipelined: AtomicU64,
    turn_waits: AtomicU64,
    planned_waits: AtomicU64,
    summary_rebuilds: AtomicU64,
    replayed: AtomicU64,
    replay_dropped: AtomicU64,
    pages_written_back: AtomicU64,
}

/// A log-layout volume, open.
pub struct LogEngine {
    dev: Arc<dyn ZonedDevice>,
    layout: Layout,
    opts: LogOptions,
    state: Mutex<Meta>,
    /// One per user frontier: held by the write placing on it, from placing to logging (the
    /// planned writes of a `plan::Pipeline` hold it together, from the first plan to the
    /// last one's completion).
    turns: Vec<Arc<Mutex<()>>>,
    next_turn: AtomicUsize,
    /// Per user frontier, the writes through the engine waiting for its turn: a stream's
    /// pipeline there takes no more plans meanwhile, so that it ends and lets them in.
    turn_waiters: Vec<AtomicUsize>,
    wlock: Mutex<()>,
    /// The one log writer (a planned log write holds it while its blocks are written by the
    /// caller, `plan::LogWrite`).
    log_write: Arc<Mutex<()>>,
    /// The planned writes in flight and the user frontiers' pipelines (`plan::Planned`): a
    /// write or discard through the engine that overlaps a planned write waits on
    /// `planned_done` until it has logged its record, so that it is not overtaken by an
    /// older write.
    planned: Mutex<plan::Planned>,
    planned_done: Condvar,
    /// Notified (with `state`) when a GC batch copied without `wlock` is back in `Meta::gc`.
    gc_copied: Condvar,
    /// Threads waiting on `gc_copied` (a test hook reads it).
    gc_copy_waiters: AtomicUsize,
    /// Read side: a read from its index lookup to the end of its device reads (a planned
    /// read's guard holds it until the caller's reads are done, `plan::LogReadPlan`); write
    /// side: a zone reset. `Arc`ed for the planned reads' owned guards.
    reset: Arc<RwLock<()>>,
    failed: Mutex<Option<String>>,
    stats: Counters,
    /// The background thread (GC to its watermark, idle compaction).
    bg: Arc<background::Background>,
}

impl Drop for LogEngine {
    fn drop(&mut self) {
        self.stop_background();
    }
}

impl LogEngine {
    /// Where the caller may read, and write, the device itself (`zbd::ReadSource`): the
    /// data of [`LogEngine::plan_write`] and the blocks of [`LogEngine::plan_sync`].
    pub fn read_source(&self) -> Option<zbd::ReadSource> {
        self.dev.read_source()
    }

    /// Exposed bytes.
    pub fn capacity(&self) -> u64 {
        self.layout.user_blocks * BLOCK as u64
    }

    /// Checkpoint and close.
    pub fn close(self) -> Result<(), EngineError> {
        self.check_failed()?;
        let _w = self.wlock.lock();
        self.checkpoint()
    }

    /// Test hook: checkpoint now (what a full log half or close does), whatever is
    /// unflushed.
    #[doc(hidden)]
    pub fn debug_checkpoint(&self) -> Result<(), EngineError> {
        self.check_failed()?;
        let _w = self.wlock.lock();
        self.checkpoint()
    }

    /// Test hook: the state's invariants (valid counts match the index, every mapped block
    /// lies in the written data part of an open or full zone, frontiers match the device's
    /// write pointers). Call with no request in flight.
    #[doc(hidden)]
    pub fn debug_check(&self) -> Result<(), String> {
        let zones = self.dev.report_all().map_err(|e| e.to_string())?;
        self.state.lock().check(&zones)
    }

    pub fn stats(&self) -> LogStats {
        let st = self.state.lock();
        let z = &st.zones;
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let user = c(&self.stats.user_blocks);
        let gc = c(&self.stats.gc_blocks);
        LogStats {
            capacity_blocks: self.layout.user_blocks,
            user_frontiers: self.layout.user_frontiers() as u64,
            zones_free: z.nr_free() as u64,
            zones_open: z.count(|s| matches!(s, zones::ZoneState::Open(_))) as u64,
            zones_full: z.count(|s| s == zones::ZoneState::Full) as u64,
            valid_blocks: z.info.iter().map(|i| i.valid as u64).sum(),
            user_blocks_written: user,
            gc_blocks_copied: gc,
            gc_zones_freed: c(&self.stats.gc_zones),
            gc_paced_batches: c(&self.stats.gc_paced),
            gc_forced_victims: c(&self.stats.gc_forced),
            gc_runs_without_victim: c(&self.stats.gc_no_victim),
            write_amplification: if user == 0 {
                0.0
            } else {
                (user + gc + c(&self.stats.compact_blocks)) as f64 / user as f64
            },
            compact_pages: c(&self.stats.compact_pages),
            compact_blocks: c(&self.stats.compact_blocks),
            compact_marked_pages: st.compact.len() as u64,
            compact_on: st.compact.on(),
            compact_skipped_pages: c(&self.stats.compact_skipped),
            background: self.bg.phase().name(),
            background_wakeups: self.bg.wakeups.load(Ordering::Relaxed),
            checkpoints: c(&self.stats.checkpoints),
            log_blocks_written: c(&self.stats.log_blocks),
            device_flushes: c(&self.stats.dev_flushes),
            reads: c(&self.stats.reads),
            writes: c(&self.stats.writes),
            discards: c(&self.stats.discards),
            flushes: c(&self.stats.flushes),
            planned_writes: c(&self.stats.planned),
            planned_groups: c(&self.stats.planned_groups),
            planned_pipelined: c(&self.stats.pipelined),
            turn_waits: c(&self.stats.turn_waits),
            planned_write_waits: c(&self.stats.planned_waits),
            summary_rebuilds: c(&self.stats.summary_rebuilds),
            replayed_records: c(&self.stats.replayed),
            replay_dropped_blocks: c(&self.stats.replay_dropped),
            index_resident_bytes: st.index.resident_bytes(),
            index_extent_pages: st.index.extent_pages(),
            index_cached_pages: st.index.cached_pages() as u64,
            index_cache_pages: st.index.cache_cap() as u64,
            index_page_reads: st.index.page_reads(),
            index_pages_written_back: c(&self.stats.pages_written_back),
        }
    }

    fn check_failed(&self) -> Result<(), EngineError> {
        match &*self.failed.lock() {
            Some(m) => Err(EngineError::Failed(m.clone())),
            None => Ok(()),
        }
    }

    /// Stop the engine: every later request fails. Returns `e` for the caller to report.
    fn fail(&self, e: EngineError) -> EngineError {
        let mut f = self.failed.lock();
        if f.is_none() {
            tracing::warn!(error = %e, "log engine stopped");
            *f = Some(e.to_string());
        }
        e
    }

    /// A device result: an error stops the engine (metadata or data placement may be half
    /// done).
    fn dev<T>(&self, r: zbd::Result<T>) -> Result<T, EngineError> {
        r.map_err(|e| self.fail(EngineError::Device(e)))
    }

    /// (first block, blocks) of a request, or why it is refused.
    fn range(&self, offset: u64, len: usize) -> Result<(u32, u32), EngineError> {
        let b = BLOCK as u64;
        let len = len as u64;
        if !offset.is_multiple_of(b) || !len.is_multiple_of(b) {
            return Err(EngineError::Invalid(format!(
                "offset {offset} and length {len} must be multiples of {b}"
            )));
        }
        if offset.checked_add(len).is_none_or(|e| e > self.capacity()) {
            return Err(EngineError::Invalid(format!(
                "{len} bytes at {offset} are beyond the capacity {}",
                self.capacity()
            )));
        }
        Ok(((offset / b) as u32, (len / b) as u32))
    }
}

use crate::engine::ids::{BLOCK, IO_BATCH_BLOCKS};

/// The unit tests' volume: 20 zones of 64 KiB, 4 conventional, a 32-block log ring.
#[cfg(test)]
pub(crate) fn test_volume() -> Arc<zbd::MemDevice> {
    let dev = Arc::new(zbd::MemDevice::with_zones(64 << 10, 20, 4).unwrap());
    let opts = FormatOptions {
        log_blocks: 32,
        ..FormatOptions::default()
    };
    format(&*dev, &opts).unwrap();
    dev
}
