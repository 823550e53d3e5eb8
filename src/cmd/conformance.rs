//! `zonedd conformance DEV --yes-destroy-data`: run the backend conformance suite
//! ([`zbd::conformance`]) on a zoned device or emulated image, one line per check; exit 1 on
//! any failure. Hidden: it is for the VM harness (null_blk, scsi_debug) and for debugging.

use super::CliError;

pub use crate::cli::conformance::Args;

pub fn run(args: Args) -> Result<(), CliError> {
    if !args.yes_destroy_data {
        return Err(CliError::Usage(format!(
            "conformance destroys all data on {}; pass --yes-destroy-data",
            args.device.display()
        )));
    }
    let dev = zbd::open(&args.device).map_err(super::emulate::cli_error)?;
    println!("conformance suite on {}", dev.describe());
    let out = zbd::conformance::run(dev.as_ref(), &mut |name, r| match r {
        Ok(()) if name.contains("(skipped:") => println!("SKIP {name}"),
        Ok(()) => println!("PASS {name}"),
        Err(e) => println!("FAIL {name}: {e}"),
    });
    println!(
        "{} passed, {} failed, {} skipped",
        out.passed, out.failed, out.skipped
    );
    if out.ok() {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "{} conformance checks failed",
            out.failed
        )))
    }
}
