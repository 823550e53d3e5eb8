//! The per-queue I/O loop: one thread per ublk queue (spawned by libublk's `run_target`),
//! a `smol::LocalExecutor` with one task per tag plus one task that keeps a poll on the
//! queue's [`Kicker`] armed (see [`crate::completion`] for why).
//!
//! A tag task: FETCH, then loop { decode the descriptor; split into per-chunk pieces;
//! queue each piece on the [`Dispatch`] pool keyed by its chunk; await the tag's
//! [`TagCompletion`]; COMMIT_AND_FETCH with the result }. The io buffer is an `Arc` shared
//! with the pieces, so a worker can never write into freed memory, even if the queue dies
//! while a piece is running.
//!
//! A write piece is done in two steps: [`BlockTarget::write_unsynced`] in its job, then
//! [`BlockTarget::sync`] and the piece's completion deferred to the end of the job's pool
//! batch ([`Dispatch::defer`]), so that the writes of one chunk that queued up behind each
//! other share one metadata-log write (group commit) instead of paying one each.
//!
//! Flushes run on the queue thread itself. A flush is what fsync waits for, and the two
//! thread switches of a pool hop were most of its latency (fsync p50 370 -> 216 us in the
//! VM, docs/PERFORMANCE.md). With `QueueShared::ring_flushes` and a target that plans them
//! ([`BlockTarget::plan_flush`]) their log writes and device flushes (`fdatasync` of fixed
//! file 1) go on the queue's own ring ([`flush`]), so the thread serves its other tags
//! meanwhile; otherwise (the daemon's default: measured faster on 6.12, where the ring's
//! fsync runs on an io-wq thread) the blocking [`BlockTarget::flush`] holds the thread
//! until it is done. The engine orders concurrent flushes itself.
//!
//! Reads run on the queue thread too when they can without waiting ("hop-free",
//! [`read_hop_free`]): the target plans every piece at once ([`BlockTarget::plan_read`]:
//! device segments and zero fills, under a guard that keeps the zones named from being
//! freed or rewritten), the segments are read on this thread's own ring from the target's
//! read fd (fixed file 1) straight into the tag's buffer, and the tag is committed when the
//! last CQE is in, with no pool hop and no kick. A piece without a plan sends the whole read
//! to the pool as before, and so does a ring read that fails or comes up short (the pool's
//! read reports the error). A read of one device extent that is the only request its
//! thread has in hand goes further ([`read_then_commit`]): the tag's COMMIT_AND_FETCH is
//! linked behind its device read in the same submission, so the kernel commits the tag
//! when the read ends and the thread enters the ring once per such read instead of twice.
//! `QueueShared::hop_free_reads` switches it all off.
//!
//! Writes go the same way when nothing must wait ([`write_hop_free`]): their chunks have no
//! job queued or running on the pool ([`Dispatch::has_work`]: a planned write never
//! overtakes an earlier request of its chunk; held there for the write when the target asks,
//! [`BlockTarget::plans_hold_chunks`], see [`Held`]), and the target plans every piece at once
//! ([`BlockTarget::plan_write`]: an overwrite in place that needs no zone, no log write
//! ahead of its data and no flush). The data is written on the ring from the tag's buffer
//! to the target's fd, each plan is completed (its record appended), and the log is
//! written up to it on this thread, after one yield to the executor so that the other tags
//! whose writes completed in the same ring wait append theirs first and share the log
//! write (group commit across the tags of a queue, and with the pool's writes through the
//! engine's own group commit). A write that needs anything else, or whose ring write
//! fails, goes to the pool. A planned write whose record or log write would wait for a
//! lock another thread holds across device I/O (the target's log writer, or what
//! [`crate::WriteGuard::try_complete`] declines) has its data written on the ring all the
//! same and the rest done by a pool job, released as its chunk's next job ([`Held`]): the
//! queue thread never blocks on it. `QueueShared::hop_free_writes` switches it off. For a
//! target that groups writes ([`BlockTarget::groups_writes`]: the log layout), a one-piece
//! write instead joins its thread's write group ([`crate::write_group`]): the writes of the
//! tags that became ready together are planned together and written with one vectored
//! write per plan.

use crate::completion::{errno_or_eio, Kicker, TagCompletion};
pub use crate::io_limit::IoLimit;
use crate::request::{decode, split, Request};
use crate::write_group::write_grouped;
pub use crate::write_group::WriteGroups;
use crate::{
    BlockTarget, Dispatch, FlushStep, Job, LogWriteGuard, ReadSegment, SyncPlan, SyncToken,
    WritePlan,
};
use io_uring::{opcode, types};
use libublk::helpers::IoBuf;
use libublk::io::{UblkDev, UblkQueue};
use libublk::uring_async::UblkUringOpFuture;
use libublk::{BufDesc, UblkError};
use serde::Serialize;
use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Frontend counters, shown by `zonedd status`.
#[derive(Debug, Default)]
pub struct IoStats {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub fua_writes: AtomicU64,
    pub flushes: AtomicU64,
    pub discards: AtomicU64,
    pub write_zeroes: AtomicU64,
    /// Requests split because they crossed a chunk end.
    pub split_requests: AtomicU64,
    pub errors: AtomicU64,
    pub rejected: AtomicU64,
    /// Reads served on the queue thread's own ring (every piece planned by the target).
    pub hop_free_reads: AtomicU64,
    /// Reads that went through the pool (no plan, or a hop-free read that failed).
    pub pool_reads: AtomicU64,
    /// Hop-free reads whose device read failed or came up short, redone on the pool.
    pub hop_free_retries: AtomicU64,
    /// Hop-free reads (counted in `hop_free_reads` too) of one device read whose tag's
    /// commit was linked behind it in the same submission ([`read_then_commit`]).
    pub linked_reads: AtomicU64,
    /// Linked reads that failed or came up short (`-EAGAIN` included), so that the kernel
    /// cancelled the commit behind them; their requests were redone the usual way.
    pub linked_cancels: AtomicU64,
    /// Writes made on the queue thread's own ring (every piece planned by the target).
    pub hop_free_writes: AtomicU64,
    /// Hop-free writes whose device write failed or came up short, redone on the pool.
    pub hop_free_write_retries: AtomicU64,
    /// Hop-free writes whose record or log write was handed to the pool: it would have
    /// waited for a lock another thread held (their data was still written on the ring).
    pub hop_free_handoffs: AtomicU64,
    /// Flushes whose log writes and device flushes went on the queue thread's own ring.
    pub ring_flushes: AtomicU64,
    /// Ring reads and writes that the device turned away at once (`EAGAIN`: its queue was
    /// full, or it would have had to split the write): made `RWF_NOWAIT`, they are never
    /// retried on an io_uring worker thread; their requests are redone on the pool (a log
    /// block: written by the queue thread with a blocking pwrite). Not failures.
    pub ring_again: AtomicU64,
}

#[derive(Debug, Serialize)]
pub struct IoStatsSnapshot {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub write_zeroes: u64,
    pub split_requests: u64,
    pub errors: u64,
    pub rejected: u64,
    pub hop_free_reads: u64,
    pub pool_reads: u64,
    pub hop_free_retries: u64,
    pub linked_reads: u64,
    pub linked_cancels: u64,
    pub hop_free_writes: u64,
    pub hop_free_write_retries: u64,
    pub hop_free_handoffs: u64,
    pub ring_flushes: u64,
    pub ring_again: u64,
}

impl IoStats {
    pub fn snapshot(&self) -> IoStatsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IoStatsSnapshot {
            reads: g(&self.reads),
            read_bytes: g(&self.read_bytes),
            writes: g(&self.writes),
            write_bytes: g(&self.write_bytes),
            fua_writes: g(&self.fua_writes),
            flushes: g(&self.flushes),
            discards: g(&self.discards),
            write_zeroes: g(&self.write_zeroes),
            split_requests: g(&self.split_requests),
            errors: g(&self.errors),
            rejected: g(&self.rejected),
            hop_free_reads: g(&self.hop_free_reads),
            pool_reads: g(&self.pool_reads),
            hop_free_retries: g(&self.hop_free_retries),
            linked_reads: g(&self.linked_reads),
            linked_cancels: g(&self.linked_cancels),
            hop_free_writes: g(&self.hop_free_writes),
            hop_free_write_retries: g(&self.hop_free_write_retries),
            hop_free_handoffs: g(&self.hop_free_handoffs),
            ring_flushes: g(&self.ring_flushes),
            ring_again: g(&self.ring_again),
        }
    }
    fn count(&self, req: &Request, pieces: u32) {
        let inc = |a: &AtomicU64, n: u64| {
            a.fetch_add(n, Ordering::Relaxed);
        };
        match *req {
            Request::Read { len, .. } => {
                inc(&self.reads, 1);
                inc(&self.read_bytes, len);
            }
            Request::Write { len, fua, .. } => {
                inc(&self.writes, 1);
                inc(&self.write_bytes, len);
                if fua {
                    inc(&self.fua_writes, 1);
                }
            }
            Request::Flush => inc(&self.flushes, 1),
            Request::Discard { .. } => inc(&self.discards, 1),
            Request::WriteZeroes { .. } => inc(&self.write_zeroes, 1),
        }
        if pieces > 1 {
            inc(&self.split_requests, 1);
        }
    }
}

/// What every queue thread shares.
pub struct QueueShared {
    pub target: Arc<dyn BlockTarget>,
    pub dispatch: Arc<dyn Dispatch>,
    pub stats: Arc<IoStats>,
    /// Serve reads on the queue threads' own rings when the target plans them
    /// ([`BlockTarget::plan_read`], [`BlockTarget::read_fd`]); false: every read goes
    /// through the pool, as before hop-free reads.
    pub hop_free_reads: bool,
    /// Make writes on the queue threads' own rings when nothing must wait
    /// ([`BlockTarget::plan_write`]); false: every write goes through the pool.
    pub hop_free_writes: bool,
    /// Put flushes' log writes and device flushes on the queue threads' own rings when the
    /// target plans them ([`BlockTarget::plan_flush`]); false: the blocking
    /// [`BlockTarget::flush`] on the queue thread. Off by default in the daemon: 6.12's
    /// io_uring runs an `IORING_OP_FSYNC` on an io-wq worker, a thread switch each way,
    /// which made write+fsync 2.6x slower in the VM (docs/PERFORMANCE.md).
    pub ring_flushes: bool,
    /// When a hop-free read has the tag's commit linked behind its device read.
    pub linked_reads: LinkedReads,
}

/// When a hop-free read of one device extent has its tag's COMMIT_AND_FETCH linked behind
/// its device read ([`read_then_commit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkedReads {
    /// Never: the commit is submitted at the read's CQE.
    Off,
    /// When the read is the only request its queue thread has in hand (the daemon's
    /// default: linked reads measured faster at QD1; at QD16 the measurements did not
    /// separate linking from not, and a link saves no ring enter there).
    Alone,
    /// Whenever the read is one device extent (tests of the cancelled commit, comparisons).
    Always,
}

/// Body of one queue thread (`q_fn` of `run_target`). Returns when the queue is down.
pub fn run_queue(qid: u16, dev: &UblkDev, shared: Arc<QueueShared>) {
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => Rc::new(q),
        Err(e) => {
            tracing::error!("queue {qid}: setup failed: {e}");
            return;
        }
    };
    let kicker = match Kicker::new() {
        Ok(k) => Arc::new(k),
        Err(e) => {
            tracing::error!("queue {qid}: eventfd: {e}");
            return;
        }
    };
    let buf_len = dev.dev_info.max_io_buf_bytes as usize;
    // `device::serve` registered the target's read fd as fixed file 1 (after the ublk char
    // device, 0) only if hop-free reads are on and the target has one.
    let hop_free = dev.tgt.nr_fds == 2;
    let exe = Rc::new(smol::LocalExecutor::new());
    let log_gate = Rc::new(smol::lock::Mutex::new(()));
    let limit = match (hop_free, shared.target.read_fd()) {
        (true, Some(fd)) => IoLimit::of_fd(fd),
        _ => IoLimit::default(),
    };
    let groups = Rc::new(WriteGroups::default());
    let serving = Rc::new(Cell::new(0));
    let mut tasks = Vec::new();
    for tag in q.tags() {
        let q = q.clone();
        let shared = shared.clone();
        let kicker = kicker.clone();
        let gate = log_gate.clone();
        let groups = groups.clone();
        let serving = serving.clone();
        tasks.push(exe.spawn(async move {
            let thread = ThreadRing {
                log_gate: &gate,
                groups: &groups,
                limit,
                serving: &serving,
            };
            match tag_loop(&q, tag, buf_len, &shared, kicker, hop_free, thread).await {
                Err(UblkError::QueueIsDown) | Ok(()) => {}
                Err(e) => tracing::error!("queue {qid} tag {tag}: {e}"),
            }
        }));
    }
    // Not in `tasks`: it lives as long as the queue and is dropped with the executor.
    let _kick_task = {
        let q = q.clone();
        let kicker = kicker.clone();
        exe.spawn(async move { kick_loop(&q, &kicker).await })
    };
    let exe2 = exe.clone();
    smol::block_on(exe.run(async move {
        let run_ops = || while exe2.try_tick() {};
        let done = || tasks.iter().all(|t| t.is_finished());
        // No idle timeout: the ring wait ends only for a completion (a request, a kick, the
        // aborts of a stopping device). libublk's 20 s timeout would wake every idle queue
        // thread just to madvise its tag buffers away; an idle daemon makes no wakeups
        // instead, and keeps the buffer pages it has touched (at most depth x max I/O size
        // per queue).
        if let Err(e) = libublk::wait_and_handle_io_events(&q, None, run_ops, done).await {
            tracing::error!("queue {qid}: event loop: {e}");
        }
    }));
    tracing::debug!("queue {qid} down");
}

/// Keep a POLL_ADD armed on the kicker: its completion wakes the queue thread.
async fn kick_loop(q: &UblkQueue<'_>, kicker: &Kicker) {
    loop {
        let sqe = opcode::PollAdd::new(types::Fd(kicker.raw_fd()), libc::POLLIN as u32).build();
        let res = q.ublk_submit_sqe(sqe).await;
        kicker.drain();
        if res < 0 {
            if res != -libc::ECANCELED {
                tracing::warn!("queue {}: kick poll failed: {}", q.get_qid(), res);
            }
            return;
        }
    }
}

async fn tag_loop(
    q: &UblkQueue<'_>,
    tag: u16,
    buf_len: usize,
    shared: &Arc<QueueShared>,
    kicker: Arc<Kicker>,
    hop_free: bool,
    thread: ThreadRing<'_>,
) -> Result<(), UblkError> {
    let ring = QueueRing {
        q,
        fd: shared.target.read_fd().unwrap_or(-1),
        log_gate: thread.log_gate,
        groups: thread.groups,
        limit: thread.limit,
    };
    let ring = hop_free.then_some(&ring);
    let buf = Arc::new(IoBuf::<u8>::new(buf_len));
    let completion = Arc::new(TagCompletion::new(kicker));
    q.submit_io_prep_cmd(tag, BufDesc::Slice(buf.as_slice()), 0, Some(&buf))
        .await?;
    let capacity = shared.target.capacity();
    loop {
        let iod = q.get_iod(tag);
        let (op_flags, start, nr) = (iod.op_flags, iod.start_sector, iod.nr_sectors);
        let req = decode(op_flags, start, nr, capacity, buf_len);
        let mut serving = Some(Serving::new(thread.serving));
        if let (Ok(req), Some(ring)) = (req, ring) {
            if let Some(next) = read_then_commit(ring, tag, req, &buf, shared, &mut serving).await {
                // Committed: the tag holds its next request, or the queue is down.
                next?;
                continue;
            }
        }
        let res = match req {
            Ok(req) => execute_with(req, &buf, &completion, shared, ring).await,
            Err(errno) => {
                tracing::debug!("tag {tag}: rejected op_flags {op_flags:#x} sector {start} n {nr}: errno {errno}");
                shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                -errno
            }
        };
        drop(serving);
        q.submit_io_commit_cmd(tag, BufDesc::Slice(buf.as_slice()), res)
            .await?;
    }
}

/// A tag counted among those of its queue thread that hold a request not yet answered
/// (from its decoding to its commit) while this lives.
struct Serving<'a>(&'a Cell<usize>);

