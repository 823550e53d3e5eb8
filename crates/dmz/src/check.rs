//! `zonedd check` / `--repair`: dmzadm's metadata checks (reference §6), in O(zones + chunks).
//!
//! Read-only by default. With `repair`, fixes go into memory first and are committed as a new
//! generation in a crash-safe order: the other set gets a full copy of the repaired primary
//! (blocks, flush, superblock gen+1, flush), then the primary is rewritten in place (blocks,
//! flush, superblock gen+1, flush). Zones are reset only after the metadata that no longer
//! references them is durable.

use std::collections::BTreeMap;

use serde::Serialize;
use tracing::{info, warn};
use zbd::{Zone, ZoneCondition, ZoneOp, ZoneType, ZonedDevice};

use crate::format::{
    clear_bit, count_bits, iter_set_bits, uuid_string, Layout, MapEntry, Result, Superblock,
    BITS_PER_BITMAP_BLOCK, BLOCK, MAP_ENTRIES_PER_BLOCK, MAP_UNMAPPED,
};
use crate::sets::{diff_sets, probe, read_meta_blocks, write_meta_blocks, write_superblock, Probe};

/// Metadata blocks read or written per I/O.
const BATCH_BLOCKS: u32 = 256;

/// What is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    /// One superblock is invalid (the set is rebuilt from the other).
    Superblock,
    /// Both superblocks are valid but their generations differ.
    StaleSet,
    /// Equal generations but the sets' blocks differ.
    SetMismatch,
    /// A map entry names a zone past the end of the device, a metadata or unusable zone.
    MapOutOfRange,
    /// An unmapped chunk has a buffer zone.
    UnmappedWithBuffer,
    /// A buffer zone that is invalid: equal to the data zone, on a chunk whose data zone is
    /// conventional, or out of range.
    BadBuffer,
    /// A buffer zone that is not conventional.
    BufferNotConventional,
    /// A zone used by several chunks (as data or buffer).
    SharedZone,
    /// A chunk mapped to an empty sequential zone without a buffer.
    EmptySeqWithoutBuffer,
    /// Valid bits at or past a sequential zone's write pointer (or past the zone end).
    ValidPastWp,
    /// A block valid in both the data zone and the buffer zone.
    ValidInBoth,
    /// An unmapped zone with valid bits.
    UnmappedZoneValidBits,
    /// An unmapped sequential zone that is not empty.
    UnmappedSeqNotEmpty,
}

/// One problem found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunk: Option<u32>,
    pub message: String,
}

/// Counts of what was checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// No error left (after repair, when repairing).
    pub clean: bool,
    pub nr_chunks: u32,
    pub mapped_chunks: u32,
    pub buffered_chunks: u32,
    pub mapped_zones: u32,
    pub unmapped_zones: u32,
    /// Blocks compared between the two sets (0 when their gens differ).
    pub set_blocks_compared: u64,
}

/// The result of `check`, serialisable for `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub device: String,
    pub label: String,
    pub uuid: String,
    /// Generation of the primary set when checked (after repair: `gen + 1` was written).
    pub gen: u64,
    pub primary: usize,
    pub repair: bool,
    pub errors: Vec<Finding>,
    pub fixed: Vec<Finding>,
    /// Not errors, but worth knowing (a degraded volume).
    pub warnings: Vec<String>,
    pub summary: Summary,
}

impl CheckReport {
    /// Errors not repaired.
    pub fn remaining(&self) -> usize {
        self.errors.len() - self.fixed.len()
    }
}

/// Everything a check works on, with the fixes planned so far.
struct Ctx<'a> {
    dev: &'a dyn ZonedDevice,
    layout: Layout,
    zones: Vec<Zone>,
    map: Vec<MapEntry>,
    /// Repaired bitmap blocks by metadata block number.
    dirty_bitmaps: BTreeMap<u32, Vec<u8>>,
    /// Sequential zones to reset once the metadata is committed.
    to_reset: Vec<u32>,
    /// (finding, fixable by repair)
    findings: Vec<(Finding, bool)>,
    /// The chunk whose bad mapping entry named a zone, dropped by a planned fix: what is
    /// then found in that zone is that chunk's business.
    dropped_from: Vec<Option<u32>>,
}

fn finding(kind: FindingKind, zone: Option<u32>, chunk: Option<u32>, message: String) -> Finding {
    Finding {
        kind,
        zone,
        chunk,
        message,
    }
}

