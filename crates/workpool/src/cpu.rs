//! CPU topology and thread placement: which CPUs exist, where the caller runs, pinning.

use std::cell::Cell;

use nix::sched::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use crate::Inner;

thread_local! {
    /// Address of the pool this thread works for (0: not a worker).
    static POOL: Cell<usize> = const { Cell::new(0) };
    /// CPU group of this worker thread, if it is a percpu worker.
    static GROUP_CPU: Cell<Option<usize>> = const { Cell::new(None) };
}

/// CPUs the calling thread may run on, ascending; falls back to `0..available_parallelism`.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    let cpus: Vec<usize> = match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(_) => Vec::new(),
    };
    if cpus.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        (0..n).collect()
    } else {
        cpus
    }
}

/// CPU the calling thread runs on now (may change right after; good enough for placement).
pub(crate) fn current_cpu() -> Option<usize> {
    sched_getcpu().ok()
}

/// Marks the calling thread as a worker of `inner` and pins it to `cpu` if given.
pub(crate) fn enter_worker(inner: &Inner, cpu: Option<usize>) {
    POOL.with(|p| p.set(inner as *const Inner as usize));
    GROUP_CPU.with(|g| g.set(cpu));
    if let Some(c) = cpu {
        let mut set = CpuSet::new();
        let pinned = set
            .set(c)
            .and_then(|()| sched_setaffinity(Pid::from_raw(0), &set));
        if let Err(e) = pinned {
            // Still correct, only placement is lost (e.g. a cpuset shrank since startup).
            tracing::warn!(pool = %inner.name, cpu = c, error = %e, "cannot pin worker");
        }
    }
}

/// Whether the calling thread is a worker of `inner`.
pub(crate) fn is_worker_of(inner: &Inner) -> bool {
    POOL.with(|p| p.get()) == inner as *const Inner as usize
}

/// The CPU group of the calling worker thread: `Some(cpu)` inside a job run by a `percpu`
/// pool, `None` in an `unbound` worker or any other thread.
pub fn worker_cpu() -> Option<usize> {
    GROUP_CPU.with(|g| g.get())
}
