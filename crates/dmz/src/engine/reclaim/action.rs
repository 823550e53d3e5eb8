//! Reclaim of one victim chunk: [`reclaim_one`] re-checks it under its lock, one of the four
//! actions plans the copy ([`buffer_into_data`], [`merge_into_fresh`], [`data_into_buffer`],
//! [`conventional_into_sequential`]), and [`carry_out`] copies, flushes and logs it.

use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;
use tracing::debug;
use zbd::ZoneOp;

use super::super::ids::{ChunkId, Mapping, ZoneId};
use super::super::meta::{self, durability, Bits, Proof, ZoneInfo};
use super::super::{EngineError, Inner, Recheck, State};
use super::copy::{abandon, copy, Runs};
use super::victim::{seq_available, Cand};
use super::Mode;

/// What an action will do: copy `runs` into `dst`, then free `srcs` and map the chunk to
/// `map`.
struct Plan {
    dst: ZoneId,
    srcs: Vec<ZoneId>,
    map: Mapping,
    runs: Runs,
    /// The destination is sequential: holes are written as zeros, the write pointer moves.
    dst_seq: bool,
    /// The destination was taken from a free pool for this reclaim.
    fresh: bool,
}

/// Reclaim one chunk if its mapping is unchanged. True if zones were freed.
///
/// In the background a busy chunk is skipped (its lock taken); when a writer waits for a
/// zone, reclaim waits for the chunk's I/O in flight instead: skipping it would count as "a
/// pass that freed nothing" and fail the waiting writer with ENOSPC although the zones are
/// reclaimable. Waiting is safe: no thread waits for a free zone, nor for reclaim, while
/// holding a chunk lock.
pub(super) fn reclaim_one(inner: &Inner, c: Cand, mode: Mode) -> Result<bool, EngineError> {
    let lock = inner.chunk_lock(c.chunk);
    let _g = if mode == Mode::Urgent {
        lock.write()
    } else {
        match lock.try_write() {
            Some(g) => g,
            None => return Ok(false),
        }
    };
    // The candidate was listed before the chunk lock was taken: its zones may have gone to
    // other chunks since. Rechecking one of those would set its write pointer from a report
    // taken while its new owner writes it (a stale, lower one: the owner's next write then
    // fails). With the lock held the mapping cannot change any more.
    if inner.state.lock().meta.mapping(c.chunk) != c.map {
        return Ok(false);
    }
    // A zone that went read-only still reads fine: ask the device before moving the chunk
    // off it (and freeing it for others to fail on). A retired zone's chunk stays put.
    for z in c.map.zones() {
        if matches!(inner.recheck_zone(z), Recheck::Lost(_)) {
            return Ok(false);
        }
    }
    let mut st = inner.state.lock();
    let m = st.meta.mapping(c.chunk);
    let Some(dz) = m.dzone.filter(|&dz| m == c.map && !st.meta.is_retired(dz)) else {
        return Ok(false);
    };
    let Some(plan) = choose(inner, &mut st, c.chunk, dz, m.bzone, mode)? else {
        return Ok(false);
    };
    carry_out(inner, st, c.chunk, plan, mode)
}

/// The action for a chunk with data zone `dz` and buffer `bz`, if any applies.
fn choose(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    chunk: ChunkId,
    dz: ZoneId,
    bz: Option<ZoneId>,
    mode: Mode,
) -> Result<Option<Plan>, EngineError> {
    let zb = inner.zone_blocks;
    let dzi = st.meta.zone(dz);
    let vd = st.meta.bits(&*inner.dev, dz, 0, zb)?;
    let Some(bz) = bz else {
        if !dzi.seq && seq_available(inner, st, mode) {
            return Ok(conventional_into_sequential(st, chunk, dz, &vd));
        }
        return Ok(None);
    };
    let vb = st.meta.bits(&*inner.dev, bz, 0, zb)?;
    if !vb[..dzi.wp as usize].any() && dzi.wp < zb {
        Ok(Some(buffer_into_data(dz, dzi, bz, &vb)))
    } else if seq_available(inner, st, mode) {
        Ok(merge_into_fresh(st, chunk, dz, bz, &vd, &vb))
    } else {
        Ok(Some(data_into_buffer(dz, bz, &vd)))
    }
}

/// (first block, count, source) runs from block 0 to the last block any source has valid,
/// each block from the first source (in order) that has it valid, holes as `None`.
fn runs_from(sources: &[(ZoneId, &Bits)], from: usize) -> Runs {
    let last = sources.iter().filter_map(|(_, v)| v.last_one()).max();
    let mut runs: Runs = Vec::new();
    let Some(last) = last else { return runs };
    for b in from..=last {
        let src = sources.iter().find(|(_, v)| v[b]).map(|(z, _)| *z);
        match runs.last_mut() {
            Some(r) if r.2 == src && r.0 + r.1 == b as u32 => r.1 += 1,
            _ => runs.push((b as u32, 1, src)),
        }
    }
    runs
}

