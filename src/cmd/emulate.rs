//! `zonedd emulate PATH --size ... --zone-size ...`

use super::CliError;

#[derive(clap::Args)]
pub struct Args {
    /// File or regular block device to hold the image.
    pub path: std::path::PathBuf,
}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("emulate: not implemented yet".into()))
}
