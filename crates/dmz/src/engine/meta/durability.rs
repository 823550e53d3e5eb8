//! Durability, in one place: writing the log (group commit), the one device flush every
//! path uses ([`dev_flush`]: a failed flush stops the engine, wherever it happens), flush and
//! FUA with the evidence rule and the promotion of freed zones, and the two-phase commit
//! into the v2 sets with its thread. The ordering rules are in docs/design.md, "Commit and
//! crash ordering".

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::MutexGuard;
use tracing::{debug, warn};

use crate::sets;

use super::super::ids::{ZoneId, BLOCK, IO_BATCH_BLOCKS};
use super::super::{EngineError, Inner, State};
use super::cache::SnapBlock;
use super::log::PAYLOAD;
use super::record::{Ctx, Rec};

/// Overwrites in place into conventional zones whose validating records were not flushed
/// when the overwrite checked them ([`Proof::Unflushed`](super::Proof)), from that check
/// until the overwrite's own record (or its absence) is in the log; and every write plan in
/// flight, whatever it found (another plan of the zone may append a record meanwhile:
/// design.md, "Hop-free writes"). A flush that covers
/// those records while one is in flight would leave them flushed but unproven under data
/// their CRCs no longer match, so [`flush`] proves them before it returns (design.md, "Why
/// proven must be durable before overwrites"). Kept in `State`, under its lock.
#[derive(Default)]
pub(in crate::engine) struct InPlaceWrites {
    in_flight: u32,
    /// Every overwrite that ever began: a flush sees one that began during it.
    began: u64,
}

/// What [`InPlaceWrites`] looked like when a flush began.
#[derive(Clone, Copy)]
pub(in crate::engine) struct InPlaceMark {
    in_flight: u32,
    began: u64,
}

impl InPlaceWrites {
    pub(in crate::engine) fn begin(&mut self) {
        self.in_flight += 1;
        self.began += 1;
    }

    pub(in crate::engine) fn end(&mut self) {
        self.in_flight -= 1;
    }

    fn mark(&self) -> InPlaceMark {
        InPlaceMark {
            in_flight: self.in_flight,
            began: self.began,
        }
    }

    /// Whether an overwrite was in flight at `m` or began since.
    fn overlapped(&self, m: InPlaceMark) -> bool {
        m.in_flight > 0 || self.began != m.began
    }
}

/// Log block images to write: (block number on the device, image).
type Pending = Vec<(u64, Box<[u8; BLOCK]>)>;

/// What a log write up to a record found, under `log_write`.
enum Take {
    /// Written already: (records written below, flushed_seq in the last block).
    Written(u64, u64),
    /// These blocks to write; then `next` is written, their last header says `hdr`.
    Blocks {
        pending: Pending,
        next: u64,
        hdr: u64,
    },
}

/// Under `log_write`: the blocks a log write up to record `upto` must write (sealing the
/// current block when `seal`, even an empty one when `force`), or that it is out already.
fn take_log(inner: &Inner, upto: u64, seal: bool, force: bool) -> Result<Take, EngineError> {
    // A log write that failed under this lock dropped the records it had taken, ours
    // possibly among them: never report them written.
    inner.check_failed()?;
    let mut st = inner.state.lock();
    if !seal && st.meta.log.written_seq >= upto {
        return Ok(Take::Written(
            st.meta.log.written_seq,
            st.meta.log.written_header_flushed,
        ));
    }
    if seal {
        st.meta.log.seal(force);
    }
    Ok(Take::Blocks {
        pending: st.meta.log.take_pending(),
        next: st.meta.log.next_seq,
        hdr: st.meta.log.flushed_seq,
    })
}

/// Under `log_write`, once the blocks [`take_log`] gave are on the device.
fn log_written(inner: &Inner, blocks: usize, next: u64, hdr: u64) -> (u64, u64) {
    let mut st = inner.state.lock();
    st.meta.log.written_seq = st.meta.log.written_seq.max(next);
    if blocks > 0 {
        st.meta.log.written_header_flushed = hdr;
        st.meta.log.blocks_written += blocks as u64;
    }
    (st.meta.log.written_seq, st.meta.log.written_header_flushed)
}

