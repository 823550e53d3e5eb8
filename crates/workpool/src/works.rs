//! Per-key works: the state machine that keeps one key's jobs ordered and single-threaded.
//!
//! A work exists in the map only while it is queued or running; a drained work retires, so
//! the map never grows with the number of keys ever used. The map is sharded by key so that
//! queueing on different keys rarely contends.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex};

/// One unit of queued code.
pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

const SHARDS: usize = 64;

/// Where a live work stands. Idle works are absent from the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// On exactly one group's run queue, not executing.
    Queued,
    /// A worker executes a batch of its jobs; no new jobs arrived since.
    Running,
    /// A worker executes it and new jobs arrived: the worker requeues it when done.
    RunningRequeue,
    /// Held by a caller outside the pool ([`Works::hold`]): jobs queued meanwhile wait
    /// until it releases the key ([`Works::release`]).
    Held,
}

struct Work {
    state: State,
    jobs: VecDeque<Job>,
}

/// Keys are already well spread (chunk and zone numbers): a multiply is enough to mix them.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type WorkMap = HashMap<u64, Work, BuildHasherDefault<KeyHasher>>;

/// Own cache line per shard so neighbouring shard locks do not bounce together.
#[repr(align(64))]
struct Shard(Mutex<WorkMap>);

/// All live works plus the "pool is idle" condition.
pub(crate) struct Works {
    shards: Box<[Shard]>,
    /// Works queued or running; zero means the pool is idle.
    live: AtomicUsize,
    /// Threads inside `wait_idle`; lets retirement skip the idle lock when nobody waits.
    waiters: AtomicUsize,
    idle_lock: Mutex<()>,
    idle_cv: Condvar,
}

impl Works {
    pub(crate) fn new() -> Self {
        Works {
            shards: (0..SHARDS).map(|_| Shard(Mutex::default())).collect(),
            live: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            idle_lock: Mutex::new(()),
            idle_cv: Condvar::new(),
        }
    }

    fn shard(&self, key: u64) -> &Mutex<WorkMap> {
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.shards[h as usize % SHARDS].0
    }

    /// Appends `job` to `key`'s work. Returns true when the work went idle -> queued: the caller
    /// must then put `key` on a run queue (exactly once). Otherwise the job rides along with the
    /// pending or running work.
    pub(crate) fn append(&self, key: u64, job: Job) -> bool {
        let mut map = self.shard(key).lock();
        match map.get_mut(&key) {
            Some(work) => {
                work.jobs.push_back(job);
                if work.state == State::Running {
                    work.state = State::RunningRequeue;
                }
                // Queued: rides along; Held: waits for the release to schedule it.
                false
            }
            None => {
                // Count before the work becomes visible so `live` never reads zero while
                // a job is pending.
                self.live.fetch_add(1, Ordering::SeqCst);
                let mut jobs = VecDeque::with_capacity(1);
                jobs.push_back(job);
                map.insert(
                    key,
                    Work {
                        state: State::Queued,
                        jobs,
                    },
                );
                true
            }
        }
    }

    /// Idle -> Held, when `key` has no work: true. The key is then the caller's, as if a
    /// job of it were running, until [`Works::release`].
    pub(crate) fn hold(&self, key: u64) -> bool {
        let mut map = self.shard(key).lock();
        if map.contains_key(&key) {
            return false;
        }
        self.live.fetch_add(1, Ordering::SeqCst);
        map.insert(
            key,
            Work {
                state: State::Held,
                jobs: VecDeque::new(),
            },
        );
        true
    }

    /// Ends a [`Works::hold`], `first` (if any) to run before the jobs queued meanwhile.
    /// Held -> retired (returns false) when nothing is left to run, or -> Queued (returns
    /// true: the caller puts `key` on a run queue).
    pub(crate) fn release(&self, key: u64, first: Option<Job>) -> bool {
        let mut map = self.shard(key).lock();
        let Some(work) = map.get_mut(&key) else {
            debug_assert!(false, "release of {key}, which is not held");
            return false;
        };
        debug_assert_eq!(
            work.state,
            State::Held,
            "release of {key}, which is not held"
        );
        if let Some(job) = first {
            work.jobs.push_front(job);
        }
        if work.jobs.is_empty() {
            map.remove(&key);
            drop(map);
            self.retired();
            false
        } else {
            work.state = State::Queued;
            true
        }
    }

