//! What a running device leaves in the run directory (`/run/zonedd`, or `$ZONEDD_RUN_DIR`):
//! `<id>.json` (a [`DeviceRecord`]), `<id>.sock` (the control endpoint), `<id>.log` (the
//! daemon's stderr). The same [`DeviceSpec`] also goes into libublk's own device JSON
//! (`/run/ublksrvd/NNNN.json`, `target_data`), which survives a crashed daemon, so
//! `recover` can rebuild the daemon from it.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    pub queues: u16,
    pub depth: u16,
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

pub fn ensure_run_dir() -> std::io::Result<PathBuf> {
    let d = run_dir();
    std::fs::create_dir_all(&d)?;
    Ok(d)
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
    std::fs::write(&tmp, serde_json::to_vec_pretty(rec)?)?;
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
                queues: 2,
                depth: 64,
            },
            pid: 42,
            socket: socket_path(3),
            log: None,
        };
        write(&rec).unwrap();
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
}
