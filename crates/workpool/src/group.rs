//! A group of workers sharing one run queue: one per CPU (`percpu`) or one for the pool
//! (`unbound`). Holds the wake economy: who gets woken, and when nobody does.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::{cpu, Inner};

/// One queued closure.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// What the jobs of the running batch deferred: not yet run, and how many in all.
#[derive(Default)]
struct Deferred {
    jobs: Vec<Job>,
    count: u64,
}

thread_local! {
    /// The batch this worker is running; `None` outside one.
    static DEFERRED: std::cell::RefCell<Option<Deferred>> = const { std::cell::RefCell::new(None) };
}

/// Runs a deferred job; a panic is logged, not passed to whoever ran it.
fn run_one(job: Job) {
    if catch_unwind(AssertUnwindSafe(job)).is_err() {
        tracing::error!("deferred job panicked");
    }
}

/// Run at once, in order, what the calling job's batch has deferred so far (nothing outside
/// a job); later defers of the batch wait for its end again. For a job about to block for
/// long: what it deferred need not wait for it.
pub fn run_deferred() {
    let now = DEFERRED.with(|d| d.borrow_mut().as_mut().map(|d| std::mem::take(&mut d.jobs)));
    for job in now.unwrap_or_default() {
        run_one(job);
    }
}

/// Run `job` once the batch of jobs the calling job belongs to has run, before its work
/// takes its next batch (in the order deferred); at once when not called from a job of a
/// pool, or from a job deferred that runs at the batch's end. What a batch's jobs can do
/// once for all of them goes here: the engine's writes of one chunk share one log write.
pub fn defer(job: Job) {
    let job = DEFERRED.with(|d| match d.borrow_mut().as_mut() {
        Some(d) => {
            d.jobs.push(job);
            d.count += 1;
            None
        }
        None => Some(job),
    });
    if let Some(job) = job {
        job();
    }
}

/// Counters one group updates; kept per group so CPUs do not bounce one cache line.
#[derive(Default)]
#[repr(align(64))]
pub(crate) struct GroupCounters {
    pub jobs_queued: AtomicU64,
    pub works_queued: AtomicU64,
    pub works_requeued: AtomicU64,
    pub works_run: AtomicU64,
    pub jobs_run: AtomicU64,
    pub jobs_panicked: AtomicU64,
    pub jobs_deferred: AtomicU64,
    pub wakeups_issued: AtomicU64,
    pub wakeups_empty: AtomicU64,
    pub workers_spawned: AtomicU64,
}

pub(crate) struct GroupState {
    /// Keys of queued works, each at most once (the work state machine guarantees it).
    runq: VecDeque<u64>,
    /// Parked workers (by slot), none of them with a wake pending.
    idle: Vec<usize>,
    /// `woken[slot]`: a wake is pending for that slot; it has left `idle` and counts as free.
    woken: Box<[bool]>,
    /// Slots with no thread behind them; a spawn takes one.
    free_slots: Vec<usize>,
    /// Awake workers not executing a work: they will look at `runq` before parking.
    awake_free: usize,
    /// Workers executing a work (never above the group limit: one work per worker).
    pub running: usize,
    /// Threads alive in this group.
    pub workers: usize,
    /// Set by shutdown: workers exit instead of parking once `runq` is empty.
    stop: bool,
}

pub(crate) struct Group {
    /// CPU this group's threads are pinned to (`percpu`), or none (`unbound`).
    pub cpu: Option<usize>,
    pub state: Mutex<GroupState>,
    /// One condvar per slot, so a wake reaches exactly the chosen worker.
    wake: Box<[Condvar]>,
    pub counters: GroupCounters,
}

impl Group {
    pub(crate) fn new(cpu: Option<usize>, limit: usize) -> Self {
        Group {
            cpu,
            state: Mutex::new(GroupState {
                runq: VecDeque::new(),
                idle: Vec::with_capacity(limit),
                woken: vec![false; limit].into_boxed_slice(),
                free_slots: (0..limit).rev().collect(),
                awake_free: 0,
                running: 0,
                workers: 0,
                stop: false,
            }),
            wake: (0..limit).map(|_| Condvar::new()).collect(),
            counters: GroupCounters::default(),
        }
    }
}

/// Puts a newly queued work on group `gi`'s run queue and makes sure someone will run it.
pub(crate) fn schedule(inner: &Arc<Inner>, gi: usize, key: u64) {
    let mut st = inner.groups[gi].state.lock();
    st.runq.push_back(key);
    kick(inner, gi, &mut st);
}

