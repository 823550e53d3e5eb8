//! Errors the frontend reports to the user: one line each, saying what to do.

use libublk::UblkError;

#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error(
        "ublk_drv is not loaded: run `modprobe ublk_drv` (kernel >= 6.0 with CONFIG_BLK_DEV_UBLK)"
    )]
    NoUblk,
    #[error("{0} needs root (CAP_SYS_ADMIN): ublk devices are created through /dev/ublk-control")]
    NotRoot(String),
    #[error("{what}: {msg}")]
    Ublk { what: String, msg: String },
    #[error("{0}")]
    Other(String),
}

impl FrontendError {
    /// Wrap a libublk error with what was attempted (libublk's own texts are terse).
    pub fn ublk(what: impl Into<String>, e: UblkError) -> FrontendError {
        FrontendError::Ublk {
            what: what.into(),
            msg: ublk_error_text(&e),
        }
    }
}

/// A readable text for a libublk error ("other failure" says nothing on its own).
pub fn ublk_error_text(e: &UblkError) -> String {
    match e {
        UblkError::OtherError(errno) | UblkError::UringIOError(errno) => {
            std::io::Error::from_raw_os_error(errno.abs()).to_string()
        }
        UblkError::IOError(io) => io.to_string(),
        other => other.to_string(),
    }
}
