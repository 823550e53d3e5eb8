//! Seeded model-based test: random reads, writes (aligned and not to the write pointer,
//! small and large, crossing chunk ends), overwrites, discards, write-zeroes, flushes and
//! FUA writes against a plain in-memory disk, with reclaim running on small zones, clean
//! reopens and daemon crashes in between; at the end close + reopen and compare every
//! block. `DMZ_MODEL_OPS` sets the operation count (default: 1,000,000 in release builds,
//! 3,000 in debug builds); `DMZ_MODEL_SEED` the seed.

mod common;

use std::sync::Arc;

use common::*;
use dmz::engine::{Engine, VictimPolicy};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zbd::{MemDevice, ZonedDevice};

fn ops_from_env() -> u64 {
    std::env::var("DMZ_MODEL_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            3_000
        } else {
            1_000_000
        })
}

/// `DMZ_MODEL_SEED`, else `default`.
fn seed_from_env(default: u64) -> u64 {
    std::env::var("DMZ_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// How often a reopen (or crash) first runs the engine's consistency check.
const CHECK_EVERY_REOPEN: u64 = 16;

struct Run {
    dev: Arc<MemDevice>,
    e: Option<Engine>,
    model: Vec<u8>,
    rng: StdRng,
    blocks: u64,
    chunk_blocks: u64,
    last_end: u64,
    id: u64,
    policy: VictimPolicy,
    /// Victims reclaimed at once.
    parallel: usize,
    /// (op index, what, first block, blocks) of every change, for failure reports.
    history: Vec<(u64, &'static str, u64, u64)>,
    op: u64,
    /// Reopens and crashes so far: every [`CHECK_EVERY_REOPEN`]th runs the consistency check.
    reopens: u64,
    /// Writes made the hop-free way (planned by the engine, put on the device here).
    planned: u64,
}

impl Run {
    fn e(&self) -> &Engine {
        self.e.as_ref().expect("open")
    }

    fn opts(&self) -> dmz::engine::EngineOptions {
        let mut o = test_opts();
        o.reclaim.policy = self.policy;
        o.reclaim.parallel = self.parallel;
        o.cache_bitmap_blocks = 8; // force bitmap cache evictions
        o.commit_interval = std::time::Duration::from_millis(20);
        o
    }

    fn reopen(&mut self, crash: bool) {
        let e = self.e.take().expect("open");
        self.reopens += 1;
        // The check reads every bitmap back from the device: at each of the ~2,000 reopens of a
        // 1,000,000-op run it made the run 4x longer. A sample of them (and the close at the
        // end, and DMZ_MODEL_INVARIANTS=1 for every op) keeps the coverage.
        let check = self.reopens.is_multiple_of(CHECK_EVERY_REOPEN);
        match (crash, check) {
            (true, true) => common::crash(e),
            (true, false) => e.crash_for_test(),
            (false, true) => close(e),
            (false, false) => e.close().expect("engine close"),
        }
        let dev: Arc<dyn ZonedDevice> = self.dev.clone();
        self.e = Some(open(dev, self.opts()));
        if std::env::var_os("DMZ_MODEL_CHECK_REOPEN").is_some() {
            self.check_all();
        }
    }

    fn range(&mut self) -> (u64, u64) {
        let r: u32 = self.rng.gen_range(0..100);
        let len = if r < 70 {
            self.rng.gen_range(1..=8)
        } else if r < 90 {
            self.rng.gen_range(9..=64)
        } else {
            self.rng.gen_range(65..=600)
        };
        let len = len.min(self.blocks);
        let s: u32 = self.rng.gen_range(0..100);
        let start = if s < 10 {
            self.rng.gen_range(0..self.blocks / self.chunk_blocks) * self.chunk_blocks
        } else if s < 25 && self.last_end < self.blocks {
            self.last_end
        } else {
            self.rng.gen_range(0..self.blocks)
        };
        let start = start.min(self.blocks - len);
        (start, len)
    }

    fn write(&mut self, fua: bool) {
        let (start, len) = self.range();
        self.id += 1;
        let mut buf = vec![0u8; len as usize * BS];
        pattern(self.id, start, &mut buf);
        // Half the plain writes go the hop-free way where the engine plans them, as the
        // frontend's queue threads make them.
        let r = if !fua && self.rng.gen_bool(0.5) {
            common::powercut::write_planned(self.e(), start * BS as u64, &buf)
        } else {
            self.e().write(start * BS as u64, &buf, fua).map(|()| false)
        };
        if r.unwrap_or_else(|e| panic!("write {start}+{len}: {e}")) {
            self.planned += 1;
        }
        let s = start as usize * BS;
        self.model[s..s + buf.len()].copy_from_slice(&buf);
        self.last_end = start + len;
        self.history
            .push((self.op, if fua { "fua" } else { "write" }, start, len));
    }

    fn read_check(&mut self) {
        let (start, len) = self.range();
        let mut buf = vec![0u8; len as usize * BS];
        self.e()
            .read(start * BS as u64, &mut buf)
            .unwrap_or_else(|e| panic!("read {start}+{len}: {e}"));
        let s = start as usize * BS;
        if buf[..] != self.model[s..s + buf.len()] {
            let bad = (0..len as usize)
                .find(|i| buf[i * BS..(i + 1) * BS] != self.model[s + i * BS..s + (i + 1) * BS])
                .unwrap();
            let blk = start + bad as u64;
            self.fail(blk, &buf[bad * BS..(bad + 1) * BS]);
        }
    }

    fn zero(&mut self, discard: bool) {
        let (start, len) = self.range();
        let len = if self.rng.gen_bool(0.1) {
            (len * 8).min(self.blocks - start)
        } else {
            len
        };
        let (o, l) = (start * BS as u64, len * BS as u64);
        if discard {
            self.e().discard(o, l).unwrap();
        } else {
            self.e().write_zeroes(o, l).unwrap();
        }
        self.model[o as usize..(o + l) as usize].fill(0);
        self.history.push((self.op, "zero", start, len));
    }

    fn fail(&self, blk: u64, got: &[u8]) -> ! {
        let s = blk as usize * BS;
        let hist: Vec<_> = self
            .history
            .iter()
            .filter(|h| (h.2 <= blk && blk < h.2 + h.3) || h.3 == 0)
            .rev()
            .take(12)
            .collect();
        panic!(
            "block {blk} (op {}): got {:?}, expected {:?}; {}; recent changes: {hist:?}",
            self.op,
            pattern_of(got),
            pattern_of(&self.model[s..s + BS]),
            self.e().debug_chunk((blk / self.chunk_blocks) as u32)
        );
    }

    fn check_all(&self) {
        let mut got = vec![0u8; self.model.len()];
        self.e().read(0, &mut got).unwrap();
        for b in 0..self.blocks as usize {
            if got[b * BS..(b + 1) * BS] != self.model[b * BS..(b + 1) * BS] {
                self.fail(b as u64, &got[b * BS..(b + 1) * BS]);
            }
        }
    }
}

fn run(seed: u64, ops: u64, policy: VictimPolicy, parallel: usize) {
    // 40 zones of 1 MiB (256 blocks), 10 conventional: 35 chunks, 8 conventional data
    // zones, 3 reserved: free zones run out quickly and reclaim works hard.
    let dev = formatted_mem(1024, 40, 10, 3);
    let d: Arc<dyn ZonedDevice> = dev.clone();
    let mut r = Run {
        dev,
        e: None,
        model: Vec::new(),
        rng: StdRng::seed_from_u64(seed),
        blocks: 0,
        chunk_blocks: 256,
        last_end: 0,
        id: 0,
        policy,
        parallel,
        history: Vec::new(),
        op: 0,
        reopens: 0,
        planned: 0,
    };
    r.e = Some(open(d, r.opts()));
    r.blocks = r.e().capacity() / BS as u64;
    r.model = vec![0u8; r.e().capacity() as usize];
    let check_each = std::env::var_os("DMZ_MODEL_INVARIANTS").is_some();
    for i in 0..ops {
        r.op = i;
        let op: u32 = r.rng.gen_range(0..1000);
        match op {
            0..=399 => r.write(false),
            400..=439 => r.write(true),
            440..=699 => r.read_check(),
            700..=769 => r.zero(true),
            770..=799 => r.zero(false),
            800..=839 => r.e().flush().unwrap(),
            840..=849 => r.e().trigger_reclaim(),
            850..=851 => r.e().wait_reclaim_idle(),
            852 => {
                r.history.push((i, "reopen", 0, 0));
                r.reopen(false)
            }
            853 => {
                r.history.push((i, "crash", 0, 0));
                r.reopen(true)
            }
            _ => r.read_check(),
        }
        if check_each {
            if let Err(m) = r.e().debug_check() {
                panic!(
                    "op {i}: {m}; history tail {:?}",
                    &r.history[r.history.len().saturating_sub(5)..]
                );
            }
        }
        if i % 50_000 == 49_999 {
            let s = r.e().stats();
            eprintln!(
                "seed {seed}: {} ops, {} zones reclaimed, WA {:.2}, commits {}",
                i + 1,
                s.reclaim_zones,
                s.write_amplification,
                s.commits
            );
        }
    }
    r.check_all();
    let s = r.e().stats();
    eprintln!(
        "seed {seed}: {ops} ops done: {} zones reclaimed, {} blocks copied, WA {:.2}, {} planned writes",
        s.reclaim_zones, s.reclaim_blocks_copied, s.write_amplification, r.planned
    );
    assert!(
        r.planned > 0 || ops < 1000,
        "no write went the hop-free way"
    );
    r.reopen(false);
    r.check_all();
    close(r.e.take().unwrap());
}

#[test]
fn model_greedy() {
    run(
        seed_from_env(0x5eed),
        ops_from_env(),
        VictimPolicy::Greedy,
        1,
    );
}

#[test]
fn model_oldest_first() {
    run(
        0xd3,
        ops_from_env() / 4,
        VictimPolicy::DmZonedOldestFirst,
        1,
    );
}

/// Several victims reclaimed at once (`zonedd create --reclaim-max-active`): reclaims
/// race each other for destinations and chunk locks.
#[test]
fn model_parallel_reclaim() {
    run(
        seed_from_env(0x9a7),
        ops_from_env() / 4,
        VictimPolicy::Greedy,
        3,
    );
}
