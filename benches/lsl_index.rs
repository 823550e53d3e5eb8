//! Bench: the log layout's paged index (`dmz::lsl`, docs/design.md "The paged index"), each
//! figure against the same workload with every page cached, in the same run.
//!
//! The volume is filled sequentially (1 MiB writes: its pages become directory extents),
//! then random 4 KiB overwrites over the whole volume (a flush every 256) and random 4 KiB
//! reads, with the index cache holding every page (the baseline), a quarter of them, and a
//! sixteenth: IOPS and their ratio to the baseline, index page reads (misses) and pages
//! written back per operation, write amplification.
//! 1. On a RAM device (`zbd::MemDevice`): the CPU cost of misses and write-backs.
//! 2. On the hdd timing model (`zbd::TimedDevice`, a 7200 rpm SMR drive): the disk's cost,
//!    each miss a 4 KiB read in the conventional zones at the start of the disk, each
//!    write-back a flush and 4 KiB writes there.
//!
//! `LSL_BENCH_RAM_OPS` (default 40000) and `LSL_BENCH_HDD_OPS` (default 2000) set the
//! writes (and as many reads, a quarter on the hdd model). Run with
//! `cargo bench --bench lsl_index`.

use std::sync::Arc;
use std::time::Instant;

use dmz::lsl::{format, FormatOptions, LogEngine, LogOptions, LogStats};
use zbd::timing::{HddClock, HddModel, HddParams};
use zbd::{MemDevice, TimedDevice, ZonedDevice};

mod common;
use common::{env_u64, rate};

const MIB: u64 = 1 << 20;
const BS: u64 = 4096;
/// Blocks an index page maps.
const PAGE_BLOCKS: u64 = 1020;
/// What a cached page costs, and what the engine keeps for the rest of its state
/// (`lsl/index.rs`): the budget that gives a cache of `pages`.
const PAGE_COST: u64 = 4096 + 80;
const OTHER_STATE: u64 = 4 << 20;

/// xorshift64*: enough randomness for offsets, no dependency.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

struct Result {
    fill_mibs: f64,
    write_iops: f64,
    read_iops: f64,
    stats: LogStats,
}

/// Fill `dev` (already formatted) sequentially, then `writes` random 4 KiB writes and
/// `reads` random 4 KiB reads, with an index cache of `cache_pages` pages (`None`: the
/// default budget, every page cached).
fn run(dev: Arc<dyn ZonedDevice>, cache_pages: Option<u64>, writes: u64, reads: u64) -> Result {
    let probe = LogEngine::open(dev.clone(), LogOptions::default()).expect("open");
    let blocks = probe.capacity() / BS;
    let pages = blocks.div_ceil(PAGE_BLOCKS);
    probe.close().expect("close");
    let index_memory = match cache_pages {
        Some(c) => OTHER_STATE + pages * 4 + c * PAGE_COST,
        None => LogOptions::default().index_memory,
    };
    let e = LogEngine::open(
        dev,
        LogOptions {
            index_memory,
            ..LogOptions::default()
        },
    )
    .expect("open");
    let chunk = vec![0x5au8; MIB as usize];
    let mut at = 0;
    let t = Instant::now();
    while at + MIB <= blocks * BS {
        e.write(at, &chunk, false).expect("fill");
        at += MIB;
    }
    e.flush().expect("flush");
    let fill_mibs = rate(at, t.elapsed().as_secs_f64());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let block = vec![0xa5u8; BS as usize];
    let t = Instant::now();
    for i in 0..writes {
        e.write(rng.below(blocks) * BS, &block, false)
            .expect("write");
        if i % 256 == 255 {
            e.flush().expect("flush");
        }
    }
    e.flush().expect("flush");
    let write_iops = writes as f64 / t.elapsed().as_secs_f64();
    let mut buf = vec![0u8; BS as usize];
    let t = Instant::now();
    for _ in 0..reads {
        e.read(rng.below(blocks) * BS, &mut buf).expect("read");
    }
    let read_iops = reads as f64 / t.elapsed().as_secs_f64();
    let stats = e.stats();
    e.close().expect("close");
    Result {
        fill_mibs,
        write_iops,
        read_iops,
        stats,
    }
}

fn formatted(dev: &dyn ZonedDevice) {
    let o = FormatOptions {
        label: Some("bench".into()),
        log_blocks: 4096,
        ..FormatOptions::default()
    };
    format(dev, &o).expect("format");
}

fn table(what: &str, make: &dyn Fn() -> Arc<dyn ZonedDevice>, writes: u64, reads: u64) {
    let probe = make();
    let pages = {
        let e = LogEngine::open(probe, LogOptions::default()).expect("open");
        (e.capacity() / BS).div_ceil(PAGE_BLOCKS)
    };
    println!("\n{what}: {pages} index pages, {writes} random writes, {reads} random reads");
    println!("| cache | fill MiB/s | write IOPS | x all cached | read IOPS | x all cached | page reads / op | written back / write | WA |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let base = run(make(), None, writes, reads);
    for (name, cache) in [
        ("all pages", None),
        ("1/4 of the pages", Some(pages / 4)),
        ("1/16 of the pages", Some((pages / 16).max(1))),
    ] {
        let r = if cache.is_none() {
            Result {
                fill_mibs: base.fill_mibs,
                write_iops: base.write_iops,
                read_iops: base.read_iops,
                stats: base.stats.clone(),
            }
        } else {
            run(make(), cache, writes, reads)
        };
        let s = &r.stats;
        println!(
            "| {name} ({} pages) | {:.0} | {:.0} | {:.2}x | {:.0} | {:.2}x | {:.2} | {:.2} | {:.2} |",
            s.index_cache_pages.min(pages),
            r.fill_mibs,
            r.write_iops,
            r.write_iops / base.write_iops,
            r.read_iops,
            r.read_iops / base.read_iops,
            s.index_page_reads as f64 / (writes + reads) as f64,
            s.index_pages_written_back as f64 / writes as f64,
            s.write_amplification
        );
    }
}

fn main() {
    let t0 = Instant::now();
    let ram_ops = env_u64("LSL_BENCH_RAM_OPS", 40_000);
    let hdd_ops = env_u64("LSL_BENCH_HDD_OPS", 2_000);
    table(
        "RAM device, 1 GiB, 4 MiB zones, 16 conventional",
        &|| {
            let d = MemDevice::with_zones(4 * MIB, 256, 16).expect("mem");
            formatted(&d);
            Arc::new(d) as Arc<dyn ZonedDevice>
        },
        ram_ops,
        ram_ops,
    );
    table(
        "hdd timing model, 256 MiB, 4 MiB zones, 16 conventional",
        &|| {
            let mem = MemDevice::with_zones(4 * MIB, 64, 16).expect("mem");
            formatted(&mem);
            let model =
                HddModel::new(HddParams::default(), mem.geometry().capacity()).expect("model");
            Arc::new(TimedDevice::new(mem, Arc::new(HddClock::new(model)))) as Arc<dyn ZonedDevice>
        },
        hdd_ops,
        hdd_ops / 4,
    );
    println!("\nbench took {:.1} s", t0.elapsed().as_secs_f64());
}
