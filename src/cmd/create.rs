//! `zonedd create`: Start a daemon exposing a formatted backend as /dev/ublkbN.
//!
//! On success it prints two lines on stdout, once the device is usable:
//!
//! ```text
//! /dev/ublkb0
//! id 0
//! ```
//!
//! Without `--foreground` it daemonizes first and returns when the daemon is ready (or
//! fails with the daemon's own error). The daemon is also what `recover` starts, so the
//! code shared with it lives here ([`serve_daemon`]).

use super::CliError;
use frontend::daemon::{self, Readiness, Shutdown};
use frontend::features::UblkFeatures;
use frontend::registry::{self, DeviceRecord, DeviceSpec};
use frontend::{sys, BlockTarget, Dispatch, FrontendError, Job, Mode};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Mutex;
use std::sync::{Arc, Weak};

pub use crate::cli::create::Args;

/// Reclaim parallelism when `--reclaim-max-active` is not given. Reclaim is what sustained
/// random writes wait for once the buffer zones run out; on flash or memory two copies at
/// once use a second CPU (measured in the VM: 12.2 -> 18.3 IOPS, docs/PERFORMANCE.md), on a
/// spinning disk they would make its head seek between four zones. A volume of several
/// zoned drives takes a copy per drive: the engine spreads reclaim's destinations over the
/// drives, so each drive writes one zone at a time and the drives drain together
/// (`benches/multidrive.rs`: 1.98x with two drives on the hdd model).
fn default_reclaim_parallel(spec: &DeviceSpec) -> usize {
    let drives = 1 + spec.more_backends.len();
    match zbd::sysfs_rotational(Path::new(&spec.backend)) {
        Some(true) => drives,
        _ => drives.max(2),
    }
}

/// The smallest `--index-memory-mib`: below it, even a small volume's cache holds few pages.
const MIN_INDEX_MEMORY_MIB: u64 = 6;
/// The largest: 1 TiB (more than any volume's whole index; keeps the bytes in a `u64`).
const MAX_INDEX_MEMORY_MIB: u64 = 1 << 20;

/// The first option given that only a log-layout volume takes.
fn log_layout_option(
    index_memory_mib: Option<u64>,
    compact: &Option<String>,
) -> Option<&'static str> {
    if index_memory_mib.is_some() {
        Some("--index-memory-mib")
    } else if compact.is_some() {
        Some("--compact")
    } else {
        None
    }
}

/// Chunk size of the test targets (`mem:SIZE`, `file:PATH`).
const TEST_CHUNK: u64 = 4 << 20;

pub fn run(args: Args) -> Result<(), CliError> {
    // Arguments first (the user's to fix wherever this runs), then the environment.
    if args.queues == 0 || args.depth == 0 || args.depth > 4096 {
        return Err(CliError::Usage(
            "--queues must be >= 1 and --depth between 1 and 4096".into(),
        ));
    }
    if args
        .index_memory_mib
        .is_some_and(|m| !(MIN_INDEX_MEMORY_MIB..=MAX_INDEX_MEMORY_MIB).contains(&m))
    {
        return Err(CliError::Usage(format!(
            "--index-memory-mib must be between {MIN_INDEX_MEMORY_MIB} and {MAX_INDEX_MEMORY_MIB}"
        )));
    }
    if let Some(opt) = log_layout_option(args.index_memory_mib, &args.compact) {
        if is_test_backend(&args.backend[0]) {
            return Err(CliError::Usage(format!(
                "{opt} applies to log-layout volumes; {} is a test target",
                args.backend[0]
            )));
        }
    }
    if args.backend.len() > 1 && args.cache.is_none() {
        return Err(CliError::Usage(
            "several --backend drives form a multi-device volume: give its regular cache \
             device with --cache"
                .into(),
        ));
    }
    if args.cache.is_some() && args.backend.iter().any(|b| is_test_backend(b)) {
        return Err(CliError::Usage(
            "--cache goes with zoned backends, not the mem:/file: test targets".into(),
        ));
    }
    let mut spec = DeviceSpec {
        backend: args.backend[0].clone(),
        cache: args.cache.clone(),
        more_backends: args.backend[1..].to_vec(),
        label: args.label.clone(),
        pool: args.pool.clone(),
        max_active: args.max_active,
        reclaim_max_active: args.reclaim_max_active,
        index_memory_mib: args.index_memory_mib,
        compact: args.compact.clone(),
        queues: args.queues,
        depth: args.depth,
        exposed: false,
    };
    pool_policy(&spec)?;
    let metrics_addr = args
        .metrics
        .as_deref()
        .map(|a| super::metrics::parse_addr(a, args.metrics_any_address))
        .transpose()?;
    super::need_ublk()?;
    super::need_root("zonedd create")?;
    // Before anything else touches it: a run directory we cannot trust is the user's to fix.
    frontend::registry::ensure_run_dir().map_err(|e| CliError::Usage(e.to_string()))?;
    // Bound now, before daemonizing: a taken port is refused here, and the daemon (a fork)
    // inherits the socket.
    let metrics = metrics_addr.map(super::metrics::bind).transpose()?;
    spec.backend = canonical_backend(&args.backend[0])?;
    spec.more_backends = args.backend[1..]
        .iter()
        .map(|b| canonical_backend(b))
        .collect::<Result<_, _>>()?;
    spec.cache = args.cache.as_deref().map(canonical_backend).transpose()?;
    let mut mode = Mode::Add { id: args.id };
    if let Some((id, state, stored)) = existing_device_for(&spec.backend) {
        match (state.as_str(), args.recover_if_present) {
            ("quiesced", true) => {
                eprintln!("zonedd: recovering ublk device {id} of {}", spec.backend);
                mode = Mode::Recover { id };
                // the device keeps its queues and depth; the rest may change
                if let Some(s) = stored {
                    spec.queues = s.queues;
                    spec.depth = s.depth;
                }
            }
            ("dead", true) => {
                frontend::device::delete_device(id).map_err(failed)?;
            }
            _ => {
                return Err(CliError::Usage(format!(
                    "{} is already used by ublk device {id} ({state}){}",
                    spec.backend,
                    if state == "quiesced" {
                        format!(": its daemon died, run `zonedd recover {id}`")
                    } else {
                        String::new()
                    }
                )))
            }
        }
    }
    if args.format && matches!(mode, Mode::Add { .. }) {
        format_backend(&spec)?;
    } else if !is_test_backend(&spec.backend) {
        // Fail here, before daemonizing, with the clearest message we can give.
        check_backend(&spec)?;
    }
    serve_daemon(spec, mode, args.foreground, metrics)
}

