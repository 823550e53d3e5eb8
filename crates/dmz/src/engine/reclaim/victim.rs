//! Victim choice: which chunks are reclaimable now, best first for the policy, and the
//! watermarks and cool-down that decide whether reclaim should run at all.

use std::time::{Duration, Instant};

use super::super::ids::{ChunkId, Mapping};
use super::super::meta::Role;
use super::super::{Inner, State};
use super::{Mode, VictimPolicy};

/// A candidate: the chunk, its mapping when chosen, and the estimated copy cost.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cand {
    pub chunk: ChunkId,
    pub map: Mapping,
    cost: u64,
    atime: u32,
}

impl Cand {
    /// A candidate taken as it is now, cost unknown (test hooks).
    pub fn now(chunk: ChunkId, map: Mapping) -> Cand {
        Cand {
            chunk,
            map,
            cost: 0,
            atime: 0,
        }
    }
}

/// Free conventional zones, in percent of the conventional data zones.
pub(super) fn free_pct(st: &State) -> u64 {
    (st.meta.nr_free_conv() as u64 * 100)
        .checked_div(st.meta.nr_conv_data_zones() as u64)
        .unwrap_or(100)
}

/// How long a chunk must have been unused to be a busy-mode victim: `busy_min_idle`, or
/// nothing while writers have been waiting for zones lately (see `ReclaimOptions`).
pub(super) fn busy_min_idle(inner: &Inner, st: &State) -> Duration {
    let demand = st
        .last_wait
        .is_some_and(|t| t.elapsed() < inner.opts.reclaim.idle_period);
    if demand {
        Duration::ZERO
    } else {
        inner.opts.reclaim.busy_min_idle
    }
}

/// How long until every zone of chunk map `m` has been unused for `min_idle`.
fn cools_in(st: &State, m: &Mapping, min_idle: Duration) -> Duration {
    m.zones()
        .map(|z| min_idle.saturating_sub(st.meta.idle_for(z)))
        .max()
        .unwrap_or_default()
}

/// Reclaimable chunks, best first for `policy`, leaving out chunks used within `min_idle`.
pub(super) fn candidates(
    st: &State,
    policy: VictimPolicy,
    allow_move: bool,
    min_idle: Duration,
) -> Vec<Cand> {
    let mut out = Vec::new();
    for (chunk, m) in st.meta.mappings() {
        let Some(dz) = m.dzone else { continue };
        if !min_idle.is_zero() && !cools_in(st, &m, min_idle).is_zero() {
            continue;
        }
        let d = st.meta.zone(dz);
        if d.role != Role::Data {
            continue;
        }
        if let Some(bz) = m.bzone {
            let b = st.meta.zone(bz);
            if b.role != Role::Buffer {
                continue; // retired: the chunk stays as it is
            }
            out.push(Cand {
                chunk,
                map: m,
                cost: b.weight as u64 + d.weight as u64,
                atime: d.atime,
            });
        } else if !d.seq && allow_move {
            out.push(Cand {
                chunk,
                map: m,
                cost: d.weight as u64,
                atime: d.atime,
            });
        }
    }
    match policy {
        VictimPolicy::Greedy => out.sort_by_key(|c| (c.cost, c.atime)),
        VictimPolicy::DmZonedOldestFirst => out.sort_by_key(|c| match c.map {
            Mapping {
                dzone: Some(d),
                bzone: Some(_),
            } => (1, u64::MAX - st.meta.zone(d).weight as u64),
            _ => (0, c.atime as u64),
        }),
    }
    out
}

/// Whether a sequential destination may be taken in `mode` (reserved zones only for
/// urgent, busy and forced reclaim), under the device's active-zone limit.
pub(super) fn seq_available(inner: &Inner, st: &State, mode: Mode) -> bool {
    st.meta.can_open(inner.geo.max_active_zones, 0)
        && (st.meta.nr_free_seq() > 0
            || (matches!(mode, Mode::Urgent | Mode::Busy | Mode::Forced)
                && st.meta.nr_reserved_free() > 0))
}

/// What reclaim should do now, and until when to sleep otherwise.
pub(super) fn evaluate(
    inner: &Inner,
    st: &State,
    busy: &mut bool,
) -> (Option<Mode>, Option<Instant>) {
    if st.waiters > 0 {
        // A writer ran out of zones: once it has one, work ahead up to the high watermark.
        // Left to the free count alone, busy mode did not start when the urgent pass had
        // freed zones faster than the writer woke to take one (free inside the band).
        *busy = true;
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
