//! The running chunk-mapping engine: a zoned device behind an ordinary-disk interface, in
//! dm-zoned's v2 on-disk format.
//!
//! - [`zones`]: the zone table and free pools;
//! - [`metacache`]: the pinned map and the bounded LRU cache of bitmap blocks;
//! - [`log`]: the metadata log that makes every acknowledged write crash-safe;
//! - [`io`]: reads, writes, discards;
//! - [`commit`]: flush, FUA, two-phase commit, load-time replay;
//! - [`reclaim`]: garbage collection.
//!
//! Locks, outermost first: a chunk's `RwLock` (striped), `commit_lock`, `log_write`, then
//! `state`. See docs/design.md, "Locking".

mod commit;
mod io;
mod log;
mod metacache;
mod reclaim;
mod zones;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use tracing::{info, warn};
use zbd::{Geometry, ZbdError, ZoneCondition, ZonedDevice};

use crate::format::{decode_map_block, FormatError, Layout, MapEntry, Superblock, BLOCK};
use crate::sets;

use log::{LogBuf, Rec, NONE};
use metacache::MetaCache;
use zones::{Role, Zones};

pub use reclaim::{ReclaimOptions, VictimPolicy};

/// Runs reclaim jobs. The daemon adapts its worker pool to this; `key` keeps jobs of one
/// chunk ordered.
pub trait Executor: Send + Sync {
    fn execute(&self, key: u64, job: Box<dyn FnOnce() + Send>);
}

/// Default executor: one short-lived thread per job (reclaim runs few jobs at once).
struct ThreadExecutor;

impl Executor for ThreadExecutor {
    fn execute(&self, _key: u64, job: Box<dyn FnOnce() + Send>) {
        std::thread::Builder::new()
            .name("dmz-reclaim-job".into())
            .spawn(job)
            .expect("spawn reclaim job thread");
    }
}

/// Engine tuning.
#[derive(Clone)]
pub struct EngineOptions {
    pub reclaim: ReclaimOptions,
    /// Fold the log into the v2 sets at least this often while something is dirty.
    pub commit_interval: Duration,
    /// Clean bitmap blocks kept cached (4 KiB each); dirty ones are pinned on top.
    pub cache_bitmap_blocks: usize,
    /// Where reclaim jobs run; None: internal threads.
    pub executor: Option<Arc<dyn Executor>>,
    /// Commit when the current log half is this full (percent).
    pub log_commit_pct: u64,
    /// A first write at a chunk's first block goes straight to a free sequential zone
    /// (false: dm-zoned's behaviour, every new chunk starts in a conventional zone).
    pub direct_sequential: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            reclaim: ReclaimOptions::default(),
            commit_interval: Duration::from_secs(10),
            cache_bitmap_blocks: 1024,
            executor: None,
            log_commit_pct: 50,
            direct_sequential: true,
        }
    }
}

impl std::fmt::Debug for EngineOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineOptions")
            .field("reclaim", &self.reclaim)
            .field("commit_interval", &self.commit_interval)
            .field("cache_bitmap_blocks", &self.cache_bitmap_blocks)
            .field("executor", &self.executor.is_some())
            .field("log_commit_pct", &self.log_commit_pct)
            .field("direct_sequential", &self.direct_sequential)
            .finish()
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
    pub commits: u64,
    pub log_block_writes: u64,
    pub device_bytes_written: u64,
    pub write_amplification: f64,
    pub metadata_mem_bytes: u64,
    pub cached_bitmap_blocks: u64,
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
    commits: AtomicU64,
    dev_bytes: AtomicU64,
    reclaim_zones: AtomicU64,
    reclaim_blocks: AtomicU64,
    catch_up_blocks: AtomicU64,
    reclaim_progress: AtomicU64,
}

