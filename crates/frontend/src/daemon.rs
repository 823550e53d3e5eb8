//! Running as a daemon: fork with a readiness handshake, signals, systemd notification.
//!
//! `zonedd create` (without `--foreground`) forks before any thread exists. The child
//! starts a new session, moves stdin/stdout to /dev/null and stderr to a log file in the run
//! directory, and does all the work; once `/dev/ublkbN` exists it writes `ok ID BDEV` on a
//! pipe, or `err MESSAGE` if it fails first. The parent prints the device and returns only
//! then, or fails with the child's own message; a child that dies without a word (a crash)
//! is noticed at EOF on the pipe. With `--foreground` (systemd) there is no fork and
//! readiness is `READY=1` through `sd_notify`.

use crate::device::Started;
use parking_lot::Mutex;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

enum Channel {
    Parent(File),
    Foreground,
}

/// Tells whoever waits for the device (the `create` parent, or systemd) how start-up went.
pub struct Readiness {
    channel: Mutex<Option<Channel>>,
}

impl Readiness {
    fn new(c: Channel) -> Arc<Readiness> {
        Arc::new(Readiness {
            channel: Mutex::new(Some(c)),
        })
    }

    /// The device is usable. Prints `/dev/ublkbN` and `id N` (two lines on stdout), from the
    /// parent when daemonized.
    pub fn ready(&self, s: &Started) {
        match self.channel.lock().take() {
            Some(Channel::Parent(mut f)) => {
                let _ = writeln!(f, "ok {} {}", s.id, s.bdev);
            }
            Some(Channel::Foreground) => {
                print_started(s);
                if std::env::var_os("NOTIFY_SOCKET").is_some() {
                    let status = format!("serving {} (ublk id {})", s.bdev, s.id);
                    if let Err(e) = sd_notify::notify(
                        false,
                        &[
                            sd_notify::NotifyState::Ready,
                            sd_notify::NotifyState::Status(&status),
                        ],
                    ) {
                        tracing::warn!("sd_notify: {e}");
                    }
                }
            }
            None => {}
        }
    }

    /// Start-up failed: forward the message to the waiting parent (no-op once ready).
    pub fn failed(&self, msg: &str) {
        if let Some(Channel::Parent(mut f)) = self.channel.lock().take() {
            let _ = writeln!(f, "err {}", msg.replace('\n', " "));
        }
    }

    pub fn is_pending(&self) -> bool {
        self.channel.lock().is_some()
    }
}

/// The two lines `create` prints once the device is usable.
pub fn print_started(s: &Started) {
    println!("{}\nid {}", s.bdev, s.id);
    let _ = std::io::stdout().flush();
}

/// Tell systemd we are stopping (no-op outside systemd).
pub fn notify_stopping() {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    }
}

/// Run `body` as a daemon (or in the foreground) and return once it is ready.
///
/// Must be called while the process is single-threaded (it forks). In the child, `body`
/// runs to completion and the process exits with its status; this function returns only in
/// the parent (or, in the foreground, when `body` returns).
pub fn launch(
    foreground: bool,
    body: impl FnOnce(Arc<Readiness>) -> Result<(), String>,
) -> Result<(), String> {
    if foreground {
        return body(Readiness::new(Channel::Foreground));
    }
    let (r, w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let run_dir = crate::registry::ensure_run_dir()
        .map_err(|e| format!("creating {}: {e}", crate::registry::run_dir().display()))?;
    // SAFETY: called while single-threaded (documented precondition), so the child may
    // run arbitrary code.
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        nix::unistd::ForkResult::Parent { child } => {
            drop(w);
            wait_ready(r, child, &run_dir.join(format!("zonedd.{child}.log")))
        }
        nix::unistd::ForkResult::Child => {
            drop(r);
            let code = daemon_child(w, body);
            std::process::exit(code);
        }
    }
}

fn wait_ready(r: OwnedFd, child: nix::unistd::Pid, log: &std::path::Path) -> Result<(), String> {
    let mut line = String::new();
    let _ = BufReader::new(File::from(r)).read_line(&mut line);
    let line = line.trim_end();
    if let Some(rest) = line.strip_prefix("ok ") {
        let (id, bdev) = rest.split_once(' ').unwrap_or((rest, ""));
        let id = id.parse().unwrap_or(0);
        print_started(&Started {
            id,
            bdev: bdev.to_string(),
        });
        return Ok(());
    }
    if let Some(msg) = line.strip_prefix("err ") {
        return Err(msg.to_string());
    }
    let status = match nix::sys::wait::waitpid(child, None) {
        Ok(s) => format!("{s:?}"),
        Err(e) => e.to_string(),
    };
    Err(format!(
        "the daemon exited before the device was ready ({status}); see {} or run with --foreground",
        log.display()
    ))
}