impl Ctx<'_> {
    fn add(&mut self, f: Finding, fixable: bool) {
        warn!(kind = ?f.kind, "{}", f.message);
        self.findings.push((f, fixable));
    }

    fn usable(&self, z: u32) -> bool {
        self.zones.get(z as usize).is_some_and(|zone| {
            zone.len == self.layout.zone_blocks as u64 * BLOCK as u64
                && !matches!(zone.cond, ZoneCondition::Offline | ZoneCondition::ReadOnly)
        })
    }

    fn is_seq(&self, z: u32) -> bool {
        self.zones[z as usize].zone_type.is_sequential()
    }

    /// Write pointer of a zone in blocks from its start (zone size for conventional zones).
    fn wp_block(&self, z: u32) -> u32 {
        let zone = &self.zones[z as usize];
        if zone.zone_type.is_sequential() {
            ((zone.wp.saturating_sub(zone.start)) / BLOCK as u64) as u32
        } else {
            self.layout.zone_blocks
        }
    }

    fn set_entry(&mut self, chunk: u32, e: MapEntry) {
        self.map[chunk as usize] = e;
    }

    /// The mapping checks; returns the owner chunk of every zone after the planned fixes.
    fn check_mapping(&mut self) -> Vec<Option<u32>> {
        let mut owner: Vec<Option<u32>> = vec![None; self.layout.nr_zones as usize];
        for chunk in 0..self.layout.nr_chunks {
            let e = self.map[chunk as usize];
            if !e.is_mapped() {
                if e.has_buffer() {
                    self.add(
                        finding(
                            FindingKind::UnmappedWithBuffer,
                            Some(e.bzone),
                            Some(chunk),
                            format!("unmapped chunk {chunk} has buffer zone {}", e.bzone),
                        ),
                        true,
                    );
                    self.set_entry(chunk, MapEntry::UNMAPPED);
                }
                continue;
            }
            if !self.check_data_zone(chunk, e, &mut owner) {
                continue;
            }
            let e = self.check_buffer_zone(chunk, e, &mut owner);
            let d = e.dzone;
            if !e.has_buffer() && self.is_seq(d) && self.wp_block(d) == 0 {
                self.add(
                    finding(
                        FindingKind::EmptySeqWithoutBuffer,
                        Some(d),
                        Some(chunk),
                        format!(
                            "chunk {chunk} is mapped to empty sequential zone {d} without buffer"
                        ),
                    ),
                    true,
                );
                self.set_entry(chunk, MapEntry::UNMAPPED);
                owner[d as usize] = None;
            }
        }
        owner
    }

    /// A mapped chunk's data zone: in range, not metadata, usable, not another chunk's.
    /// True if the chunk keeps it (and now owns it); otherwise the chunk is unmapped.
    fn check_data_zone(&mut self, chunk: u32, e: MapEntry, owner: &mut [Option<u32>]) -> bool {
        let nr_zones = self.layout.nr_zones;
        let d = e.dzone;
        let bad_d = if d >= nr_zones {
            Some(format!("past the last zone ({})", nr_zones - 1))
        } else if self.layout.is_meta_zone(d) {
            Some("a metadata zone".to_string())
        } else if !self.usable(d) {
            Some("offline, read-only or a runt zone".to_string())
        } else {
            None
        };
        if let Some(why) = bad_d {
            self.add(
                finding(
                    FindingKind::MapOutOfRange,
                    Some(d),
                    Some(chunk),
                    format!("chunk {chunk} data zone {d} is {why}"),
                ),
                true,
            );
            for z in [d, e.bzone] {
                if z < nr_zones && !self.layout.is_meta_zone(z) {
                    self.dropped_from[z as usize].get_or_insert(chunk);
                }
            }
            self.set_entry(chunk, MapEntry::UNMAPPED);
            return false;
        }
        if let Some(other) = owner[d as usize] {
            self.add(
                finding(
                    FindingKind::SharedZone,
                    Some(d),
                    Some(chunk),
                    format!("chunk {chunk} data zone {d} is already used by chunk {other}"),
                ),
                true,
            );
            self.set_entry(chunk, MapEntry::UNMAPPED);
            return false;
        }
        owner[d as usize] = Some(chunk);
        true
    }

    /// A chunk's buffer zone, if any: usable, not its data zone, on a sequential data zone,
    /// conventional, not another chunk's. Returns the entry as it stays (a bad buffer
    /// dropped).
    fn check_buffer_zone(
        &mut self,
        chunk: u32,
        mut e: MapEntry,
        owner: &mut [Option<u32>],
    ) -> MapEntry {
        if !e.has_buffer() {
            return e;
        }
        let (b, d) = (e.bzone, e.dzone);
        let nr_zones = self.layout.nr_zones;
        let bad = if b >= nr_zones || self.layout.is_meta_zone(b) || !self.usable(b) {
            Some((
                FindingKind::BadBuffer,
                format!("chunk {chunk} buffer zone {b} is out of range or unusable"),
            ))
        } else if b == d {
            Some((
                FindingKind::BadBuffer,
                format!("chunk {chunk} buffer zone {b} is its data zone"),
            ))
        } else if !self.is_seq(d) {
            Some((
                FindingKind::BadBuffer,
                format!("chunk {chunk} has conventional data zone {d} and a buffer zone {b}"),
            ))
        } else if self.zones[b as usize].zone_type != ZoneType::Conventional {
            Some((
                FindingKind::BufferNotConventional,
                format!("chunk {chunk} buffer zone {b} is not conventional"),
            ))
        } else {
            owner[b as usize].map(|other| {
                (
                    FindingKind::SharedZone,
                    format!("chunk {chunk} buffer zone {b} is already used by chunk {other}"),
                )
            })
        };
        match bad {
            Some((kind, msg)) => {
                self.add(finding(kind, Some(b), Some(chunk), msg), true);
                if b < nr_zones && b != d && !self.layout.is_meta_zone(b) {
                    self.dropped_from[b as usize].get_or_insert(chunk);
                }
                e.bzone = MAP_UNMAPPED;
                self.set_entry(chunk, e);
            }
            None => owner[b as usize] = Some(chunk),
        }
        e
    }

    /// Read the bitmap blocks of zones `first..first+n` (whole zones), repaired copies first.
    fn zone_bitmaps(&self, set: usize, first: u32, n: u32) -> Result<Vec<u8>> {
        let zbb = self.layout.zone_bitmap_blocks;
        let first_mblk = self.layout.bitmap_block(first, 0);
        let mut buf = vec![0u8; (n * zbb) as usize * BLOCK];
        read_meta_blocks(self.dev, &self.layout, set, first_mblk, &mut buf)?;
        for (m, b) in self.dirty_bitmaps.range(first_mblk..first_mblk + n * zbb) {
            let i = (m - first_mblk) as usize * BLOCK;
            buf[i..i + BLOCK].copy_from_slice(b);
        }
        Ok(buf)
    }

    /// Remember a repaired copy of every bitmap block of `zone` in `zbuf` that `changed`.
    fn keep_bitmap(&mut self, zone: u32, zbuf: &[u8], changed: &[bool]) {
        for (i, c) in changed.iter().enumerate() {
            if *c {
                let m = self.layout.bitmap_block(zone, 0) + i as u32;
                self.dirty_bitmaps
                    .insert(m, zbuf[i * BLOCK..(i + 1) * BLOCK].to_vec());
            }
        }
    }

    /// The bitmap checks, zone by zone, reading bitmaps in batches.
    fn check_bitmaps(&mut self, set: usize, owner: &[Option<u32>]) -> Result<(u32, u32)> {
        let zbb = self.layout.zone_bitmap_blocks;
        let zone_bytes = zbb as usize * BLOCK;
        let per_batch = (BATCH_BLOCKS / zbb).max(1);
        let (mut mapped, mut unmapped) = (0, 0);
        let mut z0 = 0;
        while z0 < self.layout.nr_zones {
            let n = per_batch.min(self.layout.nr_zones - z0);
            let mut batch = self.zone_bitmaps(set, z0, n)?;
            for z in z0..z0 + n {
                let off = (z - z0) as usize * zone_bytes;
                // A zone's bitmap blocks are one linear LSB-first bitmap: block b of the zone
                // is bit b (each block holds 32768 bits, or the whole zone when smaller).
                let zbuf = &mut batch[off..off + zone_bytes];
                let changed = match owner[z as usize] {
                    None => {
                        unmapped += 1;
                        self.check_unmapped_zone(z, zbuf)
                    }
                    Some(chunk) => {
                        mapped += 1;
                        self.check_mapped_zone(z, chunk, zbuf)
                    }
                };
                self.keep_bitmap(z, &batch[off..off + zone_bytes], &changed);
            }
            z0 += n;
        }
        self.check_valid_in_both(set, owner)?;
        Ok((mapped, unmapped))
    }

    /// A zone no chunk owns: no valid bits (cleared), and empty if sequential (reset later).
    /// Returns which of its bitmap blocks changed.
    fn check_unmapped_zone(&mut self, z: u32, zbuf: &mut [u8]) -> Vec<bool> {
        let mut changed = vec![false; self.layout.zone_bitmap_blocks as usize];
        let n_valid = count_bits(zbuf);
        if n_valid > 0 {
            self.add(
                finding(
                    FindingKind::UnmappedZoneValidBits,
                    Some(z),
                    self.dropped_from[z as usize],
                    format!("unmapped zone {z} has {n_valid} valid blocks"),
                ),
                true,
            );
            for (i, blk) in zbuf.chunks_mut(BLOCK).enumerate() {
                if blk.iter().any(|&b| b != 0) {
                    blk.fill(0);
                    changed[i] = true;
                }
            }
        }
        let zone = self.zones[z as usize];
        // A drive's tertiary superblock zone holds that superblock at its start.
        let tertiary = self.layout.tertiary_zones.contains(&z);
        if zone.zone_type.is_sequential() && zone.wp != zone.start && !tertiary {
            let resettable = self.usable(z);
            self.add(
                finding(
                    FindingKind::UnmappedSeqNotEmpty,
                    Some(z),
                    self.dropped_from[z as usize],
                    format!(
                        "unmapped sequential zone {z} is not empty (wp block {})",
                        self.wp_block(z)
                    ),
                ),
                resettable,
            );
            if resettable {
                self.to_reset.push(z);
            }
        }
        changed
    }

    /// A zone of `chunk`: nothing valid at or past a sequential write pointer (cleared).
    /// Returns which of its bitmap blocks changed.
    fn check_mapped_zone(&mut self, z: u32, chunk: u32, zbuf: &mut [u8]) -> Vec<bool> {
        let mut changed = vec![false; self.layout.zone_bitmap_blocks as usize];
        let limit = if self.is_seq(z) {
            self.wp_block(z)
        } else {
            self.layout.zone_blocks
        };
        let past = set_bits_from(zbuf, limit);
        if !past.is_empty() {
            self.add(
                finding(
                    FindingKind::ValidPastWp,
                    Some(z),
                    Some(chunk),
                    format!(
                        "zone {z} (chunk {chunk}) has {} valid blocks at or past \
                         its write pointer (block {limit}), first {}",
                        past.len(),
                        past[0]
                    ),
                ),
                true,
            );
            for &b in &past {
                clear_bit(zbuf, b);
                changed[(b / BITS_PER_BITMAP_BLOCK) as usize] = true;
            }
        }
        changed
    }

    /// Blocks valid in both the data zone and its buffer: keep the buffer's copy.
    fn check_valid_in_both(&mut self, set: usize, owner: &[Option<u32>]) -> Result<()> {
        let zbb = self.layout.zone_bitmap_blocks;
        // Data zone -> buffer zone, visited in zone order.
        let mut buffer_of: Vec<Option<u32>> = vec![None; self.layout.nr_zones as usize];
        for chunk in 0..self.layout.nr_chunks {
            let e = self.map[chunk as usize];
            if e.is_mapped() && e.has_buffer() {
                buffer_of[e.dzone as usize] = Some(e.bzone);
            }
        }
        for d in 0..self.layout.nr_zones {
            let Some(b) = buffer_of[d as usize] else {
                continue;
            };
            if owner[d as usize].is_none() {
                continue;
            }
            let mut dbuf = self.zone_bitmaps(set, d, 1)?;
            let bbuf = self.zone_bitmaps(set, b, 1)?;
            let both: Vec<usize> = dbuf
                .iter()
                .zip(&bbuf)
                .enumerate()
                .filter(|(_, (x, y))| *x & *y != 0)
                .map(|(i, _)| i)
                .collect();
            if both.is_empty() {
                continue;
            }
            let n: u32 = both.iter().map(|&i| (dbuf[i] & bbuf[i]).count_ones()).sum();
            let chunk = owner[d as usize].expect("checked");
            self.add(
                finding(
                    FindingKind::ValidInBoth,
                    Some(d),
                    Some(chunk),
                    format!(
                        "chunk {chunk}: {n} blocks valid in both data zone {d} and buffer zone {b}"
                    ),
                ),
                true,
            );
            let mut changed = vec![false; zbb as usize];
            for i in both {
                dbuf[i] &= !bbuf[i];
                changed[i / BLOCK] = true;
            }
            self.keep_bitmap(d, &dbuf, &changed);
        }
        Ok(())
    }
}

