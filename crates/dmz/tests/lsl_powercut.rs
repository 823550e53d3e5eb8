//! Power cuts at every device-write boundary of seeded workloads on the log layout, over
//! zbd's FaultyDevice: writes, flushes, FUA writes and discards on a volume small enough
//! that GC runs and a log ring small enough that checkpoints run (and `Commit` ops
//! checkpoint, or compact as an idle volume does, at any point, unflushed writes or not). After the cut (keeping
//! all, none or a random half of the unflushed writes, or only those to conventional zones
//! (metadata), or only those to sequential zones (data)) the volume must open, every write
//! acknowledged by a flush or a FUA write must read back (or a later write of its blocks),
//! and no block may read as data never written to it. Release builds run at least 10,000
//! crash points; the count is printed.

mod common;

use std::sync::Arc;

use parking_lot::Mutex;

use common::lsl::*;
use common::powercut::{check_read, Op};
use common::*;
use dmz::lsl::{LogEngine, LogOptions, LogSyncPlan};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zbd::{FaultyDevice, MemDevice, OpKind, ZoneOp};

const NR_CONV: u32 = 4;
/// Keep patterns: all, none, a random half, conventional (metadata) only, sequential (data)
/// only.
const PATTERNS: u64 = 5;

/// GC copies 4 blocks at a time: a victim of these 15-block zones takes several batches,
/// with user writes (and power cuts) between them.
fn opts() -> LogOptions {
    LogOptions {
        gc_batch_blocks: 4,
        ..lsl_test_opts()
    }
}

/// 20 zones of 64 KiB (15 data blocks + 1 summary block), 4 conventional; a 32-block log
/// ring (16 per generation).
fn template() -> Arc<MemDevice> {
    formatted_lsl(64, 20, NR_CONV, 32)
}

/// The zone of each write the device holds unflushed, in the order `FaultyDevice` indexes
/// them for `power_cut` (observed through a fault rule that never fires).
fn watch_pending(dev: &FaultyDevice<MemDevice>) -> Arc<Mutex<Vec<u32>>> {
    let pending = Arc::new(Mutex::new(Vec::new()));
    let p = pending.clone();
    dev.fail_matching(
        move |op| {
            let mut v = p.lock();
            match op.kind {
                OpKind::Write if op.len > 0 => v.push(op.zone),
                OpKind::Flush => v.clear(),
                OpKind::ZoneMgmt(ZoneOp::Reset) => v.retain(|&z| z != op.zone),
                OpKind::ResetAll => v.retain(|&z| z < NR_CONV),
                _ => {}
            }
            false
        },
        libc::EIO,
    );
    pending
}

fn workload(seed: u64, n: usize, blocks: u64) -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ops = Vec::new();
    for _ in 0..n {
        let len = if rng.gen_bool(0.8) {
            rng.gen_range(1..=8)
        } else {
            rng.gen_range(9..=40)
        }
        .min(blocks);
        let start = rng.gen_range(0..=blocks - len);
        // Odd seeds flush rarely: checkpoints and GC then find unflushed writes.
        let r = rng.gen_range(0..100);
        let often = seed.is_multiple_of(2);
        ops.push(match r {
            0..=59 => Op::Write {
                start,
                len,
                fua: false,
            },
            60..=69 if often || r < 62 => Op::Write {
                start,
                len,
                fua: true,
            },
            70..=81 => Op::Discard { start, len },
            82..=86 => Op::Commit,
            _ if often || r > 97 => Op::Flush,
            _ => Op::Write {
                start,
                len,
                fua: false,
            },
        });
    }
    ops
}

/// Planned writes in flight at once (`run` with `planned`): each holds a frontier's turn.
const GROUP: usize = 3;

