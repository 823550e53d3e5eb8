//! What a running device leaves in the run directory (`/run/zonedd`, or `$ZONEDD_RUN_DIR`):
//! `<id>.json` (a [`DeviceRecord`]), `<id>.sock` (the control endpoint), `<id>.log` (the
//! daemon's stderr). The same [`DeviceSpec`] also goes into libublk's own device JSON
//! (`/run/ublksrvd/NNNN.json`, `target_data`), which survives a crashed daemon, so
//! `recover` can rebuild the daemon from it.
//!
//! Only root may talk to a daemon: the run directory is created 0700 and checked before use
//! (a real directory, not a symlink, owned by the caller's effective uid, reachable by
//! nobody else); records, logs and sockets in it are 0600; the control socket also checks
//! its peer's credentials (`control`).

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How the daemon was asked to serve the device: enough to start an identical one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSpec {
    /// Backend as given (canonicalized for real paths; `mem:SIZE` / `file:PATH` test modes).
    pub backend: String,
    #[serde(default)]
    pub label: Option<String>,
    /// Worker pool policy (`percpu` or `unbound`).
    pub pool: String,
    #[serde(default)]
    pub max_active: Option<u32>,
    #[serde(default)]
    pub reclaim_max_active: Option<u32>,
    /// Log-layout volumes: the metadata memory budget in MiB (`None`: the engine's default).
    #[serde(default)]
    pub index_memory_mib: Option<u64>,
    /// Log-layout volumes: which pages idle compaction rewrites (`reads`, `writes`,
    /// `never`; `None`: the engine's default).
    #[serde(default)]
    pub compact: Option<String>,
    pub queues: u16,
    pub depth: u16,
    /// Served as it is, a zoned device (`zonedd expose`), not through the engine.
    #[serde(default)]
    pub exposed: bool,
    /// A multi-device volume: its regular cache device (canonicalized) ...
    #[serde(default)]
    pub cache: Option<String>,
    /// ... and the zoned drives after `backend`, in order.
    #[serde(default)]
    pub more_backends: Vec<String>,
}

/// A running (or crashed) daemon's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceRecord {
    pub id: u32,
    pub bdev: String,
    #[serde(flatten)]
    pub spec: DeviceSpec,
    pub pid: u32,
    pub socket: PathBuf,
    pub log: Option<PathBuf>,
}

pub fn run_dir() -> PathBuf {
    std::env::var_os("ZONEDD_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/zonedd"))
}

/// The run directory, created 0700 if missing, checked with [`check_private_dir`].
pub fn ensure_run_dir() -> std::io::Result<PathBuf> {
    let d = run_dir();
    ensure_private_dir(&d)?;
    Ok(d)
}

/// `d`, created 0700 (parents too) if missing, then checked with [`check_private_dir`].
pub fn ensure_private_dir(d: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(d) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)?,
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    check_private_dir(d)
}

/// `d` must be a directory (not a symlink to one) owned by this process's effective uid; a
/// group or other permission bit on it (a run directory made by an older zonedd under the
/// caller's umask) is cleared, since the directory is ours.
pub fn check_private_dir(d: &Path) -> std::io::Result<()> {
    let refuse = |why: String| {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "refusing to use {} as the run directory: {why}",
                d.display()
            ),
        )
    };
    let md = std::fs::symlink_metadata(d)?;
    if md.file_type().is_symlink() {
        return Err(refuse("it is a symbolic link".into()));
    }
    if !md.is_dir() {
        return Err(refuse("it is not a directory".into()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if md.uid() != me {
        return Err(refuse(format!("it is owned by uid {}, not {me}", md.uid())));
    }
    if md.mode() & 0o077 != 0 {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Create (or truncate) `path` for writing, readable by its owner only.
pub fn create_private(path: &Path, append: bool) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.create(true).write(true).mode(0o600);
    if append {
        o.append(true);
    } else {
        o.truncate(true);
    }
    o.open(path)
}

pub fn record_path(id: u32) -> PathBuf {
    run_dir().join(format!("{id}.json"))
}
pub fn socket_path(id: u32) -> PathBuf {
    run_dir().join(format!("{id}.sock"))
}
pub fn log_path(id: u32) -> PathBuf {
    run_dir().join(format!("{id}.log"))
}

/// Write atomically (temp file + rename): readers never see half a record.
pub fn write(rec: &DeviceRecord) -> std::io::Result<()> {
    ensure_run_dir()?;
    let path = record_path(rec.id);
    let tmp = path.with_extension("json.tmp");
    create_private(&tmp, false)?.write_all(&serde_json::to_vec_pretty(rec)?)?;
    std::fs::rename(&tmp, &path)
}

pub fn read(id: u32) -> Option<DeviceRecord> {
    let data = std::fs::read(record_path(id)).ok()?;
    serde_json::from_slice(&data).ok()
}

/// Remove the record and socket of a device (missing files are fine).
pub fn remove(id: u32) {
    let _ = std::fs::remove_file(record_path(id));
    let _ = std::fs::remove_file(socket_path(id));
}

/// Every record in the run directory, by id.
pub fn all() -> Vec<DeviceRecord> {
    let mut v: Vec<DeviceRecord> = std::fs::read_dir(run_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id: u32 = name.strip_suffix(".json")?.parse().ok()?;
            read(id)
        })
        .collect();
    v.sort_by_key(|r| r.id);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_the_run_dir() {
        let dir = tempfile::tempdir().unwrap();
        std::env::set_var("ZONEDD_RUN_DIR", dir.path());
        let rec = DeviceRecord {
            id: 3,
            bdev: "/dev/ublkb3".into(),
            spec: DeviceSpec {
                backend: "/tmp/x.img".into(),
                label: Some("vol".into()),
                pool: "percpu".into(),
                max_active: None,
                reclaim_max_active: Some(2),
                index_memory_mib: None,
                compact: Some("writes".into()),
                queues: 2,
                depth: 64,
                exposed: false,
                cache: Some("/tmp/c.img".into()),
                more_backends: vec!["/tmp/y.img".into()],
            },
            pid: 42,
            socket: socket_path(3),
            log: None,
        };
        write(&rec).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&record_path(3)), 0o600, "records are root's only");
        std::fs::write(dir.path().join("junk.json"), b"{").unwrap();
        let all = all();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].spec, rec.spec);
        assert_eq!(all[0].pid, 42);
        // the spec alone is readable from the flattened record (what recover needs)
        let v = serde_json::to_value(&rec).unwrap();
        let spec: DeviceSpec = serde_json::from_value(v).unwrap();
        assert_eq!(spec, rec.spec);
        remove(3);
        assert!(read(3).is_none());
        std::env::remove_var("ZONEDD_RUN_DIR");
    }

    #[test]
    fn the_run_dir_is_private_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o777;
        // Created 0700 (the umask, 022 here, only ever takes bits away).
        let d = dir.path().join("run/zonedd");
        ensure_private_dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        // A directory left 0755 (an older zonedd) is ours: tightened, not refused.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_private_dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        // A symlink to a directory, a file, a directory of another owner: refused.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let e = check_private_dir(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let e = check_private_dir(&file).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        if nix::unistd::geteuid().is_root() {
            let other = dir.path().join("other");
            std::fs::create_dir(&other).unwrap();
            std::os::unix::fs::chown(&other, Some(65534), Some(65534)).unwrap();
            let e = check_private_dir(&other).unwrap_err();
            assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        }
    }
}