/// Set bits of `bitmap` at or after bit `from`, skipping the bytes before it.
fn set_bits_from(bitmap: &[u8], from: u32) -> Vec<u32> {
    let first = (from / 8) as usize;
    if first >= bitmap.len() {
        return Vec::new();
    }
    let nbits = ((bitmap.len() - first) * 8) as u32;
    iter_set_bits(&bitmap[first..], nbits)
        .map(|b| b + first as u32 * 8)
        .filter(|&b| b >= from)
        .collect()
}

/// Compare the two sets block by block (superblocks: every field but `sb_block`).
fn compare_sets(
    dev: &dyn ZonedDevice,
    layout: &Layout,
    sbs: [&Superblock; 2],
) -> Result<(u64, Vec<u32>)> {
    let mut a = sbs[0].clone();
    a.sb_block = 0;
    let mut b = sbs[1].clone();
    b.sb_block = 0;
    let mut differ = Vec::new();
    if a != b {
        differ.push(0);
    }
    differ.extend(diff_sets(dev, layout)?);
    Ok((layout.nr_meta_blocks as u64, differ))
}

fn superblock_findings(p: &Probe, primary: usize) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, s) in p.sets.iter().enumerate() {
        if s.valid.is_none() {
            out.push(finding(
                FindingKind::Superblock,
                s.zone,
                None,
                format!(
                    "superblock {i}: {}",
                    s.error.as_deref().unwrap_or("not found")
                ),
            ));
        }
    }
    if let (Some(g0), Some(g1)) = (p.sets[0].gen(), p.sets[1].gen()) {
        if g0 != g1 {
            let other = primary ^ 1;
            out.push(finding(
                FindingKind::StaleSet,
                p.sets[other].zone,
                None,
                format!(
                    "metadata set {other} (gen {}) is older than set {primary} (gen {})",
                    p.sets[other].gen().unwrap_or(0),
                    p.sets[primary].gen().unwrap_or(0)
                ),
            ));
        }
    }
    out
}

