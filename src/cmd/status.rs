//! `zonedd status`: Show the state and counters of a zonedd device.
//!
//! The numbers come from the live daemon over its control socket. By default a short
//! summary (device, backend and layout, capacity, zones by role, the conventional cache,
//! reclaim, write amplification, I/O and errors, uptime: [`super::summary`]); while reclaim
//! runs, a second look a second later gives its rate. `--watch [SECS]` redraws the summary
//! with live rates until interrupted. `--json` prints the daemon's answer as is: every
//! counter, with the names of docs/status.md (`ublk`: what the kernel's ublk driver offers,
//! which `UBLK_F_*` flags zonedd asked for and which the device has, `frontend::features`);
//! `--prometheus` the same counters in the Prometheus text format ([`super::metrics`]).

use super::summary;
use super::CliError;
use frontend::{registry, sys};
use serde_json::Value;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use crate::cli::status::Args;

pub fn run(args: Args) -> Result<(), CliError> {
    let watch = args.watch.map(watch_interval).transpose()?;
    super::need_ublk()?;
    super::need_root_for_daemons("zonedd status")?;
    let id = args.id;
    let socket = daemon_socket(id)?;
    if args.prometheus {
        print!("{}", super::metrics::render(&ask_status(id, &socket)?));
        return Ok(());
    }
    if args.json {
        let status = ask_status(id, &socket)?;
        println!(
            "{}",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        );
        return Ok(());
    }
    match watch {
        Some(every) => watch_loop(id, &socket, every),
        None => {
            let first = ask_status(id, &socket)?;
            let t0 = Instant::now();
            let running = first["engine"]["reclaim_state"] == "running";
            let (now, rates) = if running {
                std::thread::sleep(Duration::from_secs(1));
                let second = ask_status(id, &socket)?;
                let r = summary::rates(&first, &second, t0.elapsed().as_secs_f64());
                (second, r)
            } else {
                (first, None)
            };
            for l in summary::summary(&now, rates.as_ref()) {
                println!("{l}");
            }
            Ok(())
        }
    }
}

/// `--watch`'s interval, checked like every argument before the environment.
pub(crate) fn watch_interval(secs: f64) -> Result<Duration, CliError> {
    if secs.is_finite() && (0.1..=3600.0).contains(&secs) {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(CliError::Usage(format!(
            "--watch takes an interval between 0.1 and 3600 seconds, not {secs}"
        )))
    }
}

fn watch_loop(id: u32, socket: &std::path::Path, every: Duration) -> Result<(), CliError> {
    let tty = std::io::stdout().is_terminal();
    let mut prev: Option<(Value, Instant)> = None;
    loop {
        let now = ask_status(id, socket)
            .map_err(|e| CliError::Failed(format!("watching device {id}: {e}")))?;
        let t = Instant::now();
        let rates = prev
            .as_ref()
            .and_then(|(p, pt)| summary::rates(p, &now, t.duration_since(*pt).as_secs_f64()));
        let mut out = String::new();
        if tty {
            out += "\x1b[H\x1b[2J"; // home, clear screen
        }
        for l in summary::summary(&now, rates.as_ref()) {
            out += &l;
            out.push('\n');
        }
        if tty {
            out += &format!("\nevery {} s; Ctrl-C to stop\n", every.as_secs_f64());
        } else {
            out.push('\n');
        }
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(out.as_bytes());
        let _ = stdout.flush();
        drop(stdout);
        prev = Some((now, t));
        std::thread::sleep(every);
    }
}

/// The control socket of device `id`'s live daemon, or why there is none (exit 2).
pub(crate) fn daemon_socket(id: u32) -> Result<PathBuf, CliError> {
    let rec = registry::read(id);
    if let Some(rec) = rec.filter(|r| sys::pid_alive(r.pid) && r.socket.exists()) {
        return Ok(rec.socket);
    }
    // Asked of libublk only for a device the kernel has: for another id it prints its own
    // complaint ("device reload json failed") next to our line.
    let state = if sys::ublk_ids().contains(&id) {
        frontend::device::device_info(id)
            .map(|(s, _, _)| sys::state_name(s).to_string())
            .unwrap_or_else(|_| "absent".into())
    } else {
        "absent".into()
    };
    let hint = if state == "quiesced" {
        format!(": its daemon died, run `zonedd recover {id}`")
    } else {
        String::new()
    };
    Err(CliError::Usage(format!(
        "ublk device {id} has no running zonedd daemon (device {state}){hint}"
    )))
}

/// One request to the daemon and its first reply's `key` section. A reply `{"ok":false}`
/// (the daemon refused: another uid, a target without reclaim) is exit 2 with its reason.
pub(crate) fn ask(
    id: u32,
    socket: &std::path::Path,
    cmd: &str,
    key: &str,
) -> Result<Value, CliError> {
    let replies = frontend::control::request(socket, cmd, Duration::from_secs(10), |_| true)
        .map_err(|e| CliError::Failed(format!("asking the daemon of device {id}: {e}")))?;
    let reply = replies.into_iter().next().unwrap_or(Value::Null);
    if reply["ok"] == false {
        let why = reply["error"].as_str().unwrap_or("refused");
        return Err(CliError::Usage(format!(
            "the daemon of device {id} refused: {why}"
        )));
    }
    reply
        .get(key)
        .cloned()
        .ok_or_else(|| CliError::Failed(format!("the daemon of device {id} gave no {key}")))
}

pub(crate) fn ask_status(id: u32, socket: &std::path::Path) -> Result<Value, CliError> {
    ask(id, socket, "status", "status")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_intervals_are_checked() {
        assert_eq!(watch_interval(2.0).unwrap(), Duration::from_secs(2));
        assert_eq!(watch_interval(0.5).unwrap(), Duration::from_millis(500));
        for bad in [0.0, -1.0, 0.05, 3601.0, f64::NAN, f64::INFINITY] {
            let e = watch_interval(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2);
            assert!(
                e.to_string()
                    .starts_with("--watch takes an interval between 0.1 and 3600 seconds"),
                "{e}"
            );
        }
    }
}
