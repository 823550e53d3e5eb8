//! `zonedd emulate PATH --size 64G --zone-size 256M [--conventional N] [--zone-capacity C]
//! [--max-open N] [--max-active N] [--force]`: create an emulated host-managed SMR disk image
//! on a file (sparse) or a regular block device.
//!
//! Every value is parsed here, not by clap, so that bad input gets one line and exit code 2.

use super::CliError;
use zbd::{fmt_size, parse_size, EmulateOptions, ZbdError, ZonedDevice};

pub use crate::cli::emulate::Args;

fn count(name: &str, v: &str) -> Result<u32, CliError> {
    v.trim()
        .parse()
        .map_err(|_| CliError::Usage(format!("bad {name} {v:?}: expected a whole number")))
}

fn size(name: &str, v: &str) -> Result<u64, CliError> {
    parse_size(v).map_err(|e| CliError::Usage(format!("{name}: {e}")))
}

/// Bad input (exit 2) for what the user can fix, failure (exit 1) for the rest.
pub(crate) fn cli_error(e: ZbdError) -> CliError {
    match e {
        ZbdError::Invalid(m) | ZbdError::Open(m) => CliError::Usage(m),
        _ => CliError::Failed(e.to_string()),
    }
}

pub fn run(args: Args) -> Result<(), CliError> {
    use std::os::unix::fs::FileTypeExt;
    let zone_size = size("--zone-size", &args.zone_size)?;
    let is_blockdev = std::fs::metadata(&args.path)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false);
    let total = match &args.size {
        Some(s) => size("--size", s)?,
        None if is_blockdev => 0,
        None => {
            return Err(CliError::Usage(
                "--size is required for an image file (e.g. --size 64G)".into(),
            ))
        }
    };
    let mut opts = EmulateOptions::new(total, zone_size);
    if let Some(c) = &args.conventional {
        opts.conventional = count("--conventional", c)?;
    }
    if let Some(c) = &args.zone_capacity {
        opts.zone_capacity = size("--zone-capacity", c)?;
    }
    opts.max_open = count("--max-open", &args.max_open)?;
    opts.max_active = count("--max-active", &args.max_active)?;
    opts.force = args.force;
    if total != 0 {
        // Check the shape before touching the path.
        opts.geometry(zbd::MIN_EMULATED_ZONE_SIZE)
            .map_err(cli_error)?;
    }
    let dev = zbd::Emulated::create(&args.path, &opts).map_err(cli_error)?;
    let g = dev.geometry();
    let conv = dev.nr_conventional();
    let limit = |n: u32| {
        if n == 0 {
            "none".to_string()
        } else {
            n.to_string()
        }
    };
    println!(
        "created {}: {} in {} zones of {} ({} conventional, {} sequential-write-required), \
         zone capacity {}, max-open {}, max-active {}",
        dev.describe(),
        fmt_size(g.capacity()),
        g.nr_zones,
        fmt_size(g.zone_size),
        conv,
        g.nr_zones - conv,
        fmt_size(g.zone_capacity),
        limit(g.max_open_zones),
        limit(g.max_active_zones)
    );
    Ok(())
}
