//! The log layout's background thread (`LogEngine::start_background`): idle compaction makes
//! randomly written data one run per page again (and the data reads back, before and after
//! a reopen), of the pages writes changed or of those only that reads found scattered
//! (`CompactOn`), GC drains to its watermark with no writer, and a sleeping thread is woken
//! only for work, once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::lsl::*;
use common::*;
use dmz::lsl::{CompactOn, LogEngine, LogOptions, Phase};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zbd::ZonedDevice;

/// Compaction after 10 ms without I/O (tests wait for the thread, never for time).
fn opts() -> LogOptions {
    LogOptions {
        idle_period: Duration::from_millis(10),
        ..lsl_test_opts()
    }
}

fn open(dev: Arc<dyn ZonedDevice>) -> Arc<LogEngine> {
    Arc::new(LogEngine::open(dev, opts()).expect("open"))
}

/// Blocks `0..span` written in order, then `n` random 1-block overwrites; the model.
fn scatter(e: &LogEngine, span: u64, n: usize, seed: u64) -> LModel {
    let mut m = LModel::new(e);
    let mut id = 1;
    for s in (0..span).step_by(64) {
        m.write(e, s, 64.min(span - s), id, false);
        id += 1;
    }
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..n {
        m.write(e, rng.gen_range(0..span), 1, id, false);
        id += 1;
    }
    m
}

/// Once the background thread is done: asleep again, having compacted two pages, the first
/// two, each into at most 5 extents (one per 1 MiB zone it spans). The pages' extents.
fn first_two_pages_compacted(e: &LogEngine) -> Vec<u32> {
    e.debug_wait_background();
    let s = e.stats();
    assert_eq!(e.background_phase(), Phase::Asleep, "{s:?}");
    assert_eq!(s.compact_pages, 2, "{s:?}");
    let after = e.debug_page_extents();
    assert!(after[..2].iter().all(|&x| x <= 5), "{after:?}");
    after
}

#[test]
fn idle_compaction_makes_each_page_one_run_again() {
    // 64 zones of 1 MiB, 4 conventional: about 14 index pages exposed.
    let dev = formatted_lsl(1024, 64, 4, 64);
    let e = open(dev.clone());
    let span = 4 * 1020;
    let mut m = scatter(&e, span, 3000, 7);
    // Holes in every page (as a filesystem's free space, or fstrim, leaves): compacted, a
    // page's blocks are packed, and must count as one run then.
    for p in 0..4 {
        for (off, n) in [(100, 7), (400, 1), (777, 30)] {
            m.discard(&e, p * 1020 + off, n);
        }
    }
    let before = e.debug_page_extents();
    assert!(
        before.iter().any(|&x| x > 100),
        "random overwrites should scatter the pages: {before:?}"
    );
    e.start_background().unwrap();
    e.debug_wait_background();
    let s = e.stats();
    assert_eq!(e.background_phase(), Phase::Asleep, "{s:?}");
    assert_eq!(s.compact_marked_pages, 0);
    // A page (1,020 blocks) rewritten in one run spans at most 5 of these zones (255 data
    // blocks each, then the summary), so at most 5 extents.
    let after = e.debug_page_extents();
    assert!(
        after.iter().all(|&x| x <= 5),
        "pages still scattered after compaction: {after:?} (before {before:?})"
    );
    assert!(s.compact_pages >= 4, "{s:?}");
    e.debug_check().unwrap();
    m.verify(&e);
    e.stop_background();
    let e = Arc::try_unwrap(e)
        .ok()
        .expect("the thread let go of the engine");
    e.close().unwrap();
    let e = lopen(dev);
    e.debug_check().unwrap();
    m.verify(&e);
    assert_eq!(e.debug_page_extents(), after);
}

