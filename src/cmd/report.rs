//! `zonedd report PATH [--json]`: the zone table of a zoned device or emulated image, one
//! line per zone (like `blkzone report`) and a summary line; `--json` prints
//! `{"device":..,"geometry":{..},"zones":[..],"summary":{..}}`.

use super::CliError;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use zbd::{fmt_size, Zone, ZoneCondition, ZoneType};

pub use crate::cli::report::Args;

fn type_name(t: ZoneType) -> &'static str {
    match t {
        ZoneType::Conventional => "conventional",
        ZoneType::SeqWriteRequired => "seq-write-required",
        ZoneType::SeqWritePreferred => "seq-write-preferred",
    }
}

fn cond_name(c: ZoneCondition) -> &'static str {
    match c {
        ZoneCondition::NotWp => "not-wp",
        ZoneCondition::Empty => "empty",
        ZoneCondition::ImplicitOpen => "implicit-open",
        ZoneCondition::ExplicitOpen => "explicit-open",
        ZoneCondition::Closed => "closed",
        ZoneCondition::Full => "full",
        ZoneCondition::ReadOnly => "read-only",
        ZoneCondition::Offline => "offline",
    }
}

/// Zones counted by type and by condition (names as in the JSON).
fn summary(zones: &[Zone]) -> (BTreeMap<&'static str, u32>, BTreeMap<&'static str, u32>) {
    let mut by_type = BTreeMap::new();
    let mut by_cond = BTreeMap::new();
    for z in zones {
        *by_type.entry(type_name(z.zone_type)).or_insert(0) += 1;
        *by_cond.entry(cond_name(z.cond)).or_insert(0) += 1;
    }
    (by_type, by_cond)
}

pub fn run(args: Args) -> Result<(), CliError> {
    let vol = super::VolumeArgs {
        backends: &args.path,
        cache: args.cache.as_deref(),
    };
    let dev = if args.cache.is_none() && args.path.len() == 1 {
        zbd::open_shared(&args.path[0]).map_err(super::emulate::cli_error)?
    } else {
        vol.open(false)?
    };
    let members = dev.members();
    let g = dev.geometry();
    let zones = dev
        .report_all()
        .map_err(|e| CliError::Failed(format!("report zones: {e}")))?;
    let (by_type, by_cond) = summary(&zones);
    if args.json {
        let v = serde_json::json!({
            "device": dev.describe(),
            "members": members,
            "geometry": g,
            "zones": zones,
            "summary": {
                "zones": zones.len(),
                "by_type": by_type,
                "by_condition": by_cond,
            },
        });
        return emit(format!("{v:#}\n"));
    }
    let mut out = String::new();
    for m in members.iter().filter(|_| members.len() > 1) {
        let _ = writeln!(out, "{m}");
    }
    for z in &zones {
        let _ = writeln!(
            out,
            "zone {:>6} start {:#014x} len {} cap {} wptr +{:#x} type {} cond {}",
            z.id,
            z.start,
            fmt_size(z.len),
            fmt_size(z.capacity),
            z.wp - z.start,
            type_name(z.zone_type),
            cond_name(z.cond)
        );
    }
    let join = |m: &BTreeMap<&str, u32>| {
        m.iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "{}: {} zones of {} ({}; {})",
        dev.describe(),
        zones.len(),
        fmt_size(g.zone_size),
        join(&by_type),
        join(&by_cond)
    );
    emit(out)
}

/// Prints `s`; a closed pipe (`| head`) is not an error.
fn emit(s: String) -> Result<(), CliError> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(s.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(CliError::Failed(format!("write to stdout: {e}")))
        }
        _ => Ok(()),
    }
}
