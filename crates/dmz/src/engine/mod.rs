//! The running chunk-mapping engine: a zoned device behind an ordinary-disk interface, in
//! dm-zoned's v2 on-disk format.
//!
//! - [`meta`]: the one owner of the metadata state (zone table, map and bitmaps, metadata
//!   log and its records), with durability (log writes, flushes, commits) and open/replay;
//! - [`io`]: reads, writes (one function per write case), discards;
//! - [`reclaim`]: garbage collection (the thread and victim choice apart from each action);
//! - [`ids`]: `ZoneId`, `ChunkId`, `Mapping`, the block and I/O batch sizes.
//!
//! Locks and the order they are taken in: see [`meta`] (and docs/design.md, "Locking").

pub(crate) mod ids;
mod io;
pub(crate) mod meta;
mod reclaim;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use tracing::{info, warn};
use zbd::{Geometry, ZbdError, ZoneCondition, ZonedDevice};

use crate::format::{FormatError, Layout, Superblock};

use ids::{ChunkId, ZoneId, BLOCK};
use meta::durability;
use meta::{ConvQueue, Meta, Role};

pub use io::{ReadPlan, ReadSegment, WritePlan};
pub use meta::durability::{FlushPlan, FlushStep, LogWrite, SyncPlan};
pub use reclaim::{ReclaimOptions, VictimPolicy};
pub use zbd::ReadSource;

/// Engine tuning.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub reclaim: ReclaimOptions,
    /// Fold the log into the v2 sets at least this often while something is dirty.
    pub commit_interval: Duration,
    /// Clean bitmap blocks kept cached (4 KiB each); dirty ones are pinned on top.
    pub cache_bitmap_blocks: usize,
    /// Commit when the current log half is this full (percent).
    pub log_commit_pct: u64,
    /// A first write at a chunk's first block goes straight to a free sequential zone
    /// (false: dm-zoned's behaviour, every new chunk starts in a conventional zone).
    pub direct_sequential: bool,
    /// On a volume of several zoned drives, take each sequential zone from the drive with
    /// the fewest zones being written, so that concurrent streams and reclaim use every
    /// drive at once (false: in zone order, the first drive until it is full).
    pub spread_over_drives: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            reclaim: ReclaimOptions::default(),
            commit_interval: Duration::from_secs(10),
            cache_bitmap_blocks: 1024,
            log_commit_pct: 50,
            direct_sequential: true,
            spread_over_drives: true,
        }
    }
}

/// What the engine can fail with; [`EngineError::errno`] is what a block device returns.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("no space left: {0}")]
    NoSpace(String),
    #[error("read-only zone: {0}")]
    ReadOnly(String),
    #[error(transparent)]
    Device(#[from] ZbdError),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("metadata: {0}")]
    Meta(String),
    #[error("engine stopped after an earlier error: {0}")]
    Failed(String),
}

impl EngineError {
    pub fn errno(&self) -> i32 {
        match self {
            EngineError::Invalid(_) => libc::EINVAL,
            EngineError::NoSpace(_) => libc::ENOSPC,
            EngineError::ReadOnly(_) => libc::EROFS,
            EngineError::Device(e) | EngineError::Format(FormatError::Zbd(e)) => {
                device_errno(e.errno())
            }
            EngineError::Format(_) | EngineError::Meta(_) | EngineError::Failed(_) => libc::EIO,
        }
    }
}

/// What a block-layer caller sees of a backend failure: ENOSPC and EROFS say something the
/// filesystem can act on; any other device error (ENODEV of a vanished disk, EREMOTEIO from
/// the SCSI stack, ETOOMANYREFS from a zone limit) is an I/O error.
fn device_errno(errno: i32) -> i32 {
    match errno {
        libc::ENOSPC | libc::EROFS => errno,
        _ => libc::EIO,
    }
}

/// What a write from [`Engine::write_unsynced`] still needs before it may be acknowledged:
/// the metadata log written up to (not including) this sequence number; nothing when 0.
#[must_use = "a write is acknowledged only after Engine::sync"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsynced {
    upto: u64,
}

impl Unsynced {
    /// Nothing left to write (a FUA write, or one that logged nothing).
    pub const NOTHING: Unsynced = Unsynced { upto: 0 };

    /// As a number, for a caller that carries it through a type-erased interface (the
    /// frontend's `SyncToken`).
    pub fn into_raw(self) -> u64 {
        self.upto
    }