/// Commit the repaired metadata as generation `sb.gen + 1` in both sets, other set first.
fn commit(ctx: &Ctx<'_>, primary: usize, sb: &Superblock) -> Result<()> {
    let layout = &ctx.layout;
    let other = primary ^ 1;
    let mut map_bytes = vec![0xFFu8; layout.nr_map_blocks as usize * BLOCK];
    for (chunk, e) in ctx.map.iter().enumerate() {
        let (m, i) = layout.map_block(chunk as u32);
        let off = (m - 1) as usize * BLOCK;
        e.write(&mut map_bytes[off..off + BLOCK], i);
    }
    // A full copy of the repaired primary into the other set.
    let mut buf = vec![0u8; BATCH_BLOCKS as usize * BLOCK];
    let mut m = 1;
    while m < layout.nr_meta_blocks {
        let n = (layout.nr_meta_blocks - m).min(BATCH_BLOCKS);
        let b = &mut buf[..n as usize * BLOCK];
        read_meta_blocks(ctx.dev, layout, primary, m, b)?;
        for i in 0..n {
            let mblk = m + i;
            let dst = &mut b[i as usize * BLOCK..(i as usize + 1) * BLOCK];
            if mblk <= layout.nr_map_blocks {
                let off = (mblk - 1) as usize * BLOCK;
                dst.copy_from_slice(&map_bytes[off..off + BLOCK]);
            } else if let Some(d) = ctx.dirty_bitmaps.get(&mblk) {
                dst.copy_from_slice(d);
            }
        }
        write_meta_blocks(ctx.dev, layout, other, m, b)?;
        m += n;
    }
    let mut new_sb = sb.clone();
    new_sb.gen = sb.gen + 1;
    ctx.dev.flush()?;
    write_superblock(ctx.dev, layout, other, &new_sb)?;
    ctx.dev.flush()?;
    // Then the primary in place: the map always (rebuilt from entries, it normalises the
    // unused tail past nr_chunks to 0xFF as in the other set), and the changed bitmaps.
    write_meta_blocks(ctx.dev, layout, primary, 1, &map_bytes)?;
    for (m, d) in &ctx.dirty_bitmaps {
        write_meta_blocks(ctx.dev, layout, primary, *m, d)?;
    }
    ctx.dev.flush()?;
    write_superblock(ctx.dev, layout, primary, &new_sb)?;
    ctx.dev.flush()?;
    Ok(())
}

