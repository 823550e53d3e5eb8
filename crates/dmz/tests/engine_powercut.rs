//! Power cuts at every device-write boundary of seeded workloads, on zbd's FaultyDevice:
//! after the cut (dropping all, none, or random subsets of the unflushed writes) the
//! metadata must load, every write acknowledged by a flush or a FUA write must read back
//! exactly (or a later acknowledged overwrite), and no block may return data never
//! written to it. Release builds run at least 10,000 crash points; the count is printed.

mod common;

use std::sync::Arc;

use common::powercut::{run_with, verify_upto, Op};
use common::*;
use dmz::engine::{Engine, EngineOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zbd::{FaultyDevice, ZonedDevice};

fn workload(seed: u64, n: usize, blocks: u64, chunk: u64) -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ops = Vec::new();
    let mut last_end = 0;
    for _ in 0..n {
        let r: u32 = rng.gen_range(0..100);
        let len = if rng.gen_bool(0.8) {
            rng.gen_range(1..=8)
        } else {
            rng.gen_range(9..=2 * chunk)
        };
        let len = len.min(blocks);
        let start = match rng.gen_range(0..100) {
            0..=14 => rng.gen_range(0..blocks / chunk) * chunk,
            15..=34 => last_end,
            _ => rng.gen_range(0..blocks),
        }
        .min(blocks - len);
        ops.push(match r {
            0..=54 => Op::Write {
                start,
                len,
                fua: false,
            },
            55..=64 => Op::Write {
                start,
                len,
                fua: true,
            },
            65..=79 => Op::Discard { start, len },
            _ => Op::Flush,
        });
        if let Some(Op::Write { start, len, .. }) = ops.last() {
            last_end = start + len;
        }
    }
    ops
}

/// One crash point: the power cut after device write `k` of `seed`'s workload, keeping all
/// (`pat` 0), none (1) or a random half (2) of the unflushed writes; `planned`: the
/// workload's writes go the hop-free way where the engine plans them (`run_with`).
#[derive(Clone, Copy)]
struct Cut {
    seed: u64,
    k: u64,
    pat: u64,
    planned: bool,
}

/// Run `ops` on a copy of `template` until the power goes at `cut`, then reopen and verify.
fn cut_and_verify(
    template: &zbd::MemDevice,
    opts: &EngineOptions,
    ops: &[Op],
    cap_blocks: u64,
    cut: Cut,
) {
    let Cut {
        seed,
        k,
        pat,
        planned,
    } = cut;
    let dev = Arc::new(FaultyDevice::new(template.snapshot()).unwrap());
    dev.cut_power_after_writes(k);
    let (done, upto) = match Engine::open(dev.clone(), opts.clone()) {
        Ok(e) => {
            let d = run_with(&e, ops, planned);
            // The device is dead: no consistency check (it reads bitmaps).
            e.crash_for_test();
            d
        }
        Err(_) => (0, 1),
    };
    let mut rng = StdRng::seed_from_u64(seed * 1_000_003 + k * 7 + pat);
    let keep: Vec<bool> = (0..dev.pending_writes())
        .map(|_| match pat {
            0 => true,
            1 => false,
            _ => rng.gen_bool(0.5),
        })
        .collect();
    dev.power_cut(|i| keep[i]).unwrap();
    let what = format!("seed {seed} cut after write {k} pattern {pat}");
    let d2: Arc<dyn ZonedDevice> = dev.clone();
    let e =
        Engine::open(d2, opts.clone()).unwrap_or_else(|err| panic!("{what}: reopen failed: {err}"));
    verify_upto(&e, ops, done, upto, cap_blocks, &what);
    crash(e);
}