fn daemon_child(w: OwnedFd, body: impl FnOnce(Arc<Readiness>) -> Result<(), String>) -> i32 {
    let _ = nix::unistd::setsid();
    let _ = std::env::set_current_dir("/");
    let log = crate::registry::run_dir().join(format!("zonedd.{}.log", std::process::id()));
    redirect_stdio(&log);
    let readiness = Readiness::new(Channel::Parent(File::from(w)));
    let r2 = readiness.clone();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || body(r2)));
    let res = match res {
        Ok(r) => r,
        Err(_) => Err("internal error (panic); see the daemon log".to_string()),
    };
    match res {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            readiness.failed(&e);
            1
        }
    }
}

fn redirect_stdio(log: &std::path::Path) {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    let logf = crate::registry::create_private(log, true);
    // Onto the standard descriptors of this (single-threaded) process. Best effort, as
    // before: a descriptor that cannot be replaced is left as it was.
    use nix::unistd::dup2;
    if let Ok(n) = &null {
        let _ = dup2(n.as_raw_fd(), 0);
        let _ = dup2(n.as_raw_fd(), 1);
    }
    if let Ok(f) = logf.as_ref().or(null.as_ref()) {
        let _ = dup2(f.as_raw_fd(), 2);
    }
}

/// The daemon's log file, named after its device once the id is known.
pub fn adopt_log(id: u32) -> Option<std::path::PathBuf> {
    let from = crate::registry::run_dir().join(format!("zonedd.{}.log", std::process::id()));
    let to = crate::registry::log_path(id);
    // A recovered device: keep the dead daemon's log beside ours.
    if to.exists() {
        let _ = std::fs::rename(&to, to.with_extension("log.prev"));
    }
    std::fs::rename(&from, &to).ok().map(|_| to)
}

/// Clean shutdown on request (signal, control socket): stops the device, which makes the
/// daemon's main thread leave `serve` and flush, commit and delete.
#[derive(Default)]
pub struct Shutdown {
    id: OnceLock<u32>,
    requested: AtomicBool,
}

impl Shutdown {
    /// The device exists now: a request that came earlier is carried out.
    pub fn set_device(&self, id: u32) {
        let _ = self.id.set(id);
        if self.requested.load(Ordering::SeqCst) {
            self.stop();
        }
    }

    pub fn request(&self) {
        self.requested.store(true, Ordering::SeqCst);
        if self.id.get().is_some() {
            self.stop();
        }
    }

    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    fn stop(&self) {
        if let Some(&id) = self.id.get() {
            notify_stopping();
            tracing::info!("stopping ublk device {id}");
            if let Err(e) = crate::device::stop_device(id) {
                tracing::error!("{e}");
            }
        }
    }
}

/// SIGTERM / SIGINT / SIGHUP request a clean shutdown (handled on a dedicated thread, which
/// only opens its own control handle: never the main thread's).
pub fn handle_signals(shutdown: Arc<Shutdown>) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    std::thread::Builder::new()
        .name("zonedd-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                tracing::info!("signal {sig}: shutting down");
                shutdown.request();
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_reports_once_over_the_pipe() {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let ready = Readiness::new(Channel::Parent(File::from(w)));
        assert!(ready.is_pending());
        ready.ready(&Started {
            id: 4,
            bdev: "/dev/ublkb4".into(),
        });
        ready.failed("too late");
        assert!(!ready.is_pending());
        drop(ready);
        let mut s = String::new();
        std::io::Read::read_to_string(&mut File::from(r), &mut s).unwrap();
        assert_eq!(s, "ok 4 /dev/ublkb4\n");
    }

    #[test]
    fn failure_text_reaches_the_parent() {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let ready = Readiness::new(Channel::Parent(File::from(w)));
        ready.failed("backend /x is not formatted:\nrun zonedd format");
        drop(ready);
        // the parent side turns it into the error
        let pid = nix::unistd::Pid::from_raw(std::process::id() as i32);
        let e = wait_ready(r, pid, std::path::Path::new("/x.log")).unwrap_err();
        assert_eq!(e, "backend /x is not formatted: run zonedd format");
    }
}
