//! `zonedd engine-io` (hidden): read or write through the engine without ublk, for tests.

use super::CliError;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("engine-io: not implemented yet".into()))
}
