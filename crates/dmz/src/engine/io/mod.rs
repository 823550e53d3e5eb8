//! The I/O path, in 4 KiB blocks, one chunk at a time: reads by validity bits (zeros where
//! nothing is valid), writes ([`write`]: at a sequential zone's write pointer, in place in
//! conventional zones, or into the chunk's buffer zone), discards by invalidation.

mod write;
mod write_plan;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::lock_api::ArcRwLockReadGuard;
use parking_lot::RawRwLock;

use super::ids::{ChunkId, ZoneId, BLOCK};
use super::meta::{self, durability};
use super::{retired_error, EngineError, Inner, State};

pub(super) use write::{sync, write};
pub use write_plan::WritePlan;
pub(super) use write_plan::{plan_write, PlannedWrites};

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

/// One chunk's part of a request.
struct Piece {
    chunk: ChunkId,
    /// First block in the chunk.
    block: u32,
    /// Bytes, and where they start in the request.
    len: usize,
    pos: usize,
}

/// Split `[offset, offset + len)` at chunk ends.
fn split(inner: &Inner, offset: u64, len: u64) -> Vec<Piece> {
    let zs = inner.geo.zone_size;
    let mut out = Vec::new();
    let mut off = offset;
    let end = offset + len;
    while off < end {
        let n = (zs - off % zs).min(end - off);
        out.push(Piece {
            chunk: ChunkId((off / zs) as u32),
            block: ((off % zs) / B) as u32,
            len: n as usize,
            pos: (off - offset) as usize,
        });
        off += n;
    }
    out
}

