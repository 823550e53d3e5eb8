//! `zonedd delete`: Flush, commit and remove a zonedd device.

use super::CliError;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("delete: not implemented yet".into()))
}
