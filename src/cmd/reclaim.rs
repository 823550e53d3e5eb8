//! `zonedd reclaim`: start a reclaim pass now, like dm-zoned's `dmsetup message DEV 0
//! reclaim`.
//!
//! The daemon's engine is asked for a forced pass (`Engine::trigger_reclaim`): it reclaims
//! every chunk it can (buffered chunks merged into their data zone, chunks in conventional
//! zones moved into sequential ones) whatever the idle timer and the watermarks say, then
//! sleeps (it does not spin, and a pass that freed nothing leaves it asleep until something
//! changes). The answer names the request; without `--wait` the command returns at once.
//!
//! With `--wait` it polls the status until the engine's `reclaim_requests_done` reaches that
//! request, showing progress on standard error (a progress bar on a terminal: conventional
//! zones drained of those in use at the start; plain lines otherwise, when the figures
//! change), then prints what the pass reclaimed: zones, bytes copied (the counters'
//! difference, before and after), and the conventional zones still in use.

use super::status::{ask, ask_status, daemon_socket};
use super::summary::{self, bytes};
use super::CliError;
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::time::Duration;

pub use crate::cli::reclaim::Args;

/// How often `--wait` looks at the status.
const POLL: Duration = Duration::from_millis(200);

pub fn run(args: Args) -> Result<(), CliError> {
    super::need_ublk()?;
    super::need_root_for_daemons("zonedd reclaim")?;
    let id = args.id;
    let socket = daemon_socket(id)?;
    let start_status = ask_status(id, &socket)?;
    let reply = ask(id, &socket, "reclaim", "reclaim")?;
    let request = reply["request"].as_u64().unwrap_or(0);
    if !args.wait {
        if args.json {
            println!("{}", json!({"id": id, "request": request, "done": false}));
        } else {
            println!("device {id}: reclaim pass {request} started");
        }
        return Ok(());
    }
    // The counters just before the request (the daemon read them), and the cache then.
    let mut before = start_status.clone();
    if reply["before"].is_object() {
        before["engine"] = reply["before"].clone();
    }
    let mut progress = Progress::new(&before, !args.json);
    let after = loop {
        let now = ask_status(id, &socket)
            .map_err(|e| CliError::Failed(format!("waiting for reclaim on device {id}: {e}")))?;
        progress.show(&now);
        if done(&now, request) {
            break now;
        }
        std::thread::sleep(POLL);
    };
    progress.finish();
    let r = result(id, request, &before, &after);
    if args.json {
        println!("{r}");
    } else {
        println!("{}", result_line(&r));
    }
    Ok(())
}

/// Reclaim has handled request `request` and is asleep again.
pub(crate) fn done(status: &Value, request: u64) -> bool {
    summary::num(status, &["engine", "reclaim_requests_done"]).is_some_and(|d| d >= request)
}

/// What the pass reclaimed, between two statuses.
pub(crate) fn result(id: u32, request: u64, before: &Value, after: &Value) -> Value {
    let (zones, copied) = summary::reclaimed(&before["engine"], &after["engine"]);
    let cache = |s: &Value| summary::cache_zones(s).map(|(used, _)| used);
    json!({
        "id": id,
        "request": request,
        "done": true,
        "zones_reclaimed": zones,
        "bytes_copied": copied,
        "conventional_in_use_before": cache(before),
        "conventional_in_use_after": cache(after),
        "conventional_usable": summary::cache_zones(after).map(|(_, usable)| usable),
        "zones_free": summary::num(after, &["engine", "zones_free"]),
    })
}

pub(crate) fn result_line(r: &Value) -> String {
    let zones = r["zones_reclaimed"].as_u64().unwrap_or(0);
    let mut s = format!(
        "device {}: reclaimed {zones} zone{}, {} copied",
        r["id"],
        if zones == 1 { "" } else { "s" },
        bytes(r["bytes_copied"].as_u64().unwrap_or(0))
    );
    if let (Some(b), Some(a), Some(u)) = (
        r["conventional_in_use_before"].as_u64(),
        r["conventional_in_use_after"].as_u64(),
        r["conventional_usable"].as_u64(),
    ) {
        s += &format!("; conventional zones in use {b} -> {a} of {u}");
    }
    if let Some(f) = r["zones_free"].as_u64() {
        s += &format!(", {f} zones free");
    }
    s
}

