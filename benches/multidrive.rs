//! Bench: concurrent sequential streams on a multi-device volume whose zoned drives run on
//! the `hdd` timing model (`zbd::TimedDevice`: each request takes as long as a 7200 rpm SMR
//! drive would), one drive against two, in the same run. The cache device (metadata) is a
//! memory device without timing: the figure is the drives'.
//!
//! Workload: `DMZ_BENCH_STREAMS` (default 4) writer threads, each writing its own run of
//! `DMZ_BENCH_STREAM_CHUNKS` (default 4) chunks from their first block in 1 MiB writes (as a
//! filesystem's allocation groups give several streams), then one flush. Streams go
//! straight to sequential zones, so the volume's throughput is where those zones are:
//! - `1 drive`: cache + one drive;
//! - `2 drives, zone order`: cache + two drives, zones taken in zone order
//!   (`spread_over_drives = false`: the first drive until it is full);
//! - `2 drives, spread`: zonedd's default, each zone from the drive with the fewest zones
//!   being written.
//!
//! Each configuration runs `DMZ_BENCH_ROUNDS` (default 3) times, alternating; the median is
//! reported with the drives' busy time from the model. Target (issue 18): two drives >= 1.8x
//! one.
//!
//! Then a single timed drive's reclaim drain (a single-device volume on an SMR disk: its
//! conventional zones into its sequential zones, every switch between reading the source
//! and writing the destination a seek) per copy batch (`ReclaimOptions::copy_batch_blocks`,
//! default 8 MiB; 1 MiB is the baseline, what every copy used before). Run with `cargo bench
//! --bench multidrive`.

use std::sync::Arc;
use std::time::Instant;

use dmz::engine::{Engine, EngineOptions};
use dmz::sets::{format_device, FormatOptions};
use zbd::timing::{HddClock, HddModel, HddParams, HddStats};
use zbd::{MemDevice, MultiDevice, RegularDevice, TimedDevice, ZonedDevice};

mod common;
use common::{env_u64, rate};

const MIB: u64 = 1 << 20;
const ZONE: u64 = 32 * MIB;
/// Zones per drive: every stream's chunks fit on one drive.
const DRIVE_ZONES: u32 = 24;
/// Cache zones: the metadata and the drain's chunks.
const CACHE_ZONES: u64 = 16;

#[derive(Clone, Copy, PartialEq)]
enum Config {
    One,
    TwoInOrder,
    TwoSpread,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::One => "1 drive",
            Config::TwoInOrder => "2 drives, zone order",
            Config::TwoSpread => "2 drives, spread",
        }
    }
}

struct Run {
    mibs: f64,
    /// Per drive: busy seconds in the model, seeks.
    drives: Vec<(f64, u64)>,
}

fn drive() -> Arc<TimedDevice<MemDevice>> {
    timed_drive(DRIVE_ZONES, 0)
}

/// A drive of `zones` zones, the first `conv` conventional, on the hdd model.
fn timed_drive(zones: u32, conv: u32) -> Arc<TimedDevice<MemDevice>> {
    let mem = MemDevice::with_zones(ZONE, zones, conv).expect("drive");
    let params = HddParams {
        // A small cache, so that the figure is the media's, not the interface's.
        cache_mib: 16,
        // A 20 TB drive, the image at its start: the transfer rate is the outer zone's for
        // every configuration (on a disk the image's size, one drive holding twice the data
        // would also write it slower, nearer the inner edge).
        disk_size: 20_000_000_000_000,
        ..HddParams::default()
    };
    let model = HddModel::new(params, mem.geometry().capacity()).expect("model");
    Arc::new(TimedDevice::new(mem, Arc::new(HddClock::new(model))))
}

/// A volume of a cache device and one or two timed drives (see the module docs).
fn volume(
    nr_drives: usize,
    spread: bool,
    parallel: usize,
) -> (Engine, Vec<Arc<TimedDevice<MemDevice>>>) {
    let drives: Vec<_> = (0..nr_drives).map(|_| drive()).collect();
    let cache = Arc::new(RegularDevice::new_mem(CACHE_ZONES * ZONE, ZONE).expect("cache"));
    let members = drives
        .iter()
        .map(|d| d.clone() as Arc<dyn ZonedDevice>)
        .collect();
    let dev = Arc::new(MultiDevice::new(cache, members).expect("multi-device"));
    let o = options(spread, parallel);
    (open_formatted(dev, o), drives)
}

