//! One ublk device's lifecycle: parameters, create (ADD_DEV) or recover (START/END_USER_
//! RECOVERY), serving until stopped, then removal.

use crate::error::FrontendError;
use crate::features::{self, UblkFeatures};
use crate::queue::{run_queue, QueueShared};
use crate::request::BLOCK;
use crate::zoned::{run_zoned_queue, set_zoned_params, ZonedShared};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::UblkDev;
use libublk::{sys, UblkError, UblkFlags};
use serde_json::Value;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// libublk target name: how `list` recognises zonedd's devices.
pub const TARGET_NAME: &str = "zonedd";

/// Per-tag buffer: the largest request the kernel sends us.
pub const IO_BUF_BYTES: u32 = 512 << 10;

/// What a ublk device serves.
#[derive(Clone)]
pub enum Served {
    /// A random-write block device (the engine over a zoned backend, or a test target):
    /// requests split per chunk and run on the worker pool (`queue`).
    Block(Arc<QueueShared>),
    /// A zoned backend exposed as a host-managed zoned device (`zoned`).
    Zoned(Arc<ZonedShared>),
}

impl Served {
    fn capacity(&self) -> u64 {
        match self {
            Served::Block(s) => s.target.capacity() & !(BLOCK - 1),
            Served::Zoned(z) => z.capacity(),
        }
    }

    fn kind(&self) -> features::Kind {
        match self {
            Served::Block(_) => features::Kind::Block,
            Served::Zoned(_) => features::Kind::Zoned,
        }
    }

    fn set_params(&self, dev: &mut UblkDev, depth: u16) {
        match self {
            Served::Block(s) => {
                // The target keeps the fd open while it lives, and it outlives the queues.
                let hop_free = s.hop_free_reads || s.hop_free_writes;
                let read_fd = hop_free.then(|| s.target.read_fd()).flatten();
                set_params(dev, self.capacity(), s.target.chunk_size(), depth, read_fd)
            }
            Served::Zoned(z) => set_zoned_params(dev, z, depth),
        }
    }