/// A plain progress line (not on a terminal).
pub(crate) fn progress_line(before: &Value, now: &Value) -> String {
    let (zones, copied) = summary::reclaimed(&before["engine"], &now["engine"]);
    let state = now["engine"]["reclaim_state"].as_str().unwrap_or("?");
    let mut s = format!(
        "reclaim {state}: {zones} zone{}, {} copied",
        if zones == 1 { "" } else { "s" },
        bytes(copied)
    );
    if let Some((used, usable)) = summary::cache_zones(now) {
        s += &format!(", conventional zones in use {used} of {usable}");
    }
    s
}

/// Progress on standard error: a bar on a terminal (conventional zones drained of those in
/// use at the start), plain lines when the figures change otherwise; nothing with `--json`.
struct Progress {
    before: Value,
    start_used: u64,
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    last: String,
}

impl Progress {
    fn new(before: &Value, show: bool) -> Progress {
        let start_used = summary::cache_zones(before).map_or(0, |(u, _)| u);
        let tty = std::io::stderr().is_terminal();
        let bar = (show && tty).then(|| {
            let b = indicatif::ProgressBar::new(start_used.max(1));
            let style = indicatif::ProgressStyle::with_template(
                "reclaim [{bar:30}] {pos}/{len} conventional zones drained, {msg} ({elapsed})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
            b.set_style(style);
            b.enable_steady_tick(Duration::from_millis(250));
            b
        });
        Progress {
            before: before.clone(),
            start_used,
            bar,
            plain: show && !tty,
            last: String::new(),
        }
    }

    fn show(&mut self, now: &Value) {
        if let Some(b) = &self.bar {
            let used = summary::cache_zones(now).map_or(0, |(u, _)| u);
            b.set_position(self.start_used.saturating_sub(used));
            let (zones, copied) = summary::reclaimed(&self.before["engine"], &now["engine"]);
            b.set_message(format!("{zones} zones reclaimed, {} copied", bytes(copied)));
        } else if self.plain {
            let line = progress_line(&self.before, now);
            if line != self.last {
                eprintln!("{line}");
                self.last = line;
            }
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::summary::tests::fixed_status;

    fn after_pass() -> Value {
        let mut a = fixed_status();
        let e = &mut a["engine"];
        e["reclaim_state"] = json!("idle");
        e["reclaim_requests"] = json!(1);
        e["reclaim_requests_done"] = json!(1);
        e["reclaim_zones"] = json!(15);
        e["reclaim_blocks_copied"] = json!(340000 + 2560); // + 10 MiB
        e["zones_free_conventional"] = json!(6);
        e["zones_buffer"] = json!(0);
        e["zones_free"] = json!(193);
        a
    }

    #[test]
    fn done_once_the_request_is_handled() {
        let before = fixed_status(); // reclaim_requests 1, done 0
        assert!(!done(&before, 1));
        assert!(done(&after_pass(), 1));
        assert!(!done(&after_pass(), 2));
        assert!(!done(&json!({"engine": null}), 1));
    }

    #[test]
    fn the_result_is_the_difference_before_and_after() {
        let r = result(0, 1, &fixed_status(), &after_pass());
        assert_eq!(r["zones_reclaimed"], 3);
        assert_eq!(r["bytes_copied"], 10 << 20);
        assert_eq!(r["conventional_in_use_before"], 4);
        assert_eq!(r["conventional_in_use_after"], 0);
        assert_eq!(r["conventional_usable"], 6);
        assert_eq!(
            result_line(&r),
            "device 0: reclaimed 3 zones, 10 MiB copied; conventional zones in use 4 -> 0 of 6, \
             193 zones free"
        );
    }

    #[test]
    fn plain_progress_lines() {
        assert_eq!(
            progress_line(&fixed_status(), &after_pass()),
            "reclaim idle: 3 zones, 10 MiB copied, conventional zones in use 0 of 6"
        );
        let mut mid = fixed_status();
        mid["engine"]["reclaim_zones"] = json!(13);
        assert_eq!(
            progress_line(&fixed_status(), &mid),
            "reclaim running: 1 zone, 0 B copied, conventional zones in use 4 of 6"
        );
    }
}
