//! `zonedd emulate`, `zonedd report` and `zonedd conformance` through the built binary.

use std::path::Path;
use std::process::{Command, Output};

fn zonedd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zonedd"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run zonedd")
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn emulate_then_report_json() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    let out = zonedd(&[
        "emulate",
        p(&img),
        "--size",
        "4G",
        "--zone-size",
        "64M",
        "--conventional",
        "8",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = zonedd(&["report", p(&img), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["geometry"]["nr_zones"], 64);
    assert_eq!(v["geometry"]["zone_size"], 64u64 << 20);
    assert_eq!(v["geometry"]["max_open_zones"], 128);
    assert_eq!(v["geometry"]["max_active_zones"], 0);
    let zones = v["zones"].as_array().unwrap();
    assert_eq!(zones.len(), 64);
    let conv = zones.iter().filter(|z| z["type"] == "conventional").count();
    let seq: Vec<_> = zones
        .iter()
        .filter(|z| z["type"] == "seq-write-required")
        .collect();
    assert_eq!(conv, 8);
    assert_eq!(seq.len(), 56);
    assert!(seq
        .iter()
        .all(|z| z["condition"] == "empty" && z["wp"] == z["start"]));
    assert_eq!(v["summary"]["zones"], 64);
    assert_eq!(v["summary"]["by_type"]["conventional"], 8);
    assert_eq!(v["summary"]["by_type"]["seq-write-required"], 56);
    assert_eq!(v["summary"]["by_condition"]["empty"], 56);
    assert_eq!(v["summary"]["by_condition"]["not-wp"], 8);

    // The table: one line per zone and a summary line.
    let out = zonedd(&["report", p(&img)]);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 65);
    assert!(lines[0].contains("conventional") && lines[8].contains("empty"));
    assert!(
        lines[64].contains("64 zones of 64M") && lines[64].contains("56 empty"),
        "{}",
        lines[64]
    );

    // Sparse: 4 GiB of zones cost (almost) nothing.
    use std::os::unix::fs::MetadataExt;
    assert!(std::fs::metadata(&img).unwrap().blocks() * 512 < 4 << 20);
}

#[test]
fn emulate_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    let out = zonedd(&["emulate", p(&img), "--size", "64G"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_slice(&zonedd(&["report", p(&img), "--json"]).stdout).unwrap();
    assert_eq!(v["geometry"]["zone_size"], 256u64 << 20);
    assert_eq!(v["geometry"]["nr_zones"], 256);
    assert_eq!(v["summary"]["by_type"]["conventional"], 8);
}

#[test]
fn bad_input_gives_exit_2_and_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    let existing = dir.path().join("exists.img");
    assert!(zonedd(&[
        "emulate",
        p(&existing),
        "--size",
        "1G",
        "--zone-size",
        "64M"
    ])
    .status
    .success());
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"hello").unwrap();
    let missing = dir.path().join("missing");
    let i = p(&img);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["emulate", i, "--size", "4G", "--zone-size", "48M"],
            "power of two",
        ),
        (
            vec!["emulate", i, "--size", "4100M", "--zone-size", "64M"],
            "multiple of the zone size",
        ),
        (
            vec![
                "emulate",
                p(&existing),
                "--size",
                "1G",
                "--zone-size",
                "64M",
            ],
            "--force",
        ),
        (
            vec![
                "emulate",
                i,
                "--size",
                "4G",
                "--zone-size",
                "64M",
                "--conventional",
                "65",
            ],
            "conventional",
        ),
        (
            vec!["emulate", i, "--size", "4G", "--zone-size", "512K"],
            "minimum",
        ),
        (
            vec!["emulate", i, "--size", "4G", "--zone-size", "2048"],
            "multiple of 4096",
        ),
        (
            vec!["emulate", i, "--size", "4Q", "--zone-size", "64M"],
            "unknown unit",
        ),
        (
            vec!["emulate", i, "--zone-size", "64M"],
            "--size is required",
        ),
        (
            vec![
                "emulate",
                i,
                "--size",
                "4G",
                "--zone-size",
                "64M",
                "--zone-capacity",
                "128M",
            ],
            "capacity",
        ),
        (
            vec!["emulate", i, "--size", "4G", "--max-open", "lots"],
            "--max-open",
        ),
        (
            vec![
                "emulate",
                i,
                "--size",
                "4G",
                "--zone-size",
                "64M",
                "--max-open",
                "8",
                "--max-active",
                "4",
            ],
            "max-active",
        ),
        (
            vec!["emulate", i, "--size", "0", "--zone-size", "64M"],
            "size is 0",
        ),
        (vec!["report", p(&plain)], "zonedd emulate"),
        (vec!["report", p(&missing)], "No such file"),
        (vec!["conformance", p(&existing)], "--yes-destroy-data"),
    ];
    for (args, needle) in cases {
        let out = zonedd(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert!(!img.exists(), "a refused emulate must not create the file");
}

#[test]
fn force_overwrites_and_resets_zones() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    assert!(
        zonedd(&["emulate", p(&img), "--size", "1G", "--zone-size", "64M"])
            .status
            .success()
    );
    let out = zonedd(&[
        "emulate",
        p(&img),
        "--size",
        "2G",
        "--zone-size",
        "128M",
        "--conventional",
        "2",
        "--force",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_slice(&zonedd(&["report", p(&img), "--json"]).stdout).unwrap();
    assert_eq!(v["geometry"]["nr_zones"], 16);
    assert_eq!(v["summary"]["by_type"]["conventional"], 2);
}

#[test]
fn conformance_command_passes_on_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    let out = zonedd(&[
        "emulate",
        p(&img),
        "--size",
        "32M",
        "--zone-size",
        "1M",
        "--conventional",
        "2",
        "--max-open",
        "4",
        "--max-active",
        "6",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = zonedd(&["conformance", p(&img), "--yes-destroy-data"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.lines().filter(|l| l.starts_with("PASS ")).count() >= 20,
        "{text}"
    );
    assert!(text.contains("0 failed, 0 skipped"), "{text}");
}
