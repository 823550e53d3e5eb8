//! `zonedd engine-io` on an emulated image: what it writes survives close and reopen (through
//! the CLI and through the engine library), its pattern data is tied to offsets, and bad
//! input exits with 2.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use dmz::engine::{Engine, EngineOptions};
use zbd::{EmulateOptions, Emulated};

const ZONE: u64 = 1 << 20;
const M: u64 = 1 << 20;
const K: u64 = 1 << 10;

fn zonedd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zonedd"))
        .args(args)
        .output()
        .expect("run zonedd")
}

fn zonedd_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_zonedd"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run zonedd");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(o: Output) -> Output {
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    o
}

/// A formatted 48 MiB image: 48 zones of 1 MiB, 8 conventional, 4 reserved: 42 chunks.
fn formatted(dir: &Path) -> PathBuf {
    let path = dir.join("d.img");
    let mut opts = EmulateOptions::new(48 * ZONE, ZONE);
    opts.conventional = 8;
    drop(Emulated::create(&path, &opts).expect("create image"));
    ok(zonedd(&[
        "format",
        "--backend",
        path.to_str().unwrap(),
        "--reserved-seq",
        "4",
    ]));
    path
}

/// Deterministic bytes that differ for every (seed, position).
fn bytes(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes: a streaming write at a chunk start, a second write into the same chunk not at its
/// start (an append and an overwrite), an unaligned start in a fresh chunk, a write across a
/// chunk boundary, one with --fua --flush.
const WRITES: [(u64, u64, u64); 6] = [
    (0, 512 * K, 1),
    (512 * K, 256 * K, 2),
    (100 * K, 64 * K, 3),
    (3 * M + 200 * K, 300 * K, 4),
    (5 * M + 900 * K, 400 * K, 5),
    (40 * M, 2 * M, 6),
];

/// The expected image after applying `WRITES` in order over zeros, for [0, len).
fn model(len: u64) -> Vec<u8> {
    let mut m = vec![0u8; len as usize];
    for (off, n, seed) in WRITES {
        m[off as usize..(off + n) as usize].copy_from_slice(&bytes(seed, n));
    }
    m
}

#[test]
fn writes_survive_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let img = formatted(dir.path());
    let p = img.to_str().unwrap();
    for (i, (off, n, seed)) in WRITES.iter().enumerate() {
        let f = dir.path().join(format!("w{seed}"));
        std::fs::write(&f, bytes(*seed, *n)).unwrap();
        let (off, n) = (off.to_string(), n.to_string());
        let mut args = vec!["engine-io", "--backend", p, "write", "--offset", &off];
        args.extend(["--len", &n, "--file", f.to_str().unwrap()]);
        if i == 4 {
            args.extend(["--fua", "--flush"]);
        }
        ok(zonedd(&args));
    }
    let want = model(42 * M);

    // Read back through the CLI (a new engine session), into a file and to stdout.
    let out = dir.path().join("r");
    ok(zonedd(&[
        "engine-io",
        "--backend",
        p,
        "read",
        "--offset",
        "0",
        "--len",
        "42M",
        "--file",
        out.to_str().unwrap(),
    ]));
    assert!(std::fs::read(&out).unwrap() == want, "file read differs");
    let o = ok(zonedd(&[
        "engine-io",
        "--backend",
        p,
        "read",
        "--offset",
        "3M",
        "--len",
        "1M",
    ]));
    assert!(o.stdout == want[3 * M as usize..4 * M as usize]);

    // The closed volume is clean for check and reads the same through the engine library.
    ok(zonedd(&["check", p]));
    let dev = zbd::open(&img).unwrap();
    let e = Engine::open(Arc::from(dev), EngineOptions::default()).unwrap();
    let mut got = vec![0u8; want.len()];
    e.read(0, &mut got).unwrap();
    assert!(got == want, "engine read differs");
    e.close().unwrap();
}

