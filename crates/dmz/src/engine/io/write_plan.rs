//! Hop-free writes: the one write case a caller may put on the device itself, planned
//! without blocking ([`plan_write`]) and recorded once the caller's write completed
//! ([`WritePlan::complete`]). The case is a write in place into a chunk's conventional
//! zone (its data zone, or its buffer zone below a sequential data zone's write pointer)
//! that needs nothing first: no zone to take, no proof block to write, no record to write
//! ahead of the data, no earlier invalidation to get into the log, no flush. Every other
//! write goes through [`super::write`] (docs/design.md, "Hop-free writes").
//!
//! Plans of one chunk may be in flight together, as a kernel target submits a chunk's
//! writes without waiting for each: each holds the chunk lock shared, so that nothing that
//! takes it exclusive (a write step, a discard, catch-up, reclaim) runs meanwhile, and
//! [`PlannedWrites`] keeps their ranges apart and the data zone they invalidate from being
//! emptied by them together.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::lock_api::ArcRwLockReadGuard;
use parking_lot::RawRwLock;

use super::super::ids::{ChunkId, ZoneId, IO_BATCH_BLOCKS};
use super::super::meta::{self, Proof};
use super::super::{EngineError, Inner, Unsynced};
use super::write::{block_crcs, record_blocks};
use super::{check_range, B};

/// The planned writes in flight (kept in `State`, under its lock): per chunk, the block
/// ranges `(first, count)` of its plans. No two overlap: a plan's premises (which blocks are
/// valid, which records they depend on) must hold until its record is appended, and only
/// another write of the same blocks could change them.
#[derive(Default)]
pub(in crate::engine) struct PlannedWrites {
    ranges: HashMap<ChunkId, Vec<(u32, u32)>>,
}

impl PlannedWrites {
    fn overlaps(&self, chunk: ChunkId, b: u32, n: u32) -> bool {
        self.ranges
            .get(&chunk)
            .is_some_and(|v| v.iter().any(|&(s, m)| s < b + n && b < s + m))
    }

    /// Blocks the chunk's plans cover: at most what they invalidate in its data zone.
    fn blocks(&self, chunk: ChunkId) -> u32 {
        self.ranges
            .get(&chunk)
            .map_or(0, |v| v.iter().map(|&(_, m)| m).sum())
    }

    fn add(&mut self, chunk: ChunkId, b: u32, n: u32) {
        self.ranges.entry(chunk).or_default().push((b, n));
    }

    fn remove(&mut self, chunk: ChunkId, b: u32, n: u32) {
        if let Some(v) = self.ranges.get_mut(&chunk) {
            if let Some(i) = v.iter().position(|&r| r == (b, n)) {
                v.swap_remove(i);
            }
            if v.is_empty() {
                self.ranges.remove(&chunk);
            }
        }
    }
}

/// A plan's place in [`PlannedWrites`] and in `durability::InPlaceWrites`, given up (under
/// the state lock) when the plan is completed, after its record, or dropped.
struct Slot {
    inner: Arc<Inner>,
    chunk: ChunkId,
    block: u32,
    n: u32,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut st = self.inner.state.lock();
        st.in_place.end();
        st.planned.remove(self.chunk, self.block, self.n);
    }
}

/// A write planned by [`crate::engine::Engine::plan_write`]: where its blocks go on the
/// device, with the chunk's lock held shared until the plan is completed or dropped, so
/// that nothing but other plans (of other blocks) and reads touches the chunk meanwhile.
/// The caller writes the data at [`WritePlan::device_offset`] (through the device's
/// [`zbd::ReadSource`] when its `conv_writes` allows it) and then calls
/// [`WritePlan::complete`]; a plan dropped without it (the caller's write failed) records
/// nothing, and the caller redoes the write with [`crate::engine::Engine::write`], which
/// reports the error. Not `Send` (parking_lot guards): completed or dropped on the thread
/// that planned it.
pub struct WritePlan {
    device_offset: u64,
    len: u64,
    zone: ZoneId,
    /// The chunk's other zone, whose copies of the blocks the write invalidates.
    other: Option<ZoneId>,
    /// The sequence number of the plan's record when it was appended at planning, ahead
    /// of the data (an overwrite of valid blocks whose records are not flushed: the log
    /// must hold it before the data goes out, see [`WritePlan::sync_first`]).
    ahead: Option<u64>,
    /// Declared before the guard: given up while the chunk lock is still held.
    slot: Slot,
    _guard: ArcRwLockReadGuard<RawRwLock, ()>,
}

impl WritePlan {
    /// The byte offset on the device (without a [`zbd::ReadSource`]'s `base`) to write at.
    pub fn device_offset(&self) -> u64 {
        self.device_offset
    }

    /// Bytes the plan covers.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What must be synced ([`crate::engine::Engine::sync`] or
    /// [`crate::engine::Engine::plan_sync`]) *before* the data is written, if anything:
    /// the plan's own record, appended at planning (as a write step writes an overwrite of
    /// unflushed valid blocks: design.md, "Overwrites in place and kill -9").
    pub fn sync_first(&self) -> Option<Unsynced> {
        self.ahead.map(|seq| Unsynced { upto: seq + 1 })
    }