fn failed(e: FrontendError) -> CliError {
    CliError::Failed(e.to_string())
}

fn is_test_backend(b: &str) -> bool {
    b.starts_with("mem:") || b.starts_with("file:")
}

fn canonical_backend(b: &str) -> Result<String, CliError> {
    if b.starts_with("mem:") {
        return Ok(b.to_string());
    }
    let (prefix, path) = match b.strip_prefix("file:") {
        Some(p) => ("file:", p),
        None => ("", b),
    };
    // Missing path: exit 2, as for format and check.
    let p = std::fs::canonicalize(path).map_err(|e| CliError::Usage(format!("{path}: {e}")))?;
    Ok(format!("{prefix}{}", p.display()))
}

fn pool_policy(spec: &DeviceSpec) -> Result<workpool::Policy, CliError> {
    let s = match spec.max_active {
        Some(n) => format!("{}:{n}", spec.pool),
        None => spec.pool.clone(),
    };
    s.parse::<workpool::Policy>()
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// A zonedd ublk device already serving `backend`: (id, state, its spec).
fn existing_device_for(backend: &str) -> Option<(u32, String, Option<DeviceSpec>)> {
    for id in sys::ublk_ids() {
        let Ok((state, data, ty)) = frontend::device::device_info(id) else {
            continue;
        };
        let spec: Option<DeviceSpec> = data.and_then(|d| serde_json::from_value(d).ok());
        let spec = spec.or_else(|| registry::read(id).map(|r| r.spec));
        let ours = ty.as_deref() == Some(frontend::device::TARGET_NAME) || spec.is_some();
        if ours && spec.as_ref().map(|s| s.backend.as_str()) == Some(backend) {
            return Some((id, sys::state_name(state).to_string(), spec));
        }
    }
    None
}

/// Opens the backend and its metadata, to fail early: missing, not zoned, busy, mounted,
/// not formatted (all exit 2: the user must fix them); an I/O error is exit 1.
fn check_backend(spec: &DeviceSpec) -> Result<(), CliError> {
    let backend = &spec.backend;
    let dev = open_volume(spec)?;
    if spec.cache.is_none() && dmz::lsl::is_log_layout(dev.as_ref()) {
        // A log-layout volume: its engine checks it as it opens (open_target).
        return Ok(());
    }
    if let Some(opt) = log_layout_option(spec.index_memory_mib, &spec.compact) {
        return Err(CliError::Usage(format!(
            "{opt} applies to log-layout volumes; {backend} is a dm-zoned volume"
        )));
    }
    let p = dmz::sets::probe(dev.as_ref()).map_err(|e| metadata_error(backend, e))?;
    p.choose(backend)
        .map(|_| ())
        .map_err(|e| metadata_error(backend, e))
}

/// The spec's devices, each checked free (not mounted, not held), opened exclusively: one
/// zoned backend, or the cache and zoned drives of a multi-device volume.
fn open_volume(spec: &DeviceSpec) -> Result<Box<dyn zbd::ZonedDevice>, CliError> {
    let backends: Vec<std::path::PathBuf> = std::iter::once(&spec.backend)
        .chain(&spec.more_backends)
        .map(std::path::PathBuf::from)
        .collect();
    let vol = super::VolumeArgs {
        backends: &backends,
        cache: spec.cache.as_deref().map(Path::new),
    };
    for p in vol.paths() {
        sys::check_block_device_free(p).map_err(|e| CliError::Usage(e.to_string()))?;
    }
    vol.open(true)
}

/// A backend's metadata that cannot be used: the user's to fix (exit 2), except I/O errors.
fn metadata_error(backend: &str, e: dmz::format::FormatError) -> CliError {
    match e {
        dmz::format::FormatError::Zbd(_) => CliError::Failed(format!("{backend}: {e}")),
        other => CliError::Usage(not_formatted_hint(backend, other)),
    }
}

fn not_formatted_hint(backend: &str, e: dmz::format::FormatError) -> String {
    match e {
        dmz::format::FormatError::NotFormatted(_) => format!(
            "{backend}: no valid dm-zoned superblock: not formatted? run \
             `zonedd format --backend {backend}` first (or pass --format to create)"
        ),
        other => format!("{backend}: {other}"),
    }
}

fn format_backend(spec: &DeviceSpec) -> Result<(), CliError> {
    if is_test_backend(&spec.backend) {
        return Ok(());
    }
    let dev = open_volume(spec)?;
    let opts = dmz::sets::FormatOptions {
        label: spec.label.clone(),
        ..Default::default()
    };
    dmz::sets::format_device(dev.as_ref(), &opts, &mut |_, _| {}).map_err(|e| match e {
        dmz::format::FormatError::Device(_) | dmz::format::FormatError::Invalid(_) => {
            CliError::Usage(format!("{}: {e}", spec.backend))
        }
        e => CliError::Failed(format!("formatting {}: {e}", spec.backend)),
    })?;
    Ok(())
}

/// The pool as the frontend's [`Dispatch`]; `batch_sync` false runs deferred jobs at once.
struct PoolDispatch {
    pool: Arc<workpool::Pool>,
    batch_sync: bool,
}

impl Dispatch for PoolDispatch {
    fn queue(&self, key: u64, job: Job) {
        self.pool.queue(key, job)
    }
    fn defer(&self, job: Job) {
        if self.batch_sync {
            workpool::defer(job)
        } else {
            job()
        }
    }
    fn has_work(&self, key: u64) -> bool {
        self.pool.has_work(key)
    }
    fn hold(&self, key: u64) -> bool {
        self.pool.hold(key)
    }
    fn release(&self, key: u64, first: Option<Job>) {
        self.pool.release(key, first)
    }
}

/// A pool batch's writes share their log write (docs/design.md, "Commit and crash ordering")
/// unless the daemon's environment has `ZONEDD_BATCH_SYNC=0`: each write then writes its own
/// before the next of its chunk starts, as before; for comparisons (the bench's
/// `zd-*-nobatch` targets) and as a way out.
fn batch_sync() -> bool {
    env_switch(
        "ZONEDD_BATCH_SYNC",
        "batched log writes off: each write logs alone",
    )
}

/// A behaviour the daemon's environment turns off with `VAR=0` (on otherwise); says so in
/// the log when off.
fn env_switch(var: &str, off: &str) -> bool {
    let on = std::env::var(var).map_or(true, |v| v != "0");
    if !on {
        tracing::info!("{off} ({var}=0)");
    }
    on
}

/// An opened target: the trait object the frontend serves, how to read its counters
/// (weakly: the daemon must be able to take the target back to close it), and how to close.
pub(super) struct Opened {
    pub(super) target: Arc<dyn BlockTarget>,
    /// "dm-zoned v2" for the engine; the test targets say what they are.
    pub(super) layout: &'static str,
    pub(super) stats: Box<dyn Fn() -> Value + Send + Sync>,
    /// Start a reclaim pass now (`zonedd reclaim`): the request's number and the counters
    /// before it, or why this target has none.
    pub(super) reclaim: frontend::control::ReclaimFn,
    pub(super) close: Box<dyn FnOnce() -> Result<(), String>>,
}

fn simple<T: BlockTarget + 'static>(t: T, layout: &'static str, backend: &str) -> Opened {
    let t: Arc<dyn BlockTarget> = Arc::new(t);
    let flush = t.clone();
    let no_reclaim = format!("{backend} is a {layout} test target: it has no zones to reclaim");
    Opened {
        target: t,
        layout,
        stats: Box::new(|| Value::Null),
        reclaim: Arc::new(move || Err(no_reclaim.clone())),
        close: Box::new(move || {
            flush
                .flush()
                .map_err(|e| format!("flush: {}", std::io::Error::from_raw_os_error(e)))
        }),
    }
}