#[test]
fn script_runs_one_session_with_patterns() {
    let dir = tempfile::tempdir().unwrap();
    let img = formatted(dir.path());
    let p = img.to_str().unwrap();
    let f = dir.path().join("data");
    std::fs::write(&f, bytes(9, 128 * K)).unwrap();
    let script = dir.path().join("s");
    std::fs::write(
        &script,
        "# chunk 2 streamed, then overwritten inside\n\
         write --offset 2M --len 1M --pattern 7\n\
         write --offset 2M --len 128K --pattern 8 --fua\n\n\
         write --offset 2M+0 --len 4K --pattern 1\n",
    )
    .unwrap();
    // A bad line fails before anything is written.
    let o = zonedd(&[
        "engine-io",
        "--backend",
        p,
        "--script",
        script.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(":5:"),
        "{}",
        text(&o)
    );
    std::fs::write(
        &script,
        format!(
            "write --offset 2M --len 1M --pattern 7\n\
             write --offset 2M --len 128K --pattern 8 --fua\n\
             write --offset 2200K --len 128K --file {}\n\
             flush\n\
             read --offset 2M --len 128K --pattern 8\n\
             read --offset 2328K --len 696K --pattern 7\n\
             read --offset 3M --len 1M --pattern 0\n",
            f.display()
        ),
    )
    .unwrap();
    ok(zonedd(&[
        "engine-io",
        "--backend",
        p,
        "--script",
        script.to_str().unwrap(),
    ]));

    // Pattern data is the same whether generated, written, or read back; another seed does
    // not match.
    let gen = ok(zonedd(&[
        "engine-io",
        "pattern",
        "--pattern",
        "7",
        "--offset",
        "2328K",
        "--len",
        "8K",
    ]))
    .stdout;
    assert_eq!(gen.len(), 8192);
    let read = ok(zonedd(&[
        "engine-io",
        "--backend",
        p,
        "read",
        "--offset",
        "2328K",
        "--len",
        "8K",
    ]))
    .stdout;
    assert!(gen == read);
    let o = ok(zonedd(&[
        "engine-io",
        "--backend",
        p,
        "read",
        "--offset",
        "2200K",
        "--len",
        "128K",
    ]));
    assert!(o.stdout == bytes(9, 128 * K));
    for (seed, off) in [("6", "2328K"), ("8", "2328K"), ("7", "2M")] {
        let o = zonedd(&[
            "engine-io",
            "--backend",
            p,
            "read",
            "--offset",
            off,
            "--len",
            "4K",
            "--pattern",
            seed,
        ]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("differs from pattern"));
    }
}

#[test]
fn stdin_write_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let img = formatted(dir.path());
    let p = img.to_str().unwrap();
    let data = bytes(11, 3 * M);
    let args = [
        "engine-io",
        "--backend",
        p,
        "write",
        "--offset",
        "7M",
        "--len",
        "3M",
    ];
    ok(zonedd_stdin(&args, &data));
    let o = ok(zonedd(&[
        "engine-io",
        "--backend",
        p,
        "read",
        "--offset",
        "7M",
        "--len",
        "3M",
    ]));
    assert!(o.stdout == data);
    // Short input is an error, not a partial write of garbage.
    let o = zonedd_stdin(&args, &data[..4096]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
}

#[test]
fn bad_input_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let img = formatted(dir.path());
    let p = img.to_str().unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, [1u8; 4096]).unwrap();
    let unformatted = dir.path().join("u.img");
    drop(Emulated::create(&unformatted, &EmulateOptions::new(16 * ZONE, ZONE)).unwrap());
    let cases: Vec<Vec<&str>> = vec![
        vec!["read", "--offset", "100", "--len", "4K"],
        vec!["read", "--offset", "0", "--len", "1000"],
        vec!["read", "--offset", "0", "--len", "0"],
        vec!["read", "--offset", "41M", "--len", "2M"],
        vec!["write", "--offset", "42M", "--len", "4K", "--pattern", "1"],
        vec![
            "write",
            "--offset",
            "0",
            "--len",
            "8K",
            "--file",
            short.to_str().unwrap(),
        ],
        vec!["read", "--offset", "0"],
        vec!["read", "--offset", "0", "--len", "4K", "--fua"],
        vec!["frobnicate"],
        vec![],
    ];
    for c in cases {
        let mut args = vec!["engine-io", "--backend", p];
        args.extend(&c);
        let o = zonedd(&args);
        assert_eq!(o.status.code(), Some(2), "{c:?}: {}", text(&o));
        assert!(!o.stderr.is_empty(), "{c:?}: no message");
    }
    let o = zonedd(&["engine-io", "read", "--offset", "0", "--len", "4K"]);
    assert_eq!(o.status.code(), Some(2), "no backend: {}", text(&o));
    let o = zonedd(&[
        "engine-io",
        "--backend",
        unformatted.to_str().unwrap(),
        "read",
        "--offset",
        "0",
        "--len",
        "4K",
    ]);
    assert_eq!(o.status.code(), Some(2), "unformatted: {}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not formatted"));
    // Nothing above wrote: the volume is still empty and clean.
    let o = ok(zonedd(&[
        "engine-io",
        "--backend",
        p,
        "read",
        "--offset",
        "0",
        "--len",
        "42M",
        "--pattern",
        "0",
    ]));
    drop(o);
    ok(zonedd(&["check", p]));
}