/// Everything behind the state lock.
struct State {
    pub zones: Zones,
    pub meta: MetaCache,
    pub log: LogBuf,
    /// Writers waiting for a free zone.
    pub waiters: u32,
    /// The order in which waiting writers get free conventional zones.
    pub conv_queue: zones::ConvQueue,
    /// When a writer last had to wait for a free zone.
    pub last_wait: Option<Instant>,
    /// Completed reclaim passes, and whether the last one freed anything.
    pub reclaim_passes: u64,
    pub reclaim_last_progress: bool,
    /// The last reclaim pass ended because nothing was reclaimable at all (no candidate, no
    /// zone waiting for a flush), not because it was busy or interrupted.
    pub reclaim_exhausted: bool,
    pub last_io: Instant,
}

/// Background thread control.
#[derive(Default)]
struct Bg {
    pub stop: bool,
    pub commit_wanted: bool,
    pub reclaim_kick: u64,
    /// The last kick the reclaim thread picked up.
    pub reclaim_seen: u64,
    /// Something reclaimable appeared: re-evaluate.
    pub reclaim_hint: bool,
    pub reclaim_running: bool,
    /// When metadata first changed since the last commit (None: clean).
    pub dirty_since: Option<Instant>,
}

struct Inner {
    pub dev: Arc<dyn ZonedDevice>,
    pub geo: Geometry,
    pub layout: Layout,
    pub zone_blocks: u32,
    pub sb: Mutex<Superblock>,
    pub opts: EngineOptions,
    pub state: Mutex<State>,
    pub free_cv: Condvar,
    pub log_write: Mutex<()>,
    pub commit_lock: Mutex<()>,
    pub chunk_locks: Vec<RwLock<()>>,
    pub stats: Counters,
    pub failed: Mutex<Option<String>>,
    pub is_failed: AtomicBool,
    pub bg: Mutex<Bg>,
    pub bg_cv: Condvar,
    pub reclaim_cv: Condvar,
    pub idle_cv: Condvar,
    pub executor: Arc<dyn Executor>,
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
fn retired_error(role: Role, chunk: u32, zone: u32) -> EngineError {
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
    pub fn check_failed(&self) -> Result<(), EngineError> {
        if self.is_failed.load(Ordering::Acquire) {
            let why = self.failed.lock().clone().unwrap_or_default();
            return Err(EngineError::Failed(why));
        }
        Ok(())
    }

    /// A metadata update could not be made durable: stop accepting writes.
    pub fn fail(&self, e: &EngineError) {
        let mut f = self.failed.lock();
        if f.is_none() {
            warn!(error = %e, "engine failed; further writes return EIO");
            *f = Some(e.to_string());
        }
        self.is_failed.store(true, Ordering::Release);
        self.free_cv.notify_all();
    }

    pub fn chunk_lock(&self, chunk: u32) -> &RwLock<()> {
        &self.chunk_locks[chunk as usize % self.chunk_locks.len()]
    }

    pub fn zone_offset(&self, zone: u32, block: u32) -> u64 {
        self.geo.zone_start(zone) + block as u64 * BLOCK as u64
    }

    pub fn dev_write(&self, buf: &[u8], off: u64) -> Result<(), ZbdError> {
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
    pub fn recheck_zone(&self, zone: u32) -> Recheck {
        let Some(r) = self
            .dev
            .report_zones(zone, 1)
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
                    self.state.lock().zones.z[zone as usize].wp = wp;
                }
                return Recheck::Usable;
            }
        };
        let mut st = self.state.lock();
        if !st.zones.is_retired(zone) {
            warn!(zone, ?role, "zone lost; retired");
        }
        st.zones.retire(zone, role);
        Recheck::Lost(role)
    }

    /// New reclaimable state (a conventional data zone, a buffer): let reclaim re-evaluate.
    pub fn kick_reclaim_lazy(&self) {
        let mut bg = self.bg.lock();
        if bg.reclaim_hint {
            return;
        }
        bg.reclaim_hint = true;
        drop(bg);
        self.reclaim_cv.notify_all();
    }

    pub fn kick_reclaim(&self) {
        let mut bg = self.bg.lock();
        bg.reclaim_kick += 1;
        drop(bg);
        self.reclaim_cv.notify_all();
    }
}

