//! Where log lines go.
//!
//! - A daemon (`create`, `recover`) under systemd logs to the journal through
//!   `tracing-journald`: levels as journal priorities, and once its device exists every line
//!   carries `ZONEDD_DEVICE=N` (`journalctl ZONEDD_DEVICE=0`). "Under systemd" is what
//!   systemd.exec(5) tells a service: `JOURNAL_STREAM` naming the device and inode of our
//!   stderr, `INVOCATION_ID`, or (for `--foreground`, the unit's `Type=notify`)
//!   `NOTIFY_SOCKET`. If journald cannot be reached, lines go to stderr (which systemd
//!   forwards to the journal too, without the fields).
//! - Anything else logs to stderr, which is the log file in /run/zonedd once a daemon has
//!   daemonized, as before.
//!
//! `RUST_LOG` sets the level; the default is `info` for the journal, `warn` on stderr.

use std::sync::OnceLock;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

/// What the process is, as far as logging cares.
#[derive(Clone, Copy, Debug)]
pub enum Role {
    /// A short-lived command: its messages are for whoever ran it.
    Command,
    /// A daemon (`create`, `recover`), daemonizing or staying in the `foreground`.
    Daemon { foreground: bool },
}

/// Where the lines go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sink {
    Stderr,
    Journal,
}

/// What the environment says about systemd.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemdEnv {
    /// `JOURNAL_STREAM` is set and names our stderr (`DEV:INODE`): systemd connected it to
    /// the journal. A value inherited from elsewhere (a shell started by a service) does not
    /// match and is ignored, as systemd.exec(5) advises.
    pub stderr_is_journal: bool,
    /// `INVOCATION_ID` is set: systemd started this process as (part of) a unit.
    pub invocation_id: bool,
    /// `NOTIFY_SOCKET` is set: a `Type=notify` unit waits for our READY=1.
    pub notify_socket: bool,
}

impl SystemdEnv {
    /// From the variables' values and stderr's `(st_dev, st_ino)`.
    pub fn new(
        journal_stream: Option<&str>,
        invocation_id: Option<&str>,
        notify_socket: Option<&str>,
        stderr: Option<(u64, u64)>,
    ) -> SystemdEnv {
        let set = |v: Option<&str>| v.is_some_and(|s| !s.is_empty());
        let stream = journal_stream.and_then(|s| {
            let (dev, ino) = s.split_once(':')?;
            Some((dev.parse::<u64>().ok()?, ino.parse::<u64>().ok()?))
        });
        SystemdEnv {
            stderr_is_journal: stream.is_some() && stream == stderr,
            invocation_id: set(invocation_id),
            notify_socket: set(notify_socket),
        }
    }

    /// This process's environment and stderr.
    pub fn current() -> SystemdEnv {
        let var = |k: &str| std::env::var(k).ok();
        let stderr = nix::sys::stat::fstat(libc::STDERR_FILENO)
            .ok()
            .map(|st| (st.st_dev, st.st_ino));
        SystemdEnv::new(
            var("JOURNAL_STREAM").as_deref(),
            var("INVOCATION_ID").as_deref(),
            var("NOTIFY_SOCKET").as_deref(),
            stderr,
        )
    }
}

/// The journal for a daemon that systemd runs, stderr for everything else.
pub fn choose(role: Role, env: &SystemdEnv) -> Sink {
    match role {
        Role::Command => Sink::Stderr,
        Role::Daemon { foreground } => {
            if env.stderr_is_journal || env.invocation_id || (foreground && env.notify_socket) {
                Sink::Journal
            } else {
                Sink::Stderr
            }
        }
    }
}

/// The level when `RUST_LOG` is not set.
fn default_level(sink: Sink) -> &'static str {
    match sink {
        Sink::Journal => "info",
        Sink::Stderr => "warn",
    }
}

type Journal = Option<tracing_journald::Layer>;
type JournalHandle = reload::Handle<Journal, Registry>;

/// Set once the journal layer is installed: how [`set_device`] adds its field.
static JOURNAL: OnceLock<JournalHandle> = OnceLock::new();

/// Install the subscriber for `role` in this environment. Call once, early.
pub fn init(role: Role) {
    let sink = choose(role, &SystemdEnv::current());
    let filter = || {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level(sink)))
    };
    if sink == Sink::Journal {
        match journal_layer() {
            Ok(layer) => {
                let (layer, handle) = reload::Layer::new(Some(layer));
                if tracing_subscriber::registry()
                    .with(layer.with_filter(filter()))
                    .try_init()
                    .is_ok()
                {
                    let _ = JOURNAL.set(handle);
                }
                return;
            }
            Err(e) => {
                init_stderr(filter());
                tracing::warn!("journald is not reachable ({e}): logging to stderr");
                return;
            }
        }
    }
    init_stderr(filter());
}

