//! One module per subcommand. Each has an `Args` (clap) and a `run(Args) -> Result<(), CliError>`.

pub mod check;
pub mod conformance;
pub mod create;
pub mod delete;
pub mod emulate;
pub mod engine_io;
pub mod format;
pub mod install_unit;
pub mod list;
pub mod recover;
pub mod report;
pub mod status;

/// A failed command: what the user sees, and the exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Wrong invocation or unusable input: exit code 2, like clap's own usage errors.
    #[error("{0}")]
    Usage(String),
    /// The command was valid but failed: exit code 1.
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}

/// Logs go to stderr; `RUST_LOG` selects the level (default: warnings).
pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