    /// Back from [`Unsynced::into_raw`]. Any number is safe: syncing writes the log as far
    /// as it has records, at most.
    pub fn from_raw(upto: u64) -> Unsynced {
        Unsynced { upto }
    }
}

/// Counters and zone usage, for `zonedd status` and benches.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EngineStats {
    pub zones_total: u64,
    pub zones_free: u64,
    pub zones_free_conventional: u64,
    pub zones_free_sequential: u64,
    pub zones_mapped: u64,
    pub zones_buffer: u64,
    pub zones_reserved: u64,
    pub zones_pending_free: u64,
    pub zones_meta: u64,
    pub zones_offline: u64,
    pub zones_read_only: u64,
    pub chunks_total: u64,
    pub chunks_mapped: u64,
    pub reclaim_state: String,
    /// [`Engine::trigger_reclaim`] calls so far, and how many of them reclaim is done with
    /// (it handled them and is asleep again, as [`Engine::wait_reclaim_idle`] waits for):
    /// a client that asked for reclaim polls until `reclaim_requests_done` reaches its
    /// request.
    pub reclaim_requests: u64,
    pub reclaim_requests_done: u64,
    /// Metadata changed since the last commit (the commit thread has a timer armed).
    pub metadata_dirty: bool,
    pub reclaim_progress_blocks: u64,
    pub reclaim_zones: u64,
    pub reclaim_blocks_copied: u64,
    /// Blocks of out-of-order sequential streams copied from the buffer zone to the data
    /// zone once the stream reached them (see `io::catch_up`).
    pub catch_up_blocks: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub discards: u64,
    pub flushes: u64,
    pub fua_writes: u64,
    /// Write steps that overwrote valid blocks of a conventional zone in place and needed
    /// no log record (`Meta::overwrite_needs_no_record`).
    pub unlogged_overwrites: u64,
    /// Device flushes made only to prove flushed records before they are overwritten in
    /// place or their zone is reused (design.md, "Why proven must be durable").
    pub proof_flushes: u64,
    /// Overwrites in place whose record was written before their data (design.md,
    /// "Overwrites in place and kill -9").
    pub written_ahead: u64,
    /// Writes a caller put on the device itself from a [`WritePlan`] (hop-free writes).
    pub planned_writes: u64,
    pub commits: u64,
    pub log_block_writes: u64,
    pub device_bytes_written: u64,
    pub write_amplification: f64,
    pub metadata_mem_bytes: u64,
    pub cached_bitmap_blocks: u64,
    /// Memory held by reclaim's copy buffers between copies (`reclaim::copy::copy`).
    pub reclaim_buffer_bytes: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    discards: AtomicU64,
    flushes: AtomicU64,
    fua: AtomicU64,
    unlogged: AtomicU64,
    proof_flushes: AtomicU64,
    written_ahead: AtomicU64,
    planned_writes: AtomicU64,
    commits: AtomicU64,
    dev_bytes: AtomicU64,
    reclaim_zones: AtomicU64,
    reclaim_blocks: AtomicU64,
    catch_up_blocks: AtomicU64,
    reclaim_progress: AtomicU64,
    /// Blocks reclaim has copied so far, counted at each write of a copy (not at the end
    /// of a zone): what writers waiting for a zone watch to tell slow reclaim from none.
    reclaim_copied_total: AtomicU64,
}

/// Everything behind the state lock: the metadata, and who waits for zones.
struct State {
    meta: Meta,
    /// Writers waiting for a free zone.
    waiters: u32,
    /// The order in which waiting writers get free conventional zones.
    conv_queue: ConvQueue,
    /// When a writer last had to wait for a free zone.
    last_wait: Option<Instant>,
    /// Completed reclaim passes, and whether the last one freed anything.
    reclaim_passes: u64,
    reclaim_last_progress: bool,
    /// The last reclaim pass ended because nothing was reclaimable at all (no candidate, no
    /// zone waiting for a flush), not because it was busy or interrupted.
    reclaim_exhausted: bool,
    last_io: Instant,
    /// Overwrites in place a flush must know about (`durability::InPlaceWrites`).
    in_place: meta::durability::InPlaceWrites,
    /// Write plans in flight (`io::PlannedWrites`).
    planned: io::PlannedWrites,
}

impl State {
    fn new(meta: Meta) -> State {
        State {
            meta,
            waiters: 0,
            conv_queue: ConvQueue::default(),
            last_wait: None,
            reclaim_passes: 0,
            reclaim_last_progress: false,
            reclaim_exhausted: false,
            last_io: Instant::now(),
            in_place: Default::default(),
            planned: Default::default(),
        }
    }
}

