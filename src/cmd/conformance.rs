//! `zonedd conformance`: Run the backend conformance suite against a device (destroys its data).

use super::CliError;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("conformance: not implemented yet".into()))
}
