//! Seeded model test of the log layout against a plain in-memory disk: random reads,
//! writes (small and large, over 256 blocks too), overwrites, discards, flushes, FUA writes
//! checkpoints and idle compactions on a small volume where GC runs all the time, with clean reopens and
//! daemon crashes (the engine dropped: everything it wrote is on the device) in between,
//! the engine's invariants checked at each reopen, and every block compared at the end.
//! `LSL_MODEL_OPS` sets the operation count (default: 1,000,000 in release builds, 5,000
//! in debug builds); `LSL_MODEL_SEED` the seed.

mod common;

use std::sync::Arc;

use common::lsl::*;
use common::*;
use dmz::lsl::{LogEngine, LogOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zbd::MemDevice;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

struct Run {
    dev: Arc<MemDevice>,
    opts: LogOptions,
    e: Option<LogEngine>,
    /// The reference disk.
    model: Vec<u8>,
    rng: StdRng,
    blocks: u64,
    id: u64,
    reopens: u64,
}

impl Run {
    fn e(&self) -> &LogEngine {
        self.e.as_ref().unwrap()
    }

    fn range(&mut self) -> (u64, u64) {
        let n = match self.rng.gen_range(0..1000) {
            0..=899 => self.rng.gen_range(1..=8),
            900..=993 => self.rng.gen_range(9..=64),
            _ => self.rng.gen_range(257..=600),
        }
        .min(self.blocks);
        (self.rng.gen_range(0..=self.blocks - n), n)
    }

    fn write(&mut self, fua: bool) {
        let (s, n) = self.range();
        self.id += 1;
        let at = s as usize * BS..(s + n) as usize * BS;
        pattern(self.id, s, &mut self.model[at.clone()]);
        self.e()
            .write(s * BS as u64, &self.model[at], fua)
            .unwrap_or_else(|err| panic!("write {s}+{n}: {err}"));
    }

    fn discard(&mut self) {
        let (s, n) = self.range();
        self.model[s as usize * BS..(s + n) as usize * BS].fill(0);
        self.e()
            .discard(s * BS as u64, n * BS as u64)
            .unwrap_or_else(|err| panic!("discard {s}+{n}: {err}"));
    }

    fn read(&mut self, s: u64, n: u64, what: &str) {
        let mut buf = vec![0u8; n as usize * BS];
        self.e()
            .read(s * BS as u64, &mut buf)
            .unwrap_or_else(|err| panic!("read {s}+{n}: {err}"));
        let want = &self.model[s as usize * BS..(s + n) as usize * BS];
        if buf != want {
            let b = (0..n as usize)
                .find(|&i| buf[i * BS..(i + 1) * BS] != want[i * BS..(i + 1) * BS])
                .unwrap();
            panic!(
                "{what}: block {} reads {:?}, the model has {:?}",
                s + b as u64,
                pattern_of(&buf[b * BS..]),
                pattern_of(&want[b * BS..])
            );
        }
    }

    /// Close (or crash), reopen, check the invariants and every block.
    fn reopen(&mut self, crash: bool) {
        let e = self.e.take().unwrap();
        e.debug_check()
            .unwrap_or_else(|m| panic!("before reopen: {m}"));
        if crash {
            drop(e);
        } else {
            e.close().expect("close");
        }
        self.e = Some(LogEngine::open(self.dev.clone(), self.opts.clone()).expect("reopen"));
        self.e()
            .debug_check()
            .unwrap_or_else(|m| panic!("after reopen: {m}"));
        self.reopens += 1;
        self.read(0, self.blocks, "after reopen");
    }
}

/// What a model run did, summed over its engines.
#[derive(Default)]
struct Totals {
    gc_zones: u64,
    checkpoints: u64,
    compacted: u64,
    page_reads: u64,
    pages_written_back: u64,
}

fn ops_count(release: u64) -> u64 {
    env_or(
        "LSL_MODEL_OPS",
        if cfg!(debug_assertions) {
            5_000
        } else {
            release
        },
    )
}

/// `nops` seeded random operations on `dev` against the model, every block compared at each
/// reopen and at the end.
fn run_model(dev: Arc<MemDevice>, opts: LogOptions, nops: u64, what: &str) -> Totals {
    let seed = env_or("LSL_MODEL_SEED", 1);
    let e = LogEngine::open(dev.clone(), opts.clone()).expect("open");
    let blocks = e.capacity() / BS as u64;
    let mut r = Run {
        dev,
        opts,
        e: Some(e),
        model: vec![0u8; blocks as usize * BS],
        rng: StdRng::seed_from_u64(seed),
        blocks,
        id: 0,
        reopens: 0,
    };
    let mut t = Totals::default();
    let (mut user, mut copied) = (0, 0);
    let t0 = std::time::Instant::now();
    for op in 0..nops {
        match r.rng.gen_range(0..1000) {
            0..=539 => r.write(false),
            540..=589 => r.write(true),
            590..=689 => r.discard(),
            690..=719 => r.e().flush().unwrap(),
            720..=721 => r.e().debug_checkpoint().unwrap(),
            722..=723 => {
                let s = r.e().stats();
                t.gc_zones += s.gc_zones_freed;
                t.checkpoints += s.checkpoints;
                user += s.user_blocks_written;
                t.page_reads += s.index_page_reads;
                t.pages_written_back += s.index_pages_written_back;
                copied += s.gc_blocks_copied + s.compact_blocks;
                r.reopen(op % 2 == 0);
            }
            724..=725 => t.compacted += r.e().debug_compact().unwrap(),
            _ => {
                let (s, n) = r.range();
                r.read(s, n, &format!("op {op}"));
            }
        }
    }
    r.reopen(false);
    eprintln!(
        "log layout model ({what}): {nops} ops (seed {seed}) in {:.1} s, {} reopens, {} GC \
         zones, {} checkpoints, {} pages compacted, {} index pages read and {} written back, \
         write amplification {:.2}",
        t0.elapsed().as_secs_f64(),
        r.reopens,
        t.gc_zones,
        t.checkpoints,
        t.compacted,
        t.page_reads,
        t.pages_written_back,
        (user + copied) as f64 / user.max(1) as f64
    );
    t
}

#[test]
fn random_ops_match_a_plain_disk() {
    // 48 zones of 256 KiB (63 data blocks each), 4 conventional: about 2,400 blocks exposed,
    // so a million ops rewrite the volume hundreds of times. Its pages are larger than the
    // room GC keeps: compaction skips them (the compaction ops test that it does no harm).
    let t = run_model(
        formatted_lsl(256, 48, 4, 48),
        lsl_test_opts(),
        ops_count(1_000_000),
        "GC pressure",
    );
    assert!(t.gc_zones > 0 && t.checkpoints > 0);
}

/// The same operations with idle compactions that run: zones of 4 MiB (1,019 data blocks,
/// a page's worth) and half the volume held back from the capacity, so that a page's
/// blocks fit in the free zones GC keeps.
#[test]
fn random_ops_with_compactions_match_a_plain_disk() {
    let dev = mem_device(4096, 24, 4);
    let opts = dmz::lsl::FormatOptions {
        op: 0.5,
        ..lsl_format_opts(48)
    };
    dmz::lsl::format(&dev, &opts).unwrap();
    let t = run_model(
        Arc::new(dev),
        lsl_test_opts(),
        ops_count(100_000),
        "compactions",
    );
    assert!(t.gc_zones > 0 && t.checkpoints > 0 && t.compacted > 0);
}

/// The same operations with the index paged: the volume's 3 pages, a cache of one (no
/// memory budget beyond the directory), so that nearly every record writes a page back and
/// most lookups read one (GC's and compaction's too).
#[test]
fn random_ops_with_a_paged_index_match_a_plain_disk() {
    let opts = LogOptions {
        index_memory: 0,
        ..lsl_test_opts()
    };
    let t = run_model(
        formatted_lsl(256, 48, 4, 48),
        opts,
        ops_count(200_000),
        "paged index",
    );
    assert!(t.gc_zones > 0 && t.checkpoints > 0);
    assert!(
        t.page_reads > 1000 && t.pages_written_back > 1000,
        "{} pages read, {} written back: the index was not paged",
        t.page_reads,
        t.pages_written_back
    );
}