/// Background thread control.
#[derive(Default)]
struct Bg {
    stop: bool,
    commit_wanted: bool,
    reclaim_kick: u64,
    /// The last kick the reclaim thread picked up.
    reclaim_seen: u64,
    /// Something reclaimable appeared: re-evaluate.
    reclaim_hint: bool,
    reclaim_running: bool,
    /// `reclaim_seen` when the reclaim thread last went to sleep: every kick up to it has
    /// been handled (what `EngineStats::reclaim_requests_done` shows).
    reclaim_done: u64,
    /// When metadata first changed since the last commit (None: clean).
    dirty_since: Option<Instant>,
}

/// What the engine's threads share. Lock order: [`meta`].
struct Inner {
    dev: Arc<dyn ZonedDevice>,
    geo: Geometry,
    layout: Layout,
    zone_blocks: u32,
    /// Each member device's zones (one range for a single device).
    members: Vec<std::ops::Range<u32>>,
    sb: Mutex<Superblock>,
    opts: EngineOptions,
    state: Mutex<State>,
    free_cv: Condvar,
    /// `Arc`ed so that a [`LogWrite`] can own it while its caller's ring writes the log.
    log_write: Arc<Mutex<()>>,
    commit_lock: Mutex<()>,
    /// Striped by chunk; `Arc`ed so that a [`ReadPlan`] can own a read guard.
    chunk_locks: Vec<Arc<RwLock<()>>>,
    stats: Counters,
    failed: Mutex<Option<String>>,
    is_failed: AtomicBool,
    bg: Mutex<Bg>,
    bg_cv: Condvar,
    reclaim_cv: Condvar,
    idle_cv: Condvar,
    /// Reclaim's copy buffers, kept between copies (a leaf lock): see
    /// `reclaim::copy::copy`.
    copy_bufs: Mutex<Vec<zbd::AlignedBuf>>,
}

/// What [`Inner::recheck_zone`] learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recheck {
    /// Offline or read-only: retired with this role.
    Lost(Role),
    Usable,
    /// The device did not answer.
    Unknown,
}

/// The error for I/O a retired zone cannot serve: EROFS for a read-only one, EIO for a
/// lost one.
fn retired_error(role: Role, chunk: ChunkId, zone: ZoneId) -> EngineError {
    if role == Role::ReadOnly {
        EngineError::ReadOnly(format!("chunk {chunk} (zone {zone})"))
    } else {
        EngineError::Device(ZbdError::device(
            format!("chunk {chunk}: zone {zone} is offline"),
            libc::EIO,
        ))
    }
}

/// The engine. Safe for concurrent calls from many threads.
pub struct Engine {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
    closed: bool,
}

impl Inner {
    fn check_failed(&self) -> Result<(), EngineError> {
        if self.is_failed.load(Ordering::Acquire) {
            let why = self.failed.lock().clone().unwrap_or_default();
            return Err(EngineError::Failed(why));
        }
        Ok(())
    }

    /// A metadata update could not be made durable: stop accepting writes.
    fn fail(&self, e: &EngineError) {
        let mut f = self.failed.lock();
        if f.is_none() {
            warn!(error = %e, "engine failed; further writes return EIO");
            *f = Some(e.to_string());
        }
        self.is_failed.store(true, Ordering::Release);
        self.free_cv.notify_all();
    }

    fn chunk_lock(&self, chunk: ChunkId) -> &Arc<RwLock<()>> {
        &self.chunk_locks[chunk.idx() % self.chunk_locks.len()]
    }

    fn zone_offset(&self, zone: ZoneId, block: u32) -> u64 {
        self.geo.zone_start(zone.0) + block as u64 * BLOCK as u64
    }

