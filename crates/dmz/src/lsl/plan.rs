//! Planned reads and writes (docs/design.md, "Log layout", "Planned reads" and "Planned
//! writes"): what the frontend's hop-free paths ask of a target (`frontend::BlockTarget::
//! plan_read`, `plan_write`, `plan_sync`).
//!
//! A planned read is the index's runs of the request (`reset` taken with `try_read`, then
//! `state`), and the read side of `LogEngine::reset`, which its guard holds until the caller's
//! device reads are done:
//! no zone is reset (GC, a frontier reopening a freed zone) under them. A GC that wants to
//! reset waits for those reads, holding `wlock`; new planned reads then get no plan
//! (`try_read` fails while a writer waits) and go through the pool.
//!
//! A planned write is a write placed without
//! blocking, its data written by the caller on its own ring through the device's read source
//! (`zbd::ReadSource::seq_writes`), then recorded; and the log write that makes it durable,
//! also made by the caller. What the frontend's hop-free write path asks of a target
//! (`frontend::BlockTarget::plan_write`, `plan_sync`).
//!
//! A plan is had only when nothing must wait: a free turn whose frontier has room for the whole
//! write (no seal, no zone to open), no planned write in flight over the same blocks. Its
//! completion appends the record and pays what the write owes GC; a caller that must not wait
//! ([`LogWritePlan::try_complete`]) gets the plan back when that would take `wlock` from a GC step
//! or a checkpoint, copy GC batches, or make a checkpoint. Its guard holds the turn until the
//! record is appended, as a write through the engine does (so the zone's writes reach the device in
//! write-pointer order, and every block placed in it is logged before it can be sealed); and it
//! keeps its blocks in `LogEngine::planned` until then, where a write or discard through the engine
//! over any of them waits (`wait_planned`), so that the older write never logs last. Placing needs
//! only the turn and `state`: no `wlock`, which a GC or a checkpoint may hold long.
//!
//! With `LogOptions::stream_pipelines`, a plan that continues a stream (its first write
//! begins right after the last block placed at a user frontier) may be placed there behind
//! plans of the same thread still in flight: a [`Pipeline`] holds the turn for all of them.
//! The thread submits their data in the order placed, and the kernel keeps a zone's writes
//! in the order submitted (zone write plugging), so they reach the zone in write-pointer
//! order.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::ThreadId;

use parking_lot::{ArcMutexGuard, ArcRwLockReadGuard, Mutex, RawMutex, RawRwLock};

use crate::engine::ids::{Lba, ZoneId, BLOCK, IO_BATCH_BLOCKS};
use crate::engine::meta::log::PAYLOAD;
use crate::engine::ReadSegment;

use super::layout::Pba;
use super::meta::Meta;
use super::record::LogRec;
use super::zones::{Frontier, Slot, ZoneState};
use super::{EngineError, LogEngine};

/// Writes placed one after the other at a user frontier (one write, or a write group: the
/// writes a queue thread gathered, written with one device write), their data still to be
/// written by the caller at [`LogWritePlan::device_offset`], in the order of
/// [`LogWritePlan::placed`]. Dropped without [`LogWritePlan::complete`] (not written, or the
/// data write failed), it records nothing, and its frontier gets its room back once the
/// plan's [`Pipeline`] ends with no plan after it recorded. If the failed write moved the
/// zone's write pointer all the same, the next write there fails at the device and stops
/// the engine: never a silent misplacement.
pub struct LogWritePlan {
    /// The turn it holds, with the plans placed before it still in flight (and the engine).
    pipe: Arc<Pipeline>,
    off: u32,
    /// The writes placed, in device order from `off`.
    members: Vec<Member>,
    /// Set by [`LogWritePlan::write_for_test`]: the device already knows of the data.
    through_device: bool,
    done: bool,
}

/// The planned writes in flight (`LogEngine::planned`): their logical blocks, and each user
/// frontier's pipeline, if one may still be in flight there.
pub(super) struct Planned {
    /// The logical blocks (first, count) of each planned write in flight.
    ranges: Vec<(u32, u32)>,
    /// By user slot.
    pipelines: Vec<Weak<Pipeline>>,
}

impl Planned {
    pub(super) fn new(user_frontiers: usize) -> Planned {
        Planned {
            ranges: Vec::new(),
            pipelines: (0..user_frontiers).map(|_| Weak::new()).collect(),
        }
    }
}

