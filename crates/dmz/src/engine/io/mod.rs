//! The I/O path, in 4 KiB blocks, one chunk at a time: reads by validity bits (zeros where
//! nothing is valid), writes ([`write`]: at a sequential zone's write pointer, in place in
//! conventional zones, or into the chunk's buffer zone), discards by invalidation.

mod write;

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::ids::{ChunkId, ZoneId, BLOCK};
use super::meta::{self, durability};
use super::{retired_error, EngineError, Inner};

pub(super) use write::write;

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

fn read_chunk(inner: &Inner, chunk: ChunkId, b: u32, buf: &mut [u8]) -> Result<(), EngineError> {
    let _g = inner.chunk_lock(chunk).read();
    let n = (buf.len() / BLOCK) as u32;
    // Runs of (zone or None, first block, count).
    let mut runs: Vec<Run> = Vec::new();
    {
        let mut st = inner.state.lock();
        st.last_io = Instant::now();
        let m = st.meta.mapping(chunk);
        let Some(dz) = m.dzone else {
            buf.fill(0);
            return Ok(());
        };
        let vd = st.meta.bits(&*inner.dev, dz, b, n)?;
        let vb = match m.bzone {
            Some(bz) => Some(st.meta.bits(&*inner.dev, bz, b, n)?),
            None => None,
        };
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
        st.meta.touch(dz);
    }
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