    fn dev_write(&self, buf: &[u8], off: u64) -> Result<(), ZbdError> {
        self.dev.write_at(buf, off)?;
        self.stats
            .dev_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// After an operation on `zone` failed (or before reclaim trusts it): ask the device
    /// what became of it. An offline or read-only zone is retired for good; otherwise a
    /// sequential zone's write pointer is taken from the report (blocks past it were never
    /// valid: validity is only set after a write completes).
    fn recheck_zone(&self, zone: ZoneId) -> Recheck {
        let Some(r) = self
            .dev
            .report_zones(zone.0, 1)
            .ok()
            .and_then(|r| r.first().cloned())
        else {
            return Recheck::Unknown;
        };
        let role = match r.cond {
            ZoneCondition::Offline => Role::Offline,
            ZoneCondition::ReadOnly => Role::ReadOnly,
            _ => {
                if r.zone_type.is_sequential() {
                    let wp = if r.cond == ZoneCondition::Full {
                        self.zone_blocks
                    } else {
                        ((r.wp - r.start) / BLOCK as u64) as u32
                    };
                    self.state.lock().meta.set_wp(zone, wp);
                }
                return Recheck::Usable;
            }
        };
        let mut st = self.state.lock();
        if !st.meta.is_retired(zone) {
            warn!(%zone, ?role, "zone lost; retired");
        }
        st.meta.retire(zone, role);
        Recheck::Lost(role)
    }

    /// New reclaimable state (a conventional data zone, a buffer): let reclaim re-evaluate.
    fn kick_reclaim_lazy(&self) {
        let mut bg = self.bg.lock();
        if bg.reclaim_hint {
            return;
        }
        bg.reclaim_hint = true;
        drop(bg);
        self.reclaim_cv.notify_all();
    }

    fn kick_reclaim(&self) {
        let mut bg = self.bg.lock();
        bg.reclaim_kick += 1;
        drop(bg);
        self.reclaim_cv.notify_all();
    }
}

impl Engine {
    /// Open a formatted device: load and resync the sets, replay the log, fold it with a
    /// commit, start the commit and reclaim threads.
    pub fn open(dev: Arc<dyn ZonedDevice>, opts: EngineOptions) -> Result<Engine, EngineError> {
        let inner = Arc::new(meta::open::load(dev, opts)?);
        let mut threads = Vec::new();
        let spawn = |name: &str, f: fn(&Arc<Inner>)| {
            let i = inner.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f(&i))
                .map_err(|e| EngineError::Meta(format!("spawn {name} thread: {e}")))
        };
        threads.push(spawn("dmz-commit", durability::commit_thread)?);
        if inner.opts.reclaim.enabled {
            threads.push(spawn("dmz-reclaim", reclaim::reclaim_thread)?);
        }
        info!(
            chunks = inner.layout.nr_chunks,
            dev = %inner.dev.describe(),
            "engine open"
        );
        Ok(Engine {
            inner,
            threads,
            closed: false,
        })
    }

    /// Bytes exposed.
    pub fn capacity(&self) -> u64 {
        self.inner.layout.exposed_bytes()
    }

    /// Bytes per chunk (= zone size).
    pub fn chunk_size(&self) -> u64 {
        self.inner.geo.zone_size
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        io::read(&self.inner, offset, buf)
    }

    /// Where [`ReadPlan`] segments are read from, if the device lets callers read it
    /// themselves (a block device, an emulated image); `None`: use [`Engine::read`].
    pub fn read_source(&self) -> Option<ReadSource> {
        self.inner.dev.read_source()
    }

    /// A read of `[offset, offset + len)` (inside one chunk) planned without blocking: the
    /// device ranges and zero fills that make it up, with the chunk's read lock held until
    /// the plan is dropped, so nothing frees, resets or rewrites those zones meanwhile.
    /// `None` whenever it cannot be had at once (the chunk or state lock is taken, a bitmap
    /// block is not cached, a zone is retired, the device has no [`ReadSource`], the range
    /// is invalid or crosses a chunk end): [`Engine::read`] then does it.
    pub fn plan_read(&self, offset: u64, len: u64) -> Option<ReadPlan> {
        io::plan_read(&self.inner, offset, len)
    }

    /// A write of `data` at `offset` (inside one chunk, at most `IO_BATCH_BLOCKS` blocks)
    /// that the caller may put on the device itself, planned without blocking: an
    /// overwrite in place of the chunk's conventional zone that needs nothing before its
    /// data but, for valid blocks whose records are not flushed, its own record, appended
    /// here and synced by the caller first ([`WritePlan::sync_first`]) (docs/design.md,
    /// "Hop-free writes"). The plan holds the chunk's lock shared, and its blocks, until it
    /// is completed or dropped. `None` whenever that cannot be had at once (any other write
    /// case, the chunk or state lock taken, blocks of another plan in flight, a bitmap
    /// block not cached, the engine failed): [`Engine::write`] then does it. Not for FUA
    /// writes.
    pub fn plan_write(&self, offset: u64, data: &[u8]) -> Option<WritePlan> {
        io::plan_write(&self.inner, offset, data)
    }