/// The engine as the frontend's [`BlockTarget`].
struct EngineTarget(dmz::engine::Engine);

fn errno(e: dmz::engine::EngineError) -> i32 {
    let n = e.errno();
    tracing::warn!("engine: {e}");
    if n > 0 {
        n
    } else {
        libc::EIO
    }
}

impl BlockTarget for EngineTarget {
    fn capacity(&self) -> u64 {
        self.0.capacity()
    }
    fn chunk_size(&self) -> u64 {
        self.0.chunk_size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        self.0.read(offset, buf).map_err(errno)
    }
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), i32> {
        self.0.write(offset, buf, fua).map_err(errno)
    }
    fn write_unsynced(
        &self,
        offset: u64,
        buf: &[u8],
        fua: bool,
    ) -> Result<frontend::SyncToken, i32> {
        // A write about to wait for a zone first acknowledges the batch's earlier writes.
        let w = self
            .0
            .write_unsynced(offset, buf, fua, &workpool::run_deferred)
            .map_err(errno)?;
        Ok(frontend::SyncToken(w.into_raw()))
    }
    fn sync(&self, token: frontend::SyncToken) -> Result<(), i32> {
        self.0
            .sync(dmz::engine::Unsynced::from_raw(token.0))
            .map_err(errno)
    }
    fn discard(&self, offset: u64, len: u64) -> Result<(), i32> {
        self.0.discard(offset, len).map_err(errno)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), i32> {
        self.0.write_zeroes(offset, len).map_err(errno)
    }
    fn flush(&self) -> Result<(), i32> {
        self.0.flush().map_err(errno)
    }
    fn read_fd(&self) -> Option<std::os::fd::RawFd> {
        // The ring reads it with plain offsets into caller buffers: an O_DIRECT source
        // needs aligned ones, which the tag buffers (4096-aligned) and 4 KiB segments are.
        ring_fd(self.0.read_source())
    }
    fn plan_read(&self, offset: u64, len: u64) -> Option<frontend::ReadPlan> {
        let plan = self.0.plan_read(offset, len)?;
        Some(frontend::ReadPlan {
            segments: segments(plan.segments()),
            guard: Box::new(EnginePlan(plan)),
        })
    }
    fn plan_write(&self, offset: u64, data: &[u8]) -> Option<frontend::WritePlan> {
        // Only where the queue rings' fixed file (the read source) may write those zones.
        let src = self.0.read_source().filter(|s| s.conv_writes)?;
        let plan = self.0.plan_write(offset, data)?;
        Some(frontend::WritePlan {
            device_offset: src.base + plan.device_offset(),
            sync_first: plan.sync_first().map(|w| frontend::SyncToken(w.into_raw())),
            guard: Box::new(EngineWritePlan(plan)),
        })
    }
    fn plan_flush(&self) -> Option<Box<dyn frontend::FlushGuard>> {
        // The log sits in conventional zones of the device the read source reads, and the
        // device's flush is an fdatasync of that fd (zbd::ReadSource) when the source
        // covers the whole device (not a multi-device volume's: its drives flush too).
        let src = self
            .0
            .read_source()
            .filter(|s| s.conv_writes && s.whole())?;
        // A failed engine: the blocking flush reports it.
        let plan = self.0.plan_flush().ok()?;
        Some(Box::new(EngineFlush {
            plan,
            base: src.base,
        }))
    }
    fn plan_sync(&self, token: frontend::SyncToken) -> Result<frontend::SyncPlan, i32> {
        // The log sits in conventional zones of the device the read source reads.
        let Some(src) = self.0.read_source().filter(|s| s.conv_writes) else {
            return Ok(frontend::SyncPlan::Busy);
        };
        let w = dmz::engine::Unsynced::from_raw(token.0);
        Ok(match self.0.plan_sync(w).map_err(errno)? {
            dmz::engine::SyncPlan::Done => frontend::SyncPlan::Done,
            dmz::engine::SyncPlan::Busy => frontend::SyncPlan::Busy,
            dmz::engine::SyncPlan::Write(log) => {
                frontend::SyncPlan::Write(Box::new(EngineLogWrite {
                    log,
                    base: src.base,
                }))
            }
        })
    }
}

