//! The I/O path, in 4 KiB blocks, one chunk at a time: reads by validity bits (zeros where
//! nothing is valid), writes at a sequential zone's write pointer, in place in conventional
//! zones, or into the chunk's buffer zone; discards by invalidation.

use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::MutexGuard;
use zbd::ZoneOp;

use crate::format::BLOCK;

use super::commit::{self, log_op};
use super::log::{Rec, MAX_WRITE_BLOCKS, NONE};
use super::zones::Role;
use super::{retired_error, EngineError, Inner, Recheck, State};

const B: u64 = BLOCK as u64;

fn check_range(inner: &Inner, offset: u64, len: u64) -> Result<(), EngineError> {
    if !offset.is_multiple_of(B) || !len.is_multiple_of(B) {
        return Err(EngineError::Invalid(format!(
            "offset {offset} and length {len} must be multiples of 4096"
        )));
    }
    let cap = inner.layout.exposed_bytes();
    if offset.checked_add(len).is_none_or(|end| end > cap) {
        return Err(EngineError::Invalid(format!(
            "{len} bytes at {offset} go past the end of the device ({cap} bytes)"
        )));
    }
    Ok(())
}

/// Split `[offset, offset + len)` at chunk ends: (chunk, first block in chunk, bytes, pos).
fn split(inner: &Inner, offset: u64, len: u64) -> Vec<(u32, u32, usize, usize)> {
    let zs = inner.geo.zone_size;
    let mut out = Vec::new();
    let mut off = offset;
    let end = offset + len;
    while off < end {
        let n = (zs - off % zs).min(end - off);
        out.push((
            (off / zs) as u32,
            ((off % zs) / B) as u32,
            n as usize,
            (off - offset) as usize,
        ));
        off += n;
    }
    out
}

pub(super) fn read(inner: &Inner, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
    check_range(inner, offset, buf.len() as u64)?;
    for (chunk, b, n, pos) in split(inner, offset, buf.len() as u64) {
        read_chunk(inner, chunk, b, &mut buf[pos..pos + n])?;
    }
    inner.stats.reads.fetch_add(1, Ordering::Relaxed);
    inner
        .stats
        .read_bytes
        .fetch_add(buf.len() as u64, Ordering::Relaxed);
    Ok(())
}

fn read_chunk(inner: &Inner, chunk: u32, b: u32, buf: &mut [u8]) -> Result<(), EngineError> {
    let _g = inner.chunk_lock(chunk).read();
    let n = (buf.len() / BLOCK) as u32;
    // Runs of (zone or NONE, first block, count).
    let mut runs: Vec<(u32, u32, u32)> = Vec::new();
    {
        let mut st = inner.state.lock();
        st.last_io = Instant::now();
        let e = st.meta.map[chunk as usize];
        if e.dzone == NONE {
            buf.fill(0);
            return Ok(());
        }
        let mut vd = Vec::with_capacity(n as usize);
        st.meta.bits(&*inner.dev, e.dzone, b, n, &mut vd)?;
        let mut vb = Vec::new();
        if e.bzone != NONE {
            st.meta.bits(&*inner.dev, e.bzone, b, n, &mut vb)?;
        }
        for i in 0..n {
            let src = if vd[i as usize] {
                e.dzone
            } else if e.bzone != NONE && vb[i as usize] {
                e.bzone
            } else {
                NONE
            };
            match runs.last_mut() {
                Some(r) if r.0 == src && r.1 + r.2 == b + i => r.2 += 1,
                _ => runs.push((src, b + i, 1)),
            }
        }
        st.zones.touch(e.dzone);
    }
    for (zone, start, cnt) in runs {
        let s = (start - b) as usize * BLOCK;
        let d = &mut buf[s..s + cnt as usize * BLOCK];
        if zone == NONE {
            d.fill(0);
        } else if let Err(e) = inner.dev.read_at(d, inner.zone_offset(zone, start)) {
            // An offline zone is retired: its data is lost, and reads of it fail.
            inner.recheck_zone(zone);
            return Err(e.into());
        }
    }
    Ok(())
}

