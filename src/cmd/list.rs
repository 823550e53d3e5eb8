//! `zonedd list`: List zonedd devices.
//!
//! One line per device: id, block device, kernel state (live / quiesced / dead), daemon pid
//! (or `-` when no daemon runs), then the key figures of `zonedd status` asked from the
//! daemon (size, space used by mapped chunks, free zones, reclaim state, write amplification,
//! I/O errors, uptime; `-` without a daemon), backend and label. `--json` prints an array of
//! objects with the same fields (`daemon` is true while the pid is alive; the figures are
//! null without a daemon).

use super::summary::{self, ListFigures};
use super::CliError;
use frontend::registry::{self, DeviceSpec};
use frontend::sys;
use serde::Serialize;

pub use crate::cli::list::Args;

#[derive(Debug, Serialize)]
pub struct Listed {
    pub id: u32,
    pub bdev: String,
    pub state: String,
    pub pid: Option<u32>,
    pub daemon: bool,
    pub backend: Option<String>,
    pub label: Option<String>,
    #[serde(flatten)]
    pub figures: ListFigures,
}

/// Every zonedd device the kernel knows, plus stale records of ones it no longer has.
pub fn zonedd_devices() -> Vec<Listed> {
    let mut out = Vec::new();
    for id in sys::ublk_ids() {
        let Ok((state, data, ty)) = frontend::device::device_info(id) else {
            continue;
        };
        let rec = registry::read(id);
        let spec: Option<DeviceSpec> = data
            .and_then(|d| serde_json::from_value(d).ok())
            .or_else(|| rec.as_ref().map(|r| r.spec.clone()));
        if ty.as_deref() != Some(frontend::device::TARGET_NAME) && spec.is_none() {
            continue;
        }
        let pid = rec.as_ref().map(|r| r.pid);
        out.push(Listed {
            id,
            bdev: format!("/dev/ublkb{id}"),
            state: sys::state_name(state).to_string(),
            pid,
            daemon: pid.is_some_and(sys::pid_alive) && state != 2,
            backend: spec.as_ref().map(|s| s.backend.clone()),
            label: spec.and_then(|s| s.label),
            figures: ListFigures::default(),
        });
    }
    for r in registry::all() {
        if !out.iter().any(|l| l.id == r.id) {
            out.push(Listed {
                id: r.id,
                bdev: r.bdev.clone(),
                state: "gone".into(),
                pid: Some(r.pid),
                daemon: sys::pid_alive(r.pid),
                backend: Some(r.spec.backend.clone()),
                label: r.spec.label.clone(),
                figures: ListFigures::default(),
            });
        }
    }
    out.sort_by_key(|l| l.id);
    out
}

pub fn run(args: Args) -> Result<(), CliError> {
    super::need_ublk()?;
    super::need_root_for_daemons("zonedd list")?;
    let mut devs = zonedd_devices();
    for d in devs.iter_mut().filter(|d| d.daemon) {
        // A daemon that does not answer leaves its figures unknown; list still lists it.
        if let Ok(s) = super::status::daemon_socket(d.id)
            .and_then(|sock| super::status::ask_status(d.id, &sock))
        {
            d.figures = summary::list_figures(&s);
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&devs).unwrap_or_default()
        );
        return Ok(());
    }
    println!(
        "{:<4} {:<14} {:<9} {:<8} {} {:<30} LABEL",
        "ID",
        "DEVICE",
        "STATE",
        "PID",
        summary::LIST_HEADER,
        "BACKEND"
    );
    for d in devs {
        let pid = match (d.pid, d.daemon) {
            (Some(p), true) => p.to_string(),
            _ => "-".into(),
        };
        println!(
            "{:<4} {:<14} {:<9} {:<8} {} {:<30} {}",
            d.id,
            d.bdev,
            d.state,
            pid,
            summary::list_columns(&d.figures),
            d.backend.unwrap_or_else(|| "?".into()),
            d.label.unwrap_or_default()
        );
    }
    Ok(())
}
