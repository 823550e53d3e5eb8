//! `zonedd recover`: Re-attach a new daemon to a device whose daemon died.
//!
//! The device must be QUIESCED (its daemon was killed or crashed; `/dev/ublkbN` stayed, and
//! I/O waits). The new daemon reopens the backend (the engine rebuilds its state from what
//! the dead daemon wrote), re-attaches with START/END_USER_RECOVERY, and the requests the
//! dead daemon held are re-issued to it. Prints the same two lines as `create`.

use super::CliError;
use frontend::registry::{self, DeviceSpec};
use frontend::{sys, Mode};

pub use crate::cli::recover::Args;

pub fn run(args: Args) -> Result<(), CliError> {
    super::need_ublk()?;
    super::need_root("zonedd recover")?;
    let id = args.id;
    // Asked first so that libublk, which prints its own line for a missing device, never is.
    if !sys::ublk_ids().contains(&id) {
        return Err(CliError::Usage(format!("no ublk device {id}")));
    }
    let (state, data, _) = frontend::device::device_info(id)
        .map_err(|_| CliError::Usage(format!("no ublk device {id}")))?;
    let state = sys::state_name(state);
    if state != "quiesced" {
        let hint = match registry::read(id) {
            Some(r) if state == "live" && sys::pid_alive(r.pid) => {
                format!(": its daemon (pid {}) is running", r.pid)
            }
            _ => String::new(),
        };
        return Err(CliError::Usage(format!(
            "ublk device {id} is {state}, not quiesced{hint}: only a device whose daemon died can be recovered"
        )));
    }
    let spec: DeviceSpec = data
        .and_then(|d| serde_json::from_value(d).ok())
        .or_else(|| registry::read(id).map(|r| r.spec))
        .ok_or_else(|| {
            CliError::Usage(format!(
                "ublk device {id} was not created by zonedd (no zonedd target data)"
            ))
        })?;
    super::create::serve_daemon(spec, Mode::Recover { id }, args.foreground, None)
}
