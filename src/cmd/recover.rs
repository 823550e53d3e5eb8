//! `zonedd recover`: Re-attach a new daemon to a device whose daemon died.

use super::CliError;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("recover: not implemented yet".into()))
}
