//! Behaviour of the pool: ordering, limits, wake economy, placement, shutdown.
//!
//! Tests that could hang on a bug run under `guard`, which fails the test instead of hanging.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use nix::sched::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use workpool::{worker_cpu, Policy, Pool};

/// How long a guarded body may run before the test calls it stuck. It catches hangs (a lost
/// wakeup never ends), not slowness: every body takes well under a second on an idle machine,
/// and a loaded one must not fail them, so the limit is far beyond any scheduling delay.
const STUCK_SECS: u64 = 600;

/// Runs `f` on its own thread; fails the test if it has not finished within [`STUCK_SECS`].
fn guard(name: &str, f: impl FnOnce() + Send + 'static) {
    let secs = STUCK_SECS;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{name}: stuck for {secs}s (lost wakeup?)"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{name}: failed"),
    }
}

/// Per key: (producer, seq) in execution order.
type Log = Mutex<Vec<(usize, usize)>>;

fn policies() -> [Policy; 3] {
    [
        Policy::PerCpu { max_per_cpu: 3 },
        Policy::Unbound { max_active: 8 },
        Policy::Unbound { max_active: 1 },
    ]
}

fn allowed_cpus() -> Vec<usize> {
    let set = sched_getaffinity(Pid::from_raw(0)).expect("getaffinity");
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

fn pin_self(cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu).unwrap();
    sched_setaffinity(Pid::from_raw(0), &set).expect("pin test thread");
}

#[test]
fn per_key_order_holds_under_concurrent_queueing() {
    const PRODUCERS: usize = 4;
    const KEYS: u64 = 24;
    const PER_KEY: usize = 300;
    for policy in policies() {
        guard("per-key order", move || {
            let pool = Arc::new(Pool::new("order", policy));
            // Per key: log of (producer, seq) in execution order, and an "executing" flag.
            let logs: Arc<Vec<Log>> = Arc::new((0..KEYS).map(|_| Mutex::new(Vec::new())).collect());
            let busy: Arc<Vec<AtomicBool>> =
                Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
            let overlaps = Arc::new(AtomicU64::new(0));
            let start = Arc::new(Barrier::new(PRODUCERS));
            let producers: Vec<_> = (0..PRODUCERS)
                .map(|p| {
                    let (pool, logs, busy, overlaps, start) = (
                        pool.clone(),
                        logs.clone(),
                        busy.clone(),
                        overlaps.clone(),
                        start.clone(),
                    );
                    thread::spawn(move || {
                        start.wait();
                        for seq in 0..PER_KEY {
                            for key in 0..KEYS {
                                let (logs, busy, overlaps) =
                                    (logs.clone(), busy.clone(), overlaps.clone());
                                pool.queue(
                                    key,
                                    Box::new(move || {
                                        let k = key as usize;
                                        if busy[k].swap(true, Ordering::SeqCst) {
                                            overlaps.fetch_add(1, Ordering::SeqCst);
                                        }
                                        logs[k].lock().unwrap().push((p, seq));
                                        busy[k].store(false, Ordering::SeqCst);
                                    }),
                                );
                            }
                        }
                    })
                })
                .collect();
            for t in producers {
                t.join().unwrap();
            }
            pool.wait_idle();
            assert_eq!(
                overlaps.load(Ordering::SeqCst),
                0,
                "{policy}: a key ran on two workers"
            );
            for (key, log) in logs.iter().enumerate() {
                let log = log.lock().unwrap();
                assert_eq!(
                    log.len(),
                    PRODUCERS * PER_KEY,
                    "{policy}: key {key} lost jobs"
                );
                let mut next = [0usize; PRODUCERS];
                for &(p, seq) in log.iter() {
                    assert_eq!(
                        seq, next[p],
                        "{policy}: key {key} producer {p} out of order"
                    );
                    next[p] += 1;
                }
            }
            let s = pool.stats();
            assert_eq!(s.jobs_run, (PRODUCERS * PER_KEY) as u64 * KEYS);
            assert_eq!(s.jobs_queued, s.jobs_run);
            assert_eq!(s.works_pending, 0, "drained works retire");
            assert_eq!(s.works_run, s.works_queued + s.works_requeued);
        });
    }
}