/// The engine's flush as the frontend's, for its ring.
struct EngineFlush {
    plan: dmz::engine::FlushPlan,
    /// The read source's offset of device byte 0.
    base: u64,
}

impl frontend::FlushGuard for EngineFlush {
    fn step(&mut self) -> Result<frontend::FlushStep, i32> {
        Ok(match self.plan.step().map_err(errno)? {
            dmz::engine::FlushStep::Log(log) => {
                frontend::FlushStep::Log(Box::new(EngineLogWrite {
                    log,
                    base: self.base,
                }))
            }
            dmz::engine::FlushStep::Device => frontend::FlushStep::Device,
            dmz::engine::FlushStep::Done => frontend::FlushStep::Done,
        })
    }
    fn device_flushed(&mut self, result: Result<(), i32>) -> Result<(), i32> {
        let result = result.map_err(std::io::Error::from_raw_os_error);
        self.plan.device_flushed(result).map_err(errno)
    }
}

/// A planned read's segments (either layout's) as the frontend's.
pub(super) fn segments(s: &[dmz::engine::ReadSegment]) -> Vec<frontend::ReadSegment> {
    s.iter()
        .map(|s| match *s {
            dmz::engine::ReadSegment::Zeros { len } => frontend::ReadSegment::Zeros { len },
            dmz::engine::ReadSegment::Device { offset, len } => {
                frontend::ReadSegment::Device { offset, len }
            }
        })
        .collect()
}

/// The engine's plan as the frontend's guard: it holds the chunk's read lock.
struct EnginePlan(dmz::engine::ReadPlan);

impl frontend::PlanGuard for EnginePlan {
    fn complete(self: Box<Self>) {
        self.0.complete()
    }
}

/// The engine's log write as the frontend's: it holds the engine's log writer.
struct EngineLogWrite {
    log: dmz::engine::LogWrite,
    /// The read source's offset of device byte 0.
    base: u64,
}

impl frontend::LogWriteGuard for EngineLogWrite {
    fn blocks(&self) -> Vec<(u64, &[u8])> {
        self.log
            .blocks()
            .map(|(off, b)| (self.base + off, b))
            .collect()
    }
    fn complete(self: Box<Self>, result: Result<(), i32>) -> Result<(), i32> {
        match result {
            Ok(()) => {
                self.log.complete();
                Ok(())
            }
            Err(e) => Err(errno(self.log.fail(std::io::Error::from_raw_os_error(e)))),
        }
    }
}

/// The engine's write plan as the frontend's guard: it holds the chunk's lock (shared).
struct EngineWritePlan(dmz::engine::WritePlan);

impl frontend::WriteGuard for EngineWritePlan {
    fn complete(self: Box<Self>, data: &[u8]) -> Result<frontend::SyncToken, i32> {
        let w = self.0.complete(data).map_err(errno)?;
        Ok(frontend::SyncToken(w.into_raw()))
    }
}