/// The plans of one thread in flight at one user frontier, placed one after the other: they
/// hold its turn together, and the last one gone releases it. Only the thread that placed
/// the first plan adds to it (its ring submits the data in the order placed), and only a
/// write that continues the stream placed last ([`LogEngine::plan_writes`]).
///
/// Its plans may complete in any order. The device learns of the zone's writes in order
/// ([`Pipeline::report_written`]): a plan's write that succeeded at a sequential zone's
/// write pointer means that every write placed before it in the zone succeeded too. A plan
/// dropped unrecorded leaves a hole; the pipeline takes no plan after that, and when it
/// ends, the frontier's write pointer goes back to the hole unless a plan past it was
/// recorded (only possible where the zone is conventional: the hole then stays, unmapped).
pub(super) struct Pipeline {
    engine: Arc<LogEngine>,
    slot: Slot,
    zone: ZoneId,
    owner: ThreadId,
    ends: Mutex<PipeEnds>,
    _turn: ArcMutexGuard<RawMutex, ()>,
}

/// Where a [`Pipeline`]'s plans stand, as blocks of its zone.
struct PipeEnds {
    /// The device has been told of the zone's writes below this (`source_written`).
    reported: u32,
    /// The end of the furthest plan recorded.
    recorded: u32,
    /// The start of the first plan dropped unrecorded.
    hole: Option<u32>,
}

/// One write of a [`LogWritePlan`]: its index among the writes asked for, and its logical
/// blocks.
#[derive(Debug, Clone, Copy)]
struct Member {
    idx: usize,
    first: u32,
    n: u32,
}

/// A read planned without blocking ([`LogEngine::plan_read`]): its segments, in request
/// order, for the caller to read from the device's read source (`zbd::ReadSource`, its
/// `base` included in the offsets) or fill with zeros; and the read side of the engine's
/// `reset`, held until the plan is completed or dropped, so that no zone the segments name
/// is reset under those reads.
pub struct LogReadPlan {
    engine: Arc<LogEngine>,
    segments: Vec<ReadSegment>,
    _reset: ArcRwLockReadGuard<RawRwLock, ()>,
}

/// What [`LogEngine::plan_sync`] found.
pub enum LogSyncPlan {
    /// The records are written.
    Done,
    /// Another thread writes the log now: call [`LogEngine::sync`], which waits for it.
    Busy,
    /// Write these blocks, then complete.
    Write(LogWrite),
}

/// Log blocks for the caller to write, holding the engine's log writer. Dropped without
/// [`LogWrite::complete`], it stops the engine (the records may be lost).
pub struct LogWrite {
    engine: Arc<LogEngine>,
    pending: Vec<(u64, Box<[u8; BLOCK]>)>,
    next: u64,
    hdr: u64,
    done: bool,
    _w: ArcMutexGuard<RawMutex, ()>,
}

impl LogEngine {
    /// Plan a read of `len` bytes at `offset` without waiting for device I/O, or `None`
    /// when a zone reset is pending or under way, a run lies in an unusable zone, the read
    /// is empty or 4 GiB or more, or the device has no read source: the caller then calls
    /// [`LogEngine::read`]. Takes `state` (held only across memory work, as
    /// [`LogEngine::plan_write`] takes it).
    pub fn plan_read(self: &Arc<Self>, offset: u64, len: u64) -> Option<LogReadPlan> {
        let src = self.dev.read_source()?;
        if len == 0 || len > u32::MAX as u64 {
            return None;
        }
        let (first, n) = self.range(offset, len as usize).ok()?;
        let reset = self.reset.try_read_arc()?;
        let runs = {
            let mut st = self.state.lock();
            // A page not cached: the caller's read (on the pool) reads it.
            let runs = self.cached_runs(&st, first, n)?;
            // Offline or read-only zones: the engine's read reports what the device says.
            let unusable =
                |p: Pba| st.zones.get(self.layout.zone_of(p).0).state == ZoneState::Unusable;
            // Blocks the source does not reach: the engine's read reads them.
            let b = BLOCK as u64;
            if runs.iter().any(|r| {
                r.from.is_some_and(|p| {
                    unusable(p) || !src.covers(p.0 as u64 * b, r.blocks as u64 * b)
                })
            }) {
                return None;
            }
            self.note_read(&mut st, first, n, &runs);
            runs
        };
        let segments = runs
            .into_iter()
            .map(|r| {
                let len = r.blocks * BLOCK as u32;
                match r.from {
                    None => ReadSegment::Zeros { len },
                    Some(p) => ReadSegment::Device {
                        offset: src.base + p.0 as u64 * BLOCK as u64,
                        len,
                    },
                }
            })
            .collect();
        Some(LogReadPlan {
            engine: self.clone(),
            segments,
            _reset: reset,
        })
    }

