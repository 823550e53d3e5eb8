//! Durability: appending records (checkpointing first when the log half is full), the log
//! writer with group commit, flush, and the checkpoint. Ordering rules: docs/design.md, "Log
//! layout".

use std::sync::atomic::Ordering;

use crate::engine::ids::BLOCK;
use crate::engine::meta::log::PAYLOAD;

use super::layout::{conv_write, encode_dir, encode_sb, Checkpoint};
use super::meta::{Ctx, Meta};
use super::record::LogRec;
use super::{EngineError, LogEngine};

impl LogEngine {
    /// Apply one record and append it (the caller holds `wlock`; records stay in the log
    /// until the next checkpoint). Checkpoints first when the log half is full. Returns the
    /// record's sequence number.
    pub(super) fn log_op(&self, rec: LogRec) -> Result<u64, EngineError> {
        self.log_ops(std::slice::from_ref(&rec))
    }

    /// [`LogEngine::log_op`] for records that go to the log together, in one log block (a
    /// write group's: at most [`PAYLOAD`] bytes in all). Returns the last one's sequence
    /// number.
    pub(super) fn log_ops(&self, recs: &[LogRec]) -> Result<u64, EngineError> {
        debug_assert!(encoded_len(recs) <= PAYLOAD);
        for _ in 0..3 {
            if let Some(seq) = self.append_now(&mut self.state.lock(), recs)? {
                return Ok(seq);
            }
            self.make_room(recs)?;
        }
        Err(self.fail(EngineError::Meta(
            "metadata log: no room after a checkpoint".into(),
        )))
    }

    /// Whether `recs` can be appended without a checkpoint or write-back first: the log half
    /// has room for them and is not `checkpoint_pct` full, and less than half the index
    /// cache is dirty.
    pub(super) fn can_append(&self, st: &Meta, recs: &[LogRec]) -> bool {
        self.log_has_room(st, recs) && !st.index.needs_writeback()
    }

    fn log_has_room(&self, st: &Meta, recs: &[LogRec]) -> bool {
        st.log.has_room(encoded_len(recs)) && st.log.used_pct() < self.opts.checkpoint_pct
    }

    /// What [`LogEngine::can_append`] lacks: a checkpoint when the log half is (nearly)
    /// full, else a write-back of the dirty index pages. The caller holds `wlock`.
    fn make_room(&self, recs: &[LogRec]) -> Result<(), EngineError> {
        if self.log_has_room(&self.state.lock(), recs) {
            self.writeback()
        } else {
            self.checkpoint()
        }
    }

    /// Apply `recs` in order and append them if [`LogEngine::can_append`]: the last one's
    /// sequence number. A page a record needs that cannot be read stops the engine (the
    /// records may be applied in part).
    pub(super) fn append_now(
        &self,
        st: &mut Meta,
        recs: &[LogRec],
    ) -> Result<Option<u64>, EngineError> {
        if !self.can_append(st, recs) {
            return Ok(None);
        }
        for (i, rec) in recs.iter().enumerate() {
            let seq = st.log.next_seq + i as u64;
            st.apply(rec, seq, Ctx::Live, &vec![true; rec_blocks(rec)])
                .map_err(|e| self.fail(e))?;
        }
        self.nudge(st);
        Ok(Some(st.log.append(recs)))
    }

    /// Write every record appended so far up to `upto` (all of them when `seal`, which also
    /// closes the current block: a block a flush covered is never written again). One writer
    /// at a time; a caller whose records another writer wrote returns at once (group
    /// commit). Returns the sequence number below which every record is written.
    pub(super) fn log_sync(&self, upto: u64, seal: bool) -> Result<u64, EngineError> {
        let _lw = self.log_write.lock();
        self.check_failed()?;
        let (pending, next, hdr) = {
            let mut st = self.state.lock();
            if !seal && st.log.written_seq >= upto {
                return Ok(st.log.written_seq);
            }
            if seal {
                st.log.seal(false);
            }
            (st.log.take_pending(), st.log.next_seq, st.log.flushed_seq)
        };
        for (blk, img) in &pending {
            self.dev(conv_write(&*self.dev, &self.layout, *blk, &img[..]))?;
        }
        let mut st = self.state.lock();
        st.log.written_seq = st.log.written_seq.max(next);
        if !pending.is_empty() {
            st.log.written_header_flushed = hdr;
            self.stats
                .log_blocks
                .fetch_add(pending.len() as u64, Ordering::Relaxed);
        }
        Ok(st.log.written_seq)
    }

    /// Flush: write the log (sealing its block), then one device flush; every write
    /// acknowledged before is durable after.
    pub fn flush(&self) -> Result<(), EngineError> {
        self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        self.sync_all()
    }

