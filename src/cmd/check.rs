//! `zonedd check PATH [--repair] [--json]`: check (and optionally repair) the dm-zoned
//! metadata of a backend, or a log-layout volume (`dmz::lsl::check`; its repair is an open
//! and a close, which replays the log and rewrites the older superblock slot; damage that
//! keeps the engine from opening it is reported, exit 1, and not repaired).
//!
//! Read-only unless `--repair`. A repair first opens the volume with the engine and closes it,
//! so that writes a crashed zonedd daemon left in its metadata log are folded into the sets
//! before anything is repaired (otherwise their zones look written but unmapped, and the
//! repair would reset them). Exit status: 0 when no error is left (none found, or all
//! repaired), 1 when errors remain or an I/O error stops it, 2 when nothing can be checked
//! (no such device, not a zoned device or image, in use, not formatted, metadata v1, both
//! superblocks corrupt).

use dmz::check::{check, CheckReport};
use dmz::format::FormatError;

use super::CliError;

pub use crate::cli::check::Args;

pub fn run(args: Args) -> Result<(), CliError> {
    let vol = super::VolumeArgs {
        backends: &args.path,
        cache: args.cache.as_deref(),
    };
    let p = vol.name();
    let dev = vol.open(true)?;
    let dev: std::sync::Arc<dyn zbd::ZonedDevice> = std::sync::Arc::from(dev);
    if args.cache.is_none() && dmz::lsl::is_log_layout(dev.as_ref()) {
        return run_log(&args, &p, dev);
    }
    if args.repair {
        // A device list that is not the volume's (a drive missing, foreign, out of order)
        // is refused before anything is written, the log replay included.
        let members =
            dmz::sets::probe(dev.as_ref()).and_then(|p| p.choose(&vol.name()).map(|_| ()));
        if let Err(e @ FormatError::Device(_)) = members {
            return Err(CliError::Usage(format!("{p}: {e}")));
        }
        replay_log(&dev);
    }
    let report = check(dev.as_ref(), args.repair).map_err(|e| match e {
        FormatError::NotFormatted(_) => CliError::Usage(format!(
            "{p}: no valid dm-zoned superblock: not formatted? run `zonedd format {}`",
            vol.flags()
        )),
        // Nothing checkable: the user must fix the device first (see CliError).
        FormatError::Device(_) | FormatError::Version1 | FormatError::Corrupt(_) => {
            CliError::Usage(format!("{p}: {e}"))
        }
        e => CliError::Failed(format!("{p}: {e}")),
    })?;
    if args.json {
        let s = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::Failed(format!("JSON: {e}")))?;
        println!("{s}");
    } else {
        print!("{}", human(&args, &report));
    }
    if report.summary.clean {
        Ok(())
    } else if args.repair {
        Err(CliError::Failed(format!(
            "{p}: {} error(s) could not be repaired",
            report.remaining()
        )))
    } else {
        Err(CliError::Failed(format!(
            "{p}: {} error(s) detected: run `zonedd check {} --repair`",
            report.errors.len(),
            check_args(&vol)
        )))
    }
}

/// `check` of a log-layout volume: reading only, then (with `--repair`, when there is
/// something open repairs) an open and a close, and a second check.
fn run_log(
    args: &Args,
    p: &str,
    dev: std::sync::Arc<dyn zbd::ZonedDevice>,
) -> Result<(), CliError> {
    let damaged = |e: dmz::engine::EngineError| {
        CliError::Failed(format!(
            "{p}: the engine cannot open this volume, and check --repair cannot fix it: {e}"
        ))
    };
    let mut report = dmz::lsl::check::check(dev.clone()).map_err(damaged)?;
    let mut fixed = Vec::new();
    if args.repair && report.needs_repair() {
        let e = dmz::lsl::LogEngine::open(dev.clone(), dmz::lsl::LogOptions::default())
            .map_err(damaged)?;
        e.close().map_err(damaged)?;
        fixed = std::mem::take(&mut report.errors);
        report = dmz::lsl::check::check(dev.clone()).map_err(damaged)?;
    }
    if args.json {
        let v = serde_json::json!({ "layout": "log", "check": report, "fixed": fixed });
        let s =
            serde_json::to_string_pretty(&v).map_err(|e| CliError::Failed(format!("JSON: {e}")))?;
        println!("{s}");
    } else {
        print!("{}", human_log(p, &report, &fixed));
    }
    if report.clean() {
        Ok(())
    } else if args.repair {
        Err(CliError::Failed(format!(
            "{p}: {} error(s) could not be repaired",
            report.errors.len()
        )))
    } else {
        Err(CliError::Failed(format!(
            "{p}: {} error(s) detected: run `zonedd check {p} --repair`",
            report.errors.len()
        )))
    }
}

