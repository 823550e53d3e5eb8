//! Writes, one function per case: the first write of an unmapped chunk
//! ([`map_new_chunk`]), then the placement of the blocks ([`place`]: in place in a
//! conventional data zone, at a sequential zone's write pointer, or into the chunk's buffer
//! zone), the device write with its record ([`write_blocks`]), the catch-up of out-of-order
//! streams ([`catch_up`]), and waiting for a free zone ([`wait_free`]).

use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::MutexGuard;
use zbd::ZoneOp;

use super::super::ids::{ChunkId, Mapping, ZoneId, BLOCK, IO_BATCH_BLOCKS};
use super::super::meta::{self, durability, Proof, Role};
use super::super::Unsynced;
use super::super::{retired_error, EngineError, Inner, Recheck, State};
use super::split;

/// The write up to its acknowledgement: data on the device and records appended (the
/// log block written too when `fua`, which flushes). What is left is the log write that
/// every write of a batch can share: [`sync`] it before acknowledging. `before_wait` runs
/// each time the write is about to sleep for a free zone, with no engine lock held.
pub(in crate::engine) fn write(
    inner: &Inner,
    offset: u64,
    buf: &[u8],
    fua: bool,
    before_wait: &dyn Fn(),
) -> Result<Unsynced, EngineError> {
    super::check_range(inner, offset, buf.len() as u64)?;
    inner.check_failed()?;
    let mut last = 0;
    for p in split(inner, offset, buf.len() as u64) {
        let data = &buf[p.pos..p.pos + p.len];
        last = last.max(write_pieces(inner, p.chunk, p.block, data, before_wait)?);
        last = last.max(catch_up(inner, p.chunk)?);
    }
    if fua {
        inner.stats.fua.fetch_add(1, Ordering::Relaxed);
        durability::flush(inner, false)?;
    }
    inner.stats.writes.fetch_add(1, Ordering::Relaxed);
    inner
        .stats
        .write_bytes
        .fetch_add(buf.len() as u64, Ordering::Relaxed);
    // The flush of a FUA write has written the log too.
    Ok(if fua || last == 0 {
        Unsynced::NOTHING
    } else {
        Unsynced { upto: last + 1 }
    })
}

/// Write the log up to a write's last record (group commit: nothing when another writer
/// already wrote it). After this the write survives a daemon crash.
pub(in crate::engine) fn sync(inner: &Inner, w: Unsynced) -> Result<(), EngineError> {
    if w.upto > 0 {
        durability::log_sync(inner, w.upto, false, false)?;
    }
    Ok(())
}

