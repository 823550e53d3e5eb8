//! Bench: the worker pool's policies against a naive pool, and reclaim drain time on an
//! SMR-like latency model.
//!
//! Run: `cargo bench -p zonedd --bench workpool` (plain main, prints tables; well under a
//! minute on 2 cores). `WORKPOOL_BENCH_QUICK=1` shrinks every size by 4x.
//!
//! (a) Short works: throughput, wakeups per work and CPU time (getrusage, whole process) for
//!     `percpu`, `unbound:8` and a naive pool that notifies a condvar on every queue.
//!     * stream: one producer per CPU (pinned) queues distinct keys as fast as it can;
//!     * ping-pong: one producer queues a work and waits for it, so every work needs a wake.
//! (b) Reclaim drain: N dirty chunks, one work each, every copy waiting on an [`SmrModel`].
//!     * independent: each copy sleeps seek + transfer on its own, so waits overlap freely;
//!     * one spindle: a single head serves queued copies nearest-first (seeks reordered by
//!       queue depth), transfers strictly one at a time.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use workpool::{Policy, Pool};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// What the bench drives: the real pool or the naive baseline.
trait Target: Send + Sync {
    fn queue(&self, key: u64, job: Job);
    fn wait_idle(&self);
    /// (wakeups issued, wakeups that found nothing)
    fn wakeups(&self) -> (u64, u64);
    /// Worker threads alive.
    fn threads(&self) -> usize;
}

impl Target for Pool {
    fn queue(&self, key: u64, job: Job) {
        Pool::queue(self, key, job)
    }
    fn wait_idle(&self) {
        Pool::wait_idle(self)
    }
    fn wakeups(&self) -> (u64, u64) {
        let s = self.stats();
        (s.wakeups_issued, s.wakeups_empty)
    }
    fn threads(&self) -> usize {
        self.stats().workers
    }
}

/// Baseline: one FIFO, a fixed set of workers, `notify_one` on every queue. Ignores keys
/// (no per-key ordering), so it does strictly less than the real pool.
struct NaivePool {
    shared: Arc<NaiveShared>,
    threads: Vec<JoinHandle<()>>,
}

struct NaiveShared {
    state: Mutex<NaiveState>,
    work_cv: Condvar,
    idle_cv: Condvar,
    notifies: AtomicU64,
    empty: AtomicU64,
}

struct NaiveState {
    jobs: VecDeque<Job>,
    /// Queued plus running.
    pending: usize,
    stop: bool,
}

