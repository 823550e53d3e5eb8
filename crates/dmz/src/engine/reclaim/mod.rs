//! Reclaim (garbage collection): the thread, its modes and its passes. Victims are chosen
//! in [`victim`]; each action (buffer into data, merge into a fresh sequential zone, data
//! into buffer, conventional into sequential) is a function of [`action`]; the copies are
//! [`copy`].
//!
//! The thread sleeps on a condvar: woken by an explicit trigger, by a writer waiting for a
//! zone, by new reclaimable zones, and (only while something is reclaimable) by the idle
//! deadline. A pass that frees nothing leaves it asleep until something changes.

mod action;
mod copy;
mod victim;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::warn;

use super::ids::{ChunkId, IO_BATCH_BLOCKS};
use super::meta::durability;
use super::{EngineError, Inner};
use action::reclaim_one;
use victim::{busy_min_idle, candidates, evaluate, free_pct, seq_available, Cand};

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
    /// Victims reclaimed at once (one scoped thread each).
    pub parallel: usize,
    /// Longest a writer waits for a free zone while reclaim makes no progress (neither
    /// copies a block nor finishes a pass that frees a zone) before ENOSPC.
    pub wait_timeout: Duration,
    /// Pause after each 1 MiB copied while user I/O is active and nobody waits for a zone.
    pub throttle: Duration,
    /// Blocks a copy within one device reads, then writes, at a time (at most a zone's):
    /// on a disk each switch between the source and the destination is a seek. Copies
    /// from a multi-device volume's cache onto a drive go 1 MiB at a time (`copy.rs`).
    pub copy_batch_blocks: u32,
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
            copy_batch_blocks: 8 * IO_BATCH_BLOCKS,
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

/// Test hook: reclaim `chunk` now as a forced pass would (skipping it while its lock is
/// busy), or as an urgent one (waiting for the I/O in flight on it).
pub(in crate::engine) fn reclaim_chunk(
    inner: &Inner,
    chunk: ChunkId,
    urgent: bool,
) -> Result<bool, EngineError> {
    let map = inner.state.lock().meta.mapping(chunk);
    let mode = if urgent { Mode::Urgent } else { Mode::Forced };
    reclaim_one(inner, Cand::now(chunk, map), mode)
}

pub(in crate::engine) fn reclaim_thread(inner: &Arc<Inner>) {
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
                bg.reclaim_done = bg.reclaim_seen;
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
                bg.reclaim_done = bg.reclaim_seen;
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
fn run_pass(inner: &Inner, mode: Mode) -> Result<bool, EngineError> {
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
                st.meta.nr_free_conv() == 0,
                st.meta.nr_pending_free() > 0,
            )
        };
        if cands.is_empty() {
            // Zones freed by records not yet flushed become usable (as destinations) after
            // a flush: without it this pass would end "nothing to do" and a writer waiting
            // for a zone would get ENOSPC although the next pass could free one.
            if pending && !flushed_for_pending {
                flushed_for_pending = true;
                durability::flush(inner, false)?;
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
            reclaim_parallel(inner, &cands[..cands.len().min(n)], mode)
        };
        if !done {
            return Ok(progress);
        }
        progress = true;
        // Make the freed zones reusable and wake writers waiting for them.
        durability::flush(inner, false)?;
        inner.free_cv.notify_all();
    }
}

/// Reclaim several victims at once, one scoped thread each (each chunk under its own
/// lock); true if any was reclaimed.
fn reclaim_parallel(inner: &Inner, cands: &[Cand], mode: Mode) -> bool {
    std::thread::scope(|s| {
        let jobs: Vec<_> = cands
            .iter()
            .map(|&c| {
                std::thread::Builder::new()
                    .name("dmz-reclaim-job".into())
                    .spawn_scoped(s, move || match reclaim_one(inner, c, mode) {
                        Ok(ok) => ok,
                        Err(e) => {
                            warn!(error = %e, "reclaim job failed");
                            false
                        }
                    })
            })
            .collect();
        // A job that could not be spawned is run here instead.
        jobs.into_iter()
            .zip(cands)
            .map(|(j, &c)| match j {
                Ok(h) => h.join().unwrap_or(false),
                Err(_) => reclaim_one(inner, c, mode).unwrap_or(false),
            })
            .fold(false, |a, b| a | b)
    })
}

/// Wait until reclaim has handled every trigger so far and is asleep.
pub(in crate::engine) fn wait_idle(inner: &Inner) {
    if !inner.opts.reclaim.enabled {
        return;
    }
    let mut bg = inner.bg.lock();
    let target = bg.reclaim_kick;
    while !bg.stop && (bg.reclaim_running || bg.reclaim_hint || bg.reclaim_seen < target) {
        inner.idle_cv.wait(&mut bg);
    }
}
