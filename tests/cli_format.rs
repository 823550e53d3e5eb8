//! `zonedd format` and `zonedd check` end to end on an emulated image.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use zbd::{EmulateOptions, Emulated, ZonedDevice};

const ZONE: u64 = 1 << 20;

fn zonedd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zonedd"))
        .args(args)
        .output()
        .expect("run zonedd")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A 48 MiB image: 48 zones of 1 MiB, the first 8 conventional.
fn image(dir: &Path) -> PathBuf {
    let path = dir.join("d.img");
    let mut opts = EmulateOptions::new(48 * ZONE, ZONE);
    opts.conventional = 8;
    drop(Emulated::create(&path, &opts).expect("create image"));
    path
}

#[test]
fn format_then_check_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let p = img.to_str().unwrap();
    let o = zonedd(&[
        "format",
        "--backend",
        p,
        "--label",
        "cli",
        "--reserved-seq",
        "4",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    // 48 zones - 2 metadata - 4 reserved.
    assert!(out.contains("chunks           42"), "{out}");
    assert!(out.contains("label            cli"), "{out}");
    assert!(out.contains("42 MiB"), "{out}");

    let o = zonedd(&["check", p]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("No error detected"));

    // The superblock on the image is what dmz reads back.
    let dev = zbd::open(&img).unwrap();
    let l = dmz::sets::load(dev.as_ref()).unwrap();
    assert_eq!(
        (l.sb.label_str().as_str(), l.layout.nr_chunks, l.sb.gen),
        ("cli", 42, 1)
    );
}

#[test]
fn second_format_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let p = img.to_str().unwrap();
    assert!(zonedd(&["format", "--backend", p]).status.success());
    let o = zonedd(&["format", "--backend", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("already formatted") && err.contains("--force"),
        "{err}"
    );
    let o = zonedd(&["format", "--backend", p, "--force", "--label", "again"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("again"));
}

#[test]
fn format_refuses_a_filesystem_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    {
        let dev = zbd::open(&img).unwrap();
        let mut b = vec![0u8; 4096];
        b[..4].copy_from_slice(b"XFSB");
        dev.write_at(&b, 0).unwrap();
    }
    let p = img.to_str().unwrap();
    let o = zonedd(&["format", "--backend", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("XFS"),
        "{}",
        text(&o)
    );
}

#[test]
fn check_json_parses_and_repair_fixes() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let p = img.to_str().unwrap();
    assert!(zonedd(&["format", "--backend", p, "--reserved-seq", "4"])
        .status
        .success());
    // Data in an unmapped sequential zone: an error check finds and repair fixes.
    {
        let dev = zbd::open(&img).unwrap();
        dev.write_at(&[1u8; 4096], 20 * ZONE).unwrap();
        dev.flush().unwrap();
    }
    let o = zonedd(&["check", p, "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
    assert_eq!(v["summary"]["clean"], false);
    assert_eq!(v["errors"][0]["kind"], "unmapped-seq-not-empty");
    assert_eq!(v["errors"][0]["zone"], 20);

    // The repair first replays the engine (open + close), whose close may already reset the
    // stray zone; whatever is left, the repair fixes all it reports.
    let o = zonedd(&["check", p, "--repair", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["summary"]["clean"], true, "{v}");
    assert_eq!(
        v["fixed"].as_array().unwrap().len(),
        v["errors"].as_array().unwrap().len(),
        "{v}"
    );
    let o = zonedd(&["check", p, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The repair commits once more than the engine's replay (open + close) did.
    assert!(v["gen"].as_u64().unwrap() >= 2, "{v}");
    assert_eq!(v["errors"].as_array().unwrap().len(), 0);
}

#[test]
fn bad_input_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.img");
    let o = zonedd(&["check", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let img = image(dir.path());
    let o = zonedd(&["check", img.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not formatted"));
    let o = zonedd(&[
        "format",
        "--backend",
        img.to_str().unwrap(),
        "--label",
        &"x".repeat(40),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn repair_replays_a_crashed_daemons_log_first() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let p = img.to_str().unwrap();
    assert!(zonedd(&["format", "--backend", p, "--reserved-seq", "4"])
        .status
        .success());
    let data: Vec<u8> = (0..8192).map(|i| (i % 251) as u8).collect();
    {
        let dev: std::sync::Arc<dyn ZonedDevice> = std::sync::Arc::from(zbd::open(&img).unwrap());
        let mut opts = dmz::engine::EngineOptions::default();
        opts.reclaim.enabled = false;
        let e = dmz::engine::Engine::open(dev, opts).unwrap();
        e.write(3 * ZONE, &data, false).unwrap();
        e.flush().unwrap();
        e.crash_for_test(); // acknowledged, logged, not yet in the v2 sets
    }
    let o = zonedd(&["check", p, "--repair"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let dev: std::sync::Arc<dyn ZonedDevice> = std::sync::Arc::from(zbd::open(&img).unwrap());
    let e = dmz::engine::Engine::open(dev, dmz::engine::EngineOptions::default()).unwrap();
    let mut back = vec![0u8; data.len()];
    e.read(3 * ZONE, &mut back).unwrap();
    assert!(back == data, "the repair lost an acknowledged write");
    e.close().unwrap();
}