/// Check the dm-zoned metadata of `dev` (and repair it if `repair`). Errors only when the
/// device cannot be checked at all (I/O error, no valid superblock).
/// When both sets are valid with equal generations, compare them block by block: (blocks
/// compared, a finding if they differ).
fn compare_valid_sets(
    dev: &dyn ZonedDevice,
    p: &Probe,
    layout: &Layout,
) -> Result<(u64, Option<Finding>)> {
    let (Some((s0, _)), Some((s1, _))) = (&p.sets[0].valid, &p.sets[1].valid) else {
        return Ok((0, None));
    };
    if s0.gen != s1.gen {
        return Ok((0, None));
    }
    let (n, differ) = compare_sets(dev, layout, [s0, s1])?;
    let f = (!differ.is_empty()).then(|| {
        finding(
            FindingKind::SetMismatch,
            None,
            None,
            format!(
                "metadata sets differ in {} of {n} blocks (first: block {})",
                differ.len(),
                differ[0]
            ),
        )
    });
    Ok((n, f))
}

/// The map as set `set` has it.
fn read_map(dev: &dyn ZonedDevice, layout: &Layout, set: usize) -> Result<Vec<MapEntry>> {
    let mut map_bytes = vec![0u8; layout.nr_map_blocks as usize * BLOCK];
    read_meta_blocks(dev, layout, set, 1, &mut map_bytes)?;
    Ok((0..layout.nr_chunks as usize)
        .map(|c| {
            let blk = c / MAP_ENTRIES_PER_BLOCK;
            MapEntry::read(&map_bytes[blk * BLOCK..], c % MAP_ENTRIES_PER_BLOCK)
        })
        .collect())
}

