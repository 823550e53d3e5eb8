//! `zonedd format`: Format a zoned backend with dm-zoned v2 metadata.

use super::CliError;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("format: not implemented yet".into()))
}
