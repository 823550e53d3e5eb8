//! The one owner of a log-layout volume's metadata state: index, zone table and frontiers,
//! metadata log buffer, clock and checkpoint generation. Every change goes through a record
//! ([`Meta::apply`]), the same function on the live path and at replay.

use crate::engine::ids::{Lba, ZoneId, BLOCK};
use crate::engine::meta::log::LogBuf;

use super::compact::PageSet;
use super::gc::GcWork;
use super::index::Index;
use super::layout::{Layout, Pba, ENTRIES};
use super::record::LogRec;
use super::zones::{Frontier, ZoneState, Zones};
use super::EngineError;

/// Where a record is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ctx {
    /// On the running engine: a zone opened becomes the frontier of its class's first empty
    /// slot.
    Live,
    /// At open: records already folded into a page's on-disk copy are skipped for it, and
    /// frontiers are settled after the whole log (`open::settle_zones`).
    Replay,
}

pub(crate) struct Meta {
    pub layout: Layout,
    pub index: Index,
    pub zones: Zones,
    pub log: LogBuf<LogRec>,
    /// User blocks written since format (the age of zones for cost-benefit).
    pub clock: u64,
    /// Generation of the last checkpoint; the log's epoch.
    pub gen: u64,
    /// The GC victim being emptied, and the blocks of copying user writes owe it.
    pub gc: Option<GcWork>,
    pub gc_debt: f64,
    /// A GC batch is being copied with `wlock` released (`gc.rs`, `Step::Busy`): the work is
    /// out of `gc` meanwhile, and no other GC step may start until it is back. Its ratio
    /// (blocks of copying owed per user block: 0 for a compaction), so that writes meanwhile
    /// still owe it.
    pub gc_copying: Option<f64>,
    /// The pages idle compaction looks at next (`compact.rs`): those user writes and GC
    /// copies changed since.
    pub compact: PageSet,
}

impl Meta {
    /// Whether a GC work is in progress: in `gc`, or out of it while a batch is copied.
    pub fn gc_busy(&self) -> bool {
        self.gc.is_some() || self.gc_copying.is_some()
    }

    /// Apply record `seq`. `landed[i]` says whether block `i` of an `Append` is on the device
    /// (all true on the live path; replay checks unproven records).
    /// An error (a page that cannot be read) leaves the record applied in part: the engine
    /// stops.
    pub fn apply(
        &mut self,
        rec: &LogRec,
        seq: u64,
        ctx: Ctx,
        landed: &[bool],
    ) -> Result<(), EngineError> {
        // A record's pages stay cached while it is applied: one it maps into a page not
        // cached yet must not evict another it changes (a planned write checked them all,
        // and its queue thread must not read a page under the state lock).
        let blocks = match *rec {
            LogRec::Append { lba, ref crcs, .. } => Some((lba, crcs.len() as u32)),
            LogRec::Move { lba, n, .. } => Some((lba, n)),
            // A discard drops every page it empties, and no plan checks its pages: held,
            // a whole-device discard would make every cached page unevictable, and each
            // page it reads walk the whole cache for nothing.
            _ => None,
        };
        if let Some((lba, n)) = blocks {
            self.index.hold(lba, n);
        }
        let r = self.apply_held(rec, seq, ctx, landed);
        self.index.release();
        r
    }

    fn apply_held(
        &mut self,
        rec: &LogRec,
        seq: u64,
        ctx: Ctx,
        landed: &[bool],
    ) -> Result<(), EngineError> {
        match *rec {
            LogRec::Append {
                lba,
                zone,
                off,
                ref crcs,
            } => {
                for (i, ok) in landed.iter().enumerate().take(crcs.len()) {
                    if *ok {
                        let to = self.layout.pba(zone, off + i as u32);
                        self.remap(Lba(lba.0 + i as u32), Some(to), seq, ctx)?;
                    }
                }
                self.compact.written(lba, crcs.len() as u32);
                self.clock += crcs.len() as u64;
                self.zones.get_mut(zone).last_append = self.clock;
            }
            LogRec::Move { lba, n, zone, off } => {
                for i in 0..n {
                    let to = self.layout.pba(zone, off + i);
                    self.remap(Lba(lba.0 + i), Some(to), seq, ctx)?;
                }
                self.zones.get_mut(zone).last_append = self.clock;
            }
            LogRec::Trim { lba, n } => self.trim(lba, n, seq, ctx)?,
            LogRec::ZoneOpen { zone, class } => {
                let data_blocks = self.layout.data_blocks();
                let z = self.zones.get_mut(zone);
                z.state = ZoneState::Open(class);
                z.last_append = self.clock;
                if ctx == Ctx::Live {
                    debug_assert!(!z.needs_reset);
                    let slot = self.zones.empty_slot(class);
                    debug_assert!(slot.is_some(), "zone {zone} opened with no empty slot");
                    if let Some(s) = slot {
                        *self.zones.frontier(s) = Some(Frontier::new(zone, 0, data_blocks));
                    }
                }
            }
            LogRec::ZoneFree { zone } => {
                let z = self.zones.get_mut(zone);
                debug_assert!(
                    ctx == Ctx::Replay || z.valid == 0,
                    "freed zone {zone} has valid blocks"
                );
                z.state = ZoneState::Free;
                z.needs_reset = true;
            }
        }
        Ok(())
    }