/// Write every record appended so far (sealing the current block when `seal`, even an
/// empty one when `force`). Returns (records written below, flushed_seq in the last block).
pub(in crate::engine) fn log_sync(
    inner: &Inner,
    upto: u64,
    seal: bool,
    force: bool,
) -> Result<(u64, u64), EngineError> {
    let _w = inner.log_write.lock();
    match take_log(inner, upto, seal, force)? {
        Take::Written(written, hdr) => Ok((written, hdr)),
        Take::Blocks { pending, next, hdr } => {
            write_blocks(inner, &pending)?;
            Ok(log_written(inner, pending.len(), next, hdr))
        }
    }
}

/// What [`Engine::plan_sync`](crate::engine::Engine::plan_sync) found.
#[derive(Debug)]
pub enum SyncPlan {
    /// The write's records are in the log already.
    Done,
    /// Another thread is writing the log: [`Engine::sync`](crate::engine::Engine::sync)
    /// waits for it.
    Busy,
    /// Write these log blocks, then [`LogWrite::complete`].
    Write(LogWrite),
}

/// A log write its caller puts on the device itself (a ublk queue thread, on its own
/// ring): the blocks [`log_sync`] would write, taken under `log_write`, which the plan
/// holds until it is completed or failed. Meanwhile the caller's thread must take nothing
/// that takes `log_write` (a flush, a sync, a write's record when the log half is full
/// commits): it would wait for itself. Not `Send` (it holds the lock): completed on the
/// thread that planned it. Dropped unfinished it fails the engine, as a failed log write
/// does: the records it took are no longer pending.
pub struct LogWrite {
    pending: Pending,
    next: u64,
    hdr: u64,
    finished: bool,
    inner: Arc<Inner>,
    _w: parking_lot::ArcMutexGuard<parking_lot::RawMutex, ()>,
}

impl LogWrite {
    /// The blocks [`take_log`] gave, to be written by the caller under `w` (`log_write`).
    fn new(
        inner: &Arc<Inner>,
        w: parking_lot::ArcMutexGuard<parking_lot::RawMutex, ()>,
        pending: Pending,
        next: u64,
        hdr: u64,
    ) -> LogWrite {
        LogWrite {
            pending,
            next,
            hdr,
            finished: false,
            inner: inner.clone(),
            _w: w,
        }
    }

    /// The blocks to write: (byte offset on the device, without a
    /// [`zbd::ReadSource`]'s `base`; 4096 bytes), in any order, all before `complete`.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        self.pending
            .iter()
            .map(|(b, img)| (b * BLOCK as u64, &img[..]))
    }

    /// Every block is on the device: the records are written (they survive a daemon
    /// crash), and `log_write` is released.
    pub fn complete(mut self) {
        let bytes = (self.pending.len() * BLOCK) as u64;
        self.inner
            .stats
            .dev_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        log_written(&self.inner, self.pending.len(), self.next, self.hdr);
        self.finished = true;
    }

    /// A block's write failed: the engine stops (further writes fail with EIO), as when
    /// its own log write fails. Returns the error to report.
    pub fn fail(mut self, err: std::io::Error) -> EngineError {
        self.finished = true;
        let e = EngineError::Meta(format!("log write: {err}"));
        self.inner.fail(&e);
        e
    }

    /// Test hook: write the blocks through the engine's device (what a caller's ring does
    /// through the device's file).
    #[doc(hidden)]
    pub fn write_for_test(&self) -> Result<(), EngineError> {
        for (off, data) in self.blocks() {
            self.inner.dev_write(data, off)?;
        }
        Ok(())
    }
}

impl Drop for LogWrite {
    fn drop(&mut self) {
        if !self.finished {
            self.inner
                .fail(&EngineError::Meta("a log write was abandoned".into()));
        }
    }
}

impl std::fmt::Debug for LogWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWrite")
            .field("blocks", &self.pending.len())
            .field("next", &self.next)
            .finish()
    }
}

