//! The ublk frontend: exposes any [`BlockTarget`] as a conventional `/dev/ublkbN`.
//!
//! - [`request`]: decoding ublk I/O descriptors, splitting them into per-chunk pieces (the
//!   crate `ublk-request`, kept free of libublk for its fuzz target);
//! - [`completion`]: how a worker's result gets back to the (thread-bound) queue thread;
//! - [`queue`]: the per-queue I/O loop (libublk async model, one task per tag);
//! - [`device`]: device parameters and the create / recover lifecycle of one device;
//! - [`features`]: the kernel's ublk features, and which `UBLK_F_*` flags zonedd uses;
//! - [`daemon`]: daemonizing with a readiness handshake, signals, systemd notification;
//! - [`control`]: the daemon's unix-socket control endpoint (status, shutdown);
//! - [`registry`]: what running devices leave in `/run/zonedd` for `list`/`status`/`recover`;
//! - [`sys`]: environment checks with user-facing errors (ublk_drv, root, busy backends);
//! - [`mem`], [`raw_file`]: simple targets for tests and plumbing checks.

pub mod completion;
pub mod control;
pub mod daemon;
pub mod device;
pub mod error;
pub mod features;
pub mod io_limit;
pub mod mem;
pub mod queue;
pub mod raw_file;
pub mod registry;
pub use ublk_request as request;
pub mod sys;
mod write_group;
pub mod zoned;

use std::os::fd::RawFd;

pub use device::{DeviceOptions, Mode, Served, Started};
pub use error::FrontendError;
pub use mem::MemTarget;
pub use raw_file::RawFileTarget;