pub(super) fn read(inner: &Inner, offset: u64, buf: &mut [u8]) -> Result<(), EngineError> {
    check_range(inner, offset, buf.len() as u64)?;
    for p in split(inner, offset, buf.len() as u64) {
        read_chunk(inner, p.chunk, p.block, &mut buf[p.pos..p.pos + p.len])?;
    }
    inner.stats.reads.fetch_add(1, Ordering::Relaxed);
    inner
        .stats
        .read_bytes
        .fetch_add(buf.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// Where a run of blocks is read from: a zone, or nowhere (zeros).
type Run = (Option<ZoneId>, u32, u32);

/// A chunk range's runs, and the chunk's data zone (None: unmapped).
type Runs = (Vec<Run>, Option<ZoneId>);

/// The runs of (zone or None, first block, count) that blocks `[b, b + n)` of `chunk` are
/// read from, and the chunk's data zone (None: unmapped, all zeros). With `cached`, bitmap
/// blocks are not read from the device: `Ok(None)` if one is not resident. The caller
/// holds the chunk lock (read or write) and keeps it while it reads the runs.
fn runs(
    inner: &Inner,
    st: &mut State,
    chunk: ChunkId,
    b: u32,
    n: u32,
    cached: bool,
) -> Result<Option<Runs>, EngineError> {
    let m = st.meta.mapping(chunk);
    let Some(dz) = m.dzone else {
        return Ok(Some((vec![(None, b, n)], None)));
    };
    let mut bits = |z: ZoneId| -> Result<Option<_>, EngineError> {
        if cached {
            Ok(st.meta.bits_cached(z, b, n))
        } else {
            st.meta.bits(&*inner.dev, z, b, n).map(Some)
        }
    };
    let Some(vd) = bits(dz)? else { return Ok(None) };
    let vb = match m.bzone {
        Some(bz) => match bits(bz)? {
            Some(v) => Some(v),
            None => return Ok(None),
        },
        None => None,
    };
    let mut runs: Vec<Run> = Vec::new();
    for i in 0..n {
        let src = if vd[i as usize] {
            Some(dz)
        } else if vb.as_ref().is_some_and(|v| v[i as usize]) {
            m.bzone
        } else {
            None
        };
        match runs.last_mut() {
            Some(r) if r.0 == src && r.1 + r.2 == b + i => r.2 += 1,
            _ => runs.push((src, b + i, 1)),
        }
    }
    Ok(Some((runs, Some(dz))))
}

fn read_chunk(inner: &Inner, chunk: ChunkId, b: u32, buf: &mut [u8]) -> Result<(), EngineError> {
    let _g = inner.chunk_lock(chunk).read();
    let n = (buf.len() / BLOCK) as u32;
    let runs = {
        let mut st = inner.state.lock();
        st.last_io = Instant::now();
        let (runs, dz) = runs(inner, &mut st, chunk, b, n, false)?.expect("not cached-only");
        if let Some(dz) = dz {
            st.meta.touch(dz);
        }
        runs
    };
    for (zone, start, cnt) in runs {
        let s = (start - b) as usize * BLOCK;
        let d = &mut buf[s..s + cnt as usize * BLOCK];
        match zone {
            None => d.fill(0),
            Some(zone) => {
                if let Err(e) = inner.dev.read_at(d, inner.zone_offset(zone, start)) {
                    // An offline zone is retired: its data is lost, and reads of it fail.
                    inner.recheck_zone(zone);
                    return Err(e.into());
                }
            }
        }
    }
    Ok(())
}

/// One part of a [`ReadPlan`], in request order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSegment {
    /// `len` bytes of zeros (nothing valid there).
    Zeros { len: u32 },
    /// `len` bytes at byte `offset` of the [`zbd::ReadSource`] file (its `base` included).
    Device { offset: u64, len: u32 },
}

/// A planned read of part of one chunk ([`crate::engine::Engine::plan_read`]): the segments
/// to read, and the chunk's read lock, held until the plan is dropped. The lock is what
/// keeps the zones the segments name from being freed, reset or rewritten (by a write,
/// discard or reclaim of the chunk, which all take it for writing; a zone is only reused by
/// another chunk after it was freed under it). Not `Send`: it is dropped on the thread
/// that planned it (parking_lot guards).
pub struct ReadPlan {
    segments: Vec<ReadSegment>,
    len: u64,
    inner: Arc<Inner>,
    _guard: ArcRwLockReadGuard<RawRwLock, ()>,
}

impl ReadPlan {
    pub fn segments(&self) -> &[ReadSegment] {
        &self.segments
    }

    /// Bytes the plan covers.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The caller read every segment: count the read (as [`read`] does) and release the
    /// chunk. Dropping a plan without this (its read failed; the caller retries with
    /// [`read`], which reports the error) counts nothing.
    pub fn complete(self) {
        let c = &self.inner.stats;
        c.reads.fetch_add(1, Ordering::Relaxed);
        c.read_bytes.fetch_add(self.len, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for ReadPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadPlan")
            .field("segments", &self.segments)
            .field("len", &self.len)
            .finish()
    }
}

/// See [`crate::engine::Engine::plan_read`]. Takes the same locks as [`read_chunk`], in the
/// same order, but only with `try_`: it never waits.
pub(super) fn plan_read(inner: &Arc<Inner>, offset: u64, len: u64) -> Option<ReadPlan> {
    let src = inner.dev.read_source()?;
    check_range(inner, offset, len).ok()?;
    let zs = inner.geo.zone_size;
    if len == 0 || offset / zs != (offset + len - 1) / zs {
        return None;
    }
    let chunk = ChunkId((offset / zs) as u32);
    let b = ((offset % zs) / B) as u32;
    let n = (len / B) as u32;
    let guard = inner.chunk_lock(chunk).try_read_arc()?;
    let mut st = inner.state.try_lock()?;
    st.last_io = Instant::now();
    let (runs, dz) = runs(inner, &mut st, chunk, b, n, true).ok()??;
    // Retired zones: the read reports what the device says. Zones the source does not
    // reach (a multi-device volume's zoned drives): the read goes through the device.
    if runs.iter().any(|&(z, start, cnt)| {
        z.is_some_and(|z| {
            st.meta.is_retired(z)
                || !src.covers(inner.zone_offset(z, start), cnt as u64 * BLOCK as u64)
        })
    }) {
        return None;
    }
    if let Some(dz) = dz {
        st.meta.touch(dz);
    }
    drop(st);
    let segments = runs
        .into_iter()
        .map(|(zone, start, cnt)| {
            let len = cnt * BLOCK as u32;
            match zone {
                None => ReadSegment::Zeros { len },
                Some(z) => ReadSegment::Device {
                    offset: src.base + inner.zone_offset(z, start),
                    len,
                },
            }
        })
        .collect();
    Some(ReadPlan {
        segments,
        len,
        inner: inner.clone(),
        _guard: guard,
    })
}

pub(super) fn discard(inner: &Inner, offset: u64, len: u64) -> Result<(), EngineError> {
    check_range(inner, offset, len)?;
    inner.check_failed()?;
    let mut last = 0;
    for p in split(inner, offset, len) {
        let _g = inner.chunk_lock(p.chunk).write();
        let mut st = inner.state.lock();
        st.last_io = Instant::now();
        let m = st.meta.mapping(p.chunk);
        if m.dzone.is_none() {
            continue;
        }
        for z in m.zones() {
            if st.meta.is_retired(z) {
                return Err(retired_error(st.meta.zone(z).role, p.chunk, z));
            }
        }
        let cnt = (p.len / BLOCK) as u32;
        last = last.max(meta::invalidated(inner, &mut st, m, p.block, cnt)?);
        if let Some(s) = meta::put_chunk(inner, &mut st, p.chunk)? {
            last = last.max(s);
        }
    }
    if last > 0 {
        durability::log_sync(inner, last + 1, false, false)?;
    }
    inner.stats.discards.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