#[test]
fn raw_mode_runs_the_same_steps_on_a_plain_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("plain");
    std::fs::write(&f, vec![0u8; 4 * M as usize]).unwrap();
    let p = f.to_str().unwrap();
    let script = dir.path().join("s");
    std::fs::write(
        &script,
        "write --offset 1M --len 1M --pattern 3 --fua\n\
         write --offset 1M --len 8K --pattern 4\n\
         read --offset 1M --len 8K --pattern 4\n\
         read --offset 1032K --len 1016K --pattern 3\n\
         read --offset 0 --len 1M --pattern 0\n",
    )
    .unwrap();
    ok(zonedd(&[
        "engine-io",
        "--raw",
        p,
        "--script",
        script.to_str().unwrap(),
    ]));
    // The bytes on the file are the generated ones, at their offsets.
    let gen = ok(zonedd(&[
        "engine-io",
        "pattern",
        "--pattern",
        "3",
        "--offset",
        "1032K",
        "--len",
        "1016K",
    ]))
    .stdout;
    let on_file = std::fs::read(&f).unwrap();
    assert!(on_file[1032 * K as usize..2 * M as usize] == gen[..]);
    // Past the end of the file is out of range; raw and backend together are refused.
    let o = zonedd(&[
        "engine-io",
        "--raw",
        p,
        "read",
        "--offset",
        "4M",
        "--len",
        "4K",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = zonedd(&[
        "engine-io",
        "--raw",
        p,
        "--backend",
        p,
        "read",
        "--offset",
        "0",
        "--len",
        "4K",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// Engine bug (reported to the engine's owner): reclaim frees a sequential zone without
/// resetting it, and `close()` leaves it that way, so the closed volume has an unmapped
/// sequential zone that is not empty. dm-zoned resets a sequential zone when it frees it;
/// `dmzadm --check` and `zonedd check` report such a zone as an error, and the kernel's
/// reclaim copies into a free sequential zone assuming its write pointer is at its start.
#[test]
fn reclaimed_volume_checks_clean() {
    let dir = tempfile::tempdir().unwrap();
    let img = formatted(dir.path());
    let p = img.to_str().unwrap();
    let script = dir.path().join("s");
    // Chunk 0 streamed into a sequential zone, then overwritten inside (a buffer zone);
    // reclaim merges both into a new sequential zone and frees the old one.
    std::fs::write(
        &script,
        "write --offset 0 --len 1M --pattern 1\n\
         write --offset 256K --len 64K --pattern 2\n\
         reclaim\n\
         read --offset 0 --len 256K --pattern 1\n\
         read --offset 256K --len 64K --pattern 2\n\
         read --offset 320K --len 704K --pattern 1\n",
    )
    .unwrap();
    let o = ok(zonedd(&[
        "engine-io",
        "--backend",
        p,
        "--script",
        script.to_str().unwrap(),
    ]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("reclaim: ") && !err.contains("reclaim: 0 zone"),
        "{err}"
    );
    let o = zonedd(&["check", p]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn reclaim_keeps_data() {
    let dir = tempfile::tempdir().unwrap();
    let img = formatted(dir.path());
    let p = img.to_str().unwrap();
    let script = dir.path().join("s");
    std::fs::write(
        &script,
        "write --offset 0 --len 1M --pattern 1\n\
         write --offset 256K --len 64K --pattern 2\n\
         write --offset 5128K --len 8K --pattern 3\n\
         reclaim\n\
         read --offset 0 --len 256K --pattern 1\n\
         read --offset 256K --len 64K --pattern 2\n\
         read --offset 320K --len 704K --pattern 1\n\
         read --offset 5M --len 8K --pattern 0\n\
         read --offset 5128K --len 8K --pattern 3\n",
    )
    .unwrap();
    let o = ok(zonedd(&[
        "engine-io",
        "--backend",
        p,
        "--script",
        script.to_str().unwrap(),
    ]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("0 buffer zone(s) left"), "{err}");
    // Reopened: still the same data.
    std::fs::write(
        &script,
        "read --offset 0 --len 256K --pattern 1\n\
         read --offset 256K --len 64K --pattern 2\n\
         read --offset 320K --len 704K --pattern 1\n\
         read --offset 5128K --len 8K --pattern 3\n",
    )
    .unwrap();
    ok(zonedd(&[
        "engine-io",
        "--backend",
        p,
        "--script",
        script.to_str().unwrap(),
    ]));
    // Reclaim needs the engine.
    let f = dir.path().join("plain");
    std::fs::write(&f, vec![0u8; 4096]).unwrap();
    let o = zonedd(&["engine-io", "--raw", f.to_str().unwrap(), "reclaim"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// The same engine bug in the library alone, on an in-memory device: after a reclaim and a
/// clean `close()`, `dmz::check` finds the freed sequential zone still written.
#[test]
fn engine_close_after_reclaim_leaves_no_written_free_zone() {
    let mut opts = EmulateOptions::new(48 * ZONE, ZONE);
    opts.conventional = 8;
    let dev: Arc<dyn zbd::ZonedDevice> = Arc::new(zbd::MemDevice::new(&opts).unwrap());
    let fmt = dmz::sets::FormatOptions {
        label: None,
        reserved_seq: 4,
    };
    dmz::sets::format_device(dev.as_ref(), &fmt, &mut |_, _| {}).unwrap();
    let e = Engine::open(dev.clone(), EngineOptions::default()).unwrap();
    e.write(0, &bytes(1, M), false).unwrap(); // chunk 0 in a sequential zone
    e.write(256 * K, &bytes(2, 64 * K), false).unwrap(); // its buffer zone
    e.trigger_reclaim();
    e.wait_reclaim_idle();
    assert_eq!(
        e.stats().zones_buffer,
        0,
        "reclaim did not merge the buffer"
    );
    e.close().unwrap();
    let report = dmz::check::check(dev.as_ref(), false).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}