impl<'a> Serving<'a> {
    fn new(count: &'a Cell<usize>) -> Self {
        count.set(count.get() + 1);
        Serving(count)
    }
    /// The only one: no other tag of the thread has a request in hand.
    fn alone(&self) -> bool {
        self.0.get() == 1
    }
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// A read of one device extent served with one ring submission: the device read into the
/// tag's buffer and the tag's COMMIT_AND_FETCH linked behind it (`IOSQE_IO_LINK`), so that
/// the kernel commits the tag as soon as the read has ended, without the queue thread
/// entering the ring once for the read and once more for the commit ([`read_hop_free`]
/// then the commit in [`tag_loop`]). By default only for a tag alone on its thread
/// ([`LinkedReads::Alone`], decided after one yield so that the tags woken by the same
/// ring enter have counted themselves in): with other requests in hand the thread's next
/// ring enter carries their commits anyway, so a link saves nothing there. `serving` is
/// ended once the commit is on its way.
///
/// `Some` once the tag is committed: the result of its COMMIT_AND_FETCH (it holds its next
/// request, or the queue is down). `None` when nothing was committed: the request is not a
/// read of exactly one device extent the target plans at once, or the read failed or came
/// up short (the kernel then cancels the linked commit, `-ECANCELED`). The caller runs the
/// request the usual way then, which retries and reports a real error.
async fn read_then_commit(
    ring: &QueueRing<'_, '_>,
    tag: u16,
    req: Request,
    buf: &Arc<IoBuf<u8>>,
    shared: &QueueShared,
    serving: &mut Option<Serving<'_>>,
) -> Option<Result<i32, UblkError>> {
    let Request::Read { offset, len } = req else {
        return None;
    };
    let target = &shared.target;
    if len == 0 || !shared.hop_free_reads || target.never_blocks() {
        return None;
    }
    // One chunk, one plan, one device extent no longer than the device takes whole.
    let one_piece = split(offset, len, target.chunk_size()).nth(1).is_none();
    if !one_piece || len > ring.limit().piece() {
        return None;
    }
    let link = match shared.linked_reads {
        LinkedReads::Off => false,
        LinkedReads::Alone => {
            // The tags whose requests came in the same ring enter are woken together: let
            // them count themselves in before deciding.
            smol::future::yield_now().await;
            serving.as_ref().is_some_and(Serving::alone)
        }
        LinkedReads::Always => true,
    };
    if !link {
        return None;
    }
    let plan = target.plan_read(offset, len)?;
    let [ReadSegment::Device { offset: at, len: n }] = plan.segments[..] else {
        return None;
    };
    if u64::from(n) != len {
        return None;
    }
    // SAFETY: `buf` is the tag's buffer (decode checked len <= its size), which `buf` keeps
    // allocated; nothing else touches it while the tag's request runs, and both futures are
    // awaited below before this function returns: the read's, then the commit's, until
    // whose completion the kernel owns the whole buffer (it copies the read data out, then
    // the next write's data in).
    let (read, commit) = unsafe { ring.read_and_commit(tag, buf, n, at) }?;
    let res = read.await;
    if i64::from(res) != len as i64 {
        // The kernel cancels the commit linked behind a failed or short read. The plan's
        // guard is dropped uncompleted; the caller retries (the request still in hand).
        drop(plan);
        // Counted in `linked_cancels` below; a retry that fails too counts in
        // `hop_free_retries` as for any hop-free read.
        shortfall(&[(res, len)], &shared.stats, "linked read");
        let committed = commit.await;
        if committed == -libc::ECANCELED {
            shared.stats.linked_cancels.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // Not what io_uring documents: the kernel took a buffer this read did not fill.
        tracing::error!("tag {tag}: a linked read came back {res} of {len}, yet its commit ran");
        shared.stats.errors.fetch_add(1, Ordering::Relaxed);
        return Some(committed_next(committed));
    }
    // The data is in the buffer: the zones named may go (the commit does not wait for the
    // next request to be released, which may be long in coming).
    plan.guard.complete();
    let st = &shared.stats;
    st.count(&req, 1);
    st.hop_free_reads.fetch_add(1, Ordering::Relaxed);
    st.linked_reads.fetch_add(1, Ordering::Relaxed);
    // Answered: the commit is on its way, and its completion is the tag's next request.
    *serving = None;
    Some(committed_next(commit.await))
}

/// A COMMIT_AND_FETCH's result as libublk's `submit_io_commit_cmd` gives it.
fn committed_next(res: i32) -> Result<i32, UblkError> {
    match res {
        libublk::sys::UBLK_IO_RES_ABORT => Err(UblkError::QueueIsDown),
        next => Ok(next),
    }
}

/// What the tags of one queue thread share besides the queue: its log gate and its
/// forming write group.
struct ThreadRing<'a> {
    log_gate: &'a smol::lock::Mutex<()>,
    groups: &'a WriteGroups,
    limit: IoLimit,
    /// How many tags of the thread hold a request not yet answered ([`Serving`]).
    serving: &'a Cell<usize>,
}

/// Reads and writes a queue thread submits itself: on its own ring in the daemon
/// ([`QueueRing`]), something simpler in tests.
///
/// `read`, `write` and `writev` never wait for the device's queue: on the daemon's ring
/// they are `RWF_NOWAIT`, so that what the device cannot take at once (its queue full, a
/// write it would split, a file that cannot do it without blocking) comes back as
/// `-EAGAIN` instead of being retried on an io_uring worker thread (io-wq): each such
/// retry is a thread hop, and the ring keeps its last io-wq worker for as long as it
/// lives, waking every 5 s, so one retry would end the idle daemon's silence. Callers redo
/// an `-EAGAIN` on the pool ([`HopFree::Again`]), or with [`RingIo::write_blocking`].
pub trait RingIo {
    type Fut: Future<Output = i32>;
    /// Start reading `len` bytes at byte `offset` of the target's read fd into `ptr`; the
    /// future gives the bytes read or a negative errno.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay allocated, and be neither read nor written by anyone
    /// else, until the returned future has completed.
    unsafe fn read(&self, ptr: *mut u8, len: u32, offset: u64) -> Self::Fut;
    /// Start writing `len` bytes from `ptr` at byte `offset` of the target's fd; the future
    /// gives the bytes written or a negative errno.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay allocated, and not be written by anyone, until the
    /// returned future has completed.
    unsafe fn write(&self, ptr: *const u8, len: u32, offset: u64) -> Self::Fut;
    /// Start writing the `n` buffers of `iov` one after the other from byte `offset` of the
    /// target's fd; the future gives the bytes written or a negative errno.
    ///
    /// # Safety
    /// `iov[..n]` and every buffer it names must stay allocated, and the buffers not be
    /// written by anyone, until the returned future has completed.
    unsafe fn writev(&self, iov: *const libc::iovec, n: u32, offset: u64) -> Self::Fut;
    /// Write `len` bytes from `ptr` at byte `offset` of the target's fd with a blocking
    /// `pwrite` on this thread: the bytes written or a negative errno. For the log blocks
    /// whose ring write the device turned away (`-EAGAIN`), which have no pool to go to: a
    /// ring write without `RWF_NOWAIT` would wait on an io-wq worker, which then stays.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid for reads for the call.
    unsafe fn write_blocking(&self, ptr: *const u8, len: u32, offset: u64) -> i32;
    /// Start an `fdatasync` of the target's fd; the future gives 0 or a negative errno.
    fn fsync(&self) -> Self::Fut;
    /// The queue thread's one gate around the target's log writer: held by a tag while its
    /// log write is on the ring ([`sync_on_ring`]), taken before anything on this thread
    /// that may need the log writer (a flush, a blocking sync, a planned write's record),
    /// which would otherwise wait for this thread's own log write forever.
    fn log_gate(&self) -> &smol::lock::Mutex<()>;
    /// The queue thread's forming write group ([`crate::write_group`]).
    fn write_groups(&self) -> &WriteGroups;
    /// What one read or write may carry without the device turning it away.
    fn limit(&self) -> IoLimit;
}

/// The queue thread's own io_uring (libublk's per-thread queue ring), the target's read fd
/// registered as its fixed file 1, and the thread's log gate.
pub struct QueueRing<'a, 'q> {
    q: &'a UblkQueue<'q>,
    /// The target's fd (fixed file 1), for [`RingIo::write_blocking`].
    fd: std::os::fd::RawFd,
    limit: IoLimit,
    log_gate: &'a smol::lock::Mutex<()>,
    groups: &'a WriteGroups,
}

/// A read of `len` bytes at byte `offset` of fixed file 1 into `ptr`, `RWF_NOWAIT` (see
/// [`RingIo`]).
fn read_sqe(ptr: *mut u8, len: u32, offset: u64) -> io_uring::squeue::Entry {
    opcode::Read::new(types::Fixed(1), ptr, len)
        .offset(offset)
        .rw_flags(libc::RWF_NOWAIT)
        .build()
}

impl QueueRing<'_, '_> {
    /// Start reading `len` bytes at byte `offset` of fixed file 1 into `buf`, and the tag's
    /// COMMIT_AND_FETCH with result `len`, linked behind the read so that the kernel runs
    /// it only once the read has read all `len` bytes (else it is cancelled, `-ECANCELED`).
    /// The futures give the read's result and the commit's. `None` when the queue is
    /// stopping (libublk would not queue the commit) or the ring has no room for both.
    ///
    /// # Safety
    /// As [`RingIo::read`] for `buf[..len]`, until both futures have completed.
    unsafe fn read_and_commit(
        &self,
        tag: u16,
        buf: &IoBuf<u8>,
        len: u32,
        offset: u64,
    ) -> Option<(UblkUringOpFuture, UblkUringOpFuture)> {
        if self.q.is_stopping() {
            return None;
        }
        // Both entries go into the submission queue back to back: a full queue would be
        // submitted between them, and a link cut at the end of a submission runs the
        // commit at once, before the read has filled the buffer.
        let room = libublk::io::with_task_io_ring_mut(|r| {
            let free = |r: &mut io_uring::IoUring| {
                let sq = r.submission();
                sq.capacity() - sq.len()
            };
            if free(r) < 2 {
                let _ = r.submit();
            }
            free(r) >= 2
        });
        if !room {
            return None;
        }
        let read = read_sqe(buf.as_mut_ptr(), len, offset).flags(io_uring::squeue::Flags::IO_LINK);
        let read = self.q.ublk_submit_sqe(read);
        // libublk 0.4.8's one call that queues a COMMIT_AND_FETCH at once and returns its
        // future (`submit_io_commit_cmd` is an async fn: it would queue the command only
        // when first polled, after the read may already have been submitted alone).
        #[allow(deprecated)]
        let commit = self.q.submit_io_cmd(
            tag,
            libublk::sys::UBLK_U_IO_COMMIT_AND_FETCH_REQ,
            buf.as_mut_ptr(),
            len as i32,
        );
        Some((read, commit))
    }
}

impl RingIo for QueueRing<'_, '_> {
    type Fut = UblkUringOpFuture;
    unsafe fn read(&self, ptr: *mut u8, len: u32, offset: u64) -> Self::Fut {
        let sqe = read_sqe(ptr, len, offset);
        // The SQE is queued now and submitted by the queue's event loop; the future wakes
        // at its CQE (libublk marks it a target I/O in user_data).
        self.q.ublk_submit_sqe(sqe)
    }
    unsafe fn write(&self, ptr: *const u8, len: u32, offset: u64) -> Self::Fut {
        let sqe = opcode::Write::new(types::Fixed(1), ptr, len)
            .offset(offset)
            .rw_flags(libc::RWF_NOWAIT)
            .build();
        self.q.ublk_submit_sqe(sqe)
    }
    unsafe fn write_blocking(&self, ptr: *const u8, len: u32, offset: u64) -> i32 {
        // SAFETY: the caller guarantees `ptr..ptr + len` is valid for reads; `fd` is the
        // target's, open while the target lives, which outlives the queues.
        pwrite(self.fd, ptr, len, offset)
    }
    unsafe fn writev(&self, iov: *const libc::iovec, n: u32, offset: u64) -> Self::Fut {
        let sqe = opcode::Writev::new(types::Fixed(1), iov, n)
            .offset(offset)
            .rw_flags(libc::RWF_NOWAIT)
            .build();
        self.q.ublk_submit_sqe(sqe)
    }
    fn fsync(&self) -> Self::Fut {
        let sqe = opcode::Fsync::new(types::Fixed(1))
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        self.q.ublk_submit_sqe(sqe)
    }
    fn log_gate(&self) -> &smol::lock::Mutex<()> {
        self.log_gate
    }
    fn write_groups(&self) -> &WriteGroups {
        self.groups
    }
    fn limit(&self) -> IoLimit {
        self.limit
    }
}

/// A blocking `pwrite` of `ptr[..len]` at `offset` of `fd`: the bytes written or a
/// negative errno.
fn pwrite(fd: std::os::fd::RawFd, ptr: *const u8, len: u32, offset: u64) -> i32 {
    // SAFETY: the callers (`RingIo::write_blocking`) guarantee `ptr..ptr + len` is valid
    // for reads; pwrite reads nothing else.
    let n = unsafe { libc::pwrite(fd, ptr.cast(), len as usize, offset as i64) };
    if n < 0 {
        -std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    } else {
        n as i32
    }
}

/// A ring that is never used (the type for [`execute`], which has none).
pub enum NoRing {}

impl RingIo for NoRing {
    type Fut = std::future::Ready<i32>;
    unsafe fn read(&self, _: *mut u8, _: u32, _: u64) -> Self::Fut {
        match *self {}
    }
    unsafe fn write(&self, _: *const u8, _: u32, _: u64) -> Self::Fut {
        match *self {}
    }
    unsafe fn writev(&self, _: *const libc::iovec, _: u32, _: u64) -> Self::Fut {
        match *self {}
    }
    unsafe fn write_blocking(&self, _: *const u8, _: u32, _: u64) -> i32 {
        match *self {}
    }
    fn fsync(&self) -> Self::Fut {
        match *self {}
    }
    fn log_gate(&self) -> &smol::lock::Mutex<()> {
        match *self {}
    }
    fn write_groups(&self) -> &WriteGroups {
        match *self {}
    }
    fn limit(&self) -> IoLimit {
        match *self {}
    }
}

/// Run one request on the pool and wait for it: bytes done, or a negative errno.
pub async fn execute(
    req: Request,
    buf: &Arc<IoBuf<u8>>,
    completion: &Arc<TagCompletion>,
    shared: &QueueShared,
) -> i32 {
    execute_with::<NoRing>(req, buf, completion, shared, None).await
}

/// [`execute`], with reads done on `ring` when `shared.hop_free_reads` and the target plans
/// every piece ([`read_hop_free`]), and writes when `shared.hop_free_writes` and nothing
/// must wait ([`write_hop_free`]).
pub async fn execute_with<R: RingIo>(
    req: Request,
    buf: &Arc<IoBuf<u8>>,
    completion: &Arc<TagCompletion>,
    shared: &QueueShared,
    ring: Option<&R>,
) -> i32 {
    let chunk = shared.target.chunk_size();
    let pieces = match req.range() {
        Some((offset, len)) => split(offset, len, chunk).count() as u32,
        None => 1,
    };
    shared.stats.count(&req, pieces);
    if pieces == 0 {
        return 0;
    }
    if req == Request::Flush {
        // On this thread (see the module comment): no completion, no kick.
        return finish(req, flush(ring, shared).await, shared);
    }
    if shared.target.never_blocks() {
        if let Some(result) = inline(req, buf, shared) {
            return finish(req, result, shared);
        }
    }
    let st = &shared.stats;
    let hop_free = match (req, ring) {
        (Request::Read { offset, len }, Some(ring)) if shared.hop_free_reads => {
            let h = read_hop_free(ring, offset, len, buf, shared).await;
            h.counted(&st.hop_free_reads, &st.hop_free_retries)
        }
        (
            Request::Write {
                offset,
                len,
                fua: false,
            },
            Some(ring),
        ) if shared.hop_free_writes => {
            let h = write_hop_free(ring, offset, len, buf, completion, shared).await;
            h.counted(&st.hop_free_writes, &st.hop_free_write_retries)
        }
        _ => None,
    };
    if let Some(result) = hop_free {
        return finish(req, result, shared);
    }
    if matches!(req, Request::Read { .. }) {
        shared.stats.pool_reads.fetch_add(1, Ordering::Relaxed);
    }
    completion.arm(pieces);
    if let Some((offset, len)) = req.range() {
        for p in split(offset, len, chunk) {
            let (t, c, b) = (shared.target.clone(), completion.clone(), buf.clone());
            let job: Job = match req {
                Request::Read { .. } => Box::new(move || {
                    // SAFETY: pieces of one request cover disjoint ranges of the buffer,
                    // inside its length (decode checked len <= buffer size); nothing
                    // else touches the buffer until every piece has completed, and `b`
                    // keeps the allocation alive.
                    let s = unsafe {
                        std::slice::from_raw_parts_mut(
                            b.as_mut_ptr().add(p.buf_offset as usize),
                            p.len as usize,
                        )
                    };
                    c.complete(t.read(p.offset, s))
                }),
                Request::Write { fua, .. } => {
                    let d = shared.dispatch.clone();
                    Box::new(move || {
                        let s =
                            &b.as_slice()[p.buf_offset as usize..(p.buf_offset + p.len) as usize];
                        match t.write_unsynced(p.offset, s, fua) {
                            // Group commit: the batch's writes share one log write, at its end.
                            Ok(token) => d.defer(Box::new(move || c.complete(t.sync(token)))),
                            Err(e) => c.complete(Err(e)),
                        }
                    })
                }
                Request::Discard { .. } => Box::new(move || c.complete(t.discard(p.offset, p.len))),
                Request::WriteZeroes { .. } => {
                    Box::new(move || c.complete(t.write_zeroes(p.offset, p.len)))
                }
                Request::Flush => unreachable!("flush has no range"),
            };
            shared.dispatch.queue(p.chunk, job);
        }
    }
    let result = completion.wait().await;
    finish(req, result, shared)
}

/// A request served on this thread by a target that never blocks
/// ([`BlockTarget::never_blocks`]): reads when `hop_free_reads`, writes, discards and write
/// zeroes when `hop_free_writes` (off, they go to the pool as for any target: the
/// comparison that shows what the hop costs). `None`: switched off.
fn inline(req: Request, buf: &Arc<IoBuf<u8>>, shared: &QueueShared) -> Option<Result<(), i32>> {
    let (offset, len) = req.range()?;
    let (on, count) = match req {
        Request::Read { .. } => (shared.hop_free_reads, &shared.stats.hop_free_reads),
        _ => (shared.hop_free_writes, &shared.stats.hop_free_writes),
    };
    if !on {
        return None;
    }
    let t = &shared.target;
    let mut result = Ok(());
    for p in split(offset, len, t.chunk_size()) {
        let at = p.buf_offset as usize..(p.buf_offset + p.len) as usize;
        let r = match req {
            Request::Read { .. } => {
                // SAFETY: the piece lies inside the buffer (decode checked len <= its
                // size), and nothing else touches the buffer meanwhile: this request is
                // served on this thread alone, and the kernel reads it only after commit.
                let s = unsafe {
                    std::slice::from_raw_parts_mut(buf.as_mut_ptr().add(at.start), at.len())
                };
                t.read(p.offset, s)
            }
            Request::Write { fua, .. } => t.write(p.offset, &buf.as_slice()[at], fua),
            Request::Discard { .. } => t.discard(p.offset, p.len),
            Request::WriteZeroes { .. } => t.write_zeroes(p.offset, p.len),
            Request::Flush => unreachable!("flush has no range"),
        };
        result = result.and(r);
    }
    count.fetch_add(1, Ordering::Relaxed);
    Some(result)
}

/// How [`read_hop_free`] or [`write_hop_free`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HopFree {
    /// Done on this thread, with this result for the kernel (a read: the buffer holds the
    /// data; a write: recorded and synced, or the engine's error after its data landed).
    Done(Result<(), i32>),
    /// A piece had no plan; nothing was read or written.
    NoPlan,
    /// A device read or write failed or came up short; every one has ended, the plans are
    /// dropped (nothing recorded).
    Failed,
    /// As `Failed`, but only because the device turned I/O away at once (`-EAGAIN`, see
    /// [`RingIo`]): nothing of it was done, and it is no failure.
    Again,
}