/// What the frontend needs of the engine: a random-access block device in bytes.
///
/// Offsets and lengths are multiples of 4096 and within [`BlockTarget::capacity`]; the
/// frontend checks that before calling. Errors are errnos (positive) to hand back to the
/// kernel. Calls for one chunk ([`BlockTarget::chunk_size`]) are issued in arrival order by
/// one worker at a time; calls for different chunks run concurrently. Planned reads
/// ([`BlockTarget::plan_read`]) are the exception: a queue thread plans and reads them
/// itself, concurrently with the pool's calls for the same chunk (a read in flight with a
/// write of the same blocks may see either data, as on any disk). Planned writes
/// ([`BlockTarget::plan_write`]) too, but only for a chunk with no work queued or running
/// on the pool ([`Dispatch::has_work`]), so they never overtake an earlier request of their
/// chunk (and with [`BlockTarget::plans_hold_chunks`], held there until done, so no later
/// one starts before them).
pub trait BlockTarget: Send + Sync {
    fn capacity(&self) -> u64;
    /// Requests never cross a multiple of this (the frontend splits them).
    fn chunk_size(&self) -> u64;
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32>;
    /// `fua`: durable (data and the mapping that finds it) before returning.
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), i32>;
    fn discard(&self, offset: u64, len: u64) -> Result<(), i32>;
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), i32>;
    /// Every write completed before this call is durable when it returns.
    fn flush(&self) -> Result<(), i32>;

    /// [`BlockTarget::write`] but for what the writes of one batch can share (the
    /// engine's metadata-log write): the write is not to be acknowledged until
    /// [`BlockTarget::sync`] of the token returned here succeeded. The frontend calls it for
    /// the writes of a pool batch and syncs them at the batch's end. Default: the whole
    /// write here, nothing left.
    fn write_unsynced(&self, offset: u64, buf: &[u8], fua: bool) -> Result<SyncToken, i32> {
        self.write(offset, buf, fua).map(|()| SyncToken(0))
    }

    /// Finish a write from [`BlockTarget::write_unsynced`]: after this it may be
    /// acknowledged (it survives a daemon crash).
    fn sync(&self, token: SyncToken) -> Result<(), i32> {
        let _ = token;
        Ok(())
    }

    /// A descriptor the queue threads may read the backend through themselves (registered
    /// as the rings' fixed file 1), for [`BlockTarget::plan_read`]'s segments. `None` (the
    /// default): every read goes through [`BlockTarget::read`] on the pool.
    fn read_fd(&self) -> Option<RawFd> {
        None
    }

    /// Plan a read of `[offset, offset + len)` (inside one chunk) without blocking: `None`
    /// whenever that cannot be had at once; the frontend then calls [`BlockTarget::read`]
    /// on the pool. Called on a queue thread, and the plan is dropped there.
    fn plan_read(&self, offset: u64, len: u64) -> Option<ReadPlan> {
        let _ = (offset, len);
        None
    }

    /// Plan a write of `data` at `offset` (inside one chunk, not FUA) without blocking:
    /// where its data goes on [`BlockTarget::read_fd`] (which must then be writable there),
    /// with a guard that keeps those blocks for this write alone until it is completed or
    /// dropped, and what to sync before writing the data, if anything. `None` whenever the
    /// write needs anything else first (a zone, a flush): the frontend then queues it on
    /// the pool. Called on a queue thread, and the plan is completed or dropped there.
    fn plan_write(&self, offset: u64, data: &[u8]) -> Option<WritePlan> {
        let _ = (offset, data);
        None
    }

    /// Whether a queue thread should gather its tags' writes into write groups
    /// ([`BlockTarget::plan_write_group`]) rather than plan them one by one. Default: false.
    fn groups_writes(&self) -> bool {
        false
    }

    /// Plan a write group without blocking: of the writes `(offset, len)` asked for (each
    /// inside one chunk, not FUA, none of a chunk with work on the pool), those the target
    /// places one after the other at one place of [`BlockTarget::read_fd`], so that the
    /// caller writes all their data with one device write, in the order of
    /// [`GroupPlan::placed`]; the others get no plan (the caller plans them again, or sends
    /// them to the pool). `None`: nothing placed. The guard keeps the blocks placed for
    /// these writes alone until it is completed or dropped. Called on a queue thread.
    fn plan_write_group(&self, writes: &[(u64, u64)]) -> Option<GroupPlan> {
        let _ = writes;
        None
    }

    /// [`BlockTarget::sync`] without blocking, for a caller that writes the target's log
    /// itself on its ring (through [`BlockTarget::read_fd`]): `Done` when nothing is left
    /// to write, the blocks to write, or `Busy` (the default): call
    /// [`BlockTarget::sync`], which waits for whoever is writing the log.
    fn plan_sync(&self, token: SyncToken) -> Result<SyncPlan, i32> {
        let _ = token;
        Ok(SyncPlan::Busy)
    }

    /// [`BlockTarget::flush`] for a caller that does the device I/O on its ring (log
    /// blocks written through [`BlockTarget::read_fd`], device flushes as an `fdatasync`
    /// of it): the flush's steps one at a time. `None` (the default): call
    /// [`BlockTarget::flush`].
    fn plan_flush(&self) -> Option<Box<dyn FlushGuard>> {
        None
    }

    /// Whether a [`WritePlan`]'s guard may be completed on the pool
    /// ([`WriteGuard::try_complete`] declines) while requests through the pool over the same
    /// blocks wait for it on a worker: the frontend then holds a planned write's chunks on
    /// the pool ([`Dispatch::hold`]) until it is synced, so that no such request starts
    /// before the write's own hand-off job. Default: false (plans are completed on the queue
    /// thread; the frontend only checks that their chunks have no work on the pool).
    fn plans_hold_chunks(&self) -> bool {
        false
    }

    /// True for a target none of whose calls ever waits for anything but a short memory
    /// lock (no device I/O, no zone, no log writer): the queue threads then serve every
    /// request themselves, with no pool hop and no completion kick ([`MemTarget`]: the
    /// ublk round trip alone, the floor any target is measured against). Default: false.
    fn never_blocks(&self) -> bool {
        false
    }
}

/// What [`BlockTarget::plan_sync`] found.
pub enum SyncPlan {
    Done,
    Busy,
    Write(Box<dyn LogWriteGuard>),
}

