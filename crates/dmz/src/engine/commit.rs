//! Durability: writing the log, flush and FUA, the two-phase commit into the v2 sets, and
//! load-time replay. The ordering rules are in docs/design.md, "Commit and crash ordering".

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, RwLock};
use tracing::{debug, info, warn};
use zbd::ZonedDevice;

use crate::format::BLOCK;
use crate::sets;

use super::log::{scan_half, LogBuf, Rec, NONE};
use super::metacache::MetaCache;
use super::zones::{Role, Zones};
use super::{read_map, unmapped, Bg, Counters, EngineError, EngineOptions, Inner, State};

/// Write every record appended so far (sealing the current block when `seal`, even an
/// empty one when `force`). Returns (records written below, flushed_seq in the last block).
pub(super) fn log_sync(
    inner: &Inner,
    upto: u64,
    seal: bool,
    force: bool,
) -> Result<(u64, u64), EngineError> {
    let _w = inner.log_write.lock();
    // A log write that failed under this lock dropped the records it had taken, ours
    // possibly among them: never report them written.
    inner.check_failed()?;
    let (pending, next, hdr) = {
        let mut st = inner.state.lock();
        if !seal && st.log.written_seq >= upto {
            return Ok((st.log.written_seq, st.log.written_header_flushed));
        }
        if seal {
            st.log.seal(force);
        }
        (st.log.take_pending(), st.log.next_seq, st.log.flushed_seq)
    };
    write_blocks(inner, &pending)?;
    let mut st = inner.state.lock();
    st.log.written_seq = st.log.written_seq.max(next);
    if !pending.is_empty() {
        st.log.written_header_flushed = hdr;
        st.log.blocks_written += pending.len() as u64;
    }
    Ok((st.log.written_seq, st.log.written_header_flushed))
}

