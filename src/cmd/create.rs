//! `zonedd create`: Start a daemon exposing a formatted backend as /dev/ublkbN.

use super::CliError;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("create: not implemented yet".into()))
}