/// A volume that lost zones since its format says so.
fn degraded_warning(layout: &Layout) -> Option<String> {
    if layout.nr_lost_zones == 0 {
        return None;
    }
    let w = format!(
        "degraded: {} zone(s) went offline or read-only after the format; {} reserved \
         zone(s) left for reclaim",
        layout.nr_lost_zones,
        layout.nr_reserved_seq.saturating_sub(layout.nr_lost_zones)
    );
    warn!("{w}");
    Some(w)
}

pub fn check(dev: &dyn ZonedDevice, repair: bool) -> Result<CheckReport> {
    let p = probe(dev)?;
    let (primary, sb, layout) = p.choose(&dev.describe())?;
    let mut sb_findings = superblock_findings(&p, primary);
    let (compared, mismatch) = compare_valid_sets(dev, &p, &layout)?;
    sb_findings.extend(mismatch);
    let map = read_map(dev, &layout, primary)?;
    let zones = p.zones.clone();
    let mut ctx = Ctx {
        dev,
        layout: layout.clone(),
        zones,
        map,
        dirty_bitmaps: BTreeMap::new(),
        to_reset: Vec::new(),
        findings: sb_findings.into_iter().map(|f| (f, true)).collect(),
        dropped_from: vec![None; layout.nr_zones as usize],
    };
    let owner = ctx.check_mapping();
    let (mapped_zones, unmapped_zones) = ctx.check_bitmaps(primary, &owner)?;

    let mapped_chunks = ctx.map.iter().filter(|e| e.is_mapped()).count() as u32;
    let buffered_chunks = ctx
        .map
        .iter()
        .filter(|e| e.is_mapped() && e.has_buffer())
        .count() as u32;
    let errors: Vec<Finding> = ctx.findings.iter().map(|(f, _)| f.clone()).collect();
    let mut fixed = Vec::new();
    if repair && !errors.is_empty() {
        commit(&ctx, primary, &sb)?;
        for &z in &ctx.to_reset {
            dev.zone_mgmt(ZoneOp::Reset, z)?;
        }
        fixed = ctx
            .findings
            .iter()
            .filter(|(_, ok)| *ok)
            .map(|(f, _)| f.clone())
            .collect();
        info!(fixed = fixed.len(), gen = sb.gen + 1, "metadata repaired");
    }
    let clean = errors.len() == fixed.len();
    let warnings: Vec<String> = degraded_warning(&layout).into_iter().collect();
    Ok(CheckReport {
        device: dev.describe(),
        label: sb.label_str(),
        uuid: uuid_string(&sb.set_uuid),
        gen: sb.gen,
        primary,
        repair,
        summary: Summary {
            clean,
            nr_chunks: layout.nr_chunks,
            mapped_chunks,
            buffered_chunks,
            mapped_zones,
            unmapped_zones,
            set_blocks_compared: compared,
        },
        errors,
        fixed,
        warnings,
    })
}
