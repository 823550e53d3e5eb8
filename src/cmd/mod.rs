//! One module per subcommand. Each has an `Args` (clap) and a `run(Args) -> Result<(), CliError>`.

pub mod check;
pub mod conformance;
pub mod create;
pub mod delete;
pub mod emulate;
pub mod engine_io;
pub mod expose;
pub mod format;
pub mod install_unit;
pub mod list;
mod log_target;
pub mod metrics;
pub mod reclaim;
pub mod recover;
pub mod report;
pub mod status;
pub mod summary;

/// A failed command: what the user sees (one line), and the exit code.
///
/// One rule for every subcommand (docs/bad-input.md lists each case):
/// - exit 2 ([`CliError::Usage`]): refused before doing anything. Either a bad invocation
///   (arguments, checked first), or a backend or environment the user must fix: missing path,
///   not zoned, not formatted, wrong metadata version, corrupt superblocks, device too small,
///   in use / mounted / held, already formatted (or holding a filesystem) without `--force`,
///   ublk_drv not loaded, not root, permission denied.
/// - exit 1 ([`CliError::Failed`]): the command started and failed (I/O error, the daemon
///   failed), or `check` found errors in the metadata.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Refused before doing anything: exit code 2, like clap's own usage errors.
    #[error("{0}")]
    Usage(String),
    /// Started and failed, or `check` found errors: exit code 1.
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

/// ublk_drv must be loaded. Checked before anything calls libublk, whose own hint ("Please
/// run modprobe") would otherwise leak to stdout next to ours.
pub(crate) fn need_ublk() -> Result<(), CliError> {
    frontend::sys::check_ublk().map_err(|e| CliError::Usage(e.to_string()))
}

/// Root (CAP_SYS_ADMIN) for commands that create, recover or delete ublk devices.
pub(crate) fn need_root(what: &str) -> Result<(), CliError> {
    frontend::sys::check_root(what).map_err(|e| CliError::Usage(e.to_string()))
}

/// Root for commands that only talk to running daemons (`list`, `status`): the run
/// directory is 0700 and the control sockets 0600, and the daemons refuse other users.
pub(crate) fn need_root_for_daemons(what: &str) -> Result<(), CliError> {
    if frontend::sys::is_root() {
        return Ok(());
    }
    Err(CliError::Usage(format!(
        "{what} needs root: zonedd's run directory ({}) and control sockets are root's only",
        frontend::registry::run_dir().display()
    )))
}

/// Open a backend for check, format, report and create. What the user must fix (missing,
/// not zoned, in use, permission denied) is exit 2; an I/O error while reading it is exit 1.
/// The messages already name the path, so it is not repeated.
pub(crate) fn open_backend(path: &std::path::Path) -> Result<Box<dyn zbd::ZonedDevice>, CliError> {
    zbd::open(path).map_err(|e| open_error(path, e))
}

/// [`open_backend`]'s classification of a zbd error.
pub(crate) fn open_error(path: &std::path::Path, e: zbd::ZbdError) -> CliError {
    use std::io::ErrorKind;
    match e {
        zbd::ZbdError::Open(_) | zbd::ZbdError::Invalid(_) => CliError::Usage(e.to_string()),
        zbd::ZbdError::Io { ref source, .. }
            if matches!(
                source.kind(),
                ErrorKind::NotFound | ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
            ) || source.raw_os_error() == Some(libc::EBUSY) =>
        {
            CliError::Usage(e.to_string())
        }
        zbd::ZbdError::Io { .. } => CliError::Failed(e.to_string()),
        e => CliError::Failed(format!("{}: {e}", path.display())),
    }
}

/// The devices of a volume as given: one zoned backend, or a regular cache device and
/// zoned drives (dm-zoned's multi-device volume, `--cache C --backend A [--backend B ...]`).
pub(crate) struct VolumeArgs<'a> {
    pub backends: &'a [std::path::PathBuf],
    pub cache: Option<&'a std::path::Path>,
}

impl VolumeArgs<'_> {
    /// Checked before the environment: several zoned drives need the cache in front.
    pub fn validate(&self) -> Result<(), CliError> {
        if self.backends.len() > 1 && self.cache.is_none() {
            return Err(CliError::Usage(
                "several --backend drives form a multi-device volume: give its regular cache \
                 device with --cache"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Every path, the cache first.
    pub fn paths(&self) -> Vec<&std::path::Path> {
        self.cache
            .into_iter()
            .chain(self.backends.iter().map(|p| p.as_path()))
            .collect()
    }

    /// "A", or "C + A + B" for messages.
    pub fn name(&self) -> String {
        self.paths()
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// The command line that names this volume (`--cache C --backend A ...`).
    pub fn flags(&self) -> String {
        let mut s = String::new();
        if let Some(c) = self.cache {
            s.push_str(&format!("--cache {} ", c.display()));
        }
        let b: Vec<String> = self
            .backends
            .iter()
            .map(|p| format!("--backend {}", p.display()))
            .collect();
        s + &b.join(" ")
    }

    /// Open the volume: [`open_backend`] for one device, [`zbd::open_multi`] for a cache and
    /// drives (exclusive: locked against a second user). Refusals are exit 2.
    pub fn open(&self, exclusive: bool) -> Result<Box<dyn zbd::ZonedDevice>, CliError> {
        self.validate()?;
        match self.cache {
            None if exclusive => open_backend(&self.backends[0]),
            None => {
                zbd::open_shared(&self.backends[0]).map_err(|e| open_error(&self.backends[0], e))
            }
            Some(c) => {
                let drives: Vec<&std::path::Path> =
                    self.backends.iter().map(|p| p.as_path()).collect();
                zbd::open_multi(c, &drives, exclusive)
                    .map(|m| Box::new(m) as Box<dyn zbd::ZonedDevice>)
                    .map_err(|e| open_error(c, e))
            }
        }
    }
}