    fn run_queue(&self, qid: u16, dev: &UblkDev) {
        match self {
            Served::Block(s) => run_queue(qid, dev, s.clone()),
            Served::Zoned(z) => run_zoned_queue(qid, dev, z.clone()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A new device; `None` lets the kernel pick the id.
    Add { id: Option<u32> },
    /// Re-attach to a QUIESCED device whose daemon died.
    Recover { id: u32 },
}

pub struct DeviceOptions {
    pub mode: Mode,
    pub queues: u16,
    pub depth: u16,
    /// Stored as libublk's `target_data` (what `recover` rebuilds the daemon from).
    pub target_json: Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub id: u32,
    pub bdev: String,
}

/// Ask the kernel to stop device `id` (STOP_DEV): its queues end and the daemon serving it
/// returns from [`serve`]. Safe from any thread: `new_simple` sets up this thread's own
/// control ring (libublk keeps one per thread).
pub fn stop_device(id: u32) -> Result<(), FrontendError> {
    let ctrl = UblkCtrl::new_simple(id as i32)
        .map_err(|e| FrontendError::ublk(format!("opening ublk device {id}"), e))?;
    ctrl.kill_dev()
        .map_err(|e| FrontendError::ublk(format!("stopping ublk device {id}"), e))?;
    Ok(())
}

/// Remove a device that has no daemon (or whose daemon is gone).
pub fn delete_device(id: u32) -> Result<(), FrontendError> {
    let ctrl = UblkCtrl::new_simple(id as i32)
        .map_err(|e| FrontendError::ublk(format!("opening ublk device {id}"), e))?;
    let _ = ctrl.kill_dev();
    ctrl.del_dev()
        .map_err(|e| FrontendError::ublk(format!("deleting ublk device {id}"), e))?;
    Ok(())
}

/// Kernel state and libublk's stored target data of device `id`.
pub fn device_info(id: u32) -> Result<(u16, Option<Value>, Option<String>), FrontendError> {
    let ctrl = UblkCtrl::new_simple(id as i32)
        .map_err(|e| FrontendError::ublk(format!("opening ublk device {id}"), e))?;
    Ok((
        ctrl.dev_info().state,
        ctrl.get_target_data_from_json(),
        ctrl.get_target_type_from_json().ok(),
    ))
}

/// Device parameters: 4 KiB blocks, volatile cache with FUA (so the kernel sends FLUSH and
/// FUA), chunk_sectors = chunk size, discard / write-zeroes up to one chunk. `read_fd`:
/// the target's fd for hop-free reads and writes, registered as the queue rings' fixed
/// file 1.
fn set_params(dev: &mut UblkDev, capacity: u64, chunk: u64, depth: u16, read_fd: Option<RawFd>) {
    basic_params(dev, capacity);
    let p = &mut dev.tgt.params;
    let chunk_sectors = chunk >> 9;
    if chunk.is_power_of_two() && chunk_sectors <= u32::MAX as u64 {
        p.basic.chunk_sectors = chunk_sectors as u32;
    }
    let max = chunk_sectors.min(u32::MAX as u64 & !7) as u32;
    p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
    p.discard = sys::ublk_param_discard {
        discard_alignment: 0,
        discard_granularity: BLOCK as u32,
        max_discard_sectors: max,
        max_write_zeroes_sectors: max,
        max_discard_segments: 1,
        reserved0: 0,
    };
    // One extra ring slot for the always-armed kick poll (see `completion`).
    dev.tgt.sq_depth = depth + 1;
    dev.tgt.cq_depth = 2 * (depth + 1);
    // libublk registers `tgt.fds` with every queue ring; fds[0] is the ublk char device.
    if let Some(fd) = read_fd.filter(|_| dev.tgt.nr_fds == 1) {
        dev.tgt.fds[1] = fd;
        dev.tgt.nr_fds = 2;
        // A hop-free read submits one ring read per device segment of the request: room
        // for a few per tag before a full submission queue makes libublk submit early.
        dev.tgt.sq_depth = (depth + 1).saturating_mul(4);
        dev.tgt.cq_depth = (depth + 1).saturating_mul(8);
    }
}

/// What every zonedd device has: `capacity` bytes in 4 KiB blocks, a volatile cache with FUA
/// (so the kernel sends FLUSH and FUA).
pub(crate) fn basic_params(dev: &mut UblkDev, capacity: u64) {
    dev.set_default_params(capacity);
    let p = &mut dev.tgt.params.basic;
    p.logical_bs_shift = 12;
    p.physical_bs_shift = 12;
    p.io_min_shift = 12;
    p.io_opt_shift = 12;
    p.attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
}

fn wait_for_node(path: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if std::path::Path::new(path).exists() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        // udev may still be renaming/creating the node; devtmpfs normally has it already.
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn build_error(id: Option<u32>, e: UblkError) -> FrontendError {
    match (&e, id) {
        (UblkError::OtherError(x), Some(id)) if *x == -libc::EEXIST => {
            FrontendError::Other(format!("ublk device id {id} already exists"))
        }
        (UblkError::OtherError(x), _) if *x == -libc::EPERM || *x == -libc::EACCES => {
            FrontendError::NotRoot("creating a ublk device".into())
        }
        _ => FrontendError::ublk("creating the ublk device", e),
    }
}

/// Serve `shared` as a ublk device until it is stopped ([`stop_device`], a signal
/// handler, or the kernel). The `UBLK_F_*` flags come from [`features::choose`] (what the
/// kernel offers, checked against what this kind of device needs). `on_started` runs once
/// `/dev/ublkbN` exists, with those flags (an `Err` from it stops the device and becomes this
/// call's error); `on_stopped` runs after the queues are
/// down and before the device is deleted (flush and commit go there). `shared` is dropped
/// before `on_stopped`, so that callback may hold the only reference to the target.
pub fn serve(
    shared: Served,
    opts: DeviceOptions,
    on_started: impl FnOnce(&Started, &UblkFeatures) -> Result<(), String> + Send + Sync + 'static,
    on_stopped: impl FnOnce() -> Result<(), String>,
) -> Result<Started, FrontendError> {
    crate::sys::check_ublk()?;
    let capacity = shared.capacity();
    if capacity == 0 {
        return Err(FrontendError::Other("the target has no capacity".into()));
    }
    let (id, dev_flags) = match opts.mode {
        Mode::Add { id } => (id, UblkFlags::UBLK_DEV_F_ADD_DEV),
        Mode::Recover { .. } if matches!(shared, Served::Zoned(_)) => {
            return Err(FrontendError::Other(
                "an exposed zoned device cannot be recovered: it went with its daemon".into(),
            ));
        }
        Mode::Recover { id } => {
            on_control_thread(|| prepare_recovery(id, capacity))?;
            (Some(id), UblkFlags::UBLK_DEV_F_RECOVER_DEV)
        }
    };
    // Control commands after the start (kill on error, stop, delete, and the drop of
    // `ctrl`) come from this thread: it needs a ring, which stays idle until then.
    init_control_ring().map_err(|e| FrontendError::ublk("setting up the control ring", e))?;
    let (queues, depth, kind) = (opts.queues, opts.depth, shared.kind());
    let (ctrl, ublk) = on_control_thread(move || {
        // GET_FEATURES (6.5+); `None` on older kernels, then ADD_DEV's answer is checked.
        let kernel = UblkCtrl::get_features();
        let requested = features::choose(kernel, kind).map_err(FrontendError::Other)?;
        let ctrl = UblkCtrlBuilder::default()
            .name(TARGET_NAME)
            .id(id.map(|i| i as i32).unwrap_or(-1))
            .nr_queues(queues)
            .depth(depth)
            .io_buf_bytes(IO_BUF_BYTES)
            .ctrl_flags(requested)
            .dev_flags(dev_flags)
            .build()
            .map_err(|e| build_error(id, e))?;
        let ublk = UblkFeatures {
            kernel,
            requested,
            device: ctrl.dev_info().flags,
        };
        Ok::<_, FrontendError>((ctrl, ublk))
    })?;
    let dev_id = ctrl.dev_info().dev_id;
    let started = Started {
        id: dev_id,
        bdev: ctrl.get_bdev_path(),
    };
    tracing::info!("ublk device {dev_id} added ({:?})", opts.mode);
    tracing::info!("ublk device {dev_id}: {}", ublk.describe());
    if let Err(e) = features::check_accepted(ublk.requested, ublk.device, kind) {
        // A new device is deleted when `ctrl` drops; a recovered one stays quiesced.
        if matches!(opts.mode, Mode::Recover { .. }) {
            ctrl.disown();
        }
        return Err(FrontendError::Other(e));
    }

    let target_json = opts.target_json;
    let params_of = shared.clone();
    let tgt_fn = move |dev: &mut UblkDev| {
        params_of.set_params(dev, depth);
        dev.set_target_json(target_json);
        Ok(())
    };
    let mut start_error = None;
    let run = run_device(&ctrl, tgt_fn, shared.clone(), |ctrl| {
        let res = if wait_for_node(&started.bdev) {
            on_started(&started, &ublk)
        } else {
            Err(format!("{} did not appear", started.bdev))
        };
        if let Err(e) = res {
            start_error = Some(e);
            let _ = ctrl.kill_dev();
        }
    });
    drop(shared);
    tracing::info!("ublk device {dev_id}: queues are down");
    let stopped = on_stopped();
    // A recovery that failed to start leaves the device quiesced, for another try;
    // everything else was stopped and goes.
    let keep = run.is_err() && matches!(opts.mode, Mode::Recover { .. });
    if keep {
        ctrl.disown();
    } else if let Err(e) = ctrl.del_dev() {
        tracing::warn!(
            "deleting ublk device {dev_id}: {}",
            crate::error::ublk_error_text(&e)
        );
    }
    run.map_err(|e| FrontendError::ublk("starting the ublk device", e))?;
    if let Some(e) = start_error {
        return Err(FrontendError::Other(e));
    }
    stopped.map_err(FrontendError::Other)?;
    Ok(started)
}

/// Run `f`, which sends ublk control commands, on a thread of its own that then exits.
///
/// The kernel always hands a ublk control command to an io_uring worker thread (it cannot
/// be issued without blocking), and a task's last idle `iou-wrk` thread stays for the
/// task's lifetime, waking every 5 s. Sent from the long-lived daemon thread, ADD_DEV and
/// START_DEV left such a waker behind for good (measured in the VM: 5 wakeups per 25 s of
/// an idle daemon); sent from a thread that exits, the worker goes with it.
/// A thread that cannot be spawned, or its control ring set up, is an error of `f`'s kind.
fn on_control_thread<T: Send, E: Send + From<ControlThreadError>>(
    f: impl FnOnce() -> Result<T, E> + Send,
) -> Result<T, E> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("zonedd-ublkctl".into())
            .spawn_scoped(s, move || {
                // libublk keeps its control ring per thread: give this one its own.
                init_control_ring()
                    .map_err(|e| ControlThreadError(format!("setting up its ring: {e}")))?;
                f()
            })
            .map_err(|e| E::from(ControlThreadError(format!("spawning it: {e}"))))?
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Why [`on_control_thread`] could not run its closure.
#[derive(Debug)]
struct ControlThreadError(String);

impl std::fmt::Display for ControlThreadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ublk control thread: {}", self.0)
    }
}

impl From<ControlThreadError> for FrontendError {
    fn from(e: ControlThreadError) -> FrontendError {
        FrontendError::Other(e.to_string())
    }
}

impl From<ControlThreadError> for UblkError {
    fn from(e: ControlThreadError) -> UblkError {
        UblkError::IOError(std::io::Error::other(e.to_string()))
    }
}

/// Set up the calling thread's libublk control ring if it has none (what `UblkCtrl`'s
/// constructors do on the thread that builds it).
fn init_control_ring() -> Result<(), UblkError> {
    libublk::ctrl::ublk_init_ctrl_task_ring(|ring| {
        if ring.is_none() {
            *ring = Some(
                io_uring::IoUring::<io_uring::squeue::Entry128>::builder()
                    .build(32)
                    .map_err(UblkError::IOError)?,
            );
        }
        Ok(())
    })
}

/// libublk's `run_target`, with ADD_DEV's and START_DEV's control commands (and the queue
/// affinity queries) sent from [`on_control_thread`]: queue threads are spawned and
/// configured, the device started, `device_fn` run here, and the queue threads joined.
fn run_device(
    ctrl: &UblkCtrl,
    tgt_fn: impl FnOnce(&mut UblkDev) -> Result<(), UblkError>,
    shared: Served,
    device_fn: impl FnOnce(&UblkCtrl),
) -> Result<(), UblkError> {
    let dev = Arc::new(UblkDev::new(ctrl.get_name(), tgt_fn, ctrl)?);
    let nr_queues = dev.dev_info.nr_hw_queues;
    let nr_threads = dev.io_threads_per_queue();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for q in 0..nr_queues {
        for t in 0..nr_threads {
            let (dev, tx, shared) = (dev.clone(), tx.clone(), shared.clone());
            handles.push(std::thread::spawn(move || {
                let tid = UblkCtrl::init_queue_thread();
                libublk::io::set_io_thread_idx(t);
                if tx.send((q, tid)).is_ok() {
                    shared.run_queue(q, &dev);
                }
            }));
        }
    }
    drop(tx);
    let d = dev.clone();
    let started = on_control_thread(move || {
        for _ in 0..nr_queues as u32 * nr_threads as u32 {
            let Ok((q, tid)) = rx.recv() else { break };
            ctrl.set_thread_affinity(q, tid);
            ctrl.configure_queue(&d, q, tid)?;
        }
        ctrl.start_dev(&d)
    });
    if started.is_ok() {
        device_fn(ctrl);
    } else {
        let _ = ctrl.kill_dev();
    }
    for h in handles {
        if h.join().is_err() {
            tracing::error!("a ublk queue thread panicked");
        }
    }
    // The device may already be gone (deleted from elsewhere): ENOENT is normal here.
    let _ = ctrl.stop_dev();
    started.map(|_| ())
}

/// Checks and START_USER_RECOVERY for `recover`: the device must be QUIESCED (its daemon
/// died) and the new target must have the same size.
fn prepare_recovery(id: u32, capacity: u64) -> Result<(), FrontendError> {
    let old = UblkCtrl::new_simple(id as i32)
        .map_err(|e| FrontendError::ublk(format!("opening ublk device {id}"), e))?;
    let state = old.dev_info().state;
    if state as u32 != sys::UBLK_S_DEV_QUIESCED {
        return Err(FrontendError::Other(format!(
            "ublk device {id} is {}, not quiesced: only a device whose daemon died can be recovered",
            crate::sys::state_name(state)
        )));
    }
    if let Ok(tgt) = old.get_target_from_json() {
        if tgt.dev_size != 0 && tgt.dev_size != capacity {
            return Err(FrontendError::Other(format!(
                "ublk device {id} has {} bytes but the backend gives {capacity}: not the same volume",
                tgt.dev_size
            )));
        }
    }
    old.start_user_recover()
        .map_err(|e| FrontendError::ublk(format!("starting recovery of ublk device {id}"), e))?;
    Ok(())
}
