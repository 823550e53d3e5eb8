//! The copy machinery of reclaim: copying runs of blocks into the destination zone, and
//! undoing a reclaim that failed before its record.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::warn;

use super::super::ids::{ZoneId, BLOCK, IO_BATCH_BLOCKS};
use super::super::{EngineError, Inner, Recheck};
use super::Mode;

/// Where the destination's blocks come from: runs of (first dst block, count, source zone
/// or `None` for zeros).
pub(super) type Runs = Vec<(u32, u32, Option<ZoneId>)>;

/// A reclaim failed before its record: nothing names what it wrote into `dst`. A fresh
/// destination goes back to its pool (or is retired); the write pointers are taken from the
/// device. If a zone involved went offline or read-only it is retired and the chunk left
/// as it is (false); any other error stands.
pub(super) fn abandon(
    inner: &Inner,
    dst: ZoneId,
    fresh: bool,
    srcs: &[ZoneId],
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
        if st.meta.is_retired(dst) {
            st.meta.disown(dst);
        } else {
            if !dst_known {
                // Its write pointer is unknown: make sure it is reset before reuse.
                st.meta.set_wp(dst, inner.zone_blocks);
            }
            st.meta.give_back(dst);
        }
    }
    drop(st);
    if lost {
        warn!(error = %err, %dst, ?srcs, "reclaim: a zone was lost; chunk left as it is");
        return Ok(false);
    }
    Err(err)
}

/// Blocks to read, then write, at a time: `copy_batch_blocks` within one device, where each
/// switch between source and destination is a seek on a disk (on the hdd model a drain
/// within one drive ran 1.9x faster in 8 MiB batches than in 1 MiB ones), and 1 MiB from a
/// multi-device volume's cache onto a drive, where the drive's write cache takes each write
/// at once and writes it out while the next is read (there larger batches ran slower: 0.94x
/// at 8 MiB).
fn batch_blocks(inner: &Inner, dst: ZoneId, runs: &Runs) -> u32 {
    let member = |z: ZoneId| inner.members.iter().position(|m| m.contains(&z.0));
    let within = runs
        .iter()
        .filter_map(|r| r.2)
        .all(|src| member(src) == member(dst));
    let batch = if within {
        inner.opts.reclaim.copy_batch_blocks
    } else {
        IO_BATCH_BLOCKS
    };
    batch.clamp(1, inner.zone_blocks)
}

/// Copy the runs into `dst` in batches (zeros for holes of a sequential destination):
/// [`batch_blocks`]. Returns the blocks written.
///
/// The buffer is one of `Inner::copy_bufs`, kept between copies as dm-kcopyd keeps its
/// reserved pages: allocating and zeroing a fresh one for every zone cost 11 % of the CPU
/// of the engine model test (1 MiB zones). As many buffers are kept as copies ever ran at
/// once (at most `ReclaimOptions::parallel`), each as large as the largest batch it served
/// ([`batch_blocks`]: at most a zone, and `copy_batch_blocks` or 1 MiB).
pub(super) fn copy(
    inner: &Inner,
    dst: ZoneId,
    dst_seq: bool,
    runs: &Runs,
    mode: Mode,
) -> Result<u64, EngineError> {
    let batch = batch_blocks(inner, dst, runs);
    // 4 KiB-aligned, so that an O_DIRECT backend reads and writes it without a bounce copy.
    let mut buf = inner.copy_bufs.lock().pop().unwrap_or_default();
    let len = batch as usize * BLOCK;
    if buf.len() < len {
        // Exactly one batch (what it held does not matter): `resize` could round the
        // capacity up the way `Vec` grows.
        buf = zbd::AlignedBuf::new_zeroed(len);
    }
    let r = copy_batches(inner, dst, dst_seq, runs, mode, &mut buf[..len]);
    inner.copy_bufs.lock().push(buf);
    r
}

/// [`copy`] with its buffer, one batch long: every byte of it that is written to `dst` was
/// read or zero-filled first.
fn copy_batches(
    inner: &Inner,
    dst: ZoneId,
    dst_seq: bool,
    runs: &Runs,
    mode: Mode,
    buf: &mut [u8],
) -> Result<u64, EngineError> {
    let batch = (buf.len() / BLOCK) as u32;
    let dev = &*inner.dev;
    let mut written = 0u64;
    inner.stats.reclaim_progress.store(0, Ordering::Relaxed);
    // Pieces of at most `batch` blocks, never crossing a run.
    let mut pieces: Vec<(u32, u32, Option<ZoneId>)> = Vec::new();
    for &(start, len, src) in runs {
        if src.is_none() && !dst_seq {
            continue;
        }
        let mut o = 0;
        while o < len {
            let n = (len - o).min(batch);
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
        while j < pieces.len() && pieces[j].0 == first + used && used + pieces[j].1 <= batch {
            let (b, n, src) = pieces[j];
            let d = &mut buf[used as usize * BLOCK..(used + n) as usize * BLOCK];
            match src {
                None => d.fill(0),
                Some(src) => dev.read_at(d, inner.zone_offset(src, b))?,
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
        inner
            .stats
            .reclaim_copied_total
            .fetch_add(used as u64, Ordering::Relaxed);
        i = j;
        if mode != Mode::Urgent && !inner.opts.reclaim.throttle.is_zero() {
            let recent = inner.state.lock().last_io.elapsed() < Duration::from_millis(50);
            if recent {
                // The pause is per MiB copied, whatever the batch.
                let mib = used.div_ceil(IO_BATCH_BLOCKS);
                std::thread::sleep(inner.opts.reclaim.throttle * mib);
            }
        }
    }
    Ok(written)
}