/// Formats `dev` and opens it with `o`.
fn open_formatted(dev: Arc<dyn ZonedDevice>, o: EngineOptions) -> Engine {
    let fo = FormatOptions {
        label: Some("bench".into()),
        reserved_seq: 1,
    };
    format_device(&*dev, &fo, &mut |_, _| {}).expect("format");
    Engine::open(dev, o).expect("open")
}

fn options(spread: bool, parallel: usize) -> EngineOptions {
    let mut o = EngineOptions::default();
    o.reclaim.idle_period = std::time::Duration::from_secs(3600);
    // Reclaim only when asked (the drain), never beside the streams or the fill.
    o.reclaim.low_free_pct = 0;
    o.reclaim.high_free_pct = 0;
    o.reclaim.throttle = std::time::Duration::ZERO;
    o.reclaim.parallel = parallel;
    o.spread_over_drives = spread;
    o
}

/// Per drive: busy seconds and seeks in the model since `before`.
fn drive_use(drives: &[Arc<TimedDevice<MemDevice>>], before: &[HddStats]) -> Vec<(f64, u64)> {
    drives
        .iter()
        .zip(before)
        .map(|(d, b)| {
            let a = d.report().stats;
            ((a.busy_ns - b.busy_ns) as f64 / 1e9, a.seeks - b.seeks)
        })
        .collect()
}

fn stats(drives: &[Arc<TimedDevice<MemDevice>>]) -> Vec<HddStats> {
    drives.iter().map(|d| d.report().stats).collect()
}

/// `streams` threads each write `per_stream` chunks from their first block, then a flush.
fn streams(cfg: Config, streams: u64, per_stream: u64) -> Run {
    let nr = if cfg == Config::One { 1 } else { 2 };
    let (e, drives) = volume(nr, cfg == Config::TwoSpread, 1);
    let chunk = e.chunk_size();
    assert!(
        e.capacity() >= streams * per_stream * chunk,
        "volume too small"
    );
    let before = stats(&drives);
    let buf: Vec<u8> = (0..MIB).map(|i| (i * 7 + 3) as u8).collect();
    let t = Instant::now();
    std::thread::scope(|s| {
        for st in 0..streams {
            let (e, buf) = (&e, &buf);
            s.spawn(move || {
                let start = st * per_stream * chunk;
                for i in 0..per_stream * chunk / MIB {
                    e.write(start + i * MIB, buf, false).expect("write");
                }
            });
        }
    });
    e.flush().expect("flush");
    let secs = t.elapsed().as_secs_f64();
    let st = e.stats();
    assert_eq!(st.reclaim_zones, 0, "streams needed no reclaim");
    e.close().expect("close");
    Run {
        mibs: rate(streams * per_stream * chunk, secs),
        drives: drive_use(&drives, &before),
    }
}

/// `chunks` chunks written into cache zones (each from its last MiB backwards: the first
/// write is not at the chunk's start), then one forced reclaim pass moves them onto the
/// drives; the figure is the drain's.
fn drain(nr_drives: usize, parallel: usize, chunks: u64) -> Run {
    let (e, drives) = volume(nr_drives, true, parallel);
    drain_volume(e, drives, chunks)
}

/// A single timed drive's drain (its conventional zones into its sequential ones) of
/// `chunks` chunks, with copies of `batch_mib` MiB at a time.
fn drain_batch(batch_mib: u64, chunks: u64) -> Run {
    let mut o = options(true, 1);
    o.reclaim.copy_batch_blocks = (batch_mib * MIB / 4096) as u32;
    // Conventional zones: the metadata's and one per chunk, with room to spare.
    let d = timed_drive(DRIVE_ZONES + CACHE_ZONES as u32, CACHE_ZONES as u32);
    drain_volume(open_formatted(d.clone(), o), vec![d], chunks)
}

