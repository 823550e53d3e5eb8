//! Format, detection and open: read the newer valid superblock, its directory, index pages
//! and zone table, replay the log half of its generation, settle the open zones against the
//! device, and checkpoint (docs/design.md, "Log layout", "Open").

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};
use zbd::{Zone, ZoneOp, ZonedDevice};

use crate::engine::ids::{Lba, PageId, ZoneId, BLOCK, IO_BATCH_BLOCKS};
use crate::engine::meta::log::{scan_half, LogBuf};

use super::compact::{CompactOn, PageSet};
use super::durable::PAGE_BATCH;
use super::index::{cache_pages, Index, PageSource};
use super::layout::{
    conv_read, conv_write, decode_dir, decode_sb, decode_zt, encode_dir, encode_sb, is_data_zone,
    Checkpoint, FormatOptions, Layout, RawZte, ENTRIES, NONE, SB_MAGIC, ZT_ENTRIES,
};
use super::meta::{Ctx, Meta};
use super::record::{Class, LogRec};
use super::zones::{Frontier, ZoneState, Zones};
use super::{Counters, EngineError, LogEngine, LogOptions};

/// Format `dev` with the log layout: block 0 of every conventional zone zeroed, every data
/// zone reset, both directory and zone table copies empty, then (after a flush)
/// superblocks of generations 0 and 1, then a flush.
pub fn format(dev: &dyn ZonedDevice, opts: &FormatOptions) -> Result<(), EngineError> {
    let zones = dev.report_all()?;
    let l = Layout::compute(&zones, &dev.geometry(), opts)?;
    // No valid superblock while the areas are rewritten, and none of another format left
    // at the start of any conventional zone: dm-zoned and dmzadm look for a secondary
    // superblock there, and an old v2 volume's would be found.
    conv_write(dev, &l, 0, &[0u8; 2 * BLOCK])?;
    for k in 1..l.conv_zones.len() as u64 {
        conv_write(dev, &l, k * l.zone_blocks as u64, &[0u8; BLOCK])?;
    }
    dev.flush()?;
    for z in zones.iter().filter(|z| is_data_zone(z) && z.wp != z.start) {
        dev.zone_mgmt(ZoneOp::Reset, z.id)?;
    }
    write_empty_copies(dev, &l, &zones)?;
    dev.flush()?;
    for gen in 0..2u64 {
        let c = Checkpoint {
            gen,
            ckpt_seq: 1,
            clock: 0,
        };
        conv_write(dev, &l, gen, &encode_sb(&l, &c)[..])?;
    }
    dev.flush()?;
    Ok(())
}

/// Directory and zone table copies 0 and 1 of a fresh volume (generations 0 and 1).
fn write_empty_copies(
    dev: &dyn ZonedDevice,
    l: &Layout,
    zones: &[Zone],
) -> Result<(), EngineError> {
    for gen in 0..2u64 {
        let copy = gen as usize;
        for j in 0..l.dir_blocks {
            let b = encode_dir(j, gen, &[NONE; ENTRIES]);
            conv_write(dev, l, l.dir_start(copy) + j as u64, &b[..])?;
        }
        let mut z = Zones::from_table(&fresh_table(zones, l), l.user_frontiers());
        z.info.truncate(l.nr_zones as usize);
        for (j, b) in z.encode_table(l, gen).iter().enumerate() {
            conv_write(dev, l, l.zt_start(copy) + j as u64, &b[..])?;
        }
    }
    Ok(())
}

fn fresh_table(zones: &[Zone], l: &Layout) -> Vec<RawZte> {
    (0..l.nr_zones as usize)
        .map(|z| RawZte::fresh(zones.get(z).is_some_and(is_data_zone)))
        .collect()
}

/// Whether `dev` holds a log-layout superblock magic in slot 0 or 1 (CRC not checked: a
/// damaged log-layout volume is still one).
pub fn is_log_layout(dev: &dyn ZonedDevice) -> bool {
    let Ok(zones) = dev.report_all() else {
        return false;
    };
    (0..2).any(|slot| read_slot(dev, &zones, slot).is_ok_and(|b| b[..4] == SB_MAGIC.to_le_bytes()))
}