/// Run ops until one fails: (ops completed, end of the ops in flight when it failed). With
/// `planned`, runs of plain writes go as planned writes (`LogEngine::plan_write`), up to
/// [`GROUP`] in flight, as queue threads make them: each planned, every data write done,
/// then each completed (`try_complete`, else `complete`) and synced (through `plan_sync` for even ops, the blocking `sync`
/// for odd ones). A write that gets no plan goes through the engine after the group.
fn run(e: &Arc<LogEngine>, ops: &[Op], planned: bool) -> (usize, usize) {
    let mut i = 0;
    while i < ops.len() {
        if planned {
            match run_group(e, ops, i) {
                Ok(0) => {}
                Ok(k) => {
                    i += k;
                    continue;
                }
                Err(failed) => return failed,
            }
        }
        let r = match ops[i] {
            Op::Write { start, len, fua } => {
                e.write(start * BS as u64, &op_data(i, start, len), fua)
            }
            Op::Discard { start, len } => e.discard(start * BS as u64, len * BS as u64),
            Op::Flush => e.flush(),
            // Half the `Commit` ops compact instead (idle compaction's copies, flush and
            // `Move` records, cut anywhere).
            Op::Commit if i % 2 == 1 => e.debug_compact().map(|_| ()),
            Op::Commit => e.debug_checkpoint(),
        };
        if r.is_err() {
            return (i, i + 1);
        }
        i += 1;
    }
    (ops.len(), ops.len())
}

/// The data op `i` writes.
fn op_data(i: usize, start: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize * BS];
    pattern(i as u64 + 1, start, &mut buf);
    buf
}

/// A group of planned writes from op `i` (see [`run`]): how many ops it ran (0: op `i` got
/// no plan), or (completed, end of the group) when one failed. From an even op, the plain
/// writes that follow go as one write group first (`LogEngine::plan_writes`, see
/// [`run_write_group`]).
fn run_group(e: &Arc<LogEngine>, ops: &[Op], i: usize) -> Result<usize, (usize, usize)> {
    if i.is_multiple_of(2) {
        match run_write_group(e, ops, i)? {
            0 => {}
            k => return Ok(k),
        }
    }
    let mut group = Vec::new();
    for (j, op) in ops.iter().enumerate().skip(i).take(GROUP) {
        let Op::Write {
            start,
            len,
            fua: false,
        } = *op
        else {
            break;
        };
        let data = op_data(j, start, len);
        let Some(plan) = e.plan_write(start * BS as u64, &data) else {
            break;
        };
        group.push((j, plan, data));
    }
    let end = i + group.len();
    for (_, plan, data) in &mut group {
        plan.write_for_test(data).map_err(|_| (i, end))?;
    }
    for (j, plan, data) in group {
        // As a queue thread does: `try_complete`, and `complete` (a pool job) when declined.
        let seq = match plan.try_complete(&data) {
            Ok(r) => r,
            Err(plan) => plan.complete(&data),
        };
        let seq = seq.map_err(|_| (j, end))?;
        let synced = match j % 2 {
            0 => match e.plan_sync(seq) {
                Ok(LogSyncPlan::Done) => Ok(()),
                Ok(LogSyncPlan::Busy) => e.sync(seq),
                Ok(LogSyncPlan::Write(w)) => w.write_for_test(),
                Err(err) => Err(err),
            },
            _ => e.sync(seq),
        };
        synced.map_err(|_| (j, end))?;
    }
    Ok(end - i)
}

