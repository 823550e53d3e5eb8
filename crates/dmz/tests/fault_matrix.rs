//! Fault matrix: device errors, zone conditions, running out of zones and a vanishing
//! backend, each injected with `zbd::FaultyDevice` over a small `MemDevice` while the engine
//! serves a seeded workload. Every test asserts the same contract:
//! - the error reaches the caller as EIO, ENOSPC or EROFS (never a panic or a hang: a
//!   watchdog aborts the binary if a test stops making progress);
//! - nothing acknowledged is lost: a per-block model of the writes (acknowledged, failed,
//!   flushed) is checked on the live engine and again after reopening the surviving device
//!   (faults cleared, or after a power cut for a backend that vanished);
//! - the metadata stays loadable (`sets::load`) and `check` finds nothing but the expected;
//! - reads of chunks the fault did not touch keep working.
//!
//! Each test prints how many faults it injected (`cargo test -- --nocapture`).

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use dmz::check::{check, FindingKind};
use dmz::engine::{Engine, EngineError, EngineOptions};
use dmz::format::Layout;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zbd::{FaultyDevice, MemDevice, Op, OpKind, ZoneCondition, ZoneOp};

type Dev = FaultyDevice<Arc<MemDevice>>;

/// Zones of 256 KiB (64 blocks): reclaim and commits come around quickly.
const ZONE_KIB: u64 = 256;
const NR_ZONES: u32 = 48;
const NR_CONV: u32 = 12;
const RESERVED: u32 = 3;

// ---------------------------------------------------------------------------------------
// Watchdog

/// Aborts the whole test binary (so that a hung engine fails the test instead of hanging it)
/// when the device completes no write for `secs` seconds in a row. It watches progress, not
/// the test's total time: a loaded machine makes a test slower, never a failure.
struct Watchdog(Option<mpsc::Sender<()>>);

fn watchdog(what: &'static str, secs: u64, dev: &Arc<Dev>) -> Watchdog {
    let dev = dev.clone();
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut last = dev.write_count();
        while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(secs))
        {
            let now = dev.write_count();
            if now == last {
                // Not eprintln!: the test harness captures that, and abort loses the capture.
                let _ = writeln!(
                    std::io::stderr(),
                    "WATCHDOG: {what}: no device write completed in {secs} s (engine hang); aborting"
                );
                std::process::abort();
            }
            last = now;
        }
    });
    Watchdog(Some(tx))
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Dropping the sender wakes the watchdog with Disconnected: done in time.
        self.0.take();
    }
}

// ---------------------------------------------------------------------------------------
// The model

/// What each 4 KiB block may read back as, by pattern id (0 = zeros).
struct Model {
    /// The last acknowledged write.
    cur: Vec<u64>,
    /// Contents as of the last successful flush.
    durable: Vec<u64>,
    /// Writes since the last flush (acknowledged or not): a power cut may keep any.
    since: Vec<Vec<u64>>,
    /// Failed writes newer than the last acknowledged one: may have landed, or not.
    failed: Vec<Vec<u64>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verify {
    /// Acknowledged writes (or a failed write after them) exactly.
    Acked,
    /// After a power cut: anything from the last flush onwards.
    PowerCut,
}

impl Model {
    fn new(blocks: u64) -> Model {
        let n = blocks as usize;
        Model {
            cur: vec![0; n],
            durable: vec![0; n],
            since: vec![Vec::new(); n],
            failed: vec![Vec::new(); n],
        }
    }

    fn acked(&mut self, start: u64, len: u64, id: u64) {
        for b in start..start + len {
            let b = b as usize;
            self.cur[b] = id;
            self.since[b].push(id);
            self.failed[b].clear();
        }
    }

    fn failed(&mut self, start: u64, len: u64, id: u64) {
        for b in start..start + len {
            self.failed[b as usize].push(id);
            self.since[b as usize].push(id);
        }
    }

    fn flushed(&mut self) {
        self.durable.copy_from_slice(&self.cur);
        self.since.iter_mut().for_each(Vec::clear);
    }

    fn ok(&self, b: usize, id: u64, mode: Verify) -> bool {
        let base = match mode {
            Verify::Acked => self.cur[b] == id,
            Verify::PowerCut => self.durable[b] == id || self.since[b].contains(&id),
        };
        base || self.failed[b].contains(&id)
    }

