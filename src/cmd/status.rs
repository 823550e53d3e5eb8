//! `zonedd status`: Show the state and counters of a zonedd device.
//!
//! The numbers come from the live daemon over its control socket: the engine's counters
//! (zones free / mapped / buffer / reserved, reclaim state and progress, I/O and flush
//! counters, write amplification), the worker pool's, and the frontend's request counters;
//! `ublk` says what the kernel's ublk driver offers (GET_FEATURES), which `UBLK_F_*` flags
//! zonedd asked for and which the device has (`frontend::features`).
//! `--json` prints the daemon's answer as is.

use super::CliError;
use frontend::{registry, sys};
use serde_json::Value;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// The ublk device id (from `zonedd list`).
    pub id: u32,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<(), CliError> {
    super::need_ublk()?;
    super::need_root_for_daemons("zonedd status")?;
    let id = args.id;
    let rec = registry::read(id);
    let Some(rec) = rec.filter(|r| sys::pid_alive(r.pid) && r.socket.exists()) else {
        let state = frontend::device::device_info(id)
            .map(|(s, _, _)| sys::state_name(s).to_string())
            .unwrap_or_else(|_| "absent".into());
        let hint = if state == "quiesced" {
            format!(": its daemon died, run `zonedd recover {id}`")
        } else {
            String::new()
        };
        return Err(CliError::Usage(format!(
            "ublk device {id} has no running zonedd daemon (device {state}){hint}"
        )));
    };
    let replies =
        frontend::control::request(&rec.socket, "status", Duration::from_secs(10), |_| true)
            .map_err(|e| CliError::Failed(format!("asking the daemon of device {id}: {e}")))?;
    let status = replies
        .into_iter()
        .next()
        .and_then(|v| v.get("status").cloned())
        .ok_or_else(|| CliError::Failed(format!("the daemon of device {id} gave no status")))?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        );
    } else {
        let mut lines = Vec::new();
        flatten("", &status, &mut lines);
        for (k, v) in lines {
            println!("{k:<40} {v}");
        }
    }
    Ok(())
}

/// `a.b.c  value` lines, in the daemon's order.
fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::Null => {}
        Value::String(s) => out.push((prefix.to_string(), s.clone())),
        // Lists of names (the ublk flags): space-separated.
        Value::Array(a) if a.iter().all(Value::is_string) => out.push((
            prefix.to_string(),
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" "),
        )),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattens_nested_counters() {
        let v = serde_json::json!({"id": 0, "engine": {"zones": {"free": 5}, "x": null}, "bdev": "/dev/ublkb0",
            "ublk": {"flags_used_names": ["USER_RECOVERY", "USER_RECOVERY_REISSUE"], "n": [1, 2]}});
        let mut out = Vec::new();
        flatten("", &v, &mut out);
        assert!(out.contains(&(
            "ublk.flags_used_names".to_string(),
            "USER_RECOVERY USER_RECOVERY_REISSUE".to_string()
        )));
        assert!(out.contains(&("ublk.n".to_string(), "[1,2]".to_string())));
        assert!(out.contains(&("engine.zones.free".to_string(), "5".to_string())));
        assert!(out.contains(&("bdev".to_string(), "/dev/ublkb0".to_string())));
        assert!(!out.iter().any(|(k, _)| k == "engine.x"));
    }
}