/// The default policy: data written at random and never read is left alone (no wake-up,
/// nothing copied); a sequential read that finds it scattered marks its pages and wakes the
/// sleeping thread, which compacts them once the volume is idle.
#[test]
fn compaction_follows_scattered_reads() {
    let dev = formatted_lsl(1024, 64, 4, 64);
    let o = LogOptions {
        compact: CompactOn::Reads,
        ..opts()
    };
    let e = Arc::new(LogEngine::open(dev, o).expect("open"));
    e.start_background().unwrap();
    e.debug_wait_background();
    let w0 = e.stats().background_wakeups;
    let span = 4 * 1020;
    let m = scatter(&e, span, 3000, 11);
    // Random 1-block reads need one device read each: nothing to mark.
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..200 {
        let b = rng.gen_range(0..span);
        m.verify_range(&e, b, 1);
    }
    e.debug_wait_background();
    let s = e.stats();
    assert_eq!(e.background_phase(), Phase::Asleep, "{s:?}");
    assert_eq!(s.background_wakeups, w0, "writes woke the thread: {s:?}");
    assert_eq!((s.compact_marked_pages, s.compact_pages), (0, 0), "{s:?}");
    let before = e.debug_page_extents();
    assert!(before.iter().any(|&x| x > 100), "{before:?}");
    // A sequential read of the first two pages (64 blocks at a time: each read several
    // runs on the device) marks them, and only them.
    // (Not counted here: the thread may compact page 0 before this thread looks, the idle
    // period being shorter than the verify; the two pages compacted, and only they, below.)
    m.verify_range(&e, 0, 2 * 1020);
    let after = first_two_pages_compacted(&e);
    assert!(after[2..4].iter().all(|&x| x > 100), "{after:?}");
    e.debug_check().unwrap();
    m.verify(&e);
}

/// A stream whose pieces went to two frontiers (writes in flight together take different
/// frontiers), read back in requests of one piece each: every request is one device read,
/// but the scan seeks between requests. It marks the pages, and idle compaction puts the
/// stream back in order. (Without the scan rule, `compact_scans`, nothing is marked:
/// `compact_pages` 0.)
#[test]
fn a_scan_of_a_stream_in_pieces_marks_and_compacts_it() {
    let dev = formatted_lsl(1024, 64, 4, 64);
    let o = LogOptions {
        compact: CompactOn::Reads,
        compact_scans: true,
        ..opts()
    };
    let e = Arc::new(LogEngine::open(dev, o).expect("open"));
    e.start_background().unwrap();
    e.debug_wait_background();
    let mut m = LModel::new(&e);
    let span = 2 * 1020;
    // Odd pieces are written while a plan of block `far` (never written: the plan is
    // dropped) holds the first frontier's turn, so they go to the second frontier.
    let far = 3 * 1020 * BS as u64;
    for (k, s) in (0..span).step_by(64).enumerate() {
        let held = (k % 2 == 1).then(|| e.plan_write(far, &[0u8; BS]).expect("a plan"));
        m.write(&e, s, 64.min(span - s), k as u64 + 1, false);
        drop(held);
    }
    let before = e.debug_page_extents();
    assert!(before[..2].iter().all(|&x| x > 10), "{before:?}");
    for s in (0..span).step_by(64) {
        m.verify_range(&e, s, 64.min(span - s));
    }
    first_two_pages_compacted(&e);
    e.debug_check().unwrap();
    m.verify(&e);
}

#[test]
fn gc_drains_to_its_watermark_without_a_writer() {
    // 24 zones of 256 KiB (63 data blocks), 4 conventional: random overwrites of the whole
    // exposed span leave free zones below `gc_start_zones`.
    let dev = formatted_lsl(256, 24, 4, 48);
    let e = open(dev.clone());
    let blocks = e.capacity() / BS as u64;
    let m = scatter(&e, blocks, 2000, 3);
    let s0 = e.stats();
    assert!(
        s0.zones_free < lsl_test_opts().gc_start_zones as u64,
        "the test needs GC due: {s0:?}"
    );
    e.start_background().unwrap();
    e.debug_wait_background();
    let s = e.stats();
    assert!(
        s.gc_zones_freed > s0.gc_zones_freed,
        "no zone freed without a writer: {s:?}"
    );
    assert!(
        s.zones_free >= lsl_test_opts().gc_start_zones as u64,
        "GC stopped below its watermark: {s:?}"
    );
    e.debug_check().unwrap();
    m.verify(&e);
}

#[test]
fn a_write_wakes_the_sleeping_thread_once() {
    let dev = formatted_lsl(1024, 64, 4, 64);
    let e = open(dev);
    e.start_background().unwrap();
    // Nothing mapped: the thread goes to sleep without a timeout.
    e.debug_wait_background();
    assert_eq!(e.background_phase(), Phase::Asleep);
    let w0 = e.stats().background_wakeups;
    // A write marks its page: one wake-up to start the wait for idle, one when the idle
    // period ends; the page is one run, so nothing to copy, and asleep again.
    lwrite(&e, 0, 16, 1, false);
    e.debug_wait_background();
    let s = e.stats();
    assert_eq!(e.background_phase(), Phase::Asleep, "{s:?}");
    assert_eq!(s.background_wakeups - w0, 2, "{s:?}");
    assert_eq!(s.compact_pages, 0);
}

