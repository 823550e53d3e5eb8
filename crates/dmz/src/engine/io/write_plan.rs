//! Hop-free writes: the one write case a caller may put on the device itself, planned
//! without blocking ([`plan_write`]) and recorded once the caller's write completed
//! ([`WritePlan::complete`]). The case is a write in place into a chunk's conventional
//! zone (its data zone, or its buffer zone below a sequential data zone's write pointer)
//! that needs nothing first: no zone to take, no proof block to write, no record to write
//! ahead of the data, no earlier invalidation to get into the log, no flush. Every other
//! write goes through [`super::write`] (docs/design.md, "Hop-free writes").

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::lock_api::ArcRwLockWriteGuard;
use parking_lot::RawRwLock;

use super::super::ids::{ChunkId, ZoneId, IO_BATCH_BLOCKS};
use super::super::meta::Proof;
use super::super::{EngineError, Inner, Unsynced};
use super::write::{block_crcs, record_blocks, InPlace};
use super::{check_range, B};

/// A write planned by [`crate::engine::Engine::plan_write`]: where its blocks go on the
/// device, with the chunk's write lock held until the plan is completed or dropped, so that
/// nothing else writes, reclaims or remaps the chunk meanwhile. The caller writes the data
/// at [`WritePlan::device_offset`] (through the device's [`zbd::ReadSource`] when its
/// `conv_writes` allows it) and then calls [`WritePlan::complete`]; a plan dropped without
/// it (the caller's write failed) records nothing, and the caller redoes the write with
/// [`crate::engine::Engine::write`], which reports the error. Not `Send` (parking_lot
/// guards): completed or dropped on the thread that planned it.
pub struct WritePlan {
    device_offset: u64,
    len: u64,
    chunk: ChunkId,
    zone: ZoneId,
    /// The chunk's other zone, whose copies of the blocks the write invalidates.
    other: Option<ZoneId>,
    block: u32,
    /// An overwrite of records not flushed yet, counted until its record is appended (see
    /// `durability::InPlaceWrites`). Declared before the guard: it ends under the chunk lock,
    /// as in a write step.
    _in_place: Option<InPlace<Arc<Inner>>>,
    inner: Arc<Inner>,
    _guard: ArcRwLockWriteGuard<RawRwLock, ()>,
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
        let inner = &*self.inner;
        let cnt = (self.len / B) as u32;
        let last = record_blocks(
            inner,
            self.chunk,
            self.zone,
            self.other,
            self.block,
            cnt,
            block_crcs(data),
        )?;
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
        Ok(self.inner.dev_write(data, self.device_offset)?)
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

/// See [`crate::engine::Engine::plan_write`]. Takes the chunk and state locks with `try_`
/// only, and decides as a write step would (`write::write_step`): a plan only where that
/// step would write the data in place at once.
pub(in crate::engine) fn plan_write(
    inner: &Arc<Inner>,
    offset: u64,
    len: u64,
) -> Option<WritePlan> {
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
    let guard = inner.chunk_lock(chunk).try_write_arc()?;
    let mut st = inner.state.try_lock()?;
    let m = st.meta.mapping(chunk);
    let dz = m.dzone?;
    let dzi = st.meta.zone(dz);
    // As `write::place` does: a conventional data zone in place; below a sequential data
    // zone's write pointer, the buffer zone in place, invalidating the data zone's copies
    // (unless the write would empty the data zone: that step flushes first).
    let (target, other) = if !dzi.seq {
        (dz, None)
    } else {
        let bz = m.bzone?;
        if b + n > dzi.wp || dzi.weight <= n {
            return None;
        }
        (bz, Some(dz))
    };
    if st.meta.zone(target).seq || m.zones().any(|z| st.meta.is_retired(z)) {
        return None;
    }
    let in_place = match st.meta.proof(target) {
        Proof::Proven => None,
        Proof::FlushedUnproven => return None,
        Proof::Unflushed => {
            // A write step would cut at the first validity change, write the record of an
            // overwrite of valid blocks ahead of the data, or sync the log up to the record
            // that invalidated the blocks first: all for the pool.
            let bits = st.meta.bits_cached(target, b, n)?;
            let valid = bits[0];
            if bits.count_ones() != if valid { n as usize } else { 0 } {
                return None;
            }
            if valid
                && !st
                    .meta
                    .overwrite_needs_no_record(&*inner.dev, target, b, n)
                    .ok()?
            {
                return None;
            }
            let cleared = st.meta.zone(target).last_cleared_seq;
            if cleared > 0 && !st.meta.log_holds(cleared) {
                return None;
            }
            Some(InPlace::begin(inner.clone(), &mut st))
        }
    };
    st.last_io = Instant::now();
    st.meta.touch(target);
    drop(st);
    Some(WritePlan {
        device_offset: inner.zone_offset(target, b),
        len,
        chunk,
        zone: target,
        other,
        block: b,
        _in_place: in_place,
        inner: inner.clone(),
        _guard: guard,
    })
}