    /// Plan a write of `data` at `offset` without blocking (see the module comment), or
    /// `None` whenever anything would have to wait: the caller then calls
    /// [`LogEngine::write`].
    pub fn plan_write(self: &Arc<Self>, offset: u64, data: &[u8]) -> Option<LogWritePlan> {
        let plan = self.plan_writes(&[(offset, data.len() as u64)])?;
        debug_assert_eq!(plan.placed().count(), 1);
        Some(plan)
    }

    /// Plan a write group without blocking: of the writes `(offset, len)` asked for, those
    /// that fit one free turn's frontier together (at most [`IO_BATCH_BLOCKS`] blocks in
    /// all), placed one after the other in the order asked, so that the caller writes all
    /// their data with one device write. A write overlapping a planned write in flight, or
    /// another write of the group, is left out (the caller makes it through
    /// [`LogEngine::write`], which waits for the plan). `None`: nothing placed.
    pub fn plan_writes(self: &Arc<Self>, writes: &[(u64, u64)]) -> Option<LogWritePlan> {
        if self.check_failed().is_err() {
            return None;
        }
        let mut planned = self.planned.lock();
        if self.opts.stream_pipelines {
            if let Some(plan) = self.plan_stream(&mut planned, writes) {
                return Some(plan);
            }
        }
        let data_blocks = self.layout.data_blocks();
        for (s, t) in self.turns.iter().enumerate() {
            let Some(turn) = t.try_lock_arc() else {
                continue;
            };
            let mut st = self.state.lock();
            let Some(f) = st.zones.frontier(Slot(s)) else {
                continue;
            };
            let room = (data_blocks - f.wp).min(IO_BATCH_BLOCKS);
            let members = self.pick_members(writes, room, &planned.ranges);
            if members.is_empty() {
                continue;
            }
            let pipe = Pipeline::new(self, Slot(s), f, turn);
            planned.pipelines[s] = Arc::downgrade(&pipe);
            return Some(self.place_planned(f, &mut planned, pipe, members));
        }
        None
    }

    /// A plan continuing a stream: a user frontier whose last block placed comes logically
    /// right before one of `writes`, taken with its turn free or through this thread's
    /// pipeline there (unbroken, and no write through the engine waiting for the turn: a
    /// stream would otherwise hold it for a whole zone); its members the writes that
    /// continue one another from there ([`LogEngine::pick_chain`]).
    fn plan_stream(
        self: &Arc<Self>,
        planned: &mut Planned,
        writes: &[(u64, u64)],
    ) -> Option<LogWritePlan> {
        let ranges: Vec<Option<(u32, u32)>> = writes
            .iter()
            .map(|&(offset, len)| self.range(offset, len as usize).ok())
            .collect();
        let starts = |next: u32| {
            ranges
                .iter()
                .any(|r| r.is_some_and(|(f, n)| f == next && n > 0))
        };
        let nexts: Vec<Option<u32>> = {
            let mut st = self.state.lock();
            (0..self.turns.len())
                .map(|s| stream_next(st.zones.frontier(Slot(s)).as_ref()?))
                .collect()
        };
        let me = std::thread::current().id();
        let data_blocks = self.layout.data_blocks();
        for (s, next) in nexts.into_iter().enumerate() {
            // A write through the engine waits for this turn: let the pipeline end.
            if !next.is_some_and(starts) || self.turn_waiters[s].load(Ordering::Relaxed) > 0 {
                continue;
            }
            let joined = planned.pipelines[s].upgrade();
            let access = match joined {
                Some(p) if p.owner == me && p.ends.lock().hole.is_none() => Ok(p),
                Some(_) => continue,
                None => match self.turns[s].try_lock_arc() {
                    Some(turn) => Err(turn),
                    None => continue,
                },
            };
            let mut st = self.state.lock();
            let Some(f) = st.zones.frontier(Slot(s)) else {
                continue;
            };
            let Some(next) = stream_next(f) else {
                continue;
            };
            let room = (data_blocks - f.wp).min(IO_BATCH_BLOCKS);
            let members = pick_chain(&ranges, next, room, &planned.ranges);
            if members.is_empty() {
                // `state` goes before the pipeline may (its drop takes it).
                drop(st);
                continue;
            }
            let pipe = match access {
                Ok(p) => {
                    self.stats.pipelined.fetch_add(1, Ordering::Relaxed);
                    p
                }
                Err(turn) => {
                    let p = Pipeline::new(self, Slot(s), f, turn);
                    planned.pipelines[s] = Arc::downgrade(&p);
                    p
                }
            };
            return Some(self.place_planned(f, planned, pipe, members));
        }
        None
    }