/// A flush the frontend drives on its ring ([`BlockTarget::plan_flush`]). Like a
/// [`LogWriteGuard`], it may hold the target's log writer between steps: the queue threads
/// run it behind their log gate.
pub trait FlushGuard {
    /// What to do next; an error ends the flush (the target has failed).
    fn step(&mut self) -> Result<FlushStep, i32>;
    /// The device flush of [`FlushStep::Device`] ended: `Ok`, or the errno it failed
    /// with (the target then fails, and the error comes back).
    fn device_flushed(&mut self, result: Result<(), i32>) -> Result<(), i32>;
}

/// One step of a [`FlushGuard`].
pub enum FlushStep {
    /// Write these log blocks, complete the guard, then ask again.
    Log(Box<dyn LogWriteGuard>),
    /// `fdatasync` [`BlockTarget::read_fd`], report it, then ask again.
    Device,
    /// The flush is done.
    Done,
}

/// A log write the frontend makes for the target ([`BlockTarget::plan_sync`]). While it
/// is in flight the thread that holds it must not call the target's `flush`, `sync` or a
/// [`WriteGuard::complete`] (they may need the same log writer): the queue threads gate
/// them behind their log write.
pub trait LogWriteGuard {
    /// (byte offset on [`BlockTarget::read_fd`], 4096 bytes) for each block to write.
    fn blocks(&self) -> Vec<(u64, &[u8])>;
    /// Every block written (`Ok`), or the errno of one that failed: the write's records
    /// are then lost and the target fails (the error comes back).
    fn complete(self: Box<Self>, result: Result<(), i32>) -> Result<(), i32>;
}

/// What a write from [`BlockTarget::write_unsynced`] still needs, in the target's terms.
#[must_use = "a write is acknowledged only after BlockTarget::sync"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncToken(pub u64);

/// A read a target planned ([`BlockTarget::plan_read`]): segments in request order, and a
/// guard that keeps what they name (zones of the backend) from being freed or rewritten
/// until it is completed or dropped.
pub struct ReadPlan {
    pub segments: Vec<ReadSegment>,
    pub guard: Box<dyn PlanGuard>,
}

/// One part of a [`ReadPlan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSegment {
    /// `len` bytes of zeros.
    Zeros { len: u32 },
    /// `len` bytes at byte `offset` of [`BlockTarget::read_fd`].
    Device { offset: u64, len: u32 },
}

/// Held by a [`ReadPlan`]: [`PlanGuard::complete`] once every segment was read (the target
/// counts the read); dropped without it when a read failed (the frontend then retries with
/// [`BlockTarget::read`], which reports the error).
pub trait PlanGuard {
    fn complete(self: Box<Self>);
}

/// A write a target planned ([`BlockTarget::plan_write`]): the frontend writes the piece's
/// data at `device_offset` of [`BlockTarget::read_fd`], then calls
/// [`WriteGuard::complete`] and syncs the token it returns before acknowledging. A plan
/// dropped without `complete` (the device write failed) records nothing; the frontend then
/// redoes the write on the pool, which reports the error.
pub struct WritePlan {
    pub device_offset: u64,
    /// Sync this ([`BlockTarget::sync`] or [`BlockTarget::plan_sync`]) before writing the
    /// data: the write's record goes to the target's log ahead of it.
    pub sync_first: Option<SyncToken>,
    pub guard: Box<dyn WriteGuard>,
}

/// Held by a [`WritePlan`].
pub trait WriteGuard {
    /// `data` (the whole piece) is on the device at the plan's offset: record it. The write
    /// may be acknowledged once [`BlockTarget::sync`] of the token succeeded.
    fn complete(self: Box<Self>, data: &[u8]) -> Result<SyncToken, i32>;

    /// [`WriteGuard::complete`] when it needs no lock that another thread may hold across
    /// device I/O; otherwise the guard back, as one the pool may complete (the frontend
    /// then does, so that the queue thread never waits for that lock). Default: complete
    /// here.
    fn try_complete(
        self: Box<Self>,
        data: &[u8],
    ) -> Result<Result<SyncToken, i32>, Box<dyn WriteGuard + Send>> {
        Ok(self.complete(data))
    }

    /// Whether [`WriteGuard::try_complete`] may need the target's log writer (a record
    /// that commits the log when its half is full): the queue thread then calls it behind
    /// its log gate, never while its own log write is in flight. Default: true.
    fn needs_log_writer(&self) -> bool {
        true
    }
}