/// See [`Engine::plan_sync`](crate::engine::Engine::plan_sync).
pub(in crate::engine) fn plan_sync(inner: &Arc<Inner>, upto: u64) -> Result<SyncPlan, EngineError> {
    if upto == 0 {
        return Ok(SyncPlan::Done);
    }
    let Some(w) = inner.log_write.try_lock_arc() else {
        return Ok(SyncPlan::Busy);
    };
    match take_log(inner, upto, false, false)? {
        Take::Written(..) => Ok(SyncPlan::Done),
        Take::Blocks { pending, next, hdr } if pending.is_empty() => {
            log_written(inner, 0, next, hdr);
            Ok(SyncPlan::Done)
        }
        Take::Blocks { pending, next, hdr } if !source_reaches(inner, &pending) => {
            // Not through the caller's file (dm-zoned's layouts keep the metadata on the
            // cache device, which a partial source covers: not expected): written here.
            write_blocks(inner, &pending)?;
            log_written(inner, pending.len(), next, hdr);
            Ok(SyncPlan::Done)
        }
        Take::Blocks { pending, next, hdr } => {
            Ok(SyncPlan::Write(LogWrite::new(inner, w, pending, next, hdr)))
        }
    }
}

/// Whether the caller's [`zbd::ReadSource`] reaches every block of `pending`.
fn source_reaches(inner: &Inner, pending: &Pending) -> bool {
    let b = BLOCK as u64;
    inner
        .dev
        .read_source()
        .is_none_or(|s| pending.iter().all(|(blk, _)| s.covers(blk * b, b)))
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
        inner
            .stats
            .dev_bytes
            .fetch_add(((j - i) * BLOCK) as u64, Ordering::Relaxed);
        i = j;
    }
    Ok(())
}

/// Flush: write out the log (sealing its block: a block a flush covered is never written
/// again), flush the device, then let zones freed by now-durable records be reused.
/// `evidence` forces a block carrying the latest flushed sequence number (see design.md).
/// Runs [`FlushState`]'s steps on this thread; [`FlushPlan`] runs the same steps for a
/// caller that does the device I/O on its own ring.
pub(in crate::engine) fn flush(inner: &Inner, evidence: bool) -> Result<(), EngineError> {
    let (mut f, mut next) = FlushState::begin(inner, evidence);
    loop {
        next = match next {
            Next::Log { force } => {
                let (written, hdr) = log_sync(inner, u64::MAX, true, force)?;
                f.logged(inner, written, hdr)
            }
            Next::Device => {
                dev_flush(inner)?;
                f.device_flushed(inner)
            }
            Next::Commit => return commit(inner),
            Next::Done => return Ok(()),
        }
    }
}

/// What a flush does next ([`FlushState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Write out the log, sealing its block (`force`: even an empty one, to carry the
    /// latest flushed sequence number: a proof block).
    Log {
        force: bool,
    },
    /// Flush the device ([`dev_flush`]).
    Device,
    /// Fold the log instead ([`commit`]): no room left in this half for a proof block.
    Commit,
    Done,
}

/// One flush between its device operations: the rules of [`flush`], in one place for
/// both of its drivers ([`flush`] itself and [`FlushPlan`]).
struct FlushState {
    /// Taken before the log is written: an overwrite that ended before it has its record
    /// in this flush.
    mark: InPlaceMark,
    /// Zones freed by records this flush writes: reusable once it is done.
    cands: Vec<(ZoneId, u64)>,
    /// The log write of the proof round is out (the second device flush is its last step).
    proving: bool,
    /// Records below this are in the log (raised into flushed_seq by the device flush).
    written: u64,
    /// The flushed_seq in the header of the last log block written.
    hdr: u64,
}

impl FlushState {
    fn begin(inner: &Inner, evidence: bool) -> (FlushState, Next) {
        let st = inner.state.lock();
        let f = FlushState {
            mark: st.in_place.mark(),
            cands: Vec::new(),
            proving: false,
            written: 0,
            hdr: 0,
        };
        if evidence && !st.meta.log.has_room(PAYLOAD) {
            // No room left for a proof block in this half: fold the log instead.
            return (f, Next::Commit);
        }
        if evidence {
            inner.stats.proof_flushes.fetch_add(1, Ordering::Relaxed);
        }
        (f, Next::Log { force: evidence })
    }