impl HopFree {
    /// Count how it went (`done` or `retried`); the result for the kernel once done.
    fn counted(self, done: &AtomicU64, retried: &AtomicU64) -> Option<Result<(), i32>> {
        match self {
            HopFree::Done(result) => {
                done.fetch_add(1, Ordering::Relaxed);
                Some(result)
            }
            HopFree::Failed => {
                retried.fetch_add(1, Ordering::Relaxed);
                None
            }
            HopFree::NoPlan | HopFree::Again => None,
        }
    }
}

/// `None` when every ring read or write of a batch did what it should (`(result, wanted)`
/// each); otherwise how the batch went wrong: [`HopFree::Again`] when the device only
/// turned some away at once (`-EAGAIN`, each counted in `ring_again`), else
/// [`HopFree::Failed`].
pub(crate) fn shortfall(results: &[(i32, u64)], stats: &IoStats, what: &str) -> Option<HopFree> {
    let bad: Vec<i32> = results
        .iter()
        .filter(|&&(res, want)| i64::from(res) != want as i64)
        .map(|&(res, _)| res)
        .collect();
    if bad.is_empty() {
        return None;
    }
    let again = bad.iter().filter(|&&res| res == -libc::EAGAIN).count();
    stats.ring_again.fetch_add(again as u64, Ordering::Relaxed);
    tracing::debug!(
        "hop-free {what}: {} of {} ring I/Os came back {bad:?}; redone on the pool",
        bad.len(),
        results.len()
    );
    Some(match again == bad.len() {
        true => HopFree::Again,
        false => HopFree::Failed,
    })
}

/// A read without a pool hop: the target plans every piece at once (`plan_read` never
/// blocks), each device segment is read on `ring` straight into the tag's buffer (all in
/// flight together), zero segments are filled here. The plans' guards are held until every
/// read has ended, so the zones they name stay put meanwhile; on success they are
/// completed (the target counts the read), otherwise dropped, and the caller redoes the
/// read on the pool, which reports a real error (and lets the engine recheck the zone).
async fn read_hop_free<R: RingIo>(
    ring: &R,
    offset: u64,
    len: u64,
    buf: &Arc<IoBuf<u8>>,
    shared: &QueueShared,
) -> HopFree {
    let mut plans = Vec::new();
    for p in split(offset, len, shared.target.chunk_size()) {
        let Some(plan) = shared.target.plan_read(p.offset, p.len) else {
            return HopFree::NoPlan;
        };
        let covered: u64 = plan
            .segments
            .iter()
            .map(|s| match *s {
                ReadSegment::Zeros { len } | ReadSegment::Device { len, .. } => len as u64,
            })
            .sum();
        if covered != p.len {
            tracing::error!(
                "a read plan covers {covered} bytes of a {}-byte piece",
                p.len
            );
            return HopFree::NoPlan;
        }
        plans.push((p.buf_offset as usize, plan));
    }
    // The device reads: (place in the buffer, length, device offset), each no more than
    // the device takes whole (`IoLimit`: a longer one would come back -EAGAIN).
    let mut todo: Vec<(usize, u32, u64)> = Vec::new();
    let piece = ring.limit().piece();
    for (start, plan) in &plans {
        let mut pos = *start;
        for s in &plan.segments {
            match *s {
                ReadSegment::Zeros { len } => {
                    // SAFETY: `pos..pos + len` lies inside the buffer (the pieces and their
                    // segments tile `[0, len)` of the request, checked above, and decode
                    // checked len <= buffer size); no other piece or segment covers it and
                    // nothing else touches the buffer while the tag's request runs.
                    unsafe { std::ptr::write_bytes(buf.as_mut_ptr().add(pos), 0, len as usize) };
                    pos += len as usize;
                }
                ReadSegment::Device { offset, len } => {
                    for at in (0..u64::from(len)).step_by(piece as usize) {
                        let n = piece.min(u64::from(len) - at) as u32;
                        todo.push((pos + at as usize, n, offset + at));
                    }
                    pos += len as usize;
                }
            }
        }
    }
    // All in flight together. Those the device turns away (its queue full: a read of
    // scattered blocks has one per block) go again once the others are in, as long as some
    // got through: then tags were free and are again.
    loop {
        // SAFETY: each range is inside the buffer and disjoint from every other (as
        // above); `buf` (the tag's `Arc<IoBuf>`) outlives this function, and every future
        // is awaited below before the next round or the return, so the memory stays
        // allocated and untouched by anyone else until the kernel has finished writing
        // it (the CQE).
        let reads: Vec<_> = todo
            .iter()
            .map(|&(pos, n, off)| unsafe { ring.read(buf.as_mut_ptr().add(pos), n, off) })
            .collect();
        let mut results = Vec::with_capacity(reads.len());
        for (read, &(_, n, _)) in reads.into_iter().zip(&todo) {
            results.push((read.await, u64::from(n)));
        }
        match shortfall(&results, &shared.stats, "read") {
            None => break,
            Some(HopFree::Again) => {
                let before = todo.len();
                todo = todo
                    .into_iter()
                    .zip(&results)
                    .filter(|(_, &(res, _))| res == -libc::EAGAIN)
                    .map(|(r, _)| r)
                    .collect();
                if todo.len() == before {
                    return HopFree::Again;
                }
            }
            Some(h) => return h,
        }
    }
    for (_, plan) in plans {
        plan.guard.complete();
    }
    HopFree::Done(Ok(()))
}

/// A write without a pool hop (see the module comment): every piece planned at once, for a
/// chunk with no work on the pool, written on `ring` from the tag's buffer (all in flight
/// together), then recorded and synced here. The plans' guards keep their chunks for this
/// write alone until they are completed; a failed ring write drops them uncompleted (the
/// caller redoes the write on the pool, which reports the error). A record or log write
/// that would wait for another thread (a lock held across device I/O elsewhere: a GC step,
/// a checkpoint, another thread's log write) is handed to the pool ([`Held::hand_off`]) instead,
/// so that the queue thread never blocks on it.
async fn write_hop_free<R: RingIo>(
    ring: &R,
    offset: u64,
    len: u64,
    buf: &Arc<IoBuf<u8>>,
    completion: &Arc<TagCompletion>,
    shared: &QueueShared,
) -> HopFree {
    let mut held = Held {
        dispatch: &*shared.dispatch,
        keys: Vec::new(),
        hold: shared.target.plans_hold_chunks(),
    };
    let pieces: Vec<_> = split(offset, len, shared.target.chunk_size()).collect();
    if shared.target.groups_writes() {
        // Its plans append at open zones, whose write pointers a dropped plan rewinds: the
        // whole write is one member of the group, written with one device write, which the
        // device takes all or nothing when it turns it away (one bio, `IoLimit`); its
        // chunks (two, when it crosses a chunk's end) are all held. Planned piece by piece,
        // one piece could land and the other be turned away, and the zone would then be
        // ahead of what its frontier says.
        if !pieces.iter().all(|p| held.take(p.chunk)) {
            return HopFree::NoPlan;
        }
        return write_grouped(ring, offset, len, buf, completion, shared, &mut held).await;
    }
    let mut plans: Vec<(std::ops::Range<usize>, WritePlan)> = Vec::new();
    for p in pieces {
        let start = p.buf_offset as usize;
        let at = buf.as_slice()[start..].as_ptr() as usize;
        if ring.limit().fits(std::iter::once((at, p.len))) == 0 {
            // More than the device takes in one write: it would turn it away.
            return HopFree::NoPlan;
        }
        if !held.take(p.chunk) {
            return HopFree::NoPlan;
        }
        let r = start..start + p.len as usize;
        let Some(plan) = shared
            .target
            .plan_write(p.offset, &buf.as_slice()[r.clone()])
        else {
            return HopFree::NoPlan;
        };
        plans.push((r, plan));
    }
    // Records that go to the log ahead of their data (overwrites of blocks whose records
    // are not flushed): written first, after one yield so that the other tags of the same
    // ring wait plan theirs and share that log write.
    let first: Vec<SyncToken> = plans.iter().filter_map(|(_, p)| p.sync_first).collect();
    if !first.is_empty() {
        smol::future::yield_now().await;
        if let Err(e) = sync_tokens(ring, first, &mut held, shared, completion).await {
            return HopFree::Done(Err(e));
        }
    }
    // SAFETY: each range lies inside the buffer (the pieces tile `[0, len)` of the request
    // and decode checked len <= buffer size); `buf` (the tag's `Arc<IoBuf>`) outlives this
    // function, every future is awaited below before it returns, and nothing writes the
    // buffer while the tag's request runs (the kernel filled it before the command).
    let writes: Vec<_> = plans
        .iter()
        .map(|(r, plan)| unsafe {
            ring.write(
                buf.as_slice()[r.clone()].as_ptr(),
                r.len() as u32,
                plan.device_offset,
            )
        })
        .collect();
    let mut results = Vec::with_capacity(writes.len());
    for (write, (r, _)) in writes.into_iter().zip(&plans) {
        results.push((write.await, r.len() as u64));
    }
    if let Some(h) = shortfall(&results, &shared.stats, "write") {
        return h;
    }
    let mut tokens = Vec::with_capacity(plans.len());
    let mut later = Vec::new();
    {
        // A record may commit the log when its half is full, which needs the log writer:
        // behind the gate, unless the target says it never does (the gate is held across
        // this thread's log writes, and a plan keeps what it holds until completed).
        let _g = match plans.iter().any(|(_, p)| p.guard.needs_log_writer()) {
            true => Some(ring.log_gate().lock().await),
            false => None,
        };
        for (r, plan) in plans {
            match plan.guard.try_complete(&buf.as_slice()[r.clone()]) {
                Ok(Ok(t)) => tokens.push(t),
                Ok(Err(e)) => return HopFree::Done(Err(e)),
                Err(guard) => later.push((r, guard)),
            }
        }
    }
    if !later.is_empty() {
        // Recorded and synced on the pool, where waiting for the lock costs no other tag.
        let b = buf.clone();
        let done = held
            .hand_off(shared, completion, move |t| {
                for (r, guard) in later {
                    tokens.push(guard.complete(&b.as_slice()[r])?);
                }
                tokens.into_iter().try_for_each(|tok| t.sync(tok))
            })
            .await;
        return HopFree::Done(done);
    }
    // Let the other tags whose writes completed in the same ring wait append their records
    // first: the first sync below then writes them all, and theirs find it done.
    smol::future::yield_now().await;
    HopFree::Done(sync_tokens(ring, tokens, &mut held, shared, completion).await)
}

/// The chunks of a hop-free write, which had no work on the pool when it was planned. With
/// `hold` ([`BlockTarget::plans_hold_chunks`]) they are held there ([`Dispatch::hold`])
/// until the write is recorded and synced: a request of those chunks queued meanwhile
/// waits on the pool until they are released, so that it never overtakes the write, nor
/// waits for it on a worker while the write's own hand-off job is queued behind it.
/// Released on drop (or by the hand-off job).
pub(crate) struct Held<'a> {
    dispatch: &'a dyn Dispatch,
    keys: Vec<u64>,
    hold: bool,
}

impl Held<'_> {
    /// Take `key` too (already taken by this write: nothing to do); false if it has work.
    fn take(&mut self, key: u64) -> bool {
        if self.keys.contains(&key) {
            return true;
        }
        let ok = match self.hold {
            true => self.dispatch.hold(key),
            false => !self.dispatch.has_work(key),
        };
        if ok {
            self.keys.push(key);
        }
        ok
    }

    /// Run `f` off the queue thread and wait for it without blocking it. With `hold`, on the
    /// hand-off thread ([`handoff_runner`]), the chunks staying held until it is done;
    /// without, on the pool, on a key of its own ([`handoff_key`]), not the chunk's: `f` needs no chunk
    /// order, and behind a request of the chunk it could deadlock (a v2 plan holds its
    /// chunk's lock until completed, and a hand-off of its `sync_first` runs before that:
    /// a write of the chunk queued on the pool meanwhile waits for that lock on a worker,
    /// and a job queued behind it on the same key would never run; xfstests' generic/127
    /// hung so).
    pub(crate) async fn hand_off(
        &mut self,
        shared: &QueueShared,
        completion: &Arc<TagCompletion>,
        f: impl FnOnce(&dyn BlockTarget) -> Result<(), i32> + Send + 'static,
    ) -> Result<(), i32> {
        shared
            .stats
            .hop_free_handoffs
            .fetch_add(1, Ordering::Relaxed);
        let keys = std::mem::take(&mut self.keys);
        if keys.is_empty() {
            return f(&*shared.target);
        }
        completion.arm(1);
        let (t, c, d) = (
            shared.target.clone(),
            completion.clone(),
            shared.dispatch.clone(),
        );
        let hold = self.hold;
        let job: Job = Box::new(move || {
            let result = f(&*t);
            if hold {
                // The chunks stay held until the job is done: their queued jobs run after it.
                for k in keys {
                    d.release(k, None);
                }
            }
            c.complete(result)
        });
        match hold {
            true => handoff_runner(job),
            false => self.dispatch.queue(handoff_key(completion), job),
        }
        completion.wait().await
    }
}

