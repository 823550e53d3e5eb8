//! Open: load the v2 sets, build the zone table, map and weights, replay the metadata log
//! through the records' own `apply`, settle zone ownership from the final map, and fold it
//! all with a commit. The rules are in docs/design.md, "Commit and crash ordering".

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};
use tracing::{debug, info, warn};
use zbd::ZonedDevice;

use crate::format::{decode_map_block, Layout, MapEntry, Superblock};
use crate::sets;

use super::super::ids::{ChunkId, Mapping, ZoneId, BLOCK, IO_BATCH_BLOCKS};
use super::super::{Bg, Counters, EngineError, EngineOptions, Inner, State};
use super::cache::MetaCache;
use super::log::{scan_half, LogBuf, ReplayBlock};
use super::record::{Bounds, Ctx, Rec};
use super::zones::{Role, Zones};
use super::{durability, Meta};

/// Open a formatted device: everything up to a running engine's shared state.
pub(in crate::engine) fn load(
    dev: Arc<dyn ZonedDevice>,
    opts: EngineOptions,
) -> Result<Inner, EngineError> {
    let loaded = sets::load(&*dev)?;
    for a in &loaded.actions {
        info!("{a}");
    }
    let layout = loaded.layout.clone();
    let sb = loaded.sb.clone();
    let mut meta = load_sets(&*dev, &layout, &sb, opts.cache_bitmap_blocks)?;
    let blocks = read_log(&*dev, &meta.log, sb.gen);
    let next_seq = replay(&*dev, &mut meta, &layout, &blocks)?;
    settle(&*dev, &mut meta)?;
    meta.zones.build_pools();
    let members = dev.members();
    let zones_of = |m: &zbd::Member| m.first_zone..m.first_zone + m.nr_zones;
    if opts.spread_over_drives {
        let drives = members.iter().filter(|m| !m.cache).map(zones_of).collect();
        meta.zones.set_drives(drives);
    }
    meta.log.start_at(next_seq);

    let nr_locks = (layout.nr_chunks as usize).clamp(1, 4096);
    let members = members.iter().map(zones_of).collect();
    let inner = Inner {
        members,
        geo: dev.geometry(),
        dev,
        zone_blocks: layout.zone_blocks,
        layout,
        sb: Mutex::new(sb),
        opts,
        state: Mutex::new(State::new(meta)),
        free_cv: Condvar::new(),
        log_write: Arc::new(Mutex::new(())),
        commit_lock: Mutex::new(()),
        chunk_locks: (0..nr_locks).map(|_| Arc::new(RwLock::new(()))).collect(),
        stats: Counters::default(),
        failed: Mutex::new(None),
        is_failed: AtomicBool::new(false),
        // The opened volume is new to reclaim: until its first look has decided, it counts
        // as work pending (`reclaim::wait_idle` waits for that look).
        bg: Mutex::new(Bg {
            reclaim_hint: true,
            ..Bg::default()
        }),
        bg_cv: Condvar::new(),
        reclaim_cv: Condvar::new(),
        idle_cv: Condvar::new(),
        copy_bufs: Mutex::new(Vec::new()),
    };
    // Fold the replayed log now; the new generation skips the replayed epochs' halves.
    durability::commit(&inner)?;
    Ok(inner)
}

/// The metadata as the committed v2 sets have it: zone table from the device's report,
/// map, weights counted from the bitmaps, and an empty log positioned after epoch `gen`.
fn load_sets(
    dev: &dyn ZonedDevice,
    layout: &Layout,
    sb: &Superblock,
    cache_blocks: usize,
) -> Result<Meta, EngineError> {
    let report = dev.report_all()?;
    // A degraded volume's lost zones come out of the reserved pool, and so do the drives'
    // tertiary superblock zones of a multi-device volume: dm-zoned's sizing counts them as
    // usable (chunks + reserved = usable - sets), but they never hold data.
    let nr_reserved = layout
        .nr_reserved_seq
        .saturating_sub(layout.nr_lost_zones)
        .saturating_sub(layout.tertiary_zones.len() as u32);
    let mut zones = Zones::from_report(&report, dev.geometry().zone_size, nr_reserved);
    for z in layout
        .meta_zones()
        .chain(layout.tertiary_zones.iter().copied())
    {
        zones.set_meta(ZoneId(z));
    }
    let map = read_map(dev, layout)?;
    let cache = MetaCache::new(layout.clone(), map, cache_blocks);
    count_weights(dev, layout, &mut zones)?;
    let log = LogBuf::after_load(layout, sb)?;
    Ok(Meta { zones, cache, log })
}

