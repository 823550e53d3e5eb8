//! Worker pool for per-chunk works, independent of the engine.
//!
//! A *job* is a closure queued under a *key* (the daemon uses chunk numbers; reclaim runs on
//! the engine's own threads, never here: see docs/design.md, "Architecture"). All jobs of one
//! key form that key's *work*: it runs on one worker at a time, taking the jobs in arrival
//! order. Different keys run in parallel, subject to the [`Policy`]:
//!
//! * [`Policy::PerCpu`]: one worker group per CPU, threads pinned to it. A work runs in the
//!   group of the CPU that queued it (`sched_getcpu` when it went idle -> queued; a job
//!   appended to a pending or running work joins it where it is). Userspace cannot see a
//!   worker block, so each group may run up to `max_per_cpu` works at once: while one blocks
//!   on I/O, the next work queued on that CPU still runs (no head-of-line stall).
//! * [`Policy::Unbound`]: one group, threads anywhere, at most `max_active` works executing at
//!   once (`unbound:8` reproduces the kernel's cap that slowed dm-zoned down).
//!
//! # State of a work
//!
//! ```text
//!  idle ──queue──▶ queued ──pop──▶ running ──batch done, no new jobs──▶ idle (retired)
//!                    ▲                │
//!                    │              queue
//!                    │                ▼
//!                    └──batch done── running+requeue
//!
//!  queue on queued or running+requeue: the job is appended, nothing else happens.
//!  idle ──queue: the key goes on the run queue of the queueing CPU's group (percpu) or the
//!  pool's group (unbound). running+requeue ──batch done: back of the same group's run queue.
//! ```
//!
//! Only the idle -> queued transition puts a key on a run queue, and only the worker that ran
//! the work puts it back, so a key is on at most one run queue at most once and never runs on
//! two workers. A worker takes every job queued so far in one batch; jobs arriving meanwhile
//! wait for the next batch, which goes to the back of the run queue so other works get a turn.
//! Idle works are not stored: the map holds only queued or running works.
//!
//! A job may [`defer`] a closure to the end of its batch: the worker runs every deferred
//! closure, in order, after the batch's last job and before it ends the batch (so before the
//! work's next batch starts anywhere). The frontend's writes use it for group commit: each
//! write job puts its data on the device, and one deferred log write per batch acknowledges
//! them all.
//!
//! # Who wakes whom (wake economy)
//!
//! Each group counts its *awake free* workers: awake and not executing a work, so they will
//! look at the run queue before parking. A worker with a wake pending counts as awake free
//! from the moment it is chosen, and leaves the parked list at once, so it is never woken
//! twice. The rule, applied after every push onto a run queue and after every pop from it:
//!
//! * run queue non-empty and no awake free worker: wake the most recently parked worker
//!   (cache-warm), or spawn one if none is parked and the group limit allows;
//! * otherwise nobody is woken: an awake free worker will take the work, or every worker is
//!   executing a work and the first to finish takes the queue's head.
//!
//! So the queueing thread wakes at most one worker, and at most one wake per group is in
//! flight. A worker that takes a work and leaves others queued passes the baton to one more
//! worker, because its work may block (userspace cannot see that, unlike the kernel's
//! concurrency management): no queued work waits behind a blocked one below the group limit.
//! Parked workers wait on their own condvar with no timeout and no spinning, so an idle pool
//! makes no wakeups at all. A woken worker that finds the queue already emptied (a worker that
//! just finished took the work first) counts a `wakeups_empty`.
//!
//! # Threads
//!
//! Workers are spawned lazily, up to the group limit, and then stay parked while the pool
//! lives: retiring idle threads would need a timer, i.e. wakeups in an idle pool. Because any
//! work may block, a burst of CPU-bound works can bring a `percpu` group up to `max_per_cpu`
//! threads sharing its CPU; they park again once the burst is drained.
//!
//! [`Pool::wait_idle`] sleeps on a condvar notified when the last live work retires, only when
//! someone waits.

mod cpu;
mod group;
mod policy;
mod stats;
mod works;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

pub use cpu::worker_cpu;
pub use group::{defer, run_deferred};
pub use policy::{Policy, PolicyParseError, DEFAULT_MAX_ACTIVE, DEFAULT_MAX_PER_CPU, MAX_LIMIT};
pub use stats::PoolStats;

use group::Group;
use works::Works;

/// Shared by the `Pool` handle and its worker threads.
pub(crate) struct Inner {
    pub(crate) name: String,
    policy: Policy,
    pub(crate) groups: Box<[Group]>,
    /// `cpu_group[cpu]`: group of that CPU (`percpu`), `usize::MAX` when the CPU has none.
    cpu_group: Box<[usize]>,
    pub(crate) works: Works,
    pub(crate) active_now: AtomicUsize,
    pub(crate) peak_active: AtomicUsize,
    pub(crate) handles: Mutex<Vec<JoinHandle<()>>>,
}

/// A worker pool. `Send + Sync`; share it with `Arc<Pool>`. Dropping it drains and joins.
pub struct Pool {
    inner: Arc<Inner>,
}