    /// Place `members` one after the other at `f` (the frontier of `pipe`'s slot): the
    /// summary names their blocks, and they join the planned writes in flight.
    fn place_planned(
        self: &Arc<Self>,
        f: &mut Frontier,
        planned: &mut Planned,
        pipe: Arc<Pipeline>,
        members: Vec<Member>,
    ) -> LogWritePlan {
        let off = f.wp;
        for m in &members {
            for i in 0..m.n {
                f.summary[f.wp as usize] = Some(Lba(m.first + i));
                f.wp += 1;
            }
            planned.ranges.push((m.first, m.n));
        }
        LogWritePlan {
            pipe,
            off,
            members,
            through_device: false,
            done: false,
        }
    }

    /// The writes of a group that fit `room` blocks, in the order asked, none overlapping a
    /// write in `planned` or an earlier one picked.
    fn pick_members(
        &self,
        writes: &[(u64, u64)],
        room: u32,
        planned: &[(u32, u32)],
    ) -> Vec<Member> {
        let mut members: Vec<Member> = Vec::new();
        let (mut total, mut bytes) = (0, 0);
        for (idx, &(offset, len)) in writes.iter().enumerate() {
            let Ok((first, n)) = self.range(offset, len as usize) else {
                continue;
            };
            // Its record: the group's records go to the log in one block.
            let rec_len = LogRec::append_len(n);
            let clash = |&(f, k): &(u32, u32)| overlaps((f, k), (first, n));
            if n == 0
                || total + n > room
                || bytes + rec_len > PAYLOAD
                || planned.iter().any(clash)
                || members.iter().map(|m| (m.first, m.n)).any(|p| clash(&p))
            {
                continue;
            }
            total += n;
            bytes += rec_len;
            members.push(Member { idx, first, n });
        }
        members
    }

    /// Wait until no planned write over blocks `first..first + n` is in flight (a write or
    /// discard through the engine, before it takes a turn or `wlock`).
    pub(super) fn wait_planned(&self, first: u32, n: u32) {
        let mut planned = self.planned.lock();
        let mut counted = false;
        while planned.ranges.iter().any(|&p| overlaps(p, (first, n))) {
            if !counted {
                self.stats.planned_waits.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            self.planned_done.wait(&mut planned);
        }
    }

    /// Make the records below `seq + 1` written (a completed plan's, [`LogWritePlan::complete`]),
    /// blocking: group commit with every other writer, as [`LogEngine::write`] does.
    pub fn sync(&self, seq: u64) -> Result<(), EngineError> {
        self.log_sync(seq + 1, false).map(|_| ())
    }

    /// [`LogEngine::sync`] without blocking: the blocks to write when the log writer is
    /// free, `Busy` when another thread holds it.
    pub fn plan_sync(self: &Arc<Self>, seq: u64) -> Result<LogSyncPlan, EngineError> {
        let Some(w) = self.log_write.try_lock_arc() else {
            return Ok(LogSyncPlan::Busy);
        };
        self.check_failed()?;
        let mut st = self.state.lock();
        if st.log.written_seq > seq {
            return Ok(LogSyncPlan::Done);
        }
        Ok(LogSyncPlan::Write(LogWrite {
            engine: self.clone(),
            pending: st.log.take_pending(),
            next: st.log.next_seq,
            hdr: st.log.flushed_seq,
            done: false,
            _w: w,
        }))
    }
}

/// `try_complete`'s append found no room: unreachable, the room was checked under the same
/// hold of `state`.
fn no_room() -> EngineError {
    EngineError::Meta("metadata log: no room for a planned write's record".into())
}

fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// The logical block after the last one placed at `f`: where a stream written there goes
/// on. `None` before the first block, or when the last block is not known (rebuilt at open).
fn stream_next(f: &Frontier) -> Option<u32> {
    let last = f.wp.checked_sub(1)?;
    f.summary[last as usize].map(|l| l.0 + 1)
}

/// The writes (their block ranges, `None` for one out of range) that continue one another
/// from logical block `next`, in that order, within `room` blocks and one log block of
/// records, none overlapping a write in `planned`.
fn pick_chain(
    ranges: &[Option<(u32, u32)>],
    mut next: u32,
    room: u32,
    planned: &[(u32, u32)],
) -> Vec<Member> {
    let mut members = Vec::new();
    let (mut total, mut bytes) = (0, 0);
    while let Some(idx) = ranges
        .iter()
        .position(|r| r.is_some_and(|(f, n)| f == next && n > 0))
    {
        let Some((first, n)) = ranges[idx] else {
            break;
        };
        let rec_len = LogRec::append_len(n);
        if total + n > room
            || bytes + rec_len > PAYLOAD
            || planned.iter().any(|&p| overlaps(p, (first, n)))
        {
            break;
        }
        total += n;
        bytes += rec_len;
        members.push(Member { idx, first, n });
        next = first + n;
    }
    members
}

impl Pipeline {
    /// A pipeline at `f`, the frontier of `slot`, whose turn is `turn`, owned by this thread.
    fn new(
        engine: &Arc<LogEngine>,
        slot: Slot,
        f: &Frontier,
        turn: ArcMutexGuard<RawMutex, ()>,
    ) -> Arc<Pipeline> {
        Arc::new(Pipeline {
            engine: engine.clone(),
            slot,
            zone: f.zone,
            owner: std::thread::current().id(),
            ends: Mutex::new(PipeEnds {
                reported: f.wp,
                recorded: f.wp,
                hole: None,
            }),
            _turn: turn,
        })
    }

