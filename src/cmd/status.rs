//! `zonedd status`: Show the state and counters of a zonedd device.
//!
//! The numbers come from the live daemon over its control socket: the engine's counters
//! (zones free / mapped / buffer / reserved, reclaim state and progress, I/O and flush
//! counters, write amplification), the worker pool's, and the frontend's request counters.
//! `--json` prints the daemon's answer as is.

use super::CliError;
use frontend::{registry, sys};
use serde_json::Value;
use std::time::Duration;

pub use crate::cli::status::Args;

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
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattens_nested_counters() {
        let v = serde_json::json!({"id": 0, "engine": {"zones": {"free": 5}, "x": null}, "bdev": "/dev/ublkb0"});
        let mut out = Vec::new();
        flatten("", &v, &mut out);
        assert!(out.contains(&("engine.zones.free".to_string(), "5".to_string())));
        assert!(out.contains(&("bdev".to_string(), "/dev/ublkb0".to_string())));
        assert!(!out.iter().any(|(k, _)| k == "engine.x"));
    }
}