/// Run a hand-off of held chunks on the hand-off thread, outside the pool. On the pool it
/// could wait for good: the log layout's pool writes block for a frontier's turn, a planned
/// write holds its turn until its hand-off completes it, and once every worker the pool
/// group may run is such a blocked write, a hand-off queued behind them never runs
/// (tests/vm/log-handoff-stall.sh). The thread waits on its channel between jobs and
/// is started at the first hand-off.
fn handoff_runner(job: Job) {
    static RUNNER: std::sync::OnceLock<std::sync::mpsc::Sender<Job>> = std::sync::OnceLock::new();
    let tx = RUNNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("zonedd-handoff".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            });
        if let Err(e) = spawned {
            // The receiver went with the closure: every send fails and runs its job below.
            tracing::error!("cannot start the hand-off thread ({e}): hand-offs run inline");
        }
        tx
    });
    if let Err(e) = tx.send(job) {
        // No hand-off thread (it could not start, or a job panicked on it): run the job
        // here, blocking this queue thread for once rather than never completing it.
        (e.0)();
    }
}

/// Pool keys of hand-off jobs of targets that hold no chunks ([`Held::hand_off`]): bit 63
/// set (chunk keys are chunk numbers, far below it), and the tag's completion's address,
/// so that the request's job has a key no other job in flight uses.
const HANDOFF_KEYS: u64 = 1 << 63;

fn handoff_key(completion: &Arc<TagCompletion>) -> u64 {
    HANDOFF_KEYS | Arc::as_ptr(completion) as usize as u64
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.hold {
            for &k in &self.keys {
                self.dispatch.release(k, None);
            }
        }
    }
}

/// Sync `tokens` on this thread's ring ([`sync_on_ring`]); from the first one whose log
/// writer another thread holds, the rest is synced on the pool ([`Held::hand_off`]).
pub(crate) async fn sync_tokens<R: RingIo>(
    ring: &R,
    tokens: Vec<SyncToken>,
    held: &mut Held<'_>,
    shared: &QueueShared,
    completion: &Arc<TagCompletion>,
) -> Result<(), i32> {
    for (i, &t) in tokens.iter().enumerate() {
        if !sync_on_ring(ring, t, shared).await? {
            let rest = tokens[i..].to_vec();
            return held
                .hand_off(shared, completion, move |target| {
                    rest.into_iter().try_for_each(|t| target.sync(t))
                })
                .await;
        }
    }
    Ok(())
}

/// [`BlockTarget::sync`] with the log blocks written on `ring` when the target gives them
/// ([`BlockTarget::plan_sync`]), so that the queue thread serves other tags while they are
/// in flight; behind the thread's log gate, held until they are written. False, with
/// nothing done, when another thread is writing the log (the blocking sync would wait for
/// it).
async fn sync_on_ring<R: RingIo>(
    ring: &R,
    token: SyncToken,
    shared: &QueueShared,
) -> Result<bool, i32> {
    let _g = ring.log_gate().lock().await;
    let log = match shared.target.plan_sync(token)? {
        SyncPlan::Done => return Ok(true),
        SyncPlan::Busy => return Ok(false),
        SyncPlan::Write(log) => log,
    };
    write_log(ring, log, &shared.stats).await.map(|()| true)
}

/// A flush on this thread, behind its log gate (never while this thread's own log write is
/// in flight: it holds the target's log writer). With a ring and a target that plans it
/// ([`BlockTarget::plan_flush`]), its log writes and device flushes go on the ring, so
/// that the thread serves other tags meanwhile; otherwise [`BlockTarget::flush`] blocks
/// the thread until it is done. `ring_flushes` off: always the latter.
async fn flush<R: RingIo>(ring: Option<&R>, shared: &QueueShared) -> Result<(), i32> {
    let Some(ring) = ring else {
        return shared.target.flush();
    };
    let _g = ring.log_gate().lock().await;
    let plan = match shared.ring_flushes {
        true => shared.target.plan_flush(),
        false => None,
    };
    let Some(mut plan) = plan else {
        return shared.target.flush();
    };
    shared.stats.ring_flushes.fetch_add(1, Ordering::Relaxed);
    loop {
        match plan.step()? {
            FlushStep::Log(log) => write_log(ring, log, &shared.stats).await?,
            FlushStep::Device => {
                let res = ring.fsync().await;
                plan.device_flushed(if res < 0 { Err(-res) } else { Ok(()) })?;
            }
            FlushStep::Done => return Ok(()),
        }
    }
}

/// Write a target's log blocks on `ring`, then complete the log write with the result.
async fn write_log<R: RingIo>(
    ring: &R,
    log: Box<dyn LogWriteGuard>,
    stats: &IoStats,
) -> Result<(), i32> {
    // A 4096-aligned copy of the blocks (the fd may be O_DIRECT).
    let (buf, offsets) = {
        let blocks = log.blocks();
        let buf = IoBuf::<u8>::new(blocks.len().max(1) * 4096);
        let mut offsets = Vec::with_capacity(blocks.len());
        for (i, (off, data)) in blocks.into_iter().enumerate() {
            let n = data.len().min(4096);
            // SAFETY: block `i` of `buf` (4096 bytes, inside its length) is written from
            // `data` (at least `n` bytes), and nothing else uses `buf` yet.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), buf.as_mut_ptr().add(i * 4096), n)
            };
            offsets.push((off, n));
        }
        (buf, offsets)
    };
    // SAFETY: each range is a block of `buf`, which lives until every future is awaited
    // below, and nothing writes it meanwhile.
    let writes: Vec<_> = offsets
        .iter()
        .enumerate()
        .map(|(i, &(off, n))| unsafe {
            ring.write(buf.as_slice()[i * 4096..].as_ptr(), n as u32, off)
        })
        .collect();
    let mut result = Ok(());
    for (i, (write, &(off, n))) in writes.into_iter().zip(&offsets).enumerate() {
        let mut res = write.await;
        if res == -libc::EAGAIN {
            // Turned away at once (see `RingIo`): a log block has no pool to go to, so
            // this once the thread writes it itself, waiting for the device.
            stats.ring_again.fetch_add(1, Ordering::Relaxed);
            // SAFETY: block `i` of `buf`, which lives until the end of this function.
            res =
                unsafe { ring.write_blocking(buf.as_slice()[i * 4096..].as_ptr(), n as u32, off) };
        }
        if res != n as i32 && result.is_ok() {
            result = Err(if res < 0 { -res } else { libc::EIO });
        }
    }
    log.complete(result)
}