impl State {
    /// Blocks `[block, block + count)` of `zone` become valid, the same in `other` invalid.
    pub fn apply_write(
        &mut self,
        dev: &dyn ZonedDevice,
        zone: u32,
        block: u32,
        count: u32,
        other: u32,
        seq: u64,
    ) -> Result<(), EngineError> {
        let c = self.meta.set_range(dev, zone, block, count, true)?;
        let zi = &mut self.zones.z[zone as usize];
        zi.weight += c;
        zi.last_seq = seq;
        if other != NONE {
            let c = self.meta.set_range(dev, other, block, count, false)?;
            self.zones.z[other as usize].weight -= c;
        }
        Ok(())
    }

    /// Apply one record to the in-memory metadata (runtime and replay share this).
    /// `seq` is the record's sequence number; `runtime` releases freed zones into the
    /// pending pool (at load the pools are rebuilt afterwards).
    pub fn apply(
        &mut self,
        dev: &dyn ZonedDevice,
        rec: &Rec,
        seq: u64,
        runtime: bool,
    ) -> Result<(), EngineError> {
        let zb = self.zones.zone_blocks;
        match rec {
            Rec::Map {
                chunk,
                dzone,
                bzone,
            } => self.meta.set_map(
                *chunk,
                MapEntry {
                    dzone: *dzone,
                    bzone: *bzone,
                },
            ),
            Rec::Write {
                zone,
                block,
                other,
                crcs,
            } => self.apply_write(dev, *zone, *block, crcs.len() as u32, *other, seq)?,
            Rec::Invalidate { zone, block, count } => {
                let c = self.meta.set_range(dev, *zone, *block, *count, false)?;
                self.zones.z[*zone as usize].weight -= c;
            }
            Rec::Free { zone } => {
                if self.zones.z[*zone as usize].weight > 0 {
                    self.meta.set_range(dev, *zone, 0, zb, false)?;
                }
                self.zones.z[*zone as usize].weight = 0;
                if runtime {
                    self.zones.release(*zone, seq);
                }
            }
            Rec::Reclaim {
                chunk,
                dst,
                srcs,
                dzone,
                bzone,
            } => {
                for &s in srcs {
                    let added = self.meta.merge_zone(dev, *dst, s)?;
                    self.zones.z[*dst as usize].weight += added;
                    self.zones.z[s as usize].weight = 0;
                    if runtime {
                        self.zones.release(s, seq);
                    }
                }
                self.meta.set_map(
                    *chunk,
                    MapEntry {
                        dzone: *dzone,
                        bzone: *bzone,
                    },
                );
            }
        }
        Ok(())
    }
}

impl Engine {
    /// Open a formatted device: load and resync the sets, replay the log, fold it with a
    /// commit, start the commit and reclaim threads.
    pub fn open(dev: Arc<dyn ZonedDevice>, opts: EngineOptions) -> Result<Engine, EngineError> {
        let inner = Arc::new(commit::load(dev, opts)?);
        let mut threads = Vec::new();
        {
            let i = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("dmz-commit".into())
                    .spawn(move || commit::commit_thread(&i))
                    .map_err(|e| EngineError::Meta(format!("spawn commit thread: {e}")))?,
            );
        }
        if inner.opts.reclaim.enabled {
            let i = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("dmz-reclaim".into())
                    .spawn(move || reclaim::reclaim_thread(&i))
                    .map_err(|e| EngineError::Meta(format!("spawn reclaim thread: {e}")))?,
            );
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

    pub fn write(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), EngineError> {
        io::write(&self.inner, offset, buf, fua)
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
        commit::flush(&self.inner, false)
    }