impl Pool {
    /// Makes a pool. Threads are spawned lazily, when queued works need them.
    pub fn new(name: &str, policy: Policy) -> Pool {
        let limit = policy.group_limit();
        let (groups, cpu_group): (Vec<Group>, Vec<usize>) = match policy {
            Policy::PerCpu { .. } => {
                let cpus = cpu::allowed_cpus();
                let max = cpus.iter().copied().max().unwrap_or(0);
                let mut map = vec![usize::MAX; max + 1];
                for (i, &c) in cpus.iter().enumerate() {
                    map[c] = i;
                }
                let groups = cpus.iter().map(|&c| Group::new(Some(c), limit)).collect();
                (groups, map)
            }
            Policy::Unbound { .. } => (vec![Group::new(None, limit)], Vec::new()),
        };
        Pool {
            inner: Arc::new(Inner {
                name: name.to_string(),
                policy,
                groups: groups.into_boxed_slice(),
                cpu_group: cpu_group.into_boxed_slice(),
                works: Works::new(),
                active_now: AtomicUsize::new(0),
                peak_active: AtomicUsize::new(0),
                handles: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The policy this pool was made with.
    pub fn policy(&self) -> Policy {
        self.inner.policy
    }

    /// The name given to `new` (also the prefix of worker thread names).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Appends `job` to the work of `key`; jobs of one key run in queue order, one at a time.
    pub fn queue(&self, key: u64, job: Box<dyn FnOnce() + Send + 'static>) {
        let inner = &self.inner;
        let gi = inner.pick_group();
        let counters = &inner.groups[gi].counters;
        counters.jobs_queued.fetch_add(1, Ordering::Relaxed);
        if inner.works.append(key, job) {
            counters.works_queued.fetch_add(1, Ordering::Relaxed);
            group::schedule(inner, gi, key);
        }
    }

    /// Whether jobs of `key` are queued or running (including what their batch deferred).
    /// A moment's answer: a job queued on another thread right after may make it stale.
    pub fn has_work(&self, key: u64) -> bool {
        self.inner.works.has(key)
    }

    /// Take `key` as if a job of it were running, when it has no work: true. Jobs queued on
    /// it meanwhile wait for [`Pool::release`], which must follow. For a caller that does
    /// a key's work outside the pool and must not be overtaken by jobs queued after it
    /// started (the frontend's hop-free writes).
    pub fn hold(&self, key: u64) -> bool {
        self.inner.works.hold(key)
    }

    /// End [`Pool::hold`] of `key`: `first`, if given, runs before the jobs queued meanwhile.
    pub fn release(&self, key: u64, first: Option<Box<dyn FnOnce() + Send + 'static>>) {
        let inner = &self.inner;
        let gi = inner.pick_group();
        if first.is_some() {
            inner.groups[gi]
                .counters
                .jobs_queued
                .fetch_add(1, Ordering::Relaxed);
        }
        if inner.works.release(key, first) {
            inner.groups[gi]
                .counters
                .works_queued
                .fetch_add(1, Ordering::Relaxed);
            group::schedule(inner, gi, key);
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        let inner = &self.inner;
        let mut s = PoolStats {
            name: inner.name.clone(),
            policy: inner.policy.to_string(),
            groups: inner.groups.len(),
            works_pending: inner.works.live(),
            peak_active: inner.peak_active.load(Ordering::Relaxed),
            active_now: inner.active_now.load(Ordering::Relaxed),
            ..PoolStats::default()
        };
        for g in inner.groups.iter() {
            let c = &g.counters;
            let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            s.workers += g.state.lock().workers;
            s.workers_spawned += get(&c.workers_spawned);
            s.jobs_queued += get(&c.jobs_queued);
            s.jobs_run += get(&c.jobs_run);
            s.jobs_panicked += get(&c.jobs_panicked);
            s.jobs_deferred += get(&c.jobs_deferred);
            s.works_queued += get(&c.works_queued);
            s.works_requeued += get(&c.works_requeued);
            s.works_run += get(&c.works_run);
            s.wakeups_issued += get(&c.wakeups_issued);
            s.wakeups_empty += get(&c.wakeups_empty);
        }
        s
    }

    /// Blocks until nothing is queued or running. Must not be called from a job of this pool
    /// (it would wait for itself): there it logs an error and returns at once.
    pub fn wait_idle(&self) {
        if cpu::is_worker_of(&self.inner) {
            tracing::error!(pool = %self.inner.name, "wait_idle called from the pool's own job");
            return;
        }
        self.inner.works.wait_idle();
    }

    /// Drains every queued work, then joins the workers. Jobs queued later still run (a worker
    /// is spawned for them and exits when done). Called from one of the pool's own jobs it
    /// cannot wait for itself: it only tells the workers to exit once the queue is empty.
    pub fn shutdown(&self) {
        let inner = &self.inner;
        let own_worker = cpu::is_worker_of(inner);
        if !own_worker {
            inner.works.wait_idle();
        }
        for gi in 0..inner.groups.len() {
            group::stop(inner, gi);
        }
        if own_worker {
            return;
        }
        loop {
            let handles = std::mem::take(&mut *inner.handles.lock());
            if handles.is_empty() {
                break;
            }
            for h in handles {
                if h.join().is_err() {
                    tracing::error!(pool = %inner.name, "worker thread panicked");
                }
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.inner.name)
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// Group that takes a work queued by the calling thread.
    fn pick_group(&self) -> usize {
        if self.groups.len() == 1 {
            return 0;
        }
        match cpu::current_cpu() {
            Some(c) => match self.cpu_group.get(c) {
                Some(&g) if g != usize::MAX => g,
                // A CPU outside the mask seen at creation: spread deterministically.
                _ => c % self.groups.len(),
            },
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<Pool>();
        check::<PoolStats>();
    }
}