/// Writes placed one after the other ([`BlockTarget::plan_write_group`]).
pub struct GroupPlan {
    /// Where the data of the first write placed goes; each next one follows the last.
    pub device_offset: u64,
    /// The writes placed, as indexes among those asked for, in device order.
    pub placed: Vec<usize>,
    pub guard: Box<dyn GroupGuard>,
}

/// Held by a [`GroupPlan`].
pub trait GroupGuard {
    /// The data of every write placed (`parts`, in the order placed) is on the device from
    /// the plan's offset: record them. The writes may be acknowledged once
    /// [`BlockTarget::sync`] of the token succeeded. May wait for locks held across
    /// device I/O: for the pool.
    fn complete(self: Box<Self>, parts: &[&[u8]]) -> Result<SyncToken, i32>;

    /// [`GroupGuard::complete`] when it needs no lock another thread may hold across device
    /// I/O, and never the target's log writer; otherwise the guard back, for the pool.
    fn try_complete(
        self: Box<Self>,
        parts: &[&[u8]],
    ) -> Result<Result<SyncToken, i32>, Box<dyn GroupGuard + Send>>;
}

/// One unit of work handed to the worker pool.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// Where the frontend runs per-chunk works: jobs with the same key run one at a time in
/// queueing order; jobs with different keys may run concurrently (a `workpool::Pool`).
pub trait Dispatch: Send + Sync {
    fn queue(&self, key: u64, job: Job);

    /// Called from a job: run `job` after the other jobs of the batch it belongs to, before
    /// the key's next batch (`workpool::defer`). Default: at once.
    fn defer(&self, job: Job) {
        job()
    }

    /// Whether jobs of `key` are queued or running (a planned write of that chunk would
    /// overtake them). Default: never (jobs run as soon as they are queued).
    fn has_work(&self, key: u64) -> bool {
        let _ = key;
        false
    }

    /// Take `key` as if a job of it were running, when it has no work: true. Jobs queued
    /// on it meanwhile wait for [`Dispatch::release`], which must follow. Default: true
    /// when it has no work (and nothing is held back).
    fn hold(&self, key: u64) -> bool {
        !self.has_work(key)
    }

    /// End [`Dispatch::hold`] of `key`; `first`, if given, runs as the key's next job,
    /// before those queued meanwhile. Default: `first` is queued.
    fn release(&self, key: u64, first: Option<Job>) {
        if let Some(job) = first {
            self.queue(key, job)
        }
    }
}

/// Runs every job on the calling thread at once (tests, and a fallback without a pool).
pub struct InlineDispatch;

impl Dispatch for InlineDispatch {
    fn queue(&self, _key: u64, job: Job) {
        job()
    }
}

#[cfg(test)]
mod request_abi {
    /// `ublk-request` spells out the kernel's values itself (no libublk there): they are
    /// the ones libublk's bindgen read from the kernel header.
    #[test]
    fn ublk_request_constants_are_libublk_s() {
        use libublk::sys as k;
        use ublk_request::sys as r;
        let pairs = [
            (r::UBLK_IO_OP_READ, k::UBLK_IO_OP_READ),
            (r::UBLK_IO_OP_WRITE, k::UBLK_IO_OP_WRITE),
            (r::UBLK_IO_OP_FLUSH, k::UBLK_IO_OP_FLUSH),
            (r::UBLK_IO_OP_DISCARD, k::UBLK_IO_OP_DISCARD),
            (r::UBLK_IO_OP_WRITE_SAME, k::UBLK_IO_OP_WRITE_SAME),
            (r::UBLK_IO_OP_WRITE_ZEROES, k::UBLK_IO_OP_WRITE_ZEROES),
            (r::UBLK_IO_OP_ZONE_APPEND, k::UBLK_IO_OP_ZONE_APPEND),
            (r::UBLK_IO_F_FUA, k::UBLK_IO_F_FUA),
        ];
        for (i, (ours, kernel)) in pairs.into_iter().enumerate() {
            assert_eq!(ours, kernel, "constant {i}");
        }
    }
}