fn init_stderr(filter: EnvFilter) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn journal_layer() -> std::io::Result<tracing_journald::Layer> {
    use tracing_journald::{Priority, PriorityMappings};
    // syslog's meaning of the levels (tracing-journald's default puts info at "notice").
    let priorities = PriorityMappings {
        error: Priority::Error,
        warn: Priority::Warning,
        info: Priority::Informational,
        debug: Priority::Debug,
        trace: Priority::Debug,
    };
    Ok(tracing_journald::layer()?
        .with_syslog_identifier("zonedd".into())
        .with_priority_mappings(priorities))
}

/// The daemon's device exists: from now on every journal line carries `ZONEDD_DEVICE=id`.
/// A no-op when logging to stderr.
pub fn set_device(id: u32) {
    if let Some(h) = JOURNAL.get() {
        let _ = h.modify(|l| {
            *l = l
                .take()
                .map(|l| l.with_custom_fields([("ZONEDD_DEVICE", id.to_string())]));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STDERR: Option<(u64, u64)> = Some((27, 4242));

    fn env(stream: Option<&str>, inv: Option<&str>, notify: Option<&str>) -> SystemdEnv {
        SystemdEnv::new(stream, inv, notify, STDERR)
    }

    #[test]
    fn journal_stream_counts_only_when_it_names_our_stderr() {
        assert!(env(Some("27:4242"), None, None).stderr_is_journal);
        // inherited from a service's shell: another stream
        assert!(!env(Some("27:4243"), None, None).stderr_is_journal);
        assert!(!env(Some("junk"), None, None).stderr_is_journal);
        assert!(!env(Some(""), None, None).stderr_is_journal);
        assert!(!SystemdEnv::new(Some("27:4242"), None, None, None).stderr_is_journal);
        assert!(!env(Some("27:4242"), Some(""), Some("")).invocation_id);
    }

    #[test]
    fn daemons_under_systemd_log_to_the_journal() {
        let fg = Role::Daemon { foreground: true };
        let bg = Role::Daemon { foreground: false };
        let cases = [
            // (role, JOURNAL_STREAM, INVOCATION_ID, NOTIFY_SOCKET, sink)
            (fg, None, None, None, Sink::Stderr),
            (bg, None, None, None, Sink::Stderr),
            // the unit: Type=notify, stderr to the journal, an invocation id
            (
                fg,
                Some("27:4242"),
                Some("0123abcd"),
                Some("/run/systemd/notify"),
                Sink::Journal,
            ),
            (fg, Some("27:4242"), None, None, Sink::Journal),
            (fg, None, Some("0123abcd"), None, Sink::Journal),
            (fg, None, None, Some("/run/systemd/notify"), Sink::Journal),
            // a notify socket means nothing to a daemon that forks away from it
            (bg, None, None, Some("/run/systemd/notify"), Sink::Stderr),
            // a daemonizing `create` run by a unit (its child stays in the unit's cgroup)
            (bg, None, Some("0123abcd"), None, Sink::Journal),
            (bg, Some("27:4242"), None, None, Sink::Journal),
            // a stale JOURNAL_STREAM from a parent service: not ours
            (fg, Some("27:1"), None, None, Sink::Stderr),
            (bg, Some("27:1"), None, None, Sink::Stderr),
        ];
        for (role, stream, inv, notify, want) in cases {
            assert_eq!(
                choose(role, &env(stream, inv, notify)),
                want,
                "{role:?} JOURNAL_STREAM={stream:?} INVOCATION_ID={inv:?} NOTIFY_SOCKET={notify:?}"
            );
        }
    }

    #[test]
    fn commands_log_to_stderr_even_under_systemd() {
        let e = env(
            Some("27:4242"),
            Some("0123abcd"),
            Some("/run/systemd/notify"),
        );
        assert_eq!(choose(Role::Command, &e), Sink::Stderr);
    }

    #[test]
    fn the_journal_gets_info_by_default_stderr_warnings() {
        assert_eq!(default_level(Sink::Journal), "info");
        assert_eq!(default_level(Sink::Stderr), "warn");
    }
}