pub(super) fn write(inner: &Inner, offset: u64, buf: &[u8], fua: bool) -> Result<(), EngineError> {
    check_range(inner, offset, buf.len() as u64)?;
    inner.check_failed()?;
    let mut last = 0;
    for (chunk, b, n, pos) in split(inner, offset, buf.len() as u64) {
        last = last.max(write_chunk(inner, chunk, b, &buf[pos..pos + n])?);
    }
    if fua {
        inner.stats.fua.fetch_add(1, Ordering::Relaxed);
        commit::flush(inner, false)?;
    } else if last > 0 {
        commit::log_sync(inner, last + 1, false, false)?;
    }
    inner.stats.writes.fetch_add(1, Ordering::Relaxed);
    inner
        .stats
        .write_bytes
        .fetch_add(buf.len() as u64, Ordering::Relaxed);
    Ok(())
}

enum Step {
    /// Blocks written, and the last record's sequence number.
    Done(u32, u64),
    /// Wait for a free zone (conventional only, or any).
    NeedZone { conv_only: bool },
    /// Make the log prove an earlier flush before overwriting in place (design.md).
    NeedEvidence,
    /// A zone just taken turned out offline or read-only (now retired): again, elsewhere.
    Retry,
}

/// How far past a chunk's start (in blocks: 8 MiB) a first write may land and still be
/// treated as the early piece of a sequential stream.
const STREAM_WINDOW: u32 = 2048;

/// Most blocks one catch-up step copies (1 MiB).
const CATCH_UP_MAX: u32 = 256;

/// A sequential stream whose pieces arrived out of order has the early ones in the buffer
/// zone, just past the data zone's write pointer: once the stream reaches them, copy the
/// buffer's contiguous valid blocks at the write pointer into the data zone, as writes
/// that invalidate the buffer's copies. The buffer empties and is freed, and the stream's
/// next piece lands at the write pointer again: the early pieces are copied once, instead
/// of the whole chunk being merged by reclaim. Returns the last record's sequence number.
fn catch_up(inner: &Inner, chunk: u32) -> Result<u64, EngineError> {
    let mut last = 0;
    let mut buf = Vec::new();
    // At most 4 MiB per write: what is left is caught up after the next one (or reclaimed).
    for _ in 0..4 {
        let _g = inner.chunk_lock(chunk).write();
        let (wp, run, bz) = {
            let mut st = inner.state.lock();
            let e = st.meta.map[chunk as usize];
            if e.dzone == NONE || e.bzone == NONE {
                return Ok(last);
            }
            let d = st.zones.z[e.dzone as usize];
            if !d.seq
                || d.wp >= inner.zone_blocks
                || st.zones.is_retired(e.dzone)
                || st.zones.is_retired(e.bzone)
            {
                return Ok(last);
            }
            let n = CATCH_UP_MAX.min(inner.zone_blocks - d.wp);
            let mut v = Vec::with_capacity(n as usize);
            st.meta.bits(&*inner.dev, e.bzone, d.wp, n, &mut v)?;
            let run = v.iter().take_while(|&&x| x).count() as u32;
            if run == 0 {
                return Ok(last);
            }
            (d.wp, run, e.bzone)
        };
        buf.resize(run as usize * BLOCK, 0);
        if let Err(e) = inner.dev.read_at(&mut buf, inner.zone_offset(bz, wp)) {
            inner.recheck_zone(bz);
            return Err(e.into());
        }
        match write_step(inner, chunk, wp, &buf, None)? {
            Step::Done(_, seq) => last = seq,
            // Anything else (a zone lost meanwhile): leave the blocks to reclaim.
            _ => return Ok(last),
        }
        inner
            .stats
            .catch_up_blocks
            .fetch_add(run as u64, Ordering::Relaxed);
    }
    Ok(last)
}

fn write_chunk(inner: &Inner, chunk: u32, b: u32, data: &[u8]) -> Result<u64, EngineError> {
    let last = write_pieces(inner, chunk, b, data)?;
    Ok(last.max(catch_up(inner, chunk)?))
}