/// Write log block images, merging contiguous blocks that stay within one zone.
fn write_blocks(inner: &Inner, blocks: &[(u64, Box<[u8; BLOCK]>)]) -> Result<(), EngineError> {
    let zb = inner.zone_blocks as u64;
    let mut i = 0;
    while i < blocks.len() {
        let start = blocks[i].0;
        let mut j = i + 1;
        while j < blocks.len()
            && blocks[j].0 == blocks[j - 1].0 + 1
            && blocks[j].0 / zb == start / zb
        {
            j += 1;
        }
        let bufs: Vec<&[u8]> = blocks[i..j].iter().map(|b| &b.1[..]).collect();
        inner
            .dev
            .writev_at(&bufs, start * BLOCK as u64)
            .inspect_err(|e| inner.fail(&EngineError::Meta(format!("log write: {e}"))))?;
        inner.stats.dev_bytes.fetch_add(
            ((j - i) * BLOCK) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        i = j;
    }
    Ok(())
}

/// Flush: write out the log (sealing its block: a block a flush covered is never written
/// again), flush the device, then let zones freed by now-durable records be reused.
/// `evidence` forces a block carrying the latest flushed sequence number (see design.md).
pub(super) fn flush(inner: &Inner, evidence: bool) -> Result<(), EngineError> {
    if evidence && !inner.state.lock().log.has_room(super::log::PAYLOAD) {
        // No room left for a proof block in this half: fold the log instead.
        return commit(inner);
    }
    let (written, hdr) = log_sync(inner, u64::MAX, true, evidence)?;
    let cands = inner.state.lock().zones.flushable_frees(written);
    dev_flush(inner)?;
    let need_proof = {
        let mut st = inner.state.lock();
        st.log.flushed_seq = st.log.flushed_seq.max(written);
        st.log.evidence_seq = st.log.evidence_seq.max(hdr);
        let floor = st.log.evidence_seq.max(st.log.folded_seq);
        cands
            .iter()
            .any(|&(z, _)| st.zones.z[z as usize].last_seq >= floor.max(1))
    };
    if need_proof && !inner.state.lock().log.has_room(super::log::PAYLOAD) {
        // The commit promotes the zones itself once their records are folded.
        return commit(inner);
    }
    if need_proof {
        // A freed zone gets overwritten once reused: replay must then trust (not check) the
        // records that validated its old contents, so make a block proving their flush
        // durable first.
        let (_, hdr) = log_sync(inner, u64::MAX, true, true)?;
        dev_flush(inner)?;
        let mut st = inner.state.lock();
        st.log.evidence_seq = st.log.evidence_seq.max(hdr);
    }
    let mut st = inner.state.lock();
    if st.zones.promote(&cands) > 0 {
        inner.free_cv.notify_all();
    }
    Ok(())
}

fn dev_flush(inner: &Inner) -> Result<(), EngineError> {
    inner
        .dev
        .flush()
        .inspect_err(|e| inner.fail(&EngineError::Meta(format!("device flush: {e}"))))?;
    Ok(())
}

/// Fold everything logged so far into the v2 sets (dm-zoned's two-phase commit: set 1
/// first, then set 0, a device flush after each step) and start the next log epoch.
pub(super) fn commit(inner: &Inner) -> Result<(), EngineError> {
    inner.check_failed()?;
    let _c = inner.commit_lock.lock();
    let (snap, new_gen, start_seq, cands) = {
        let _w = inner.log_write.lock();
        // Everything of this epoch goes out before the switch, so a later epoch's records
        // can only be durable if this epoch's are. Appends do not take `log_write`, so
        // repeat until nothing is left, then switch under the state lock.
        let mut st = inner.state.lock();
        loop {
            st.log.seal(false);
            let pending = st.log.take_pending();
            if pending.is_empty() {
                break;
            }
            let n = pending.len() as u64;
            parking_lot::MutexGuard::unlocked(&mut st, || write_blocks(inner, &pending))?;
            st.log.blocks_written += n;
        }
        let next = st.log.next_seq;
        st.log.written_seq = next;
        if !st.meta.is_dirty() && st.log.epoch_start_seq == next && !st.log.needs_switch {
            return Ok(());
        }
        let snap = st.meta.snapshot();
        let new_gen = st.log.epoch + 1;
        st.log.switch_epoch(new_gen);
        st.log.needs_switch = false;
        inner.bg.lock().dirty_since = None;
        let cands = st.zones.flushable_frees(next);
        (snap, new_gen, next, cands)
    };
    let res = write_sets(inner, &snap, new_gen);
    if let Err(e) = res {
        inner.fail(&e);
        return Err(e);
    }
    let mut st = inner.state.lock();
    st.meta.commit_done(&snap);
    st.log.folded_seq = start_seq;
    st.log.flushed_seq = st.log.flushed_seq.max(start_seq);
    if st.zones.promote(&cands) > 0 {
        inner.free_cv.notify_all();
    }
    drop(st);
    inner
        .stats
        .commits
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    debug!(gen = new_gen, blocks = snap.len(), "committed");
    Ok(())
}

fn write_sets(
    inner: &Inner,
    snap: &[super::metacache::SnapBlock],
    gen: u64,
) -> Result<(), EngineError> {
    let dev = &*inner.dev;
    // The data (and log) the snapshot points at must be durable before any set says so.
    dev.flush()?;
    let mut sb = inner.sb.lock().clone();
    sb.gen = gen;
    for set in [1usize, 0] {
        let mut i = 0;
        while i < snap.len() {
            let mut j = i + 1;
            while j < snap.len() && snap[j].mblk == snap[j - 1].mblk + 1 && j - i < 256 {
                j += 1;
            }
            let mut buf = Vec::with_capacity((j - i) * BLOCK);
            for b in &snap[i..j] {
                buf.extend_from_slice(&b.data[..]);
            }
            sets::write_meta_blocks(dev, &inner.layout, set, snap[i].mblk, &buf)?;
            inner
                .stats
                .dev_bytes
                .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
            i = j;
        }
        dev.flush()?;
        sets::write_superblock(dev, &inner.layout, set, &sb)?;
        dev.flush()?;
    }
    *inner.sb.lock() = sb;
    Ok(())
}

/// The commit thread: sleeps on a condvar (no wakeups while clean), commits when the
/// interval since the first change has passed, or when asked (log half filling up).
pub(super) fn commit_thread(inner: &Arc<Inner>) {
    loop {
        {
            let mut bg = inner.bg.lock();
            loop {
                if bg.stop {
                    return;
                }
                if bg.commit_wanted {
                    bg.commit_wanted = false;
                    break;
                }
                match bg.dirty_since {
                    None => inner.bg_cv.wait(&mut bg),
                    Some(t) => {
                        let due = t + inner.opts.commit_interval;
                        if Instant::now() >= due {
                            break;
                        }
                        inner.bg_cv.wait_until(&mut bg, due);
                    }
                }
            }
        }
        if inner.check_failed().is_err() {
            // Nothing more can be made durable; wait for the stop.
            let mut bg = inner.bg.lock();
            while !bg.stop {
                inner.bg_cv.wait(&mut bg);
            }
            return;
        }
        if let Err(e) = commit(inner) {
            warn!(error = %e, "periodic commit failed");
        }
    }
}

/// Note that metadata changed: arm the commit timer; ask for an early commit when the log
/// half is filling up.
pub(super) fn note_dirty(inner: &Inner, st: &mut State) {
    let want = st.log.used_pct() >= inner.opts.log_commit_pct
        || st.meta.dirty_bitmaps > inner.opts.cache_bitmap_blocks / 2;
    let mut bg = inner.bg.lock();
    let first = bg.dirty_since.is_none();
    if first {
        bg.dirty_since = Some(Instant::now());
    }
    if want && !bg.commit_wanted {
        bg.commit_wanted = true;
    } else if !first {
        return;
    }
    drop(bg);
    inner.bg_cv.notify_all();
}

/// Append one operation's records atomically with their effect on memory. Commits first
/// (synchronously) when the log half has no room. Returns the last record's sequence.
pub(super) fn log_op(
    inner: &Inner,
    st: &mut parking_lot::MutexGuard<'_, State>,
    recs: &[Rec],
) -> Result<u64, EngineError> {
    let mut len = 0;
    {
        let mut v = Vec::new();
        for r in recs {
            r.encode(&mut v);
        }
        len += v.len();
    }
    let mut tries = 0;
    while !st.log.has_room(len) {
        tries += 1;
        if tries > 3 {
            return Err(EngineError::Meta("metadata log full".into()));
        }
        parking_lot::MutexGuard::unlocked(st, || commit(inner))?;
    }
    let first = st.log.next_seq;
    for (k, r) in recs.iter().enumerate() {
        if let Err(e) = st.apply(&*inner.dev, r, first + k as u64, true) {
            inner.fail(&e);
            return Err(e);
        }
    }
    let last = st.log.append(recs);
    note_dirty(inner, st);
    Ok(last)
}

/// Check a Write record's blocks at replay. A record a durable log block proves flushed is
/// trusted; otherwise each block must be below a sequential zone's write pointer and hold
/// the data the record describes (each block on its own: a later logged write may have
/// overwritten some of them in place).
fn landed_blocks(
    dev: &dyn ZonedDevice,
    zones: &Zones,
    zone_size: u64,
    zone: u32,
    block: u32,
    crcs: &[u32],
    proven: bool,
) -> Vec<bool> {
    // A proven record's data was durable when written; the zone may have been freed, reset
    // and reused since (later records say so), so today's write pointer proves nothing.
    if proven {
        return vec![true; crcs.len()];
    }
    let zi = &zones.z[zone as usize];
    let mut ok: Vec<bool> = (0..crcs.len() as u32)
        .map(|i| !zi.seq || block + i < zi.wp)
        .collect();
    let mut buf = vec![0u8; crcs.len() * BLOCK];
    let off = zone as u64 * zone_size + block as u64 * BLOCK as u64;
    if dev.read_at(&mut buf, off).is_err() {
        return vec![false; crcs.len()];
    }
    for (i, c) in crcs.iter().enumerate() {
        ok[i] &= crc32fast::hash(&buf[i * BLOCK..(i + 1) * BLOCK]) == *c;
    }
    ok
}

/// Whether every zone and chunk number in a record is in range and usable.
fn rec_in_range(rec: &Rec, nr_zones: u32, nr_chunks: u32, zb: u32) -> bool {
    let z = |z: u32| z < nr_zones;
    let zo = |v: u32| v == NONE || v < nr_zones;
    let blk = |b: u32, n: u32| n > 0 && (b as u64 + n as u64) <= zb as u64;
    match rec {
        Rec::Map {
            chunk,
            dzone,
            bzone,
        } => *chunk < nr_chunks && zo(*dzone) && zo(*bzone),
        Rec::Write {
            zone,
            block,
            other,
            crcs,
        } => z(*zone) && zo(*other) && *other != *zone && blk(*block, crcs.len() as u32),
        Rec::Invalidate { zone, block, count } => z(*zone) && blk(*block, *count),
        Rec::Free { zone } => z(*zone),
        Rec::Reclaim {
            chunk,
            dst,
            srcs,
            dzone,
            bzone,
        } => {
            *chunk < nr_chunks
                && z(*dst)
                && srcs.iter().all(|s| z(*s) && s != dst)
                && zo(*dzone)
                && zo(*bzone)
        }
    }
}

/// Open: load the sets, build the zone table and map, compute weights, replay the log,
/// clean up, and fold it all with a commit.
pub(super) fn load(dev: Arc<dyn ZonedDevice>, opts: EngineOptions) -> Result<Inner, EngineError> {
    let loaded = sets::load(&*dev)?;
    for a in &loaded.actions {
        info!("{a}");
    }
    let geo = dev.geometry();
    let layout = loaded.layout.clone();
    let sb = loaded.sb.clone();
    let zb = layout.zone_blocks;
    let report = dev.report_all()?;
    // A degraded volume's lost zones come out of the reserved pool.
    let nr_reserved = layout.nr_reserved_seq.saturating_sub(layout.nr_lost_zones);
    let mut zones = Zones::from_report(&report, geo.zone_size, nr_reserved);
    for z in layout.meta_zones() {
        zones.z[z as usize].role = Role::Meta;
    }
    let map = read_map(&*dev, &layout)?;
    let meta = MetaCache::new(layout.clone(), map, opts.cache_bitmap_blocks);

    // Weights: stream the bitmaps once (a 10 TB volume has ~80k bitmap blocks).
    {
        let per_zone = layout.zone_bitmap_blocks;
        let batch_zones = (256 / per_zone).max(1);
        let mut buf = vec![0u8; (batch_zones * per_zone) as usize * BLOCK];
        let mut z = 0u32;
        while z < layout.nr_zones {
            let n = batch_zones.min(layout.nr_zones - z);
            let b = &mut buf[..(n * per_zone) as usize * BLOCK];
            sets::read_meta_blocks(&*dev, &layout, 0, layout.bitmap_block(z, 0), b)?;
            for k in 0..n {
                let s = (k * per_zone) as usize * BLOCK;
                let w = crate::format::count_bits(&b[s..s + per_zone as usize * BLOCK]);
                zones.z[(z + k) as usize].weight = w as u32;
            }
            z += n;
        }
    }

    // The log tails.
    let tail_start = layout.nr_meta_blocks as u64;
    let cap = (layout.nr_meta_zones as u64 * zb as u64).saturating_sub(tail_start);
    if cap < 4 {
        return Err(EngineError::Meta(format!(
            "the metadata zones leave {cap} free blocks for the metadata log (need 4); \
             reformat with a different number of reserved zones"
        )));
    }
    let base = [
        layout.set_start_block(0) + tail_start,
        layout.set_start_block(1) + tail_start,
    ];
    let gen = sb.gen;
    let read_blk = |half: usize, idx: u64| -> Option<Box<[u8; BLOCK]>> {
        let mut b = Box::new([0u8; BLOCK]);
        dev.read_at(&mut b[..], (base[half] + idx) * BLOCK as u64)
            .ok()
            .map(|_| b)
    };
    let mut blocks = scan_half(&sb.set_uuid, gen, cap, |i| read_blk((gen % 2) as usize, i));
    if let Some(last) = blocks.last() {
        let end = last.header.first_seq + last.recs.len() as u64;
        let next = scan_half(&sb.set_uuid, gen + 1, cap, |i| {
            read_blk(((gen + 1) % 2) as usize, i)
        });
        if next.first().map(|b| b.header.epoch_start_seq) == Some(end) {
            blocks.extend(next);
        }
    }
    let proven_below = blocks
        .iter()
        .map(|b| b.header.flushed_seq)
        .max()
        .unwrap_or(0);
    let mut next_seq = 1;
    let mut st = State {
        zones,
        meta,
        log: LogBuf {
            uuid: sb.set_uuid,
            epoch: gen + 1,
            cap,
            base,
            cur_idx: 0,
            cur_first_seq: 0,
            cur_payload: Vec::new(),
            cur_nr: 0,
            cur_written: 0,
            sealed: Vec::new(),
            next_seq: 0,
            epoch_start_seq: 0,
            flushed_seq: 0,
            evidence_seq: 0,
            folded_seq: 0,
            written_seq: 0,
            written_header_flushed: 0,
            blocks_written: 0,
            needs_switch: true,
        },
        waiters: 0,
        conv_queue: Default::default(),
        last_wait: None,
        reclaim_passes: 0,
        reclaim_last_progress: false,
        reclaim_exhausted: false,
        last_io: Instant::now(),
    };
    let (mut applied, mut skipped) = (0u64, 0u64);
    for b in &blocks {
        for (k, rec) in b.recs.iter().enumerate() {
            let seq = b.header.first_seq + k as u64;
            next_seq = seq + 1;
            if !rec_in_range(rec, layout.nr_zones, layout.nr_chunks, zb) {
                skipped += 1;
                continue;
            }
            if let Rec::Write {
                zone,
                block,
                other,
                crcs,
            } = rec
            {
                let ok = landed_blocks(
                    &*dev,
                    &st.zones,
                    geo.zone_size,
                    *zone,
                    *block,
                    crcs,
                    seq < proven_below,
                );
                if ok.iter().any(|x| !x) {
                    skipped += 1;
                    if std::env::var_os("DMZ_DEBUG_REPLAY").is_some() {
                        let bad: Vec<usize> = (0..ok.len()).filter(|&i| !ok[i]).collect();
                        eprintln!(
                            "replay partial seq {seq} zone {zone} block {block} n {} other {other} bad {bad:?} wp {} proven<{proven_below}",
                            ok.len(),
                            st.zones.z[*zone as usize].wp
                        );
                    }
                }
                // Apply the runs of blocks that landed.
                let mut i = 0;
                while i < ok.len() {
                    if !ok[i] {
                        i += 1;
                        continue;
                    }
                    let s0 = i;
                    while i < ok.len() && ok[i] {
                        i += 1;
                    }
                    st.apply_write(
                        &*dev,
                        *zone,
                        block + s0 as u32,
                        (i - s0) as u32,
                        *other,
                        seq,
                    )?;
                }
                applied += 1;
                continue;
            }
            st.apply(&*dev, rec, seq, false)?;
            applied += 1;
        }
    }
    if std::env::var_os("DMZ_DEBUG_REPLAY").is_some() {
        eprintln!(
            "replay gen {gen}: {} blocks, next seq {next_seq}, applied {applied} skipped {skipped}",
            blocks.len()
        );
    }
    if !blocks.is_empty() {
        info!(
            blocks = blocks.len(),
            applied, skipped, "replayed the metadata log"
        );
    }
    cleanup(&*dev, &mut st)?;
    st.zones.build_pools();
    st.log.next_seq = next_seq;
    st.log.cur_first_seq = next_seq;
    st.log.epoch_start_seq = next_seq;
    st.log.written_seq = next_seq;
    st.log.flushed_seq = next_seq;
    st.log.folded_seq = next_seq;

    let nr_locks = (layout.nr_chunks as usize).clamp(1, 4096);
    let executor = opts
        .executor
        .clone()
        .unwrap_or_else(|| Arc::new(super::ThreadExecutor));
    let inner = Inner {
        dev,
        geo,
        zone_blocks: zb,
        layout,
        sb: Mutex::new(sb),
        opts,
        state: Mutex::new(st),
        free_cv: Condvar::new(),
        log_write: Mutex::new(()),
        commit_lock: Mutex::new(()),
        chunk_locks: (0..nr_locks).map(|_| RwLock::new(())).collect(),
        stats: Counters::default(),
        failed: Mutex::new(None),
        is_failed: AtomicBool::new(false),
        bg: Mutex::new(Bg::default()),
        bg_cv: Condvar::new(),
        reclaim_cv: Condvar::new(),
        idle_cv: Condvar::new(),
        executor,
    };
    // Fold the replayed log now; the new generation skips the replayed epochs' halves.
    commit(&inner)?;
    Ok(inner)
}

/// After replay: drop impossible mappings, unmap empty chunks, clear bits past sequential
/// write pointers and in unmapped zones, and set each zone's role.
fn cleanup(dev: &dyn ZonedDevice, st: &mut State) -> Result<(), EngineError> {
    let zb = st.zones.zone_blocks;
    let nr_zones = st.zones.z.len() as u32;
    // A chunk on an offline zone stays mapped: its data is lost, and reads of it must fail
    // rather than return zeros.
    let usable = |r: Role| matches!(r, Role::Free | Role::ReadOnly | Role::Offline);
    for chunk in 0..st.meta.map.len() as u32 {
        let e = st.meta.map[chunk as usize];
        if !e.is_mapped() && e.bzone == NONE {
            continue;
        }
        let mut ne = e;
        let ok_zone = |zones: &Zones, z: u32| z < nr_zones && usable(zones.z[z as usize].role);
        if ne.dzone == NONE || !ok_zone(&st.zones, ne.dzone) {
            if ne.dzone != NONE {
                warn!(
                    chunk,
                    zone = ne.dzone,
                    "chunk mapped to an unusable zone; unmapped"
                );
            }
            ne = unmapped();
        } else if ne.bzone != NONE
            && (!ok_zone(&st.zones, ne.bzone)
                || st.zones.z[ne.bzone as usize].seq
                || !st.zones.z[ne.dzone as usize].seq
                || ne.bzone == ne.dzone)
        {
            warn!(chunk, zone = ne.bzone, "bad buffer zone; dropped");
            ne.bzone = NONE;
        }
        if ne.dzone != NONE {
            let d = ne.dzone as usize;
            // Sequential zone: nothing is valid at or past the write pointer.
            let (seq, wp, w) = (st.zones.z[d].seq, st.zones.z[d].wp, st.zones.z[d].weight);
            if seq && wp < zb && w > 0 && st.zones.z[d].role != Role::Offline {
                let c = st.meta.set_range(dev, ne.dzone, wp, zb - wp, false)?;
                st.zones.z[d].weight -= c;
            }
            if ne.bzone != NONE && st.zones.z[ne.bzone as usize].weight == 0 {
                ne.bzone = NONE;
            }
            if ne.bzone == NONE && st.zones.z[d].weight == 0 {
                ne = unmapped();
            }
        }
        if ne != e {
            st.meta.set_map(chunk, ne);
        }
        if ne.dzone != NONE {
            let zi = &mut st.zones.z[ne.dzone as usize];
            if zi.role == Role::Free {
                zi.role = Role::Data;
            }
            zi.chunk = chunk;
        }
        if ne.bzone != NONE {
            let zi = &mut st.zones.z[ne.bzone as usize];
            if zi.role == Role::Free {
                zi.role = Role::Buffer;
            }
            zi.chunk = chunk;
        }
    }
    for z in 0..nr_zones {
        let zi = st.zones.z[z as usize];
        if zi.role == Role::Free && zi.weight > 0 {
            st.meta.set_range(dev, z, 0, zb, false)?;
            st.zones.z[z as usize].weight = 0;
        }
    }
    Ok(())
}
