//! `zonedd report PATH [--json]`

use super::CliError;

#[derive(clap::Args)]
pub struct Args {
    /// Zoned block device or emulated image.
    pub path: std::path::PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_args: Args) -> Result<(), CliError> {
    Err(CliError::Failed("report: not implemented yet".into()))
}