/// The plain writes from op `i` (up to [`GROUP`], none overlapping an earlier one) as one
/// write group, made as a queue thread makes it: planned together, their data written
/// with one device write in the order placed, the records appended together and synced
/// once. 0 when fewer than two writes, or not all of them, were placed (the plan is
/// dropped: it records nothing).
fn run_write_group(e: &Arc<LogEngine>, ops: &[Op], i: usize) -> Result<usize, (usize, usize)> {
    let mut writes: Vec<(u64, u64)> = Vec::new();
    for op in ops.iter().skip(i).take(GROUP) {
        let Op::Write {
            start,
            len,
            fua: false,
        } = *op
        else {
            break;
        };
        let clash = |&(s, l): &(u64, u64)| s < start + len && start < s + l;
        if writes.iter().any(clash) {
            break;
        }
        writes.push((start, len));
    }
    if writes.len() < 2 {
        return Ok(0);
    }
    let bytes: Vec<(u64, u64)> = writes
        .iter()
        .map(|&(s, l)| (s * BS as u64, l * BS as u64))
        .collect();
    let Some(mut plan) = e.plan_writes(&bytes) else {
        return Ok(0);
    };
    let placed: Vec<usize> = plan.placed().collect();
    if placed != (0..writes.len()).collect::<Vec<_>>() {
        return Ok(0);
    }
    let end = i + writes.len();
    let data: Vec<Vec<u8>> = (0..writes.len())
        .map(|k| op_data(i + k, writes[k].0, writes[k].1))
        .collect();
    plan.write_for_test(&data.concat()).map_err(|_| (i, end))?;
    let parts: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let seq = match plan.try_complete_parts(&parts) {
        Ok(r) => r,
        Err(plan) => plan.complete_parts(&parts),
    };
    let seq = seq.map_err(|_| (i, end))?;
    let synced = match e.plan_sync(seq) {
        Ok(LogSyncPlan::Done) => Ok(()),
        Ok(LogSyncPlan::Busy) => e.sync(seq),
        Ok(LogSyncPlan::Write(w)) => w.write_for_test(),
        Err(err) => Err(err),
    };
    synced.map_err(|_| (i, end))?;
    Ok(writes.len())
}

/// A copy of `base` loses power after its device write `k` of an open followed by `work`
/// on the engine (if it opened), keeping the unflushed writes `pat` chooses: all (0), none
/// (1), a random half (2), those to conventional zones (3) or to sequential zones (4).
/// Returns the device as it comes back, and what `work` returned (0 if the open failed).
fn cut_during(
    base: &MemDevice,
    k: u64,
    pat: u64,
    rng_seed: u64,
    opts: LogOptions,
    work: impl FnOnce(&Arc<LogEngine>) -> (usize, usize),
) -> (MemDevice, (usize, usize)) {
    let dev = Arc::new(FaultyDevice::new(base.snapshot()).unwrap());
    let zones = watch_pending(&dev);
    dev.cut_power_after_writes(k);
    let done = match LogEngine::open(dev.clone(), opts) {
        Ok(e) => work(&Arc::new(e)),
        Err(_) => (0, 0),
    };
    let mut rng = StdRng::seed_from_u64(rng_seed);
    let zones = zones.lock().clone();
    assert_eq!(zones.len(), dev.pending_writes());
    let keep: Vec<bool> = zones
        .iter()
        .map(|&z| match pat {
            0 => true,
            1 => false,
            2 => rng.gen_bool(0.5),
            3 => z < NR_CONV,
            _ => z >= NR_CONV,
        })
        .collect();
    dev.power_cut(|i| keep[i]).unwrap();
    (dev.inner().snapshot(), done)
}

/// Open `dev` and check every block against `ops`: `done.0` of them completed, those up to
/// `done.1` were in flight.
fn verify(dev: MemDevice, ops: &[Op], done: (usize, usize), what: &str, o: &LogOptions) {
    let e = LogEngine::open(Arc::new(dev), o.clone())
        .unwrap_or_else(|err| panic!("{what}: reopen failed: {err}"));
    let mut got = vec![0u8; e.capacity() as usize];
    e.read(0, &mut got)
        .unwrap_or_else(|err| panic!("{what}: read: {err}"));
    check_read(&got, ops, done.0, done.1.max(done.0 + 1), what);
}

/// The power goes after device write `k` of `ops` (on a copy of `template`); then reopen
/// and check.
fn cut_and_verify(template: &MemDevice, ops: &[Op], seed: u64, k: u64, pat: u64, o: &LogOptions) {
    let rng_seed = seed * 1_000_003 + k * 7 + pat;
    let (dev, done) = cut_during(template, k, pat, rng_seed, o.clone(), |e| {
        run(e, ops, planned(seed))
    });
    verify(
        dev,
        ops,
        done,
        &format!("seed {seed} cut after write {k} pattern {pat}"),
        o,
    );
}