    /// The log is written: records below `written`, the last block's header says `hdr`.
    fn logged(&mut self, inner: &Inner, written: u64, hdr: u64) -> Next {
        self.hdr = hdr;
        if !self.proving {
            self.written = written;
            self.cands = inner.state.lock().meta.zones.flushable_frees(written);
        }
        Next::Device
    }

    /// The device flush after [`FlushState::logged`] is done.
    fn device_flushed(&mut self, inner: &Inner) -> Next {
        let mut st = inner.state.lock();
        if self.proving {
            st.meta.log.evidence_seq = st.meta.log.evidence_seq.max(self.hdr);
            return self.promote(inner, st);
        }
        st.meta.log.flushed_seq = st.meta.log.flushed_seq.max(self.written);
        st.meta.log.evidence_seq = st.meta.log.evidence_seq.max(self.hdr);
        let floor = st.meta.log.evidence_seq.max(st.meta.log.folded_seq);
        // An overwrite in flight may have its data durable (by this flush, or by a later
        // destage) while its record is not: the records it overwrote must not depend on
        // their CRCs.
        let need_proof = (st.in_place.overlapped(self.mark) && floor < st.meta.log.flushed_seq)
            || self
                .cands
                .iter()
                .any(|&(z, _)| st.meta.zones.get(z).last_seq >= floor.max(1));
        if !need_proof {
            return self.promote(inner, st);
        }
        if !st.meta.log.has_room(PAYLOAD) {
            // The commit promotes the zones itself once their records are folded.
            return Next::Commit;
        }
        // A freed zone gets overwritten once reused, and an overwrite in flight may have
        // landed: replay must then trust (not check) the records that validated the old
        // contents, so make a block proving their flush durable first.
        inner.stats.proof_flushes.fetch_add(1, Ordering::Relaxed);
        self.proving = true;
        Next::Log { force: true }
    }

    fn promote(&self, inner: &Inner, mut st: MutexGuard<'_, State>) -> Next {
        if st.meta.zones.promote(&self.cands) > 0 {
            inner.free_cv.notify_all();
        }
        Next::Done
    }
}

/// A flush whose caller does the device I/O itself, on its own ring (a ublk queue
/// thread): the steps of [`flush`], handed out one at a time. Its caller's thread must
/// hold no other [`LogWrite`] meanwhile (it would wait for itself).
pub struct FlushPlan {
    inner: Arc<Inner>,
    state: FlushState,
    next: Next,
    /// A [`LogWrite`] was handed out: its result is in the log state by the next step.
    awaiting_log: bool,
}

/// What to do for a [`FlushPlan`] next.
#[derive(Debug)]
pub enum FlushStep {
    /// Write these blocks, complete (or fail) the log write, then ask again.
    Log(LogWrite),
    /// Flush the device (`fdatasync` of its [`zbd::ReadSource`]'s fd), then
    /// [`FlushPlan::device_flushed`], then ask again.
    Device,
    /// The flush is done: every write completed before it began is durable.
    Done,
}

impl FlushPlan {
    pub(in crate::engine) fn new(inner: &Arc<Inner>) -> FlushPlan {
        let (state, next) = FlushState::begin(inner, false);
        FlushPlan {
            inner: inner.clone(),
            state,
            next,
            awaiting_log: false,
        }
    }

    /// The next step. A log write another thread holds, or a commit (the log half full),
    /// is waited for here, on the caller's thread, as [`flush`] would.
    pub fn step(&mut self) -> Result<FlushStep, EngineError> {
        let inner = &*self.inner;
        if std::mem::take(&mut self.awaiting_log) {
            // A failed log write failed the engine; a completed one raised written_seq
            // past every record this flush took (and anything a later write completed).
            inner.check_failed()?;
            let (written, hdr) = {
                let st = inner.state.lock();
                (st.meta.log.written_seq, st.meta.log.written_header_flushed)
            };
            self.next = self.state.logged(inner, written, hdr);
        }
        loop {
            self.next = match self.next {
                Next::Log { force } => match take_log_write(&self.inner, force)? {
                    Some(w) => {
                        self.awaiting_log = true;
                        return Ok(FlushStep::Log(w));
                    }
                    None => {
                        let (written, hdr) = log_sync(inner, u64::MAX, true, force)?;
                        self.state.logged(inner, written, hdr)
                    }
                },
                Next::Device => return Ok(FlushStep::Device),
                Next::Commit => {
                    commit(inner)?;
                    Next::Done
                }
                Next::Done => return Ok(FlushStep::Done),
            };
        }
    }

