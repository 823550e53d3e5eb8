//! Environment checks with errors a user can act on, and small facts about ublk devices
//! read from sysfs and the control device.

use crate::error::FrontendError;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use std::os::fd::{AsFd, FromRawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

pub const UBLK_CONTROL: &str = "/dev/ublk-control";

/// `/dev/ublk-control` exists (ublk_drv loaded).
pub fn check_ublk() -> Result<(), FrontendError> {
    if Path::new(UBLK_CONTROL).exists() {
        Ok(())
    } else {
        Err(FrontendError::NoUblk)
    }
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub fn check_root(what: &str) -> Result<(), FrontendError> {
    if is_root() {
        Ok(())
    } else {
        Err(FrontendError::NotRoot(what.to_string()))
    }
}

/// Mount points whose source device is `rdev` (from /proc/self/mountinfo).
pub fn mounts_of(rdev: u64) -> Vec<String> {
    let (maj, min) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    let want = format!("{maj}:{min}");
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(2) == Some(&want.as_str())).then(|| f.get(4).unwrap_or(&"?").to_string())
        })
        .collect()
}

/// A block device that is mounted or held exclusively (by a filesystem, dm, md, another
/// zonedd) cannot be a backend: say which.
pub fn check_block_device_free(path: &Path) -> Result<(), FrontendError> {
    let Ok(md) = std::fs::metadata(path) else {
        return Ok(());
    };
    if !md.file_type().is_block_device() {
        return Ok(());
    }
    let mounts = mounts_of(md.rdev());
    if !mounts.is_empty() {
        return Err(FrontendError::Other(format!(
            "{} is mounted on {}: unmount it first",
            path.display(),
            mounts.join(", ")
        )));
    }
    // O_EXCL on a block device: EBUSY while anyone holds it exclusively.
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(path)
    {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(FrontendError::Other(format!(
            "{} is busy (held by a filesystem, device-mapper, md or another daemon)",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// Is `/dev/ublkbN` mounted or held open exclusively? (`delete` refuses then.)
pub fn bdev_in_use(id: u32) -> Option<String> {
    let path = format!("/dev/ublkb{id}");
    check_block_device_free(Path::new(&path))
        .err()
        .map(|e| e.to_string())
}

/// A process exists and is not a zombie (an exited daemon whose parent did not reap it).
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .map(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Wait (without polling in a loop) until process `pid` has exited, at most `timeout`.
/// True once it is gone (or a zombie).
pub fn wait_pid_exit(pid: u32, timeout: std::time::Duration) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return !pid_alive(pid);
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    let mut pfd = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    let n = nix::poll::poll(&mut pfd, timeout);
    n == Ok(1) || !pid_alive(pid)
}

/// Ids of every ublk device on the system (from sysfs; empty without ublk_drv).
pub fn ublk_ids() -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir("/sys/class/ublk-char")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("ublkc")?.parse().ok())
        .collect();
    v.sort();
    v
}

/// The kernel's state of a ublk device, by name.
pub fn state_name(state: u16) -> &'static str {
    match state as u32 {
        libublk::sys::UBLK_S_DEV_DEAD => "dead",
        libublk::sys::UBLK_S_DEV_LIVE => "live",
        libublk::sys::UBLK_S_DEV_QUIESCED => "quiesced",
        libublk::sys::UBLK_S_DEV_FAIL_IO => "fail-io",
        _ => "unknown",
    }
}

/// Put this process in its own mount namespace with private propagation, and detach any
/// ublk filesystems it inherited. Then a filesystem mounted on our own /dev/ublkbN is never
/// held by our namespace, and our exit can't deadlock writing back to ourselves.
pub fn private_mount_namespace() -> Result<(), String> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("making / private: {e}"))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut targets: Vec<String> = info
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let source = post.split(' ').nth(1)?;
            source
                .starts_with("/dev/ublkb")
                .then(|| pre.split(' ').nth(4).map(str::to_string))?
        })
        .collect();
    targets.reverse();
    for t in targets {
        if let Err(e) = umount2(t.as_str(), MntFlags::MNT_DETACH) {
            tracing::warn!("detaching inherited ublk mount {t}: {e}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_files_and_missing_paths_are_not_busy() {
        let f = tempfile::NamedTempFile::new().unwrap();
        assert!(check_block_device_free(f.path()).is_ok());
        assert!(check_block_device_free(Path::new("/nonexistent/x")).is_ok());
    }

    #[test]
    fn waits_for_a_process_to_exit() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        assert!(wait_pid_exit(pid, std::time::Duration::from_secs(10)));
        // an unreaped child is a zombie: not alive
        assert!(!pid_alive(pid));
        child.wait().unwrap();
    }

    #[test]
    fn own_pid_is_alive() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(0));
    }

    #[test]
    fn the_ublk_hint_names_the_module() {
        let msg = FrontendError::NoUblk.to_string();
        assert!(msg.contains("modprobe ublk_drv"), "{msg}");
    }
}
