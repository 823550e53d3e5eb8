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
//! Flushes run on the queue thread itself. A flush is what fsync waits for, and the two
//! thread switches of a pool hop were most of its latency (fsync p50 370 -> 216 us in the
//! VM, docs/PERFORMANCE.md). Blocking the queue meanwhile costs little: a SATA disk runs a
//! cache flush as a non-queued command, stalling its other I/O anyway, and drives with a
//! protected cache make flushes near-instant. The engine orders concurrent flushes itself.

use crate::completion::{errno_or_eio, Kicker, TagCompletion};
use crate::request::{decode, split, Request};
use crate::{BlockTarget, Dispatch, Job};
use io_uring::{opcode, types};
use libublk::helpers::IoBuf;
use libublk::io::{UblkDev, UblkQueue};
use libublk::{BufDesc, UblkError};
use serde::Serialize;
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
    let exe = Rc::new(smol::LocalExecutor::new());
    let mut tasks = Vec::new();
    for tag in q.tags() {
        let q = q.clone();
        let shared = shared.clone();
        let kicker = kicker.clone();
        tasks.push(exe.spawn(async move {
            match tag_loop(&q, tag, buf_len, &shared, kicker).await {
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
) -> Result<(), UblkError> {
    let buf = Arc::new(IoBuf::<u8>::new(buf_len));
    let completion = Arc::new(TagCompletion::new(kicker));
    q.submit_io_prep_cmd(tag, BufDesc::Slice(buf.as_slice()), 0, Some(&buf))
        .await?;
    let capacity = shared.target.capacity();
    loop {
        let iod = q.get_iod(tag);
        let (op_flags, start, nr) = (iod.op_flags, iod.start_sector, iod.nr_sectors);
        let res = match decode(op_flags, start, nr, capacity, buf_len) {
            Ok(req) => execute(req, &buf, &completion, shared).await,
            Err(errno) => {
                tracing::debug!("tag {tag}: rejected op_flags {op_flags:#x} sector {start} n {nr}: errno {errno}");
                shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                -errno
            }
        };
        q.submit_io_commit_cmd(tag, BufDesc::Slice(buf.as_slice()), res)
            .await?;
    }
}

/// Run one request on the pool and wait for it: bytes done, or a negative errno.
pub async fn execute(
    req: Request,
    buf: &Arc<IoBuf<u8>>,
    completion: &Arc<TagCompletion>,
    shared: &QueueShared,
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
        return finish(req, shared.target.flush(), shared);
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
                Request::Write { fua, .. } => Box::new(move || {
                    let s = &b.as_slice()[p.buf_offset as usize..(p.buf_offset + p.len) as usize];
                    c.complete(t.write(p.offset, s, fua))
                }),
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
    use crate::{InlineDispatch, MemTarget};
    use std::sync::Mutex;

    /// Runs jobs on spawned threads and records the keys, to check splitting and keying.
    struct Threads(Mutex<Vec<u64>>);
    impl Dispatch for Threads {
        fn queue(&self, key: u64, job: Job) {
            self.0.lock().unwrap().push(key);
            std::thread::spawn(job);
        }
    }

    fn shared(d: Arc<dyn Dispatch>) -> QueueShared {
        QueueShared {
            target: Arc::new(MemTarget::new(4 << 20, 1 << 20)),
            dispatch: d,
            stats: Arc::new(IoStats::default()),
        }
    }

    #[test]
    fn split_write_then_read_back_across_chunks() {
        let d = Arc::new(Threads(Mutex::new(Vec::new())));
        let sh = shared(d.clone());
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
        assert_eq!(*d.0.lock().unwrap(), vec![0, 1]);
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
        // The flush ran on the calling (queue) thread: nothing more went to the pool.
        assert_eq!(*d.0.lock().unwrap(), vec![0, 1, 0, 1]);
        let s = sh.stats.snapshot();
        assert_eq!(
            (s.writes, s.reads, s.flushes, s.fua_writes, s.split_requests),
            (1, 1, 1, 1, 2)
        );
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
}