/// Fuzzing: recompute the CRC of conventional block `k` (counted over the device's
/// conventional zones, as the layout counts them) for the area it lies in, so that patched
/// contents reach the decoders. The layout comes from the valid superblock, if any; without
/// one only the two superblock slots can be resealed. Ok(false): `k` is in no known area.
#[doc(hidden)]
pub fn debug_reseal(dev: &dyn ZonedDevice, k: u64) -> Result<bool, EngineError> {
    let zones = dev.report_all()?;
    let l = read_superblock(dev, &zones).ok().map(|(l, _)| l);
    let at = match &l {
        Some(l) if (k / l.zone_blocks as u64) < l.conv_zones.len() as u64 => l.conv_offset(k),
        _ if k < 2 => slot_offset(dev, &zones, k)?,
        _ => return Ok(false),
    };
    let mut b = vec![0u8; BLOCK];
    dev.read_at(&mut b, at)?;
    if !super::layout::reseal(l.as_ref(), k, &mut b) {
        return Ok(false);
    }
    dev.write_at(&b, at)?;
    Ok(true)
}

/// Superblock slot `slot` (conventional block 0 or 1), before any layout is known.
pub(super) fn read_slot(
    dev: &dyn ZonedDevice,
    zones: &[Zone],
    slot: u64,
) -> Result<Vec<u8>, EngineError> {
    let mut b = vec![0u8; BLOCK];
    dev.read_at(&mut b, slot_offset(dev, zones, slot)?)?;
    Ok(b)
}

/// Byte offset of superblock slot `slot`: block `slot` of the usable conventional zones.
fn slot_offset(dev: &dyn ZonedDevice, zones: &[Zone], slot: u64) -> Result<u64, EngineError> {
    let zb = dev.geometry().zone_size / BLOCK as u64;
    let conv: Vec<&Zone> = zones
        .iter()
        .filter(|z| {
            z.zone_type == zbd::ZoneType::Conventional && z.cond == zbd::ZoneCondition::NotWp
        })
        .collect();
    let z = conv
        .get((slot / zb) as usize)
        .ok_or_else(|| EngineError::Meta("not a log-layout volume: no conventional zone".into()))?;
    Ok(z.start + (slot % zb) * BLOCK as u64)
}

/// The valid superblock of the higher generation, or a one-line refusal naming both slots.
fn read_superblock(
    dev: &dyn ZonedDevice,
    zones: &[Zone],
) -> Result<(Layout, Checkpoint), EngineError> {
    let geo = dev.geometry();
    let mut why = Vec::new();
    let mut best: Option<(Layout, Checkpoint)> = None;
    for slot in 0..2u32 {
        let b = read_slot(dev, zones, slot as u64)?;
        match decode_sb(&b, slot, zones, &geo) {
            Ok((l, c)) if best.as_ref().is_none_or(|(_, bc)| c.gen > bc.gen) => best = Some((l, c)),
            Ok(_) => {}
            Err(e) => why.push(format!("slot {slot}: {e}")),
        }
    }
    best.ok_or_else(|| EngineError::Meta(format!("not a log-layout volume: {}", why.join("; "))))
}

/// What open reads and derives before it writes anything: the chosen checkpoint, the state
/// after replay (valid counts recounted), the device's zones and write pointers. `check`
/// stops here.
pub(super) struct Loaded {
    pub layout: Layout,
    pub ck: Checkpoint,
    pub meta: Meta,
    pub zones: Vec<Zone>,
    pub wps: Vec<u32>,
    pub stats: Counters,
    pub next_seq: u64,
    /// Each open zone's summary, rebuilt from the index (`recount_and_check`).
    pub summaries: Summaries,
}

/// Open zones and the logical block each of their data blocks holds per the index.
pub(super) type Summaries = Vec<(ZoneId, Vec<Option<Lba>>)>;

/// What a load may write: open writes index pages back during a long replay (so that the
/// cache stays bounded); check writes nothing (its replay keeps every page it changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Open,
    Check,
}

