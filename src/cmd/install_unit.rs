//! `zonedd install-unit`: Install the systemd unit zonedd@.service.

use super::CliError;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("install-unit: not implemented yet".into()))
}