/// Fills `chunks` chunks of `e` into conventional zones, then times one forced reclaim pass.
fn drain_volume(e: Engine, drives: Vec<Arc<TimedDevice<MemDevice>>>, chunks: u64) -> Run {
    let chunk = e.chunk_size();
    let buf: Vec<u8> = (0..MIB).map(|i| (i * 5 + 1) as u8).collect();
    let free_seq = e.stats().zones_free_sequential;
    for c in 0..chunks {
        for i in (0..chunk / MIB).rev() {
            e.write(c * chunk + i * MIB, &buf, false).expect("write");
        }
    }
    e.flush().expect("flush");
    let st = e.stats();
    assert_eq!(
        st.zones_free_sequential, free_seq,
        "the fill stayed in the cache: {st:?}"
    );
    let before = stats(&drives);
    let t = Instant::now();
    e.trigger_reclaim();
    e.wait_reclaim_idle();
    let secs = t.elapsed().as_secs_f64();
    let st = e.stats();
    assert_eq!(st.reclaim_zones, chunks, "every chunk moved: {st:?}");
    e.close().expect("close");
    Run {
        mibs: rate(chunks * chunk, secs),
        drives: drive_use(&drives, &before),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn table(title: &str, names: &[String], runs: &[Vec<Run>]) {
    println!("\n{title}");
    println!(
        "| configuration | MiB/s (median) | runs | drive busy s, seeks (last run) | vs first |"
    );
    println!("|---|---|---|---|---|");
    let first = median(runs[0].iter().map(|r| r.mibs).collect());
    for (name, rs) in names.iter().zip(runs) {
        let m = median(rs.iter().map(|r| r.mibs).collect());
        let all: Vec<String> = rs.iter().map(|r| format!("{:.0}", r.mibs)).collect();
        let last = rs.last().expect("rounds >= 1");
        let d: Vec<String> = last
            .drives
            .iter()
            .map(|(b, s)| format!("{b:.1} s, {s}"))
            .collect();
        println!(
            "| {name} | {m:.0} | {} | {} | {:.2}x |",
            all.join(" "),
            d.join(" / "),
            m / first
        );
    }
}

fn main() {
    let t0 = Instant::now();
    let nr_streams = env_u64("DMZ_BENCH_STREAMS", 4);
    let per_stream = env_u64("DMZ_BENCH_STREAM_CHUNKS", 4);
    let drain_chunks = env_u64("DMZ_BENCH_DRAIN_CHUNKS", 8);
    let rounds = env_u64("DMZ_BENCH_ROUNDS", 3).max(1);
    println!(
        "multi-drive bench: chunks of {} MiB, 1 MiB writes, drives on the hdd timing model \
         (20 TB disk, 16 MiB write cache), {rounds} rounds alternating, medians",
        ZONE / MIB
    );
    let cfgs = [Config::One, Config::TwoInOrder, Config::TwoSpread];
    let drains = [(1, 1), (2, 1), (2, 2)];
    let batches = [1, 4, 8, 16];
    let mut s_runs: Vec<Vec<Run>> = cfgs.iter().map(|_| Vec::new()).collect();
    let mut d_runs: Vec<Vec<Run>> = drains.iter().map(|_| Vec::new()).collect();
    let mut b_runs: Vec<Vec<Run>> = batches.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (i, &c) in cfgs.iter().enumerate() {
            s_runs[i].push(streams(c, nr_streams, per_stream));
        }
        for (i, &(d, p)) in drains.iter().enumerate() {
            d_runs[i].push(drain(d, p, drain_chunks));
        }
        for (i, &b) in batches.iter().enumerate() {
            b_runs[i].push(drain_batch(b, drain_chunks));
        }
    }
    let names: Vec<String> = cfgs.iter().map(|c| c.name().to_string()).collect();
    table(
        &format!("{nr_streams} concurrent streams x {per_stream} chunks, then a flush"),
        &names,
        &s_runs,
    );
    let names: Vec<String> = drains
        .iter()
        .map(|(d, p)| format!("{d} drive(s), reclaim parallel {p}"))
        .collect();
    table(
        &format!("reclaim drain: {drain_chunks} chunks from the cache device onto the drives"),
        &names,
        &d_runs,
    );
    let names: Vec<String> = batches
        .iter()
        .map(|b| format!("copy batch {b} MiB"))
        .collect();
    table(
        &format!(
            "reclaim drain: {drain_chunks} chunks from a single drive's conventional zones into \
             its sequential zones"
        ),
        &names,
        &b_runs,
    );
    println!("\nbench took {:.1} s", t0.elapsed().as_secs_f64());
}
