//! Getting a worker's result back to the queue thread.
//!
//! A `UblkQueue` and its io_uring are bound to the queue thread, which sleeps in
//! `io_uring_enter` until a CQE arrives, so a cross-thread `Waker` alone would not wake it.
//! Each queue therefore owns a [`Kicker`] (an eventfd) with a `POLL_ADD` on it always armed
//! on the queue's own ring ([`crate::queue`] re-arms it). A request's pieces run on pool
//! workers; each reports into the tag's [`TagCompletion`]. The worker that finishes the last
//! piece wakes the tag's task (scheduling it on the queue thread's executor) and then writes
//! the eventfd: the poll completes, the queue thread leaves `io_uring_enter`, and its
//! executor runs the woken task, which commits the result to the kernel.
//! Nothing spins: an idle queue thread sleeps in the kernel, an idle tag task is parked.
//!
//! Ordering: a worker writes the request's buffer, then decrements `remaining` with
//! release semantics; the task reads `remaining` with acquire semantics before touching the
//! buffer, so it sees every byte the workers wrote.

use atomic_waker::AtomicWaker;
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// An eventfd that wakes a queue thread out of `io_uring_enter`.
#[derive(Debug)]
pub struct Kicker {
    fd: EventFd,
}

impl Kicker {
    /// A non-blocking (and close-on-exec) eventfd, so that [`Kicker::drain`] never waits.
    pub fn new() -> std::io::Result<Kicker> {
        let fd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        Ok(Kicker { fd })
    }

    /// Make the eventfd readable (the armed poll completes).
    pub fn kick(&self) {
        // A full counter (EAGAIN) still leaves it readable, which is all a kick needs.
        let _ = self.fd.write(1);
    }

    /// Reset the counter after a wakeup (non-blocking; nothing to drain is fine).
    pub fn drain(&self) -> u64 {
        self.fd.read().unwrap_or(0)
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A target's error as an errno to report: anything not positive becomes EIO.
pub fn errno_or_eio(e: i32) -> i32 {
    if e > 0 {
        e
    } else {
        libc::EIO
    }
}

/// The outstanding pieces of one tag's current request.
#[derive(Debug)]
pub struct TagCompletion {
    remaining: AtomicU32,
    /// First errno reported by a piece, 0 if none.
    errno: AtomicI32,
    waker: AtomicWaker,
    kicker: Arc<Kicker>,
}

impl TagCompletion {
    pub fn new(kicker: Arc<Kicker>) -> TagCompletion {
        TagCompletion {
            remaining: AtomicU32::new(0),
            errno: AtomicI32::new(0),
            waker: AtomicWaker::new(),
            kicker,
        }
    }

    /// Start a request of `pieces` pieces. Only the owning task calls this, and only when
    /// the previous request has completed.
    pub fn arm(&self, pieces: u32) {
        self.errno.store(0, Ordering::Relaxed);
        self.remaining.store(pieces, Ordering::Release);
    }

    /// Called once per piece, from any thread.
    pub fn complete(&self, result: Result<(), i32>) {
        if let Err(e) = result {
            let e = errno_or_eio(e);
            let _ = self
                .errno
                .compare_exchange(0, e, Ordering::Relaxed, Ordering::Relaxed);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.waker.wake();
            self.kicker.kick();
        }
    }

    /// Resolves when every piece has completed: `Err(errno)` if any failed.
    pub fn wait(&self) -> Wait<'_> {
        Wait { c: self }
    }
}

pub struct Wait<'a> {
    c: &'a TagCompletion,
}

impl Future for Wait<'_> {
    type Output = Result<(), i32>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Register first, then check: a completion racing with us either sees our waker
        // or we see its decrement.
        self.c.waker.register(cx.waker());
        if self.c.remaining.load(Ordering::Acquire) == 0 {
            match self.c.errno.load(Ordering::Relaxed) {
                0 => Poll::Ready(Ok(())),
                e => Poll::Ready(Err(e)),
            }
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;

    #[test]
    fn last_piece_wakes_and_kicks_once_with_first_error() {
        let k = Arc::new(Kicker::new().unwrap());
        let c = Arc::new(TagCompletion::new(k.clone()));
        c.arm(3);
        let workers: Vec<_> = [Ok(()), Err(libc::ENOSPC), Ok(())]
            .into_iter()
            .map(|r| {
                let c = c.clone();
                std::thread::spawn(move || c.complete(r))
            })
            .collect();
        let res = smol::block_on(c.wait());
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(res, Err(libc::ENOSPC));
        // exactly one kick for the whole request
        assert_eq!(k.drain(), 1);
        assert_eq!(k.drain(), 0);
    }

    #[test]
    fn rearm_clears_previous_error() {
        let k = Arc::new(Kicker::new().unwrap());
        let c = TagCompletion::new(k);
        c.arm(1);
        c.complete(Err(-5));
        assert_eq!(smol::block_on(c.wait()), Err(libc::EIO));
        c.arm(2);
        c.complete(Ok(()));
        c.complete(Ok(()));
        assert_eq!(smol::block_on(c.wait()), Ok(()));
    }

    #[test]
    fn eventfd_wakes_a_blocked_poll() {
        let k = Arc::new(Kicker::new().unwrap());
        let k2 = k.clone();
        let t = std::thread::spawn(move || k2.kick());
        let mut pfd = [PollFd::new(k.fd.as_fd(), PollFlags::POLLIN)];
        // wait for the kick, no timeout
        let n = poll(&mut pfd, PollTimeout::NONE);
        t.join().unwrap();
        assert_eq!(n, Ok(1));
        assert_eq!(k.drain(), 1);
    }
}