    /// The caller wrote `data` (the plan's length) at [`WritePlan::device_offset`]: record it
    /// as [`crate::engine::Engine::write_unsynced`] would, then release the chunk. What is
    /// returned must be synced ([`crate::engine::Engine::sync`]) before the write is
    /// acknowledged. Blocks only on the engine's state lock (and, rarely, to read a bitmap
    /// block evicted since the plan).
    pub fn complete(self, data: &[u8]) -> Result<Unsynced, EngineError> {
        if data.len() as u64 != self.len {
            return Err(EngineError::Invalid(format!(
                "a write plan of {} bytes completed with {} bytes",
                self.len,
                data.len()
            )));
        }
        let s = &self.slot;
        let inner = &*s.inner;
        let last = match self.ahead {
            Some(seq) => {
                inner.stats.written_ahead.fetch_add(1, Ordering::Relaxed);
                seq
            }
            None => record_blocks(
                inner,
                s.chunk,
                self.zone,
                self.other,
                s.block,
                s.n,
                block_crcs(data),
            )?,
        };
        let c = &inner.stats;
        c.writes.fetch_add(1, Ordering::Relaxed);
        c.write_bytes.fetch_add(self.len, Ordering::Relaxed);
        c.planned_writes.fetch_add(1, Ordering::Relaxed);
        Ok(if last == 0 {
            Unsynced::NOTHING
        } else {
            Unsynced { upto: last + 1 }
        })
    }

    /// Test hook: write `data` where the plan says, through the engine's device (what a
    /// caller's own ring does through the device's file).
    #[doc(hidden)]
    pub fn write_for_test(&self, data: &[u8]) -> Result<(), EngineError> {
        Ok(self.slot.inner.dev_write(data, self.device_offset)?)
    }
}

impl std::fmt::Debug for WritePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WritePlan")
            .field("device_offset", &self.device_offset)
            .field("len", &self.len)
            .field("zone", &self.zone)
            .finish()
    }
}

/// See [`crate::engine::Engine::plan_write`]. Takes the chunk lock (shared) and the state
/// lock with `try_` only, and decides as a write step would (`write::write_step`): a plan
/// only where that step would write the data in place, at once or after its record
/// (`write_ahead`, whose record is appended here).
pub(in crate::engine) fn plan_write(
    inner: &Arc<Inner>,
    offset: u64,
    data: &[u8],
) -> Option<WritePlan> {
    let len = data.len() as u64;
    check_range(inner, offset, len).ok()?;
    inner.check_failed().ok()?;
    let zs = inner.geo.zone_size;
    if len == 0 || offset / zs != (offset + len - 1) / zs {
        return None;
    }
    let n = (len / B) as u32;
    if n > IO_BATCH_BLOCKS {
        return None;
    }
    let chunk = ChunkId((offset / zs) as u32);
    let b = ((offset % zs) / B) as u32;
    let guard = inner.chunk_lock(chunk).try_read_arc()?;
    let mut st = inner.state.try_lock()?;
    if st.planned.overlaps(chunk, b, n) {
        return None;
    }
    let m = st.meta.mapping(chunk);
    let dz = m.dzone?;
    let dzi = st.meta.zone(dz);
    // As `write::place` does: a conventional data zone in place; below a sequential data
    // zone's write pointer, the buffer zone in place, invalidating the data zone's copies,
    // unless the write (with the chunk's other plans) could empty the data zone: that step
    // flushes first.
    let (target, other) = if !dzi.seq {
        (dz, None)
    } else {
        let bz = m.bzone?;
        if b + n > dzi.wp || dzi.weight <= st.planned.blocks(chunk) + n {
            return None;
        }
        (bz, Some(dz))
    };
    if st.meta.zone(target).seq || m.zones().any(|z| st.meta.is_retired(z)) {
        return None;
    }
    // Only where the caller's file reaches (a multi-device volume's source is the cache).
    let device_offset = inner.zone_offset(target, b);
    if inner
        .dev
        .read_source()
        .is_some_and(|s| !s.covers(device_offset, len))
    {
        return None;
    }
    let mut ahead = false;
    match st.meta.proof(target) {
        Proof::Proven => {}
        Proof::FlushedUnproven => return None,
        Proof::Unflushed => {
            // A write step would cut at the first validity change (for the pool), write the
            // record of an overwrite of valid blocks ahead of the data (so does this plan),
            // or sync the log up to the record that invalidated the blocks first (for the
            // pool).
            let bits = st.meta.bits_cached(target, b, n)?;
            let valid = bits[0];
            if bits.count_ones() != if valid { n as usize } else { 0 } {
                return None;
            }
            if let Some(o) = other {
                // Only cached bitmap blocks on a queue thread (the check reads the other
                // zone's bits too).
                st.meta.bits_cached(o, b, n)?;
            }
            ahead = valid
                && !st
                    .meta
                    .overwrite_needs_no_record(&*inner.dev, target, other, b, n)
                    .ok()?;
            let cleared = st.meta.zone(target).last_cleared_seq;
            if !ahead && cleared > 0 && !st.meta.log_holds(cleared) {
                return None;
            }
        }
    }
    // The record of an overwrite ahead of its data: appended now (its bits change
    // nothing), unless the log half would have to be committed first (the caller must
    // not wait).
    let ahead = if ahead {
        let crcs = block_crcs(data);
        Some(meta::written_ahead_if_room(inner, &mut st, target, b, other, crcs).ok()??)
    } else {
        None
    };
    // Every plan counts as an overwrite in place in flight, a `Proven` one too: another plan
    // of the zone may append a record while this one is in flight, and a flush meanwhile
    // must then prove that record, or this one's record would follow it unproven and
    // hide it from the next write step's proof check (design.md, "Hop-free writes").
    st.in_place.begin();
    st.planned.add(chunk, b, n);
    st.last_io = Instant::now();
    st.meta.touch(target);
    drop(st);
    Some(WritePlan {
        device_offset,
        len,
        zone: target,
        other,
        ahead,
        slot: Slot {
            inner: inner.clone(),
            chunk,
            block: b,
            n,
        },
        _guard: guard,
    })
}
