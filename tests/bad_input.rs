//! The bad-input table (docs/bad-input.md), one test per row: the exact command, its exit code
//! and the key words of the one-line error the user sees.
//!
//! Rows that need ublk (create/list/delete/recover) are checked for what this machine is:
//! without /dev/ublk-control (this host) they must say that ublk_drv is missing; the rows that
//! only a VM with ublk can show (second daemon, create on an unformatted backend, not root with
//! ublk loaded) are listed in docs/bad-input.md with the VM scenario that covers them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use zbd::{EmulateOptions, Emulated, ZonedDevice};

const MIB: u64 = 1 << 20;

/// Tests run one at a time: an image's flock lives as long as any copy of its fd, and a child
/// forked by a parallel test holds copies until it execs, so a test reopening its own image
/// could find it "in use" (EBUSY).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn zonedd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zonedd"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run zonedd")
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The row's contract: exit code, and one stderr line `zonedd: ...` holding every key word.
#[track_caller]
fn refused(o: &Output, code: i32, words: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    // The row as docs/bad-input.md shows it (visible with --nocapture).
    eprintln!(
        "row: exit {:?} | {}",
        o.status.code(),
        lines.last().unwrap_or(&"")
    );
    assert_eq!(o.status.code(), Some(code), "{}", text(o));
    assert_eq!(lines.len(), 1, "one line expected: {}", text(o));
    assert!(lines[0].starts_with("zonedd: "), "{}", text(o));
    for w in words {
        assert!(lines[0].contains(w), "missing {w:?}: {}", text(o));
    }
}

/// An emulated image: `zones` zones of 1 MiB, the first `conv` conventional.
fn image(dir: &Path, name: &str, zones: u64, conv: u32) -> PathBuf {
    let path = dir.join(name);
    let mut opts = EmulateOptions::new(zones * MIB, MIB);
    opts.conventional = conv;
    drop(Emulated::create(&path, &opts).expect("create image"));
    path
}

/// A formatted 48-zone image (8 conventional); returns it and its layout.
fn formatted(dir: &Path) -> (PathBuf, dmz::format::Layout) {
    let path = image(dir, "d.img", 48, 8);
    let dev = zbd::open(&path).unwrap();
    let opts = dmz::sets::FormatOptions {
        label: Some("bad".into()),
        reserved_seq: 4,
    };
    let l = dmz::sets::format_device(dev.as_ref(), &opts, &mut |_, _| {}).unwrap();
    (path, l)
}

/// Rewrite the superblock block of `set` through `f`, optionally re-sealing its CRC.
fn edit_superblock(
    path: &Path,
    l: &dmz::format::Layout,
    set: usize,
    seal: bool,
    f: impl Fn(&mut [u8]),
) {
    let dev = zbd::open(path).unwrap();
    let off = l.mblk_offset(set, 0);
    let mut b = vec![0u8; 4096];
    dev.read_at(&mut b, off).unwrap();
    f(&mut b);
    if seal {
        let gen = u64::from_le_bytes(b[8..16].try_into().unwrap());
        b[44..48].fill(0);
        let crc = dmz::format::linux_crc32(gen as u32, &b);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
    }
    dev.write_at(&b, off).unwrap();
    dev.flush().unwrap();
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn ublk_loaded() -> bool {
    Path::new("/dev/ublk-control").exists()
}

/// The block device holding `/` (e.g. /dev/vda), when it is one.
fn root_block_device() -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    for l in info.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        if f.get(4) != Some(&"/") {
            continue;
        }
        let sep = f.iter().position(|&x| x == "-")?;
        let src = f.get(sep + 2)?.to_string();
        use std::os::unix::fs::FileTypeExt;
        let is_blk = std::fs::metadata(&src)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        if is_blk {
            return Some(src);
        }
    }
    None
}

/// A non-zoned block device this process can open for reading: /'s device or a loop device.
fn plain_block_device() -> Option<String> {
    let loops = (0..8).map(|i| format!("/dev/loop{i}"));
    root_block_device().into_iter().chain(loops).find(|d| {
        matches!(
            zbd::sysfs_zoned_model(Path::new(d)).as_deref(),
            Some("none")
        ) && std::fs::File::open(d).is_ok()
    })
}

