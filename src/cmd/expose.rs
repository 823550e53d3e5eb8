//! `zonedd expose IMAGE`: serve an emulated SMR image as a host-managed zoned block device.
//!
//! The kernel sees the image's zones as they are (conventional and sequential zones, write
//! pointers, conditions, open/active limits; `frontend::zoned` answers zone reports, zone
//! management and zone append from the image's own rules), so anything that runs on a zoned
//! disk runs on it: the kernel's dm-zoned, btrfs/f2fs/XFS zoned, `fio --zonemode=zbd`, and
//! zonedd itself (`zonedd create --backend /dev/ublkbN`). The image keeps its state: after
//! `zonedd delete`, `zonedd expose` again shows the same zones and data. Prints the same two
//! lines as `create` (`/dev/ublkbN`, `id N`); `list`, `status` and `delete` work on it.

use super::create::{publish, unpublish, ControlSlot};
use super::CliError;
use frontend::daemon::{self, Readiness, Shutdown};
use frontend::features::UblkFeatures;
use frontend::registry::DeviceSpec;
use frontend::zoned::{ZonedShared, ZonedStats};
use frontend::{sys, Mode};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

pub use crate::cli::expose::{Args, Timing};

/// What `status` shows as the device's layout.
const LAYOUT: &str = "zoned (exposed image)";

pub fn run(args: Args) -> Result<(), CliError> {
    if args.queues == 0 || args.depth == 0 || args.depth > 4096 {
        return Err(CliError::Usage(
            "--queues must be >= 1 and --depth between 1 and 4096".into(),
        ));
    }
    let params = timing_params(&args)?;
    super::need_ublk()?;
    super::need_root("zonedd expose")?;
    frontend::registry::ensure_run_dir().map_err(|e| CliError::Usage(e.to_string()))?;
    let path = std::fs::canonicalize(&args.image)
        .map_err(|e| CliError::Usage(format!("{}: {e}", args.image)))?;
    let backend = path.display().to_string();
    if let Some(id) = exposed_by(&backend) {
        return Err(CliError::Usage(format!(
            "{backend} is already served by ublk device {id}"
        )));
    }
    let capacity = check_image(&path)?;
    let model = params
        .map(|p| zbd::timing::HddModel::new(p, capacity))
        .transpose()
        .map_err(CliError::Usage)?;
    let spec = DeviceSpec {
        backend,
        label: args.label,
        pool: "none".into(),
        max_active: None,
        reclaim_max_active: None,
        index_memory_mib: None,
        compact: None,
        queues: args.queues,
        depth: args.depth,
        exposed: true,
        cache: None,
        more_backends: Vec::new(),
    };
    let mode = Mode::Add { id: args.id };
    daemon::launch(args.foreground, move |ready| body(spec, mode, model, ready))
        .map_err(CliError::Failed)
}

/// The `hdd` model's parameters (`None` for `--timing none`), checked before anything else.
fn timing_params(args: &Args) -> Result<Option<zbd::timing::HddParams>, CliError> {
    if args.timing == Timing::None {
        if let Some(kv) = args.timing_param.first() {
            return Err(CliError::Usage(format!(
                "--timing-param {kv} needs --timing hdd (there is nothing to set with --timing none)"
            )));
        }
        return Ok(None);
    }
    let mut p = zbd::timing::HddParams::default();
    for kv in &args.timing_param {
        p.set(kv).map_err(CliError::Usage)?;
    }
    p.validate().map_err(CliError::Usage)?;
    Ok(Some(p))
}

/// Only an emulated image can be exposed: a zoned disk already is a zoned block device, and
/// anything else has no zones. Opened (and locked) here for the clearest refusal; the daemon
/// opens it again. Gives the image's capacity.
fn check_image(path: &Path) -> Result<u64, CliError> {
    let meta =
        std::fs::metadata(path).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
    if std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type())
        && zbd::sysfs_zoned_model(path).is_some_and(|m| m != "none")
    {
        return Err(CliError::Usage(format!(
            "{} is a zoned block device already: use it as it is (zonedd expose serves emulated images)",
            path.display()
        )));
    }
    zbd::Emulated::open(path)
        .map(|img| zbd::ZonedDevice::geometry(&img).capacity())
        .map_err(|e| super::open_error(path, e))
}