/// Steps 1-5 of open (docs/design.md, "Open and replay"): everything but the checkpoint.
pub(super) fn load(
    dev: &Arc<dyn ZonedDevice>,
    index_memory: u64,
    compact_on: CompactOn,
    mode: Mode,
) -> Result<Loaded, EngineError> {
    let zones = dev.report_all()?;
    let (layout, ck) = read_superblock(&**dev, &zones)?;
    let mut meta = load_checkpoint(dev, &layout, &ck, &zones, index_memory, compact_on)?;
    let wps: Vec<u32> = zones
        .iter()
        .map(|z| ((z.wp - z.start) / BLOCK as u64) as u32)
        .collect();
    let stats = Counters::default();
    let next_seq = replay(&**dev, &mut meta, &wps, &ck, &stats, mode)?;
    let summaries = recount_and_check(&mut meta, &zones, &wps)?;
    Ok(Loaded {
        layout,
        ck,
        meta,
        zones,
        wps,
        stats,
        next_seq,
        summaries,
    })
}

impl LogEngine {
    /// Open a log-layout volume: load the last checkpoint, replay its log, settle the open
    /// zones, checkpoint.
    pub fn open(dev: Arc<dyn ZonedDevice>, opts: LogOptions) -> Result<LogEngine, EngineError> {
        let Loaded {
            layout,
            mut meta,
            wps,
            stats,
            next_seq,
            summaries,
            ..
        } = load(&dev, opts.index_memory, opts.compact, Mode::Open)?;
        layout.check_limits(&dev.geometry())?;
        meta.log.start_at(next_seq);
        let users = layout.user_frontiers();
        let planned = super::plan::Planned::new(users as usize);
        let turns = (0..users).map(|_| Arc::new(Mutex::new(()))).collect();
        let e = LogEngine {
            dev,
            layout,
            opts,
            state: Mutex::new(meta),
            turns,
            next_turn: AtomicUsize::new(0),
            turn_waiters: (0..users).map(|_| AtomicUsize::new(0)).collect(),
            wlock: Mutex::new(()),
            log_write: Arc::new(Mutex::new(())),
            planned: Mutex::new(planned),
            planned_done: Condvar::new(),
            gc_copied: Condvar::new(),
            gc_copy_waiters: Default::default(),
            reset: Arc::new(RwLock::new(())),
            failed: Mutex::new(None),
            stats,
            bg: Arc::default(),
        };
        {
            let _w = e.wlock.lock();
            e.settle_zones(&wps, summaries)?;
            e.checkpoint()?;
        }
        Ok(e)
    }