    /// Checks blocks `[start, start + buf/BS)` read into `buf`.
    fn check(&self, start: u64, buf: &[u8], mode: Verify) -> Result<(), String> {
        for (i, got) in buf.chunks(BS).enumerate() {
            let b = start + i as u64;
            let id = block_id(got, b)
                .map_err(|m| format!("{m}; expected write {}", self.cur[b as usize]))?;
            if !self.ok(b as usize, id, mode) {
                return Err(format!(
                    "block {b}: write {id}; expected {} (durable {}, since flush {:?}, failed {:?})",
                    self.cur[b as usize],
                    self.durable[b as usize],
                    self.since[b as usize],
                    self.failed[b as usize]
                ));
            }
        }
        Ok(())
    }

    /// Reads the whole volume chunk by chunk and checks it; `skip` chunks are not read.
    fn verify(&self, e: &Engine, mode: Verify, skip: &[u64]) -> Result<(), String> {
        let cs = e.chunk_size();
        let mut buf = vec![0u8; cs as usize];
        for c in 0..e.capacity() / cs {
            if skip.contains(&c) {
                continue;
            }
            e.read(c * cs, &mut buf)
                .map_err(|err| format!("read chunk {c}: {err}"))?;
            self.check(c * cs / BS as u64, &buf, mode)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The rig

struct Rig {
    dev: Arc<Dev>,
    layout: Layout,
    blocks: u64,
    chunk_blocks: u64,
    model: Model,
    rng: StdRng,
    id: u64,
    last_end: u64,
    /// Errors seen by the caller, by errno.
    errors: Vec<(i32, String)>,
    /// Record any errno instead of failing at once (the caller asserts later).
    any_errno: bool,
    /// A zone went offline or read-only for good: the volume runs degraded.
    degraded: bool,
}

fn opts() -> EngineOptions {
    let mut o = test_opts();
    o.commit_interval = Duration::from_millis(2);
    o.cache_bitmap_blocks = 4;
    o.reclaim.wait_timeout = Duration::from_secs(10);
    o
}

impl Rig {
    fn new(seed: u64) -> Rig {
        let mem = formatted_mem(ZONE_KIB, NR_ZONES, NR_CONV, RESERVED);
        let layout = dmz::sets::load(&*mem).expect("load").layout;
        let dev = Arc::new(FaultyDevice::new(mem).expect("faulty"));
        let e = open(dev.clone(), opts());
        let blocks = e.capacity() / BS as u64;
        let chunk_blocks = e.chunk_size() / BS as u64;
        close(e);
        Rig {
            dev,
            layout,
            blocks,
            chunk_blocks,
            model: Model::new(blocks),
            rng: StdRng::seed_from_u64(seed),
            id: 0,
            last_end: 0,
            errors: Vec::new(),
            any_errno: false,
            degraded: false,
        }
    }

    fn open(&self, o: EngineOptions) -> Engine {
        Engine::open(self.dev.clone(), o).expect("engine open on the surviving device")
    }

    fn note_err(&mut self, what: &str, err: &EngineError) {
        let errno = err.errno();
        assert!(
            self.any_errno || [libc::EIO, libc::ENOSPC, libc::EROFS].contains(&errno),
            "{what}: errno {errno} ({err}); expected EIO, ENOSPC or EROFS"
        );
        self.errors.push((errno, format!("{what}: {err}")));
    }

    fn count(&self, errno: i32) -> usize {
        self.errors.iter().filter(|e| e.0 == errno).count()
    }

    /// Writes blocks `[start, start + len)` with a fresh pattern and updates the model.
    fn write_at(&mut self, e: &Engine, start: u64, len: u64) -> Result<(), i32> {
        self.id += 1;
        let mut buf = vec![0u8; len as usize * BS];
        pattern(self.id, start, &mut buf);
        match e.write(start * BS as u64, &buf, false) {
            Ok(()) => {
                self.model.acked(start, len, self.id);
                self.last_end = start + len;
                Ok(())
            }
            Err(err) => {
                self.model.failed(start, len, self.id);
                self.note_err(&format!("write {start}+{len}"), &err);
                Err(err.errno())
            }
        }
    }

    fn flush(&mut self, e: &Engine) -> Result<(), i32> {
        match e.flush() {
            Ok(()) => {
                self.model.flushed();
                Ok(())
            }
            Err(err) => {
                self.note_err("flush", &err);
                Err(err.errno())
            }
        }
    }

    /// One random operation: small overwrites (buffers, conventional zones), whole-chunk
    /// writes (sequential zones), appends, reads checked against the model, flushes.
    fn step(&mut self, e: &Engine, mode: Verify) {
        let r: u32 = self.rng.gen_range(0..100);
        if r < 8 {
            let _ = self.flush(e);
            return;
        }
        if r < 25 {
            let len = self.rng.gen_range(1..=16).min(self.blocks);
            let start = self.rng.gen_range(0..=self.blocks - len);
            let mut buf = vec![0u8; len as usize * BS];
            match e.read(start * BS as u64, &mut buf) {
                Ok(()) => {
                    if let Err(m) = self.model.check(start, &buf, mode) {
                        panic!("live read: {m}");
                    }
                }
                Err(err) => self.note_err(&format!("read {start}+{len}"), &err),
            }
            return;
        }
        let (start, len) = if r < 40 {
            let c = self.rng.gen_range(0..self.blocks / self.chunk_blocks);
            (c * self.chunk_blocks, self.chunk_blocks)
        } else if r < 55 && self.last_end < self.blocks {
            let len = self.rng.gen_range(1..=32).min(self.blocks - self.last_end);
            (self.last_end, len)
        } else {
            let len = self.rng.gen_range(1..=8);
            (self.rng.gen_range(0..=self.blocks - len), len)
        };
        let _ = self.write_at(e, start, len);
    }

    /// Closes `e` (it must succeed unless the caller already saw an error), clears the
    /// faults, reopens, verifies the model, closes again and checks the metadata.
    fn reopen_and_verify(&mut self, e: Engine, mode: Verify, skip: &[u64]) -> Engine {
        let closed = try_close(e);
        if self.errors.is_empty() {
            closed.expect("close without any earlier error");
        }
        self.dev.clear_faults();
        let e = self.open(opts());
        if let Err(m) = self.model.verify(&e, mode, skip) {
            panic!("after reopen: {m}");
        }
        e
    }

    fn final_check(&self, e: Engine, allow: impl Fn(&dmz::check::Finding) -> bool) {
        close(e); // the fault was cleared
        dmz::sets::load(&*self.dev).expect("metadata loadable");
        let r = check(&*self.dev, false).expect("check runs");
        let bad: Vec<_> = r
            .errors
            .iter()
            .filter(|f| {
                (f.kind != FindingKind::UnmappedSeqNotEmpty || f.chunk.is_some()) && !allow(f)
            })
            .collect();
        assert!(bad.is_empty(), "check findings: {bad:#?}");
        assert_eq!(
            r.warnings.iter().any(|w| w.starts_with("degraded")),
            self.degraded,
            "check warnings: {:?}",
            r.warnings
        );
    }
}

/// Every zone is accounted for once reclaim is idle: in a pool, a chunk's data or buffer
/// zone, metadata, or lost. A failed operation must not leak the zone it was working on.
fn assert_zones_accounted(e: &Engine, what: &str) {
    e.wait_reclaim_idle();
    let s = e.stats();
    let sum = s.zones_free
        + s.zones_mapped
        + s.zones_buffer
        + s.zones_reserved
        + s.zones_pending_free
        + s.zones_meta
        + s.zones_offline
        + s.zones_read_only;
    assert!(
        sum == s.zones_total && s.zones_mapped == s.chunks_mapped,
        "{what}: zones leaked: {} accounted of {}, {} data zones for {} mapped chunks; {s:?}",
        sum,
        s.zones_total,
        s.zones_mapped,
        s.chunks_mapped
    );
}

/// The chunk's data and buffer zones, parsed from `Engine::debug_chunk`.
fn chunk_zones(e: &Engine, chunk: u32) -> (Option<u32>, Option<u32>) {
    let s = e.debug_chunk(chunk);
    let zone = |key: &str| {
        let rest = &s[s.find(key).expect("debug_chunk format") + key.len()..];
        let num: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        num.parse().ok()
    };
    (zone("dzone "), zone("bzone "))
}

// ---------------------------------------------------------------------------------------
// Device errors during user I/O, reclaim and commits

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ctx {
    /// The caller's own thread (data reads and writes, resets of reused zones, flushes).
    User,
    /// Reclaim's threads.
    Reclaim,
    /// The periodic commit thread.
    Commit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    /// Data writes (outside the metadata zones).
    Write,
    /// Writes to the metadata zones: log blocks (and, in a commit, set blocks).
    LogWrite,
    /// Writes of metadata set blocks (a commit's second phase).
    SetWrite,
    Reset,
    Flush,
}

fn in_ctx(ctx: Ctx) -> bool {
    let t = std::thread::current();
    let name = t.name().unwrap_or("");
    match ctx {
        Ctx::User => !name.starts_with("dmz-"),
        Ctx::Reclaim => name.starts_with("dmz-reclaim"),
        Ctx::Commit => name == "dmz-commit",
    }
}

fn kind_matches(kind: Kind, op: &Op, layout: &Layout, ctx: Ctx) -> bool {
    match (kind, op.kind) {
        (Kind::Read, OpKind::Read) => ctx != Ctx::User || !layout.is_meta_zone(op.zone),
        (Kind::Write, OpKind::Write) => !layout.is_meta_zone(op.zone),
        (Kind::LogWrite, OpKind::Write) => layout.is_meta_zone(op.zone),
        (Kind::SetWrite, OpKind::Write) => (0..2).any(|set| {
            let first = layout.set_start_block(set) * BS as u64;
            let end = first + u64::from(layout.nr_meta_blocks) * BS as u64;
            op.offset < end && op.offset + op.len > first
        }),
        (Kind::Reset, OpKind::ZoneMgmt(ZoneOp::Reset)) | (Kind::Reset, OpKind::ResetAll) => true,
        (Kind::Flush, OpKind::Flush) => true,
        _ => false,
    }
}

/// Runs the workload, arms a one-shot fault on the first `kind` operation issued in `ctx`
/// after some data exists, keeps going, then checks the contract. Returns faults injected.
fn device_error(ctx: Ctx, kind: Kind, seed: u64, zones_accounted: bool) -> u64 {
    let mut rig = Rig::new(seed);
    let _w = watchdog("device_error", 120, &rig.dev);
    let mut o = opts();
    if ctx == Ctx::Reclaim {
        // Reclaim often: keep conventional zones scarce.
        o.reclaim.low_free_pct = 90;
        o.reclaim.high_free_pct = 95;
    }
    if (ctx, kind) == (Ctx::User, Kind::Reset) {
        // Only the writer resets zones (reclaim would reset some first).
        o.reclaim.enabled = false;
    }
    let e = rig.open(o);
    if (ctx, kind) != (Ctx::User, Kind::Reset) {
        for _ in 0..60 {
            rig.step(&e, Verify::Acked);
        }
    } else {
        // Freed sequential zones that still hold data: the next allocations reset them.
        let cb = rig.chunk_blocks;
        for c in 0..rig.blocks / cb {
            rig.write_at(&e, c * cb, cb).unwrap();
        }
        for c in 0..8 {
            e.discard(c * cb * BS as u64, cb * BS as u64).unwrap();
            rig.model.acked(c * cb, cb, 0);
        }
        rig.flush(&e).unwrap();
    }
    let injected = Arc::new(AtomicU64::new(0));
    let (inj, layout) = (injected.clone(), rig.layout.clone());
    rig.dev.fail_matching(
        move |op| {
            let hit = kind_matches(kind, op, &layout, ctx)
                && in_ctx(ctx)
                && inj
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                        (n < 1).then_some(n + 1)
                    })
                    .is_ok();
            if hit {
                println!(
                    "injected EIO: {op:?} (block {}, zone {}, meta {})",
                    op.offset / BS as u64,
                    op.zone,
                    layout.is_meta_zone(op.zone)
                );
            }
            hit
        },
        libc::EIO,
    );
    for i in 0..400 {
        rig.step(&e, Verify::Acked);
        if i % 25 == 0 && ctx == Ctx::Reclaim {
            e.trigger_reclaim();
            e.wait_reclaim_idle();
        }
    }
    e.trigger_reclaim();
    e.wait_reclaim_idle();
    let n = injected.load(Ordering::SeqCst);
    println!(
        "{ctx:?} {kind:?} error: faults injected {n}, caller errors {} (EIO {}, ENOSPC {})",
        rig.errors.len(),
        rig.count(libc::EIO),
        rig.count(libc::ENOSPC)
    );
    // The device keeps serving reads, with every acknowledged write in place.
    if let Err(m) = rig.model.verify(&e, Verify::Acked, &[]) {
        panic!("live engine after the fault: {m}");
    }
    if zones_accounted {
        assert_zones_accounted(&e, &format!("{ctx:?} {kind:?} error"));
    }
    let e = rig.reopen_and_verify(e, Verify::Acked, &[]);
    // And it takes writes again once the fault is gone.
    rig.errors.clear();
    for _ in 0..40 {
        rig.step(&e, Verify::Acked);
    }
    assert!(rig.errors.is_empty(), "after reopen: {:?}", rig.errors);
    rig.final_check(e, |_| false);
    n
}

macro_rules! device_error_tests {
    ($($name:ident: $ctx:ident, $kind:ident, $must_inject:expr, $accounted:expr;)*) => {$(
        #[test]
        fn $name() {
            let n = device_error(Ctx::$ctx, Kind::$kind, seed(stringify!($name)), $accounted);
            if $must_inject {
                assert_eq!(n, 1, "the fault was never hit: the scenario does not exercise it");
            }
        }
    )*};
}

fn seed(name: &str) -> u64 {
    name.bytes().fold(0xfa17u64, |h, b| {
        h.wrapping_mul(31).wrapping_add(u64::from(b))
    })
}

// Columns: whether that context is sure to issue such an operation (commits never read or
// reset); whether every zone is accounted for afterwards (a failed reset, copy or flush
// gives its zone back).
device_error_tests! {
    user_read_error: User, Read, true, true;
    user_write_error: User, Write, true, true;
    user_reset_error: User, Reset, true, true;
    user_flush_error: User, Flush, true, true;
    reclaim_read_error: Reclaim, Read, true, true;
    reclaim_write_error: Reclaim, Write, true, true;
    user_log_write_error: User, LogWrite, true, true;
    reclaim_reset_error: Reclaim, Reset, true, true;
    reclaim_flush_error: Reclaim, Flush, true, true;
    commit_read_error: Commit, Read, false, true;

    commit_reset_error: Commit, Reset, false, true;
    commit_set_write_error: Commit, SetWrite, true, true;
    commit_flush_error: Commit, Flush, true, true;
}

#[test]
fn commit_write_error() {
    let n = device_error(
        Ctx::Commit,
        Kind::LogWrite,
        seed("commit_write_error"),
        true,
    );
    assert_eq!(
        n, 1,
        "the fault was never hit: the scenario does not exercise it"
    );
}

#[test]
fn reclaim_log_write_error() {
    let n = device_error(
        Ctx::Reclaim,
        Kind::LogWrite,
        seed("reclaim_log_write_error"),
        true,
    );
    assert_eq!(
        n, 1,
        "the fault was never hit: the scenario does not exercise it"
    );
}

// ---------------------------------------------------------------------------------------
// Zones turning offline or read-only

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    /// The data zone of a chunk in use.
    Data,
    /// The buffer zone of a chunk in use.
    Buffer,
    /// A zone no chunk uses.
    Free,
}

fn zone_condition(which: Which, cond: ZoneCondition) {
    let mut rig = Rig::new(0x20e5 ^ which as u64 ^ ((cond as u64) << 8));
    let _w = watchdog("zone_condition", 120, &rig.dev);
    // Reclaim only for writers waiting for a zone: a busy pass must not move chunk 3
    // between looking up its zones and losing one of them.
    let mut o = opts();
    o.reclaim.low_free_pct = 0;
    o.reclaim.high_free_pct = 0;
    let e = rig.open(o);
    let cb = rig.chunk_blocks;
    // Chunks 0..8 fully written (sequential data zones), then an overwrite of blocks 5..8
    // of each (a buffer zone per chunk).
    for c in 0..8 {
        rig.write_at(&e, c * cb, cb).unwrap();
        rig.write_at(&e, c * cb + 5, 3).unwrap();
    }
    rig.flush(&e).unwrap();
    let victim = 3u32;
    let (dz, bz) = chunk_zones(&e, victim);
    let zone = match which {
        Which::Data => dz.expect("chunk 3 mapped"),
        Which::Buffer => bz.expect("chunk 3 buffered"),
        Which::Free => {
            // The highest zone no chunk maps.
            let used: Vec<u32> = (0..rig.blocks / cb)
                .flat_map(|c| {
                    let (d, b) = chunk_zones(&e, c as u32);
                    [d, b]
                })
                .flatten()
                .collect();
            (0..NR_ZONES)
                .rev()
                .find(|z| !used.contains(z) && !rig.layout.is_meta_zone(*z))
                .expect("a free zone")
        }
    };
    rig.dev.set_condition(zone, cond).expect("set condition");
    rig.degraded = true;
    // Count what the engine still sends to the lost zone (the predicate never fails).
    let touched = Arc::new(AtomicU64::new(0));
    let t = touched.clone();
    rig.dev.fail_matching(
        move |op| {
            if op.zone == zone && !matches!(op.kind, OpKind::Report | OpKind::Flush) {
                t.fetch_add(1, Ordering::Relaxed);
            }
            false
        },
        libc::EIO,
    );
    let before = e.stats();
    println!(
        "{which:?} zone {zone} -> {cond:?} (chunk {victim}: {dz:?}/{bz:?}); faults injected 1"
    );

    let hit = which != Which::Free;
    let victim_blocks = u64::from(victim) * cb..u64::from(victim + 1) * cb;
    // Reads: everything but the lost zone's blocks.
    let mut buf = vec![0u8; cb as usize * BS];
    for c in 0..rig.blocks / cb {
        let r = e.read(c * cb * BS as u64, &mut buf);
        let lost = hit && c == u64::from(victim) && cond == ZoneCondition::Offline;
        match r {
            Ok(()) => {
                assert!(!lost, "read of chunk {c} on an offline zone succeeded");
                rig.model.check(c * cb, &buf, Verify::Acked).unwrap();
            }
            Err(err) => {
                assert!(lost, "read of chunk {c}: {err}");
                assert_eq!(err.errno(), libc::EIO, "{err}");
            }
        }
    }
    if lost_buffer_blocks_readable(which, cond) {
        // Blocks of the victim outside the buffer still read from the data zone.
        let mut b = vec![0u8; BS];
        e.read((victim_blocks.start + 20) * BS as u64, &mut b)
            .expect("data-zone block of a chunk whose buffer zone went away");
        rig.model
            .check(victim_blocks.start + 20, &b, Verify::Acked)
            .unwrap();
    }
    // A write to the lost buffer fails cleanly (EIO / EROFS). (Writes to a chunk whose
    // full data zone went away land in its buffer, and may succeed.)
    if which == Which::Buffer {
        let r = rig.write_at(&e, victim_blocks.start + 5, 1);
        // Unless reclaim already merged the buffer away (reading it still worked).
        let moved = chunk_zones(&e, victim).1 != Some(zone);
        assert!(r.is_err() || moved, "write onto a {cond:?} zone succeeded");
    }
    // Elsewhere writes keep working: the engine may learn about the zone from one failed
    // write, but must not keep using it (nor stall reclaim on it).
    let mut failed = Vec::new();
    for _ in 0..300 {
        let c = rig.rng.gen_range(0..rig.blocks / cb);
        if hit && c == u64::from(victim) {
            continue;
        }
        let s = c * cb + rig.rng.gen_range(0..cb - 4);
        if rig.write_at(&e, s, 4).is_err() {
            failed.push(rig.errors.last().cloned().unwrap());
            if failed.len() > 1 {
                break; // the assertion below fails anyway; ENOSPC can take a while
            }
        }
    }
    let _ = rig.flush(&e);
    let after = e.stats();
    println!(
        "zones offline {} -> {}, read-only {} -> {}; ops sent to the lost zone {}; \
         failed writes to other chunks {}",
        before.zones_offline,
        after.zones_offline,
        before.zones_read_only,
        after.zones_read_only,
        touched.load(Ordering::Relaxed),
        failed.len()
    );
    assert!(
        failed.len() <= 1 && failed.iter().all(|f| f.0 == libc::EIO),
        "writes to chunks not on the {cond:?} zone kept failing: {:?}",
        failed
    );
    let skip: Vec<u64> = if hit && cond == ZoneCondition::Offline {
        vec![u64::from(victim)]
    } else {
        vec![]
    };
    // Reopen (the zone stays offline / read-only): the rest is intact.
    let e = rig.reopen_and_verify(e, Verify::Acked, &skip);
    let s = e.stats();
    match cond {
        ZoneCondition::Offline => assert!(s.zones_offline >= 1, "{s:?}"),
        _ => assert!(s.zones_read_only >= 1, "{s:?}"),
    }
    if hit {
        let mut b = vec![0u8; BS];
        let r = rig.write_at(&e, victim_blocks.start + 5, 1);
        assert!(
            r.is_err(),
            "write onto a {cond:?} zone after reopen succeeded"
        );
        if cond == ZoneCondition::ReadOnly && which == Which::Data {
            assert_eq!(r.unwrap_err(), libc::EROFS);
            e.read(victim_blocks.start * BS as u64, &mut b).unwrap();
        }
    }
    rig.final_check(e, |f| {
        hit && (f.chunk == Some(victim) || f.zone == Some(zone))
            || f.zone == Some(zone) && cond == ZoneCondition::Offline
    });
}

/// With only the buffer zone gone offline the chunk's other blocks are still readable.
fn lost_buffer_blocks_readable(which: Which, cond: ZoneCondition) -> bool {
    which == Which::Buffer && cond == ZoneCondition::Offline
}

#[test]
fn data_zone_offline() {
    zone_condition(Which::Data, ZoneCondition::Offline);
}

#[test]
fn data_zone_read_only() {
    zone_condition(Which::Data, ZoneCondition::ReadOnly);
}

#[test]
fn buffer_zone_offline() {
    zone_condition(Which::Buffer, ZoneCondition::Offline);
}

#[test]
fn buffer_zone_read_only() {
    zone_condition(Which::Buffer, ZoneCondition::ReadOnly);
}

#[test]
fn free_zone_offline() {
    zone_condition(Which::Free, ZoneCondition::Offline);
}

#[test]
fn free_zone_read_only() {
    zone_condition(Which::Free, ZoneCondition::ReadOnly);
}

// ---------------------------------------------------------------------------------------
// Running out of free zones

#[test]
fn out_of_zones_without_reclaim_is_enospc() {
    let mut rig = Rig::new(0xe05c);
    let _w = watchdog("out_of_zones_without_reclaim_is_enospc", 120, &rig.dev);
    let mut o = opts();
    o.reclaim.enabled = false;
    let e = rig.open(o);
    let cb = rig.chunk_blocks;
    // One unaligned write per chunk (a conventional zone each), then an overwrite of a
    // fully written chunk (a buffer): conventional zones run out long before the chunks.
    let mut first = None;
    for c in 0..rig.blocks / cb {
        if rig.write_at(&e, c * cb + 1, 2).is_err() && first.is_none() {
            first = Some(c);
        }
    }
    let enospc = rig.count(libc::ENOSPC);
    println!(
        "no reclaim: first ENOSPC at chunk {first:?} of {}, {enospc} ENOSPC; faults injected 0",
        rig.blocks / cb
    );
    assert!(first.is_some(), "the volume never ran out of zones");
    assert_eq!(enospc, rig.errors.len(), "{:?}", rig.errors);
    // Reads and overwrites of what is mapped still work.
    rig.model.verify(&e, Verify::Acked, &[]).unwrap();
    rig.write_at(&e, 1, 2)
        .expect("in-place overwrite of a mapped chunk");
    rig.flush(&e).unwrap();
    rig.errors.clear();
    let e = rig.reopen_and_verify(e, Verify::Acked, &[]);
    rig.final_check(e, |_| false);
}

#[test]
fn random_overwrites_of_the_whole_volume() {
    let mut rig = Rig::new(0x0e11);
    let _w = watchdog("random_overwrites_of_the_whole_volume", 240, &rig.dev);
    let e = rig.open(opts());
    let cb = rig.chunk_blocks;
    let ops = if cfg!(debug_assertions) {
        3_000
    } else {
        30_000
    };
    for c in 0..rig.blocks / cb {
        rig.write_at(&e, c * cb, cb).expect("initial fill");
    }
    for i in 0..ops {
        let len = rig.rng.gen_range(1..=4);
        let s = rig.rng.gen_range(0..=rig.blocks - len);
        let _ = rig.write_at(&e, s, len);
        if i % 64 == 0 {
            let _ = rig.flush(&e);
        }
    }
    let s = e.stats();
    println!(
        "random overwrites: {ops} writes, ENOSPC {}, reclaimed zones {}; faults injected 0",
        rig.count(libc::ENOSPC),
        s.reclaim_zones
    );
    assert_eq!(
        rig.count(libc::ENOSPC),
        rig.errors.len(),
        "{:?}",
        rig.errors
    );
    rig.model.verify(&e, Verify::Acked, &[]).unwrap();
    rig.errors.clear();
    let e = rig.reopen_and_verify(e, Verify::Acked, &[]);
    rig.final_check(e, |_| false);
}

// ---------------------------------------------------------------------------------------
// A backend that vanishes

fn vanish(errno: i32, seed: u64, check_errno: bool) {
    let mut rig = Rig::new(seed);
    let _w = watchdog("vanish", 120, &rig.dev);
    let e = rig.open(opts());
    for _ in 0..150 {
        rig.step(&e, Verify::Acked);
    }
    assert!(rig.errors.is_empty(), "{:?}", rig.errors);
    let injected = Arc::new(AtomicU64::new(0));
    if errno == libc::EIO {
        // Dies a few writes from now, as a pulled cable would.
        let n = rig.dev.write_count() + rig.rng.gen_range(1..20);
        rig.dev.cut_power_after_writes(n);
    } else {
        let inj = injected.clone();
        rig.dev.fail_matching(
            move |_| {
                inj.fetch_add(1, Ordering::Relaxed);
                true
            },
            errno,
        );
    }
    rig.any_errno = true;
    let mut errs = 0;
    for _ in 0..100 {
        let before = rig.errors.len();
        rig.step(&e, Verify::PowerCut);
        errs += rig.errors.len() - before;
    }
    let n = injected
        .load(Ordering::Relaxed)
        .max(u64::from(rig.dev.is_dead()));
    println!(
        "backend gone ({}): faults injected {n}, caller errors {errs}",
        if errno == libc::EIO {
            "dead, EIO"
        } else {
            "ENODEV"
        }
    );
    assert!(errs > 0, "no error reached the caller");
    let errors = std::mem::take(&mut rig.errors);
    // What was not flushed may be gone: cut the power, then bring the device back. (No
    // consistency check on this engine: it reads bitmaps from the dead device.)
    e.crash_for_test();
    rig.dev.clear_faults();
    rig.dev.power_cut_random(seed).expect("power cut");
    let e = rig.open(opts());
    if let Err(m) = rig.model.verify(&e, Verify::PowerCut, &[]) {
        panic!("after the backend came back: {m}");
    }
    rig.final_check(e, |_| false);
    if !check_errno {
        return;
    }
    let wrong: Vec<_> = errors.iter().filter(|e| e.0 != libc::EIO).collect();
    assert!(
        wrong.is_empty(),
        "a vanished backend must read as EIO; {} of {} errors were not, first {:?}",
        wrong.len(),
        errors.len(),
        wrong.first()
    );
}

/// Data and metadata survive a dead backend and the power cut (the errno is
/// `backend_vanishes_eio`'s business).
#[test]
fn backend_vanishes_keeps_flushed_data() {
    vanish(libc::EIO, 0xdead, false);
}

#[test]
fn backend_vanishes_eio() {
    vanish(libc::EIO, 0xdead, true);
}

#[test]
fn backend_vanishes_enodev() {
    vanish(libc::ENODEV, 0xde0d, true);
}

/// A volume loads degraded while its lost zones fit in the reserve (sized by the format's
/// count of usable zones), and fails with a clear error once its chunks no longer fit.
#[test]
fn lost_zones_load_degraded_until_chunks_no_longer_fit() {
    let mem = mem_device(ZONE_KIB, NR_ZONES, NR_CONV);
    let fresh = format_dev(&mem, RESERVED);
    assert_eq!(fresh.nr_lost_zones, 0);
    let mut lost = 0;
    let err = loop {
        // Sequential zones from the top: never the metadata.
        mem.set_condition(NR_ZONES - 1 - lost, ZoneCondition::Offline)
            .expect("set condition");
        lost += 1;
        match dmz::sets::load(&mem) {
            Ok(l) => {
                assert_eq!(l.layout.nr_lost_zones, lost, "{:?}", l.layout);
                assert_eq!(l.layout.nr_chunks, fresh.nr_chunks);
            }
            Err(e) => break e.to_string(),
        }
    };
    println!("{lost} lost zones: {err}; faults injected {lost}");
    assert!(lost > RESERVED, "failed with only {lost} lost zones: {err}");
    assert!(err.contains("offline or read-only"), "{err}");
}
