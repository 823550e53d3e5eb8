//! Bench: sequential write and read throughput of the emulated SMR backend
//! (`zbd::Emulated`) against plain `pwrite`/`pread` on a file of the same kind, in the same
//! run, with the same I/O size. The target is less than 10 % overhead.
//!
//! Rows:
//! - `write`: sequential 1 MiB writes into the page cache, then `fdatasync` (what
//!   `dd bs=1M conv=fdatasync` does);
//! - `write (cached)`: the same without the final sync (CPU cost of the path only);
//! - `read (cached)`: sequential 1 MiB reads of the data just written (page cache).
//!
//! Each measurement is repeated (baseline and emulated alternately) and the best run kept.
//! `ZBD_BENCH_MIB` sets the volume (default 1024), `ZBD_BENCH_RUNS` the repeats (default 5),
//! `ZBD_BENCH_DIR` the directory (default: the system temp dir). Run with
//! `cargo bench --bench backend` or `scripts/bench-backend.sh` (which adds `dd`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Instant;
use zbd::{EmulateOptions, Emulated, ZonedDevice};

const IO: usize = 1 << 20;
const ZONE: u64 = 256 << 20;

mod common;
use common::{env_u64, rate};

struct Plain(File);

trait Target {
    fn write(&self, buf: &[u8], off: u64);
    fn read(&self, buf: &mut [u8], off: u64);
    fn sync(&self);
    /// Makes the range writable again (a fresh file / reset zones).
    fn rewind(&self);
}

impl Target for Plain {
    fn write(&self, buf: &[u8], off: u64) {
        self.0.write_all_at(buf, off).expect("pwrite");
    }
    fn read(&self, buf: &mut [u8], off: u64) {
        self.0.read_exact_at(buf, off).expect("pread");
    }
    fn sync(&self) {
        self.0.sync_data().expect("fdatasync");
    }
    fn rewind(&self) {
        self.0.set_len(0).expect("truncate");
    }
}

/// The emulated device, written from its first sequential zone.
struct Emu(Emulated, u64);

impl Target for Emu {
    fn write(&self, buf: &[u8], off: u64) {
        self.0.write_at(buf, self.1 + off).expect("emulated write");
    }
    fn read(&self, buf: &mut [u8], off: u64) {
        self.0.read_at(buf, self.1 + off).expect("emulated read");
    }
    fn sync(&self) {
        self.0.flush().expect("emulated flush");
    }
    fn rewind(&self) {
        self.0.reset_all().expect("reset all");
    }
}

/// One pass: (write+sync, write cached, read cached) seconds.
fn pass(t: &dyn Target, total: u64, buf: &[u8], rbuf: &mut [u8]) -> [f64; 3] {
    t.rewind();
    t.sync();
    let s = Instant::now();
    for off in (0..total).step_by(IO) {
        t.write(buf, off);
    }
    let cached = s.elapsed().as_secs_f64();
    t.sync();
    let synced = s.elapsed().as_secs_f64();
    let s = Instant::now();
    for off in (0..total).step_by(IO) {
        t.read(rbuf, off);
    }
    let read = s.elapsed().as_secs_f64();
    [synced, cached, read]
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let total = env_u64("ZBD_BENCH_MIB", 1024).max(1) << 20;
    let runs = env_u64("ZBD_BENCH_RUNS", 5).max(1);
    let base = std::env::var("ZBD_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    let dir = tempfile::tempdir_in(&base).expect("temp dir");
    let total = total.div_ceil(ZONE) * ZONE;

    let plain_path = dir.path().join("plain");
    let plain = Plain(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&plain_path)
            .expect("create plain file"),
    );
    let mut o = EmulateOptions::new(total + 8 * ZONE, ZONE);
    o.conventional = 8;
    let emu_path = dir.path().join("emulated.img");
    let dev = Emulated::create(&emu_path, &o).expect("create image");
    let first_seq = 8 * ZONE;
    let emu = Emu(dev, first_seq);

    let buf: Vec<u8> = (0..IO).map(|i| (i * 7 + 1) as u8).collect();
    let mut rbuf = vec![0u8; IO];
    let mut best_plain = [f64::MAX; 3];
    let mut best_emu = [f64::MAX; 3];
    for _ in 0..runs {
        let p = pass(&plain, total, &buf, &mut rbuf);
        let e = pass(&emu, total, &buf, &mut rbuf);
        assert_eq!(rbuf, buf, "emulated read back wrong data");
        for i in 0..3 {
            best_plain[i] = best_plain[i].min(p[i]);
            best_emu[i] = best_emu[i].min(e[i]);
        }
    }
    println!(
        "backend bench: {} MiB sequential, {} KiB I/Os, best of {runs}, on {}",
        total >> 20,
        IO >> 10,
        dir.path().display()
    );
    println!(
        "{:<16} {:>14} {:>14} {:>8}",
        "op", "file MiB/s", "emulated MiB/s", "ratio"
    );
    for (i, name) in ["write+fdatasync", "write (cached)", "read (cached)"]
        .iter()
        .enumerate()
    {
        let p = rate(total, best_plain[i]);
        let e = rate(total, best_emu[i]);
        println!("{name:<16} {p:>14.0} {e:>14.0} {:>8.3}", e / p);
    }
}
