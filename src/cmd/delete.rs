//! `zonedd delete`: Flush, commit and remove a zonedd device.
//!
//! Asks the daemon over its control socket to shut down, and waits for its answer: it stops
//! the device, flushes and commits the engine, deletes the device and exits. A device whose
//! daemon is gone is deleted directly (without a final flush: the dead daemon's last commit
//! is what the backend has).

use super::CliError;
use frontend::registry;
use frontend::sys;
use std::time::Duration;

pub use crate::cli::delete::Args;

pub fn run(args: Args) -> Result<(), CliError> {
    super::need_ublk()?;
    super::need_root("zonedd delete")?;
    let ids: Vec<u32> = if args.all {
        super::list::zonedd_devices()
            .into_iter()
            .map(|d| d.id)
            .collect()
    } else if let Some(b) = &args.backend {
        let canon = std::fs::canonicalize(b)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| b.clone());
        let found: Vec<u32> = super::list::zonedd_devices()
            .into_iter()
            .filter(|d| {
                d.backend.as_deref() == Some(canon.as_str())
                    || d.backend.as_deref() == Some(b.as_str())
            })
            .map(|d| d.id)
            .collect();
        if found.is_empty() {
            // Nothing to do is success for `ExecStop=`: the unit may already be down.
            eprintln!("zonedd: no device serves {b}");
            return Ok(());
        }
        found
    } else {
        vec![args.id.unwrap_or_default()]
    };
    let mut errors = Vec::new();
    for id in ids {
        match delete_one(id, args.force, Duration::from_secs(args.timeout)) {
            Ok(msg) => println!("{msg}"),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    // Refused everywhere (no such device, in use): exit 2; anything that failed: exit 1.
    let refused = errors.iter().all(|e| matches!(e, CliError::Usage(_)));
    let msg = errors
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ");
    Err(if refused {
        CliError::Usage(msg)
    } else {
        CliError::Failed(msg)
    })
}

fn delete_one(id: u32, force: bool, timeout: Duration) -> Result<String, CliError> {
    let exists = sys::ublk_ids().contains(&id);
    let rec = registry::read(id);
    if !exists {
        if rec.is_some() {
            registry::remove(id);
        }
        return Err(CliError::Usage(format!("no ublk device {id}")));
    }
    if !force {
        if let Some(why) = sys::bdev_in_use(id) {
            return Err(CliError::Usage(format!(
                "{why} (use --force to delete anyway)"
            )));
        }
    }
    delete_live(id, rec, timeout).map_err(CliError::Failed)
}

/// Shut down the daemon of an existing device `id`, or delete the device directly if the
/// daemon is gone.
fn delete_live(
    id: u32,
    rec: Option<registry::DeviceRecord>,
    timeout: Duration,
) -> Result<String, String> {
    if let Some(r) = rec
        .as_ref()
        .filter(|r| sys::pid_alive(r.pid) && r.socket.exists())
    {
        match frontend::control::request(&r.socket, "shutdown", timeout, |v| {
            v.get("done").is_some() || v.get("error").is_some()
        }) {
            Ok(replies) => {
                let last = replies.last().cloned().unwrap_or_default();
                if last.get("done").is_some() {
                    if !sys::wait_pid_exit(r.pid, timeout) {
                        return Err(format!(
                            "device {id}: the daemon (pid {}) did not exit",
                            r.pid
                        ));
                    }
                    return Ok(format!("deleted {} (id {id})", r.bdev));
                }
                if let Some(e) = last.get("error").and_then(|e| e.as_str()) {
                    return Err(format!(
                        "device {id}: the daemon failed to shut down cleanly: {e}"
                    ));
                }
                // The daemon went away without its final word: fall through to the check.
            }
            Err(e) => tracing::warn!("control socket of device {id}: {e}"),
        }
        if !sys::ublk_ids().contains(&id) {
            return Ok(format!("deleted {} (id {id})", r.bdev));
        }
    }
    eprintln!(
        "zonedd: ublk device {id} has no daemon: deleting it without a final flush (check the backend with `zonedd check`)"
    );
    frontend::device::delete_device(id).map_err(|e| e.to_string())?;
    registry::remove(id);
    Ok(format!("deleted /dev/ublkb{id} (id {id})"))
}