    /// Queued -> Running: hands the worker every job queued so far, in order.
    pub(crate) fn begin(&self, key: u64) -> VecDeque<Job> {
        let mut map = self.shard(key).lock();
        match map.get_mut(&key) {
            Some(work) => {
                debug_assert_eq!(work.state, State::Queued, "work {key} ran twice");
                work.state = State::Running;
                std::mem::take(&mut work.jobs)
            }
            // Unreachable by construction: only the run queue entry leads here.
            None => VecDeque::new(),
        }
    }

    /// Ends a batch. Running -> retired (returns false), or RunningRequeue -> Queued (returns
    /// true: the caller puts `key` back on a run queue).
    pub(crate) fn finish(&self, key: u64) -> bool {
        let mut map = self.shard(key).lock();
        let Some(work) = map.get_mut(&key) else {
            return false;
        };
        if work.jobs.is_empty() {
            debug_assert_eq!(work.state, State::Running);
            map.remove(&key);
            drop(map);
            self.retired();
            false
        } else {
            debug_assert_eq!(work.state, State::RunningRequeue);
            work.state = State::Queued;
            true
        }
    }

    fn retired(&self) {
        if self.live.fetch_sub(1, Ordering::SeqCst) == 1 && self.waiters.load(Ordering::SeqCst) > 0
        {
            // Taking the lock orders this notify after a waiter's check-then-wait.
            let _g = self.idle_lock.lock();
            self.idle_cv.notify_all();
        }
    }

    /// Whether `key` has jobs queued or running (its batch's deferred jobs included).
    pub(crate) fn has(&self, key: u64) -> bool {
        self.shard(key).lock().contains_key(&key)
    }

    /// Works queued or running right now.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Blocks until no work is queued or running.
    pub(crate) fn wait_idle(&self) {
        let mut g = self.idle_lock.lock();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        while self.live.load(Ordering::SeqCst) != 0 {
            self.idle_cv.wait(&mut g);
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_machine_retires_and_requeues() {
        let w = Works::new();
        assert!(!w.has(7));
        assert!(w.append(7, Box::new(|| {})), "idle -> queued schedules");
        assert!(w.has(7) && !w.has(8), "queued");
        assert!(
            !w.append(7, Box::new(|| {})),
            "queued work is not scheduled twice"
        );
        assert_eq!(w.begin(7).len(), 2);
        assert!(
            !w.append(7, Box::new(|| {})),
            "running work is not scheduled again"
        );
        assert!(w.finish(7), "running+requeue goes back on a run queue");
        assert_eq!(w.begin(7).len(), 1);
        assert!(w.has(7), "running");
        assert!(!w.finish(7), "drained work retires");
        assert!(!w.has(7), "retired");
        assert_eq!(w.live(), 0);
        assert!(w.append(7, Box::new(|| {})), "retired work starts over");
    }

    #[test]
    fn a_held_key_keeps_its_jobs_until_released() {
        let w = Works::new();
        assert!(w.append(3, Box::new(|| {})));
        assert!(!w.hold(3), "a key with work cannot be held");
        assert!(w.hold(4), "an idle key can");
        assert!(!w.hold(4), "nor held twice");
        assert!(w.has(4) && w.live() == 2);
        assert!(!w.append(4, Box::new(|| {})), "queued behind the hold");
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let o = order.clone();
        assert!(
            w.release(4, Some(Box::new(move || o.lock().push("first")))),
            "released with jobs: scheduled"
        );
        let jobs = w.begin(4);
        assert_eq!(jobs.len(), 2);
        for j in jobs {
            j();
        }
        assert_eq!(*order.lock(), ["first"], "the release's job runs first");
        assert!(!w.finish(4));
        assert!(w.hold(4));
        assert!(!w.release(4, None), "released empty: retired");
        assert!(!w.has(4));
        assert_eq!(w.live(), 1);
    }
}
