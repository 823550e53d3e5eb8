//! `kill -9` of a process writing to an emulated image loses no completed write.
//!
//! In its own test binary: the child is spawned by fork+exec, and until the exec it shares
//! the open files (and so the `flock`s) of every other test running in the same process.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use zbd::{EmulateOptions, Emulated, ZonedDevice};

const Z: u64 = 1 << 20;

fn opts() -> EmulateOptions {
    let mut o = EmulateOptions::new(16 * Z, Z);
    o.conventional = 2;
    o.max_open = 4;
    o
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 / 7)) as u8 | 1)
        .collect()
}

fn read(dev: &dyn ZonedDevice, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0xeeu8; len];
    dev.read_at(&mut b, off).unwrap();
    b
}

/// Zone written by write `i` of the kill -9 workload, and its place in that zone.
fn kill9_slot(i: u64) -> (u32, u64) {
    (2 + (i % 4) as u32, i / 4)
}

const KILL9_WRITE: usize = 16384;

/// Child half of `kill_9_loses_no_completed_write` (does nothing unless run by it): writes
/// forever-ish, reporting each completed write, until killed.
#[test]
fn kill9_child_helper() {
    let Ok(path) = std::env::var("ZBD_KILL9_IMAGE") else {
        return;
    };
    let dev = Emulated::open(Path::new(&path)).unwrap();
    let mut out = std::io::stdout().lock();
    for i in 0..(4 * (Z / KILL9_WRITE as u64) - 4) {
        let (z, n) = kill9_slot(i);
        dev.write_at(
            &pattern(i, KILL9_WRITE),
            z as u64 * Z + n * KILL9_WRITE as u64,
        )
        .unwrap();
        writeln!(out, "done {i}").unwrap();
        out.flush().unwrap();
    }
    writeln!(out, "all done").unwrap();
    out.flush().unwrap();
    // Wait to be killed.
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
}

#[test]
fn kill_9_loses_no_completed_write() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.img");
    drop(Emulated::create(&p, &opts()).unwrap());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "kill9_child_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ZBD_KILL9_IMAGE", &p)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked = 0u64;
    for l in lines.by_ref() {
        let l = l.unwrap();
        if let Some(n) = l.strip_prefix("done ") {
            acked = n.parse::<u64>().unwrap() + 1;
            if acked == 40 {
                break; // the child is still writing
            }
        }
    }
    assert_eq!(acked, 40, "child died early");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    // The lock died with the process.
    let dev = Emulated::open(&p).unwrap();
    let zones = dev.report_all().unwrap();
    let counts: Vec<u64> = (2..6)
        .map(|z| (zones[z].wp - zones[z].start) / KILL9_WRITE as u64)
        .collect();
    let total: u64 = counts.iter().sum();
    assert!(
        total >= acked,
        "{total} writes in the image, {acked} acknowledged"
    );
    for i in 0..total {
        let (z, n) = kill9_slot(i);
        assert!(
            n < counts[z as usize - 2],
            "write {i} missing while a later one is there"
        );
        let off = z as u64 * Z + n * KILL9_WRITE as u64;
        assert_eq!(
            read(&dev, off, KILL9_WRITE),
            pattern(i, KILL9_WRITE),
            "write {i}"
        );
    }
}