    /// The device flush of [`FlushStep::Device`] ended with `result`. A failed one stops
    /// the engine, as [`dev_flush`] does.
    pub fn device_flushed(&mut self, result: std::io::Result<()>) -> Result<(), EngineError> {
        let inner = &*self.inner;
        let result = result.map_err(|source| zbd::ZbdError::Io {
            what: "flush on the caller's ring".into(),
            source,
        });
        flush_failed(inner, result)?;
        self.next = self.state.device_flushed(inner);
        Ok(())
    }
}

impl FlushPlan {
    /// Test hook: flush the device through the engine's own device (what a caller's ring
    /// does with an `fdatasync`), then [`FlushPlan::device_flushed`].
    #[doc(hidden)]
    pub fn flush_device_for_test(&mut self) -> Result<(), EngineError> {
        let r = self.inner.dev.flush().map_err(std::io::Error::other);
        self.device_flushed(r)
    }
}

impl std::fmt::Debug for FlushPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlushPlan")
            .field("next", &self.next)
            .finish()
    }
}

/// The sealed log as a [`LogWrite`] for a ring, if `log_write` is free now.
fn take_log_write(inner: &Arc<Inner>, force: bool) -> Result<Option<LogWrite>, EngineError> {
    let Some(w) = inner.log_write.try_lock_arc() else {
        return Ok(None);
    };
    Ok(match take_log(inner, u64::MAX, true, force)? {
        Take::Blocks { pending, next, hdr } => Some(LogWrite::new(inner, w, pending, next, hdr)),
        Take::Written(..) => unreachable!("a sealing take always gives blocks"),
    })
}

/// Flush the device: every write completed before it is durable after it. The one place
/// the engine flushes its backend. A failed flush stops the engine, whoever asked for it (a
/// user flush, a write emptying a zone, reclaim before its record, a commit): the device
/// may have dropped any write it covered, and a later flush succeeding would not bring them
/// back (as Linux treats a failed fsync).
pub(in crate::engine) fn dev_flush(inner: &Inner) -> Result<(), EngineError> {
    flush_failed(inner, inner.dev.flush())
}

/// The commit's ordering flushes between set writes: only the device holding the metadata
/// (member 0: the cache device of a multi-device volume, else the only device). The zoned
/// drives were flushed by the commit's first [`dev_flush`]; flushing them again for writes
/// they do not hold would only drain their caches while streams are writing (a flush per
/// drive per step, measured in the VM: 36 drive flushes in 85 s of streaming).
fn meta_flush(inner: &Inner) -> Result<(), EngineError> {
    flush_failed(inner, inner.dev.flush_member(0))
}

/// One error policy for every flush: a failed flush stops the engine (see design.md).
fn flush_failed(inner: &Inner, r: zbd::Result<()>) -> Result<(), EngineError> {
    r.map_err(|e| {
        let err = EngineError::Device(e);
        inner.fail(&EngineError::Meta(format!("device flush: {err}")));
        err
    })
}