    /// [`LogEngine::flush`] without the count: the log written, the device flushed, and the
    /// records below that point marked flushed (the next log block proves them).
    pub(super) fn sync_all(&self) -> Result<(), EngineError> {
        let written = self.log_sync(u64::MAX, true)?;
        self.dev_flush()?;
        let mut st = self.state.lock();
        st.log.flushed_seq = st.log.flushed_seq.max(written);
        Ok(())
    }

    /// The one device flush; a failure stops the engine.
    pub(super) fn dev_flush(&self) -> Result<(), EngineError> {
        self.stats.dev_flushes.fetch_add(1, Ordering::Relaxed);
        self.dev(self.dev.flush())
    }

    /// Write the dirty index pages back to their slots, between checkpoints, so that the
    /// cache can evict them. The caller holds `wlock` (no record is appended meanwhile).
    /// The log is written and the device flushed first: a page may name only records that
    /// are durable with their data (a power cut must not keep a page and drop what it maps).
    /// The directory and zone table on the device stay the checkpoint's: a replay after a
    /// crash skips, for these pages, the records they fold, and open recounts valid blocks.
    pub(super) fn writeback(&self) -> Result<(), EngineError> {
        self.sync_all()?;
        let n = self.write_dirty_pages()?;
        self.stats
            .pages_written_back
            .fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Write every dirty index page to its slot, folded to the log's next sequence number,
    /// in batches of [`PAGE_BATCH`]; returns how many. The caller holds `wlock`.
    fn write_dirty_pages(&self) -> Result<u64, EngineError> {
        let l = &self.layout;
        let mut n = 0;
        loop {
            let pages = {
                let mut st = self.state.lock();
                let s = st.log.next_seq;
                st.index.take_dirty(s, PAGE_BATCH)
            };
            if pages.is_empty() {
                return Ok(n);
            }
            for (p, img) in &pages {
                self.dev(conv_write(
                    &*self.dev,
                    l,
                    l.page_start() + p.0 as u64,
                    &img[..],
                ))?;
            }
            // Their slots hold them now: evictable.
            self.state.lock().index.written();
            n += pages.len() as u64;
        }
    }

    /// Fold the log into the index pages, directory and zone table, and start the next
    /// generation's log half. The caller holds `wlock` (no record is appended meanwhile).
    ///
    /// 1. Write the log and flush: every record below S is durable with its data, so no page
    ///    written next can name data a power cut would take back.
    /// 2. Write the dirty pages (folded to S) in place, the directory and zone table copy
    ///    `g' % 2`; flush.
    /// 3. Write superblock slot `g' % 2`; flush. Only now does epoch g' log into its half.
    pub(super) fn checkpoint(&self) -> Result<(), EngineError> {
        self.sync_all()?;
        let pages = self.write_dirty_pages()?;
        let l = &self.layout;
        let (gen, sb) = {
            let st = self.state.lock();
            let gen = st.gen + 1;
            let c = Checkpoint {
                gen,
                ckpt_seq: st.log.next_seq,
                clock: st.clock,
            };
            (gen, encode_sb(l, &c))
        };
        let copy = (gen % 2) as usize;
        // The directory in batches too (4 KiB for 4 GiB of volume), then the zone table.
        for j0 in (0..l.dir_blocks).step_by(PAGE_BATCH) {
            let dir: Vec<_> = {
                let st = self.state.lock();
                (j0..(j0 + PAGE_BATCH as u32).min(l.dir_blocks))
                    .map(|j| encode_dir(j, gen, &st.index.dir_entries(j)))
                    .collect()
            };
            self.write_blocks(l.dir_start(copy) + j0 as u64, &dir)?;
        }
        let zt = self.state.lock().zones.encode_table(l, gen);
        self.write_blocks(l.zt_start(copy), &zt)?;
        self.dev_flush()?;
        self.dev(conv_write(&*self.dev, l, gen % 2, &sb[..]))?;
        self.dev_flush()?;
        let mut st = self.state.lock();
        st.gen = gen;
        st.log.switch_epoch(gen);
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(gen, pages, "log layout checkpoint");
        Ok(())
    }

    /// Write block images at conventional blocks `start..`.
    fn write_blocks(&self, start: u64, blocks: &[Box<[u8; BLOCK]>]) -> Result<(), EngineError> {
        let mut buf = Vec::with_capacity(blocks.len() * BLOCK);
        for b in blocks {
            buf.extend_from_slice(&b[..]);
        }
        self.dev(conv_write(&*self.dev, &self.layout, start, &buf))
    }
}

/// Index pages (and directory blocks) written per batch: their images take 1 MiB.
pub(super) const PAGE_BATCH: usize = 256;

/// Blocks an `Append` covers (the `landed` flags apply needs), 0 for other records.
/// Bytes `recs` take in a log block.
pub(super) fn encoded_len(recs: &[LogRec]) -> usize {
    recs.iter().map(LogRec::encoded_len).sum()
}

fn rec_blocks(rec: &LogRec) -> usize {
    match rec {
        LogRec::Append { crcs, .. } => crcs.len(),
        _ => 0,
    }
}