/// Hop-free reads (docs/design.md, "The read path") are on unless the daemon's environment
/// has `ZONEDD_HOP_FREE_READS=0`: the switch back to reads through the pool, for
/// comparisons and as a way out.
fn hop_free_reads() -> bool {
    env_switch(
        "ZONEDD_HOP_FREE_READS",
        "hop-free reads off: every read goes through the pool",
    )
}

/// Linked reads (docs/design.md, "Hop-free reads"): a hop-free read of one device extent
/// has its tag's commit linked behind its device read when it is the only request its queue
/// thread has in hand, unless the daemon's environment has `ZONEDD_LINKED_READS=0` (never)
/// or `=always` (whenever it can: the VM test of cancelled commits, comparisons).
fn linked_reads() -> frontend::queue::LinkedReads {
    use frontend::queue::LinkedReads;
    let var = "ZONEDD_LINKED_READS";
    let mode = match std::env::var(var).as_deref() {
        Ok("0") => LinkedReads::Off,
        Ok("always") => LinkedReads::Always,
        Err(std::env::VarError::NotPresent) => return LinkedReads::Alone,
        Ok(other) => {
            tracing::warn!("{var}={other:?} is neither 0 nor always: linked reads as by default");
            return LinkedReads::Alone;
        }
        Err(e) => {
            tracing::warn!("{var}: {e}: linked reads as by default");
            return LinkedReads::Alone;
        }
    };
    tracing::info!("linked reads: {mode:?} ({var})");
    mode
}

/// The fd of `source` for the queue threads' rings ([`frontend::BlockTarget::read_fd`]):
/// only an `O_DIRECT` one (a zoned block device). An emulated image is a buffered file,
/// whose reads (on tmpfs) and writes (on tmpfs and ext4 alike) 6.12's io_uring cannot
/// issue without blocking: `RWF_NOWAIT` would turn them all away, and without it each one
/// runs on an io-wq worker thread (a hop, and a thread that wakes every 5 s once idle).
/// Its requests go through the pool instead.
pub(super) fn ring_fd(source: Option<zbd::ReadSource>) -> Option<std::os::fd::RawFd> {
    source.filter(|s| s.direct).map(|s| s.fd)
}

/// Hop-free writes (docs/design.md, "Hop-free writes") are on for both layouts (on the log
/// layout in write groups: 2.0-2.1x the pool path's random-write IOPS on the memory device,
/// 1.12-1.19x on the hdd model with GC running; docs/PERFORMANCE.md, "Write groups on the
/// log layout") unless the daemon's environment says otherwise: `ZONEDD_HOP_FREE_WRITES=0`
/// sends every write through the pool. Their ring writes are `RWF_NOWAIT` (what the device
/// cannot take at once goes to the pool, never to an io-wq worker thread that would keep
/// an idle daemon awake: docs/design.md, "Never on io-wq").
fn hop_free_writes() -> bool {
    let var = "ZONEDD_HOP_FREE_WRITES";
    match std::env::var(var) {
        Ok(v) if v == "0" => {
            tracing::info!("hop-free writes off: every write goes through the pool ({var}=0)");
            false
        }
        _ => true,
    }
}

/// A stream's planned writes on the log layout go behind one another at one frontier, in
/// logical order (`LogOptions::stream_pipelines`; docs/design.md, "Planned writes") when
/// the kernel keeps a zone's writes in the order submitted, unless the daemon's
/// environment has `ZONEDD_STREAM_PIPELINES=0` (the benches' baseline).
fn stream_pipelines() -> bool {
    let var = "ZONEDD_STREAM_PIPELINES";
    if std::env::var(var).is_ok_and(|v| v == "0") {
        tracing::info!("stream pipelines off ({var}=0)");
        return false;
    }
    let on = zbd::kernel_orders_zone_writes() == Some(true);
    if !on {
        tracing::info!("stream pipelines off: this kernel has no zone write plugging (6.10)");
    }
    on
}

/// Flushes on the queue threads' rings (docs/design.md, "Flushes on the ring") are off
/// unless the daemon's environment has `ZONEDD_RING_FLUSHES=1`: on 6.12 the ring's fsync
/// runs on an io-wq worker, and write+fsync measured 2.6x slower that way
/// (docs/PERFORMANCE.md).
fn ring_flushes() -> bool {
    let on = std::env::var("ZONEDD_RING_FLUSHES").is_ok_and(|v| v == "1");
    if on {
        tracing::info!("flushes on the queue rings (ZONEDD_RING_FLUSHES=1)");
    }
    on
}

/// The capacity of a `mem:SIZE` backend, `None` for any other backend. SIZE is spelled as
/// every other size option ([`zbd::parse_size`]: `512M`, `512MiB`, `1g`) and is at least
/// 1 MiB.
fn mem_backend_size(backend: &str) -> Option<Result<u64, String>> {
    let size = backend.strip_prefix("mem:")?;
    Some(
        zbd::parse_size(size)
            .ok()
            .filter(|&b| b >= 1 << 20)
            .ok_or_else(|| format!("bad size in {backend}: expected e.g. mem:512M")),
    )
}

