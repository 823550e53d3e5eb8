//! `zonedd list`: List zonedd devices.

use super::CliError;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("list: not implemented yet".into()))
}