/// The blocks a seed's workload writes: seed 1 of every four stays in the first 40 (three
/// zones' worth), so that its page fits the room GC keeps and compactions run; the others
/// cover the volume (GC under pressure).
fn span(seed: u64, capacity: u64) -> u64 {
    if seed % 4 == 1 {
        capacity.min(40)
    } else {
        capacity
    }
}

/// Seeds 1 and 2 of every four run their plain writes as planned writes (the frontend's
/// hop-free writes), one flushing often and one rarely.
fn planned(seed: u64) -> bool {
    matches!(seed % 4, 1 | 2)
}

/// Device writes an open of `dev` makes (replay, settling zones, checkpoint).
fn open_writes(dev: &MemDevice) -> u64 {
    let f = Arc::new(FaultyDevice::new(dev.snapshot()).unwrap());
    drop(LogEngine::open(f.clone(), opts()).unwrap());
    f.write_count()
}

#[test]
fn power_cut_at_every_write() {
    let release = !cfg!(debug_assertions);
    let seeds: u64 = if release { 12 } else { 2 };
    let first: u64 = std::env::var("LSL_POWERCUT_FIRST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let nops = if release { 70 } else { 40 };
    let template = template();
    let (mut points, mut gc_zones, mut checkpoints, mut writes, mut paced) = (0u64, 0, 0, 0, 0);
    let (mut nr_planned, mut grouped, mut compacted) = (0, 0, 0);
    let start = std::time::Instant::now();
    for seed in first..first + seeds {
        // Dry run: how many device writes the workload makes, and that it runs GC.
        let dev = Arc::new(FaultyDevice::new(template.snapshot()).unwrap());
        let e = Arc::new(LogEngine::open(dev.clone(), opts()).unwrap());
        let blocks = span(seed, e.capacity() / BS as u64);
        let ops = workload(seed, nops, blocks);
        assert_eq!(run(&e, &ops, planned(seed)), (ops.len(), ops.len()));
        let s = e.stats();
        compacted += s.compact_pages;
        nr_planned += s.planned_writes;
        // Writes that shared a plan with another (a write group).
        grouped += s.planned_writes - s.planned_groups;
        gc_zones += s.gc_zones_freed;
        paced += s.gc_paced_batches;
        checkpoints += s.checkpoints;
        drop(e);
        let total = dev.write_count();
        writes += total;
        for k in 0..=total {
            for pat in 0..PATTERNS {
                cut_and_verify(&template, &ops, seed, k, pat, &opts());
                points += 1;
            }
        }
    }
    eprintln!(
        "log layout power cuts: {points} crash points over {writes} device writes, \
         {gc_zones} GC zones ({paced} paced batches), {checkpoints} checkpoints and \
         {nr_planned} planned writes ({grouped} beyond the first of a write group) and \
         {compacted} compacted pages in the workloads, {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(
        gc_zones > 0 && paced > 0 && checkpoints > seeds,
        "the workloads must run GC (paced too) and checkpoints"
    );
    assert!(nr_planned > 0, "no write of the workloads was planned");
    if release {
        // Debug builds run two short workloads (one planned, in 40 blocks: its writes
        // overlap too often to group), too few `Commit` ops to compact surely.
        assert!(grouped > 0, "no write group in the workloads");
        assert!(compacted > 0, "no page of the workloads was compacted");
        assert!(points >= 10_000, "only {points} crash points");
    }
}

/// The index paged: a cache of one page, so that nearly every record writes a
/// page back between checkpoints (after a flush) and lookups read pages from their slots,
/// with a power cut after every device write. 200 zones of 64 KiB, 4 conventional (3 pages).
#[test]
fn power_cut_with_a_paged_index() {
    let release = !cfg!(debug_assertions);
    let seeds: u64 = if release { 4 } else { 1 };
    let nops = if release { 30 } else { 12 };
    let o = LogOptions {
        index_memory: 0,
        ..opts()
    };
    let template = formatted_lsl(64, 200, NR_CONV, 32);
    let (mut points, mut reads, mut written_back) = (0u64, 0, 0);
    let start = std::time::Instant::now();
    for seed in 0..seeds {
        let dev = Arc::new(FaultyDevice::new(template.snapshot()).unwrap());
        let e = Arc::new(LogEngine::open(dev.clone(), o.clone()).unwrap());
        let ops = workload(seed, nops, e.capacity() / BS as u64);
        assert_eq!(run(&e, &ops, planned(seed)), (ops.len(), ops.len()));
        let s = e.stats();
        reads += s.index_page_reads;
        written_back += s.index_pages_written_back;
        drop(e);
        for k in 0..=dev.write_count() {
            for pat in 0..PATTERNS {
                cut_and_verify(&template, &ops, seed, k, pat, &o);
                points += 1;
            }
        }
    }
    eprintln!(
        "log layout power cuts, paged index: {points} crash points, {reads} pages read and \
         {written_back} written back in the workloads, {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(
        reads > 0 && written_back > 0,
        "the workloads must read and write back pages"
    );
    if release {
        assert!(points >= 2_000, "only {points} crash points");
    }
}

/// A second power cut during the open that recovers from a first one (its replay, the
/// zones it pads and seals, its checkpoint), at every write of that open: the third open
/// must still give every flushed write and nothing never written. First cuts: every 11th
/// write of 6 workloads, a random half of the unflushed writes kept.
#[test]
fn power_cut_during_recovery() {
    let release = !cfg!(debug_assertions);
    let seeds: u64 = if release { 6 } else { 1 };
    let template = template();
    let (mut points, mut recovery_writes) = (0u64, 0u64);
    let start = std::time::Instant::now();
    for seed in 0..seeds {
        let dev = Arc::new(FaultyDevice::new(template.snapshot()).unwrap());
        let e = Arc::new(LogEngine::open(dev.clone(), opts()).unwrap());
        let ops = workload(seed, 70, e.capacity() / BS as u64);
        assert_eq!(run(&e, &ops, planned(seed)), (ops.len(), ops.len()));
        drop(e);
        for k in (0..=dev.write_count()).step_by(11) {
            let o = opts();
            let (first, done) = cut_during(&template, k, 2, seed * 31 + k, o, |e| {
                run(e, &ops, planned(seed))
            });
            let writes = open_writes(&first);
            recovery_writes += writes;
            for k2 in 0..=writes {
                for pat in 0..PATTERNS {
                    let (second, _) = cut_during(&first, k2, pat, k2 * 5 + pat, opts(), |_| (0, 0));
                    let what = format!(
                        "seed {seed} cut after write {k}, then after write {k2} of the \
                         recovery, pattern {pat}"
                    );
                    verify(second, &ops, done, &what, &opts());
                    points += 1;
                }
            }
        }
    }
    eprintln!(
        "log layout power cuts during recovery: {points} crash points over \
         {recovery_writes} recovery writes, {:.1} s",
        start.elapsed().as_secs_f64()
    );
    if release {
        assert!(points > 1000, "only {points} crash points");
    }
}

/// What one writer of [`concurrent_writers_lose_power`] did to its blocks.
struct WriterLog {
    /// Every id written to each block (in order), the first `durable[b]` of which a flush or
    /// FUA write it saw complete covers.
    ids: Vec<Vec<u64>>,
    durable: Vec<usize>,
}

/// One writer on its own `span` blocks from `base`: random writes (some FUA) and flushes
/// until the device dies.
fn concurrent_writer(e: &LogEngine, w: u64, base: u64, span: u64, seed: u64) -> WriterLog {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut log = WriterLog {
        ids: vec![Vec::new(); span as usize],
        durable: vec![0; span as usize],
    };
    for i in 1.. {
        let n = rng.gen_range(1..=6u64).min(span);
        let off = rng.gen_range(0..=span - n);
        let id = (w << 32) | i;
        let r = if rng.gen_range(0..12) == 0 {
            // Everything this writer had acknowledged is covered once the flush returns.
            let acked: Vec<usize> = log.ids.iter().map(Vec::len).collect();
            e.flush().map(|_| log.durable = acked)
        } else {
            let fua = rng.gen_range(0..8) == 0;
            let mut buf = vec![0u8; n as usize * BS];
            pattern(id, base + off, &mut buf);
            let blocks = off as usize..(off + n) as usize;
            // Submitted: from here the blocks may hold this id after a cut.
            for b in blocks.clone() {
                log.ids[b].push(id);
            }
            let r = e.write((base + off) * BS as u64, &buf, fua);
            if r.is_ok() && fua {
                for b in blocks {
                    log.durable[b] = log.ids[b].len();
                }
            }
            r
        };
        if r.is_err() {
            break;
        }
    }
    log
}

/// Four writers at once, each on its own quarter of the volume, so that the user frontiers
/// take writes side by side (data written outside `wlock`, records sharing log blocks), GC
/// and checkpoints among them; the power goes at a seeded device write, keeping a random
/// half of the unflushed writes. After reopening, each block holds zeros (only if nothing
/// durable was written to it) or one of the writes submitted to it, never older than the
/// newest one a completed flush or FUA write covered.
#[test]
fn concurrent_writers_lose_power() {
    let release = !cfg!(debug_assertions);
    let runs: u64 = if release { 60 } else { 12 };
    let template = formatted_lsl(64, 40, NR_CONV, 32);
    let (mut frontiers_used, mut gc_zones) = (0, 0);
    for run in 0..runs {
        let dev = Arc::new(FaultyDevice::new(template.snapshot()).unwrap());
        dev.cut_power_after_writes(60 + run * 41);
        let e = Arc::new(LogEngine::open(dev.clone(), opts()).unwrap());
        let span = e.capacity() / BS as u64 / 4;
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let e = e.clone();
                std::thread::spawn(move || {
                    concurrent_writer(&e, w + 1, w * span, span, run * 4 + w)
                })
            })
            .collect();
        let logs: Vec<WriterLog> = writers.into_iter().map(|h| h.join().unwrap()).collect();
        let s = e.stats();
        frontiers_used = frontiers_used.max(s.zones_open);
        gc_zones += s.gc_zones_freed;
        drop(e);
        dev.power_cut_random(run).unwrap();
        let what = format!("run {run}");
        let e = LogEngine::open(Arc::new(dev.inner().snapshot()), opts())
            .unwrap_or_else(|err| panic!("{what}: reopen failed: {err}"));
        e.debug_check().unwrap_or_else(|m| panic!("{what}: {m}"));
        let mut got = vec![0u8; (span * 4) as usize * BS];
        e.read(0, &mut got).unwrap();
        for (w, log) in logs.iter().enumerate() {
            for (b, ids) in log.ids.iter().enumerate() {
                let block = w as u64 * span + b as u64;
                let at = block as usize * BS;
                let id =
                    block_id(&got[at..at + BS], block).unwrap_or_else(|m| panic!("{what}: {m}"));
                let pos = ids.iter().rposition(|&x| x == id);
                let ok = match (id, pos) {
                    (0, _) => log.durable[b] == 0,
                    (_, Some(p)) => p + 1 >= log.durable[b],
                    (_, None) => false,
                };
                assert!(
                    ok,
                    "{what}: block {block} reads write {id:#x}; written {ids:x?}, the first {} \
                     durable",
                    log.durable[b]
                );
            }
        }
    }
    eprintln!("concurrent power cuts: {runs} runs, up to {frontiers_used} zones open, {gc_zones} GC zones");
    assert!(
        frontiers_used > 2,
        "the writers never had two user frontiers open"
    );
}