    /// Write, and return once the write survives a daemon crash (its log block written);
    /// with `fua`, a power cut too.
    pub fn write(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), EngineError> {
        let w = io::write(&self.inner, offset, buf, fua, &|| {})?;
        io::sync(&self.inner, w)
    }

    /// [`Engine::write`] without its last step, the metadata-log write that writes done
    /// together can share: the data is on the device and reads see it, but the write must
    /// not be acknowledged before [`Engine::sync`] of what this returns succeeded. Writes
    /// done one after another and then synced in any order cost one log write together
    /// (the frontend does this for the writes of one pool batch). `before_wait` runs, with
    /// no engine lock held, whenever the write is about to sleep until a zone is free: the
    /// caller acknowledges what it held back (`workpool::run_deferred`), so that a write
    /// stuck behind reclaim does not hold back the writes done before it.
    pub fn write_unsynced(
        &self,
        offset: u64,
        buf: &[u8],
        fua: bool,
        before_wait: &dyn Fn(),
    ) -> Result<Unsynced, EngineError> {
        io::write(&self.inner, offset, buf, fua, before_wait)
    }

    /// [`Engine::sync`] for a caller that writes the log itself, without blocking: `Done`
    /// when `w`'s records are written already, `Busy` when another thread is writing the
    /// log (then [`Engine::sync`] waits for it), else the blocks to write
    /// ([`LogWrite`], which holds the log writer's lock until it is completed).
    pub fn plan_sync(&self, w: Unsynced) -> Result<SyncPlan, EngineError> {
        meta::durability::plan_sync(&self.inner, w.upto)
    }

    /// Make a write from [`Engine::write_unsynced`] survive a daemon crash.
    pub fn sync(&self, w: Unsynced) -> Result<(), EngineError> {
        io::sync(&self.inner, w)
    }

    pub fn discard(&self, offset: u64, len: u64) -> Result<(), EngineError> {
        io::discard(&self.inner, offset, len)
    }