#[test]
fn max_active_is_never_exceeded() {
    guard("max_active", || {
        const CAP: usize = 3;
        let pool = Pool::new("cap", Policy::Unbound { max_active: CAP });
        let now = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        for key in 0..400u64 {
            for _ in 0..3 {
                let (now, max) = (now.clone(), max.clone());
                pool.queue(
                    key,
                    Box::new(move || {
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        max.fetch_max(n, Ordering::SeqCst);
                        thread::yield_now();
                        now.fetch_sub(1, Ordering::SeqCst);
                    }),
                );
            }
        }
        pool.wait_idle();
        let s = pool.stats();
        assert!(
            max.load(Ordering::SeqCst) <= CAP,
            "jobs saw {max:?} at once"
        );
        assert!(s.peak_active <= CAP, "peak_active {}", s.peak_active);
        assert!(s.workers <= CAP);
        assert_eq!(s.jobs_run, 1200);
    });
}

#[test]
fn max_active_works_do_run_together() {
    // Each of CAP works waits for all CAP to be executing: completes only if the cap is
    // reached, not just respected.
    guard("cap reached", || {
        const CAP: usize = 4;
        let pool = Pool::new("together", Policy::Unbound { max_active: CAP });
        let all_in = Arc::new(Barrier::new(CAP));
        for key in 0..CAP as u64 {
            let all_in = all_in.clone();
            pool.queue(
                key,
                Box::new(move || {
                    all_in.wait();
                }),
            );
        }
        pool.wait_idle();
        assert_eq!(pool.stats().peak_active, CAP);
    });
}

#[test]
fn no_lost_wakeup_over_thousands_of_rounds() {
    const ROUNDS: u64 = 3000;
    for policy in [
        Policy::Unbound { max_active: 2 },
        Policy::PerCpu { max_per_cpu: 1 },
    ] {
        guard("rounds", move || {
            let pool = Arc::new(Pool::new("rounds", policy));
            let done = Arc::new(AtomicU64::new(0));
            let step = Arc::new(Barrier::new(3));
            let producers: Vec<_> = (0..2u64)
                .map(|p| {
                    let (pool, done, step) = (pool.clone(), done.clone(), step.clone());
                    thread::spawn(move || {
                        for round in 0..ROUNDS {
                            step.wait();
                            let done = done.clone();
                            pool.queue(
                                round * 2 + p,
                                Box::new(move || {
                                    done.fetch_add(1, Ordering::SeqCst);
                                }),
                            );
                            step.wait();
                        }
                    })
                })
                .collect();
            for round in 0..ROUNDS {
                step.wait();
                step.wait();
                pool.wait_idle();
                assert_eq!(done.load(Ordering::SeqCst), 2 * (round + 1), "{policy}");
            }
            for t in producers {
                t.join().unwrap();
            }
        });
    }
}

#[test]
fn ping_pong_never_loses_a_wakeup() {
    // Every job is queued right as the worker goes back to sleep: the classic lost-wakeup race.
    guard("ping-pong", || {
        let pool = Pool::new("pingpong", Policy::Unbound { max_active: 2 });
        let (tx, rx) = mpsc::channel();
        for i in 0..5000u64 {
            let tx = tx.clone();
            pool.queue(i % 7, Box::new(move || tx.send(i).unwrap()));
            assert_eq!(rx.recv().unwrap(), i);
        }
        let s = pool.stats();
        // Each wake leads to a work taken or is counted as empty, but for the one wake per
        // group that may still be in flight.
        assert!(s.wakeups_issued <= s.works_run + s.wakeups_empty + s.groups as u64);
    });
}

#[test]
fn idle_pool_makes_zero_wakeups() {
    for policy in policies() {
        let pool = Pool::new("idle", policy);
        for key in 0..64 {
            pool.queue(key, Box::new(|| {}));
        }
        pool.wait_idle();
        let before = pool.stats();
        assert!(before.workers > 0);
        // Letting time pass is the point: nothing may happen in it.
        thread::sleep(Duration::from_millis(200));
        let after = pool.stats();
        assert_eq!(before.wakeups_issued, after.wakeups_issued, "{policy}");
        // A wake issued while the pool was busy may land now and find nothing; at most one
        // is in flight per group.
        assert!(
            after.wakeups_empty - before.wakeups_empty <= before.groups as u64,
            "{policy}"
        );
        assert_eq!(before.works_run, after.works_run, "{policy}");
        assert_eq!(after.active_now, 0);
    }
}

