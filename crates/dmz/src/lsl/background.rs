//! The background thread of a log-layout volume (docs/design.md, "Log layout", GC): GC that
//! drains to its watermark by itself, and idle compaction (`compact.rs`). It is started by
//! the daemon ([`LogEngine::start_background`]); the tests that drive GC themselves run
//! without it.
//!
//! One pass at a time, each a bounded piece of work under `wlock` (a GC batch or a victim's
//! finish), so writers interleave with it:
//! 1. **GC** while a victim (or compaction) is in progress; or free zones are below
//!    `gc_start_zones` and the best victim is worth copying (the pacing rule); or below
//!    `gc_high_zones` and the best victim is at least half invalid (cheap room ahead of the
//!    writers).
//! 2. **Compaction** when pages are marked: only after `idle_period` without a read, write or
//!    discard, then page after page while nothing arrives.
//! 3. Otherwise **sleep without a timeout**. The thread sleeps in one of three waits, and a
//!    writer wakes it (`nudge`, from the record's append, under `state`) only for what that
//!    wait is for: asleep (nothing to do) on GC need or a marked page; waiting for idle
//!    (timed) on GC need; stuck (GC and compaction can do nothing) on GC need once a zone's
//!    worth of blocks was written since. A read that marks a page (`CompactOn::Reads`)
//!    nudges the same way. An idle, clean volume makes no wakeup.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use super::compact::Compaction;
use super::gc::Step;
use super::meta::Meta;
use super::{EngineError, LogEngine};

/// The thread's phase (`Background::phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// No thread (not started, or stopped).
    Off = 0,
    Running = 1,
    /// Compaction has work and waits for `idle_period` without I/O.
    WaitingForIdle = 2,
    /// Nothing to do: asleep until a writer needs GC or marks a page.
    Asleep = 3,
    /// Work left that GC and compaction cannot do (no victim worth it, no room): asleep
    /// until writes make some.
    Stuck = 4,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            1 => Phase::Running,
            2 => Phase::WaitingForIdle,
            3 => Phase::Asleep,
            4 => Phase::Stuck,
            _ => Phase::Off,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Phase::Off => "off",
            Phase::Running => "running",
            Phase::WaitingForIdle => "waiting for idle",
            Phase::Asleep => "asleep",
            Phase::Stuck => "stuck",
        }
    }
}

#[derive(Default)]
pub(super) struct Background {
    phase: AtomicU8,
    /// The clock and the free zones when the thread went `Stuck`.
    stuck_clock: AtomicU64,
    stuck_free: AtomicU32,
    /// Wake-ups of the thread (tests and status).
    pub wakeups: AtomicU64,
    mu: Mutex<BgState>,
    /// Wakes the thread.
    cv: Condvar,
    /// Wakes [`LogEngine::debug_wait_background`] when the thread goes to sleep.
    idle_cv: Condvar,
}

#[derive(Default)]
struct BgState {
    stop: bool,
    /// Kicks given and taken: a kick between the thread's decision and its wait is not lost.
    kicks: u64,
    seen: u64,
    handle: Option<JoinHandle<()>>,
}

/// What the thread does after a pass.
enum Next {
    Again,
    /// Wait `idle_period` (or a kick).
    WaitIdle,
    /// Wait for a kick (the phase is set already, under `state`).
    Sleep,
}

impl Background {
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    fn set(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Release);
    }

    fn kick(&self) {
        let mut g = self.mu.lock();
        g.kicks += 1;
        self.set(Phase::Running);
        self.cv.notify_one();
    }

    /// Wait in `phase` for a kick (or `timeout`), unless one came since the last wait.
    fn wait(&self, timeout: Option<std::time::Duration>) {
        let mut g = self.mu.lock();
        if g.stop || g.kicks != g.seen {
            g.seen = g.kicks;
            self.set(Phase::Running);
            return;
        }
        if self.phase() != Phase::WaitingForIdle {
            self.idle_cv.notify_all();
        }
        match timeout {
            Some(t) => {
                self.cv.wait_for(&mut g, t);
            }
            None => self.cv.wait(&mut g),
        }
        g.seen = g.kicks;
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        self.set(Phase::Running);
    }
}

impl LogEngine {
    /// Start the background thread (GC to its watermark, idle compaction). It holds the
    /// engine only while it works; [`LogEngine::stop_background`] (or dropping the engine)
    /// stops it. Stop it before dropping the engine when the device is opened again next:
    /// should the last other reference go while a pass holds one, the engine is dropped on
    /// the thread at the pass's end, after the caller's drop returned.
    pub fn start_background(self: &Arc<Self>) -> Result<(), EngineError> {
        let mut g = self.bg.mu.lock();
        if g.handle.is_some() {
            return Ok(());
        }
        g.stop = false;
        let weak: Weak<LogEngine> = Arc::downgrade(self);
        let bg = self.bg.clone();
        self.bg.set(Phase::Running);
        let h = std::thread::Builder::new()
            .name("lsl-background".into())
            .spawn(move || run(weak, bg))
            .map_err(|e| {
                self.bg.set(Phase::Off);
                EngineError::Meta(format!("spawn the log layout's GC thread: {e}"))
            })?;
        g.handle = Some(h);
        Ok(())
    }