/// The buffer's valid blocks all sit at or past the data zone's write pointer: append them
/// there (holes zero-filled) and free the buffer.
fn buffer_into_data(dz: ZoneId, dzi: ZoneInfo, bz: ZoneId, vb: &Bits) -> Plan {
    Plan {
        dst: dz,
        srcs: vec![bz],
        map: Mapping::data(dz),
        runs: runs_from(&[(bz, vb)], dzi.wp as usize),
        dst_seq: true,
        fresh: false,
    }
}

/// Copy the union (buffer wins) from block 0 to the last valid block into a free or
/// reserved sequential zone, and free both: one copy, where dm-zoned copies twice through
/// the buffer.
fn merge_into_fresh(
    st: &mut MutexGuard<'_, State>,
    chunk: ChunkId,
    dz: ZoneId,
    bz: ZoneId,
    vd: &Bits,
    vb: &Bits,
) -> Option<Plan> {
    let dst = st.meta.alloc_seq_reclaim(chunk)?;
    Some(Plan {
        dst,
        srcs: vec![dz, bz],
        map: Mapping::data(dst),
        runs: runs_from(&[(bz, vb), (dz, vd)], 0),
        dst_seq: true,
        fresh: true,
    })
}

/// dm-zoned's fallback when no sequential zone is available: copy the data zone's valid
/// blocks into the (conventional) buffer in place; the buffer becomes the data zone.
fn data_into_buffer(dz: ZoneId, bz: ZoneId, vd: &Bits) -> Plan {
    let runs = meta::runs_of_ones(vd)
        .into_iter()
        .map(|(b, n)| (b, n, Some(dz)))
        .collect();
    Plan {
        dst: bz,
        srcs: vec![dz],
        map: Mapping::data(bz),
        runs,
        dst_seq: false,
        fresh: false,
    }
}

/// Move a conventional data zone into a sequential one, freeing the conventional zone for
/// random writes.
fn conventional_into_sequential(
    st: &mut MutexGuard<'_, State>,
    chunk: ChunkId,
    dz: ZoneId,
    vd: &Bits,
) -> Option<Plan> {
    let dst = st.meta.alloc_seq_reclaim(chunk)?;
    Some(Plan {
        dst,
        srcs: vec![dz],
        map: Mapping::data(dst),
        runs: runs_from(&[(dz, vd)], 0),
        dst_seq: true,
        fresh: true,
    })
}

/// Copies into a conventional destination overwrite its blocks in place: as for a write in
/// place (design.md, "Why proven must be durable before overwrites"), the records that
/// validated them must be proven first, or a power cut that keeps the copies and loses the
/// records after them fails their CRC checks. Two proof flushes at most: the first flushes
/// the zone's records, the second proves them (nothing else writes into the chunk's zone).
fn prove_destination(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    dst: ZoneId,
) -> Result<(), EngineError> {
    while st.meta.proof(dst) != Proof::Proven {
        MutexGuard::unlocked(st, || durability::flush(inner, true))?;
    }
    Ok(())
}

/// Reset a fresh destination, copy, make the copies durable, then log the `Reclaim` record
/// (which frees the sources) and free what the chunk no longer needs.
fn carry_out(
    inner: &Inner,
    mut st: MutexGuard<'_, State>,
    chunk: ChunkId,
    plan: Plan,
    mode: Mode,
) -> Result<bool, EngineError> {
    let Plan {
        dst,
        srcs,
        map,
        runs,
        dst_seq,
        fresh,
    } = plan;
    if fresh && st.meta.zone(dst).wp != 0 {
        if let Err(err) =
            MutexGuard::unlocked(&mut st, || inner.dev.zone_mgmt(ZoneOp::Reset, dst.0))
        {
            drop(st);
            return abandon(inner, dst, fresh, &srcs, err.into());
        }
        st.meta.set_wp(dst, 0);
    }
    if !dst_seq {
        if let Err(err) = prove_destination(inner, &mut st, dst) {
            drop(st);
            return abandon(inner, dst, fresh, &srcs, err);
        }
    }
    drop(st);
    // The copies must be durable before the record that points at them.
    let copied = match copy(inner, dst, dst_seq, &runs, mode)
        .and_then(|n| durability::dev_flush(inner).map(|_| n))
    {
        Ok(n) => n,
        Err(err) => return abandon(inner, dst, fresh, &srcs, err),
    };
    let mut st = inner.state.lock();
    if let (true, Some(r)) = (dst_seq, runs.last()) {
        st.meta.set_wp(dst, r.0 + r.1);
    }
    if let Err(err) = meta::reclaimed(inner, &mut st, chunk, dst, srcs.clone(), map) {
        // The engine has failed (a bitmap read while applying, a commit for room); a fresh
        // destination the chunk does not map yet goes back rather than leak.
        if fresh && st.meta.mapping(chunk).dzone != Some(dst) {
            st.meta.give_back(dst);
        }
        return Err(err);
    }
    meta::put_chunk(inner, &mut st, chunk)?;
    drop(st);
    inner.stats.reclaim_zones.fetch_add(1, Ordering::Relaxed);
    inner
        .stats
        .reclaim_blocks
        .fetch_add(copied, Ordering::Relaxed);
    debug!(%chunk, %dst, ?srcs, copied, ?mode, "reclaimed");
    Ok(true)
}
