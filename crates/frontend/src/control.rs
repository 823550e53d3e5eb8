//! The daemon's control endpoint: a unix socket (`<run dir>/<id>.sock`) speaking one JSON
//! object per line.
//!
//! - `{"cmd":"status"}` -> `{"ok":true,"status":{...}}` (frontend, engine and pool counters);
//! - `{"cmd":"reclaim"}` -> `{"ok":true,"reclaim":{...}}`: a reclaim pass is asked for now
//!   (what the target's handler answers: for the engine, the request's number and the
//!   counters before it; `zonedd reclaim --wait` then polls the status until the engine's
//!   `reclaim_requests_done` reaches that number), or `{"ok":false,"error":"..."}` from a
//!   target without reclaim;
//! - `{"cmd":"shutdown"}` -> `{"ok":true,"stopping":true}` at once, then, when the daemon
//!   has flushed, committed and removed the device, `{"ok":true,"done":true}` (or
//!   `{"ok":false,"error":"..."}`) just before it exits. `zonedd delete` waits for that
//!   second line, so it reports the daemon's real outcome.
//!
//! The socket is 0600 in a 0700 run directory, and every connection's peer credentials
//! (`SO_PEERCRED`) are checked: a client whose uid is not the daemon's (root) gets
//! `{"ok":false,"error":"permission denied: ..."}` and nothing else.

use parking_lot::Mutex;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub type StatusFn = Arc<dyn Fn() -> Value + Send + Sync>;
pub type ShutdownFn = Arc<dyn Fn() + Send + Sync>;
pub type ReclaimFn = Arc<dyn Fn() -> Result<Value, String> + Send + Sync>;

/// What the daemon does for each request.
#[derive(Clone)]
pub struct Handlers {
    pub status: StatusFn,
    pub shutdown: ShutdownFn,
    pub reclaim: ReclaimFn,
}

pub struct ControlServer {
    path: PathBuf,
    waiters: Arc<Mutex<Vec<UnixStream>>>,
}

impl ControlServer {
    /// Bind `path` (replacing a stale socket) and serve it on a background thread.
    pub fn start(path: &Path, handlers: Handlers) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let waiters: Arc<Mutex<Vec<UnixStream>>> = Arc::default();
        let w = waiters.clone();
        std::thread::Builder::new()
            .name("zonedd-control".into())
            .spawn(move || {
                for conn in listener.incoming().flatten() {
                    if let Err(e) = serve_one(conn, &handlers, &w) {
                        tracing::debug!("control connection: {e}");
                    }
                }
            })?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            waiters,
        })
    }

    /// Tell every waiting `shutdown` client how it ended, and remove the socket.
    pub fn finish(&self, result: &Result<(), String>) {
        let _ = std::fs::remove_file(&self.path);
        let line = match result {
            Ok(()) => json!({"ok": true, "done": true}),
            Err(e) => json!({"ok": false, "error": e}),
        };
        for mut s in self.waiters.lock().drain(..) {
            let _ = writeln!(s, "{line}");
        }
    }
}

fn serve_one(
    conn: UnixStream,
    h: &Handlers,
    waiters: &Mutex<Vec<UnixStream>>,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut out = &conn;
    let peer = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(std::io::Error::from)?;
    let me = nix::unistd::geteuid().as_raw();
    if peer.uid() != me {
        let msg = format!(
            "permission denied: only uid {me} (root) may control zonedd, not uid {}",
            peer.uid()
        );
        tracing::warn!(
            pid = peer.pid(),
            uid = peer.uid(),
            "control connection refused"
        );
        return writeln!(out, "{}", json!({"ok": false, "error": msg}));
    }
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let req: Value = serde_json::from_str(line.trim()).unwrap_or(Value::Null);
    match req.get("cmd").and_then(Value::as_str) {
        Some("status") => writeln!(out, "{}", json!({"ok": true, "status": (h.status)()})),
        Some("reclaim") => match (h.reclaim)() {
            Ok(v) => writeln!(out, "{}", json!({"ok": true, "reclaim": v})),
            Err(e) => writeln!(out, "{}", json!({"ok": false, "error": e})),
        },
        Some("shutdown") => {
            writeln!(out, "{}", json!({"ok": true, "stopping": true}))?;
            waiters.lock().push(conn.try_clone()?);
            (h.shutdown)();
            Ok(())
        }
        _ => writeln!(out, "{}", json!({"ok": false, "error": "unknown request"})),
    }
}