/// What one step of a write did, or what it needs first.
enum Step {
    /// Blocks written, and the sequence number of the last record the write must see in
    /// the log before it is acknowledged (0: none).
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

/// How many pieces of its own length a stream's early piece may be ahead of the chunk's
/// start (the pieces in flight before it). A first write of `n` blocks starting
/// `n * STREAM_AHEAD` blocks in or more is taken for a random write, whatever the window: with
/// 16 MiB zones the window alone took half of all randomly placed first 4 KiB writes for
/// stream pieces (a sequential zone, then every later write of the chunk past its write
/// pointer into a buffer zone, through the pool).
const STREAM_AHEAD: u32 = 64;

/// A sequential stream whose pieces arrived out of order has the early ones in the buffer
/// zone, just past the data zone's write pointer: once the stream reaches them, copy the
/// buffer's contiguous valid blocks at the write pointer into the data zone, as writes
/// that invalidate the buffer's copies. The buffer empties and is freed, and the stream's
/// next piece lands at the write pointer again: the early pieces are copied once, instead
/// of the whole chunk being merged by reclaim. Returns the last record's sequence number.
fn catch_up(inner: &Inner, chunk: ChunkId) -> Result<u64, EngineError> {
    let mut last = 0;
    let mut buf = Vec::new();
    // At most 4 MiB per write: what is left is caught up after the next one (or reclaimed).
    for _ in 0..4 {
        let _g = inner.chunk_lock(chunk).write();
        let (wp, run, bz) = {
            let mut st = inner.state.lock();
            let m = st.meta.mapping(chunk);
            let (Some(dz), Some(bz)) = (m.dzone, m.bzone) else {
                return Ok(last);
            };
            let d = st.meta.zone(dz);
            if !d.seq
                || d.wp >= inner.zone_blocks
                || st.meta.is_retired(dz)
                || st.meta.is_retired(bz)
            {
                return Ok(last);
            }
            let n = IO_BATCH_BLOCKS.min(inner.zone_blocks - d.wp);
            let v = st.meta.bits(&*inner.dev, bz, d.wp, n)?;
            let run = v.leading_ones() as u32;
            if run == 0 {
                return Ok(last);
            }
            (d.wp, run, bz)
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

/// Write one chunk's part of a request, step by step (a step ends at a zone end, the write
/// pointer, or `IO_BATCH_BLOCKS`), waiting for zones or evidence where a step needs them.
fn write_pieces(
    inner: &Inner,
    chunk: ChunkId,
    mut b: u32,
    mut data: &[u8],
    before_wait: &dyn Fn(),
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
                last = last.max(seq);
                b += n;
                data = &data[n as usize * BLOCK..];
            }
            Step::NeedZone { conv_only } => {
                before_wait();
                if let Err(e) = wait_free(inner, conv_only, deadline, &mut ticket.t) {
                    // An early stream piece may have mapped an empty sequential zone.
                    let _g = inner.chunk_lock(chunk).write();
                    meta::put_chunk(inner, &mut inner.state.lock(), chunk)?;
                    return Err(e);
                }
            }
            Step::NeedEvidence => durability::flush(inner, true)?,
            Step::Retry => {}
        }
    }
    Ok(last)
}

/// A writer's place in the [`ConvQueue`](super::super::meta::ConvQueue), given up when it
/// no longer needs a zone, whichever way it leaves.
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
            if st.meta.nr_free_conv() > 0 {
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
fn take_conv(st: &mut State, ticket: Option<u64>, role: Role, chunk: ChunkId) -> Option<ZoneId> {
    if !st.conv_queue.may_take(ticket, st.meta.nr_free_conv()) {
        return None;
    }
    st.meta.alloc_conv(role, chunk)
}

/// Reset a sequential zone taken from the free pool if it still holds old data. If the
/// reset fails the zone, named by no record yet, goes back to the pool, or is retired if it
/// went offline or read-only (true: take another one).
fn reset_if_needed(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    z: ZoneId,
) -> Result<bool, EngineError> {
    let zi = st.meta.zone(z);
    if zi.seq && zi.wp != 0 {
        if let Err(e) = MutexGuard::unlocked(st, || inner.dev.zone_mgmt(ZoneOp::Reset, z.0)) {
            let r = MutexGuard::unlocked(st, || inner.recheck_zone(z));
            if let Recheck::Lost(_) = r {
                st.meta.disown(z);
                return Ok(true);
            }
            st.meta.give_back(z);
            return Err(e.into());
        }
        st.meta.set_wp(z, 0);
    }
    Ok(false)
}

/// One step of a write of `data` at block `b` of `chunk`, under the chunk's write lock.
fn write_step(
    inner: &Inner,
    chunk: ChunkId,
    b: u32,
    data: &[u8],
    ticket: Option<u64>,
) -> Result<Step, EngineError> {
    let n = (data.len() / BLOCK) as u32;
    let mut st = inner.state.lock();
    st.last_io = Instant::now();
    let m = st.meta.mapping(chunk);
    let dz = match m.dzone {
        Some(dz) => dz,
        None => match map_new_chunk(inner, &mut st, chunk, b, n, ticket)? {
            Ok(dz) => dz,
            Err(step) => return Ok(step),
        },
    };
    if st.meta.is_retired(dz) {
        if drop_empty_zone(inner, &mut st, chunk, dz)? {
            return Ok(Step::Retry);
        }
        return Err(retired_error(st.meta.zone(dz).role, chunk, dz));
    }
    let Placement {
        target,
        other,
        blocks,
    } = match place(inner, &mut st, chunk, b, n, dz, ticket)? {
        Ok(p) => p,
        Err(step) => return Ok(step),
    };
    if st.meta.is_retired(target) {
        return Err(retired_error(st.meta.zone(target).role, chunk, target));
    }
    let in_place = if st.meta.zone(target).seq {
        None
    } else {
        match st.meta.proof(target) {
            Proof::Proven => None,
            Proof::FlushedUnproven => return Ok(Step::NeedEvidence),
            Proof::Unflushed => Some(InPlace::begin(inner, &mut st)),
        }
    };
    st.meta.touch(target);
    let mut cnt = blocks.min(IO_BATCH_BLOCKS);
    if in_place.is_some() {
        // Replay checks the zone's records against the data: what this write overwrites
        // must be in the log before it (design.md, "Overwrites in place and kill -9").
        let bits = st.meta.bits(&*inner.dev, target, b, cnt)?;
        let valid = bits[0];
        cnt = bits.iter().take_while(|v| **v == valid).count() as u32;
        if valid
            && !st
                .meta
                .overwrite_needs_no_record(&*inner.dev, target, other, b, cnt)?
        {
            let data = &data[..cnt as usize * BLOCK];
            return write_ahead(inner, st, chunk, target, other, b, data);
        }
        // Invalid blocks: the records that invalidated them (a write at the data zone's
        // write pointer waiting for its batch's log write, say) go to the log first.
        let cleared = st.meta.zone(target).last_cleared_seq;
        let unwritten = cleared > 0 && !st.meta.log_holds(cleared);
        drop(st);
        if unwritten {
            durability::log_sync(inner, cleared + 1, false, false)?;
        }
    } else {
        drop(st);
    }
    write_blocks(
        inner,
        chunk,
        target,
        other,
        b,
        &data[..cnt as usize * BLOCK],
    )
}

/// An overwrite in place of blocks all valid in `target`, whose records replay would check
/// against the data: its own record (no bit changes) and every record before it go to the
/// log first, then the data. A daemon killed between the two leaves either the old data,
/// which the earlier records match, or the new, which this record matches; with the record
/// after the data, the new data would fail the earlier records and the blocks read as never
/// written (design.md, "Overwrites in place and kill -9").
fn write_ahead(
    inner: &Inner,
    mut st: MutexGuard<'_, State>,
    chunk: ChunkId,
    target: ZoneId,
    other: Option<ZoneId>,
    b: u32,
    data: &[u8],
) -> Result<Step, EngineError> {
    let cnt = (data.len() / BLOCK) as u32;
    let seq = meta::written(inner, &mut st, target, b, other, block_crcs(data))?;
    drop(st);
    durability::log_sync(inner, seq + 1, false, false)?;
    if let Err(err) = inner.dev_write(data, inner.zone_offset(target, b)) {
        if let Recheck::Lost(role) = inner.recheck_zone(target) {
            return Err(retired_error(role, chunk, target));
        }
        return Err(err.into());
    }
    inner.stats.written_ahead.fetch_add(1, Ordering::Relaxed);
    Ok(Step::Done(cnt, seq))
}

/// The CRC-32 of each block of `data`, as a `Write` record carries them.
pub(super) fn block_crcs(data: &[u8]) -> Vec<u32> {
    data.chunks(BLOCK).map(crc32fast::hash).collect()
}

/// An overwrite in place of records not yet flushed, counted from its check until its own
/// record is appended (`durability::InPlaceWrites`), whichever way the step ends.
struct InPlace<'a> {
    inner: &'a Inner,
}

impl<'a> InPlace<'a> {
    fn begin(inner: &'a Inner, st: &mut State) -> InPlace<'a> {
        st.in_place.begin();
        InPlace { inner }
    }
}

impl Drop for InPlace<'_> {
    fn drop(&mut self) {
        self.inner.state.lock().in_place.end();
    }
}

/// The first write of an unmapped chunk (`n` blocks at block `b`) maps a zone: at the
/// chunk's first block a free sequential zone (streaming data is written once); a little
/// past it too (within [`STREAM_WINDOW`] and [`STREAM_AHEAD`] pieces of its length), as the
/// early piece of a stream whose first pieces are still on their way (another ublk queue,
/// the pool), the piece itself going to a buffer zone until the stream reaches it
/// ([`catch_up`]); anywhere else a conventional zone, like dm-zoned. `Err(step)`: what the
/// write needs first.
fn map_new_chunk(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    chunk: ChunkId,
    b: u32,
    n: u32,
    ticket: Option<u64>,
) -> Result<Result<ZoneId, Step>, EngineError> {
    let zb = inner.zone_blocks;
    // Keep one active-zone slot for reclaim destinations.
    let seq_ok = inner.opts.direct_sequential && st.meta.can_open(inner.geo.max_active_zones, 1);
    let direct = b == 0 && seq_ok;
    let early = b != 0
        && b < STREAM_WINDOW.min(zb).min(n.saturating_mul(STREAM_AHEAD))
        && seq_ok
        && st.meta.nr_free_conv() > 0
        && st.meta.nr_free_seq() > 0;
    let z = if direct || early {
        match st.meta.alloc_seq(Role::Data, chunk) {
            Some(z) => Some(z),
            None => take_conv(st, ticket, Role::Data, chunk),
        }
    } else {
        take_conv(st, ticket, Role::Data, chunk)
    };
    let Some(z) = z else {
        return Ok(Err(Step::NeedZone { conv_only: !direct }));
    };
    if reset_if_needed(inner, st, z)? {
        return Ok(Err(Step::Retry));
    }
    meta::map_chunk(inner, st, chunk, Mapping::data(z))?;
    if !st.meta.zone(z).seq {
        MutexGuard::unlocked(st, || inner.kick_reclaim_lazy());
    }
    Ok(Ok(z))
}

/// Where one write step goes.
struct Placement {
    target: ZoneId,
    /// The chunk's other zone, whose copies of the blocks the write invalidates.
    other: Option<ZoneId>,
    /// Blocks this step covers.
    blocks: u32,
}

/// Where blocks `[b, b + n)` of `chunk` (data zone `dz`) go. A conventional
/// data zone is written in place; a sequential one at its write pointer; below it (an
/// overwrite) or past it (a gap) the blocks go to the chunk's buffer zone, taken now if the
/// chunk has none. `Err(step)`: what the write needs first.
fn place(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    chunk: ChunkId,
    b: u32,
    n: u32,
    dz: ZoneId,
    ticket: Option<u64>,
) -> Result<Result<Placement, Step>, EngineError> {
    let zb = inner.zone_blocks;
    let dzi = st.meta.zone(dz);
    let bz = st.meta.mapping(chunk).bzone;
    let to = |target, other, blocks| {
        Ok(Ok(Placement {
            target,
            other,
            blocks,
        }))
    };
    if !dzi.seq {
        return to(dz, None, n);
    }
    if b == dzi.wp {
        return to(dz, bz, n.min(zb - b));
    }
    let cnt = if b < dzi.wp { n.min(dzi.wp - b) } else { n };
    let bz = match bz {
        Some(bz) => bz,
        None => {
            let Some(z) = take_conv(st, ticket, Role::Buffer, chunk) else {
                return Ok(Err(Step::NeedZone { conv_only: true }));
            };
            meta::map_chunk(inner, st, chunk, Mapping::buffered(dz, z))?;
            MutexGuard::unlocked(st, || inner.kick_reclaim_lazy());
            z
        }
    };
    to(bz, Some(dz), cnt)
}

/// Write `data` at block `b` of `target` and log it (the blocks become valid there and
/// invalid in `other`); then free what the write emptied. A device error retires a lost
/// zone (the step is retried elsewhere if the chunk held nothing in it).
fn write_blocks(
    inner: &Inner,
    chunk: ChunkId,
    target: ZoneId,
    other: Option<ZoneId>,
    b: u32,
    data: &[u8],
) -> Result<Step, EngineError> {
    let cnt = (data.len() / BLOCK) as u32;
    let crcs = block_crcs(data);
    if let Err(err) = inner.dev_write(data, inner.zone_offset(target, b)) {
        if let Recheck::Lost(role) = inner.recheck_zone(target) {
            let mut st = inner.state.lock();
            if drop_empty_zone(inner, &mut st, chunk, target)? {
                return Ok(Step::Retry);
            }
            return Err(retired_error(role, chunk, target));
        }
        // A zone just taken for this write holds nothing: give it back rather than leak it.
        let mut st = inner.state.lock();
        meta::put_chunk(inner, &mut st, chunk)?;
        return Err(err.into());
    }
    let seq = record_blocks(inner, chunk, target, other, b, cnt, crcs)?;
    Ok(Step::Done(cnt, seq))
}

/// After `cnt` blocks at block `b` of `target` reached the device (under the chunk's lock:
/// exclusive from [`write_blocks`], shared with the blocks reserved from a
/// [`WritePlan`](super::WritePlan) the caller wrote): their
/// record (the blocks become valid there and invalid in `other`), unless the overwrite needs
/// none; then free what the write emptied. Returns the sequence number of the last record
/// the write must see in the log before it is acknowledged.
pub(super) fn record_blocks(
    inner: &Inner,
    chunk: ChunkId,
    target: ZoneId,
    other: Option<ZoneId>,
    b: u32,
    cnt: u32,
    crcs: Vec<u32>,
) -> Result<u64, EngineError> {
    let mut st = inner.state.lock();
    if st
        .meta
        .overwrite_needs_no_record(&*inner.dev, target, other, b, cnt)?
    {
        inner.stats.unlogged.fetch_add(1, Ordering::Relaxed);
        return Ok(st.meta.last_record_seq());
    }
    if st.meta.zone(target).seq {
        st.meta.set_wp(target, b + cnt);
    }
    if let Some(o) = other {
        if st.meta.empties(&*inner.dev, o, b, cnt)? {
            // This write replaces the last valid blocks of `other`, which `put_chunk` then
            // drops from the chunk. Replay skips a write whose blocks did not land but
            // applies the records after it: had the drop reached the log and the data not
            // the disk, the chunk would lose the durable old version along with the new
            // one. So the data is made durable first, as reclaim does with its copies.
            MutexGuard::unlocked(&mut st, || durability::dev_flush(inner))?;
        }
    }
    let seq = meta::written(inner, &mut st, target, b, other, crcs)?;
    Ok(meta::put_chunk(inner, &mut st, chunk)?.unwrap_or(seq))
}

/// A retired zone the chunk holds nothing valid in (it was just taken) leaves the chunk, so
/// that the write can go elsewhere. True if it did.
fn drop_empty_zone(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    chunk: ChunkId,
    zone: ZoneId,
) -> Result<bool, EngineError> {
    let m = st.meta.mapping(chunk);
    if st.meta.zone(zone).weight != 0 {
        return Ok(false);
    }
    let new = if Some(zone) == m.bzone {
        Mapping {
            dzone: m.dzone,
            bzone: None,
        }
    } else if Some(zone) == m.dzone && m.bzone.is_none() {
        Mapping::UNMAPPED
    } else if let Some(bz) = m
        .bzone
        .filter(|&bz| Some(zone) == m.dzone && !st.meta.is_retired(bz))
    {
        // Everything the chunk holds is in its (conventional) buffer zone, at the chunk's
        // offsets (an early stream piece): the buffer becomes the data zone as it is.
        Mapping::data(bz)
    } else {
        return Ok(false);
    };
    meta::map_chunk(inner, st, chunk, new)?;
    Ok(true)
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
        st.conv_queue.may_take(Some(t), st.meta.nr_free_conv())
            || (!conv_only && st.meta.nr_free_seq() > 0)
    };
    let mut pass0: Option<u64> = None;
    let mut seen_pass = st.reclaim_passes;
    let copied = || inner.stats.reclaim_copied_total.load(Ordering::Relaxed);
    let mut seen_copied = copied();
    let mut probed = false;
    loop {
        inner.check_failed()?;
        if have(&st) {
            return Ok(());
        }
        if copied() != seen_copied {
            // Reclaim is copying (one zone can take many seconds on a disk): the clock
            // measures time without progress, not the length of a pass.
            seen_copied = copied();
            deadline = Instant::now() + inner.opts.reclaim.wait_timeout;
        }
        if st.reclaim_passes != seen_pass {
            seen_pass = st.reclaim_passes;
            if st.reclaim_last_progress {
                // Reclaim is freeing zones: restart both the pass count and the clock.
                pass0 = Some(seen_pass);
                deadline = Instant::now() + inner.opts.reclaim.wait_timeout;
            }
        }
        if st.meta.nr_pending_free() > 0 {
            MutexGuard::unlocked(&mut st, || durability::flush(inner, false))?;
            continue;
        }
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
            MutexGuard::unlocked(&mut st, || durability::flush(inner, false))?;
            continue;
        }
        if out {
            return Err(EngineError::NoSpace(format!(
                "no free {} zone and reclaim cannot free one",
                if conv_only { "conventional" } else { "" }
            )));
        }
        pass0.get_or_insert(p);
        st.waiters += 1;
        st.last_wait = Some(Instant::now());
        MutexGuard::unlocked(&mut st, || inner.kick_reclaim());
        // Reclaim bumps `reclaim_passes` under this lock before it signals: re-checking it
        // here means a signal cannot be missed. The 1 s cap only bounds noticing a failure.
        if !have(&st)
            && st.meta.nr_pending_free() == 0
            && st.reclaim_passes == p
            && inner.check_failed().is_ok()
        {
            let until = deadline.min(Instant::now() + std::time::Duration::from_secs(1));
            inner.free_cv.wait_until(&mut st, until);
        }
        st.waiters -= 1;
    }
}