/// Read map blocks of set 0 into a map of `nr_chunks` entries.
fn read_map(dev: &dyn ZonedDevice, layout: &Layout) -> Result<Vec<MapEntry>, EngineError> {
    let mut map = Vec::with_capacity(layout.nr_chunks as usize);
    let mut buf = vec![0u8; IO_BATCH_BLOCKS as usize * BLOCK];
    let mut m = 0u32;
    while m < layout.nr_map_blocks {
        let n = (layout.nr_map_blocks - m).min(IO_BATCH_BLOCKS);
        let b = &mut buf[..n as usize * BLOCK];
        sets::read_meta_blocks(dev, layout, 0, 1 + m, b)?;
        for blk in b.chunks(BLOCK) {
            for e in decode_map_block(blk) {
                if map.len() < layout.nr_chunks as usize {
                    map.push(e);
                }
            }
        }
        m += n;
    }
    Ok(map)
}

/// Zone weights: stream the bitmaps once (a 10 TB volume has ~80k bitmap blocks).
fn count_weights(
    dev: &dyn ZonedDevice,
    layout: &Layout,
    zones: &mut Zones,
) -> Result<(), EngineError> {
    let per_zone = layout.zone_bitmap_blocks;
    let batch_zones = (IO_BATCH_BLOCKS / per_zone).max(1);
    let mut buf = vec![0u8; (batch_zones * per_zone) as usize * BLOCK];
    let mut z = 0u32;
    while z < layout.nr_zones {
        let n = batch_zones.min(layout.nr_zones - z);
        let b = &mut buf[..(n * per_zone) as usize * BLOCK];
        sets::read_meta_blocks(dev, layout, 0, layout.bitmap_block(z, 0), b)?;
        for k in 0..n {
            let s = (k * per_zone) as usize * BLOCK;
            let w = crate::format::count_bits(&b[s..s + per_zone as usize * BLOCK]);
            zones.set_loaded_weight(ZoneId(z + k), w as u32);
        }
        z += n;
    }
    Ok(())
}

/// The log blocks to replay on top of generation `gen`: epoch `gen`'s half, then epoch
/// `gen + 1`'s (a commit that did not finish) only if it starts exactly where `gen`'s
/// records end.
fn read_log(dev: &dyn ZonedDevice, log: &LogBuf<Rec>, gen: u64) -> Vec<ReplayBlock<Rec>> {
    let read_blk = |half: usize, idx: u64| -> Option<Box<[u8; BLOCK]>> {
        let mut b = Box::new([0u8; BLOCK]);
        dev.read_at(&mut b[..], (log.base[half] + idx) * BLOCK as u64)
            .ok()
            .map(|_| b)
    };
    let half = |e: u64| (e % 2) as usize;
    let mut blocks = scan_half(&log.uuid, gen, log.cap, |i| read_blk(half(gen), i));
    if let Some(last) = blocks.last() {
        let end = last.header.first_seq + last.recs.len() as u64;
        let next = scan_half(&log.uuid, gen + 1, log.cap, |i| read_blk(half(gen + 1), i));
        if next.first().map(|b| b.header.epoch_start_seq) == Some(end) {
            blocks.extend(next);
        }
    }
    blocks
}

/// Apply the replayed records in order; returns the next sequence number. A record naming
/// zones or chunks that do not exist is skipped; a `Write` record's blocks are checked
/// against the device unless a durable header proves them flushed (`WriteRec::replay`).
fn replay(
    dev: &dyn ZonedDevice,
    meta: &mut Meta,
    layout: &Layout,
    blocks: &[ReplayBlock<Rec>],
) -> Result<u64, EngineError> {
    let bounds = Bounds {
        nr_zones: layout.nr_zones,
        nr_chunks: layout.nr_chunks,
        zone_blocks: layout.zone_blocks,
    };
    let proven_below = blocks
        .iter()
        .map(|b| b.header.flushed_seq)
        .max()
        .unwrap_or(0);
    let mut next_seq = 1;
    let (mut applied, mut skipped) = (0u64, 0u64);
    for b in blocks {
        for (k, rec) in b.recs.iter().enumerate() {
            let seq = b.header.first_seq + k as u64;
            next_seq = seq + 1;
            if !rec.in_range(&bounds) {
                skipped += 1;
                continue;
            }
            let whole = match rec {
                Rec::Write(w) => w.replay(meta, dev, seq, seq < proven_below)?,
                _ => {
                    rec.apply(meta, dev, seq, Ctx::Replay)?;
                    true
                }
            };
            if !whole {
                skipped += 1;
                debug!(
                    seq,
                    ?rec,
                    proven_below,
                    "replay: a write's blocks did not all land"
                );
            }
            applied += 1;
        }
    }
    if !blocks.is_empty() {
        info!(
            blocks = blocks.len(),
            applied, skipped, next_seq, "replayed the metadata log"
        );
    }
    Ok(next_seq)
}