    pub fn stats(&self) -> EngineStats {
        let i = &self.inner;
        let st = i.state.lock();
        let z = &st.zones;
        let c = &i.stats;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let wb = ld(&c.write_bytes);
        let db = ld(&c.dev_bytes);
        let bg = i.bg.lock();
        EngineStats {
            zones_total: z.z.len() as u64,
            zones_free: (z.free_conv.len() + z.free_seq.len()) as u64,
            zones_free_conventional: z.free_conv.len() as u64,
            zones_free_sequential: z.free_seq.len() as u64,
            zones_mapped: z.count(Role::Data),
            zones_buffer: z.count(Role::Buffer),
            zones_reserved: z.reserved.len() as u64,
            zones_pending_free: z.pending_free.len() as u64,
            zones_meta: z.count(Role::Meta),
            zones_offline: z.count(Role::Offline) + z.count(Role::Unusable),
            zones_read_only: z.count(Role::ReadOnly),
            chunks_total: i.layout.nr_chunks as u64,
            chunks_mapped: st.meta.map.iter().filter(|e| e.is_mapped()).count() as u64,
            reclaim_state: if bg.reclaim_running {
                "running".into()
            } else {
                "idle".into()
            },
            metadata_dirty: bg.dirty_since.is_some(),
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
            commits: ld(&c.commits),
            log_block_writes: st.log.blocks_written,
            device_bytes_written: db,
            write_amplification: if wb == 0 { 0.0 } else { db as f64 / wb as f64 },
            metadata_mem_bytes: (st.meta.mem_bytes()
                + z.z.capacity() * std::mem::size_of::<zones::ZoneInfo>()
                + (z.free_conv.capacity() + z.free_seq.capacity() + z.reserved.capacity()) * 4
                + i.chunk_locks.len() * std::mem::size_of::<RwLock<()>>())
                as u64,
            cached_bitmap_blocks: st.meta.nr_cached() as u64,
        }
    }

    /// Diagnostics: a chunk's mapping and its zones, one line.
    #[doc(hidden)]
    pub fn debug_chunk(&self, chunk: u32) -> String {
        let st = self.inner.state.lock();
        let e = st.meta.map[chunk as usize];
        let z = |z: u32| {
            if z == NONE {
                "-".to_string()
            } else {
                format!("{z}:{:?}", st.zones.z[z as usize])
            }
        };
        format!(
            "chunk {chunk}: dzone {} bzone {} (log epoch {}, next seq {})",
            z(e.dzone),
            z(e.bzone),
            st.log.epoch,
            st.log.next_seq
        )
    }

    /// Diagnostics: check the in-memory invariants (weights match bitmaps, no block valid
    /// in both zones of a chunk, nothing valid past a sequential write pointer).
    #[doc(hidden)]
    pub fn debug_check(&self) -> Result<(), String> {
        let i = &self.inner;
        let _c: Vec<_> = i.chunk_locks.iter().map(|l| l.write()).collect();
        let mut st = i.state.lock();
        let zb = i.zone_blocks;
        for z in 0..st.zones.z.len() as u32 {
            let zi = st.zones.z[z as usize];
            if zi.role == Role::Meta {
                continue;
            }
            let mut v = Vec::new();
            st.meta
                .bits(&*i.dev, z, 0, zb, &mut v)
                .map_err(|e| e.to_string())?;
            let w = v.iter().filter(|&&x| x).count() as u32;
            if w != zi.weight {
                return Err(format!(
                    "zone {z}: weight {} but {w} bits ({zi:?})",
                    zi.weight
                ));
            }
            if zi.seq && v[zi.wp as usize..].iter().any(|&x| x) {
                return Err(format!("zone {z}: bits past wp ({zi:?})"));
            }
        }
        for c in 0..st.meta.map.len() as u32 {
            let e = st.meta.map[c as usize];
            if e.dzone != NONE && e.bzone != NONE {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                st.meta
                    .bits(&*i.dev, e.dzone, 0, zb, &mut a)
                    .map_err(|e| e.to_string())?;
                st.meta
                    .bits(&*i.dev, e.bzone, 0, zb, &mut b)
                    .map_err(|e| e.to_string())?;
                if let Some(k) = (0..zb as usize).find(|&k| a[k] && b[k]) {
                    return Err(format!("chunk {c}: block {k} valid in both zones"));
                }
            }
            for z in [e.dzone, e.bzone] {
                if z != NONE && st.zones.z[z as usize].chunk != c {
                    return Err(format!("chunk {c}: zone {z} owned by another chunk"));
                }
            }
        }
        Ok(())
    }