    /// The data of a plan ending at block `end` of the zone was written through the read
    /// source: tell the device of every write of the zone up to there not told yet (a
    /// plan placed before it may complete later, on another thread).
    fn report_written(&self, end: u32) -> Result<(), EngineError> {
        let e = &self.engine;
        let mut ends = self.ends.lock();
        if end > ends.reported {
            let from = ends.reported;
            let len = (end - from) as u64 * BLOCK as u64;
            e.dev(
                e.dev
                    .source_written(e.layout.zone_offset(self.zone, from), len),
            )?;
            ends.reported = end;
        }
        Ok(())
    }
}

impl Drop for Pipeline {
    /// Its last plan is gone: give the frontier back the room from the first hole on, if no
    /// plan past it was recorded. The turn is released after this, with the guard.
    fn drop(&mut self) {
        let ends = self.ends.get_mut();
        let Some(hole) = ends.hole else {
            return;
        };
        if ends.recorded > hole {
            return;
        }
        let mut st = self.engine.state.lock();
        if let Some(f) = st.zones.frontier(self.slot) {
            if f.zone == self.zone && f.wp > hole {
                f.summary[hole as usize..f.wp as usize].fill(None);
                f.wp = hole;
            }
        }
    }
}

impl LogReadPlan {
    pub fn segments(&self) -> &[ReadSegment] {
        &self.segments
    }

    /// The caller read every segment: count the read (as [`LogEngine::read`] does) and let
    /// resets go on. Dropped without this (a read failed: the caller retries with
    /// [`LogEngine::read`], which reports the error), it counts nothing.
    pub fn complete(self) {
        self.engine.stats.reads.fetch_add(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for LogReadPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReadPlan")
            .field("segments", &self.segments)
            .finish()
    }
}

impl LogWritePlan {
    /// Byte offset on the device (of the read source: add its `base`) for the data.
    pub fn device_offset(&self) -> u64 {
        self.pipe
            .engine
            .layout
            .zone_offset(self.pipe.zone, self.off)
    }

    /// The writes placed ([`LogEngine::plan_writes`]), by their index among those asked
    /// for, in the order their data goes from [`LogWritePlan::device_offset`].
    pub fn placed(&self) -> impl Iterator<Item = usize> + '_ {
        self.members.iter().map(|m| m.idx)
    }

    /// Blocks placed, in all.
    fn blocks(&self) -> u32 {
        self.members.iter().map(|m| m.n).sum()
    }