/// After replay: drop impossible mappings, unmap empty chunks, clear bits past sequential
/// write pointers and in unmapped zones, and give each mapped zone to its chunk (the first
/// chunk naming a zone keeps it).
fn settle(dev: &dyn ZonedDevice, m: &mut Meta) -> Result<(), EngineError> {
    let nr_chunks = m.cache.nr_chunks();
    for chunk in (0..nr_chunks).map(ChunkId) {
        let e = m.cache.mapping(chunk);
        if e == Mapping::UNMAPPED {
            continue;
        }
        let ne = settle_chunk(dev, m, chunk, e)?;
        if ne != e {
            m.cache.set_map(chunk, ne);
        }
        if let Some(d) = ne.dzone {
            m.zones.own(d, Role::Data, chunk);
        }
        if let Some(b) = ne.bzone {
            m.zones.own(b, Role::Buffer, chunk);
        }
    }
    let zb = m.zones.zone_blocks();
    for z in (0..m.zones.len()).map(ZoneId) {
        let zi = m.zones.get(z);
        if zi.role == Role::Free && zi.weight > 0 {
            m.cache.set_range(dev, z, 0, zb, false)?;
            m.zones.clear_weight(z);
        }
    }
    Ok(())
}

/// The mapping `e` of `chunk` as it may stay: zones that exist and are not another chunk's
/// (its role is no longer free) or unusable, a buffer only on a sequential data zone, nothing valid at or past a
/// sequential write pointer, no empty buffer, no empty chunk.
fn settle_chunk(
    dev: &dyn ZonedDevice,
    m: &mut Meta,
    chunk: ChunkId,
    e: Mapping,
) -> Result<Mapping, EngineError> {
    let zb = m.zones.zone_blocks();
    let nr_zones = m.zones.len();
    // A chunk on an offline zone stays mapped: its data is lost, and reads of it must fail
    // rather than return zeros. A zone already given to an earlier chunk is not free.
    let ok_zone = |zones: &Zones, z: ZoneId| {
        z.0 < nr_zones
            && matches!(
                zones.get(z).role,
                Role::Free | Role::ReadOnly | Role::Offline
            )
    };
    let Some(d) = e.dzone.filter(|&d| ok_zone(&m.zones, d)) else {
        if let Some(d) = e.dzone {
            warn!(%chunk, zone = %d, "chunk mapped to an unusable zone; unmapped");
        }
        return Ok(Mapping::UNMAPPED);
    };
    let mut ne = e;
    if let Some(b) = e.bzone {
        if !ok_zone(&m.zones, b) || m.zones.get(b).seq || !m.zones.get(d).seq || b == d {
            warn!(%chunk, zone = %b, "bad buffer zone; dropped");
            ne.bzone = None;
        }
    }
    // Sequential zone: nothing is valid at or past the write pointer.
    let di = m.zones.get(d);
    if di.seq && di.wp < zb && di.weight > 0 && di.role != Role::Offline {
        let c = m.cache.set_range(dev, d, di.wp, zb - di.wp, false)?;
        m.zones.sub_weight(d, c, 0);
    }
    if ne.bzone.is_some_and(|b| m.zones.get(b).weight == 0) {
        ne.bzone = None;
    }
    if ne.bzone.is_none() && m.zones.get(d).weight == 0 {
        return Ok(Mapping::UNMAPPED);
    }
    Ok(ne)
}

impl LogBuf<Rec> {
    /// An empty log for a volume at generation `sb.gen`: its tails located, nothing
    /// appended, and the next commit forced to a new epoch (the replayed halves must not be
    /// appended to).
    fn after_load(layout: &Layout, sb: &Superblock) -> Result<LogBuf<Rec>, EngineError> {
        let tail_start = layout.nr_meta_blocks as u64;
        let cap =
            (layout.nr_meta_zones as u64 * layout.zone_blocks as u64).saturating_sub(tail_start);
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
        Ok(LogBuf::new(sb.set_uuid, sb.gen + 1, cap, base))
    }
}