#[test]
fn busy_workers_are_not_woken_and_limit_holds_back_extra_works() {
    guard("busy", || {
        let pool = Arc::new(Pool::new("busy", Policy::Unbound { max_active: 2 }));
        let (started_tx, started_rx) = mpsc::channel();
        let gate = Arc::new(Barrier::new(3));
        // Two works that block until released: both workers busy.
        for key in 0..2 {
            let (started_tx, gate) = (started_tx.clone(), gate.clone());
            pool.queue(
                key,
                Box::new(move || {
                    started_tx.send(()).unwrap();
                    gate.wait();
                }),
            );
        }
        started_rx.recv().unwrap();
        started_rx.recv().unwrap();
        let before = pool.stats();
        assert_eq!(before.active_now, 2);
        for key in 2..50 {
            pool.queue(key, Box::new(|| {}));
        }
        let mid = pool.stats();
        assert_eq!(
            mid.wakeups_issued, before.wakeups_issued,
            "woke a busy pool"
        );
        assert_eq!(
            mid.workers_spawned, before.workers_spawned,
            "spawned past the limit"
        );
        assert_eq!(mid.works_run, before.works_run, "ran a work past the limit");
        gate.wait();
        pool.wait_idle();
        let s = pool.stats();
        assert_eq!(s.jobs_run, 50);
        assert!(s.peak_active <= 2);
    });
}

#[test]
fn appending_to_a_running_work_wakes_nobody() {
    guard("append", || {
        let pool = Pool::new("append", Policy::Unbound { max_active: 4 });
        let (started_tx, started_rx) = mpsc::channel();
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        pool.queue(
            0,
            Box::new(move || {
                started_tx.send(()).unwrap();
                gate_rx.recv().unwrap();
            }),
        );
        started_rx.recv().unwrap();
        let before = pool.stats();
        let order = Arc::new(Mutex::new(Vec::new()));
        for i in 0..1000 {
            let order = order.clone();
            pool.queue(0, Box::new(move || order.lock().unwrap().push(i)));
        }
        let mid = pool.stats();
        assert_eq!(
            mid.wakeups_issued, before.wakeups_issued,
            "appends woke a worker"
        );
        assert_eq!(
            mid.workers_spawned, before.workers_spawned,
            "appends spawned a worker"
        );
        assert_eq!(
            mid.works_queued, before.works_queued,
            "a running work was queued again"
        );
        gate_tx.send(()).unwrap();
        pool.wait_idle();
        let s = pool.stats();
        assert_eq!(*order.lock().unwrap(), (0..1000).collect::<Vec<_>>());
        assert_eq!(
            s.works_requeued, 1,
            "all appended jobs ran as one more batch"
        );
        assert_eq!(s.works_run, 2);
    });
}

#[test]
fn percpu_jobs_run_on_the_queueing_cpu() {
    let cpus = allowed_cpus();
    let pool = Arc::new(Pool::new("place", Policy::PerCpu { max_per_cpu: 2 }));
    assert_eq!(pool.stats().groups, cpus.len());
    for &cpu in &cpus {
        let pool = pool.clone();
        let seen = thread::spawn(move || {
            pin_self(cpu);
            let seen = Arc::new(Mutex::new(Vec::new()));
            for key in 0..50u64 {
                let seen = seen.clone();
                pool.queue(
                    key,
                    Box::new(move || {
                        seen.lock()
                            .unwrap()
                            .push((worker_cpu(), sched_getcpu().ok()));
                    }),
                );
            }
            pool.wait_idle();
            Arc::try_unwrap(seen).unwrap().into_inner().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(seen.len(), 50);
        for (group, ran_on) in seen {
            assert_eq!(
                group,
                Some(cpu),
                "work queued on cpu {cpu} ran in group {group:?}"
            );
            assert_eq!(ran_on, Some(cpu), "worker of cpu {cpu} not pinned");
        }
    }
}

#[test]
fn percpu_blocked_work_does_not_stall_its_cpu() {
    // Work 1 blocks until work 2, queued later on the same CPU, runs.
    guard("head-of-line", || {
        let cpu = allowed_cpus()[0];
        pin_self(cpu);
        let pool = Pool::new("hol", Policy::PerCpu { max_per_cpu: 2 });
        let (tx, rx) = mpsc::channel::<()>();
        pool.queue(1, Box::new(move || rx.recv().unwrap()));
        pool.queue(2, Box::new(move || tx.send(()).unwrap()));
        pool.wait_idle();
        assert_eq!(pool.stats().peak_active, 2);
    });
}

#[test]
fn panicking_job_does_not_wedge_its_work() {
    guard("panic", || {
        let pool = Pool::new("panic", Policy::Unbound { max_active: 1 });
        let ran = Arc::new(AtomicBool::new(false));
        pool.queue(5, Box::new(|| panic!("job panic (expected by the test)")));
        let r = ran.clone();
        pool.queue(5, Box::new(move || r.store(true, Ordering::SeqCst)));
        pool.wait_idle();
        assert!(ran.load(Ordering::SeqCst));
        let s = pool.stats();
        assert_eq!((s.jobs_panicked, s.jobs_run), (1, 2));
    });
}

#[test]
fn shutdown_drains_chained_jobs_and_joins() {
    guard("shutdown", || {
        let pool = Arc::new(Pool::new("down", Policy::PerCpu { max_per_cpu: 2 }));
        let count = Arc::new(AtomicU64::new(0));
        // Each job queues the next one: shutdown must wait for the whole chain.
        fn chain(pool: Arc<Pool>, count: Arc<AtomicU64>, left: u64) {
            let p = pool.clone();
            pool.queue(
                left % 3,
                Box::new(move || {
                    count.fetch_add(1, Ordering::SeqCst);
                    if left > 0 {
                        chain(p, count, left - 1);
                    }
                }),
            );
        }
        chain(pool.clone(), count.clone(), 500);
        pool.shutdown();
        assert_eq!(count.load(Ordering::SeqCst), 501);
        assert_eq!(pool.stats().workers, 0);
        // Still usable afterwards: a late job runs and its worker exits.
        let c = count.clone();
        pool.queue(
            9,
            Box::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
            }),
        );
        pool.wait_idle();
        assert_eq!(count.load(Ordering::SeqCst), 502);
    });
}