/// The ublk device already serving `backend` through zonedd, if any.
fn exposed_by(backend: &str) -> Option<u32> {
    sys::ublk_ids()
        .into_iter()
        .find(|&id| frontend::registry::read(id).is_some_and(|r| r.spec.backend == backend))
}

fn body(
    spec: DeviceSpec,
    mode: Mode,
    model: Option<zbd::timing::HddModel>,
    ready: Arc<Readiness>,
) -> Result<(), String> {
    if let Err(e) = sys::private_mount_namespace() {
        tracing::warn!("no private mount namespace: {e}");
    }
    let shutdown = Arc::new(Shutdown::default());
    daemon::handle_signals(shutdown.clone()).map_err(|e| format!("signal handler: {e}"))?;
    let image = zbd::Emulated::open(Path::new(&spec.backend)).map_err(|e| e.to_string())?;
    let dev: Arc<dyn zbd::ZonedDevice> = Arc::new(image);
    let stats = Arc::new(ZonedStats::default());
    let mut shared = ZonedShared::new(dev.clone(), stats.clone()).map_err(|e| e.to_string())?;
    let clock = model.map(|m| Arc::new(zbd::timing::HddClock::new(m)));
    if let Some(c) = &clock {
        shared = shared.with_timing(c.clone());
    }
    let shared = Arc::new(shared);
    let opts = frontend::DeviceOptions {
        mode,
        queues: spec.queues,
        depth: spec.depth,
        target_json: serde_json::to_value(&spec).map_err(|e| e.to_string())?,
    };
    let control: ControlSlot = Arc::default();
    let (ctl, sd, spec2, dev2) = (control.clone(), shutdown.clone(), spec.clone(), dev.clone());
    let started = std::time::Instant::now();
    let on_started = move |s: &frontend::Started, ublk: &UblkFeatures| -> Result<(), String> {
        let (id, bdev, ublk) = (s.id, s.bdev.clone(), ublk.to_json());
        let backend = spec2.backend.clone();
        let status = Arc::new(move || {
            let mut v = status_json(id, &bdev, &backend, &*dev2, &stats, started);
            v["timing"] = match &clock {
                Some(c) => serde_json::to_value(c.report()).unwrap_or(Value::Null),
                None => json!({ "model": "none" }),
            };
            v["ublk"] = ublk.clone();
            v
        });
        let no_reclaim = format!(
            "device {id} serves {} as a zoned device: it has no reclaim of its own",
            spec2.backend
        );
        let reclaim = Arc::new(move || -> Result<Value, String> { Err(no_reclaim.clone()) });
        publish(s, &spec2, &sd, status, reclaim, &ctl, &ready)
    };
    let on_stopped = move || dev.flush().map_err(|e| format!("flush: {e}"));
    let result = frontend::device::serve(
        frontend::Served::Zoned(shared),
        opts,
        on_started,
        on_stopped,
    );
    unpublish(result, &control)
}

/// `zonedd status --json` of an exposed device.
fn status_json(
    id: u32,
    bdev: &str,
    backend: &str,
    dev: &dyn zbd::ZonedDevice,
    stats: &ZonedStats,
    started: std::time::Instant,
) -> Value {
    let geo = dev.geometry();
    let mut by_cond = std::collections::BTreeMap::<String, u32>::new();
    if let Ok(zones) = dev.report_all() {
        for z in zones {
            let k = serde_json::to_value(z.cond)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            *by_cond.entry(k).or_default() += 1;
        }
    }
    json!({
        "id": id,
        "bdev": bdev,
        "backend": backend,
        "pid": std::process::id(),
        "version": env!("CARGO_PKG_VERSION"),
        "layout": LAYOUT,
        "capacity_bytes": geo.capacity(),
        "zone_bytes": geo.zone_size,
        "zones": geo.nr_zones,
        "max_open_zones": geo.max_open_zones,
        "max_active_zones": geo.max_active_zones,
        "zones_by_condition": by_cond,
        "uptime_secs": started.elapsed().as_secs(),
        "zoned": stats.snapshot(),
    })
}