    /// Stop the background thread and wait for it (its work in progress is left for the
    /// next one: a victim half copied is finished by the next GC, or at the next open
    /// never was).
    pub fn stop_background(&self) {
        let h = {
            let mut g = self.bg.mu.lock();
            g.stop = true;
            self.bg.cv.notify_all();
            g.handle.take()
        };
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    /// The background thread's phase.
    pub fn background_phase(&self) -> Phase {
        self.bg.phase()
    }

    /// Test hook: wait until the background thread sleeps (asleep or stuck) or is off.
    #[doc(hidden)]
    pub fn debug_wait_background(&self) {
        let mut g = self.bg.mu.lock();
        while !matches!(self.bg.phase(), Phase::Asleep | Phase::Stuck | Phase::Off)
            || g.kicks != g.seen
        {
            self.bg.idle_cv.wait(&mut g);
        }
    }

    /// Wake the background thread if `st` (just changed by a record) gives the wait it is
    /// in something to do. Called under `state`, as the thread decides to sleep, so no
    /// change is missed.
    pub(super) fn nudge(&self, st: &Meta) {
        let gc_need = || st.zones.nr_free() < self.opts.gc_start_zones;
        let kick = match self.bg.phase() {
            Phase::Asleep => gc_need() || st.compact.len() > 0,
            Phase::WaitingForIdle => gc_need(),
            // GC may have work once a zone's worth of blocks is written; compaction once
            // a zone is freed.
            Phase::Stuck => {
                (gc_need()
                    && st.clock
                        >= self.bg.stuck_clock.load(Ordering::Relaxed)
                            + self.layout.data_blocks() as u64)
                    || st.zones.nr_free() > self.bg.stuck_free.load(Ordering::Relaxed)
            }
            Phase::Running | Phase::Off => false,
        };
        if kick {
            self.bg.kick();
        }
    }

    /// Reads, writes and discards so far: compaction waits for a period without a change.
    fn activity(&self) -> u64 {
        let c = &self.stats;
        c.reads.load(Ordering::Relaxed)
            + c.read_marks.load(Ordering::Relaxed)
            + c.writes.load(Ordering::Relaxed)
            + c.discards.load(Ordering::Relaxed)
    }

    /// One pass of the thread; `idle_mark` is the activity count when the current wait for
    /// idle began.
    fn bg_pass(&self, idle_mark: &mut Option<u64>) -> Next {
        // Records appended from here on are seen by the decision or undo it (`sleep`).
        let seq = self.state.lock().log.next_seq;
        if self.check_failed().is_err() {
            return self.sleep(Phase::Asleep, None);
        }
        if self.gc_wanted() {
            let mut w = self.wlock.lock();
            return match self.gc_step(self.opts.gc_batch_blocks.max(1) as u64, Some(&mut w)) {
                Ok(Step::Copied(_) | Step::Finished) => Next::Again,
                // A writer's paced step copies a batch: wait for it, not for `wlock`.
                Ok(Step::Busy) => {
                    drop(w);
                    self.wait_gc_copied();
                    Next::Again
                }
                Ok(Step::NoVictim) | Err(EngineError::NoSpace(_)) => {
                    self.sleep(Phase::Stuck, Some(seq))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "background GC failed");
                    self.sleep(Phase::Asleep, None)
                }
            };
        }
        if self.state.lock().compact.len() == 0 {
            return self.sleep(Phase::Asleep, Some(seq));
        }
        let now = self.activity();
        if *idle_mark != Some(now) {
            *idle_mark = Some(now);
            return match self.sleep(Phase::WaitingForIdle, Some(seq)) {
                Next::Sleep => Next::WaitIdle,
                again => again,
            };
        }
        let _w = self.wlock.lock();
        match self.compact_next(256) {
            Ok(Compaction::Nothing) => self.sleep(Phase::Asleep, Some(seq)),
            Ok(Compaction::NoRoom) => self.sleep(Phase::Stuck, Some(seq)),
            Ok(Compaction::Scanning | Compaction::Started) => Next::Again,
            Err(e) => {
                tracing::warn!(error = %e, "background compaction failed");
                self.sleep(Phase::Asleep, None)
            }
        }
    }

    /// Whether GC should run now (see the module's rule 1).
    fn gc_wanted(&self) -> bool {
        let st = self.state.lock();
        if st.gc_busy() {
            return true;
        }
        let free = st.zones.nr_free();
        (free < self.opts.gc_start_zones && self.gc_owed(&st))
            || (free < self.opts.gc_high_zones && self.victim_ratio(&st).is_some_and(|r| r <= 1.0))
    }

    /// Set `phase` for the wait that follows, under `state`, so that a record appended after
    /// it sees it (see [`LogEngine::nudge`]); unless a record was appended since the decision
    /// (`seq`, the log's next sequence number when the pass began): then decide again.
    fn sleep(&self, phase: Phase, seq: Option<u64>) -> Next {
        let st = self.state.lock();
        if seq.is_some_and(|s| st.log.next_seq != s) {
            return Next::Again;
        }
        // A read marks pages without a record: one that did since the decision is seen
        // here, or sees `Asleep` and kicks (`note_read` nudges under `state`).
        if phase == Phase::Asleep && seq.is_some() && st.compact.len() > 0 {
            return Next::Again;
        }
        self.bg.stuck_clock.store(st.clock, Ordering::Relaxed);
        self.bg
            .stuck_free
            .store(st.zones.nr_free(), Ordering::Relaxed);
        self.bg.set(phase);
        Next::Sleep
    }
}

fn run(weak: Weak<LogEngine>, bg: Arc<Background>) {
    let mut idle_mark = None;
    loop {
        if bg.mu.lock().stop {
            break;
        }
        let Some(e) = weak.upgrade() else { break };
        let next = e.bg_pass(&mut idle_mark);
        let idle_period = e.opts.idle_period;
        drop(e);
        match next {
            Next::Again => {}
            Next::WaitIdle => bg.wait(Some(idle_period)),
            Next::Sleep => bg.wait(None),
        }
    }
    bg.set(Phase::Off);
    let _g = bg.mu.lock();
    bg.idle_cv.notify_all();
}