/// The result to commit to the kernel: bytes done, or a negative errno.
fn finish(req: Request, result: Result<(), i32>, shared: &QueueShared) -> i32 {
    match result {
        Ok(()) => req.success_result(),
        Err(errno) => {
            let errno = errno_or_eio(errno);
            shared.stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("{req:?} failed: errno {errno}");
            -errno
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InlineDispatch, MemTarget, SyncToken};
    use std::sync::Mutex;

    /// Runs jobs on spawned threads and records the keys, to check splitting and keying.
    struct Threads(Mutex<Vec<u64>>);
    impl Dispatch for Threads {
        fn queue(&self, key: u64, job: Job) {
            self.0.lock().unwrap().push(key);
            std::thread::spawn(job);
        }
    }

    fn shared(d: Arc<dyn Dispatch>, hop_free: bool) -> QueueShared {
        QueueShared {
            target: Arc::new(MemTarget::new(4 << 20, 1 << 20)),
            dispatch: d,
            stats: Arc::new(IoStats::default()),
            hop_free_reads: hop_free,
            hop_free_writes: hop_free,
            ring_flushes: hop_free,
            linked_reads: LinkedReads::Alone,
        }
    }

    /// A write across a chunk end, read back, then a flush: through the pool (`hop_free`
    /// off: one job per piece, keyed by its chunk) or, since a [`MemTarget`] never blocks,
    /// on the calling (queue) thread with nothing queued at all.
    fn split_write_then_read_back(hop_free: bool) -> (Vec<u64>, IoStatsSnapshot) {
        let d = Arc::new(Threads(Mutex::new(Vec::new())));
        let sh = shared(d.clone(), hop_free);
        let k = Arc::new(Kicker::new().unwrap());
        let c = Arc::new(TagCompletion::new(k));
        let buf = Arc::new(IoBuf::<u8>::new(512 << 10));
        let off = (1 << 20) - 8192;
        // SAFETY: nothing else uses the buffer yet.
        let b = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr(), 16384) };
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i / 4096) as u8 + 1;
        }
        let w = Request::Write {
            offset: off,
            len: 16384,
            fua: true,
        };
        assert_eq!(smol::block_on(execute(w, &buf, &c, &sh)), 16384);
        b.fill(0);
        let r = Request::Read {
            offset: off,
            len: 16384,
        };
        assert_eq!(smol::block_on(execute(r, &buf, &c, &sh)), 16384);
        for (i, x) in b.iter().enumerate() {
            assert_eq!(*x, (i / 4096) as u8 + 1);
        }
        assert_eq!(smol::block_on(execute(Request::Flush, &buf, &c, &sh)), 0);
        let s = sh.stats.snapshot();
        assert_eq!(
            (s.writes, s.reads, s.flushes, s.fua_writes, s.split_requests),
            (1, 1, 1, 1, 2)
        );
        let keys = d.0.lock().unwrap().clone();
        (keys, s)
    }

    #[test]
    fn split_write_then_read_back_across_chunks_through_the_pool() {
        let (keys, s) = split_write_then_read_back(false);
        // One job per piece; the flush ran on the calling (queue) thread.
        assert_eq!(keys, vec![0, 1, 0, 1]);
        assert_eq!(
            (s.hop_free_writes, s.hop_free_reads, s.pool_reads),
            (0, 0, 1)
        );
    }

    #[test]
    fn a_target_that_never_blocks_is_served_on_the_queue_thread() {
        let (keys, s) = split_write_then_read_back(true);
        assert_eq!(keys, Vec::<u64>::new(), "nothing went to the pool");
        assert_eq!(
            (s.hop_free_writes, s.hop_free_reads, s.pool_reads),
            (1, 1, 0)
        );
    }

    /// Records the calls; the data goes to a [`MemTarget`].
    struct Recording {
        mem: MemTarget,
        calls: Mutex<Vec<String>>,
    }
    impl Recording {
        fn note(&self, s: String) {
            self.calls.lock().unwrap().push(s);
        }
    }
    impl BlockTarget for Recording {
        fn capacity(&self) -> u64 {
            self.mem.capacity()
        }
        fn chunk_size(&self) -> u64 {
            self.mem.chunk_size()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
            self.mem.read(offset, buf)
        }
        fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), i32> {
            panic!("the frontend writes in two steps")
        }
        fn write_unsynced(&self, offset: u64, buf: &[u8], fua: bool) -> Result<SyncToken, i32> {
            self.note(format!("write {offset}"));
            self.mem.write(offset, buf, fua)?;
            Ok(SyncToken(offset + 1))
        }
        fn sync(&self, t: SyncToken) -> Result<(), i32> {
            self.note(format!("sync {}", t.0 - 1));
            Ok(())
        }
        fn discard(&self, _: u64, _: u64) -> Result<(), i32> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64) -> Result<(), i32> {
            Ok(())
        }
        fn flush(&self) -> Result<(), i32> {
            Ok(())
        }
    }

    /// A pool stand-in: jobs wait until the test runs them as one batch, then what they
    /// deferred.
    #[derive(Default)]
    struct OneBatch {
        queued: Mutex<Vec<Job>>,
        cv: std::sync::Condvar,
        deferred: Mutex<Option<Vec<Job>>>,
    }
    impl Dispatch for OneBatch {
        fn queue(&self, _: u64, job: Job) {
            self.queued.lock().unwrap().push(job);
            self.cv.notify_all();
        }
        fn defer(&self, job: Job) {
            let mut d = self.deferred.lock().unwrap();
            match d.as_mut() {
                Some(v) => v.push(job),
                None => {
                    drop(d);
                    job()
                }
            }
        }
    }

    /// Group commit: the writes of one batch are written first, and synced (then
    /// acknowledged) at the batch's end, each with its own token.
    #[test]
    fn writes_of_a_batch_are_synced_after_the_batch() {
        let target = Arc::new(Recording {
            mem: MemTarget::new(4 << 20, 1 << 20),
            calls: Mutex::default(),
        });
        let d = Arc::new(OneBatch::default());
        let sh = Arc::new(QueueShared {
            target: target.clone(),
            dispatch: d.clone(),
            stats: Arc::new(IoStats::default()),
            hop_free_reads: true,
            hop_free_writes: true,
            ring_flushes: true,
            linked_reads: LinkedReads::Alone,
        });
        let writers: Vec<_> = (0..3u64)
            .map(|i| {
                let sh = sh.clone();
                std::thread::spawn(move || {
                    let c = Arc::new(TagCompletion::new(Arc::new(Kicker::new().unwrap())));
                    let buf = Arc::new(IoBuf::<u8>::new(4096));
                    // SAFETY: nothing else uses the buffer yet.
                    unsafe { std::ptr::write_bytes(buf.as_mut_ptr(), i as u8 + 1, 4096) };
                    let w = Request::Write {
                        offset: i * 4096,
                        len: 4096,
                        fua: false,
                    };
                    smol::block_on(execute(w, &buf, &c, &sh))
                })
            })
            .collect();
        let jobs = {
            let mut q = d.queued.lock().unwrap();
            while q.len() < 3 {
                q = d.cv.wait(q).unwrap();
            }
            std::mem::take(&mut *q)
        };
        *d.deferred.lock().unwrap() = Some(Vec::new());
        for job in jobs {
            job();
        }
        let deferred = d.deferred.lock().unwrap().take().unwrap();
        assert_eq!(
            deferred.len(),
            3,
            "each write left its sync for the batch's end"
        );
        assert!(
            target
                .calls
                .lock()
                .unwrap()
                .iter()
                .all(|c| c.starts_with("write")),
            "nothing synced before the batch ended"
        );
        for job in deferred {
            job();
        }
        for w in writers {
            assert_eq!(w.join().unwrap(), 4096);
        }
        let calls = target.calls.lock().unwrap().clone();
        let (writes, syncs) = calls.split_at(3);
        let mut writes = writes.to_vec();
        writes.sort();
        assert_eq!(writes, ["write 0", "write 4096", "write 8192"]);
        let want_syncs: Vec<_> = calls[..3]
            .iter()
            .map(|c| c.replace("write", "sync"))
            .collect();
        assert_eq!(
            syncs,
            &want_syncs[..],
            "synced in the batch's order, each its own token"
        );
        let mut r = vec![0u8; 3 * 4096];
        target.read(0, &mut r).unwrap();
        for (i, b) in r.chunks(4096).enumerate() {
            assert!(b.iter().all(|&x| x == i as u8 + 1), "block {i}");
        }
    }

    struct Failing;
    impl BlockTarget for Failing {
        fn capacity(&self) -> u64 {
            1 << 20
        }
        fn chunk_size(&self) -> u64 {
            1 << 16
        }
        fn read(&self, _: u64, _: &mut [u8]) -> Result<(), i32> {
            Err(libc::EIO)
        }
        fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), i32> {
            Err(libc::ENOSPC)
        }
        fn discard(&self, _: u64, _: u64) -> Result<(), i32> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64) -> Result<(), i32> {
            Ok(())
        }
        fn flush(&self) -> Result<(), i32> {
            Err(libc::EIO)
        }
    }

    #[test]
    fn target_errors_become_negative_errnos() {
        let sh = QueueShared {
            target: Arc::new(Failing),
            dispatch: Arc::new(InlineDispatch),
            stats: Arc::new(IoStats::default()),
            hop_free_reads: true,
            hop_free_writes: true,
            ring_flushes: true,
            linked_reads: LinkedReads::Alone,
        };
        let c = Arc::new(TagCompletion::new(Arc::new(Kicker::new().unwrap())));
        let buf = Arc::new(IoBuf::<u8>::new(1 << 16));
        let w = Request::Write {
            offset: 0,
            len: 4096,
            fua: false,
        };
        assert_eq!(smol::block_on(execute(w, &buf, &c, &sh)), -libc::ENOSPC);
        let r = Request::Read {
            offset: 0,
            len: 4096,
        };
        assert_eq!(smol::block_on(execute(r, &buf, &c, &sh)), -libc::EIO);
        assert_eq!(
            smol::block_on(execute(Request::Flush, &buf, &c, &sh)),
            -libc::EIO
        );
        let d = Request::Discard {
            offset: 0,
            len: 1 << 18,
        };
        assert_eq!(smol::block_on(execute(d, &buf, &c, &sh)), 0);
        assert_eq!(sh.stats.snapshot().errors, 3);
    }

    /// A read-only target over a file whose every third 4 KiB block is zeros: the pool path
    /// reads the file, plans name the file's ranges and zero-fill the zero blocks.
    struct FileTarget {
        file: std::fs::File,
        _dir: tempfile::TempDir,
        plans: std::sync::atomic::AtomicBool,
        completed: Arc<AtomicU64>,
    }

    const FT_CHUNK: u64 = 64 << 10;

    impl FileTarget {
        fn new() -> FileTarget {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("data");
            let mut data = vec![0u8; 16 * FT_CHUNK as usize];
            for (i, b) in data.chunks_mut(4096).enumerate() {
                if i % 3 != 2 {
                    b.fill((i % 251) as u8 + 1);
                }
            }
            std::fs::write(&path, &data).unwrap();
            FileTarget {
                file: std::fs::File::open(&path).unwrap(),
                _dir: dir,
                plans: true.into(),
                completed: Arc::default(),
            }
        }
        fn want(&self, offset: u64, len: u64) -> Vec<u8> {
            use std::os::unix::fs::FileExt;
            let mut v = vec![0u8; len as usize];
            self.file.read_exact_at(&mut v, offset).unwrap();
            v
        }
    }

    struct Counted(Arc<AtomicU64>);
    impl crate::PlanGuard for Counted {
        fn complete(self: Box<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    impl BlockTarget for FileTarget {
        fn capacity(&self) -> u64 {
            16 * FT_CHUNK
        }
        fn chunk_size(&self) -> u64 {
            FT_CHUNK
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
            use std::os::unix::fs::FileExt;
            self.file.read_exact_at(buf, offset).map_err(|_| libc::EIO)
        }
        fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), i32> {
            Err(libc::EROFS)
        }
        fn discard(&self, _: u64, _: u64) -> Result<(), i32> {
            Err(libc::EROFS)
        }
        fn write_zeroes(&self, _: u64, _: u64) -> Result<(), i32> {
            Err(libc::EROFS)
        }
        fn flush(&self) -> Result<(), i32> {
            Ok(())
        }
        fn read_fd(&self) -> Option<std::os::fd::RawFd> {
            use std::os::fd::AsRawFd;
            Some(self.file.as_raw_fd())
        }
        fn plan_read(&self, offset: u64, len: u64) -> Option<crate::ReadPlan> {
            assert_eq!(
                offset / FT_CHUNK,
                (offset + len - 1) / FT_CHUNK,
                "one chunk"
            );
            if !self.plans.load(Ordering::Relaxed) {
                return None;
            }
            let mut segments: Vec<ReadSegment> = Vec::new();
            for b in (offset..offset + len).step_by(4096) {
                let zero = (b / 4096) % 3 == 2;
                match (segments.last_mut(), zero) {
                    (Some(ReadSegment::Zeros { len }), true) => *len += 4096,
                    (Some(ReadSegment::Device { len, .. }), false) => *len += 4096,
                    (_, true) => segments.push(ReadSegment::Zeros { len: 4096 }),
                    (_, false) => segments.push(ReadSegment::Device {
                        offset: b,
                        len: 4096,
                    }),
                }
            }
            Some(crate::ReadPlan {
                segments,
                guard: Box::new(Counted(self.completed.clone())),
            })
        }
    }

    /// "Ring" reads and writes done at once with pread and pwrite; one at `fail_at` fails
    /// with `errno` (EIO unless [`PreadRing::failing_with`]), except a `write_blocking`.
    /// `PreadRing::fail_at` for a ring whose fsync fails.
    const FSYNC_FAILS: u64 = u64::MAX;

    struct PreadRing {
        fd: std::os::fd::RawFd,
        fail_at: Option<u64>,
        errno: i32,
        reads: std::cell::Cell<u32>,
        fsyncs: std::cell::Cell<u32>,
        gate: smol::lock::Mutex<()>,
        groups: WriteGroups,
        /// Vectored writes made (write groups).
        writevs: std::cell::Cell<u32>,
        /// Writes made with `write_blocking`.
        waited: std::cell::Cell<u32>,
        limit: IoLimit,
        /// How many more times the I/O at `fail_at` fails (`None`: always).
        fails_left: std::cell::Cell<Option<u32>>,
    }

    impl PreadRing {
        /// A ring over `fd`; its I/O at byte `fail_at` fails (`FSYNC_FAILS`: its fsyncs).
        fn new(fd: std::os::fd::RawFd, fail_at: Option<u64>) -> Self {
            PreadRing {
                fd,
                fail_at,
                errno: libc::EIO,
                reads: 0.into(),
                fsyncs: 0.into(),
                gate: Default::default(),
                groups: WriteGroups::default(),
                writevs: 0.into(),
                waited: 0.into(),
                limit: IoLimit::default(),
                fails_left: None.into(),
            }
        }

        /// The I/O at `fail_at` fails `n` times only.
        fn failing_times(self, n: u32) -> Self {
            self.fails_left.set(Some(n));
            self
        }

        /// Whether the I/O at `offset` fails now.
        fn fails(&self, offset: u64) -> bool {
            if self.fail_at != Some(offset) {
                return false;
            }
            match self.fails_left.get() {
                None => true,
                Some(0) => false,
                Some(n) => {
                    self.fails_left.set(Some(n - 1));
                    true
                }
            }
        }

        /// The I/O at `fail_at` fails with `errno` (EAGAIN: as a device that turns it away).
        fn failing_with(self, errno: i32) -> Self {
            PreadRing { errno, ..self }
        }

        /// Its reads and writes carry at most `limit`.
        fn limited(self, limit: IoLimit) -> Self {
            PreadRing { limit, ..self }
        }
    }

    impl RingIo for PreadRing {
        type Fut = std::future::Ready<i32>;
        unsafe fn read(&self, ptr: *mut u8, len: u32, offset: u64) -> Self::Fut {
            self.reads.set(self.reads.get() + 1);
            if self.fails(offset) {
                return std::future::ready(-self.errno);
            }
            // SAFETY: the caller guarantees `ptr..ptr + len` is valid and ours until the
            // future completes (it is complete when returned).
            let n = unsafe { libc::pread(self.fd, ptr.cast(), len as usize, offset as i64) };
            std::future::ready(if n < 0 { -libc::EIO } else { n as i32 })
        }
        unsafe fn write(&self, ptr: *const u8, len: u32, offset: u64) -> Self::Fut {
            if self.fails(offset) {
                return std::future::ready(-self.errno);
            }
            // SAFETY: as for `read`: `ptr..ptr + len` is valid until the future completes.
            let n = unsafe { libc::pwrite(self.fd, ptr.cast(), len as usize, offset as i64) };
            std::future::ready(if n < 0 { -libc::EIO } else { n as i32 })
        }
        unsafe fn write_blocking(&self, ptr: *const u8, len: u32, offset: u64) -> i32 {
            self.waited.set(self.waited.get() + 1);
            super::pwrite(self.fd, ptr, len, offset)
        }
        unsafe fn writev(&self, iov: *const libc::iovec, n: u32, offset: u64) -> Self::Fut {
            self.writevs.set(self.writevs.get() + 1);
            if self.fails(offset) {
                return std::future::ready(-self.errno);
            }
            // SAFETY: the caller guarantees `iov[..n]` and its buffers are valid until the
            // future completes (it is complete when returned).
            let n = unsafe { libc::pwritev(self.fd, iov, n as i32, offset as i64) };
            std::future::ready(if n < 0 { -libc::EIO } else { n as i32 })
        }
        fn fsync(&self) -> Self::Fut {
            self.fsyncs.set(self.fsyncs.get() + 1);
            if self.fail_at == Some(FSYNC_FAILS) {
                return std::future::ready(-libc::EIO);
            }
            // SAFETY: plain syscall on an fd the test keeps open.
            let r = unsafe { libc::fdatasync(self.fd) };
            std::future::ready(if r < 0 { -libc::EIO } else { 0 })
        }
        fn log_gate(&self) -> &smol::lock::Mutex<()> {
            &self.gate
        }
        fn write_groups(&self) -> &WriteGroups {
            &self.groups
        }
        fn limit(&self) -> IoLimit {
            self.limit
        }
    }

    fn file_shared(t: Arc<FileTarget>, d: Arc<Threads>, hop_free: bool) -> QueueShared {
        QueueShared {
            target: t,
            dispatch: d,
            stats: Arc::new(IoStats::default()),
            hop_free_reads: hop_free,
            hop_free_writes: hop_free,
            ring_flushes: hop_free,
            linked_reads: LinkedReads::Alone,
        }
    }

    /// A file target, its pool (threads that record the keys) and hop-free reads on.
    fn read_setup() -> (Arc<FileTarget>, Arc<Threads>, QueueShared) {
        let t = Arc::new(FileTarget::new());
        let d = Arc::new(Threads(Mutex::new(Vec::new())));
        let sh = file_shared(t.clone(), d.clone(), true);
        (t, d, sh)
    }

    /// Read `len` at `off` through `execute_with` and check the data against the file.
    fn read_via(sh: &QueueShared, t: &FileTarget, ring: &PreadRing, off: u64, len: u64) {
        let c = Arc::new(TagCompletion::new(Arc::new(Kicker::new().unwrap())));
        let buf = Arc::new(IoBuf::<u8>::new(512 << 10));
        // Garbage first: zero segments must be filled, not left as they were.
        // SAFETY: nothing else uses the buffer yet.
        unsafe { std::ptr::write_bytes(buf.as_mut_ptr(), 0xee, 512 << 10) };
        let r = Request::Read { offset: off, len };
        let res = smol::block_on(execute_with(r, &buf, &c, sh, Some(ring)));
        assert_eq!(res, len as i32);
        assert!(
            buf.as_slice()[..len as usize] == t.want(off, len)[..],
            "data at {off}+{len}"
        );
    }

    #[test]
    fn planned_reads_go_hop_free_into_the_buffer() {
        let (t, d, sh) = read_setup();
        let ring = PreadRing::new(t.read_fd().unwrap(), None);
        // Two pieces (a chunk end inside), zero blocks among them.
        read_via(&sh, &t, &ring, FT_CHUNK - 5 * 4096, 12 * 4096);
        read_via(&sh, &t, &ring, 2 * 4096, 4096);
        let s = sh.stats.snapshot();
        assert_eq!((s.reads, s.hop_free_reads, s.pool_reads), (2, 2, 0));
        assert_eq!(
            t.completed.load(Ordering::Relaxed),
            3,
            "every plan completed"
        );
        assert!(ring.reads.get() >= 4);
        assert!(d.0.lock().unwrap().is_empty(), "nothing went to the pool");
    }

    /// A device segment longer than one read may carry is read in pieces of what it may
    /// (`IoLimit::piece`), each into its place in the buffer.
    #[test]
    fn long_segments_are_read_in_pieces_the_device_takes_whole() {
        let (t, _d, sh) = read_setup();
        // Blocks 0-11: four device segments of two blocks, zeros between them.
        let ring = PreadRing::new(t.read_fd().unwrap(), None);
        read_via(&sh, &t, &ring, 0, 12 * 4096);
        assert_eq!(ring.reads.get(), 4);
        for (limit, reads) in [
            ((1, 1 << 20), 8),
            ((256, 4096), 8),
            ((256, 6144), 8),
            ((2, 1 << 20), 4),
        ] {
            let limit = IoLimit {
                pages: limit.0,
                bytes: limit.1,
            };
            let ring = PreadRing::new(t.read_fd().unwrap(), None).limited(limit);
            read_via(&sh, &t, &ring, 0, 12 * 4096);
            assert_eq!(ring.reads.get(), reads, "{limit:?}");
        }
        let s = sh.stats.snapshot();
        assert_eq!((s.hop_free_reads, s.pool_reads), (5, 0));
    }

    #[test]
    fn unplanned_or_failed_reads_go_through_the_pool() {
        let (t, d, sh) = read_setup();
        // A device read fails: the plans are dropped uncompleted, the pool redoes the read.
        let ring = PreadRing::new(t.read_fd().unwrap(), Some(FT_CHUNK));
        read_via(&sh, &t, &ring, FT_CHUNK - 4 * 4096, 8 * 4096);
        let s = sh.stats.snapshot();
        assert_eq!(
            (s.hop_free_reads, s.hop_free_retries, s.pool_reads),
            (0, 1, 1)
        );
        assert_eq!(t.completed.load(Ordering::Relaxed), 0);
        assert_eq!(*d.0.lock().unwrap(), vec![0, 1]);
        // No plan (the target could not have one at once): the pool, no ring read.
        t.plans.store(false, Ordering::Relaxed);
        let ring = PreadRing::new(t.read_fd().unwrap(), None);
        read_via(&sh, &t, &ring, 3 * FT_CHUNK, 4096);
        assert_eq!(ring.reads.get(), 0);
        assert_eq!(sh.stats.snapshot().pool_reads, 2);
        // Hop-free reads switched off: the pool even when plans are offered.
        t.plans.store(true, Ordering::Relaxed);
        let sh = file_shared(t.clone(), d.clone(), false);
        read_via(&sh, &t, &ring, 0, 4096);
        assert_eq!(ring.reads.get(), 0);
        let s = sh.stats.snapshot();
        assert_eq!((s.hop_free_reads, s.pool_reads), (0, 1));
    }

    /// A writable file target that plans writes at the same offsets of its file (unless
    /// `plans` is off) and logs, in order, each plan completed (checking that its data is
    /// on the file by then), each sync, each pool write, and each log write it has the
    /// frontend make on its ring (its block at [`LOG_OFF`] names how many records it
    /// covers; it covers every plan completed so far).
    struct WriteFile {
        file: std::fs::File,
        _dir: tempfile::TempDir,
        plans: std::sync::atomic::AtomicBool,
        log: Arc<Mutex<Vec<String>>>,
        /// Plans completed and not yet covered by a log write; plans covered.
        appended: Arc<Mutex<Vec<u64>>>,
        logged: Arc<Mutex<Vec<u64>>>,
        /// Plans have their record appended at planning, to be synced before the data.
        ahead: std::sync::atomic::AtomicBool,
        /// Flushes are planned ([`BlockTarget::plan_flush`]): rounds of (log, device flush)
        /// each (2: with a proof round).
        flush_rounds: std::sync::atomic::AtomicU32,
        /// Plans decline [`crate::WriteGuard::try_complete`] (a lock held elsewhere), and
        /// [`BlockTarget::plan_sync`] answers `Busy` (another thread writes the log).
        decline: Arc<std::sync::atomic::AtomicBool>,
        log_busy: std::sync::atomic::AtomicBool,
        /// [`BlockTarget::plans_hold_chunks`].
        hold_chunks: std::sync::atomic::AtomicBool,
    }

    /// [`WriteFile`]'s planned flush: `rounds` of a log write then a device flush.
    struct FileFlush {
        file: std::fs::File,
        log: Arc<Mutex<Vec<String>>>,
        appended: Arc<Mutex<Vec<u64>>>,
        logged: Arc<Mutex<Vec<u64>>>,
        rounds: u32,
        device_next: bool,
    }
    impl crate::FlushGuard for FileFlush {
        fn step(&mut self) -> Result<FlushStep, i32> {
            if self.device_next {
                return Ok(FlushStep::Device);
            }
            if self.rounds == 0 {
                self.log.lock().unwrap().push("flush done".into());
                return Ok(FlushStep::Done);
            }
            self.rounds -= 1;
            self.device_next = true;
            let covered = std::mem::take(&mut *self.appended.lock().unwrap());
            Ok(FlushStep::Log(Box::new(FileLog {
                file: self.file.try_clone().unwrap(),
                block: vec![covered.len() as u8; 4096],
                covered,
                log: self.log.clone(),
                logged: self.logged.clone(),
            })))
        }
        fn device_flushed(&mut self, result: Result<(), i32>) -> Result<(), i32> {
            assert!(self.device_next, "a device flush that was not asked for");
            self.device_next = false;
            self.log
                .lock()
                .unwrap()
                .push(format!("device flushed {result:?}"));
            result
        }
    }

    /// Where [`WriteFile`]'s log block goes.
    const LOG_OFF: u64 = 16 * FT_CHUNK - 4096;

    struct FileLog {
        file: std::fs::File,
        block: Vec<u8>,
        covered: Vec<u64>,
        log: Arc<Mutex<Vec<String>>>,
        logged: Arc<Mutex<Vec<u64>>>,
    }
    impl crate::LogWriteGuard for FileLog {
        fn blocks(&self) -> Vec<(u64, &[u8])> {
            vec![(LOG_OFF, &self.block[..])]
        }
        fn complete(self: Box<Self>, result: Result<(), i32>) -> Result<(), i32> {
            result?;
            assert!(
                WriteFile::at(&self.file, LOG_OFF, 4096) == self.block,
                "log write completed before its block was written"
            );
            let before_data: Vec<bool> = self
                .covered
                .iter()
                .map(|&off| WriteFile::at(&self.file, off, 4096) == vec![0u8; 4096])
                .collect();
            self.log.lock().unwrap().push(format!(
                "log {:?}, before their data {before_data:?}",
                self.covered
            ));
            self.logged.lock().unwrap().extend(&self.covered);
            Ok(())
        }
    }

    impl WriteFile {
        fn new() -> WriteFile {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("data");
            std::fs::write(&path, vec![0u8; 16 * FT_CHUNK as usize]).unwrap();
            WriteFile {
                file: std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .unwrap(),
                _dir: dir,
                plans: true.into(),
                log: Arc::default(),
                appended: Arc::default(),
                logged: Arc::default(),
                ahead: false.into(),
                flush_rounds: 0.into(),
                decline: Arc::default(),
                log_busy: false.into(),
                hold_chunks: false.into(),
            }
        }
        fn log(&self) -> Vec<String> {
            std::mem::take(&mut *self.log.lock().unwrap())
        }
        fn at(file: &std::fs::File, offset: u64, len: usize) -> Vec<u8> {
            use std::os::unix::fs::FileExt;
            let mut v = vec![0u8; len];
            file.read_exact_at(&mut v, offset).unwrap();
            v
        }
    }

    struct FileWriteGuard {
        file: std::fs::File,
        offset: u64,
        log: Arc<Mutex<Vec<String>>>,
        appended: Arc<Mutex<Vec<u64>>>,
        ahead: bool,
        decline: Arc<std::sync::atomic::AtomicBool>,
    }
    impl crate::WriteGuard for FileWriteGuard {
        fn try_complete(
            self: Box<Self>,
            data: &[u8],
        ) -> Result<Result<SyncToken, i32>, Box<dyn crate::WriteGuard + Send>> {
            if self.decline.load(Ordering::Relaxed) {
                self.log
                    .lock()
                    .unwrap()
                    .push(format!("declined {}", self.offset));
                return Err(self);
            }
            Ok(self.complete(data))
        }
        fn complete(self: Box<Self>, data: &[u8]) -> Result<SyncToken, i32> {
            assert!(
                WriteFile::at(&self.file, self.offset, data.len()) == data,
                "completed before its data was written"
            );
            self.log
                .lock()
                .unwrap()
                .push(format!("complete {}", self.offset));
            if !self.ahead {
                self.appended.lock().unwrap().push(self.offset);
            }
            // 0 is the pool writes' token (they have nothing to sync here).
            Ok(SyncToken(self.offset + 1))
        }
    }

    impl BlockTarget for WriteFile {
        fn capacity(&self) -> u64 {
            16 * FT_CHUNK
        }
        fn chunk_size(&self) -> u64 {
            FT_CHUNK
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
            buf.copy_from_slice(&WriteFile::at(&self.file, offset, buf.len()));
            Ok(())
        }
        fn write(&self, offset: u64, buf: &[u8], _: bool) -> Result<(), i32> {
            use std::os::unix::fs::FileExt;
            self.log.lock().unwrap().push(format!("pool {offset}"));
            self.file.write_all_at(buf, offset).map_err(|_| libc::EIO)
        }
        fn sync(&self, t: SyncToken) -> Result<(), i32> {
            if t.0 != 0 {
                self.log.lock().unwrap().push(format!("sync {}", t.0 - 1));
            }
            Ok(())
        }
        fn discard(&self, _: u64, _: u64) -> Result<(), i32> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64) -> Result<(), i32> {
            Ok(())
        }
        fn flush(&self) -> Result<(), i32> {
            self.log.lock().unwrap().push("flush".into());
            Ok(())
        }
        fn read_fd(&self) -> Option<std::os::fd::RawFd> {
            use std::os::fd::AsRawFd;
            Some(self.file.as_raw_fd())
        }
        fn plan_write(&self, offset: u64, data: &[u8]) -> Option<crate::WritePlan> {
            let len = data.len() as u64;
            assert_eq!(
                offset / FT_CHUNK,
                (offset + len - 1) / FT_CHUNK,
                "one chunk"
            );
            if !self.plans.load(Ordering::Relaxed) {
                return None;
            }
            let ahead = self.ahead.load(Ordering::Relaxed);
            if ahead {
                self.appended.lock().unwrap().push(offset);
            }
            Some(crate::WritePlan {
                device_offset: offset,
                sync_first: ahead.then_some(SyncToken(offset + 1)),
                guard: Box::new(FileWriteGuard {
                    file: self.file.try_clone().unwrap(),
                    offset,
                    log: self.log.clone(),
                    appended: self.appended.clone(),
                    ahead,
                    decline: self.decline.clone(),
                }),
            })
        }
        fn plans_hold_chunks(&self) -> bool {
            self.hold_chunks.load(Ordering::Relaxed)
        }
        fn plan_flush(&self) -> Option<Box<dyn crate::FlushGuard>> {
            let rounds = self.flush_rounds.load(Ordering::Relaxed);
            (rounds > 0).then(|| {
                Box::new(FileFlush {
                    file: self.file.try_clone().unwrap(),
                    log: self.log.clone(),
                    appended: self.appended.clone(),
                    logged: self.logged.clone(),
                    rounds,
                    device_next: false,
                }) as Box<dyn crate::FlushGuard>
            })
        }
        fn plan_sync(&self, t: SyncToken) -> Result<SyncPlan, i32> {
            if t.0 == 0 || self.logged.lock().unwrap().contains(&(t.0 - 1)) {
                return Ok(SyncPlan::Done);
            }
            if self.log_busy.load(Ordering::Relaxed) {
                return Ok(SyncPlan::Busy);
            }
            let covered = std::mem::take(&mut *self.appended.lock().unwrap());
            Ok(SyncPlan::Write(Box::new(FileLog {
                file: self.file.try_clone().unwrap(),
                block: vec![covered.len() as u8; 4096],
                covered,
                log: self.log.clone(),
                logged: self.logged.clone(),
            })))
        }
    }

    /// Runs jobs at once and records their keys; says the keys in `busy` have work.
    struct BusyKeys {
        busy: Mutex<Vec<u64>>,
        queued: Mutex<Vec<u64>>,
    }
    impl Dispatch for BusyKeys {
        fn queue(&self, key: u64, job: Job) {
            self.queued.lock().unwrap().push(key);
            job()
        }
        fn has_work(&self, key: u64) -> bool {
            self.busy.lock().unwrap().contains(&key)
        }
    }

    fn write_setup(hop_free: bool) -> (Arc<WriteFile>, Arc<BusyKeys>, QueueShared, PreadRing) {
        let t = Arc::new(WriteFile::new());
        let d = Arc::new(BusyKeys {
            busy: Mutex::default(),
            queued: Mutex::default(),
        });
        let sh = QueueShared {
            target: t.clone(),
            dispatch: d.clone(),
            stats: Arc::new(IoStats::default()),
            hop_free_reads: hop_free,
            hop_free_writes: hop_free,
            ring_flushes: hop_free,
            linked_reads: LinkedReads::Alone,
        };
        let ring = PreadRing::new(t.read_fd().unwrap(), None);
        (t, d, sh, ring)
    }

    /// A tag's buffer holding `len` bytes of `fill`.
    fn filled(fill: u8, len: usize) -> Arc<IoBuf<u8>> {
        let buf = Arc::new(IoBuf::<u8>::new(len));
        // SAFETY: `len` bytes, and nothing else uses the buffer yet.
        unsafe { std::ptr::write_bytes(buf.as_mut_ptr(), fill, len) };
        buf
    }

    fn write_via(sh: &QueueShared, ring: &PreadRing, off: u64, len: u64, fill: u8, fua: bool) {
        let c = Arc::new(TagCompletion::new(Arc::new(Kicker::new().unwrap())));
        let buf = filled(fill, len as usize);
        let w = Request::Write {
            offset: off,
            len,
            fua,
        };
        assert_eq!(
            smol::block_on(execute_with(w, &buf, &c, sh, Some(ring))),
            len as i32
        );
    }

    /// Two tags' planned writes (one split at a chunk end) on one queue thread's executor:
    /// written from their buffers at the planned offsets, completed only then, and their
    /// log written on the ring once, after both were completed (the yield lets the second
    /// append its record before the first writes the log), nothing on the pool.
    #[test]
    fn planned_writes_go_hop_free_and_share_their_sync() {
        let (t, d, sh, ring) = write_setup(true);
        let exe = smol::LocalExecutor::new();
        let (a, b) = (FT_CHUNK - 4096, 5 * FT_CHUNK + 8192);
        let tasks: Vec<_> = [(a, 2 * 4096u64, 0xa1u8), (b, 4096, 0xb2)]
            .into_iter()
            .map(|(off, len, fill)| {
                let (sh, ring) = (&sh, &ring);
                exe.spawn(async move {
                    let c = Arc::new(TagCompletion::new(Arc::new(Kicker::new().unwrap())));
                    let buf = filled(fill, len as usize);
                    let w = Request::Write {
                        offset: off,
                        len,
                        fua: false,
                    };
                    execute_with(w, &buf, &c, sh, Some(ring)).await
                })
            })
            .collect();
        let res = smol::block_on(exe.run(async {
            let mut v = Vec::new();
            for task in tasks {
                v.push(task.await);
            }
            v
        }));
        assert_eq!(res, [8192, 4096]);
        assert_eq!(
            t.log(),
            [
                format!("complete {a}"),
                format!("complete {}", a + 4096),
                format!("complete {b}"),
                format!(
                    "log [{a}, {}, {b}], before their data [false, false, false]",
                    a + 4096
                ),
            ],
            "one log write on the ring for every record appended"
        );
        assert_eq!(WriteFile::at(&t.file, LOG_OFF, 4096), vec![3; 4096]);
        assert_eq!(WriteFile::at(&t.file, a, 8192), vec![0xa1; 8192]);
        assert_eq!(WriteFile::at(&t.file, b, 4096), vec![0xb2; 4096]);
        let s = sh.stats.snapshot();
        assert_eq!((s.writes, s.hop_free_writes, s.split_requests), (2, 2, 1));
        assert!(
            d.queued.lock().unwrap().is_empty(),
            "nothing went to the pool"
        );
    }

    /// Writes go to the pool when their chunk has work there (they must not overtake it),
    /// when a piece has no plan, when they are FUA, when hop-free writes are off, and when
    /// the ring write fails (the plans dropped uncompleted, the pool redoes the write).
    #[test]
    fn writes_that_must_wait_go_through_the_pool() {
        let (t, d, sh, mut ring) = write_setup(true);
        let queued = |d: &BusyKeys| std::mem::take(&mut *d.queued.lock().unwrap());
        // Chunk 3 has work on the pool: a write over chunks 2 and 3 waits its turn there.
        d.busy.lock().unwrap().push(3);
        write_via(&sh, &ring, 3 * FT_CHUNK - 4096, 8192, 1, false);
        assert_eq!(queued(&d), [2, 3]);
        let pool = [
            format!("pool {}", 3 * FT_CHUNK - 4096),
            format!("pool {}", 3 * FT_CHUNK),
        ];
        assert_eq!(t.log(), pool, "no plan completed, nothing synced here");
        d.busy.lock().unwrap().clear();
        // No plan for the write.
        t.plans.store(false, Ordering::Relaxed);
        write_via(&sh, &ring, 4096, 4096, 2, false);
        assert_eq!(t.log(), ["pool 4096"]);
        t.plans.store(true, Ordering::Relaxed);
        // FUA: the pool (the engine flushes it).
        write_via(&sh, &ring, 8192, 4096, 3, true);
        assert_eq!(t.log(), ["pool 8192"]);
        // The ring write of the second piece fails.
        ring.fail_at = Some(7 * FT_CHUNK);
        write_via(&sh, &ring, 7 * FT_CHUNK - 4096, 8192, 4, false);
        let pool = [
            format!("pool {}", 7 * FT_CHUNK - 4096),
            format!("pool {}", 7 * FT_CHUNK),
        ];
        assert_eq!(t.log(), pool);
        assert_eq!(
            WriteFile::at(&t.file, 7 * FT_CHUNK - 4096, 8192),
            vec![4; 8192]
        );
        let s = sh.stats.snapshot();
        assert_eq!(
            (s.writes, s.hop_free_writes, s.hop_free_write_retries),
            (4, 0, 1)
        );
        // Hop-free writes off.
        let (t, d, sh, ring) = write_setup(false);
        write_via(&sh, &ring, 0, 4096, 5, false);
        assert_eq!(t.log(), ["pool 0"]);
        assert_eq!(queued(&d), [0]);
        assert_eq!(WriteFile::at(&t.file, 0, 4096), vec![5; 4096]);
        // A piece bigger than the device takes in one write: not tried on the ring.
        let (t, d, sh, ring) = write_setup(true);
        let ring = ring.limited(IoLimit {
            pages: 1,
            bytes: 1 << 20,
        });
        write_via(&sh, &ring, 0, 8192, 6, false);
        write_via(&sh, &ring, FT_CHUNK, 4096, 7, false);
        assert_eq!(
            t.log(),
            [
                "pool 0".to_string(),
                format!("complete {FT_CHUNK}"),
                format!("log [{FT_CHUNK}], before their data [false]")
            ]
        );
        assert_eq!(queued(&d), [0]);
        assert_eq!(WriteFile::at(&t.file, 0, 8192), vec![6; 8192]);
        assert_eq!(sh.stats.snapshot().ring_again, 0);
    }

    /// [`PreadRing`] whose writes at [`LOG_OFF`] complete only once `release` is set: a log
    /// write stays in flight while the executor runs other tags.
    struct HeldLogRing {
        inner: PreadRing,
        release: Rc<std::cell::Cell<bool>>,
    }

    struct Held(Rc<std::cell::Cell<bool>>, i32);
    impl Future for Held {
        type Output = i32;
        fn poll(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<i32> {
            if self.0.get() {
                std::task::Poll::Ready(self.1)
            } else {
                // Polled again by the test's executor until released.
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            }
        }
    }

    impl RingIo for HeldLogRing {
        type Fut = Held;
        unsafe fn read(&self, ptr: *mut u8, len: u32, offset: u64) -> Held {
            // SAFETY: the caller's guarantee, passed on.
            Held(
                Rc::new(true.into()),
                unsafe { self.inner.read(ptr, len, offset) }.into_inner(),
            )
        }
        unsafe fn write(&self, ptr: *const u8, len: u32, offset: u64) -> Held {
            // SAFETY: the caller's guarantee, passed on (the write is made at once).
            let n = unsafe { self.inner.write(ptr, len, offset) }.into_inner();
            if offset == LOG_OFF {
                Held(self.release.clone(), n)
            } else {
                Held(Rc::new(true.into()), n)
            }
        }
        unsafe fn writev(&self, iov: *const libc::iovec, n: u32, offset: u64) -> Held {
            // SAFETY: the caller's guarantee, passed on (the write is made at once).
            let n = unsafe { self.inner.writev(iov, n, offset) }.into_inner();
            Held(Rc::new(true.into()), n)
        }
        unsafe fn write_blocking(&self, ptr: *const u8, len: u32, offset: u64) -> i32 {
            // SAFETY: the caller's guarantee, passed on.
            unsafe { self.inner.write_blocking(ptr, len, offset) }
        }
        fn fsync(&self) -> Held {
            Held(Rc::new(true.into()), self.inner.fsync().into_inner())
        }
        fn log_gate(&self) -> &smol::lock::Mutex<()> {
            self.inner.log_gate()
        }
        fn write_groups(&self) -> &WriteGroups {
            self.inner.write_groups()
        }
        fn limit(&self) -> IoLimit {
            self.inner.limit()
        }
    }

    /// A flush on the queue thread waits for that thread's log write on the ring (it holds
    /// the target's log writer: a flush meanwhile would wait for itself forever).
    #[test]
    fn a_flush_waits_for_the_queue_thread_s_own_log_write() {
        let (t, _d, sh, ring) = write_setup(true);
        let release = Rc::new(std::cell::Cell::new(false));
        let ring = HeldLogRing {
            inner: ring,
            release: release.clone(),
        };
        let c1 = Arc::new(TagCompletion::new(Arc::new(Kicker::new().unwrap())));
        let c2 = Arc::new(TagCompletion::new(Arc::new(Kicker::new().unwrap())));
        let buf = filled(7, 4096);
        let exe = smol::LocalExecutor::new();
        let w = Request::Write {
            offset: 4096,
            len: 4096,
            fua: false,
        };
        let write = exe.spawn(execute_with(w, &buf, &c1, &sh, Some(&ring)));
        // Run the write until its log write is on the "ring".
        for _ in 0..100 {
            exe.try_tick();
        }
        assert_eq!(t.log(), ["complete 4096"]);
        let flush = exe.spawn(execute_with(Request::Flush, &buf, &c2, &sh, Some(&ring)));
        for _ in 0..100 {
            exe.try_tick();
        }
        assert!(
            t.log().is_empty(),
            "flushed while the log write was in flight"
        );
        release.set(true);
        let (w, f) = smol::block_on(exe.run(async { (write.await, flush.await) }));
        assert_eq!((w, f), (4096, 0));
        assert_eq!(t.log(), ["log [4096], before their data [false]", "flush"]);
    }

    /// A flush the target plans goes on the ring: each round's log write, then an
    /// fdatasync there, and never the blocking flush; with hop-free writes off, the
    /// blocking flush as before.
    #[test]
    fn a_planned_flush_goes_on_the_ring() {
        for (hop_free, rounds) in [(true, 1), (true, 2), (false, 2)] {
            let (t, _d, sh, ring) = write_setup(hop_free);
            t.flush_rounds.store(rounds, Ordering::Relaxed);
            t.plans.store(false, Ordering::Relaxed);
            write_via(&sh, &ring, 4096, 4096, 7, false);
            assert_eq!(t.log(), ["pool 4096"]);
            t.appended.lock().unwrap().push(4096);
            let c = Arc::new(TagCompletion::new(Arc::new(Kicker::new().unwrap())));
            let buf = filled(0, 4096);
            let res = smol::block_on(execute_with(Request::Flush, &buf, &c, &sh, Some(&ring)));
            assert_eq!(res, 0);
            let s = sh.stats.snapshot();
            if !hop_free {
                assert_eq!(t.log(), ["flush"]);
                assert_eq!((ring.fsyncs.get(), s.ring_flushes), (0, 0));
                continue;
            }
            let mut want = vec![
                "log [4096], before their data [false]".to_string(),
                "device flushed Ok(())".into(),
            ];
            if rounds == 2 {
                want.push("log [], before their data []".into());
                want.push("device flushed Ok(())".into());
            }
            want.push("flush done".into());
            assert_eq!(t.log(), want, "rounds {rounds}");
            assert_eq!((ring.fsyncs.get(), s.ring_flushes), (rounds, 1));
        }
    }

    /// A device flush that fails on the ring fails the flush (the target hears of it).
    #[test]
    fn a_failed_ring_fsync_fails_the_flush() {
        let (t, _d, sh, mut ring) = write_setup(true);
        t.flush_rounds.store(1, Ordering::Relaxed);
        ring.fail_at = Some(FSYNC_FAILS);
        let c = Arc::new(TagCompletion::new(Arc::new(Kicker::new().unwrap())));
        let buf = filled(0, 4096);
        let res = smol::block_on(execute_with(Request::Flush, &buf, &c, &sh, Some(&ring)));
        assert_eq!(res, -libc::EIO);
        assert_eq!(
            t.log(),
            ["log [], before their data []", "device flushed Err(5)"]
        );
    }

    /// A record that goes ahead of its data, its log writer busy: the sync is handed to the
    /// pool before the data is written, while the plan (a v2 plan: its chunk's lock) is
    /// held. The job goes on a key of its own, never the chunk's: a write of the chunk
    /// queued on the pool meanwhile waits for the plan's lock on a worker, and a job behind
    /// it on the chunk's key would never run (xfstests' generic/127 hung so in the VM; with
    /// the job on the chunk's key this test fails).
    #[test]
    fn a_sync_ahead_of_the_data_is_handed_off_on_a_key_of_its_own() {
        let (t, d, sh, ring) = write_setup(true);
        t.ahead.store(true, Ordering::Relaxed);
        t.log_busy.store(true, Ordering::Relaxed);
        write_via(&sh, &ring, 3 * FT_CHUNK + 8192, 4096, 7, false);
        let q = std::mem::take(&mut *d.queued.lock().unwrap());
        assert!(!q.is_empty(), "handed off");
        assert!(
            q.iter().all(|&k| k & HANDOFF_KEYS != 0 && k != 3),
            "hand-off jobs on keys of their own, not chunk 3's: {q:?}"
        );
        let l = t.log();
        let sync = l
            .iter()
            .position(|e| e.starts_with("sync"))
            .expect("synced");
        let complete = l
            .iter()
            .position(|e| e.starts_with("complete"))
            .expect("completed");
        assert!(
            sync < complete,
            "the record synced before the plan completes: {l:?}"
        );
        assert_eq!(
            WriteFile::at(&t.file, 3 * FT_CHUNK + 8192, 4096),
            vec![7; 4096]
        );
        assert_eq!(sh.stats.snapshot().hop_free_writes, 1);
    }

    /// A plan whose record goes ahead of its data: the log is written (on the ring) before
    /// the data, then the plan completed, and nothing is left to sync after it.
    #[test]
    fn a_record_that_goes_ahead_is_logged_before_the_data() {
        let (t, d, sh, ring) = write_setup(true);
        t.ahead.store(true, Ordering::Relaxed);
        write_via(&sh, &ring, 5 * 4096, 4096, 8, false);
        assert_eq!(
            t.log(),
            ["log [20480], before their data [true]", "complete 20480"]
        );
        assert_eq!(WriteFile::at(&t.file, 5 * 4096, 4096), vec![8; 4096]);
        assert!(d.queued.lock().unwrap().is_empty());
    }

    /// What would block the queue thread goes to the pool, after the data was written on
    /// the ring: a record the target declines to append now (`try_complete`: a lock held
    /// elsewhere) is appended and synced by a job of the write's chunk; a log writer busy
    /// on another thread (`plan_sync` answers `Busy`) makes the sync a job too. The write
    /// still counts as hop-free, and as handed off.
    #[test]
    fn what_would_block_the_queue_thread_is_handed_to_the_pool() {
        let (t, d, sh, ring) = write_setup(true);
        let queued = |d: &BusyKeys| std::mem::take(&mut *d.queued.lock().unwrap());
        // The record: declined on the queue thread, completed and synced on the pool.
        t.decline.store(true, Ordering::Relaxed);
        t.log_busy.store(true, Ordering::Relaxed);
        write_via(&sh, &ring, 2 * FT_CHUNK + 4096, 4096, 9, false);
        let own = |q: Vec<u64>| q.len() == 1 && q[0] & HANDOFF_KEYS != 0;
        assert!(
            own(queued(&d)),
            "one job, on a key of its own (no chunk held)"
        );
        assert_eq!(
            t.log(),
            [
                format!("declined {}", 2 * FT_CHUNK + 4096),
                format!("complete {}", 2 * FT_CHUNK + 4096),
                format!("sync {}", 2 * FT_CHUNK + 4096),
            ]
        );
        assert_eq!(
            WriteFile::at(&t.file, 2 * FT_CHUNK + 4096, 4096),
            vec![9; 4096]
        );
        // The sync alone: completed here, the busy log writer waited for on the pool.
        t.decline.store(false, Ordering::Relaxed);
        write_via(&sh, &ring, 4 * FT_CHUNK, 4096, 10, false);
        assert!(own(queued(&d)));
        assert_eq!(
            t.log(),
            [
                format!("complete {}", 4 * FT_CHUNK),
                format!("sync {}", 4 * FT_CHUNK),
            ]
        );
        // Neither: all on this thread, the log written on the ring.
        t.log_busy.store(false, Ordering::Relaxed);
        write_via(&sh, &ring, 6 * FT_CHUNK, 4096, 11, false);
        assert!(queued(&d).is_empty());
        let s = sh.stats.snapshot();
        assert_eq!(
            (s.writes, s.hop_free_writes, s.hop_free_handoffs),
            (3, 3, 2)
        );
        assert_eq!(WriteFile::at(&t.file, 6 * FT_CHUNK, 4096), vec![11; 4096]);
    }

    /// Holds keys like the pool: a job queued on a held key waits for its release, which
    /// runs the release's job first. Each hold is followed at once by a request of the same
    /// key (a job that logs "later request"), as when another tag's write of the chunk
    /// arrives while a hop-free write of it is in flight.
    struct HoldKeys {
        held: Mutex<Vec<u64>>,
        pending: Mutex<Vec<(u64, Job)>>,
        events: Arc<Mutex<Vec<String>>>,
    }
    impl Dispatch for HoldKeys {
        fn queue(&self, key: u64, job: Job) {
            if self.held.lock().unwrap().contains(&key) {
                self.pending.lock().unwrap().push((key, job));
            } else {
                job()
            }
        }
        fn hold(&self, key: u64) -> bool {
            self.events.lock().unwrap().push(format!("hold {key}"));
            self.held.lock().unwrap().push(key);
            let ev = self.events.clone();
            self.queue(
                key,
                Box::new(move || ev.lock().unwrap().push(format!("later request {key}"))),
            );
            true
        }
        fn release(&self, key: u64, first: Option<Job>) {
            self.events.lock().unwrap().push(format!(
                "release {key}{}",
                if first.is_some() { " with a job" } else { "" }
            ));
            self.held.lock().unwrap().retain(|&k| k != key);
            if let Some(job) = first {
                job();
            }
            let mine: Vec<Job> = {
                let mut p = self.pending.lock().unwrap();
                let (mine, rest) = std::mem::take(&mut *p)
                    .into_iter()
                    .partition(|(k, _)| *k == key);
                *p = rest;
                mine.into_iter().map(|(_, j)| j).collect()
            };
            for j in mine {
                j();
            }
        }
    }

    /// A hop-free write holds its chunks on the pool from its plan to its sync: a request
    /// of the chunk that arrives meanwhile runs after it, and after its hand-off job when
    /// it has one (which runs on the hand-off thread and releases the chunks when done,
    /// never queued behind the request: the request's job could wait on a worker for the
    /// write's record). Every hold is released, on every path.
    #[test]
    fn a_hop_free_write_holds_its_chunks_until_it_is_synced() {
        let (t, _d, mut sh, ring) = write_setup(true);
        t.hold_chunks.store(true, Ordering::Relaxed);
        let events = Arc::new(Mutex::new(Vec::new()));
        let hk = Arc::new(HoldKeys {
            held: Mutex::default(),
            pending: Mutex::default(),
            events: events.clone(),
        });
        sh.dispatch = hk.clone();
        let take = || std::mem::take(&mut *events.lock().unwrap());
        // On the thread: held until synced on the ring.
        write_via(&sh, &ring, 4 * FT_CHUNK, 4096, 1, false);
        assert_eq!(take(), ["hold 4", "release 4", "later request 4"]);
        assert_eq!(
            t.log(),
            [
                format!("complete {}", 4 * FT_CHUNK),
                format!("log [{}], before their data [false]", 4 * FT_CHUNK),
            ]
        );
        // Declined across two chunks: the hand-off job (on the hand-off thread, not the pool)
        // releases both chunks once it has completed and synced the write, so their later
        // requests run after it.
        t.decline.store(true, Ordering::Relaxed);
        write_via(&sh, &ring, 3 * FT_CHUNK - 4096, 8192, 2, false);
        assert_eq!(
            take(),
            [
                "hold 2",
                "hold 3",
                "release 2",
                "later request 2",
                "release 3",
                "later request 3",
            ]
        );
        let log = t.log();
        assert_eq!(log.len(), 6, "{log:?}");
        assert!(log[2..]
            .iter()
            .all(|l| l.starts_with("complete") || l.starts_with("sync")));
        // No plan: released at once, the write goes to the pool after the later request.
        t.decline.store(false, Ordering::Relaxed);
        t.plans.store(false, Ordering::Relaxed);
        write_via(&sh, &ring, 6 * FT_CHUNK, 4096, 3, false);
        assert_eq!(take(), ["hold 6", "release 6", "later request 6"]);
        assert_eq!(t.log(), [format!("pool {}", 6 * FT_CHUNK)]);
        assert!(hk.held.lock().unwrap().is_empty() && hk.pending.lock().unwrap().is_empty());
        // A target whose plans are completed on the queue thread: nothing held.
        t.hold_chunks.store(false, Ordering::Relaxed);
        t.plans.store(true, Ordering::Relaxed);
        write_via(&sh, &ring, 8 * FT_CHUNK, 4096, 4, false);
        assert!(take().is_empty());
        assert_eq!(WriteFile::at(&t.file, 8 * FT_CHUNK, 4096), vec![4; 4096]);
    }

    /// A log-structured file target for write groups: the logical space is the file's first
    /// half; every write lands at a cursor in its second half, a plan taking at most
    /// `room` bytes (writes that do not fit are left out), and reads follow the map that
    /// completed plans (and pool writes) keep. Logs each completion, pool write and sync.
    struct GroupFile {
        file: std::fs::File,
        _dir: tempfile::TempDir,
        cursor: Mutex<u64>,
        room: u64,
        map: Arc<Mutex<std::collections::HashMap<u64, u64>>>,
        log: Arc<Mutex<Vec<String>>>,
        decline: bool,
        tokens: Arc<std::sync::atomic::AtomicU64>,
    }

    const GF_HALF: u64 = 8 * FT_CHUNK;

    impl GroupFile {
        fn new(room: u64, decline: bool) -> GroupFile {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("data");
            std::fs::write(&path, vec![0u8; 2 * GF_HALF as usize]).unwrap();
            GroupFile {
                file: std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .unwrap(),
                _dir: dir,
                cursor: Mutex::new(GF_HALF),
                room,
                map: Arc::default(),
                log: Arc::default(),
                decline,
                tokens: Arc::default(),
            }
        }
        fn log(&self) -> Vec<String> {
            std::mem::take(&mut *self.log.lock().unwrap())
        }
    }

    struct GroupFileGuard {
        file: std::fs::File,
        at: u64,
        writes: Vec<(u64, u64)>,
        map: Arc<Mutex<std::collections::HashMap<u64, u64>>>,
        log: Arc<Mutex<Vec<String>>>,
        decline: bool,
        tokens: Arc<std::sync::atomic::AtomicU64>,
    }
    impl crate::GroupGuard for GroupFileGuard {
        fn complete(self: Box<Self>, parts: &[&[u8]]) -> Result<SyncToken, i32> {
            let all = parts.concat();
            assert!(
                WriteFile::at(&self.file, self.at, all.len()) == all,
                "completed before its data was written where it was placed"
            );
            let mut at = self.at;
            let mut map = self.map.lock().unwrap();
            for &(off, len) in &self.writes {
                for b in (0..len).step_by(4096) {
                    map.insert(off + b, at + b);
                }
                at += len;
            }
            let offs: Vec<u64> = self.writes.iter().map(|w| w.0).collect();
            self.log.lock().unwrap().push(format!("complete {offs:?}"));
            Ok(SyncToken(self.tokens.fetch_add(1, Ordering::Relaxed) + 1))
        }
        fn try_complete(
            self: Box<Self>,
            parts: &[&[u8]],
        ) -> Result<Result<SyncToken, i32>, Box<dyn crate::GroupGuard + Send>> {
            if self.decline {
                let mut g = self;
                g.decline = false;
                return Err(g);
            }
            Ok(self.complete(parts))
        }
    }

    impl BlockTarget for GroupFile {
        fn capacity(&self) -> u64 {
            GF_HALF
        }
        fn chunk_size(&self) -> u64 {
            FT_CHUNK
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
            let map = self.map.lock().unwrap();
            for (i, b) in buf.chunks_mut(4096).enumerate() {
                match map.get(&(offset + i as u64 * 4096)) {
                    Some(&at) => b.copy_from_slice(&WriteFile::at(&self.file, at, 4096)),
                    None => b.fill(0),
                }
            }
            Ok(())
        }
        fn write(&self, offset: u64, buf: &[u8], _: bool) -> Result<(), i32> {
            use std::os::unix::fs::FileExt;
            let at = {
                let mut c = self.cursor.lock().unwrap();
                *c += buf.len() as u64;
                *c - buf.len() as u64
            };
            self.file.write_all_at(buf, at).map_err(|_| libc::EIO)?;
            let mut map = self.map.lock().unwrap();
            for b in (0..buf.len() as u64).step_by(4096) {
                map.insert(offset + b, at + b);
            }
            self.log.lock().unwrap().push(format!("pool {offset}"));
            Ok(())
        }
        fn sync(&self, t: SyncToken) -> Result<(), i32> {
            if t.0 != 0 {
                self.log.lock().unwrap().push(format!("sync {}", t.0));
            }
            Ok(())
        }
        fn discard(&self, _: u64, _: u64) -> Result<(), i32> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64) -> Result<(), i32> {
            Ok(())
        }
        fn flush(&self) -> Result<(), i32> {
            Ok(())
        }
        fn read_fd(&self) -> Option<std::os::fd::RawFd> {
            use std::os::fd::AsRawFd;
            Some(self.file.as_raw_fd())
        }
        fn plan_write(&self, offset: u64, _: &[u8]) -> Option<crate::WritePlan> {
            panic!("plan_write({offset}): a write on a target that groups writes is planned in a group or not at all");
        }
        fn groups_writes(&self) -> bool {
            true
        }
        fn plan_write_group(&self, writes: &[(u64, u64)]) -> Option<crate::GroupPlan> {
            let mut cursor = self.cursor.lock().unwrap();
            let (mut placed, mut taken, mut total) = (Vec::new(), Vec::new(), 0);
            for (i, &(off, len)) in writes.iter().enumerate() {
                if total + len <= self.room {
                    placed.push(i);
                    taken.push((off, len));
                    total += len;
                }
            }
            if placed.is_empty() {
                return None;
            }
            let at = *cursor;
            *cursor += total;
            Some(crate::GroupPlan {
                device_offset: at,
                placed,
                guard: Box::new(GroupFileGuard {
                    file: self.file.try_clone().unwrap(),
                    at,
                    writes: taken,
                    map: self.map.clone(),
                    log: self.log.clone(),
                    decline: self.decline,
                    tokens: self.tokens.clone(),
                }),
            })
        }
        fn plan_sync(&self, t: SyncToken) -> Result<SyncPlan, i32> {
            self.log
                .lock()
                .unwrap()
                .push(format!("sync {} on the ring", t.0));
            Ok(SyncPlan::Done)
        }
    }

    /// The tags' writes `(offset, len, fill)` run together on one queue thread's executor
    /// with `t` as target: their results, the ring, the pool's keys and the stats.
    fn group_writes(
        t: Arc<GroupFile>,
        busy: &[u64],
        ring: PreadRing,
        writes: &[(u64, u64, u8)],
    ) -> (Vec<i32>, PreadRing, Vec<u64>, IoStatsSnapshot) {
        let d = Arc::new(BusyKeys {
            busy: Mutex::new(busy.to_vec()),
            queued: Mutex::default(),
        });
        let sh = QueueShared {
            target: t.clone(),
            dispatch: d.clone(),
            stats: Arc::new(IoStats::default()),
            hop_free_reads: true,
            hop_free_writes: true,
            ring_flushes: false,
            linked_reads: LinkedReads::Alone,
        };
        let exe = smol::LocalExecutor::new();
        let tasks: Vec<_> = writes
            .iter()
            .map(|&(offset, len, fill)| {
                let (sh, ring) = (&sh, &ring);
                exe.spawn(async move {
                    let c = Arc::new(TagCompletion::new(Arc::new(Kicker::new().unwrap())));
                    let buf = filled(fill, len as usize);
                    let w = Request::Write {
                        offset,
                        len,
                        fua: false,
                    };
                    execute_with(w, &buf, &c, sh, Some(ring)).await
                })
            })
            .collect();
        let res = smol::block_on(exe.run(async {
            let mut v = Vec::new();
            for task in tasks {
                v.push(task.await);
            }
            v
        }));
        drop(exe);
        let queued = std::mem::take(&mut *d.queued.lock().unwrap());
        (res, ring, queued, sh.stats.snapshot())
    }

    /// A ring over `t`'s file, failing at `fail_at`.
    fn ring_over(t: &GroupFile, fail_at: Option<u64>) -> PreadRing {
        PreadRing::new(t.read_fd().unwrap(), fail_at)
    }

    /// Every write reads back as written, through the target's map.
    fn reads_back(t: &GroupFile, writes: &[(u64, u64, u8)]) {
        for &(offset, len, fill) in writes {
            let mut got = vec![0u8; len as usize];
            t.read(offset, &mut got).unwrap();
            assert!(got == vec![fill; len as usize], "write at {offset} lost");
        }
    }

    /// The writes of a queue thread's tags that become ready together form one write
    /// group: planned together, each plan's data written with one vectored write (two plans
    /// here: a plan takes at most three blocks), recorded, then synced once on the ring; a
    /// write whose chunk has work on the pool goes there, and nothing else does.
    #[test]
    fn tags_writes_form_a_group_with_one_vectored_write_per_plan() {
        let t = Arc::new(GroupFile::new(3 * 4096, false));
        let writes = [
            (0, 4096, 1u8),
            (FT_CHUNK, 8192, 2),
            (2 * FT_CHUNK + 4096, 4096, 3),
            (3 * FT_CHUNK, 4096, 4),
            (5 * FT_CHUNK, 4096, 5),
        ];
        let (res, ring, queued, s) = group_writes(t.clone(), &[3], ring_over(&t, None), &writes);
        assert_eq!(res, [4096, 8192, 4096, 4096, 4096]);
        assert_eq!(ring.writevs.get(), 2, "one vectored write per plan");
        assert_eq!(
            t.log(),
            [
                format!("pool {}", 3 * FT_CHUNK),
                format!("complete [0, {FT_CHUNK}]"),
                format!("complete [{}, {}]", 2 * FT_CHUNK + 4096, 5 * FT_CHUNK),
                "sync 1 on the ring".to_string(),
                "sync 2 on the ring".to_string(),
            ],
            "the busy chunk's write on the pool; the others in two plans, synced after both"
        );
        assert_eq!(
            queued,
            [3],
            "only the write of the busy chunk went to the pool"
        );
        assert_eq!((s.writes, s.hop_free_writes), (5, 4));
        reads_back(&t, &writes);
    }

    /// A group whose vectored write fails records nothing: its writes are redone on the
    /// pool (and read back); a group whose record would wait is completed and synced by
    /// one pool job (the hand-off), after its data was written on the ring.
    #[test]
    fn a_failed_or_declined_group_finishes_on_the_pool() {
        let t = Arc::new(GroupFile::new(16 * 4096, false));
        let writes = [(0, 4096, 6u8), (FT_CHUNK, 4096, 7)];
        let (res, ring, queued, s) =
            group_writes(t.clone(), &[], ring_over(&t, Some(GF_HALF)), &writes);
        assert_eq!(res, [4096, 4096]);
        assert_eq!(ring.writevs.get(), 1);
        let (mut log, mut queued) = (t.log(), queued);
        log.sort();
        queued.sort();
        assert_eq!(log, ["pool 0".to_string(), format!("pool {FT_CHUNK}")]);
        assert_eq!(queued, [0, 1]);
        assert_eq!((s.hop_free_writes, s.hop_free_write_retries), (0, 2));
        reads_back(&t, &writes);

        let t = Arc::new(GroupFile::new(16 * 4096, true));
        let writes = [
            (0, 4096, 8u8),
            (FT_CHUNK, 8192, 9),
            (4 * FT_CHUNK, 4096, 10),
        ];
        let (res, ring, queued, s) = group_writes(t.clone(), &[], ring_over(&t, None), &writes);
        assert_eq!(res, [4096, 8192, 4096]);
        assert_eq!(ring.writevs.get(), 1);
        assert_eq!(
            t.log(),
            [
                format!("complete [0, {FT_CHUNK}, {}]", 4 * FT_CHUNK),
                "sync 1".to_string()
            ],
            "completed and synced by the pool job"
        );
        assert_eq!(queued.len(), 1, "one hand-off job");
        assert_eq!((s.hop_free_writes, s.hop_free_handoffs), (3, 1));
        reads_back(&t, &writes);
    }

    /// A group whose vectored write the device turns away (`-EAGAIN`: its queue full, or a
    /// write it would split) is no failure: its writes are redone on the pool, counted in
    /// `ring_again`, not in the retries, and read back.
    #[test]
    fn a_group_turned_away_goes_to_the_pool_without_failing() {
        let t = Arc::new(GroupFile::new(16 * 4096, false));
        let writes = [(0, 4096, 11u8), (FT_CHUNK, 8192, 12)];
        let ring = ring_over(&t, Some(GF_HALF)).failing_with(libc::EAGAIN);
        let (res, ring, mut queued, s) = group_writes(t.clone(), &[], ring, &writes);
        assert_eq!(res, [4096, 8192]);
        assert_eq!(ring.writevs.get(), 1);
        queued.sort();
        assert_eq!(queued, [0, 1], "both redone on the pool");
        assert_eq!(
            (s.hop_free_writes, s.hop_free_write_retries, s.ring_again),
            (0, 0, 1)
        );
        reads_back(&t, &writes);
    }

    /// A group offers its writes to the target in logical order, whatever order their
    /// requests came in (a stream's pieces then land one after the other); an offer the
    /// target turns down sends only its own writes to the pool, and the next is offered.
    #[test]
    fn a_group_offers_its_writes_in_logical_order_and_goes_on_after_a_refusal() {
        let t = Arc::new(GroupFile::new(16 * 4096, false));
        let writes = [
            (3 * FT_CHUNK, 4096, 21u8),
            (FT_CHUNK, 4096, 22),
            (0, 8192, 23),
        ];
        let (res, ring, queued, _) = group_writes(t.clone(), &[], ring_over(&t, None), &writes);
        assert_eq!(res, [4096, 4096, 8192]);
        assert_eq!(ring.writevs.get(), 1);
        assert!(queued.is_empty());
        let map = t.map.lock().unwrap().clone();
        assert!(
            map[&0] < map[&FT_CHUNK] && map[&FT_CHUNK] < map[&(3 * FT_CHUNK)],
            "placed out of logical order: {map:?}"
        );
        reads_back(&t, &writes);
        // Room for one block a plan, and an offer of at most two blocks: the two-block
        // write, offered first and alone, is turned down; the two others then go.
        let t = Arc::new(GroupFile::new(4096, false));
        let limit = IoLimit {
            pages: 256,
            bytes: 8192,
        };
        let ring = ring_over(&t, None).limited(limit);
        let (res, ring, queued, s) = group_writes(t.clone(), &[], ring, &writes);
        assert_eq!(res, [4096, 4096, 8192]);
        assert_eq!(ring.writevs.get(), 2, "the two later offers planned");
        assert_eq!(queued, [0], "the refused write alone on the pool");
        assert_eq!(s.hop_free_writes, 2);
        reads_back(&t, &writes);
    }

    /// On a target whose plans append (write groups), a write across a chunk's end is one
    /// member of the group, written with the others in one vectored write, its two chunks
    /// held; with either chunk busy on the pool, it goes there whole.
    #[test]
    fn a_write_of_two_pieces_on_a_grouping_target_is_one_member() {
        let t = Arc::new(GroupFile::new(16 * 4096, false));
        let writes = [(FT_CHUNK - 4096, 8192, 18u8), (4 * FT_CHUNK, 4096, 19)];
        let (res, ring, queued, s) = group_writes(t.clone(), &[], ring_over(&t, None), &writes);
        assert_eq!(res, [8192, 4096]);
        assert_eq!(ring.writevs.get(), 1, "one vectored write for the group");
        assert!(queued.is_empty(), "nothing on the pool: {queued:?}");
        assert_eq!(s.hop_free_writes, 2);
        reads_back(&t, &writes);
        for busy in [0, 1] {
            let t = Arc::new(GroupFile::new(16 * 4096, false));
            let (res, ring, mut queued, s) =
                group_writes(t.clone(), &[busy], ring_over(&t, None), &writes);
            assert_eq!(res, [8192, 4096]);
            assert_eq!(ring.writevs.get(), 1, "the other write only");
            queued.sort();
            assert_eq!(
                queued,
                [0, 1],
                "both pieces on the pool (chunk {busy} busy)"
            );
            assert_eq!(s.hop_free_writes, 1);
            reads_back(&t, &writes);
        }
    }

    /// A group offers the target no more than one vectored write may carry: by pages
    /// (each may be a segment) and by bytes; the rest go in further plans.
    #[test]
    fn a_group_carries_no_more_than_one_write_may() {
        let writes = [
            (0, 4096, 13u8),
            (FT_CHUNK, 4096, 14),
            (2 * FT_CHUNK, 4096, 15),
            (3 * FT_CHUNK, 8192, 16),
            (4 * FT_CHUNK, 4096, 17),
        ];
        for (limit, plans) in [
            (
                IoLimit {
                    pages: 2,
                    bytes: 1 << 20,
                },
                4,
            ),
            (
                IoLimit {
                    pages: 1,
                    bytes: 1 << 20,
                },
                4,
            ),
            (
                IoLimit {
                    pages: 256,
                    bytes: 8192,
                },
                4,
            ),
            (
                IoLimit {
                    pages: 256,
                    bytes: 12288,
                },
                2,
            ),
            (IoLimit::default(), 1),
        ] {
            let t = Arc::new(GroupFile::new(16 * 4096, false));
            let ring = ring_over(&t, None).limited(limit);
            let (res, ring, queued, s) = group_writes(t.clone(), &[], ring, &writes);
            assert_eq!(res, [4096, 4096, 4096, 8192, 4096]);
            assert_eq!(ring.writevs.get(), plans, "{limit:?}");
            // One page: the 8 KiB write is too big alone, and goes to the pool untried.
            let pool: &[u64] = if limit.pages == 1 { &[3] } else { &[] };
            assert_eq!(queued, pool, "on the pool ({limit:?})");
            assert_eq!(s.hop_free_writes, 5 - pool.len() as u64);
            assert_eq!(s.ring_again, 0);
            reads_back(&t, &writes);
        }
    }

    /// A read the device turns away goes to the pool, counted in `ring_again` and not as a
    /// retry; a log block it turns away is written again by a blocking pwrite, and the write is
    /// acknowledged with its log on the device.
    #[test]
    fn what_the_device_turns_away_is_redone_not_failed() {
        let (t, d, sh) = read_setup();
        let ring = PreadRing::new(t.read_fd().unwrap(), Some(FT_CHUNK)).failing_with(libc::EAGAIN);
        read_via(&sh, &t, &ring, FT_CHUNK - 4 * 4096, 8 * 4096);
        let s = sh.stats.snapshot();
        assert_eq!(
            (
                s.hop_free_reads,
                s.hop_free_retries,
                s.pool_reads,
                s.ring_again
            ),
            (0, 0, 1, 2)
        );
        assert_eq!(
            *d.0.lock().unwrap(),
            vec![0, 1],
            "turned away twice, none getting through the second time: both pieces on the pool"
        );
        // Turned away once only: read again on the ring once the others are in.
        let d = Arc::new(Threads(Mutex::new(Vec::new())));
        let sh = file_shared(t.clone(), d.clone(), true);
        let ring = PreadRing::new(t.read_fd().unwrap(), Some(FT_CHUNK))
            .failing_with(libc::EAGAIN)
            .failing_times(1);
        read_via(&sh, &t, &ring, FT_CHUNK - 4 * 4096, 8 * 4096);
        let s = sh.stats.snapshot();
        assert_eq!((s.hop_free_reads, s.pool_reads, s.ring_again), (1, 0, 1));
        assert!(d.0.lock().unwrap().is_empty(), "nothing on the pool");

        let (t, d, sh, ring) = write_setup(true);
        let ring = PreadRing {
            fail_at: Some(LOG_OFF),
            ..ring
        }
        .failing_with(libc::EAGAIN);
        write_via(&sh, &ring, 4096, 4096, 0xc3, false);
        assert_eq!(
            ring.waited.get(),
            1,
            "the log block written again, blocking"
        );
        assert_eq!(WriteFile::at(&t.file, LOG_OFF, 4096), vec![1; 4096]);
        assert_eq!(WriteFile::at(&t.file, 4096, 4096), vec![0xc3; 4096]);
        let s = sh.stats.snapshot();
        assert_eq!(
            (s.hop_free_writes, s.hop_free_write_retries, s.ring_again),
            (1, 0, 1)
        );
        assert!(d.queued.lock().unwrap().is_empty(), "nothing on the pool");
    }
}
