//! Reclaim (garbage collection): merge a buffer zone into its data zone, merge both into a
//! fresh sequential zone, fold the data zone into its buffer, or move a conventional data
//! zone into a sequential one. Victims are chosen by valid blocks (greedy) or, for the
//! baseline, oldest conventional zone first like dm-zoned.
//!
//! The thread sleeps on a condvar: woken by an explicit trigger, by a writer waiting for a
//! zone, by new reclaimable zones, and (only while something is reclaimable) by the idle
//! deadline. A pass that frees nothing leaves it asleep until something changes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use tracing::{debug, warn};
use zbd::ZoneOp;

use crate::format::{MapEntry, BLOCK};

use super::commit::{self, log_op};
use super::log::{Rec, NONE};
use super::zones::Role;
use super::{EngineError, Inner, Recheck, State};

/// How reclaim picks its victims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum VictimPolicy {
    /// Fewest blocks to copy per zone freed first.
    Greedy,
    /// dm-zoned: the least recently used conventional data zone first, then the buffered
    /// chunk with the heaviest data zone.
    DmZonedOldestFirst,
}

/// Reclaim tuning.
#[derive(Debug, Clone)]
pub struct ReclaimOptions {
    pub enabled: bool,
    pub policy: VictimPolicy,
    /// Busy reclaim starts when free conventional zones fall to this percentage of the
    /// conventional data zones...
    pub low_free_pct: u64,
    /// ...and stops when they are back above this one.
    pub high_free_pct: u64,
    /// Reclaim everything reclaimable after this long without user I/O.
    pub idle_period: Duration,
    /// Victims reclaimed at once (jobs on the executor).
    pub parallel: usize,
    /// Longest a writer waits for a free zone before ENOSPC.
    pub wait_timeout: Duration,
    /// Pause after each 1 MiB copied while user I/O is active and nobody waits for a zone.
    pub throttle: Duration,
    /// Busy reclaim leaves alone a chunk whose zones were read or written this recently,
    /// unless a writer had to wait for a zone within `idle_period`: moving a hot chunk out
    /// of its conventional zone only makes its next overwrite need a buffer zone and
    /// another reclaim (dm-zoned skips active zones for the same reason), but when writers
    /// keep running out of zones, reclaiming ahead of them is worth it whatever the victim.
    pub busy_min_idle: Duration,
}