    /// `data` (the whole write, or every write of the group one after the other) is on the
    /// device at [`LogWritePlan::device_offset`], written through the read source: record
    /// it, then pay what the write owes GC (`gc_paced`, as a write through the engine
    /// does). Returns the sequence number of the last record, for [`LogEngine::sync`] or
    /// [`LogEngine::plan_sync`]; the writes may be acknowledged once that succeeded. Waits
    /// for `wlock`, which a GC step or a checkpoint holds across device I/O, and may copy
    /// GC batches itself: for a thread that may wait.
    pub fn complete(self, data: &[u8]) -> Result<u64, EngineError> {
        self.complete_parts(&[data])
    }

    /// [`LogWritePlan::complete`] with the data in parts (each write's buffer, in the
    /// order placed).
    pub fn complete_parts(mut self, parts: &[&[u8]]) -> Result<u64, EngineError> {
        let e = self.pipe.engine.clone();
        let n = self.blocks() as u64;
        let recs = self.records(parts);
        let seq = {
            let _w = e.wlock.lock();
            self.commit(|| e.log_ops(&recs))
        };
        // Its turn is free again while GC is paid, as in `write`.
        drop(self);
        let seq = seq?;
        let mut w = e.wlock.lock();
        e.gc_paced(&mut w, n)?;
        Ok(seq)
    }

    /// [`LogWritePlan::complete`] when it waits for nothing: `wlock` free, no GC owed (the
    /// write would pay it), no checkpoint due (the record would make one, which needs the
    /// log writer), no index page to read. Otherwise the plan back, still holding its turn
    /// and blocks, for a thread that may wait. Never takes the log writer: the device
    /// learns of the data and the records are appended under one hold of `state`, so
    /// nothing (a flush sealing the log block) comes between the check and the append.
    pub fn try_complete(self, data: &[u8]) -> Result<Result<u64, EngineError>, LogWritePlan> {
        self.try_complete_parts(&[data])
    }

    /// [`LogWritePlan::try_complete`] with the data in parts, as
    /// [`LogWritePlan::complete_parts`].
    pub fn try_complete_parts(
        self,
        parts: &[&[u8]],
    ) -> Result<Result<u64, EngineError>, LogWritePlan> {
        let e = self.pipe.engine.clone();
        let recs = self.records(parts);
        let Some(_w) = e.wlock.try_lock() else {
            return Err(self);
        };
        let mut st = e.state.lock();
        if !e.can_append(&st, &recs) || e.gc_owed(&st) || !pages_ready(&st, &recs) {
            return Err(self);
        }
        let mut plan = self;
        let r = plan.commit(|| e.append_now(&mut st, &recs)?.ok_or_else(no_room));
        // The plan's drop takes `state` (to give its room back, if not done).
        drop(st);
        drop(plan);
        Ok(r)
    }

    /// The `Append` record of each write placed, `parts` being the data written, in order.
    fn records(&self, parts: &[&[u8]]) -> Vec<LogRec> {
        let mut crcs = parts
            .iter()
            .flat_map(|p| p.chunks(BLOCK))
            .map(crc32fast::hash);
        debug_assert_eq!(
            parts.iter().map(|p| p.len()).sum::<usize>(),
            self.blocks() as usize * BLOCK
        );
        let mut off = self.off;
        self.members
            .iter()
            .map(|m| {
                let rec = LogRec::Append {
                    lba: Lba(m.first),
                    zone: self.pipe.zone,
                    off,
                    crcs: crcs.by_ref().take(m.n as usize).collect(),
                };
                off += m.n;
                rec
            })
            .collect()
    }

    /// Tell the device of the data (unless written through it), then `append` the records;
    /// counted, and the plan done, once they are appended. The caller holds `wlock`, and
    /// not `state` when it drops the plan.
    fn commit(
        &mut self,
        append: impl FnOnce() -> Result<u64, EngineError>,
    ) -> Result<u64, EngineError> {
        let e = &self.pipe.engine;
        e.check_failed()?;
        let blocks = self.blocks() as u64;
        let end = self.off + self.blocks();
        if !self.through_device {
            self.pipe.report_written(end)?;
        }
        let seq = append()?;
        self.done = true;
        let mut ends = self.pipe.ends.lock();
        ends.recorded = ends.recorded.max(end);
        drop(ends);
        let writes = self.members.len() as u64;
        e.stats.writes.fetch_add(writes, Ordering::Relaxed);
        e.stats.planned.fetch_add(writes, Ordering::Relaxed);
        e.stats.planned_groups.fetch_add(1, Ordering::Relaxed);
        e.stats.user_blocks.fetch_add(blocks, Ordering::Relaxed);
        Ok(seq)
    }

