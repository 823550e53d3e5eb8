//! `zonedd check`: Check (and optionally repair) the dm-zoned metadata of a backend.

use super::CliError;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("check: not implemented yet".into()))
}