    /// Ask reclaim to run a pass now, whatever the watermarks say.
    pub fn trigger_reclaim(&self) {
        self.inner.kick_reclaim();
    }

    /// Wait until reclaim has nothing left to do for the requests made so far.
    pub fn wait_reclaim_idle(&self) {
        reclaim::wait_idle(&self.inner);
    }

    /// Stop reclaim, then a final commit folding the log into the v2 sets.
    pub fn close(mut self) -> Result<(), EngineError> {
        self.stop_threads();
        self.closed = true;
        self.inner.check_failed()?;
        commit::flush(&self.inner, false)?;
        commit::commit(&self.inner)?;
        self.reset_unmapped_zones()?;
        info!("engine closed");
        Ok(())
    }

    /// After the final commit no record can point into an unmapped zone any more, so the
    /// sequential ones the engine freed lazily (reset only when reused, since a crash before
    /// their Free record was durable would need their data) are reset now: dm-zoned and
    /// dmzadm expect every unmapped sequential zone to be empty.
    fn reset_unmapped_zones(&self) -> Result<(), EngineError> {
        let stale: Vec<u32> = {
            let st = self.inner.state.lock();
            st.zones
                .z
                .iter()
                .enumerate()
                .filter(|(_, zi)| {
                    zi.seq
                        && zi.wp != 0
                        && matches!(zi.role, Role::Free | Role::Reserved | Role::PendingFree)
                })
                .map(|(i, _)| i as u32)
                .collect()
        };
        for z in stale {
            if let Err(e) = self.inner.dev.zone_mgmt(zbd::ZoneOp::Reset, z) {
                // A zone that went offline or read-only is retired, not an error.
                if let Recheck::Lost(_) = self.inner.recheck_zone(z) {
                    continue;
                }
                return Err(e.into());
            }
            self.inner.state.lock().zones.z[z as usize].wp = 0;
        }
        Ok(())
    }

    /// Test hook: stop the threads and drop everything in memory without flushing or
    /// committing, as a daemon killed with SIGKILL would.
    pub fn crash_for_test(mut self) {
        self.stop_threads();
        if std::env::var_os("DMZ_DEBUG_REPLAY").is_some() {
            let st = self.inner.state.lock();
            eprintln!(
                "crash: epoch {} next_seq {} written {} flushed {} cur_idx {} gen {}",
                st.log.epoch,
                st.log.next_seq,
                st.log.written_seq,
                st.log.flushed_seq,
                st.log.cur_idx,
                self.inner.sb.lock().gen
            );
        }
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
                commit::flush(&self.inner, false).and_then(|_| commit::commit(&self.inner))
            {
                warn!(error = %e, "commit at drop failed");
            }
        }
    }
}

/// Read map blocks of set 0 into a map of `nr_chunks` entries.
fn read_map(dev: &dyn ZonedDevice, layout: &Layout) -> Result<Vec<MapEntry>, EngineError> {
    let mut map = Vec::with_capacity(layout.nr_chunks as usize);
    let mut buf = vec![0u8; 256 * BLOCK];
    let mut m = 0u32;
    while m < layout.nr_map_blocks {
        let n = (layout.nr_map_blocks - m).min(256);
        let b = &mut buf[..n as usize * BLOCK];
        sets::read_meta_blocks(dev, layout, 0, 1 + m, b)?;
        for blk in b.chunks(BLOCK) {
            for e in decode_map_block(blk) {
                if map.len() < layout.nr_chunks as usize {
                    map.push(e);
                }
            }
        }
        m += n;
    }
    Ok(map)
}

fn unmapped() -> MapEntry {
    MapEntry {
        dzone: NONE,
        bzone: NONE,
    }
}