/// Wake economy: a queued work needs an awake free worker, and one is enough. Wake a parked
/// worker (or spawn one, within the limit) only when the run queue is non-empty and nobody
/// awake is free to look at it. A worker with a wake pending already counts as free, so it is
/// never woken twice, and at most one wake per group is in flight. Called after every push
/// and every pop: a worker that takes a work and leaves others queued passes the baton to
/// one more worker (it may block in its work, and nothing in userspace would tell us), so no
/// queued work waits behind a running one unless the group limit is reached.
fn kick(inner: &Arc<Inner>, gi: usize, st: &mut GroupState) {
    if st.awake_free > 0 || st.runq.is_empty() {
        return;
    }
    let group = &inner.groups[gi];
    if let Some(slot) = st.idle.pop() {
        debug_assert!(!st.woken.iter().any(|&w| w), "two wakes in flight");
        st.woken[slot] = true;
        st.awake_free += 1;
        group.wake[slot].notify_one();
        group
            .counters
            .wakeups_issued
            .fetch_add(1, Ordering::Relaxed);
    } else if let Some(slot) = st.free_slots.pop() {
        match spawn_worker(inner, gi, slot) {
            Ok(()) => {
                tracing::debug!(pool = %inner.name, group = gi, slot, "spawned worker");
                st.workers += 1;
                st.awake_free += 1;
                group
                    .counters
                    .workers_spawned
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                st.free_slots.push(slot);
                tracing::error!(pool = %inner.name, error = %e, "cannot spawn worker thread");
            }
        }
    }
    // Else every worker runs a work: the first to finish takes the queue's head.
}

/// Shutdown: workers stop parking; every parked one is woken to exit.
pub(crate) fn stop(inner: &Inner, gi: usize) {
    let group = &inner.groups[gi];
    let mut st = group.state.lock();
    st.stop = true;
    while let Some(slot) = st.idle.pop() {
        st.woken[slot] = true;
        st.awake_free += 1;
        group.wake[slot].notify_one();
    }
}

fn spawn_worker(inner: &Arc<Inner>, gi: usize, slot: usize) -> std::io::Result<()> {
    let name = match inner.groups[gi].cpu {
        Some(c) => format!("{}/{c}.{slot}", inner.name),
        None => format!("{}/u.{slot}", inner.name),
    };
    let inner2 = Arc::clone(inner);
    let handle = std::thread::Builder::new()
        .name(name)
        .spawn(move || worker_main(inner2, gi, slot))?;
    inner.handles.lock().push(handle);
    Ok(())
}

fn worker_main(inner: Arc<Inner>, gi: usize, slot: usize) {
    let group = &inner.groups[gi];
    cpu::enter_worker(&inner, group.cpu);
    let mut st = group.state.lock();
    loop {
        if let Some(key) = st.runq.pop_front() {
            st.awake_free -= 1;
            st.running += 1;
            kick(&inner, gi, &mut st);
            drop(st);
            let requeue = run_work(&inner, gi, key);
            st = group.state.lock();
            st.running -= 1;
            st.awake_free += 1;
            if requeue {
                // Back of the queue: other works of this group get their turn first.
                st.runq.push_back(key);
                group
                    .counters
                    .works_requeued
                    .fetch_add(1, Ordering::Relaxed);
                kick(&inner, gi, &mut st);
            }
            continue;
        }
        st.awake_free -= 1;
        if st.stop {
            st.workers -= 1;
            st.free_slots.push(slot);
            return;
        }
        st.idle.push(slot);
        while !st.woken[slot] {
            group.wake[slot].wait(&mut st);
        }
        st.woken[slot] = false;
        if st.runq.is_empty() && !st.stop {
            // Another awake worker took the work first.
            group.counters.wakeups_empty.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs one batch of `key`'s jobs; returns whether the work must be requeued.
fn run_work(inner: &Inner, gi: usize, key: u64) -> bool {
    let counters = &inner.groups[gi].counters;
    let active = inner.active_now.fetch_add(1, Ordering::Relaxed) + 1;
    inner.peak_active.fetch_max(active, Ordering::Relaxed);
    let jobs = inner.works.begin(key);
    let n = jobs.len() as u64;
    DEFERRED.with(|d| *d.borrow_mut() = Some(Deferred::default()));
    for job in jobs {
        // A panicking job must not kill the worker nor wedge its work in Running.
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            counters.jobs_panicked.fetch_add(1, Ordering::Relaxed);
            tracing::error!(pool = %inner.name, key, "job panicked");
        }
    }
    // What the batch's jobs deferred, in order, before the work may run its next batch.
    let deferred = DEFERRED.with(|d| d.borrow_mut().take()).unwrap_or_default();
    counters
        .jobs_deferred
        .fetch_add(deferred.count, Ordering::Relaxed);
    for job in deferred.jobs {
        run_one(job);
    }
    counters.works_run.fetch_add(1, Ordering::Relaxed);
    counters.jobs_run.fetch_add(n, Ordering::Relaxed);
    inner.active_now.fetch_sub(1, Ordering::Relaxed);
    inner.works.finish(key)
}