// --- backend state --------------------------------------------------------------------------

#[test]
fn unformatted_backend() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = image(d.path(), "u.img", 48, 8);
    let o = zonedd(&["check", p(&img)]);
    refused(
        &o,
        2,
        &["no valid dm-zoned superblock", "zonedd format --backend"],
    );
}

#[test]
fn metadata_v1_superblocks() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let (img, l) = formatted(d.path());
    for set in 0..2 {
        edit_superblock(&img, &l, set, true, |b| {
            b[4..8].copy_from_slice(&1u32.to_le_bytes())
        });
    }
    // Like "not formatted": the device holds something zonedd does not read, which is the
    // user's to fix (exit 2), and it is not corruption.
    let o = zonedd(&["check", p(&img)]);
    refused(&o, 2, &["metadata v1 is not supported", "v2"]);
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("corrupt"),
        "{}",
        text(&o)
    );
}

#[test]
fn one_corrupt_superblock_is_found_then_repaired() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let (img, l) = formatted(d.path());
    edit_superblock(&img, &l, 0, false, |b| b[100] ^= 0xff);
    let o = zonedd(&["check", p(&img)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("1 error(s) detected") && last.contains("--repair"),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("bad superblock CRC"),
        "{}",
        text(&o)
    );
    let o = zonedd(&["check", p(&img), "--repair"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = zonedd(&["check", p(&img)]);
    assert_eq!(o.status.code(), Some(0), "after repair: {}", text(&o));
}

#[test]
fn both_superblocks_corrupt() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let (img, l) = formatted(d.path());
    for set in 0..2 {
        edit_superblock(&img, &l, set, false, |b| b[100] ^= 0xff);
    }
    // Nothing can be checked: refused (exit 2), the user must restore the device.
    let o = zonedd(&["check", p(&img)]);
    refused(
        &o,
        2,
        &["corrupt superblock", "superblock 0", "superblock 1", "CRC"],
    );
    let o = zonedd(&["check", p(&img), "--repair"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("corrupt superblock"),
        "{}",
        text(&o)
    );
}

// --- device shape ---------------------------------------------------------------------------

#[test]
fn device_too_small() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("s.img");
    let o = zonedd(&["emulate", p(&img), "--size", "2M", "--zone-size", "1M"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = zonedd(&["format", "--backend", p(&img)]);
    refused(&o, 2, &["not enough conventional zones", "at least 3"]);
}

#[test]
fn too_small_for_metadata_and_reserved_zones() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = image(d.path(), "s4.img", 4, 3);
    let o = zonedd(&["format", "--backend", p(&img)]);
    refused(&o, 2, &["not enough zones", "4 usable", "reserved"]);
}

#[test]
fn too_few_conventional_zones() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = image(d.path(), "c2.img", 32, 2);
    let o = zonedd(&["format", "--backend", p(&img)]);
    refused(
        &o,
        2,
        &["not enough conventional zones: 2 usable", "at least 3"],
    );
}

#[test]
fn zone_size_not_a_power_of_two() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("z.img");
    let o = zonedd(&["emulate", p(&img), "--size", "30M", "--zone-size", "3M"]);
    refused(&o, 2, &["zone size 3M is not a power of two"]);
    assert!(!img.exists(), "nothing created");
}

#[test]
fn zone_size_below_minimum() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("z.img");
    let o = zonedd(&["emulate", p(&img), "--size", "8M", "--zone-size", "512K"]);
    refused(&o, 2, &["zone size 512K is below the minimum 1M"]);
}

#[test]
fn size_not_a_multiple_of_the_zone_size() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("m.img");
    let o = zonedd(&["emulate", p(&img), "--size", "10M", "--zone-size", "4M"]);
    refused(&o, 2, &["size 10M is not a multiple of the zone size 4M"]);
    assert!(!img.exists(), "nothing created");
}