impl NaivePool {
    fn new(workers: usize) -> Self {
        let shared = Arc::new(NaiveShared {
            state: Mutex::new(NaiveState {
                jobs: VecDeque::new(),
                pending: 0,
                stop: false,
            }),
            work_cv: Condvar::new(),
            idle_cv: Condvar::new(),
            notifies: AtomicU64::new(0),
            empty: AtomicU64::new(0),
        });
        let threads = (0..workers)
            .map(|_| {
                let sh = shared.clone();
                thread::spawn(move || {
                    let mut st = sh.state.lock().unwrap();
                    loop {
                        if let Some(job) = st.jobs.pop_front() {
                            drop(st);
                            job();
                            st = sh.state.lock().unwrap();
                            st.pending -= 1;
                            if st.pending == 0 {
                                sh.idle_cv.notify_all();
                            }
                            continue;
                        }
                        if st.stop {
                            return;
                        }
                        st = sh.work_cv.wait(st).unwrap();
                        if st.jobs.is_empty() && !st.stop {
                            sh.empty.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        NaivePool { shared, threads }
    }
}

impl Target for NaivePool {
    fn queue(&self, _key: u64, job: Job) {
        let mut st = self.shared.state.lock().unwrap();
        st.jobs.push_back(job);
        st.pending += 1;
        drop(st);
        self.shared.work_cv.notify_one();
        self.shared.notifies.fetch_add(1, Ordering::Relaxed);
    }
    fn wait_idle(&self) {
        let mut st = self.shared.state.lock().unwrap();
        while st.pending != 0 {
            st = self.shared.idle_cv.wait(st).unwrap();
        }
    }
    fn wakeups(&self) -> (u64, u64) {
        (
            self.shared.notifies.load(Ordering::Relaxed),
            self.shared.empty.load(Ordering::Relaxed),
        )
    }
    fn threads(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for NaivePool {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().stop = true;
        self.shared.work_cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// User plus system CPU time of the whole process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct we pass; all-zero is a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid, writable pointer.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage failed");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn allowed_cpus() -> Vec<usize> {
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(_) => vec![0],
    }
}

fn pin_self(cpu: usize) {
    let mut set = CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = sched_setaffinity(Pid::from_raw(0), &set);
    }
}

fn scale(n: usize) -> usize {
    if std::env::var_os("WORKPOOL_BENCH_QUICK").is_some() {
        (n / 4).max(1)
    } else {
        n
    }
}

/// One measured run.
#[derive(Clone, Copy)]
struct Run {
    wall: Duration,
    cpu: Duration,
    works: u64,
    wakeups: u64,
    empty: u64,
    threads: usize,
}

fn median(mut runs: Vec<Run>) -> Run {
    runs.sort_by_key(|r| r.wall);
    runs[runs.len() / 2]
}

/// Runs `body` between two snapshots of wall time, CPU time and the target's wakeups.
fn measure(target: &dyn Target, works: u64, body: impl FnOnce()) -> Run {
    let (w0, e0) = target.wakeups();
    let (t0, c0) = (Instant::now(), cpu_time());
    body();
    target.wait_idle();
    let (wall, cpu) = (t0.elapsed(), cpu_time() - c0);
    let (w1, e1) = target.wakeups();
    Run {
        wall,
        cpu,
        works,
        wakeups: w1 - w0,
        empty: e1 - e0,
        threads: target.threads(),
    }
}

/// A short work: a few hundred nanoseconds of arithmetic.
fn short_job(seed: u64) -> Job {
    Box::new(move || {
        let mut x = seed;
        for _ in 0..256 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        }
        black_box(x);
    })
}

/// Every producer (one per CPU, pinned) queues `per_producer` works on distinct keys.
fn stream(target: Arc<dyn Target>, cpus: &[usize], per_producer: usize) -> Run {
    let go = Arc::new(Barrier::new(cpus.len() + 1));
    let producers: Vec<_> = cpus
        .iter()
        .enumerate()
        .map(|(p, &cpu)| {
            let (target, go) = (target.clone(), go.clone());
            thread::spawn(move || {
                pin_self(cpu);
                go.wait();
                for i in 0..per_producer as u64 {
                    target.queue(((p as u64) << 32) | i, short_job(i));
                }
            })
        })
        .collect();
    let works = (cpus.len() * per_producer) as u64;
    measure(&*target, works, || {
        go.wait();
        for t in producers {
            t.join().unwrap();
        }
    })
}

/// One producer queues a work and waits for it to run, `rounds` times.
fn ping_pong(target: &dyn Target, rounds: usize) -> Run {
    measure(target, rounds as u64, || {
        let (tx, rx) = mpsc::channel();
        for i in 0..rounds as u64 {
            let tx = tx.clone();
            target.queue(i % 64, Box::new(move || tx.send(i).unwrap()));
            rx.recv().unwrap();
        }
    })
}

fn warm_up(target: &dyn Target) {
    for i in 0..1000 {
        target.queue(i, short_job(i));
    }
    target.wait_idle();
}

fn short_works(cpus: &[usize]) {
    let per_producer = scale(100_000);
    let rounds = scale(20_000);
    println!(
        "(a) short works: stream = {} producers x {per_producer} works, ping-pong = {rounds} \
         round trips; median of 3",
        cpus.len()
    );
    println!(
        "{:<10} {:<12} {:>12} {:>10} {:>12} {:>12} {:>10} {:>8}",
        "pattern", "pool", "works/s", "us/work", "wakeups/wk", "empty/wk", "cpu us/wk", "threads"
    );
    type Make = fn() -> Arc<dyn Target>;
    let targets: [(&str, Make); 3] = [
        ("percpu", || {
            Arc::new(Pool::new("bench", "percpu".parse().unwrap()))
        }),
        ("unbound:8", || {
            Arc::new(Pool::new("bench", Policy::Unbound { max_active: 8 }))
        }),
        ("naive(8)", || Arc::new(NaivePool::new(8))),
    ];
    for pattern in ["stream", "ping-pong"] {
        for (name, make) in targets {
            let runs = (0..3)
                .map(|_| {
                    let t = make();
                    warm_up(&*t);
                    match pattern {
                        "stream" => stream(t, cpus, per_producer),
                        _ => ping_pong(&*t, rounds),
                    }
                })
                .collect();
            let r = median(runs);
            let n = r.works as f64;
            println!(
                "{:<10} {:<12} {:>12.0} {:>10.2} {:>12.3} {:>12.3} {:>10.2} {:>8}",
                pattern,
                name,
                n / r.wall.as_secs_f64(),
                r.wall.as_secs_f64() * 1e6 / n,
                r.wakeups as f64 / n,
                r.empty as f64 / n,
                r.cpu.as_secs_f64() * 1e6 / n,
                r.threads,
            );
        }
    }
}

/// SMR-like disk timing: a seek grows with the square root of the distance (short seeks are
/// dominated by settle time), a transfer is bytes over bandwidth.
#[derive(Clone, Copy, Debug)]
struct SmrModel {
    seek_min_ms: f64,
    seek_max_ms: f64,
    bandwidth_mb_s: f64,
    /// Bytes read and written per chunk copy.
    copy_bytes: u64,
    /// Positions (chunks) on the platter; seeks are scaled by distance over this span.
    span: u64,
}

impl SmrModel {
    fn seek(&self, from: u64, to: u64) -> Duration {
        if from == to {
            return Duration::ZERO;
        }
        let frac = from.abs_diff(to) as f64 / self.span as f64;
        let ms = self.seek_min_ms + (self.seek_max_ms - self.seek_min_ms) * frac.sqrt();
        Duration::from_secs_f64(ms / 1e3)
    }
    fn transfer(&self) -> Duration {
        Duration::from_secs_f64(self.copy_bytes as f64 / (self.bandwidth_mb_s * 1e6))
    }
}

/// Deterministic positions for the dirty chunks (xorshift, no dependency needed).
fn positions(n: usize, span: u64) -> Vec<u64> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % span
        })
        .collect()
}

/// Completion flag of one disk request.
type Done = (Mutex<bool>, Condvar);

/// One disk head serving queued requests nearest-first; transfers never overlap.
struct Spindle {
    model: SmrModel,
    state: Mutex<SpindleState>,
    cv: Condvar,
}

struct SpindleState {
    head: u64,
    /// (position, completion flag)
    queue: Vec<(u64, Arc<Done>)>,
    stop: bool,
}

impl Spindle {
    fn start(model: SmrModel) -> (Arc<Spindle>, JoinHandle<()>) {
        let disk = Arc::new(Spindle {
            model,
            state: Mutex::new(SpindleState {
                head: 0,
                queue: Vec::new(),
                stop: false,
            }),
            cv: Condvar::new(),
        });
        let d = disk.clone();
        let server = thread::spawn(move || loop {
            let mut st = d.state.lock().unwrap();
            while st.queue.is_empty() && !st.stop {
                st = d.cv.wait(st).unwrap();
            }
            if st.queue.is_empty() {
                return;
            }
            let head = st.head;
            let (i, _) = st
                .queue
                .iter()
                .enumerate()
                .min_by_key(|(_, (pos, _))| pos.abs_diff(head))
                .unwrap();
            let (pos, done) = st.queue.swap_remove(i);
            st.head = pos;
            drop(st);
            thread::sleep(d.model.seek(head, pos) + d.model.transfer());
            *done.0.lock().unwrap() = true;
            done.1.notify_one();
        });
        (disk, server)
    }

    /// Blocks the caller until the head has served a copy at `pos`.
    fn copy(&self, pos: u64) {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        self.state.lock().unwrap().queue.push((pos, done.clone()));
        self.cv.notify_one();
        let mut ok = done.0.lock().unwrap();
        while !*ok {
            ok = done.1.wait(ok).unwrap();
        }
    }

    fn stop(&self) {
        self.state.lock().unwrap().stop = true;
        self.cv.notify_one();
    }
}

/// Queues one reclaim work per dirty chunk (split over pinned producers) and drains.
/// Returns the run and the pool's measured peak of works executing at once.
fn drain(
    policy: Policy,
    cpus: &[usize],
    model: SmrModel,
    chunks: usize,
    spindle: bool,
) -> (Run, usize) {
    let pool: Arc<Pool> = Arc::new(Pool::new("reclaim", policy));
    let pos = Arc::new(positions(chunks, model.span));
    let disk = spindle.then(|| Spindle::start(model));
    let go = Arc::new(Barrier::new(cpus.len() + 1));
    let producers: Vec<_> = cpus
        .iter()
        .enumerate()
        .map(|(p, &cpu)| {
            let (pool, pos, go) = (pool.clone(), pos.clone(), go.clone());
            let disk = disk.as_ref().map(|(d, _)| d.clone());
            let n = cpus.len();
            thread::spawn(move || {
                pin_self(cpu);
                go.wait();
                for chunk in (p..pos.len()).step_by(n) {
                    let (pos, disk) = (pos.clone(), disk.clone());
                    pool.queue(
                        chunk as u64,
                        Box::new(move || match disk {
                            Some(d) => d.copy(pos[chunk]),
                            None => {
                                let from = pos[(chunk + 1) % pos.len()];
                                thread::sleep(model.seek(from, pos[chunk]) + model.transfer());
                            }
                        }),
                    );
                }
            })
        })
        .collect();
    let run = measure(&*pool, chunks as u64, || {
        go.wait();
        for t in producers {
            t.join().unwrap();
        }
    });
    if let Some((d, server)) = disk {
        d.stop();
        server.join().unwrap();
    }
    (run, pool.stats().peak_active)
}

fn reclaim(cpus: &[usize]) {
    let model = SmrModel {
        seek_min_ms: 1.0,
        seek_max_ms: 8.0,
        bandwidth_mb_s: 200.0,
        copy_bytes: 2 * 256 * 1024,
        span: 1 << 20,
    };
    let chunks = scale(256);
    println!();
    println!(
        "(b) reclaim drain of {chunks} dirty chunks, {} producers; {model:?}",
        cpus.len()
    );
    println!(
        "{:<12} {:<14} {:>10} {:>14} {:>12}",
        "disk model", "policy", "drain ms", "vs unbound:8", "peak active"
    );
    let policies = [
        Policy::Unbound { max_active: 1 },
        Policy::Unbound { max_active: 8 },
        Policy::PerCpu { max_per_cpu: 4 },
        "percpu".parse().unwrap(),
        Policy::Unbound { max_active: 64 },
    ];
    let mut summary = Vec::new();
    for spindle in [false, true] {
        let label = if spindle {
            "one spindle"
        } else {
            "independent"
        };
        let results: Vec<(Policy, Run, usize)> = policies
            .iter()
            .map(|&p| {
                let (r, peak) = drain(p, cpus, model, chunks, spindle);
                (p, r, peak)
            })
            .collect();
        let base = results
            .iter()
            .find(|(p, ..)| *p == Policy::Unbound { max_active: 8 })
            .map(|(_, r, _)| r.wall.as_secs_f64())
            .unwrap_or(1.0);
        if let Some((_, r, _)) = results.iter().find(|(p, ..)| *p == Policy::default()) {
            summary.push((label, r.wall.as_secs_f64() / base));
        }
        for (p, r, peak) in results {
            println!(
                "{:<12} {:<14} {:>10.1} {:>13.2}x {:>12}",
                label,
                p.to_string(),
                r.wall.as_secs_f64() * 1e3,
                r.wall.as_secs_f64() / base,
                peak
            );
        }
    }
    print_summary(&summary);
}

/// Prints the ratio the kernel story is about: per-CPU drain time over the capped unbound one.
fn print_summary(summary: &[(&str, f64)]) {
    let parts: Vec<String> = summary
        .iter()
        .map(|(label, ratio)| format!("{label} {ratio:.2}x"))
        .collect();
    println!(
        "{} / unbound:8 drain time: {} (kernel story: 27m12s / 34m17s = 0.79x)",
        Policy::default(),
        parts.join(", ")
    );
}

fn main() {
    let cpus = allowed_cpus();
    let t0 = Instant::now();
    short_works(&cpus);
    reclaim(&cpus);
    println!("\nbench took {:.1} s", t0.elapsed().as_secs_f64());
}