    /// Test hook: write `data` (every write placed, one after the other) with the device's
    /// own write (the caller's ring write, for devices without a read source), before
    /// [`LogWritePlan::complete`].
    #[doc(hidden)]
    pub fn write_for_test(&mut self, data: &[u8]) -> Result<(), EngineError> {
        let e = &self.pipe.engine;
        e.dev(e.dev.write_at(data, self.device_offset()))?;
        self.through_device = true;
        Ok(())
    }
}

impl Drop for LogWritePlan {
    fn drop(&mut self) {
        let e = &self.pipe.engine;
        if !self.done {
            // Its blocks name nothing; its pipeline gives the room back when it ends.
            let r = self.off as usize..(self.off + self.blocks()) as usize;
            let mut st = e.state.lock();
            if let Some(f) = st.zones.frontier(self.pipe.slot) {
                if f.zone == self.pipe.zone {
                    f.summary[r].fill(None);
                }
            }
            drop(st);
            let mut ends = self.pipe.ends.lock();
            ends.hole = Some(ends.hole.map_or(self.off, |h| h.min(self.off)));
        }
        let mut planned = e.planned.lock();
        for m in &self.members {
            if let Some(i) = planned.ranges.iter().position(|&p| p == (m.first, m.n)) {
                planned.ranges.swap_remove(i);
            }
        }
        e.planned_done.notify_all();
        // The pipeline (and with its last plan the turn) goes after this, with `pipe`.
    }
}

impl LogWrite {
    /// (byte offset on the device, 4096-byte block) of each block to write.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let l = &self.engine.layout;
        self.pending
            .iter()
            .map(move |(k, b)| (l.conv_offset(*k), &b[..]))
    }

