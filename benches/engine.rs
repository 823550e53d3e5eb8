//! Bench: the chunk-mapping engine (`dmz::engine::Engine`), each figure against a baseline
//! measured in the same run.
//!
//! 1. **Sequential fill** through the engine (1 MiB writes from chunk starts, then one
//!    flush; best of 3, alternating) against the backend's raw sequential writes into its sequential zones (same
//!    volume, same I/O size, then one device flush), on an emulated image file
//!    (`zbd::Emulated`, page cache). Target: engine >= 0.9x raw.
//! 2. **Random 4 KiB overwrites** at 50 % and 80 % logical fill (filled sequentially first)
//!    on a RAM device (`zbd::MemDevice`, so the figure is the engine's, not the disk's):
//!    write amplification (device bytes written / user bytes written, fill excluded) and
//!    throughput, for zonedd's policy (fresh chunks straight into sequential zones, greedy
//!    victims) and a dm-zoned-like policy in the same engine (every new chunk into a
//!    conventional zone first, oldest-first victims).
//!
//! 3. **Write + flush in place** from 1 and 4 threads (a database's fsync'd overwrites):
//!    how often a flush has to prove the records an overwrite in flight checked, and what
//!    the IOPS are with 4 writers against 1 (which never pays it).
//!
//! `DMZ_BENCH_SEQ_MIB` (default 1024) sets the sequential volume, `DMZ_BENCH_RAND_OPS`
//! (default 5000) the number of random writes, `DMZ_BENCH_DIR` the image directory.
//! Run with `cargo bench --bench engine`.

use std::sync::Arc;
use std::time::Instant;

use dmz::engine::{Engine, EngineOptions, VictimPolicy};
use dmz::sets::{format_device, FormatOptions};
use zbd::{EmulateOptions, Emulated, MemDevice, ZoneOp, ZonedDevice};

const MIB: u64 = 1 << 20;
const BS: u64 = 4096;

mod common;
use common::{env_u64, rate};

/// xorshift64*: enough randomness for offsets, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn format(dev: &dyn ZonedDevice, reserved: u32) {
    let o = FormatOptions {
        label: Some("bench".into()),
        reserved_seq: reserved,
    };
    format_device(dev, &o, &mut |_, _| {}).expect("format");
}

fn quiet_opts() -> EngineOptions {
    let mut o = EngineOptions::default();
    o.reclaim.idle_period = std::time::Duration::from_secs(3600);
    o
}

/// Sequential fill: returns (raw MiB/s, engine MiB/s).
fn sequential(dir: &std::path::Path, mib: u64) -> (f64, f64) {
    let zone = 64 * MIB;
    let nr_zones = (mib / (zone / MIB)).max(4) as u32 + 16;
    let size = nr_zones as u64 * zone;
    let path = dir.join("dmz-bench-seq.img");
    let mut eo = EmulateOptions::new(size, zone);
    eo.force = true;
    let buf: Vec<u8> = (0..MIB).map(|i| (i * 7 + 3) as u8).collect();
    let bytes = mib * MIB;

    // Raw: the backend's sequential zones, written in order.
    let dev = Emulated::create(&path, &eo).expect("create image");
    let g = dev.geometry();
    let first_seq = dev
        .report_all()
        .unwrap()
        .iter()
        .find(|z| z.zone_type.is_sequential())
        .map(|z| z.id)
        .unwrap();
    for z in first_seq..g.nr_zones {
        dev.zone_mgmt(ZoneOp::Reset, z).unwrap();
    }
    let t = Instant::now();
    let mut off = first_seq as u64 * zone;
    for _ in 0..mib {
        dev.write_at(&buf, off).unwrap();
        off += MIB;
    }
    dev.flush().unwrap();
    let raw = rate(bytes, t.elapsed().as_secs_f64());
    drop(dev);

    // Engine: the same volume from chunk 0, 1 MiB writes, one flush at the end.
    let dev = Emulated::create(&path, &eo).expect("create image");
    format(&dev, 4);
    let dev: Arc<dyn ZonedDevice> = Arc::new(dev);
    let e = Engine::open(dev, quiet_opts()).expect("open");
    assert!(e.capacity() >= bytes, "volume too small");
    let t = Instant::now();
    for i in 0..mib {
        e.write(i * MIB, &buf, false).unwrap();
    }
    e.flush().unwrap();
    let eng = rate(bytes, t.elapsed().as_secs_f64());
    let s = e.stats();
    e.close().unwrap();
    let _ = std::fs::remove_file(&path);
    println!(
        "  (engine: {} zones reclaimed, write amplification {:.3})",
        s.reclaim_zones, s.write_amplification
    );
    (raw, eng)
}

struct RandResult {
    wa: f64,
    mibs: f64,
    iops: f64,
    reclaimed: u64,
}