    /// Unmap `lba..lba + n`, skipping whole pages that map nothing (a discard of the whole
    /// device, as mkfs makes, costs one step per page).
    fn trim(&mut self, lba: Lba, n: u32, seq: u64, ctx: Ctx) -> Result<(), EngineError> {
        let end = lba.0 as u64 + n as u64;
        let mut b = lba.0 as u64;
        while b < end {
            let (p, i) = Layout::page_of(Lba(b as u32));
            let page_end = (b + (ENTRIES - i) as u64).min(end);
            if self.index.has_page(p) {
                for x in b..page_end {
                    self.remap(Lba(x as u32), None, seq, ctx)?;
                }
            }
            b = page_end;
        }
        Ok(())
    }

    /// Point `lba` at `to`, moving one valid block from its old zone to the new one.
    fn remap(&mut self, lba: Lba, to: Option<Pba>, seq: u64, ctx: Ctx) -> Result<(), EngineError> {
        if ctx == Ctx::Replay && seq < self.index.page_seq(Layout::page_of(lba).0)? {
            return Ok(());
        }
        if let Some(old) = self.index.set(lba, to)? {
            let z = self.layout.zone_of(old).0;
            let v = &mut self.zones.get_mut(z).valid;
            *v = v.saturating_sub(1);
        }
        if let Some(t) = to {
            self.zones.get_mut(self.layout.zone_of(t).0).valid += 1;
        }
        Ok(())
    }

    /// The logical block each data block of `zone` holds per the index (`None` where
    /// nothing live), from one pass over the index: a GC victim's summary when a summary
    /// block fails its CRC. (Open builds the open zones' summaries in its own pass:
    /// `open::recount_and_check`.)
    pub fn reverse_map(&self, zone: ZoneId) -> Result<Vec<Option<Lba>>, EngineError> {
        let mut s = vec![None; self.layout.data_blocks() as usize];
        self.index.for_each_mapped(|lba, p| {
            let (z, off) = self.layout.zone_of(p);
            if z == zone {
                if let Some(e) = s.get_mut(off as usize) {
                    *e = Some(lba);
                }
            }
        })?;
        Ok(s)
    }

    /// See `LogEngine::debug_check`; `zones` is the device's report.
    pub fn check(&self, zones: &[zbd::Zone]) -> Result<(), String> {
        let l = &self.layout;
        let wp = |z: ZoneId| ((zones[z.idx()].wp - zones[z.idx()].start) / BLOCK as u64) as u32;
        self.index.check_counts()?;
        let mut valid = vec![0u32; self.zones.info.len()];
        let mut bad = None;
        self.index
            .for_each_mapped(|lba, p| {
                let (z, off) = l.zone_of(p);
                let state = self.zones.get(z).state;
                let ok = match state {
                    ZoneState::Open(_) => off < wp(z).min(l.data_blocks()),
                    ZoneState::Full => off < l.data_blocks(),
                    _ => false,
                };
                if !ok && bad.is_none() {
                    bad = Some(format!("block {} maps to {z}:{off} ({state:?})", lba.0));
                }
                valid[z.idx()] += 1;
            })
            .map_err(|e| e.to_string())?;
        if let Some(b) = bad {
            return Err(b);
        }
        for (z, i) in self.zones.info.iter().enumerate() {
            if i.valid != valid[z] {
                return Err(format!("zone {z}: valid {} counted {}", i.valid, valid[z]));
            }
        }
        for (s, f) in self.zones.frontiers.iter().enumerate() {
            if let Some(f) = f {
                let class = self.zones.class_of(super::zones::Slot(s));
                if self.zones.get(f.zone).state != ZoneState::Open(class) || f.wp != wp(f.zone) {
                    return Err(format!(
                        "frontier {s} at {}:{} disagrees with the device",
                        f.zone, f.wp
                    ));
                }
            }
        }
        Ok(())
    }
}