    /// Every block written (`Ok`), or the error of one that failed: the engine then stops
    /// (the records may be lost) and the error comes back.
    pub fn complete(mut self, result: std::io::Result<()>) -> Result<(), EngineError> {
        self.done = true;
        let e = &self.engine;
        if let Err(err) = result {
            return Err(e.fail(EngineError::Meta(format!(
                "metadata log write on the caller's ring: {err}"
            ))));
        }
        let mut st = e.state.lock();
        st.log.written_seq = st.log.written_seq.max(self.next);
        if !self.pending.is_empty() {
            st.log.written_header_flushed = self.hdr;
            e.stats
                .log_blocks
                .fetch_add(self.pending.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Test hook: write the blocks with the device's own writes, then complete.
    #[doc(hidden)]
    pub fn write_for_test(self) -> Result<(), EngineError> {
        let mut r = Ok(());
        for (k, b) in &self.pending {
            let at = self.engine.layout.conv_offset(*k);
            if let Err(err) = self.engine.dev.write_at(&b[..], at) {
                r = Err(std::io::Error::other(err.to_string()));
                break;
            }
        }
        self.complete(r)
    }
}

impl Drop for LogWrite {
    fn drop(&mut self) {
        if !self.done {
            self.engine.fail(EngineError::Meta(
                "a planned metadata log write was dropped unwritten".into(),
            ));
        }
    }
}

/// Whether appending `recs` (a planned write's or write group's `Append`s) reads no index
/// page: a queue thread does not wait for the device. Each record keeps its own pages
/// cached while it is applied; a group's later records need the cache to take every page
/// not cached yet without evicting one (an earlier record could evict a later one's).
fn pages_ready(st: &Meta, recs: &[LogRec]) -> bool {
    let ranges: Vec<(Lba, u32)> = recs
        .iter()
        .filter_map(|r| match r {
            LogRec::Append { lba, crcs, .. } => Some((*lba, crcs.len() as u32)),
            _ => None,
        })
        .collect();
    ranges.len() == recs.len()
        && match &ranges[..] {
            [(lba, n)] => st.index.ready(*lba, *n),
            _ => st.index.ready_all(&ranges),
        }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{format, test_volume, FormatOptions, LogEngine, LogOptions};

    /// `try_complete` gives the plan back, recording nothing, while `wlock` is held (a GC
    /// step or a checkpoint); the plan still holds its place, and completes once it is free.
    #[test]
    fn try_complete_declines_while_wlock_is_held() {
        let e = Arc::new(LogEngine::open(test_volume(), LogOptions::default()).unwrap());
        // A first write through the engine opens a frontier, which plans need.
        e.write(0, &[1u8; 4096], false).unwrap();
        let data = vec![0x5au8; 8192];
        let mut plan = e.plan_write(3 * 4096, &data).expect("a plan");
        plan.write_for_test(&data).unwrap();
        let w = e.wlock.lock();
        let plan = match plan.try_complete(&data) {
            Err(plan) => plan,
            Ok(_) => panic!("completed while wlock was held"),
        };
        assert_eq!(e.stats().planned_writes, 0, "nothing recorded");
        drop(w);
        let seq = match plan.try_complete(&data) {
            Ok(r) => r.unwrap(),
            Err(_) => panic!("declined with wlock free"),
        };
        e.sync(seq).unwrap();
        let mut back = vec![0u8; 8192];
        e.read(3 * 4096, &mut back).unwrap();
        assert_eq!(back, data);
        assert_eq!(e.stats().planned_writes, 1);
        e.debug_check().unwrap();
    }

    /// A planned write whose index pages are cached (or map nothing) reads no page while it
    /// completes, even with a cache of one page: mapping its first block into a new page
    /// must not evict the cached page its second block changes (the queue thread would read
    /// it under the state lock).
    #[test]
    fn a_ready_plan_reads_no_page_while_it_completes() {
        let lopts = LogOptions {
            index_memory: 0,
            ..LogOptions::default()
        };
        // 40 zones of 256 KiB, 4 conventional: 2 index pages.
        let dev = Arc::new(zbd::MemDevice::with_zones(256 << 10, 40, 4).unwrap());
        let fopts = FormatOptions {
            log_blocks: 32,
            ..FormatOptions::default()
        };
        format(&*dev, &fopts).unwrap();
        let e = Arc::new(LogEngine::open(dev, lopts).unwrap());
        // Page 1 (blocks 1020..2040) in its slot, page 0 never written.
        e.write(1020 * 4096, &[1u8; 4096], false).unwrap();
        e.write(1500 * 4096, &[2u8; 4096], false).unwrap();
        e.debug_checkpoint().unwrap();
        let mut back = vec![0u8; 4096];
        e.read(1020 * 4096, &mut back).unwrap();
        assert_eq!(back, [1u8; 4096]);
        // Blocks 1019 and 1020: page 0 (new) and page 1 (cached).
        let data = vec![0x77u8; 8192];
        let mut plan = e.plan_write(1019 * 4096, &data).expect("a plan");
        plan.write_for_test(&data).unwrap();
        let reads = e.stats().index_page_reads;
        let seq = match plan.try_complete(&data) {
            Ok(r) => r.unwrap(),
            Err(_) => panic!("declined: the pages were ready"),
        };
        assert_eq!(e.stats().index_page_reads, reads, "a page was read");
        e.sync(seq).unwrap();
        let mut back = vec![0u8; 8192];
        e.read(1019 * 4096, &mut back).unwrap();
        assert_eq!(back, data);
        e.debug_check().unwrap();
    }

    /// `try_complete` declines when the record would make a checkpoint (which needs the
    /// log writer: a queue thread's own log write may hold it); `complete` makes it.
    #[test]
    fn try_complete_declines_when_a_checkpoint_is_due() {
        let dev = test_volume();
        let lopts = LogOptions {
            checkpoint_pct: 1,
            ..LogOptions::default()
        };
        let e = Arc::new(LogEngine::open(dev.clone(), lopts).unwrap());
        // A flush seals the log block: the half is 1/16 used, past `checkpoint_pct`.
        e.write(0, &[1u8; 4096], false).unwrap();
        e.flush().unwrap();
        let before = e.stats().checkpoints;
        let data = vec![0xc3u8; 4096];
        let mut plan = e.plan_write(5 * 4096, &data).expect("a plan");
        plan.write_for_test(&data).unwrap();
        let plan = match plan.try_complete(&data) {
            Err(plan) => plan,
            Ok(_) => panic!("completed with a checkpoint due"),
        };
        assert_eq!(
            e.stats().checkpoints,
            before,
            "no checkpoint on the caller's thread"
        );
        let seq = plan.complete(&data).unwrap();
        e.sync(seq).unwrap();
        assert!(e.stats().checkpoints > before);
        drop(e);
        let e = LogEngine::open(dev, LogOptions::default()).unwrap();
        let mut back = vec![0u8; 4096];
        e.read(5 * 4096, &mut back).unwrap();
        assert_eq!(back, data);
    }
}
