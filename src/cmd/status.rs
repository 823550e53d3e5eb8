//! `zonedd status`: Show the state and counters of a zonedd device.

use super::CliError;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("status: not implemented yet".into()))
}
