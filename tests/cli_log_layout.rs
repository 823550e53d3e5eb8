//! `zonedd format --layout log` and I/O through the CLI (`engine-io`, which opens the engine
//! of the layout it finds): what separate processes write reads back from another, data
//! lands at its offsets, never-written blocks read as zeros, and the volume stays one.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use zbd::{EmulateOptions, Emulated};

const MIB: u64 = 1 << 20;

fn zonedd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zonedd"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run zonedd")
}

#[track_caller]
fn ok(o: Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// 512 MiB in 2 MiB zones, 48 conventional, formatted with the log layout.
fn formatted(dir: &Path) -> PathBuf {
    let path = dir.join("l.img");
    let mut opts = EmulateOptions::new(512 * MIB, 2 * MIB);
    opts.conventional = 48;
    drop(Emulated::create(&path, &opts).expect("create image"));
    let out = ok(zonedd(&[
        "format",
        "--backend",
        path.to_str().unwrap(),
        "--layout",
        "log",
    ]));
    assert!(out.contains("log (zonedd)"), "{out}");
    path
}

fn io(img: &Path, step: &[&str]) -> Output {
    let mut args = vec!["engine-io", "--backend", img.to_str().unwrap()];
    args.extend_from_slice(step);
    zonedd(&args)
}

#[test]
fn writes_through_the_cli_read_back_from_another_process() {
    let d = tempfile::tempdir().unwrap();
    let img = formatted(d.path());
    // A stream, an overwrite inside it (FUA), a write across zone ends elsewhere.
    ok(io(
        &img,
        &["write", "--offset", "1M", "--len", "3M", "--pattern", "7"],
    ));
    ok(io(
        &img,
        &[
            "write",
            "--offset",
            "2M",
            "--len",
            "8K",
            "--pattern",
            "8",
            "--fua",
        ],
    ));
    ok(io(
        &img,
        &["write", "--offset", "301M", "--len", "5M", "--pattern", "9"],
    ));
    ok(io(
        &img,
        &["read", "--offset", "1M", "--len", "1M", "--pattern", "7"],
    ));
    ok(io(
        &img,
        &["read", "--offset", "2M", "--len", "8K", "--pattern", "8"],
    ));
    ok(io(
        &img,
        &[
            "read",
            "--offset",
            "2056K",
            "--len",
            "2040K",
            "--pattern",
            "7",
        ],
    ));
    ok(io(
        &img,
        &["read", "--offset", "301M", "--len", "5M", "--pattern", "9"],
    ));
    // Never written: zeros.
    ok(io(
        &img,
        &["read", "--offset", "100M", "--len", "1M", "--pattern", "0"],
    ));
    // The overwritten blocks no longer hold the stream's data: the comparison must fail.
    let o = io(
        &img,
        &["read", "--offset", "2M", "--len", "8K", "--pattern", "7"],
    );
    assert_eq!(o.status.code(), Some(1));
}

fn check(img: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["check", img.to_str().unwrap()];
    args.extend_from_slice(extra);
    zonedd(&args)
}

/// `check --json` of a log-layout volume, parsed.
fn check_json(img: &Path) -> serde_json::Value {
    let o = check(img, &["--json"]);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json: {e}; stdout {} stderr {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// Enough writes to fill a few zones (full zones have summaries to check).
fn write_some(img: &Path) {
    ok(io(
        img,
        &["write", "--offset", "0", "--len", "9M", "--pattern", "3"],
    ));
    for off in ["100K", "3M", "7M"] {
        ok(io(
            img,
            &["write", "--offset", off, "--len", "4K", "--pattern", "4"],
        ));
    }
}

#[test]
fn check_of_a_written_log_layout_volume_is_clean() {
    let d = tempfile::tempdir().unwrap();
    let img = formatted(d.path());
    write_some(&img);
    let out = ok(check(&img, &[]));
    assert!(out.contains("(log layout)"), "{out}");
    assert!(out.contains("No error detected"), "{out}");
    let j = check_json(&img);
    assert_eq!(j["layout"], "log");
    let c = &j["check"];
    assert_eq!(c["mapped_blocks"], 9 * 256, "{c}");
    assert!(c["summaries_checked"].as_u64().unwrap() >= 3, "{c}");
    assert_eq!(c["errors"].as_array().unwrap().len(), 0, "{c}");
    assert_eq!(c["warnings"].as_array().unwrap().len(), 0, "{c}");
}