/// Send one request and read the replies until the daemon closes the connection or
/// `until` accepts a reply. `timeout` bounds each wait.
pub fn request(
    path: &Path,
    cmd: &str,
    timeout: Duration,
    until: impl Fn(&Value) -> bool,
) -> std::io::Result<Vec<Value>> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(timeout))?;
    writeln!(s, "{}", json!({ "cmd": cmd }))?;
    let mut replies = Vec::new();
    for line in BufReader::new(&s).lines() {
        let v: Value = serde_json::from_str(&line?).map_err(std::io::Error::other)?;
        let stop = until(&v);
        replies.push(v);
        if stop {
            break;
        }
    }
    Ok(replies)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn status_and_shutdown_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.sock");
        let stopped = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let tx = Mutex::new(tx);
        let s2 = stopped.clone();
        let asked = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let a2 = asked.clone();
        let server = ControlServer::start(
            &path,
            Handlers {
                status: Arc::new(|| json!({"engine": {"free_zones": 5}})),
                shutdown: Arc::new(move || {
                    s2.store(true, Ordering::SeqCst);
                    let _ = tx.lock().send(());
                }),
                reclaim: Arc::new(move || {
                    let n = a2.fetch_add(1, Ordering::SeqCst) + 1;
                    Ok(json!({ "request": n }))
                }),
            },
        )
        .unwrap();
        let r = request(&path, "status", Duration::from_secs(5), |_| true).unwrap();
        assert_eq!(r[0]["status"]["engine"]["free_zones"], 5);
        for n in 1..=2 {
            let r = request(&path, "reclaim", Duration::from_secs(5), |_| true).unwrap();
            assert_eq!(r.len(), 1);
            assert_eq!(r[0]["ok"], true, "{}", r[0]);
            assert_eq!(r[0]["reclaim"]["request"], n);
        }
        assert_eq!(asked.load(Ordering::SeqCst), 2);

        let p2 = path.clone();
        let client = std::thread::spawn(move || {
            request(&p2, "shutdown", Duration::from_secs(5), |v| {
                v.get("done").is_some()
            })
        });
        rx.recv().unwrap();
        assert!(stopped.load(Ordering::SeqCst));
        server.finish(&Ok(()));
        let replies = client.join().unwrap().unwrap();
        assert_eq!(replies.len(), 2);
        assert_eq!(replies[1]["done"], true);
        assert!(!path.exists());

        let r = request(
            &dir.path().join("none.sock"),
            "status",
            Duration::from_secs(1),
            |_| true,
        );
        assert!(r.is_err());
    }

    /// A target without reclaim says why, and the client gets it as the error.
    #[test]
    fn reclaim_refusal_is_passed_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("3.sock");
        let _server = ControlServer::start(
            &path,
            Handlers {
                status: Arc::new(|| Value::Null),
                shutdown: Arc::new(|| {}),
                reclaim: Arc::new(|| Err("no reclaim on mem:64M".into())),
            },
        )
        .unwrap();
        let r = request(&path, "reclaim", Duration::from_secs(5), |_| true).unwrap();
        assert_eq!(r[0], json!({"ok": false, "error": "no reclaim on mem:64M"}));
    }

    /// A client of another uid gets a refusal, not the status, and cannot stop the daemon.
    /// Needs root (to run the client as nobody) and python3 (the client).
    #[test]
    fn other_users_are_refused() {
        use std::os::unix::process::CommandExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to run a client as another uid");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("9.sock");
        let stopped = Arc::new(AtomicBool::new(false));
        let s2 = stopped.clone();
        let reclaimed = Arc::new(AtomicBool::new(false));
        let r2 = reclaimed.clone();
        let _server = ControlServer::start(
            &path,
            Handlers {
                status: Arc::new(|| json!({"secret": 1})),
                shutdown: Arc::new(move || s2.store(true, Ordering::SeqCst)),
                reclaim: Arc::new(move || {
                    r2.store(true, Ordering::SeqCst);
                    Ok(Value::Null)
                }),
            },
        )
        .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Open the way for the test client only: the check under test is SO_PEERCRED.
        for (p, m) in [(dir.path(), 0o755), (path.as_path(), 0o666)] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        }
        let client = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
    s.sendall(sys.argv[2].encode() + b"\n")
except BrokenPipeError:
    pass  # a refused client is answered without its request being read
print(s.makefile().readline().strip())
"#;
        for cmd in ["status", "shutdown", "reclaim"] {
            let out = std::process::Command::new("python3")
                .arg("-c")
                .arg(client)
                .arg(&path)
                .arg(json!({ "cmd": cmd }).to_string())
                .uid(65534)
                .gid(65534)
                .output()
                .expect("python3");
            assert!(out.status.success(), "{out:?}");
            let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(reply["ok"], false, "{reply}");
            let err = reply["error"].as_str().unwrap();
            assert!(
                err.contains("permission denied") && err.contains("uid 65534"),
                "{err}"
            );
        }
        assert!(
            !stopped.load(Ordering::SeqCst),
            "a refused shutdown stopped the daemon"
        );
        assert!(
            !reclaimed.load(Ordering::SeqCst),
            "a refused client started reclaim"
        );
        // Root still gets the status.
        let r = request(&path, "status", Duration::from_secs(5), |_| true).unwrap();
        assert_eq!(r[0]["status"]["secret"], 1);
    }
}