    /// After replay: free zones holding old data are reset before use; of each class's open
    /// zones the ones opened last with room (as many as the class has slots) stay its
    /// frontiers (with their `summaries`, rebuilt from the index), the others are padded and
    /// sealed with their summary.
    fn settle_zones(&self, wps: &[u32], mut summaries: Summaries) -> Result<(), EngineError> {
        let data_blocks = self.layout.data_blocks();
        let mut open: [Vec<(u64, ZoneId)>; 2] = [Vec::new(), Vec::new()];
        {
            let mut st = self.state.lock();
            for (z, i) in st.zones.info.iter_mut().enumerate() {
                match i.state {
                    ZoneState::Free => i.needs_reset = wps[z] > 0,
                    ZoneState::Open(c) => open[c.idx()].push((i.last_append, ZoneId(z as u32))),
                    _ => {}
                }
            }
        }
        let mut summary_of = |z: ZoneId| {
            let k = summaries
                .iter()
                .position(|s| s.0 == z)
                .expect("an open zone");
            std::mem::take(&mut summaries[k].1)
        };
        for c in Class::ALL {
            let list = &mut open[c.idx()];
            // Newest first: the newest zones with room take the class's slots.
            list.sort_by(|a, b| b.cmp(a));
            for &(_, z) in list.iter() {
                let mut st = self.state.lock();
                let slot = st.zones.empty_slot(c);
                match slot.filter(|_| wps[z.idx()] < data_blocks) {
                    Some(s) => {
                        let mut f = Frontier::new(z, wps[z.idx()], data_blocks);
                        f.summary = summary_of(z);
                        *st.zones.frontier(s) = Some(f);
                    }
                    None => {
                        drop(st);
                        self.seal_at_open(z, wps[z.idx()], summary_of(z))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Pad an open zone's data part with zeros from `wp`, write the summary blocks not yet
    /// written (`summary`, rebuilt from the index); the zone is full.
    fn seal_at_open(
        &self,
        zone: ZoneId,
        wp: u32,
        summary: Vec<Option<Lba>>,
    ) -> Result<(), EngineError> {
        let l = &self.layout;
        let mut at = wp;
        while at < l.data_blocks() {
            let n = (l.data_blocks() - at).min(IO_BATCH_BLOCKS);
            let zeros = vec![0u8; n as usize * BLOCK];
            self.dev(self.dev.write_at(&zeros, l.zone_offset(zone, at)))?;
            at += n;
        }
        let from = wp.saturating_sub(l.data_blocks());
        if from < l.summary_blocks {
            self.write_summary(zone, from, &summary)?;
        }
        self.state.lock().zones.get_mut(zone).state = ZoneState::Full;
        Ok(())
    }
}

/// The state as checkpoint `ck` left it: the directory (pages are read when needed), the
/// zone table (a zone the device does not offer for data is never one, whatever the table
/// says), and an empty log positioned at epoch `ck.gen`.
fn load_checkpoint(
    dev: &Arc<dyn ZonedDevice>,
    l: &Layout,
    ck: &Checkpoint,
    zones: &[Zone],
    index_memory: u64,
    compact_on: CompactOn,
) -> Result<Meta, EngineError> {
    let copy = (ck.gen % 2) as usize;
    let bad = |m: String| EngineError::Meta(format!("log layout: {m}"));
    let mut dir = Vec::with_capacity(l.dir_blocks as usize * ENTRIES);
    let mut b = vec![0u8; BLOCK];
    for j in 0..l.dir_blocks {
        conv_read(&**dev, l, l.dir_start(copy) + j as u64, &mut b)?;
        dir.extend_from_slice(&decode_dir(j, ck.gen, &b).map_err(bad)?);
    }
    if let Some(p) = (l.nr_pages as usize..dir.len()).find(|&p| dir[p] != NONE) {
        return Err(bad(format!(
            "directory entry {:#x} for page {p}, beyond the last",
            dir[p]
        )));
    }
    dir.truncate(l.nr_pages as usize);
    let mut table = Vec::with_capacity(l.zt_blocks as usize * ZT_ENTRIES);
    for j in 0..l.zt_blocks {
        conv_read(&**dev, l, l.zt_start(copy) + j as u64, &mut b)?;
        table.extend_from_slice(&decode_zt(j, ck.gen, &b).map_err(bad)?);
    }
    table.truncate(l.nr_zones as usize);
    let mut zt = Zones::from_table(&table, l.user_frontiers());
    for (z, info) in zt.info.iter_mut().enumerate() {
        if !zones.get(z).is_some_and(is_data_zone) {
            info.state = ZoneState::Unusable;
        }
    }
    let data_zone = (0..l.nr_zones)
        .map(|z| zt.is_data_zone(ZoneId(z)))
        .collect();
    let src = PageSource::new(dev.clone(), l.clone(), data_zone);
    let cap = cache_pages(index_memory, l.nr_pages);
    let index = Index::new(dir, ck.ckpt_seq, cap, src)?;
    let half = l.log_half();
    let log = LogBuf::new(l.uuid, ck.gen, half, [l.log_start(), l.log_start() + half]);
    Ok(Meta {
        layout: l.clone(),
        index,
        zones: zt,
        log,
        clock: ck.clock,
        gen: ck.gen,
        gc: None,
        gc_debt: 0.0,
        gc_copying: None,
        compact: PageSet::new(l.nr_pages, compact_on),
    })
}

/// One pass over the index after replay: the valid counts (the zone table's are as of the
/// checkpoint, and pages written back since may be newer), and every mapped block lies in
/// an open or full zone, below the zone's write pointer on the device. A crash never
/// breaks the latter (data is flushed before the records or pages that map it are proven,
/// replay drops unproven blocks the device lacks, and a torn superblock's fallback replays
/// the zone openings its newer pages rely on); damage does: a zone reset outside zonedd, or
/// a damaged superblock together with a damaged log block. Such a volume is refused,
/// naming the zone: serving its blocks would return zeros, or, once the zone is written
/// again, another block's data.
fn recount_and_check(
    meta: &mut Meta,
    zones: &[Zone],
    wps: &[u32],
) -> Result<Summaries, EngineError> {
    let l = &meta.layout;
    let mut valid = vec![0u32; meta.zones.info.len()];
    let mut bad = None;
    // Open zones are few (the frontiers, and zones a crash left open): a short list.
    let mut summaries: Summaries = (meta.zones.info.iter().enumerate())
        .filter(|(_, i)| matches!(i.state, ZoneState::Open(_)))
        .map(|(z, _)| (ZoneId(z as u32), vec![None; l.data_blocks() as usize]))
        .collect();
    let mut summary_of = vec![None; valid.len()];
    for (k, s) in summaries.iter().enumerate() {
        summary_of[s.0.idx()] = Some(k);
    }
    // With `CompactOn::Writes`, pages of more than one extent, for idle compaction (one of
    // one extent never needs it): (page, extents, the device block that would continue the
    // last).
    let mut scattered = Vec::new();
    let mut page: Option<(u32, u32, u32)> = None;
    let writes = meta.compact.on() == CompactOn::Writes;
    meta.index.warm()?;
    meta.index.for_each_mapped(|lba, p| {
        let pg = lba.0 / ENTRIES as u32;
        page = match page {
            Some((q, e, next)) if q == pg => Some((q, e + (p.0 != next) as u32, p.0 + 1)),
            done => {
                if writes {
                    scattered.extend(done.filter(|d| d.1 > 1).map(|d| PageId(d.0)));
                }
                Some((pg, 1, p.0 + 1))
            }
        };
        let (z, off) = l.zone_of(p);
        valid[z.idx()] += 1;
        if let Some(k) = summary_of[z.idx()] {
            if let Some(e) = summaries[k].1.get_mut(off as usize) {
                *e = Some(lba);
            }
        }
        if bad.is_some() {
            return;
        }
        let state = meta.zones.get(z).state;
        if !matches!(state, ZoneState::Open(_) | ZoneState::Full) {
            bad = Some(format!(
                "log layout: block {} is mapped into zone {}, which the zone table calls \
                 {state:?}: the metadata is damaged",
                lba.0, z.0
            ));
            return;
        }
        let full = zones
            .get(z.idx())
            .is_some_and(|d| d.cond == zbd::ZoneCondition::Full);
        let wp = wps.get(z.idx()).copied().unwrap_or(0);
        if !full && off >= wp {
            bad = Some(format!(
                "log layout: block {} is mapped to block {off} of zone {}, past its write \
                 pointer ({wp}): the zone lost data outside zonedd (reset or damaged)",
                lba.0, z.0
            ));
        }
    })?;
    if let Some(m) = bad {
        return Err(EngineError::Meta(m));
    }
    for (info, v) in meta.zones.info.iter_mut().zip(valid) {
        info.valid = v;
    }
    scattered.extend(page.filter(|d| writes && d.1 > 1).map(|d| PageId(d.0)));
    for p in scattered {
        meta.compact.scattered_at_open(p);
    }
    Ok(summaries)
}

/// Apply the log half of generation `ck.gen` from `ck.ckpt_seq`; returns the next sequence
/// number. Records below the highest `flushed_seq` a block carries are proven; an unproven
/// `Append` maps only the blocks below their zone's write pointer whose CRC matches.
fn replay(
    dev: &dyn ZonedDevice,
    meta: &mut Meta,
    wps: &[u32],
    ck: &Checkpoint,
    stats: &Counters,
    mode: Mode,
) -> Result<u64, EngineError> {
    let l = meta.layout.clone();
    let base = l.log_start() + (ck.gen % 2) * l.log_half();
    let mut blocks = scan_half::<LogRec>(&l.uuid, ck.gen, l.log_half(), |i| {
        let mut b = Box::new([0u8; BLOCK]);
        conv_read(dev, &l, base + i, &mut b[..]).ok().map(|_| b)
    });
    if blocks
        .first()
        .is_some_and(|b| b.header.epoch_start_seq != ck.ckpt_seq)
    {
        tracing::warn!(
            "log half of generation {} does not start at the checkpoint",
            ck.gen
        );
        blocks.clear();
    }
    let proven_below = blocks
        .iter()
        .map(|b| b.header.flushed_seq)
        .max()
        .unwrap_or(0);
    let mut next = ck.ckpt_seq;
    let mut flushed = false;
    for b in &blocks {
        for (k, rec) in b.recs.iter().enumerate() {
            let seq = b.header.first_seq + k as u64;
            next = seq + 1;
            if !rec.in_range(&l, |z| meta.zones.is_data_zone(z)) {
                tracing::warn!(seq, "log record out of range, skipped");
                continue;
            }
            let landed = landed(dev, meta, rec, wps, seq < proven_below)?;
            let dropped = landed.iter().filter(|&&ok| !ok).count() as u64;
            stats.replay_dropped.fetch_add(dropped, Ordering::Relaxed);
            meta.apply(rec, seq, Ctx::Replay, &landed)?;
            stats.replayed.fetch_add(1, Ordering::Relaxed);
            if mode == Mode::Open && meta.index.needs_writeback() {
                replay_writeback(dev, meta, seq + 1, &mut flushed)?;
            }
        }
    }
    Ok(next)
}

/// Write the pages replay changed back to their slots, folded to `seq` (ahead of the
/// checkpoint: a replay after a crash skips the records below `seq` for them, and open
/// recounts the valid blocks). Everything folded is read from the device; one flush first
/// makes it durable there, so that no page can outlive what it names.
fn replay_writeback(
    dev: &dyn ZonedDevice,
    meta: &mut Meta,
    seq: u64,
    flushed: &mut bool,
) -> Result<(), EngineError> {
    if !std::mem::replace(flushed, true) {
        dev.flush()?;
    }
    let l = meta.layout.clone();
    loop {
        let pages = meta.index.take_dirty(seq, PAGE_BATCH);
        if pages.is_empty() {
            break;
        }
        for (p, img) in pages {
            conv_write(dev, &l, l.page_start() + p.0 as u64, &img[..])?;
        }
        meta.index.written();
    }
    Ok(())
}

/// For an `Append`, which of its blocks are on the device: all of a proven record; of an
/// unproven one, those below their zone's write pointer holding the logged CRC. Empty for
/// other records.
fn landed(
    dev: &dyn ZonedDevice,
    meta: &Meta,
    rec: &LogRec,
    wps: &[u32],
    proven: bool,
) -> Result<Vec<bool>, EngineError> {
    let LogRec::Append {
        zone, off, crcs, ..
    } = rec
    else {
        return Ok(Vec::new());
    };
    if meta.zones.get(*zone).state == ZoneState::Free {
        return Ok(vec![false; crcs.len()]);
    }
    if proven {
        return Ok(vec![true; crcs.len()]);
    }
    let below = wps[zone.idx()].saturating_sub(*off).min(crcs.len() as u32) as usize;
    let mut ok = vec![false; crcs.len()];
    if below > 0 {
        let mut buf = vec![0u8; below * BLOCK];
        dev.read_at(&mut buf, meta.layout.zone_offset(*zone, *off))?;
        for (i, data) in buf.chunks(BLOCK).enumerate() {
            ok[i] = crc32fast::hash(data) == crcs[i];
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    //! Open against crafted metadata (intact CRCs, arbitrary contents): it may refuse or
    //! drop what does not fit, never panic, and the engine it gives must serve requests.

    use super::*;
    use crate::engine::ids::Lba;
    use crate::lsl::layout::encode_page;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use zbd::MemDevice;

    fn random_rec(rng: &mut StdRng, l: &Layout) -> LogRec {
        let lba = Lba(rng.gen_range(0..l.user_blocks as u32 + 8));
        let zone = ZoneId(rng.gen_range(0..l.nr_zones + 2));
        let off = rng.gen_range(0..l.zone_blocks + 2);
        let n = rng.gen_range(1..=300u32);
        match rng.gen_range(0..5) {
            0 => LogRec::Append {
                lba,
                zone,
                off,
                crcs: (0..n.min(256)).map(|_| rng.gen()).collect(),
            },
            1 => LogRec::Move { lba, n, zone, off },
            2 => LogRec::Trim { lba, n },
            3 => LogRec::ZoneOpen {
                zone,
                class: if rng.gen() { Class::User } else { Class::Gc },
            },
            _ => LogRec::ZoneFree { zone },
        }
    }

    /// Replace the current generation's log half with random records (and sometimes page 0
    /// with random entries), as a block-for-block valid image.
    fn craft(dev: &MemDevice, rng: &mut StdRng) {
        let zones = dev.report_all().unwrap();
        let (l, ck) = read_superblock(dev, &zones).unwrap();
        let half = l.log_half();
        let mut log: LogBuf<LogRec> =
            LogBuf::new(l.uuid, ck.gen, half, [l.log_start(), l.log_start() + half]);
        log.start_at(ck.ckpt_seq);
        log.flushed_seq = ck.ckpt_seq + rng.gen_range(0..40);
        for _ in 0..rng.gen_range(1..60) {
            log.append(&[random_rec(rng, &l)]);
            if rng.gen_bool(0.1) {
                log.seal(false);
            }
        }
        log.seal(false);
        for (blk, img) in log.take_pending() {
            conv_write(dev, &l, blk, &img[..]).unwrap();
        }
        if rng.gen_bool(0.2) {
            let mut e = [NONE; ENTRIES];
            for v in e.iter_mut().take(64) {
                *v = rng.gen_range(0..l.nr_zones * l.zone_blocks + 4);
            }
            let p = encode_page(PageId(0), rng.gen_range(0..ck.ckpt_seq + 20), &e);
            conv_write(dev, &l, l.page_start(), &p[..]).unwrap();
        }
    }

    /// Open reads each index page once, however small the cache: the valid counts, the
    /// checks and the open zones' summaries come from one pass.
    #[test]
    fn open_reads_each_page_once() {
        // 40 zones of 1 MiB, 4 conventional: 7 index pages.
        let dev = Arc::new(zbd::MemDevice::with_zones(1 << 20, 40, 4).unwrap());
        let fopts = FormatOptions {
            log_blocks: 32,
            ..FormatOptions::default()
        };
        format(&*dev, &fopts).unwrap();
        let opts = LogOptions {
            index_memory: 0,
            ..LogOptions::default()
        };
        let e = LogEngine::open(dev.clone(), opts.clone()).unwrap();
        let pages = (e.capacity() / 4096).div_ceil(ENTRIES as u64);
        assert!(pages >= 4, "{pages} pages");
        for p in 0..pages {
            let b = (p * ENTRIES as u64 + 7).min(e.capacity() / 4096 - 1);
            e.write(b * 4096, &[p as u8 + 1; 4096], false).unwrap();
        }
        e.close().unwrap();
        let e = LogEngine::open(dev, opts).unwrap();
        assert_eq!(e.stats().index_page_reads, pages, "pages read at open");
        for p in 0..pages {
            let b = (p * ENTRIES as u64 + 7).min(e.capacity() / 4096 - 1);
            let mut back = [0u8; 4096];
            e.read(b * 4096, &mut back).unwrap();
            assert_eq!(back, [p as u8 + 1; 4096]);
        }
    }

    #[test]
    fn crafted_logs_and_pages_never_panic_open() {
        let dev = MemDevice::with_zones(64 << 10, 20, 4).unwrap();
        format(
            &dev,
            &FormatOptions {
                log_blocks: 32,
                ..FormatOptions::default()
            },
        )
        .unwrap();
        let e = LogEngine::open(Arc::new(dev.snapshot()), LogOptions::default()).unwrap();
        drop(e);
        let mut rng = StdRng::seed_from_u64(5);
        let (mut opened, mut refused, mut replayed) = (0, 0, 0);
        for _ in 0..400 {
            let d = Arc::new(dev.snapshot());
            // Some data first, so that pages and zones are in use.
            if let Ok(e) = LogEngine::open(d.clone(), LogOptions::default()) {
                for i in 0..rng.gen_range(0..40u64) {
                    let b = rng.gen_range(0..e.capacity() / BLOCK as u64);
                    let _ = e.write(b * BLOCK as u64, &[i as u8 + 1; BLOCK], false);
                }
                if rng.gen() {
                    let _ = e.debug_checkpoint();
                }
            }
            craft(&d, &mut rng);
            match LogEngine::open(d, LogOptions::default()) {
                Ok(e) => {
                    opened += 1;
                    replayed += e.stats().replayed_records;
                    let mut buf = vec![0u8; e.capacity() as usize];
                    let _ = e.read(0, &mut buf);
                    for _ in 0..50 {
                        let b = rng.gen_range(0..e.capacity() / BLOCK as u64);
                        let _ = e.write(b * BLOCK as u64, &[7; BLOCK], rng.gen());
                    }
                    let _ = e.close();
                }
                Err(_) => refused += 1,
            }
        }
        eprintln!("crafted metadata: {opened} opened ({replayed} records), {refused} refused");
        assert!(
            opened > 100 && replayed > 1000,
            "{opened} opened, {refused} refused"
        );
    }
}
