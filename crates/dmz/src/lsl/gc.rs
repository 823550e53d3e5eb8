//! Garbage collection, one victim at a time, synchronously in the writer that needs a zone
//! (this slice has no GC thread): the victim's live blocks, found through its summary,
//! are copied in logical order into the GC frontier; then flush, `Move` + `ZoneFree`
//! records, log write, flush, and only then the victim's reset.

use std::sync::atomic::Ordering;

use zbd::ZoneOp;

use crate::engine::ids::{Lba, ZoneId, BLOCK, IO_BATCH_BLOCKS};

use super::layout::{decode_summary, ENTRIES};
use super::record::{Class, LogRec};
use super::{EngineError, LogEngine};

impl LogEngine {
    /// Empty the best victim. Returns false when no full zone has an invalid block (GC can
    /// free nothing). The caller holds `wlock`.
    pub(super) fn gc_one(&self) -> Result<bool, EngineError> {
        let victim = {
            let st = self.state.lock();
            st.zones.pick_victim(st.clock, self.layout.data_blocks())
        };
        let Some(victim) = victim else {
            self.stats.gc_no_victim.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        };
        let live = self.live_blocks(victim)?;
        let moves = self.copy_live(victim, &live)?;
        // The copies are durable before any record names them (Move is trusted at replay).
        self.dev_flush()?;
        for m in moves {
            self.log_op(m)?;
        }
        self.log_op(LogRec::ZoneFree { zone: victim })?;
        // ZoneFree durable (and every record naming the victim before it) before the reset.
        self.sync_all()?;
        {
            let _r = self.reset.write();
            self.dev(self.dev.zone_mgmt(ZoneOp::Reset, victim.0))?;
        }
        self.state.lock().zones.get_mut(victim).needs_reset = false;
        self.stats.gc_zones.fetch_add(1, Ordering::Relaxed);
        self.stats
            .gc_blocks
            .fetch_add(live.len() as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// The victim's live blocks as (logical block, offset in the victim), in logical order:
    /// its summary's entries that the index still maps there. Should the summary miss some
    /// (the valid count says so: only damaged metadata does that), the index is searched
    /// instead, so GC never frees a zone the index still maps into.
    fn live_blocks(&self, victim: ZoneId) -> Result<Vec<(Lba, u32)>, EngineError> {
        let summary = self.read_summary(victim)?;
        let st = self.state.lock();
        let live_of = |summary: &[Option<Lba>]| -> Vec<(Lba, u32)> {
            let mut v: Vec<(Lba, u32)> = summary
                .iter()
                .enumerate()
                .filter_map(|(off, l)| Some(((*l)?, off as u32)))
                .filter(|&(l, _)| (l.0 as u64) < self.layout.user_blocks)
                .filter(|&(l, off)| st.index.get(l) == Some(self.layout.pba(victim, off)))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let live = live_of(&summary);
        if live.len() as u32 == st.zones.get(victim).valid {
            return Ok(live);
        }
        tracing::warn!(zone = %victim, "zone summary misses live blocks: searching the index");
        self.stats.summary_rebuilds.fetch_add(1, Ordering::Relaxed);
        Ok(live_of(&st.reverse_map(victim)))
    }

    /// The logical block of each data block of a full zone, from its summary; a summary block
    /// that fails its check (torn by a power cut) is rebuilt from the index.
    fn read_summary(&self, zone: ZoneId) -> Result<Vec<Option<Lba>>, EngineError> {
        let l = &self.layout;
        let mut buf = vec![0u8; l.summary_blocks as usize * BLOCK];
        self.dev(
            self.dev
                .read_at(&mut buf, l.zone_offset(zone, l.data_blocks())),
        )?;
        let mut out = Vec::with_capacity(l.data_blocks() as usize);
        let mut rebuilt: Option<Vec<Option<Lba>>> = None;
        for (j, b) in buf.chunks(BLOCK).enumerate() {
            let n = (l.data_blocks() as usize - j * ENTRIES).min(ENTRIES);
            match decode_summary(zone, j as u32, b) {
                Some(e) => out.extend_from_slice(&e[..n]),
                None => {
                    self.stats.summary_rebuilds.fetch_add(1, Ordering::Relaxed);
                    let r = rebuilt.get_or_insert_with(|| self.state.lock().reverse_map(zone));
                    out.extend_from_slice(&r[j * ENTRIES..j * ENTRIES + n]);
                }
            }
        }
        Ok(out)
    }

    /// Copy `live` (sorted) into the GC frontier in batches; returns the `Move` records.
    fn copy_live(&self, victim: ZoneId, live: &[(Lba, u32)]) -> Result<Vec<LogRec>, EngineError> {
        let mut moves = Vec::new();
        let mut i = 0;
        while i < live.len() {
            let batch = &live[i..live.len().min(i + IO_BATCH_BLOCKS as usize)];
            let lbas: Vec<Lba> = batch.iter().map(|&(l, _)| l).collect();
            let (zone, off, k) = self.place(Class::Gc, &lbas)?;
            let batch = &batch[..k as usize];
            let mut buf = vec![0u8; batch.len() * BLOCK];
            self.read_victim(victim, batch, &mut buf)?;
            self.dev(self.dev.write_at(&buf, self.layout.zone_offset(zone, off)))?;
            push_moves(&mut moves, batch, zone, off);
            i += batch.len();
        }
        Ok(moves)
    }

    /// Read the victim's blocks `batch` (runs of consecutive offsets at once) into `buf`.
    fn read_victim(
        &self,
        victim: ZoneId,
        batch: &[(Lba, u32)],
        buf: &mut [u8],
    ) -> Result<(), EngineError> {
        let mut i = 0;
        while i < batch.len() {
            let mut j = i + 1;
            while j < batch.len() && batch[j].1 == batch[j - 1].1 + 1 {
                j += 1;
            }
            let at = self.layout.zone_offset(victim, batch[i].1);
            self.dev(self.dev.read_at(&mut buf[i * BLOCK..j * BLOCK], at))?;
            i = j;
        }
        Ok(())
    }
}

/// `Move` records for `batch` copied to `zone:off..`: one per run of consecutive logical
/// blocks.
fn push_moves(moves: &mut Vec<LogRec>, batch: &[(Lba, u32)], zone: ZoneId, off: u32) {
    let mut i = 0;
    while i < batch.len() {
        let mut j = i + 1;
        while j < batch.len() && batch[j].0 .0 == batch[j - 1].0 .0 + 1 {
            j += 1;
        }
        moves.push(LogRec::Move {
            lba: batch[i].0,
            n: (j - i) as u32,
            zone,
            off: off + i as u32,
        });
        i = j;
    }
}
