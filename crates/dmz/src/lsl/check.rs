//! `zonedd check` for a log-layout volume: everything open reads and verifies, without
//! writing (docs/design.md, "Log layout", "Check"), and what open would find beyond that:
//! the other superblock slot, and the summary of every full zone against the index.
//! `--repair` is an open and a close (the checkpoint at open rewrites the other superblock
//! slot; replay folds the log), which the caller does when [`LogCheck::needs_repair`].

use crate::engine::ids::{Lba, ZoneId, BLOCK};

use super::layout::{decode_sb, decode_summary, ENTRIES};
use super::open::{load, read_slot, Mode};
use super::zones::ZoneState;
use super::EngineError;
use std::sync::Arc;
use zbd::{ZoneCondition, ZonedDevice};

/// What `check` found, for the CLI (human and JSON).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LogCheck {
    pub label: String,
    pub uuid: String,
    /// Generation and first sequence number of the checkpoint open would start from.
    pub gen: u64,
    pub ckpt_seq: u64,
    /// Records of the log half that open would replay, and `Append` blocks it would drop
    /// (unflushed writes a crash did not keep: not an error).
    pub records_to_replay: u64,
    pub dropped_blocks: u64,
    pub zones_free: u32,
    pub zones_open: u32,
    pub zones_full: u32,
    /// Free zones holding old data (reset before reuse: not an error).
    pub zones_to_reset: u32,
    pub mapped_blocks: u64,
    pub capacity_blocks: u64,
    /// Full zones whose summary was compared with the index.
    pub summaries_checked: u32,
    /// Damage open repairs (the other superblock slot): `check --repair` fixes it.
    pub errors: Vec<String>,
    /// Damage that costs nothing but a rebuild from the index (a full zone's summary).
    pub warnings: Vec<String>,
}

impl LogCheck {
    pub fn clean(&self) -> bool {
        self.errors.is_empty()
    }
    /// Whether `--repair` has work: every error `check` reports (today, a damaged older
    /// superblock slot) is one an open and a close repair.
    pub fn needs_repair(&self) -> bool {
        !self.clean()
    }
}

/// Check a log-layout volume, reading only. `Err`: open itself would refuse the volume (the
/// error says why); the caller reports it as damage `--repair` cannot fix.
pub fn check(dev: Arc<dyn ZonedDevice>) -> Result<LogCheck, EngineError> {
    let ld = load(
        &dev,
        super::LogOptions::default().index_memory,
        super::CompactOn::Never,
        Mode::Check,
    )?;
    let dev = &*dev;
    let l = &ld.layout;
    let st = &ld.meta;
    let count = |f: fn(ZoneState) -> bool| st.zones.count(f);
    let mut r = LogCheck {
        label: String::from_utf8_lossy(&l.label)
            .trim_end_matches('\0')
            .to_string(),
        uuid: uuid::Uuid::from_bytes(l.uuid).to_string(),
        gen: ld.ck.gen,
        ckpt_seq: ld.ck.ckpt_seq,
        records_to_replay: ld.next_seq - ld.ck.ckpt_seq,
        dropped_blocks: ld
            .stats
            .replay_dropped
            .load(std::sync::atomic::Ordering::Relaxed),
        zones_free: count(|s| s == ZoneState::Free),
        zones_open: count(|s| matches!(s, ZoneState::Open(_))),
        zones_full: count(|s| s == ZoneState::Full),
        zones_to_reset: st
            .zones
            .info
            .iter()
            .enumerate()
            .filter(|(z, i)| i.state == ZoneState::Free && ld.wps.get(*z).is_some_and(|&w| w > 0))
            .count() as u32,
        capacity_blocks: l.user_blocks,
        ..Default::default()
    };
    // The other slot: open takes the newer valid one; the older must be valid too (it is
    // what a torn superblock write falls back to).
    let other = 1 - (ld.ck.gen % 2);
    let why = read_slot(dev, &ld.zones, other).and_then(|b| {
        decode_sb(&b, other as u32, &ld.zones, &dev.geometry())
            .map(|_| ())
            .map_err(EngineError::Meta)
    });
    if let Err(e) = why {
        r.errors.push(format!(
            "superblock slot {other} (the older checkpoint): {e}"
        ));
    }
    check_summaries(dev, &ld, &mut r)?;
    Ok(r)
}

/// The summary of every full zone names, at each offset the index maps into the zone, the
/// logical block mapped there. Counts the mapped blocks on the way (one walk of the index).
fn check_summaries(
    dev: &dyn ZonedDevice,
    ld: &super::open::Loaded,
    r: &mut LogCheck,
) -> Result<(), EngineError> {
    let l = &ld.layout;
    let mut by_zone: Vec<Vec<(u32, Lba)>> = vec![Vec::new(); l.nr_zones as usize];
    ld.meta.index.for_each_mapped(|lba, p| {
        r.mapped_blocks += 1;
        let (z, off) = l.zone_of(p);
        if let Some(v) = by_zone.get_mut(z.idx()) {
            v.push((off, lba));
        }
    })?;
    let mut buf = vec![0u8; l.summary_blocks as usize * BLOCK];
    for (z, mapped) in by_zone.iter().enumerate() {
        let zone = ZoneId(z as u32);
        if ld.meta.zones.get(zone).state != ZoneState::Full
            || ld
                .zones
                .get(z)
                .is_none_or(|d| d.cond == ZoneCondition::Offline)
        {
            continue;
        }
        r.summaries_checked += 1;
        dev.read_at(&mut buf, l.zone_offset(zone, l.data_blocks()))?;
        // Per data block: the logical block its summary names, None where the summary
        // block is damaged (not compared).
        let mut names: Vec<Option<Option<Lba>>> = Vec::with_capacity(l.data_blocks() as usize);
        for (j, b) in buf.chunks(BLOCK).enumerate() {
            match decode_summary(zone, j as u32, b) {
                Some(v) => names.extend(v.into_iter().map(Some)),
                None => {
                    r.warnings.push(format!(
                        "zone {z}: summary block {j} is damaged (GC rebuilds it from the index)"
                    ));
                    names.extend(std::iter::repeat_n(None, ENTRIES));
                }
            }
        }
        let wrong = mapped
            .iter()
            .filter(|&&(off, lba)| {
                names
                    .get(off as usize)
                    .is_some_and(|n| n.is_some_and(|n| n != Some(lba)))
            })
            .count();
        if wrong > 0 {
            r.warnings.push(format!(
                "zone {z}: the summary disagrees with the index on {wrong} of {} blocks \
                 (GC follows the index)",
                mapped.len()
            ));
        }
    }
    Ok(())
}