#[test]
fn dropping_last_handle_inside_a_job_does_not_deadlock() {
    guard("self-drop", || {
        let pool = Arc::new(Pool::new("selfdrop", Policy::Unbound { max_active: 2 }));
        let (tx, rx) = mpsc::channel();
        let p = pool.clone();
        pool.queue(
            1,
            Box::new(move || {
                // Hold the only handle left once the test drops its own.
                let _last = p;
                tx.send(()).unwrap();
            }),
        );
        drop(pool);
        rx.recv().unwrap();
    });
}

/// `defer`: what a batch's jobs defer runs after the batch's last job, in order, before the
/// work's next batch; outside a job, and from a deferred job, it runs at once;
/// `run_deferred` runs what was deferred so far at once.
#[test]
fn deferred_jobs_run_at_the_end_of_their_batch() {
    guard("defer", || {
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let note = |l: &Arc<Mutex<Vec<String>>>, s: String| l.lock().unwrap().push(s);
        let l = log.clone();
        workpool::defer(Box::new(move || note(&l, "outside".into())));
        assert_eq!(*log.lock().unwrap(), ["outside"], "not in a job: at once");

        let pool = Pool::new("defer", Policy::Unbound { max_active: 1 });
        // Hold the key's first batch so that the next three jobs form one batch.
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        pool.queue(
            5,
            Box::new(move || {
                started_tx.send(()).unwrap();
                go_rx.recv().unwrap();
            }),
        );
        started_rx.recv().unwrap();
        for i in 0..3 {
            let l = log.clone();
            pool.queue(
                5,
                Box::new(move || {
                    note(&l, format!("job {i}"));
                    if i == 1 {
                        // A job about to block runs what the batch deferred so far.
                        let l1 = l.clone();
                        workpool::defer(Box::new(move || note(&l1, "early 1".into())));
                        workpool::run_deferred();
                    }
                    let l2 = l.clone();
                    workpool::defer(Box::new(move || {
                        note(&l2, format!("deferred {i}"));
                        let l3 = l2.clone();
                        workpool::defer(Box::new(move || note(&l3, format!("nested {i}"))));
                    }));
                }),
            );
        }
        go_tx.send(()).unwrap();
        pool.wait_idle();
        let l = log.clone();
        pool.queue(5, Box::new(move || note(&l, "next batch".into())));
        pool.wait_idle();
        assert_eq!(
            *log.lock().unwrap(),
            [
                "outside",
                "job 0",
                "job 1",
                "deferred 0",
                "early 1",
                "job 2",
                "nested 0",
                "deferred 1",
                "nested 1",
                "deferred 2",
                "nested 2",
                "next batch"
            ]
        );
        let s = pool.stats();
        assert_eq!((s.jobs_run, s.jobs_deferred), (5, 5));
        pool.shutdown();
    });
}