/// Fold everything logged so far into the v2 sets (dm-zoned's two-phase commit: set 1
/// first, then set 0, a device flush after each step) and start the next log epoch.
pub(in crate::engine) fn commit(inner: &Inner) -> Result<(), EngineError> {
    inner.check_failed()?;
    let _c = inner.commit_lock.lock();
    let (snap, new_gen, start_seq, cands) = {
        let _w = inner.log_write.lock();
        // Everything of this epoch goes out before the switch, so a later epoch's records
        // can only be durable if this epoch's are. Appends do not take `log_write`, so
        // repeat until nothing is left, then switch under the state lock.
        let mut st = inner.state.lock();
        loop {
            st.meta.log.seal(false);
            let pending = st.meta.log.take_pending();
            if pending.is_empty() {
                break;
            }
            let n = pending.len() as u64;
            MutexGuard::unlocked(&mut st, || write_blocks(inner, &pending))?;
            st.meta.log.blocks_written += n;
        }
        let next = st.meta.log.next_seq;
        st.meta.log.written_seq = next;
        if !st.meta.cache.is_dirty()
            && st.meta.log.epoch_start_seq == next
            && !st.meta.log.needs_switch
        {
            return Ok(());
        }
        let snap = st.meta.cache.snapshot();
        let new_gen = st.meta.log.epoch + 1;
        st.meta.log.switch_epoch(new_gen);
        st.meta.log.needs_switch = false;
        inner.bg.lock().dirty_since = None;
        let cands = st.meta.zones.flushable_frees(next);
        (snap, new_gen, next, cands)
    };
    let res = write_sets(inner, &snap, new_gen);
    if let Err(e) = res {
        inner.fail(&e);
        return Err(e);
    }
    let mut st = inner.state.lock();
    st.meta.cache.commit_done(&snap);
    st.meta.log.folded_seq = start_seq;
    st.meta.log.flushed_seq = st.meta.log.flushed_seq.max(start_seq);
    if st.meta.zones.promote(&cands) > 0 {
        inner.free_cv.notify_all();
    }
    drop(st);
    inner.stats.commits.fetch_add(1, Ordering::Relaxed);
    debug!(gen = new_gen, blocks = snap.len(), "committed");
    Ok(())
}

fn write_sets(inner: &Inner, snap: &[SnapBlock], gen: u64) -> Result<(), EngineError> {
    let dev = &*inner.dev;
    // The data (and log) the snapshot points at must be durable before any set says so.
    dev_flush(inner)?;
    let mut sb = inner.sb.lock().clone();
    sb.gen = gen;
    for set in [1usize, 0] {
        let mut i = 0;
        while i < snap.len() {
            let mut j = i + 1;
            while j < snap.len()
                && snap[j].mblk == snap[j - 1].mblk + 1
                && j - i < IO_BATCH_BLOCKS as usize
            {
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
                .fetch_add(buf.len() as u64, Ordering::Relaxed);
            i = j;
        }
        meta_flush(inner)?;
        sets::write_superblock(dev, &inner.layout, set, &sb)?;
        meta_flush(inner)?;
    }
    *inner.sb.lock() = sb;
    Ok(())
}

/// The commit thread: sleeps on a condvar (no wakeups while clean), commits when the
/// interval since the first change has passed, or when asked (log half filling up).
pub(in crate::engine) fn commit_thread(inner: &Arc<Inner>) {
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
    let want = st.meta.log.used_pct() >= inner.opts.log_commit_pct
        || st.meta.cache.dirty_bitmaps() > inner.opts.cache_bitmap_blocks / 2;
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
    st: &mut MutexGuard<'_, State>,
    recs: &[Rec],
) -> Result<u64, EngineError> {
    let len = encoded_len(recs);
    let mut tries = 0;
    while !st.meta.log.has_room(len) {
        tries += 1;
        if tries > 3 {
            return Err(EngineError::Meta("metadata log full".into()));
        }
        MutexGuard::unlocked(st, || commit(inner))?;
    }
    append_op(inner, st, recs)
}

/// [`log_op`] for a caller that must not wait for a commit (a write plan on a queue
/// thread): `None`, nothing appended, when the log half has no room for the records.
pub(super) fn log_op_if_room(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    recs: &[Rec],
) -> Result<Option<u64>, EngineError> {
    if !st.meta.log.has_room(encoded_len(recs)) {
        return Ok(None);
    }
    append_op(inner, st, recs).map(Some)
}

/// Bytes `recs` take in a log block.
fn encoded_len(recs: &[Rec]) -> usize {
    let mut v = Vec::new();
    for r in recs {
        r.encode(&mut v);
    }
    v.len()
}

/// Apply one operation's records to memory and append them (the caller checked the room).
fn append_op(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    recs: &[Rec],
) -> Result<u64, EngineError> {
    let first = st.meta.log.next_seq;
    for (k, r) in recs.iter().enumerate() {
        if let Err(e) = r.apply(&mut st.meta, &*inner.dev, first + k as u64, Ctx::Live) {
            inner.fail(&e);
            return Err(e);
        }
    }
    let last = st.meta.log.append(recs);
    note_dirty(inner, st);
    Ok(last)
}