/// Holds back the first read of a sequential zone's data part after `arm` (GC's or
/// compaction's copy reads: the test makes no read of its own meanwhile) until released.
struct ReadGate {
    dev: Arc<zbd::MemDevice>,
    zone: u64,
    data_bytes: u64,
    first_seq: u64,
    armed: std::sync::atomic::AtomicBool,
    arrived: std::sync::mpsc::SyncSender<()>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl zbd::ZonedDevice for ReadGate {
    fn geometry(&self) -> zbd::Geometry {
        self.dev.geometry()
    }
    fn report_zones(&self, first: u32, nr: u32) -> zbd::Result<Vec<zbd::Zone>> {
        self.dev.report_zones(first, nr)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> zbd::Result<()> {
        let copy_read =
            offset >= self.first_seq * self.zone && offset % self.zone < self.data_bytes;
        if copy_read && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.arrived.send(()).unwrap();
            self.release.lock().unwrap().recv().unwrap();
        }
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> zbd::Result<()> {
        self.dev.write_at(buf, offset)
    }
    fn writev_at(&self, bufs: &[&[u8]], offset: u64) -> zbd::Result<()> {
        self.dev.writev_at(bufs, offset)
    }
    fn zone_mgmt(&self, op: zbd::ZoneOp, zone: u32) -> zbd::Result<()> {
        self.dev.zone_mgmt(op, zone)
    }
    fn reset_all(&self) -> zbd::Result<()> {
        self.dev.reset_all()
    }
    fn flush(&self) -> zbd::Result<()> {
        self.dev.flush()
    }
    fn describe(&self) -> String {
        self.dev.describe()
    }
}

/// GC copies a batch with `wlock` released (docs/design.md, "GC"): while the background
/// thread's copy read is held back, no thread holds `wlock`, and a user write goes ahead
/// (placing, writing, logging) and completes, while a forced GC waits for the batch; once
/// the read is let go, GC finishes and every block reads back as last written. With the batch copied under `wlock`, as before, the lock is held
/// at the read.
#[test]
fn writers_go_ahead_while_gc_copies_a_batch() {
    // As `gc_drains_to_its_watermark_without_a_writer`: 256 KiB zones (63 data blocks and
    // one summary block), 4 conventional.
    let (tx, arrived) = std::sync::mpsc::sync_channel(1);
    let (release, rx) = std::sync::mpsc::channel();
    let gate = Arc::new(ReadGate {
        dev: formatted_lsl(256, 24, 4, 48),
        zone: 256 << 10,
        data_bytes: 63 * BS as u64,
        first_seq: 4,
        armed: false.into(),
        arrived: tx,
        release: std::sync::Mutex::new(rx),
    });
    let e = open(gate.clone());
    let blocks = e.capacity() / BS as u64;
    let mut m = scatter(&e, blocks, 2000, 5);
    let s0 = e.stats();
    let o = lsl_test_opts();
    assert!(
        s0.zones_free < o.gc_start_zones as u64 && s0.zones_free > o.gc_low_zones as u64,
        "the test needs GC due, and a user write that opens a zone needing no forced GC: {s0:?}"
    );
    gate.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    e.start_background().unwrap();
    arrived.recv().unwrap();
    assert!(!e.debug_wlock_held(), "wlock is held across GC's copy read");
    std::thread::scope(|s| {
        // A user write places, writes its data and logs while the copy read is held back
        // (it completes before the read is let go). A channel, not a join, so that a
        // writer stuck behind GC fails the test rather than hangs it.
        let (done_tx, done) = std::sync::mpsc::channel();
        let er = &e;
        s.spawn(move || {
            lwrite(er, 7, 3, 100_000, false);
            done_tx.send(()).unwrap();
        });
        let wrote = done.recv_timeout(Duration::from_secs(120));
        // A forced GC meanwhile (a frontier out of free zones) waits for the batch with
        // `wlock` held: the copier gives its work back without `wlock`, so both finish.
        let forced = s.spawn(|| e.debug_gc_one().unwrap());
        while e.debug_gc_copy_waiters() == 0 && !forced.is_finished() {
            std::thread::yield_now();
        }
        let forced_waited = !forced.is_finished();
        release.send(()).unwrap();
        assert!(wrote.is_ok(), "a user write waited for GC's copy");
        assert!(
            forced_waited,
            "a forced GC went ahead of the batch in flight"
        );
        forced.join().unwrap();
    });
    m.write(&e, 7, 3, 100_000, false); // the same write again, into the model too
    e.debug_wait_background();
    let s = e.stats();
    assert!(s.gc_zones_freed > s0.gc_zones_freed, "{s:?}");
    e.debug_check().unwrap();
    m.verify(&e);
}