fn write_pieces(
    inner: &Inner,
    chunk: u32,
    mut b: u32,
    mut data: &[u8],
) -> Result<u64, EngineError> {
    let mut last = 0;
    let deadline = Instant::now() + inner.opts.reclaim.wait_timeout;
    let mut ticket = Ticket { inner, t: None };
    while !data.is_empty() {
        let step = {
            let _g = inner.chunk_lock(chunk).write();
            write_step(inner, chunk, b, data, ticket.t)?
        };
        if !matches!(step, Step::NeedZone { .. }) {
            ticket.leave();
        }
        match step {
            Step::Done(n, seq) => {
                last = seq;
                b += n;
                data = &data[n as usize * BLOCK..];
            }
            Step::NeedZone { conv_only } => {
                if let Err(e) = wait_free(inner, conv_only, deadline, &mut ticket.t) {
                    // An early stream piece may have mapped an empty sequential zone.
                    let _g = inner.chunk_lock(chunk).write();
                    put_chunk(inner, &mut inner.state.lock(), chunk)?;
                    return Err(e);
                }
            }
            Step::NeedEvidence => commit::flush(inner, true)?,
            Step::Retry => {}
        }
    }
    Ok(last)
}

/// A writer's place in the [`ConvQueue`](super::zones::ConvQueue), given up when it no
/// longer needs a zone, whichever way it leaves.
struct Ticket<'a> {
    inner: &'a Inner,
    t: Option<u64>,
}