#[test]
fn power_cut_at_every_write() {
    let release = !cfg!(debug_assertions);
    let seeds: u64 = if release { 20 } else { 1 };
    // DMZ_POWERCUT_FIRST_SEED: explore other workloads (a long run before a release).
    let first: u64 = std::env::var("DMZ_POWERCUT_FIRST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let nops = if release { 70 } else { 40 };
    // 24 zones of 256 KiB (64 blocks), 8 conventional: 20 chunks, reclaim needed.
    let template = formatted_mem(256, 24, 8, 2);
    let mut points = 0u64;
    let mut nr_planned = 0u64;
    let mut slow = std::time::Duration::ZERO;
    let start = std::time::Instant::now();
    for seed in first..first + seeds {
        // Dry run: how many device writes the workload makes.
        let dev = Arc::new(FaultyDevice::new(template.snapshot()).unwrap());
        let e = open(dev.clone(), power_cut_opts());
        let cap_blocks = e.capacity() / BS as u64;
        let ops = workload(seed, nops, cap_blocks, e.chunk_size() / BS as u64);
        // Odd seeds make their writes the hop-free way where the engine plans them.
        let planned = seed % 2 == 1;
        assert_eq!(run_with(&e, &ops, planned).0, ops.len());
        nr_planned += e.stats().planned_writes;
        crash(e);
        let total = dev.write_count();
        eprintln!(
            "seed {seed}: {total} device writes; {points} points so far, {:.1} s, slowest {slow:?}",
            start.elapsed().as_secs_f64()
        );
        let step = if release { 1 } else { 3 };
        for k in (0..=total).step_by(step) {
            for pat in 0..3u64 {
                let t0 = std::time::Instant::now();
                let cut = Cut {
                    seed,
                    k,
                    pat,
                    planned,
                };
                cut_and_verify(&template, &power_cut_opts(), &ops, cap_blocks, cut);
                points += 1;
                slow = slow.max(t0.elapsed());
            }
        }
    }
    eprintln!("power-cut test: {points} crash points verified, {nr_planned} planned writes");
    if release {
        assert!(nr_planned > 0, "no write went the hop-free way");
        assert!(points >= 10_000, "only {points} crash points");
    }
}

/// In-place overwrites of conventional zones between commits: after a commit, an overwrite
/// of valid blocks needs no log record (`unlogged_overwrites`), and a power cut at any
/// write boundary still leaves every flushed write readable and no block with data never
/// written to it. Small writes over one chunk, commits among the flushes; the chunk in a
/// conventional data zone (`direct_sequential` off: every new chunk starts there), or in a
/// sequential data zone with a conventional buffer (the default: a first write near the
/// chunk's start is an early stream piece).
#[test]
fn power_cut_at_every_write_with_unlogged_overwrites() {
    for direct_sequential in [false, true] {
        let (points, unlogged, _) = unlogged_overwrite_cuts(direct_sequential, false);
        eprintln!(
            "unlogged-overwrite power cuts, direct_sequential {direct_sequential}: {points} \
             points, {unlogged} unlogged overwrites"
        );
        assert!(
            unlogged > 0,
            "the workload never overwrote without a record"
        );
    }
}

/// The same workloads with their writes made the hop-free way (`Engine::plan_write`, the
/// data put on the device by the caller, as the frontend's queue threads do) wherever the
/// engine plans them: the same guarantees at every cut.
#[test]
fn power_cut_at_every_write_with_planned_writes() {
    for direct_sequential in [false, true] {
        let grouped = common::powercut::grouped_plans;
        let before = grouped();
        let (points, unlogged, planned) = unlogged_overwrite_cuts(direct_sequential, true);
        eprintln!(
            "planned-write power cuts, direct_sequential {direct_sequential}: {points} points, \
             {planned} planned writes, {} in flight with others in the runs to the cuts, \
             {unlogged} unlogged overwrites",
            grouped() - before
        );
        assert!(planned > 0, "the workload never made a planned write");
        if !direct_sequential {
            assert!(
                grouped() > before,
                "no two plans were ever in flight together"
            );
        }
    }
}

/// Returns (crash points, unlogged overwrites and planned writes in the dry runs).
const DEBUG_SEED: u64 = 3;

fn unlogged_overwrite_cuts(direct_sequential: bool, planned: bool) -> (u64, u64, u64) {
    let release = !cfg!(debug_assertions);
    // A debug build runs one seed: one whose workload makes planned writes with and without
    // `direct_sequential` (seed 0's makes none with it).
    let seeds = if release {
        0..4
    } else {
        DEBUG_SEED..DEBUG_SEED + 1
    };
    let template = formatted_mem(256, 24, 8, 2);
    let mut opts = power_cut_opts();
    opts.direct_sequential = direct_sequential;
    let mut points = 0u64;
    let mut unlogged = 0u64;
    let mut nr_planned = 0u64;
    for seed in seeds {
        let mut rng = StdRng::seed_from_u64(seed + 100);
        let dev = Arc::new(FaultyDevice::new(template.snapshot()).unwrap());
        let e = open(dev.clone(), opts.clone());
        let chunk = e.chunk_size() / BS as u64;
        let span = chunk;
        let cap_blocks = e.capacity() / BS as u64;
        let ops: Vec<Op> = (0..60)
            .map(|_| match rng.gen_range(0..100) {
                0..=69 => {
                    let len = rng.gen_range(1..=4);
                    Op::Write {
                        start: rng.gen_range(0..span - len),
                        len,
                        fua: rng.gen_bool(0.1),
                    }
                }
                70..=86 => Op::Flush,
                _ => Op::Commit,
            })
            .collect();
        assert_eq!(run_with(&e, &ops, planned).0, ops.len());
        unlogged += e.stats().unlogged_overwrites;
        nr_planned += e.stats().planned_writes;
        crash(e);
        let total = dev.write_count();
        for k in 0..=total {
            for pat in 0..3u64 {
                let cut = Cut {
                    seed,
                    k,
                    pat,
                    planned,
                };
                cut_and_verify(&template, &opts, &ops, cap_blocks, cut);
                points += 1;
            }
        }
    }
    (points, unlogged, nr_planned)
}

/// Holds back one device write (the one whose data is `data`) until the test lets it go,
/// so that a flush can run while an overwrite is between its check and its data.
struct Gate {
    dev: Arc<FaultyDevice<zbd::MemDevice>>,
    data: Vec<u8>,
    arrived: std::sync::mpsc::SyncSender<usize>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Gate {
    fn hold(&self, bufs: &[&[u8]]) {
        if bufs.len() == 1 && bufs[0] == &self.data[..] {
            self.arrived.send(self.dev.pending_writes()).unwrap();
            self.release.lock().unwrap().recv().unwrap();
        }
    }
}

impl ZonedDevice for Gate {
    fn geometry(&self) -> zbd::Geometry {
        self.dev.geometry()
    }
    fn report_zones(&self, first: u32, nr: u32) -> zbd::Result<Vec<zbd::Zone>> {
        self.dev.report_zones(first, nr)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> zbd::Result<()> {
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> zbd::Result<()> {
        self.hold(&[buf]);
        self.dev.write_at(buf, offset)
    }
    fn writev_at(&self, bufs: &[&[u8]], offset: u64) -> zbd::Result<()> {
        self.hold(bufs);
        self.dev.writev_at(bufs, offset)
    }
    fn zone_mgmt(&self, op: zbd::ZoneOp, zone: u32) -> zbd::Result<()> {
        self.dev.zone_mgmt(op, zone)
    }
    fn reset_all(&self) -> zbd::Result<()> {
        self.dev.reset_all()
    }
    fn flush(&self) -> zbd::Result<()> {
        self.dev.flush()
    }
    fn describe(&self) -> String {
        self.dev.describe()
    }
}

/// A flush that covers the record of a write in place while an overwrite of the same block
/// is between its check and its data (design.md, "Why proven must be durable before
/// overwrites"): the flush must prove that record before it returns. Otherwise a power cut
/// that keeps the overwrite's data and drops its record leaves the flushed record unproven,
/// replay checks its CRC against the new data, drops it, and the block reads as never
/// written: a flushed write lost.
#[test]
fn a_flush_during_an_overwrite_in_place_proves_what_it_overwrites() {
    let template = formatted_mem(256, 24, 8, 2);
    let dev = Arc::new(FaultyDevice::new(template.snapshot()).unwrap());
    let mut opts = power_cut_opts();
    opts.direct_sequential = false; // the chunk's data zone is conventional
    let (blk, a, b) = (5u64, 1u64, 2u64);
    let block = |id| {
        let mut v = vec![0u8; BS];
        pattern(id, blk, &mut v);
        v
    };
    let (arrived_tx, arrived) = std::sync::mpsc::sync_channel(1);
    let (release, release_rx) = std::sync::mpsc::channel();
    let gate = Arc::new(Gate {
        dev: dev.clone(),
        data: block(b),
        arrived: arrived_tx,
        release: std::sync::Mutex::new(release_rx),
    });
    let e = open(gate, opts.clone());
    let off = blk * BS as u64;
    e.write(off, &block(a), false).unwrap();
    std::thread::scope(|s| {
        let w = s.spawn(|| e.write(off, &block(b), false));
        // The overwrite checked the block's record (not flushed yet) and is at its data.
        arrived.recv().unwrap();
        let proofs = e.stats().proof_flushes;
        e.flush().unwrap(); // write `a` is now durable
        assert_eq!(dev.pending_writes(), 0, "the flush left writes unflushed");
        assert_eq!(
            e.stats().proof_flushes,
            proofs + 1,
            "the flush proved nothing"
        );
        release.send(()).unwrap();
        w.join().unwrap().unwrap();
    });
    assert_eq!(
        arrived.try_recv().ok(),
        None,
        "the overwrite's data was written once"
    );
    dev.cut_power_after_writes(0);
    e.crash_for_test();
    // Keep the overwrite's data (the first write after the flush), drop its record.
    dev.power_cut(|i| i == 0).unwrap();
    let e = open(dev.clone(), opts);
    let mut got = vec![0u8; BS];
    e.read(off, &mut got).unwrap();
    let id = block_id(&got, blk).unwrap();
    assert!(
        id == a || id == b,
        "block {blk} reads as write {id}: the flushed write {a} was lost"
    );
    crash(e);
}

/// Pattern data of write `id` for blocks `b..b + n`.
fn blocks_of(id: u64, b: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n * BS];
    pattern(id, b, &mut v);
    v
}

/// The write block `b` of `e` holds (0: zeros); panics on damaged data.
fn id_at(e: &Engine, b: u64) -> u64 {
    let mut got = vec![0u8; BS];
    e.read(b * BS as u64, &mut got).unwrap();
    block_id(&got, b).unwrap()
}

/// Reclaim's fallback when no sequential zone is free copies the data zone's blocks into the
/// buffer in place: the records that validated the buffer's overwritten blocks must be proven
/// first. Here the buffer's block 12 (write 3, flushed) is invalidated by an unsynced write
/// at the data zone's write pointer, and reclaim's copy overwrites it; a power cut keeping the
/// copies (reclaim flushes them) and nothing after must still read write 3 (or 5).
#[test]
fn reclaim_into_the_buffer_proves_what_it_overwrites() {
    // 9 zones of 1 MiB: 6 conventional (2 for the sets), 3 sequential, one reserved; a
    // sequential zone offline takes the reserve's place: 2 for data, none left.
    let template = formatted_mem(1024, 9, 6, 1);
    template
        .set_condition(8, zbd::ZoneCondition::Offline)
        .unwrap();
    let dev = Arc::new(FaultyDevice::new(template.snapshot()).unwrap());
    let opts = power_cut_opts();
    let e = open(dev.clone(), opts.clone());
    let cs = e.chunk_size() / BS as u64;
    let w =
        |b: u64, n: usize, id: u64| e.write(b * BS as u64, &blocks_of(id, b, n), false).unwrap();
    w(0, 10, 1); // chunk 0 streams into a sequential zone, write pointer 10
    w(3, 1, 2); // below the write pointer: the buffer
    w(12, 1, 3); // past it: the buffer
    w(cs, 4, 4); // chunk 1 takes the last sequential zone
    e.flush().unwrap(); // write 3 is durable
    assert_eq!(e.stats().zones_free_sequential, 0);
    // At the write pointer, invalidating the buffer's block 12; its record is not written.
    let _u = e
        .write_unsynced(10 * BS as u64, &blocks_of(5, 10, 3), false, &|| {})
        .unwrap();
    assert!(e.debug_reclaim_chunk(0, true).unwrap());
    dev.cut_power_after_writes(0);
    e.crash_for_test();
    dev.power_cut(|_| false).unwrap();
    let e = open(dev.clone(), opts);
    let id = id_at(&e, 12);
    assert!(
        id == 3 || id == 5,
        "block 12 reads as write {id}: the flushed write 3 was lost"
    );
    crash(e);
}

/// A daemon killed after an overwrite in place put its data on the device, before the log
/// had its record: the blocks must read as the acknowledged write before it or as the
/// overwrite, never as unwritten (replay checks the earlier, unproven record's CRC against
/// the data). Two cases: blocks valid in the zone (a record is written ahead of the data),
/// and blocks invalid there whose invalidating record is still in the log buffer (the log
/// is written up to it before the data).
#[test]
fn a_daemon_killed_during_an_overwrite_in_place_keeps_the_acknowledged_write() {
    let mut opts = power_cut_opts();
    opts.direct_sequential = false; // the chunk's data zone is conventional
    let dev = formatted_mem(256, 24, 8, 2);
    let e = open(dev.clone(), opts.clone());
    e.write(5 * BS as u64, &blocks_of(1, 5, 1), false).unwrap();
    let before = e.stats().written_ahead;
    // The overwrite's data is on the device; its acknowledgement (the log write) is not.
    let _u = e
        .write_unsynced(5 * BS as u64, &blocks_of(2, 5, 1), false, &|| {})
        .unwrap();
    assert_eq!(e.stats().written_ahead, before + 1);
    e.crash_for_test();
    let e = open(dev.clone(), opts);
    let id = id_at(&e, 5);
    assert!(
        id == 1 || id == 2,
        "block 5 reads as write {id}: the acknowledged write 1 was lost"
    );
    crash(e);

    // Buffer block 12 (write 3, acknowledged) is invalidated by an unsynced write at the data
    // zone's write pointer, then overwritten in the buffer by an unsynced write.
    let opts = power_cut_opts();
    let dev = formatted_mem(256, 24, 8, 2);
    let e = open(dev.clone(), opts.clone());
    e.write(0, &blocks_of(1, 0, 10), false).unwrap(); // a sequential data zone, wp 10
                                                      // The buffer: block 12, and block 14, which keeps it mapped.
    e.write(12 * BS as u64, &blocks_of(3, 12, 1), false)
        .unwrap();
    e.write(14 * BS as u64, &blocks_of(6, 14, 1), false)
        .unwrap();
    let _x = e
        .write_unsynced(10 * BS as u64, &blocks_of(4, 10, 3), false, &|| {})
        .unwrap();
    let _w = e
        .write_unsynced(12 * BS as u64, &blocks_of(5, 12, 1), false, &|| {})
        .unwrap();
    e.crash_for_test();
    let e = open(dev.clone(), opts);
    let id = id_at(&e, 12);
    assert!(
        [3, 4, 5].contains(&id),
        "block 12 reads as write {id}: the acknowledged write 3 was lost"
    );
    crash(e);
}