fn open_target(spec: &DeviceSpec) -> Result<Opened, String> {
    if let Some(bytes) = mem_backend_size(&spec.backend) {
        let t = frontend::MemTarget::new(bytes?, TEST_CHUNK);
        return Ok(simple(t, "memory", &spec.backend));
    }
    if let Some(path) = spec.backend.strip_prefix("file:") {
        let t =
            frontend::RawFileTarget::open(path, TEST_CHUNK).map_err(|e| format!("{path}: {e}"))?;
        return Ok(simple(t, "raw file", &spec.backend));
    }
    check_backend(spec).map_err(|e| e.to_string())?;
    let dev: Arc<dyn zbd::ZonedDevice> = Arc::from(open_volume(spec).map_err(|e| e.to_string())?);
    if dmz::lsl::is_log_layout(dev.as_ref()) {
        let mut opts = dmz::lsl::LogOptions::default();
        if zbd::sysfs_rotational(Path::new(&spec.backend)) == Some(true) {
            opts.gc_read_gap_blocks = dmz::lsl::GC_READ_GAP_ROTATIONAL;
            opts.compact_scans = true;
        }
        opts.stream_pipelines = stream_pipelines();
        if let Some(m) = spec.index_memory_mib {
            opts.index_memory = m.min(MAX_INDEX_MEMORY_MIB) << 20;
        }
        opts.compact = match spec.compact.as_deref() {
            None => opts.compact,
            Some("reads") => dmz::lsl::CompactOn::Reads,
            Some("writes") => dmz::lsl::CompactOn::Writes,
            Some("never") => dmz::lsl::CompactOn::Never,
            Some(other) => return Err(format!("--compact {other}: not reads, writes or never")),
        };
        return super::log_target::open(&spec.backend, dev, opts);
    }
    if let Some(opt) = log_layout_option(spec.index_memory_mib, &spec.compact) {
        return Err(format!(
            "{opt} applies to log-layout volumes; {} is a dm-zoned volume",
            spec.backend
        ));
    }
    let mut opts = dmz::engine::EngineOptions::default();
    opts.reclaim.parallel = match spec.reclaim_max_active {
        Some(n) => n.max(1) as usize,
        None => default_reclaim_parallel(spec),
    };
    let geometry = geometry_json(dev.as_ref());
    let engine = dmz::engine::Engine::open(dev, opts).map_err(|e| match e {
        dmz::engine::EngineError::Format(f) => not_formatted_hint(&spec.backend, f),
        other => format!("{}: {other}", spec.backend),
    })?;
    let typed = Arc::new(EngineTarget(engine));
    let weak = Arc::downgrade(&typed);
    let weak2 = weak.clone();
    let target: Arc<dyn BlockTarget> = typed.clone();
    Ok(Opened {
        target,
        layout: "dm-zoned v2",
        stats: Box::new(move || {
            json!({
                "geometry": geometry,
                "engine": weak.upgrade().map(|t| t.0.stats()),
            })
        }),
        reclaim: Arc::new(move || {
            let t = weak2
                .upgrade()
                .ok_or_else(|| "the engine is closing".to_string())?;
            let before = t.0.stats();
            t.0.trigger_reclaim();
            let request = t.0.stats().reclaim_requests;
            tracing::info!(request, "reclaim requested");
            Ok(json!({ "request": request, "before": before }))
        }),
        close: Box::new(move || {
            let r = match Arc::try_unwrap(typed) {
                Ok(t) => t.0.close().map_err(|e| format!("closing the engine: {e}")),
                Err(t) => {
                    tracing::error!(
                        "engine still referenced at shutdown: flushing instead of closing"
                    );
                    t.0.flush().map_err(|e| format!("flushing the engine: {e}"))
                }
            };
            r
        }),
    })
}