impl Default for ReclaimOptions {
    fn default() -> Self {
        ReclaimOptions {
            enabled: true,
            policy: VictimPolicy::Greedy,
            low_free_pct: 30,
            high_free_pct: 50,
            idle_period: Duration::from_secs(10),
            parallel: 1,
            wait_timeout: Duration::from_secs(60),
            throttle: Duration::from_micros(200),
            busy_min_idle: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A writer waits for a zone.
    Urgent,
    /// Below the low watermark.
    Busy,
    Idle,
    /// trigger_reclaim().
    Forced,
}

/// A candidate: the chunk, its mapping when chosen, and the estimated copy cost.
#[derive(Debug, Clone, Copy)]
struct Cand {
    chunk: u32,
    map: MapEntry,
    cost: u64,
    atime: u32,
}

fn free_pct(st: &State) -> u64 {
    (st.zones.free_conv.len() as u64 * 100)
        .checked_div(st.zones.nr_conv_data_zones as u64)
        .unwrap_or(100)
}

/// How long a chunk must have been unused to be a busy-mode victim: `busy_min_idle`, or
/// nothing while writers have been waiting for zones lately (see `ReclaimOptions`).
fn busy_min_idle(inner: &Inner, st: &State) -> Duration {
    let demand = st
        .last_wait
        .is_some_and(|t| t.elapsed() < inner.opts.reclaim.idle_period);
    if demand {
        Duration::ZERO
    } else {
        inner.opts.reclaim.busy_min_idle
    }
}

/// How long until every zone of chunk map `e` has been unused for `min_idle`.
fn cools_in(st: &State, e: &MapEntry, min_idle: Duration) -> Duration {
    [e.dzone, e.bzone]
        .into_iter()
        .filter(|&z| z != NONE)
        .map(|z| min_idle.saturating_sub(st.zones.idle_for(z)))
        .max()
        .unwrap_or_default()
}

/// Reclaimable chunks, best first for `policy`, leaving out chunks used within `min_idle`.
fn candidates(st: &State, policy: VictimPolicy, allow_move: bool, min_idle: Duration) -> Vec<Cand> {
    let mut out = Vec::new();
    for (chunk, e) in st.meta.map.iter().enumerate() {
        if e.dzone == NONE {
            continue;
        }
        if !min_idle.is_zero() && !cools_in(st, e, min_idle).is_zero() {
            continue;
        }
        let d = &st.zones.z[e.dzone as usize];
        if d.role != Role::Data {
            continue;
        }
        if e.bzone != NONE {
            if st.zones.z[e.bzone as usize].role != Role::Buffer {
                continue; // retired: the chunk stays as it is
            }
            let bw = st.zones.z[e.bzone as usize].weight as u64;
            out.push(Cand {
                chunk: chunk as u32,
                map: *e,
                cost: bw + d.weight as u64,
                atime: d.atime,
            });
        } else if !d.seq && allow_move {
            out.push(Cand {
                chunk: chunk as u32,
                map: *e,
                cost: d.weight as u64,
                atime: d.atime,
            });
        }
    }
    match policy {
        VictimPolicy::Greedy => out.sort_by_key(|c| (c.cost, c.atime)),
        VictimPolicy::DmZonedOldestFirst => out.sort_by_key(|c| {
            if c.map.bzone == NONE {
                (0, c.atime as u64)
            } else {
                (1, u64::MAX - st.zones.z[c.map.dzone as usize].weight as u64)
            }
        }),
    }
    out
}

fn seq_available(inner: &Inner, st: &State, mode: Mode) -> bool {
    st.zones.can_open(inner.geo.max_active_zones, 0)
        && (!st.zones.free_seq.is_empty()
            || (matches!(mode, Mode::Urgent | Mode::Busy | Mode::Forced)
                && !st.zones.reserved.is_empty()))
}

/// What reclaim should do now, and until when to sleep otherwise.
fn evaluate(inner: &Inner, st: &State, busy: &mut bool) -> (Option<Mode>, Option<Instant>) {
    if st.waiters > 0 {
        return (Some(Mode::Urgent), None);
    }
    let pct = free_pct(st);
    if pct <= inner.opts.reclaim.low_free_pct {
        *busy = true;
    } else if pct > inner.opts.reclaim.high_free_pct {
        *busy = false;
    }
    let policy = inner.opts.reclaim.policy;
    let all = candidates(
        st,
        policy,
        seq_available(inner, st, Mode::Idle),
        Duration::ZERO,
    );
    if all.is_empty() {
        return (None, None);
    }
    let now = Instant::now();
    let idle_due = st.last_io + inner.opts.reclaim.idle_period;
    let mut due = idle_due;
    if *busy {
        let min_idle = busy_min_idle(inner, st);
        let allow_move = seq_available(inner, st, Mode::Busy);
        if !candidates(st, policy, allow_move, min_idle).is_empty() {
            return (Some(Mode::Busy), None);
        }
        // Every candidate is in use: look again when the first one has cooled down.
        if let Some(t) = all.iter().map(|c| cools_in(st, &c.map, min_idle)).min() {
            due = due.min(now + t.max(Duration::from_millis(100)));
        }
    }
    if now >= idle_due {
        (Some(Mode::Idle), None)
    } else {
        (None, Some(due))
    }
}

pub(super) fn reclaim_thread(inner: &Arc<Inner>) {
    let mut busy = false;
    // After a pass that freed nothing, wait for a change rather than retry at once.
    let mut stuck = false;
    loop {
        let (need, due) = {
            let st = inner.state.lock();
            evaluate(inner, &st, &mut busy)
        };
        let mode;
        {
            let mut bg = inner.bg.lock();
            if bg.stop {
                bg.reclaim_running = false;
                inner.idle_cv.notify_all();
                return;
            }
            if bg.reclaim_kick != bg.reclaim_seen {
                bg.reclaim_seen = bg.reclaim_kick;
                mode = if need == Some(Mode::Urgent) {
                    Mode::Urgent
                } else {
                    Mode::Forced
                };
            } else if bg.reclaim_hint {
                bg.reclaim_hint = false;
                // Counts as running until the next look decides (see `wait_idle`).
                bg.reclaim_running = true;
                stuck = false;
                continue;
            } else if let Some(m) = need.filter(|_| !stuck) {
                mode = m;
            } else {
                bg.reclaim_running = false;
                inner.idle_cv.notify_all();
                match due.filter(|_| !stuck) {
                    Some(t) => {
                        inner.reclaim_cv.wait_until(&mut bg, t);
                    }
                    None => inner.reclaim_cv.wait(&mut bg),
                }
                continue;
            }
            bg.reclaim_running = true;
        }
        let progress = match run_pass(inner, mode) {
            Ok(p) => p,
            Err(e) => {
                // Like dm-zoned's dying device: stop rather than retry on a failing device.
                warn!(error = %e, "reclaim failed");
                inner.fail(&e);
                false
            }
        };
        stuck = !progress;
        {
            let mut st = inner.state.lock();
            st.reclaim_passes += 1;
            st.reclaim_last_progress = progress;
        }
        inner.free_cv.notify_all();
    }
}

/// One pass: reclaim victims until the mode's goal is met. Returns whether any zone was
/// freed.
fn run_pass(inner: &Arc<Inner>, mode: Mode) -> Result<bool, EngineError> {
    let start = Instant::now();
    let mut progress = false;
    let mut flushed_for_pending = false;
    inner.state.lock().reclaim_exhausted = false;
    loop {
        if inner.bg.lock().stop || inner.check_failed().is_err() {
            return Ok(progress);
        }
        // Whether no zone is free, read under the same lock as the candidates: nothing to
        // reclaim proves exhaustion only then. A pass that starts after reclaim freed zones,
        // before the waiting writers woke to take them, finds nothing to do either; calling
        // that "exhausted" failed those writers with ENOSPC once others took the zones.
        let (cands, none_free, pending) = {
            let st = inner.state.lock();
            let goal_met = match mode {
                Mode::Urgent => st.waiters == 0 && progress,
                Mode::Busy => free_pct(&st) > inner.opts.reclaim.high_free_pct,
                Mode::Idle => st.last_io > start,
                Mode::Forced => false,
            };
            if goal_met {
                return Ok(progress);
            }
            let min_idle = if mode == Mode::Busy {
                busy_min_idle(inner, &st)
            } else {
                Duration::ZERO
            };
            let cands = candidates(
                &st,
                inner.opts.reclaim.policy,
                seq_available(inner, &st, mode),
                min_idle,
            );
            (
                cands,
                st.zones.free_conv.is_empty(),
                !st.zones.pending_free.is_empty(),
            )
        };
        if cands.is_empty() {
            // Zones freed by records not yet flushed become usable (as destinations) after
            // a flush: without it this pass would end "nothing to do" and a writer waiting
            // for a zone would get ENOSPC although the next pass could free one.
            if pending && !flushed_for_pending {
                flushed_for_pending = true;
                commit::flush(inner, false)?;
                continue;
            }
            inner.state.lock().reclaim_exhausted = !pending && none_free;
            return Ok(progress);
        }
        flushed_for_pending = false;
        let n = inner.opts.reclaim.parallel.max(1);
        let done = if n == 1 {
            let mut done = false;
            for c in &cands {
                if reclaim_one(inner, *c, mode)? {
                    done = true;
                    break;
                }
            }
            done
        } else {
            run_parallel(inner, &cands[..cands.len().min(n)], mode)
        };
        if !done {
            return Ok(progress);
        }
        progress = true;
        // Make the freed zones reusable and wake writers waiting for them.
        commit::flush(inner, false)?;
        inner.free_cv.notify_all();
    }
}

/// Reclaim several victims at once on the executor; true if any was reclaimed.
fn run_parallel(inner: &Arc<Inner>, cands: &[Cand], mode: Mode) -> bool {
    let latch = Arc::new((Mutex::new((cands.len(), false)), Condvar::new()));
    for c in cands {
        let (i, l, c) = (inner.clone(), latch.clone(), *c);
        inner.executor.execute(
            c.chunk as u64,
            Box::new(move || {
                let ok = match reclaim_one(&i, c, mode) {
                    Ok(ok) => ok,
                    Err(e) => {
                        warn!(error = %e, "reclaim job failed");
                        false
                    }
                };
                let mut g = l.0.lock();
                g.0 -= 1;
                g.1 |= ok;
                l.1.notify_all();
            }),
        );
    }
    let mut g = latch.0.lock();
    while g.0 > 0 {
        latch.1.wait(&mut g);
    }
    g.1
}

/// Where the destination's blocks come from: runs of (first dst block, count, source zone
/// or NONE for zeros).
type Runs = Vec<(u32, u32, u32)>;

fn push_run(runs: &mut Runs, b: u32, src: u32) {
    match runs.last_mut() {
        Some(r) if r.2 == src && r.0 + r.1 == b => r.1 += 1,
        _ => runs.push((b, 1, src)),
    }
}

/// Reclaim one chunk if its mapping is unchanged. True if zones were freed.
///
/// In the background a busy chunk is skipped (its lock taken); when a writer waits for a
/// zone, reclaim waits for the chunk's I/O in flight instead: skipping it would count as "a
/// pass that freed nothing" and fail the waiting writer with ENOSPC although the zones are
/// reclaimable. Waiting is safe: no thread waits for a free zone, nor for reclaim, while
/// holding a chunk lock.
fn reclaim_one(inner: &Arc<Inner>, c: Cand, mode: Mode) -> Result<bool, EngineError> {
    let lock = inner.chunk_lock(c.chunk);
    let _g = if mode == Mode::Urgent {
        lock.write()
    } else {
        match lock.try_write() {
            Some(g) => g,
            None => return Ok(false),
        }
    };
    let dev = &*inner.dev;
    let zb = inner.zone_blocks;
    // The candidate was listed before the chunk lock was taken: its zones may have gone to
    // other chunks since. Rechecking one of those would set its write pointer from a report
    // taken while its new owner writes it (a stale, lower one: the owner's next write then
    // fails). With the lock held the mapping cannot change any more.
    if inner.state.lock().meta.map[c.chunk as usize] != c.map {
        return Ok(false);
    }
    // A zone that went read-only still reads fine: ask the device before moving the chunk
    // off it (and freeing it for others to fail on). A retired zone's chunk stays put.
    for z in [c.map.dzone, c.map.bzone] {
        if z != NONE && matches!(inner.recheck_zone(z), Recheck::Lost(_)) {
            return Ok(false);
        }
    }
    let mut st = inner.state.lock();
    let e = st.meta.map[c.chunk as usize];
    if e != c.map || e.dzone == NONE || st.zones.is_retired(e.dzone) {
        return Ok(false);
    }
    let (dz, bz) = (e.dzone, e.bzone);
    let dzi = st.zones.z[dz as usize];
    let mut vd = Vec::with_capacity(zb as usize);
    st.meta.bits(dev, dz, 0, zb, &mut vd)?;
    let mut vb = Vec::new();
    if bz != NONE {
        st.meta.bits(dev, bz, 0, zb, &mut vb)?;
    }
    let last_valid = |v: &[bool]| v.iter().rposition(|&x| x).map(|i| i as u32);
    let mut runs: Runs = Vec::new();
    let (dst, srcs, newmap, dst_seq);
    if bz != NONE {
        let below_wp = vb[..dzi.wp as usize].iter().any(|&x| x);
        if !below_wp && dzi.wp < zb {
            // Buffer into data: append the buffer's blocks after the write pointer.
            if let Some(l) = last_valid(&vb) {
                for b in dzi.wp..=l {
                    push_run(&mut runs, b, if vb[b as usize] { bz } else { NONE });
                }
            }
            dst = dz;
            srcs = vec![bz];
            newmap = (dz, NONE);
            dst_seq = true;
        } else if seq_available(inner, &st, mode) {
            // Both into a fresh sequential zone.
            let Some(s) = st.zones.alloc_seq_reclaim(c.chunk) else {
                return Ok(false);
            };
            let l = last_valid(&vb).max(last_valid(&vd));
            if let Some(l) = l {
                for b in 0..=l {
                    let src = if vb[b as usize] {
                        bz
                    } else if vd[b as usize] {
                        dz
                    } else {
                        NONE
                    };
                    push_run(&mut runs, b, src);
                }
            }
            dst = s;
            srcs = vec![dz, bz];
            newmap = (s, NONE);
            dst_seq = true;
        } else {
            // Data into buffer (conventional, in place), like dm-zoned.
            for b in 0..zb {
                if vd[b as usize] {
                    push_run(&mut runs, b, dz);
                }
            }
            dst = bz;
            srcs = vec![dz];
            newmap = (bz, NONE);
            dst_seq = false;
        }
    } else if !dzi.seq && seq_available(inner, &st, mode) {
        let Some(s) = st.zones.alloc_seq_reclaim(c.chunk) else {
            return Ok(false);
        };
        if let Some(l) = last_valid(&vd) {
            for b in 0..=l {
                push_run(&mut runs, b, if vd[b as usize] { dz } else { NONE });
            }
        }
        dst = s;
        srcs = vec![dz];
        newmap = (s, NONE);
        dst_seq = true;
    } else {
        return Ok(false);
    }
    let fresh = dst != dz && dst != bz;
    if fresh && st.zones.z[dst as usize].wp != 0 {
        if let Err(err) = MutexGuard::unlocked(&mut st, || dev.zone_mgmt(ZoneOp::Reset, dst)) {
            drop(st);
            return abandon(inner, dst, fresh, &srcs, err.into());
        }
        st.zones.z[dst as usize].wp = 0;
    }
    drop(st);

    // The copies must be durable before the record that points at them.
    let copied = match copy(inner, dst, dst_seq, &runs, mode)
        .and_then(|n| dev.flush().map(|_| n).map_err(EngineError::from))
    {
        Ok(n) => n,
        Err(err) => return abandon(inner, dst, fresh, &srcs, err),
    };
    let mut st = inner.state.lock();
    if dst_seq {
        if let Some(r) = runs.last() {
            st.zones.z[dst as usize].wp = r.0 + r.1;
        }
    }
    let logged = log_op(
        inner,
        &mut st,
        &[Rec::Reclaim {
            chunk: c.chunk,
            dst,
            srcs: srcs.clone(),
            dzone: newmap.0,
            bzone: newmap.1,
        }],
    );
    if let Err(err) = logged {
        // The engine has failed (a bitmap read while applying, a commit for room); a fresh
        // destination the chunk does not map yet goes back rather than leak.
        if fresh && st.meta.map[c.chunk as usize].dzone != dst {
            st.zones.give_back(dst);
        }
        return Err(err);
    }
    let zi = &mut st.zones.z[dst as usize];
    zi.role = Role::Data;
    zi.chunk = c.chunk;
    super::io::put_chunk(inner, &mut st, c.chunk)?;
    drop(st);
    inner.stats.reclaim_zones.fetch_add(1, Ordering::Relaxed);
    inner
        .stats
        .reclaim_blocks
        .fetch_add(copied, Ordering::Relaxed);
    debug!(chunk = c.chunk, dst, ?srcs, copied, ?mode, "reclaimed");
    Ok(true)
}

/// A reclaim failed before its record: nothing names what it wrote into `dst`. A fresh
/// destination goes back to its pool (or is retired); the write pointers are taken from the
/// device. If a zone involved went offline or read-only it is retired and the chunk left
/// as it is (false); any other error stands.
fn abandon(
    inner: &Inner,
    dst: u32,
    fresh: bool,
    srcs: &[u32],
    err: EngineError,
) -> Result<bool, EngineError> {
    let mut lost = false;
    let mut dst_known = false;
    for &z in std::iter::once(&dst).chain(srcs) {
        let r = inner.recheck_zone(z);
        lost |= matches!(r, Recheck::Lost(_));
        if z == dst {
            dst_known = r != Recheck::Unknown;
        }
    }
    let mut st = inner.state.lock();
    if fresh {
        if st.zones.is_retired(dst) {
            st.zones.z[dst as usize].chunk = u32::MAX;
        } else {
            if !dst_known {
                // Its write pointer is unknown: make sure it is reset before reuse.
                st.zones.z[dst as usize].wp = inner.zone_blocks;
            }
            st.zones.give_back(dst);
        }
    }
    drop(st);
    if lost {
        warn!(error = %err, dst, ?srcs, "reclaim: a zone was lost; chunk left as it is");
        return Ok(false);
    }
    Err(err)
}

/// Copy the runs into `dst` in batches of up to 1 MiB (zeros for holes of a sequential
/// destination). Returns the blocks written.
fn copy(
    inner: &Inner,
    dst: u32,
    dst_seq: bool,
    runs: &Runs,
    mode: Mode,
) -> Result<u64, EngineError> {
    const BATCH: u32 = 256;
    let dev = &*inner.dev;
    // 4 KiB-aligned, so that an O_DIRECT backend reads and writes it without a bounce copy.
    let mut store = vec![0u8; (BATCH as usize + 1) * BLOCK];
    let skip = store.as_ptr().align_offset(BLOCK);
    let buf = &mut store[skip..skip + BATCH as usize * BLOCK];
    let mut written = 0u64;
    inner.stats.reclaim_progress.store(0, Ordering::Relaxed);
    // Pieces of at most BATCH blocks, never crossing a run.
    let mut pieces: Vec<(u32, u32, u32)> = Vec::new();
    for &(start, len, src) in runs {
        if src == NONE && !dst_seq {
            continue;
        }
        let mut o = 0;
        while o < len {
            let n = (len - o).min(BATCH);
            pieces.push((start + o, n, src));
            o += n;
        }
    }
    let mut i = 0;
    while i < pieces.len() {
        // Group contiguous pieces into one write.
        let first = pieces[i].0;
        let mut used = 0u32;
        let mut j = i;
        while j < pieces.len() && pieces[j].0 == first + used && used + pieces[j].1 <= BATCH {
            let (b, n, src) = pieces[j];
            let d = &mut buf[used as usize * BLOCK..(used + n) as usize * BLOCK];
            if src == NONE {
                d.fill(0);
            } else {
                dev.read_at(d, inner.zone_offset(src, b))?;
            }
            used += n;
            j += 1;
        }
        inner.dev_write(&buf[..used as usize * BLOCK], inner.zone_offset(dst, first))?;
        written += used as u64;
        inner
            .stats
            .reclaim_progress
            .store(written, Ordering::Relaxed);
        i = j;
        if mode != Mode::Urgent && !inner.opts.reclaim.throttle.is_zero() {
            let recent = inner.state.lock().last_io.elapsed() < Duration::from_millis(50);
            if recent {
                std::thread::sleep(inner.opts.reclaim.throttle);
            }
        }
    }
    Ok(written)
}

/// Wait until reclaim has handled every trigger so far and is asleep.
pub(super) fn wait_idle(inner: &Inner) {
    if !inner.opts.reclaim.enabled {
        return;
    }
    let mut bg = inner.bg.lock();
    let target = bg.reclaim_kick;
    while !bg.stop && (bg.reclaim_running || bg.reclaim_hint || bg.reclaim_seen < target) {
        inner.idle_cv.wait(&mut bg);
    }
}
