//! Planned reads on the log layout (`LogEngine::plan_read`, the frontend's hop-free reads):
//! the segments give what `LogEngine::read` gives, and the plan's guard keeps GC from
//! resetting a zone under the caller's device reads until it is dropped.

mod common;

use std::sync::Arc;

use common::lsl::*;
use common::*;
use dmz::engine::ReadSegment;
use dmz::lsl::{format, LogEngine, LogReadPlan};
use zbd::{EmulateOptions, Emulated, ZoneCondition};

const B: u64 = BS as u64;
const ZONE: u64 = 1 << 20;

/// A log-layout volume on an emulated image (which has a read source): 32 zones of 1 MiB, 4
/// conventional.
fn engine(dir: &tempfile::TempDir) -> (Arc<Emulated>, Arc<LogEngine>) {
    let path = dir.path().join("d.img");
    let mut o = EmulateOptions::new(32 * ZONE, ZONE);
    o.conventional = 4;
    let dev = Emulated::create(&path, &o).unwrap();
    format(&dev, &lsl_format_opts(64)).unwrap();
    let dev = Arc::new(dev);
    (dev.clone(), Arc::new(lopen(dev)))
}

/// Do what the frontend does with a plan ([`read_segments`]).
fn run(e: &LogEngine, plan: &LogReadPlan) -> Vec<u8> {
    let src = e
        .read_source()
        .expect("an emulated image has a read source");
    read_segments(src.fd, plan.segments())
}

fn read(e: &LogEngine, first: u64, n: u64) -> Vec<u8> {
    let mut b = vec![0u8; (n * B) as usize];
    e.read(first * B, &mut b).unwrap();
    b
}

#[test]
fn segments_read_what_read_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (_, e) = engine(&dir);
    // A stream, overwrites scattered into it, a discarded hole, blocks never written.
    lwrite(&e, 0, 64, 1, false);
    for (k, b) in [3u64, 9, 10, 40, 41, 42, 63].into_iter().enumerate() {
        lwrite(&e, b, 1, 10 + k as u64, false);
    }
    e.discard(20 * B, 4 * B).unwrap();
    lwrite(&e, 100, 8, 2, false);
    let s0 = e.stats();
    let ranges = [
        (0, 64),
        (2, 3),
        (8, 4),
        (18, 8),
        (60, 50),
        (96, 16),
        (200, 32),
    ];
    for (first, n) in ranges {
        let plan = e.plan_read(first * B, n * B).expect("uncontended: a plan");
        let got = run(&e, &plan);
        plan.complete();
        assert!(got == read(&e, first, n), "blocks {first}+{n}");
    }
    // Blocks never written are zeros of their own, not device reads; runs contiguous on
    // the device are one segment.
    let plan = e.plan_read(200 * B, 32 * B).unwrap();
    assert_eq!(
        plan.segments(),
        &[ReadSegment::Zeros {
            len: 32 * BS as u32
        }]
    );
    let plan = e.plan_read(18 * B, 8 * B).unwrap();
    let kinds: Vec<_> = plan
        .segments()
        .iter()
        .map(|s| match *s {
            ReadSegment::Zeros { len } => (false, len as u64 / B),
            ReadSegment::Device { len, .. } => (true, len as u64 / B),
        })
        .collect();
    assert_eq!(kinds, [(true, 2), (false, 4), (true, 2)]);
    drop(plan); // not completed: not counted
    let s = e.stats();
    assert_eq!(
        s.reads - s0.reads,
        2 * ranges.len() as u64,
        "one read per completed plan"
    );
    // Off block alignment or past the end: no plan.
    assert!(e.plan_read(100, B).is_none());
    assert!(e.plan_read(e.capacity(), B).is_none());
    assert!(e.plan_read(0, 0).is_none());
    e.debug_check().unwrap();
}

/// The race of issue 13: GC empties the zone a planned read is reading from. It copies the
/// live blocks and frees the zone, but its reset waits for the plan; meanwhile new reads get
/// no plan (they go through the engine), and the planned read's device reads still find the
/// data. Without the guard the reset would punch the zone and the read would return zeros.
#[test]
fn a_planned_read_holds_off_the_reset_of_its_zone() {
    let dir = tempfile::tempdir().unwrap();
    let (dev, e) = engine(&dir);
    let per_zone = ZONE / B;
    // Fill well past one zone, then overwrite most of the first zone's blocks: that zone is
    // full with few live blocks, GC's best victim.
    let n = 3 * per_zone;
    lwrite(&e, 0, n, 1, false);
    for b in (0..per_zone).filter(|b| b % 8 != 0) {
        lwrite(&e, b, 1, 2, false);
    }
    e.flush().unwrap();
    let want = read(&e, 0, 64);
    let plan = e.plan_read(0, 64 * B).expect("a plan");
    let victim = match plan.segments().first() {
        Some(ReadSegment::Device { offset, .. }) => {
            let src = e.read_source().unwrap();
            ((offset - src.base) / ZONE) as u32
        }
        other => panic!("block 0 is on the device: {other:?}"),
    };
    let full = zone(&*dev, victim);
    assert_eq!(full.cond, ZoneCondition::Full, "the victim: {full:?}");
    let freed = e.stats().gc_zones_freed;
    std::thread::scope(|s| {
        let gc = s.spawn(|| e.debug_gc_one().unwrap());
        // Wait until GC waits for the reset.
        while !gc.is_finished() && !e.debug_reset_pending() {
            std::thread::yield_now();
        }
        assert!(!gc.is_finished(), "GC reset the zone under a planned read");
        assert_eq!(zone(&*dev, victim), full, "not reset yet");
        assert!(
            e.plan_read(0, 64 * B).is_none(),
            "no new plan while a reset waits"
        );
        assert!(
            run(&e, &plan) == want,
            "the planned read still finds its data"
        );
        drop(plan);
        assert!(gc.join().unwrap(), "GC freed a zone");
    });
    assert_eq!(e.stats().gc_zones_freed, freed + 1);
    let z = zone(&*dev, victim);
    assert!(z.wp - z.start < ZONE, "the victim was reset: {z:?}");
    assert!(read(&e, 0, 64) == want, "the data moved with GC");
    let plan = e.plan_read(0, 64 * B).expect("a plan again");
    assert!(run(&e, &plan) == want, "and planned reads find it there");
    drop(plan);
    e.debug_check().unwrap();
}