/// The backend's zones, for `status`: how many, how many conventional (the cache that
/// reclaim drains), and their size.
pub(super) fn geometry_json(dev: &dyn zbd::ZonedDevice) -> Value {
    let g = dev.geometry();
    let conventional = dev.report_zones(0, g.nr_zones).ok().map(|z| {
        z.iter()
            .filter(|z| z.zone_type == zbd::ZoneType::Conventional)
            .count()
    });
    json!({
        "members": dev.members(),
        "zones": g.nr_zones,
        "conventional_zones": conventional,
        "zone_bytes": g.zone_size,
        "zone_capacity_bytes": g.zone_capacity,
    })
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Run a daemon for `spec` (create or recover), daemonized unless `foreground`.
/// `metrics`: the bound `--metrics` socket, served once the device is up.
pub(crate) fn serve_daemon(
    spec: DeviceSpec,
    mode: Mode,
    foreground: bool,
    metrics: Option<std::net::TcpListener>,
) -> Result<(), CliError> {
    daemon::launch(foreground, move |ready| {
        daemon_body(spec, mode, ready, metrics)
    })
    .map_err(CliError::Failed)
}

fn daemon_body(
    spec: DeviceSpec,
    mode: Mode,
    ready: Arc<Readiness>,
    metrics: Option<std::net::TcpListener>,
) -> Result<(), String> {
    if let Err(e) = sys::private_mount_namespace() {
        tracing::warn!("no private mount namespace: {e}");
    }
    let shutdown = Arc::new(Shutdown::default());
    daemon::handle_signals(shutdown.clone()).map_err(|e| format!("signal handler: {e}"))?;
    let policy = pool_policy(&spec).map_err(|e| e.to_string())?;
    let pool = Arc::new(workpool::Pool::new("zonedd-io", policy));
    let opened = open_target(&spec)?;
    let io_stats = Arc::new(frontend::queue::IoStats::default());
    let shared = Arc::new(frontend::queue::QueueShared {
        target: opened.target,
        dispatch: Arc::new(PoolDispatch {
            pool: pool.clone(),
            batch_sync: batch_sync(),
        }),
        stats: io_stats.clone(),
        hop_free_reads: hop_free_reads(),
        hop_free_writes: hop_free_writes(),
        ring_flushes: ring_flushes(),
        linked_reads: linked_reads(),
    });
    let engine_stats = opened.stats;
    let reclaim = opened.reclaim;
    let layout = opened.layout;
    let (capacity, chunk) = (shared.target.capacity(), shared.target.chunk_size());
    let started = unix_now();
    let started_at = std::time::Instant::now();
    let close = opened.close;
    let control: ControlSlot = Arc::default();
    let target_json = serde_json::to_value(&spec).map_err(|e| e.to_string())?;
    let opts = frontend::DeviceOptions {
        mode,
        queues: spec.queues,
        depth: spec.depth,
        target_json,
    };
    let pool_weak: Weak<workpool::Pool> = Arc::downgrade(&pool);
    let (ctl, sd, spec2) = (control.clone(), shutdown.clone(), spec.clone());
    let on_started = move |s: &frontend::Started, ublk: &UblkFeatures| -> Result<(), String> {
        let (id, bdev, shown, ublk) = (s.id, s.bdev.clone(), spec2.clone(), ublk.to_json());
        let status = Arc::new(move || {
            let mut v = json!({
                "id": id,
                "bdev": bdev,
                "backend": shown.backend,
                "label": shown.label,
                "pid": std::process::id(),
                "version": env!("CARGO_PKG_VERSION"),
                "layout": layout,
                "capacity_bytes": capacity,
                "chunk_bytes": chunk,
                "started_unix": started,
                "uptime_secs": started_at.elapsed().as_secs(),
                "ublk": ublk,
                "frontend": io_stats.snapshot(),
                "pool": pool_weak.upgrade().map(|p| p.stats()),
            });
            // the target's own section: "engine"
            if let (Value::Object(m), Value::Object(extra)) = (&mut v, engine_stats()) {
                m.extend(extra);
            }
            v
        });
        if let Some(l) = metrics {
            let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            super::metrics::serve(l, status.clone())
                .map_err(|e| format!("metrics endpoint {addr}: {e}"))?;
            tracing::info!("metrics at http://{addr}/metrics");
        }
        publish(s, &spec2, &sd, status, reclaim.clone(), &ctl, &ready)
    };
    let on_stopped = || -> Result<(), String> {
        let r = close();
        pool.shutdown();
        r
    };
    let result = frontend::device::serve(
        frontend::Served::Block(shared),
        opts,
        on_started,
        on_stopped,
    );
    unpublish(result, &control)
}

/// The slot of a daemon's control server, filled by [`publish`].
pub(crate) type ControlSlot = Arc<Mutex<Option<frontend::control::ControlServer>>>;

/// Once `/dev/ublkbN` exists (create and expose alike): the device's record, its control
/// socket (status, shutdown, reclaim) and readiness, which the parent process (or systemd)
/// waits for. `list`, `status` and `delete` find the daemon through these.
pub(crate) fn publish(
    s: &frontend::Started,
    spec: &DeviceSpec,
    shutdown: &Arc<Shutdown>,
    status: frontend::control::StatusFn,
    reclaim: frontend::control::ReclaimFn,
    control: &ControlSlot,
    ready: &Readiness,
) -> Result<(), String> {
    shutdown.set_device(s.id);
    crate::logging::set_device(s.id);
    let log = daemon::adopt_log(s.id);
    let socket = registry::socket_path(s.id);
    let rec = DeviceRecord {
        id: s.id,
        bdev: s.bdev.clone(),
        spec: spec.clone(),
        pid: std::process::id(),
        socket: socket.clone(),
        log,
    };
    registry::write(&rec)
        .map_err(|e| format!("writing {}: {e}", registry::record_path(s.id).display()))?;
    let sd = shutdown.clone();
    let handlers = frontend::control::Handlers {
        status,
        shutdown: Arc::new(move || sd.request()),
        reclaim,
    };
    let server = frontend::control::ControlServer::start(&socket, handlers)
        .map_err(|e| format!("control socket {}: {e}", socket.display()))?;
    *control.lock().unwrap_or_else(|p| p.into_inner()) = Some(server);
    ready.ready(s);
    Ok(())
}

/// After `serve` returned: the record goes, and a waiting `zonedd delete` hears the outcome.
pub(crate) fn unpublish(
    result: Result<frontend::Started, FrontendError>,
    control: &ControlSlot,
) -> Result<(), String> {
    let outcome = result.as_ref().map(|_| ()).map_err(|e| e.to_string());
    if let Ok(s) = &result {
        registry::remove(s.id);
        let _ = std::fs::remove_file(registry::log_path(s.id));
        tracing::info!("ublk device {} removed", s.id);
    }
    // Last: a waiting `zonedd delete` returns once it reads this and the process exits.
    if let Some(server) = control.lock().unwrap_or_else(|p| p.into_inner()).take() {
        server.finish(&outcome);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use frontend::completion::{Kicker, TagCompletion};
    use frontend::queue::{execute, IoStats, QueueShared};
    use frontend::request::Request;
    use libublk::helpers::IoBuf;
    use std::sync::{mpsc, Condvar};

    /// Counts the jobs queued (the test waits on it) and passes everything to the pool.
    struct Counting {
        inner: PoolDispatch,
        queued: Mutex<usize>,
        cv: Condvar,
    }
    impl Dispatch for Counting {
        fn queue(&self, key: u64, job: Job) {
            self.inner.queue(key, job);
            *self.queued.lock().unwrap() += 1;
            self.cv.notify_all();
        }
        fn defer(&self, job: Job) {
            self.inner.defer(job)
        }
    }

    /// Log blocks the engine writes for 8 writes of one chunk that queue up behind a busy
    /// work of that chunk on the daemon's pool, through the frontend's request path.
    fn log_writes_for_a_batch_of_8(batch_sync: bool) -> u64 {
        let dev = zbd::MemDevice::with_zones(1 << 20, 16, 4).unwrap();
        let opts = dmz::sets::FormatOptions {
            label: None,
            reserved_seq: 2,
        };
        dmz::sets::format_device(&dev, &opts, &mut |_, _| {}).unwrap();
        // No reclaim: its passes flush (a log write) whenever it wakes.
        let mut eo = dmz::engine::EngineOptions::default();
        eo.reclaim.enabled = false;
        let engine = dmz::engine::Engine::open(Arc::new(dev), eo).unwrap();
        let target = Arc::new(EngineTarget(engine));
        let pool = Arc::new(workpool::Pool::new(
            "t",
            workpool::Policy::Unbound { max_active: 1 },
        ));
        let dispatch = Arc::new(Counting {
            inner: PoolDispatch {
                pool: pool.clone(),
                batch_sync,
            },
            queued: Mutex::new(0),
            cv: Condvar::new(),
        });
        let shared = Arc::new(QueueShared {
            target: target.clone(),
            dispatch: dispatch.clone(),
            stats: Arc::new(IoStats::default()),
            hop_free_reads: false,
            hop_free_writes: false,
            ring_flushes: false,
            linked_reads: frontend::queue::LinkedReads::Alone,
        });
        // Chunk 0 written whole first: the 8 writes below, in whatever order their threads
        // queue them, are overwrites in place in its buffer zone (no zone emptied, no flush).
        target.0.write(0, &vec![0x55; 1 << 20], false).unwrap();
        // Chunk 0's work is busy (started, so its batch holds it alone) until the 8 writes
        // are queued behind it: they form the next batch.
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        dispatch.queue(
            0,
            Box::new(move || {
                let _ = started_tx.send(());
                let _ = go_rx.recv();
            }),
        );
        started_rx.recv().unwrap();
        let before = target.0.stats().log_block_writes;
        let writers: Vec<_> = (0..8u64)
            .map(|i| {
                let sh = shared.clone();
                std::thread::spawn(move || {
                    let c = Arc::new(TagCompletion::new(Arc::new(Kicker::new().unwrap())));
                    let buf = Arc::new(IoBuf::<u8>::new(4096));
                    // SAFETY: the buffer is 4096 bytes and nothing else uses it yet.
                    unsafe { std::ptr::write_bytes(buf.as_mut_ptr(), i as u8 + 1, 4096) };
                    let w = Request::Write {
                        offset: i * 4096,
                        len: 4096,
                        fua: false,
                    };
                    smol::block_on(execute(w, &buf, &c, &sh))
                })
            })
            .collect();
        {
            let mut q = dispatch.queued.lock().unwrap();
            while *q < 9 {
                q = dispatch.cv.wait(q).unwrap();
            }
        }
        go_tx.send(()).unwrap();
        for w in writers {
            assert_eq!(w.join().unwrap(), 4096);
        }
        let n = target.0.stats().log_block_writes - before;
        let mut r = vec![0u8; 8 * 4096];
        target.0.read(0, &mut r).unwrap();
        for (i, b) in r.chunks(4096).enumerate() {
            assert!(b.iter().all(|&x| x == i as u8 + 1), "block {i}");
        }
        pool.shutdown();
        n
    }

    /// The daemon's wiring of group commit (PoolDispatch defers, EngineTarget syncs): one
    /// log write for the batch, against one per write with ZONEDD_BATCH_SYNC=0's setting.
    #[test]
    fn writes_batched_on_the_pool_share_one_log_write() {
        assert_eq!(log_writes_for_a_batch_of_8(true), 1);
        assert_eq!(log_writes_for_a_batch_of_8(false), 8);
    }

    #[test]
    fn mem_backend_sizes_parse_like_every_size_option() {
        assert_eq!(mem_backend_size("mem:512MiB"), Some(Ok(512 << 20)));
        assert_eq!(mem_backend_size("mem:512M"), Some(Ok(512 << 20)));
        assert_eq!(mem_backend_size("mem:1g"), Some(Ok(1 << 30)));
        assert_eq!(mem_backend_size("mem:1048576"), Some(Ok(1 << 20)));
        for bad in ["mem:512K", "mem:", "mem:x", "mem:4Q"] {
            assert_eq!(
                mem_backend_size(bad),
                Some(Err(format!("bad size in {bad}: expected e.g. mem:512M")))
            );
        }
        assert_eq!(mem_backend_size("file:/tmp/x"), None);
        assert_eq!(mem_backend_size("/dev/sda"), None);
    }
}