/// Fill `fill_pct` % of the volume sequentially, then `ops` random 4 KiB overwrites in the
/// filled part, then wait for reclaim to settle.
fn random(fill_pct: u64, ops: u64, zonedd: bool) -> RandResult {
    // 512 MiB: 128 zones of 4 MiB, 8 conventional; 4 reserved.
    let dev = MemDevice::with_zones(4 * MIB, 128, 8).unwrap();
    format(&dev, 4);
    let dev: Arc<dyn ZonedDevice> = Arc::new(dev);
    let mut o = quiet_opts();
    if !zonedd {
        o.direct_sequential = false;
        o.reclaim.policy = VictimPolicy::DmZonedOldestFirst;
    }
    let e = Engine::open(dev, o).expect("open");
    let filled = e.capacity() * fill_pct / 100 / MIB * MIB;
    let buf = vec![0x5au8; MIB as usize];
    for off in (0..filled).step_by(MIB as usize) {
        e.write(off, &buf, false).unwrap();
    }
    e.flush().unwrap();
    e.trigger_reclaim();
    e.wait_reclaim_idle();
    let s0 = e.stats();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let blk = vec![0xa5u8; BS as usize];
    let t = Instant::now();
    for i in 0..ops {
        let off = rng.next() % (filled / BS) * BS;
        e.write(off, &blk, false).unwrap();
        if i % 1024 == 1023 {
            e.flush().unwrap();
        }
    }
    e.flush().unwrap();
    let secs = t.elapsed().as_secs_f64();
    let s1 = e.stats();
    e.close().unwrap();
    let user = s1.write_bytes - s0.write_bytes;
    let dev_bytes = s1.device_bytes_written - s0.device_bytes_written;
    RandResult {
        wa: dev_bytes as f64 / user as f64,
        mibs: rate(user, secs),
        iops: ops as f64 / secs,
        reclaimed: s1.reclaim_zones - s0.reclaim_zones,
    }
}

struct FsyncResult {
    iops: f64,
    flushes: u64,
    proofs: u64,
}

/// `writers` threads each write a random 4 KiB block of a 16 MiB working set in place (the
/// chunks' data zones are conventional) and flush after every write, `ops` writes in all,
/// after one pass over the set (no commit: the zones' records are in the log). Proof
/// flushes (design.md, "Why proven must be durable before overwrites") come from a write
/// meeting its zone's record flushed but unproven (with any number of writers) and from a
/// flush that covered a record an overwrite in flight had checked (only with several: one
/// writer never has an overwrite in flight during its flush).
fn fsync_overwrites(writers: u64, ops: u64) -> FsyncResult {
    let dev = MemDevice::with_zones(4 * MIB, 32, 12).unwrap();
    format(&dev, 2);
    let mut o = quiet_opts();
    o.direct_sequential = false;
    let e = Engine::open(Arc::new(dev), o).expect("open");
    let set = 16 * MIB;
    let buf = vec![0x5au8; MIB as usize];
    for off in (0..set).step_by(MIB as usize) {
        e.write(off, &buf, false).unwrap();
    }
    e.flush().unwrap();
    let s0 = e.stats();
    let t = Instant::now();
    std::thread::scope(|sc| {
        for w in 0..writers {
            let e = &e;
            sc.spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (w + 1));
                let blk = vec![w as u8; BS as usize];
                for _ in 0..ops / writers {
                    e.write(rng.next() % (set / BS) * BS, &blk, false).unwrap();
                    e.flush().unwrap();
                }
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    let s1 = e.stats();
    e.close().unwrap();
    FsyncResult {
        iops: (ops / writers * writers) as f64 / secs,
        flushes: s1.flushes - s0.flushes,
        proofs: s1.proof_flushes - s0.proof_flushes,
    }
}

fn main() {
    let t0 = Instant::now();
    let dir = std::env::var("DMZ_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    let mib = env_u64("DMZ_BENCH_SEQ_MIB", 1024);
    let ops = env_u64("DMZ_BENCH_RAND_OPS", 5_000);

    println!(
        "engine bench: sequential {mib} MiB on an emulated image in {}",
        dir.display()
    );
    // Alternate baseline and engine, keep the best of each (page-cache noise).
    let (mut raw, mut eng) = (0f64, 0f64);
    for _ in 0..3 {
        let (r, e) = sequential(&dir, mib);
        raw = raw.max(r);
        eng = eng.max(e);
    }
    println!("| workload | baseline | engine | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| sequential fill, 1 MiB writes | raw backend {raw:.0} MiB/s | {eng:.0} MiB/s | {:.2}x |",
        eng / raw
    );

    println!("\nrandom 4 KiB overwrites, {ops} writes (flush every 1024), 512 MiB RAM device, 4 MiB zones, 8 conventional");
    println!("| fill | policy | write amplification | MiB/s | IOPS | zones reclaimed |");
    println!("|---|---|---|---|---|---|");
    for fill in [50, 80] {
        let d = random(fill, ops, false);
        let z = random(fill, ops, true);
        for (name, r) in [("dm-zoned-like", &d), ("zonedd", &z)] {
            println!(
                "| {fill} % | {name} | {:.2} | {:.1} | {:.0} | {} |",
                r.wa, r.mibs, r.iops, r.reclaimed
            );
        }
        println!(
            "| {fill} % | zonedd / dm-zoned-like | {:.2}x | {:.2}x | | |",
            z.wa / d.wa,
            z.mibs / d.mibs
        );
    }
    println!("\nwrite + flush, 4 KiB in place, {ops} writes over a 16 MiB working set in conventional zones, RAM device");
    println!("| writers | IOPS | flushes | proof flushes | proof flushes per flush |");
    println!("|---|---|---|---|---|");
    let one = fsync_overwrites(1, ops);
    let four = fsync_overwrites(4, ops);
    for (n, r) in [(1, &one), (4, &four)] {
        println!(
            "| {n} | {:.0} | {} | {} | {:.3} |",
            r.iops,
            r.flushes,
            r.proofs,
            r.proofs as f64 / r.flushes.max(1) as f64
        );
    }
    println!("| 4 / 1 | {:.2}x | | | |", four.iops / one.iops);
    println!("\nbench took {:.1} s", t0.elapsed().as_secs_f64());
}