fn human_log(p: &str, r: &dmz::lsl::check::LogCheck, fixed: &[String]) -> String {
    let mut out = format!(
        "{p} (log layout): label {:?}, uuid {}, checkpoint gen {} (sequence {})\n\
         \x20 {} of {} blocks mapped; zones: {} free ({} to reset before reuse), {} open, \
         {} full; {} full zones' summaries checked\n\
         \x20 log: {} records to replay, {} unflushed blocks a crash did not keep\n",
        r.label,
        r.uuid,
        r.gen,
        r.ckpt_seq,
        r.mapped_blocks,
        r.capacity_blocks,
        r.zones_free,
        r.zones_to_reset,
        r.zones_open,
        r.zones_full,
        r.summaries_checked,
        r.records_to_replay,
        r.dropped_blocks,
    );
    for w in &r.warnings {
        out.push_str(&format!("  warning: {w}\n"));
    }
    for f in fixed {
        out.push_str(&format!("  error: {f} [fixed]\n"));
    }
    for f in &r.errors {
        out.push_str(&format!("  error: {f}\n"));
    }
    if r.errors.is_empty() && fixed.is_empty() {
        out.push_str("No error detected\n");
    } else if !fixed.is_empty() {
        out.push_str(&format!(
            "Repaired {} error(s): the engine opened and closed the volume\n",
            fixed.len()
        ));
    }
    out
}

/// Open and close the engine: replays and commits a zonedd metadata log, if any. A volume the
/// engine cannot open (corrupt metadata) is repaired without it.
fn replay_log(dev: &std::sync::Arc<dyn zbd::ZonedDevice>) {
    let mut opts = dmz::engine::EngineOptions::default();
    opts.reclaim.enabled = false;
    match dmz::engine::Engine::open(dev.clone(), opts) {
        Ok(e) => {
            if let Err(err) = e.close() {
                tracing::warn!("closing the engine after replaying its log: {err}");
            }
        }
        Err(err) => {
            tracing::warn!("engine cannot open the volume ({err}); repairing the sets as found")
        }
    }
}

/// The devices as `zonedd check` takes them: `[--cache C] A [B ...]`.
fn check_args(vol: &super::VolumeArgs) -> String {
    let drives: Vec<String> = vol
        .backends
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    match vol.cache {
        Some(c) => format!("--cache {} {}", c.display(), drives.join(" ")),
        None => drives.join(" "),
    }
}

fn human(args: &Args, r: &CheckReport) -> String {
    let s = &r.summary;
    let mut out = format!(
        "{} ({}): label {:?}, uuid {}, gen {}, primary set {}\n\
         \x20 {} chunks: {} mapped ({} buffered); {} mapped + {} unmapped zones checked; \
         {} blocks compared between the sets\n",
        super::VolumeArgs {
            backends: &args.path,
            cache: args.cache.as_deref()
        }
        .name(),
        r.device,
        r.label,
        r.uuid,
        r.gen,
        r.primary,
        s.nr_chunks,
        s.mapped_chunks,
        s.buffered_chunks,
        s.mapped_zones,
        s.unmapped_zones,
        s.set_blocks_compared
    );
    for w in &r.warnings {
        out.push_str(&format!("  warning: {w}\n"));
    }
    for f in &r.errors {
        let fixed = if r.fixed.contains(f) { " [fixed]" } else { "" };
        out.push_str(&format!("  error: {}{fixed}\n", f.message));
    }
    if r.errors.is_empty() {
        out.push_str("No error detected\n");
    } else if args.repair {
        out.push_str(&format!(
            "Repaired {} of {} error(s); metadata written as gen {}\n",
            r.fixed.len(),
            r.errors.len(),
            r.gen + 1
        ));
    }
    out
}