impl Ticket<'_> {
    fn leave(&mut self) {
        if let Some(t) = self.t.take() {
            let mut st = self.inner.state.lock();
            st.conv_queue.leave(t);
            // The writers behind moved up: one of them may be next for a free zone.
            if !st.zones.free_conv.is_empty() {
                self.inner.free_cv.notify_all();
            }
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// A free conventional zone for `chunk`, unless it is promised to writers that waited
/// longer than this one (holding `ticket`, or none).
fn take_conv(st: &mut State, ticket: Option<u64>, role: Role, chunk: u32) -> Option<u32> {
    if !st.conv_queue.may_take(ticket, st.zones.free_conv.len()) {
        return None;
    }
    st.zones.alloc_conv(role, chunk)
}

/// Whether overwriting conventional zone `z` in place needs a durable proof that the
/// records validating it were flushed (otherwise replay could not trust them).
fn need_evidence(st: &State, z: u32) -> bool {
    let ls = st.zones.z[z as usize].last_seq;
    ls != 0 && ls >= st.log.evidence_seq.max(st.log.folded_seq) && ls < st.log.flushed_seq
}

/// Reset a sequential zone taken from the free pool if it still holds old data. If the
/// reset fails the zone, named by no record yet, goes back to the pool, or is retired if it
/// went offline or read-only (true: take another one).
fn reset_if_needed(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    z: u32,
) -> Result<bool, EngineError> {
    if st.zones.z[z as usize].seq && st.zones.z[z as usize].wp != 0 {
        if let Err(e) = MutexGuard::unlocked(st, || inner.dev.zone_mgmt(ZoneOp::Reset, z)) {
            let r = MutexGuard::unlocked(st, || inner.recheck_zone(z));
            if let Recheck::Lost(_) = r {
                st.zones.z[z as usize].chunk = u32::MAX;
                return Ok(true);
            }
            st.zones.give_back(z);
            return Err(e.into());
        }
        st.zones.z[z as usize].wp = 0;
    }
    Ok(false)
}

fn write_step(
    inner: &Inner,
    chunk: u32,
    b: u32,
    data: &[u8],
    ticket: Option<u64>,
) -> Result<Step, EngineError> {
    let zb = inner.zone_blocks;
    let n = (data.len() / BLOCK) as u32;
    let mut st = inner.state.lock();
    st.last_io = Instant::now();
    let e = st.meta.map[chunk as usize];
    let mut dz = e.dzone;
    let mut bz = e.bzone;
    if dz == NONE {
        // Keep one active-zone slot for reclaim destinations.
        let seq_ok =
            inner.opts.direct_sequential && st.zones.can_open(inner.geo.max_active_zones, 1);
        let direct = b == 0 && seq_ok;
        // A write a little past the start most likely belongs to a stream whose first
        // pieces are still on their way (another ublk queue, the pool): map a sequential
        // zone anyway and put this piece in a buffer zone until the stream reaches it
        // (`catch_up`), rather than putting the whole chunk in a conventional zone that
        // reclaim must copy out again.
        let early = b != 0
            && b < STREAM_WINDOW.min(zb)
            && seq_ok
            && !st.zones.free_conv.is_empty()
            && !st.zones.free_seq.is_empty();
        let z = if direct || early {
            match st.zones.alloc_seq(Role::Data, chunk) {
                Some(z) => Some(z),
                None => take_conv(&mut st, ticket, Role::Data, chunk),
            }
        } else {
            take_conv(&mut st, ticket, Role::Data, chunk)
        };
        let Some(z) = z else {
            return Ok(Step::NeedZone { conv_only: !direct });
        };
        if reset_if_needed(inner, &mut st, z)? {
            return Ok(Step::Retry);
        }
        log_op(
            inner,
            &mut st,
            &[Rec::Map {
                chunk,
                dzone: z,
                bzone: NONE,
            }],
        )?;
        if !st.zones.z[z as usize].seq {
            drop(st);
            inner.kick_reclaim_lazy();
            st = inner.state.lock();
        }
        dz = z;
    }
    let dzi = st.zones.z[dz as usize];
    if st.zones.is_retired(dz) {
        if drop_empty_zone(inner, &mut st, chunk, dz)? {
            return Ok(Step::Retry);
        }
        return Err(retired_error(dzi.role, chunk, dz));
    }
    let (target, other, cnt) = if !dzi.seq {
        (dz, NONE, n)
    } else if b == dzi.wp {
        (dz, bz, n.min(zb - b))
    } else {
        let cnt = if b < dzi.wp { n.min(dzi.wp - b) } else { n };
        if bz == NONE {
            let Some(z) = take_conv(&mut st, ticket, Role::Buffer, chunk) else {
                return Ok(Step::NeedZone { conv_only: true });
            };
            log_op(
                inner,
                &mut st,
                &[Rec::Map {
                    chunk,
                    dzone: dz,
                    bzone: z,
                }],
            )?;
            drop(st);
            inner.kick_reclaim_lazy();
            st = inner.state.lock();
            bz = z;
        }
        (bz, dz, cnt)
    };
    if st.zones.is_retired(target) {
        return Err(retired_error(
            st.zones.z[target as usize].role,
            chunk,
            target,
        ));
    }
    if !st.zones.z[target as usize].seq && need_evidence(&st, target) {
        return Ok(Step::NeedEvidence);
    }
    st.zones.touch(target);
    drop(st);

    let cnt = cnt.min(MAX_WRITE_BLOCKS);
    let bytes = &data[..cnt as usize * BLOCK];
    let crcs: Vec<u32> = bytes.chunks(BLOCK).map(crc32fast::hash).collect();
    if let Err(err) = inner.dev_write(bytes, inner.zone_offset(target, b)) {
        if let Recheck::Lost(role) = inner.recheck_zone(target) {
            let mut st = inner.state.lock();
            if drop_empty_zone(inner, &mut st, chunk, target)? {
                return Ok(Step::Retry);
            }
            return Err(retired_error(role, chunk, target));
        }
        // A zone just taken for this write holds nothing: give it back rather than leak it.
        let mut st = inner.state.lock();
        put_chunk(inner, &mut st, chunk)?;
        return Err(err.into());
    }
    let mut st = inner.state.lock();
    if st.zones.z[target as usize].seq {
        st.zones.z[target as usize].wp = b + cnt;
    }
    if other != NONE && empties(inner, &mut st, other, b, cnt)? {
        // This write replaces the last valid blocks of `other`, which `put_chunk` then
        // drops from the chunk. Replay skips a write whose blocks did not land but applies
        // the records after it: had the drop reached the log and the data not the disk,
        // the chunk would lose the durable old version along with the new one. So the
        // data is made durable first, as reclaim does with its copies.
        drop(st);
        inner.dev.flush().map_err(EngineError::from)?;
        st = inner.state.lock();
    }
    let seq = log_op(
        inner,
        &mut st,
        &[Rec::Write {
            zone: target,
            block: b,
            other,
            crcs,
        }],
    )?;
    let seq = put_chunk(inner, &mut st, chunk)?.unwrap_or(seq);
    Ok(Step::Done(cnt, seq))
}

/// Whether blocks `[b, b + n)` hold every valid block of `zone`.
fn empties(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    zone: u32,
    b: u32,
    n: u32,
) -> Result<bool, EngineError> {
    let w = st.zones.z[zone as usize].weight;
    if w == 0 || w > n {
        return Ok(false);
    }
    let mut v = Vec::with_capacity(n as usize);
    st.meta.bits(&*inner.dev, zone, b, n, &mut v)?;
    Ok(v.iter().filter(|&&x| x).count() as u32 == w)
}

/// A retired zone the chunk holds nothing valid in (it was just taken) leaves the chunk, so
/// that the write can go elsewhere. True if it did.
fn drop_empty_zone(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    chunk: u32,
    zone: u32,
) -> Result<bool, EngineError> {
    let e = st.meta.map[chunk as usize];
    if st.zones.z[zone as usize].weight != 0 {
        return Ok(false);
    }
    let (dzone, bzone) = if zone == e.bzone {
        (e.dzone, NONE)
    } else if zone == e.dzone && e.bzone == NONE {
        (NONE, NONE)
    } else if zone == e.dzone && !st.zones.is_retired(e.bzone) {
        // Everything the chunk holds is in its (conventional) buffer zone, at the chunk's
        // offsets (an early stream piece): the buffer becomes the data zone as it is.
        (e.bzone, NONE)
    } else {
        return Ok(false);
    };
    log_op(
        inner,
        st,
        &[Rec::Map {
            chunk,
            dzone,
            bzone,
        }],
    )?;
    st.zones.z[zone as usize].chunk = u32::MAX;
    if dzone != NONE && dzone == e.bzone {
        st.zones.z[dzone as usize].role = Role::Data;
    }
    Ok(true)
}

/// Free the chunk's zones that hold no valid block any more (a buffer zone first, then a
/// data zone without buffer). Returns the sequence number of the record if one was logged.
pub(super) fn put_chunk(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    chunk: u32,
) -> Result<Option<u64>, EngineError> {
    let e = st.meta.map[chunk as usize];
    if e.dzone == NONE {
        return Ok(None);
    }
    let mut recs = Vec::new();
    let (mut dz, mut bz) = (e.dzone, e.bzone);
    let freeable = |st: &State, z: u32| !st.zones.is_retired(z);
    if bz != NONE && st.zones.z[bz as usize].weight == 0 {
        if freeable(st, bz) {
            recs.push(Rec::Free { zone: bz });
        }
        bz = NONE;
    }
    if bz == NONE && st.zones.z[dz as usize].weight == 0 {
        if freeable(st, dz) {
            recs.push(Rec::Free { zone: dz });
        }
        dz = NONE;
    }
    if dz == e.dzone && bz == e.bzone {
        return Ok(None);
    }
    recs.insert(
        0,
        Rec::Map {
            chunk,
            dzone: dz,
            bzone: bz,
        },
    );
    Ok(Some(log_op(inner, st, &recs)?))
}

/// Wait for a free zone: flush to release zones whose Free records are not durable yet,
/// then wait on the condvar reclaim signals. ENOSPC when two reclaim passes in a row, started
/// after the last one that freed something, free nothing, or when reclaim makes no progress
/// for `wait_timeout`. A writer is never failed while reclaim is still freeing zones, however
/// slowly (other writers may take each zone first): a filesystem shuts down on ENOSPC from
/// its block device, so like dm-zoned we rather wait.
fn wait_free(
    inner: &Inner,
    conv_only: bool,
    deadline: Instant,
    ticket: &mut Option<u64>,
) -> Result<(), EngineError> {
    let mut deadline = deadline;
    let mut st = inner.state.lock();
    let t = *ticket.get_or_insert_with(|| st.conv_queue.join());
    let have = |st: &State| {
        st.conv_queue.may_take(Some(t), st.zones.free_conv.len())
            || (!conv_only && !st.zones.free_seq.is_empty())
    };
    let mut pass0: Option<u64> = None;
    let mut seen_pass = st.reclaim_passes;
    let mut probed = false;
    loop {
        inner.check_failed()?;
        if have(&st) {
            return Ok(());
        }
        if st.reclaim_passes != seen_pass {
            seen_pass = st.reclaim_passes;
            if st.reclaim_last_progress {
                // Reclaim is freeing zones: restart both the pass count and the clock.
                pass0 = Some(seen_pass);
                deadline = Instant::now() + inner.opts.reclaim.wait_timeout;
            }
        }
        if !st.zones.pending_free.is_empty() {
            drop(st);
            commit::flush(inner, false)?;
            st = inner.state.lock();
            continue;
        }
        let nospace = || {
            EngineError::NoSpace(format!(
                "no free {} zone and reclaim cannot free one",
                if conv_only { "conventional" } else { "" }
            ))
        };
        let p = st.reclaim_passes;
        let out = !inner.opts.reclaim.enabled
            || Instant::now() >= deadline
            // A whole pass that started after we asked found nothing to free.
            || matches!(pass0, Some(p0) if p >= p0 + 2
                && !st.reclaim_last_progress && st.reclaim_exhausted);
        if out && !probed {
            // Before saying ENOSPC, make sure the device still answers: writes that failed
            // on a dead device may be what holds the zones, and reclaim may not have touched
            // it. A device error here is the caller's error, not ENOSPC.
            probed = true;
            drop(st);
            commit::flush(inner, false)?;
            st = inner.state.lock();
            continue;
        }
        if out {
            return Err(nospace());
        }
        pass0.get_or_insert(p);
        st.waiters += 1;
        st.last_wait = Some(Instant::now());
        MutexGuard::unlocked(&mut st, || inner.kick_reclaim());
        // Reclaim bumps `reclaim_passes` under this lock before it signals: re-checking it
        // here means a signal cannot be missed. The 1 s cap only bounds noticing a failure.
        if !have(&st)
            && st.zones.pending_free.is_empty()
            && st.reclaim_passes == p
            && inner.check_failed().is_ok()
        {
            let until = deadline.min(Instant::now() + std::time::Duration::from_secs(1));
            inner.free_cv.wait_until(&mut st, until);
        }
        st.waiters -= 1;
    }
}

pub(super) fn discard(inner: &Inner, offset: u64, len: u64) -> Result<(), EngineError> {
    check_range(inner, offset, len)?;
    inner.check_failed()?;
    let mut last = 0;
    for (chunk, b, n, _) in split(inner, offset, len) {
        let _g = inner.chunk_lock(chunk).write();
        let mut st = inner.state.lock();
        st.last_io = Instant::now();
        let e = st.meta.map[chunk as usize];
        if e.dzone == NONE {
            continue;
        }
        for z in [e.dzone, e.bzone] {
            if z != NONE && st.zones.is_retired(z) {
                return Err(retired_error(st.zones.z[z as usize].role, chunk, z));
            }
        }
        let cnt = (n / BLOCK) as u32;
        let mut recs = vec![Rec::Invalidate {
            zone: e.dzone,
            block: b,
            count: cnt,
        }];
        if e.bzone != NONE {
            recs.push(Rec::Invalidate {
                zone: e.bzone,
                block: b,
                count: cnt,
            });
        }
        last = last.max(log_op(inner, &mut st, &recs)?);
        if let Some(s) = put_chunk(inner, &mut st, chunk)? {
            last = last.max(s);
        }
    }
    if last > 0 {
        commit::log_sync(inner, last + 1, false, false)?;
    }
    inner.stats.discards.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