    /// Blocks read back as zeros afterwards (by invalidation, like dm-zoned).
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), EngineError> {
        io::discard(&self.inner, offset, len)
    }

    /// Every write completed before this call, and the metadata that finds it, is durable
    /// when it returns.
    pub fn flush(&self) -> Result<(), EngineError> {
        self.inner.check_failed()?;
        self.inner.stats.flushes.fetch_add(1, Ordering::Relaxed);
        durability::flush(&self.inner, false)
    }

    /// [`Engine::flush`] for a caller that does its device I/O on its own ring: the same
    /// steps, handed out by [`FlushPlan::step`] (log writes, then device flushes, with
    /// the proof round when one is needed). Only for a device with a
    /// [`zbd::ReadSource`] (whose flush is an `fdatasync` of its fd).
    pub fn plan_flush(&self) -> Result<FlushPlan, EngineError> {
        self.inner.check_failed()?;
        self.inner.stats.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(FlushPlan::new(&self.inner))
    }

    pub fn stats(&self) -> EngineStats {
        let i = &self.inner;
        let c = &i.stats;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let wb = ld(&c.write_bytes);
        let db = ld(&c.dev_bytes);
        let mut s = EngineStats {
            reclaim_progress_blocks: ld(&c.reclaim_progress),
            reclaim_zones: ld(&c.reclaim_zones),
            reclaim_blocks_copied: ld(&c.reclaim_blocks),
            catch_up_blocks: ld(&c.catch_up_blocks),
            reads: ld(&c.reads),
            read_bytes: ld(&c.read_bytes),
            writes: ld(&c.writes),
            write_bytes: wb,
            discards: ld(&c.discards),
            flushes: ld(&c.flushes),
            fua_writes: ld(&c.fua),
            unlogged_overwrites: ld(&c.unlogged),
            proof_flushes: ld(&c.proof_flushes),
            written_ahead: ld(&c.written_ahead),
            planned_writes: ld(&c.planned_writes),
            commits: ld(&c.commits),
            device_bytes_written: db,
            write_amplification: if wb == 0 { 0.0 } else { db as f64 / wb as f64 },
            ..EngineStats::default()
        };
        let st = i.state.lock();
        st.meta.fill_stats(&mut s);
        s.metadata_mem_bytes += (i.chunk_locks.len()
            * (std::mem::size_of::<Arc<RwLock<()>>>() + std::mem::size_of::<RwLock<()>>() + 16))
            as u64;
        let bg = i.bg.lock();
        s.reclaim_state = if bg.reclaim_running {
            "running"
        } else {
            "idle"
        }
        .into();
        s.reclaim_requests = bg.reclaim_kick;
        s.reclaim_requests_done = if i.opts.reclaim.enabled {
            bg.reclaim_done
        } else {
            bg.reclaim_kick
        };
        s.metadata_dirty = bg.dirty_since.is_some();
        drop(bg);
        drop(st);
        s.reclaim_buffer_bytes = i.copy_bufs.lock().iter().map(|b| b.capacity() as u64).sum();
        s
    }

    /// Diagnostics: a chunk's mapping and its zones, one line.
    #[doc(hidden)]
    pub fn debug_chunk(&self, chunk: u32) -> String {
        self.inner.state.lock().meta.describe_chunk(ChunkId(chunk))
    }

    /// Diagnostics: check the in-memory invariants (weights match bitmaps, no block valid
    /// in both zones of a chunk, nothing valid past a sequential write pointer). Takes every
    /// chunk lock: call it with no I/O in flight.
    #[doc(hidden)]
    pub fn debug_check(&self) -> Result<(), String> {
        let i = &self.inner;
        let _c: Vec<_> = i.chunk_locks.iter().map(|l| l.write()).collect();
        i.state.lock().meta.check_invariants(&*i.dev)
    }

    /// Test hook: reclaim `chunk` now, on the calling thread. Not `urgent`: skipped (false)
    /// while I/O holds the chunk, as a background pass does; `urgent`: waits for it, as a
    /// pass for a writer waiting for a zone does. True if zones were freed.
    #[doc(hidden)]
    pub fn debug_reclaim_chunk(&self, chunk: u32, urgent: bool) -> Result<bool, EngineError> {
        reclaim::reclaim_chunk(&self.inner, ChunkId(chunk), urgent)
    }

    /// Test hook: commit now (fold the log into the v2 sets), as the commit thread does.
    #[doc(hidden)]
    pub fn debug_commit(&self) -> Result<(), EngineError> {
        durability::commit(&self.inner)
    }

    /// Ask reclaim to run a pass now, whatever the watermarks say.
    pub fn trigger_reclaim(&self) {
        self.inner.kick_reclaim();
    }

    /// Wait until reclaim has nothing left to do for the requests made so far.
    pub fn wait_reclaim_idle(&self) {
        reclaim::wait_idle(&self.inner);
    }

    /// Stop reclaim, then a final commit folding the log into the v2 sets. Debug builds
    /// check the in-memory invariants first.
    pub fn close(mut self) -> Result<(), EngineError> {
        self.stop_threads();
        self.closed = true;
        self.inner.check_failed()?;
        if cfg!(debug_assertions) {
            if let Err(e) = self.debug_check() {
                return Err(EngineError::Meta(format!("invariant broken at close: {e}")));
            }
        }
        durability::flush(&self.inner, false)?;
        durability::commit(&self.inner)?;
        self.reset_unmapped_zones()?;
        info!("engine closed");
        Ok(())
    }

    /// After the final commit no record can point into an unmapped zone any more, so the
    /// sequential ones the engine freed lazily (reset only when reused, since a crash before
    /// their Free record was durable would need their data) are reset now: dm-zoned and
    /// dmzadm expect every unmapped sequential zone to be empty.
    fn reset_unmapped_zones(&self) -> Result<(), EngineError> {
        let stale = self.inner.state.lock().meta.stale_free_zones();
        for z in stale {
            if let Err(e) = self.inner.dev.zone_mgmt(zbd::ZoneOp::Reset, z.0) {
                // A zone that went offline or read-only is retired, not an error.
                if let Recheck::Lost(_) = self.inner.recheck_zone(z) {
                    continue;
                }
                return Err(e.into());
            }
            self.inner.state.lock().meta.set_wp(z, 0);
        }
        Ok(())
    }

    /// Test hook: stop the threads and drop everything in memory without flushing or
    /// committing, as a daemon killed with SIGKILL would.
    pub fn crash_for_test(mut self) {
        self.stop_threads();
        self.closed = true;
    }

    fn stop_threads(&mut self) {
        {
            let mut bg = self.inner.bg.lock();
            bg.stop = true;
        }
        self.inner.bg_cv.notify_all();
        self.inner.reclaim_cv.notify_all();
        self.inner.free_cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.stop_threads();
        if self.inner.check_failed().is_ok() {
            if let Err(e) =
                durability::flush(&self.inner, false).and_then(|_| durability::commit(&self.inner))
            {
                warn!(error = %e, "commit at drop failed");
            }
        }
    }
}