#[test]
fn more_conventional_zones_than_zones() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("c.img");
    let o = zonedd(&[
        "emulate",
        p(&img),
        "--size",
        "8M",
        "--zone-size",
        "1M",
        "--conventional",
        "9",
    ]);
    refused(&o, 2, &["9 conventional zones", "only 8 zones"]);
}

// --- existing content -----------------------------------------------------------------------

#[test]
fn existing_image_without_force() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = image(d.path(), "e.img", 8, 4);
    let o = zonedd(&["emulate", p(&img), "--size", "8M", "--zone-size", "1M"]);
    refused(&o, 2, &["already exists", "--force"]);
}

#[test]
fn already_formatted_without_force() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let (img, _) = formatted(d.path());
    let o = zonedd(&["format", "--backend", p(&img)]);
    refused(&o, 2, &["already formatted", "label \"bad\"", "--force"]);
}

#[test]
fn existing_filesystem_without_force() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = image(d.path(), "fs.img", 48, 8);
    {
        // An ext4 superblock magic at byte 1080 of (conventional) zone 0.
        let dev = zbd::open(&img).unwrap();
        let mut b = vec![0u8; 4096];
        b[1080] = 0x53;
        b[1081] = 0xEF;
        dev.write_at(&b, 0).unwrap();
        dev.flush().unwrap();
    }
    let o = zonedd(&["format", "--backend", p(&img)]);
    refused(&o, 2, &["contains an ext2/3/4 filesystem", "--force"]);
    let o = zonedd(&["format", "--backend", p(&img), "--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn mounted_device() {
    let _serial = serial();
    let Some(dev) = root_block_device() else {
        eprintln!("SKIP mounted_device: / is not on a plain block device here");
        return;
    };
    // Refused before the device is opened (and it is not zoned either): nothing is written.
    let o = zonedd(&["format", "--backend", &dev]);
    refused(&o, 2, &["is mounted on /", "unmount it first"]);
    let line = String::from_utf8_lossy(&o.stderr);
    assert_eq!(line.matches(dev.as_str()).count(), 1, "path once: {line}");
}

// --- who holds the backend ------------------------------------------------------------------

#[test]
fn backend_in_use_by_another_process() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let (img, _) = formatted(d.path());
    // What a running daemon holds: the exclusive open (flock on an image, O_EXCL on a disk).
    // Refused before doing anything (exit 2), like a mounted device or a backend a live ublk
    // device already serves: the user must stop the holder first.
    let held = zbd::open(&img).unwrap();
    let o = zonedd(&["check", p(&img)]);
    refused(&o, 2, &["in use"]);
    let o = zonedd(&["format", "--backend", p(&img), "--force"]);
    refused(&o, 2, &["in use"]);
    drop(held);
    let o = zonedd(&["check", p(&img)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

// --- environment ----------------------------------------------------------------------------

#[test]
fn missing_ublk_drv() {
    let _serial = serial();
    if ublk_loaded() {
        eprintln!("SKIP missing_ublk_drv: /dev/ublk-control exists here");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (img, _) = formatted(d.path());
    for args in [
        vec!["create", "--backend", p(&img)],
        vec!["list"],
        vec!["delete", "0"],
        vec!["recover", "0"],
        vec!["status", "0"],
        vec!["status", "0", "--watch"],
        vec!["reclaim", "0"],
        vec!["reclaim", "0", "--wait", "--json"],
    ] {
        let o = zonedd(&args);
        refused(&o, 2, &["ublk_drv is not loaded", "modprobe ublk_drv"]);
        assert!(
            o.stdout.is_empty(),
            "libublk's own hint leaked: {}",
            text(&o)
        );
    }
}

#[test]
fn not_root() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let (img, _) = formatted(d.path());
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_zonedd"))
            .args(args)
            .env_remove("RUST_LOG")
            .output()
    };
    let Ok(o) = as_nobody(&["create", "--backend", p(&img)]) else {
        eprintln!("SKIP not_root: no setpriv");
        return;
    };
    if !nix_is_root() {
        eprintln!("SKIP not_root: the tests do not run as root");
        return;
    }
    if ublk_loaded() {
        refused(&o, 2, &["zonedd create needs root"]);
    } else {
        // ublk is checked first: the missing module is the first thing to fix.
        refused(&o, 2, &["ublk_drv is not loaded"]);
    }
    // Commands that only talk to daemons: the run directory and sockets are root's.
    for (args, what) in [
        (&["list"][..], "zonedd list"),
        (&["status", "0"], "zonedd status"),
        (&["reclaim", "0", "--wait"], "zonedd reclaim"),
    ] {
        let o = as_nobody(args).unwrap();
        if ublk_loaded() {
            refused(
                &o,
                2,
                &[what, "needs root", "control sockets are root's only"],
            );
        } else {
            refused(&o, 2, &["ublk_drv is not loaded"]);
        }
    }
    // The backend itself (root's, mode 0644 after umask) cannot be opened for writing.
    let o = as_nobody(&["check", p(&img)]).unwrap();
    refused(&o, 2, &["Permission denied"]);
    let line = String::from_utf8_lossy(&o.stderr);
    assert_eq!(line.matches(p(&img)).count(), 1, "path once: {line}");
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

// --- backend path ---------------------------------------------------------------------------

#[test]
fn backend_path_missing() {
    let _serial = serial();
    let missing = "/nonexistent/zonedd-bad-input.img";
    let o = zonedd(&["format", "--backend", missing]);
    refused(&o, 2, &[missing, "No such file or directory"]);
    let o = zonedd(&["check", missing]);
    refused(&o, 2, &[missing, "No such file or directory"]);
    let o = zonedd(&["report", missing]);
    refused(&o, 2, &[missing, "No such file or directory"]);
}

#[test]
fn backend_is_a_plain_file() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("plain.txt");
    std::fs::write(&f, b"hello").unwrap();
    let o = zonedd(&["format", "--backend", p(&f)]);
    refused(
        &o,
        2,
        &[
            "regular file without the zonedd image header",
            "zonedd emulate",
        ],
    );
    let o = zonedd(&["check", p(&f)]);
    refused(&o, 2, &["regular file without the zonedd image header"]);
    assert_eq!(std::fs::read(&f).unwrap(), b"hello", "left untouched");
}

#[test]
fn backend_is_a_character_device() {
    let _serial = serial();
    let o = zonedd(&["check", "/dev/null"]);
    refused(
        &o,
        2,
        &["neither a zoned block device nor an emulated image"],
    );
}

#[test]
fn backend_is_a_regular_block_device() {
    let _serial = serial();
    let Some(dev) = plain_block_device() else {
        eprintln!("SKIP backend_is_a_regular_block_device: no readable non-zoned block device");
        return;
    };
    // check only reads: the first 8 bytes, to look for an emulated image header.
    let o = zonedd(&["check", &dev]);
    refused(
        &o,
        2,
        &["is a regular block device", "not zoned", "zonedd emulate"],
    );
}

// --- invocation -----------------------------------------------------------------------------

#[test]
fn bad_format_options() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = image(d.path(), "o.img", 48, 8);
    let o = zonedd(&["format", "--backend", p(&img), "--reserved-seq", "0"]);
    refused(&o, 2, &["--reserved-seq must be at least 1"]);
    let long = "x".repeat(40);
    let o = zonedd(&["format", "--backend", p(&img), "--label", &long]);
    refused(&o, 2, &["must be 1 to 31 bytes long"]);
}

#[test]
fn bad_create_options_before_environment() {
    let _serial = serial();
    // Argument errors are the user's to fix wherever they run: they come first.
    let o = zonedd(&["create", "--backend", "/nonexistent", "--queues", "0"]);
    refused(&o, 2, &["--queues must be >= 1"]);
    let o = zonedd(&["expose", "/nonexistent", "--queues", "0"]);
    refused(&o, 2, &["--queues must be >= 1"]);
    let o = zonedd(&[
        "create",
        "--backend",
        "/nonexistent",
        "--index-memory-mib",
        "5",
    ]);
    refused(&o, 2, &["--index-memory-mib must be between 6 and 1048576"]);
    let o = zonedd(&[
        "create",
        "--backend",
        "/nonexistent",
        "--index-memory-mib",
        "1048577",
    ]);
    refused(&o, 2, &["--index-memory-mib must be between 6 and 1048576"]);
    // clap: an unknown policy.
    let o = zonedd(&[
        "create",
        "--backend",
        "/nonexistent",
        "--compact",
        "sometimes",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("invalid value 'sometimes' for '--compact"),
        "{}",
        text(&o)
    );
    let o = zonedd(&["create", "--backend", "mem:64M", "--compact", "writes"]);
    refused(
        &o,
        2,
        &["--compact applies to log-layout volumes; mem:64M is a test target"],
    );
    let o = zonedd(&["create", "--backend", "mem:64M", "--index-memory-mib", "64"]);
    refused(
        &o,
        2,
        &["--index-memory-mib applies to log-layout volumes; mem:64M is a test target"],
    );
}

#[test]
fn bad_timing_params_before_environment() {
    let _serial = serial();
    let expose = |extra: &[&str]| {
        let mut a = vec!["expose", "/nonexistent"];
        a.extend_from_slice(extra);
        zonedd(&a)
    };
    let hdd = |kv: &str| expose(&["--timing", "hdd", "--timing-param", kv]);
    refused(
        &hdd("bogus=1"),
        2,
        &["--timing-param: unknown key \"bogus\" (keys: rpm,"],
    );
    refused(
        &hdd("rpm=fast"),
        2,
        &["--timing-param rpm=fast: \"fast\" is not a number"],
    );
    refused(
        &hdd("rpm"),
        2,
        &["--timing-param takes KEY=VALUE, not \"rpm\""],
    );
    refused(
        &hdd("disk_size=huge"),
        2,
        &["disk_size=huge: \"huge\" is not a size"],
    );
    refused(
        &hdd("avg_seek_ms=30"),
        2,
        &["0 < track_to_track_ms < avg_seek_ms < full_stroke_ms, not 0.23 / 30 / 16"],
    );
    refused(
        &hdd("inner_mbps=400"),
        2,
        &["inner_mbps 400 is above outer_mbps 261"],
    );
    refused(&hdd("queue_depth=0"), 2, &["queue_depth 1 to 256"]);
    refused(
        &hdd("rpm=0"),
        2,
        &["rpm, outer_mbps, inner_mbps and iface_mbps must be > 0"],
    );
    refused(
        &expose(&["--timing-param", "rpm=5400"]),
        2,
        &["--timing-param rpm=5400 needs --timing hdd"],
    );
    // clap: an unknown model.
    let o = expose(&["--timing", "ssd"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("invalid value 'ssd'"),
        "{}",
        text(&o)
    );
}

#[test]
fn bad_watch_interval_before_environment() {
    let _serial = serial();
    for secs in ["0", "0.01", "5000", "nan"] {
        let o = zonedd(&["status", "0", "--watch", secs]);
        refused(
            &o,
            2,
            &["--watch takes an interval between 0.1 and 3600 seconds, not"],
        );
    }
    // --json prints the counters once: it does not mix with --watch (clap, exit 2).
    let o = zonedd(&["status", "0", "--json", "--watch"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot be used with"),
        "{}",
        text(&o)
    );
}

#[test]
fn reclaim_needs_an_id() {
    let _serial = serial();
    let o = zonedd(&["reclaim", "--wait"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("required arguments were not provided"),
        "{}",
        text(&o)
    );
}

#[test]
fn metrics_address_checked_before_environment() {
    let _serial = serial();
    let o = zonedd(&[
        "create",
        "--backend",
        "/nonexistent",
        "--metrics",
        "0.0.0.0:9577",
    ]);
    refused(
        &o,
        2,
        &[
            "--metrics 0.0.0.0:9577 is not a loopback address",
            "--metrics-any-address",
        ],
    );
    let o = zonedd(&[
        "create",
        "--backend",
        "/nonexistent",
        "--metrics",
        "localhost",
    ]);
    refused(&o, 2, &["--metrics takes IP:PORT", "not localhost"]);
    // --metrics-any-address alone means nothing (clap, exit 2).
    let o = zonedd(&[
        "create",
        "--backend",
        "/nonexistent",
        "--metrics-any-address",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("required arguments were not provided"),
        "{}",
        text(&o)
    );
    // An acceptable address goes on to the environment checks (here: ublk_drv).
    if !ublk_loaded() {
        let o = zonedd(&["create", "--backend", "/nonexistent", "--metrics", "9577"]);
        refused(&o, 2, &["ublk_drv is not loaded"]);
    }
}

// --- multi-device volumes (a regular cache device in front of zoned drives) ---------------

/// Two 32-zone drives without conventional zones and an 8 MiB cache file, formatted as one
/// multi-device volume; also a third drive of another volume and a drive of 2 MiB zones.
struct Multi {
    _dir: tempfile::TempDir,
    cache: PathBuf,
    z1: PathBuf,
    z2: PathBuf,
    foreign: PathBuf,
    big_zones: PathBuf,
    plain: PathBuf,
}

fn multi() -> Multi {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let file = |name: &str| {
        let f = d.join(name);
        std::fs::File::create(&f).unwrap().set_len(8 * MIB).unwrap();
        f
    };
    let (cache, other_cache, plain) = (file("c.img"), file("c2.img"), file("plain.img"));
    let (z1, z2, foreign) = (
        image(d, "z1.img", 32, 0),
        image(d, "z2.img", 32, 0),
        image(d, "z3.img", 32, 0),
    );
    let mut o = EmulateOptions::new(64 * MIB, 2 * MIB);
    o.conventional = 0;
    let big_zones = d.join("big.img");
    drop(Emulated::create(&big_zones, &o).unwrap());
    for (c, a, b) in [(&cache, &z1, &z2), (&other_cache, &z1, &foreign)] {
        let o = zonedd(&[
            "format",
            "--cache",
            p(c),
            "--backend",
            p(a),
            "--backend",
            p(b),
            "--force",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    // z1 now belongs to the second volume: format the first one again over it.
    let o = zonedd(&[
        "format",
        "--cache",
        p(&cache),
        "--backend",
        p(&z1),
        "--backend",
        p(&z2),
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    Multi {
        _dir: dir,
        cache,
        z1,
        z2,
        foreign,
        big_zones,
        plain,
    }
}

#[test]
fn multi_several_backends_without_cache() {
    let _serial = serial();
    let m = multi();
    let o = zonedd(&["format", "--backend", p(&m.z1), "--backend", p(&m.z2)]);
    refused(&o, 2, &["multi-device volume", "--cache"]);
    let o = zonedd(&["create", "--backend", p(&m.z1), "--backend", p(&m.z2)]);
    refused(&o, 2, &["multi-device volume", "--cache"]);
}

#[test]
fn multi_zoned_device_as_cache() {
    let _serial = serial();
    let m = multi();
    let o = zonedd(&["format", "--cache", p(&m.z2), "--backend", p(&m.z1)]);
    refused(
        &o,
        2,
        &[p(&m.z2), "is a zoned device", "--cache takes a regular"],
    );
}

#[test]
fn multi_regular_device_as_backend() {
    let _serial = serial();
    let m = multi();
    let o = zonedd(&["format", "--cache", p(&m.cache), "--backend", p(&m.plain)]);
    refused(
        &o,
        2,
        &[
            p(&m.plain),
            "is a regular device or file",
            "--backend takes a zoned",
        ],
    );
}

#[test]
fn multi_same_device_twice() {
    let _serial = serial();
    let m = multi();
    let z1 = p(&m.z1);
    let o = zonedd(&[
        "format",
        "--cache",
        p(&m.cache),
        "--backend",
        z1,
        "--backend",
        z1,
    ]);
    refused(&o, 2, &[z1, "is given twice"]);
    let o = zonedd(&["format", "--cache", p(&m.cache), "--backend", p(&m.cache)]);
    refused(&o, 2, &[p(&m.cache), "is given twice"]);
}

#[test]
fn multi_different_zone_sizes() {
    let _serial = serial();
    let m = multi();
    let o = zonedd(&[
        "format",
        "--cache",
        p(&m.cache),
        "--backend",
        p(&m.z1),
        "--backend",
        p(&m.big_zones),
    ]);
    refused(
        &o,
        2,
        &[
            p(&m.big_zones),
            "zone size 2097152 bytes differs",
            "same zone size",
        ],
    );
}

#[test]
fn multi_drive_missing_at_open() {
    let _serial = serial();
    let m = multi();
    // Given but not there.
    let gone = m.z2.with_file_name("gone.img");
    let o = zonedd(&["check", "--cache", p(&m.cache), p(&m.z1), p(&gone)]);
    refused(&o, 2, &[p(&gone), "No such file or directory"]);
    // Not given: the volume is refused whole, never opened half.
    let o = zonedd(&["check", "--cache", p(&m.cache), p(&m.z1)]);
    refused(
        &o,
        2,
        &[
            "the volume spans 72 zones",
            "have 40",
            "a zoned drive is missing",
        ],
    );
    let o = zonedd(&["check", "--cache", p(&m.cache), p(&m.z1), "--repair"]);
    refused(&o, 2, &["a zoned drive is missing"]);
}

#[test]
fn multi_foreign_or_misplaced_drive() {
    let _serial = serial();
    let m = multi();
    let o = zonedd(&["check", "--cache", p(&m.cache), p(&m.z1), p(&m.foreign)]);
    refused(
        &o,
        2,
        &[
            p(&m.foreign),
            "is not a member of this volume",
            "of another volume",
        ],
    );
    let o = zonedd(&["check", "--cache", p(&m.cache), p(&m.z2), p(&m.z1)]);
    refused(&o, 2, &[p(&m.z2), "in the order they were formatted in"]);
    // The right list is clean.
    let o = zonedd(&["check", "--cache", p(&m.cache), p(&m.z1), p(&m.z2)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn multi_cache_with_a_test_target() {
    let _serial = serial();
    let m = multi();
    let o = zonedd(&["create", "--cache", p(&m.cache), "--backend", "mem:64M"]);
    refused(&o, 2, &["--cache goes with zoned backends"]);
}

/// An emulated image big enough for the log layout: `zones` zones of 2 MiB, the first 48
/// conventional (96 MiB of conventional space: the log ring alone takes 64 MiB).
fn log_image(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let mut opts = EmulateOptions::new(256 * 2 * MIB, 2 * MIB);
    opts.conventional = 48;
    drop(Emulated::create(&path, &opts).expect("create image"));
    path
}

#[test]
fn log_layout_on_a_device_too_small_for_it() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = image(d.path(), "d.img", 48, 8);
    let o = zonedd(&["format", "--backend", p(&img), "--layout", "log"]);
    refused(
        &o,
        2,
        &[
            "device too small for the log layout",
            "conventional blocks needed",
        ],
    );
}

#[test]
fn log_layout_on_a_device_with_one_open_zone() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("o.img");
    let mut opts = EmulateOptions::new(256 * 2 * MIB, 2 * MIB);
    opts.conventional = 48;
    opts.max_open = 1;
    drop(Emulated::create(&path, &opts).expect("create image"));
    let o = zonedd(&["format", "--backend", p(&path), "--layout", "log"]);
    refused(
        &o,
        2,
        &[
            "the log layout keeps 2 zones open at once (a user frontier and GC's)",
            "the device allows 1",
        ],
    );
}

#[test]
fn log_layout_with_a_cache_device() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = log_image(d.path(), "l.img");
    let cache = d.path().join("c.img");
    std::fs::write(&cache, vec![0u8; 8 << 20]).unwrap();
    let o = zonedd(&[
        "format",
        "--backend",
        p(&img),
        "--cache",
        p(&cache),
        "--layout",
        "log",
    ]);
    refused(&o, 2, &["--layout log is single-device", "--cache"]);
}

#[test]
fn bad_user_frontiers() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = log_image(d.path(), "l.img");
    let o = zonedd(&["format", "--backend", p(&img), "--user-frontiers", "2"]);
    refused(&o, 2, &["--user-frontiers applies to --layout log only"]);
    for n in ["0", "5"] {
        let o = zonedd(&[
            "format",
            "--backend",
            p(&img),
            "--layout",
            "log",
            "--user-frontiers",
            n,
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("invalid value '{n}' for '--user-frontiers <N>'")),
            "{}",
            text(&o)
        );
    }
}

#[test]
fn unknown_layout() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = log_image(d.path(), "l.img");
    let o = zonedd(&["format", "--backend", p(&img), "--layout", "bogus"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("invalid value 'bogus' for '--layout <LAYOUT>'"),
        "{}",
        text(&o)
    );
}

#[test]
fn log_layout_volume_given_to_format_and_check() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = log_image(d.path(), "l.img");
    let o = zonedd(&["format", "--backend", p(&img), "--layout", "log"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = zonedd(&["format", "--backend", p(&img)]);
    refused(
        &o,
        2,
        &["already formatted (zonedd's log layout)", "--force"],
    );
    // `check` reads the log layout too (tests/cli_log_layout.rs): a fresh volume is clean.
    let o = zonedd(&["check", p(&img)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// A formatted log-layout image with 9 MiB written through the engine (full zones).
fn written_log_image(dir: &Path) -> PathBuf {
    let img = log_image(dir, "l.img");
    let o = zonedd(&["format", "--backend", p(&img), "--layout", "log"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = zonedd(&[
        "engine-io",
        "--backend",
        p(&img),
        "write",
        "--offset",
        "0",
        "--len",
        "9M",
        "--pattern",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    img
}

/// What the engine reads back of the 9 MiB [`written_log_image`] wrote.
fn read_9m(img: &Path) -> Vec<u8> {
    let args = ["read", "--offset", "0", "--len", "9M"];
    let o = zonedd(&[&["engine-io", "--backend", p(img)][..], &args[..]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    o.stdout
}

#[test]
fn log_layout_older_superblock_slot_damaged() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = written_log_image(d.path());
    let before = read_9m(&img);
    let o = zonedd(&["check", p(&img), "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("check --json");
    let gen = j["check"]["gen"].as_u64().expect("gen");
    {
        let dev = Emulated::open(&img).unwrap();
        let older = (1 - gen % 2) * 4096;
        let mut b = vec![0u8; 4096];
        dev.read_at(&mut b, older).unwrap();
        b[100] ^= 0xFF;
        dev.write_at(&b, older).unwrap();
        dev.flush().unwrap();
    }
    let o = zonedd(&["check", p(&img)]);
    refused(
        &o,
        1,
        &[
            "l.img: 1 error(s) detected: run `zonedd check ",
            " --repair`",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("superblock slot") && out.contains("bad CRC"),
        "{out}"
    );
    // The fix the line names works, and the data is intact.
    let o = zonedd(&["check", p(&img), "--repair"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("[fixed]"), "{}", text(&o));
    assert_eq!(zonedd(&["check", p(&img)]).status.code(), Some(0));
    assert!(read_9m(&img) == before, "data changed by the repair");
}

#[test]
fn log_layout_zone_reset_outside_zonedd() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let img = written_log_image(d.path());
    {
        let dev = Emulated::open(&img).unwrap();
        let zones = dev.report_all().unwrap();
        let z = zones
            .iter()
            .find(|z| z.zone_type.is_sequential() && z.wp > z.start)
            .expect("a written sequential zone");
        dev.zone_mgmt(zbd::ZoneOp::Reset, z.id).unwrap();
    }
    let image_before = std::fs::read(&img).unwrap();
    for extra in [&[][..], &["--repair"][..]] {
        let mut args = vec!["check", p(&img)];
        args.extend_from_slice(extra);
        let o = zonedd(&args);
        refused(
            &o,
            1,
            &[
                "l.img: the engine cannot open this volume, and check --repair cannot fix it",
                "past its write pointer",
                "the zone lost data outside zonedd",
            ],
        );
    }
    assert!(
        std::fs::read(&img).unwrap() == image_before,
        "--repair wrote"
    );
    // The daemon refuses it the same way (create opens the same engine).
    let o = zonedd(&[
        "engine-io",
        "--backend",
        p(&img),
        "read",
        "--offset",
        "0",
        "--len",
        "4K",
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
}
