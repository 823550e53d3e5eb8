//! `Engine::plan_read`: the segments of a planned read give what `Engine::read` gives, and
//! the plan's guard keeps reclaim and writes off the chunk's zones until it is dropped.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use dmz::engine::{Engine, ReadPlan, ReadSegment};
use zbd::{EmulateOptions, Emulated, ZonedDevice};

const B: u64 = BS as u64;

/// An engine on an emulated image (which has a read source), background reclaim off.
fn engine(dir: &tempfile::TempDir) -> Engine {
    let path = dir.path().join("d.img");
    let mut o = EmulateOptions::new(32 << 20, 1 << 20);
    o.conventional = 8;
    let dev = Emulated::create(&path, &o).unwrap();
    format_dev(&dev, 2);
    let dev: Arc<dyn ZonedDevice> = Arc::new(dev);
    let mut opts = test_opts();
    opts.reclaim.enabled = false;
    open(dev, opts)
}

/// Do what the frontend does with a plan ([`read_segments`]).
fn run(e: &Engine, plan: &ReadPlan) -> Vec<u8> {
    let src = e
        .read_source()
        .expect("an emulated image has a read source");
    let out = read_segments(src.fd, plan.segments());
    assert_eq!(out.len() as u64, plan.len(), "segments cover the request");
    out
}

fn read(e: &Engine, off: u64, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    e.read(off, &mut b).unwrap();
    b
}

fn write(e: &Engine, id: u64, block: u64, n: u64) {
    let mut w = vec![0u8; (n * B) as usize];
    pattern(id, block, &mut w);
    e.write(block * B, &w, false).unwrap();
}

/// Chunk 0: a sequential data zone (blocks 0..32) with overwrites in a buffer zone and a
/// hole; chunk 1: a conventional data zone (first write unaligned); chunk 2: unmapped.
fn populate(e: &Engine) -> u64 {
    let cb = e.chunk_size() / B;
    write(e, 1, 0, 32);
    write(e, 2, 4, 3);
    write(e, 3, 20, 1);
    e.discard(10 * B, 2 * B).unwrap();
    write(e, 4, 40, 2);
    write(e, 5, cb + 7, 9);
    cb
}

#[test]
fn segments_read_what_read_returns() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir);
    let cb = populate(&e);
    let s0 = e.stats();
    assert!(s0.zones_buffer >= 1, "chunk 0 has a buffer zone: {s0:?}");
    let ranges = [
        (0, 64),
        (3, 5),
        (9, 4),
        (20, 1),
        (30, 16),
        (0, cb),
        (cb, 32),
        (cb + 5, 20),
        (2 * cb, 16),
    ];
    let mut completed = 0;
    for (first, n) in ranges {
        let plan = e.plan_read(first * B, n * B).expect("uncontended: a plan");
        let got = run(&e, &plan);
        plan.complete();
        completed += 1;
        assert!(got == read(&e, first * B, n * B), "blocks {first}+{n}");
    }
    // The zeros are segments of their own, not device reads.
    let plan = e.plan_read(2 * cb * B, 16 * B).unwrap();
    assert_eq!(
        plan.segments(),
        &[ReadSegment::Zeros {
            len: 16 * BS as u32
        }]
    );
    drop(plan); // (a plan holds its chunk's lock: close below would wait for it)
    let plan = e.plan_read(8 * B, 6 * B).unwrap();
    assert_eq!(plan.segments().len(), 3, "{plan:?}");
    assert_eq!(
        plan.segments()[1],
        ReadSegment::Zeros { len: 2 * BS as u32 }
    );
    drop(plan); // not completed: not counted
                // One read per completed plan (and per Engine::read), as the engine counts reads.
    let s = e.stats();
    assert_eq!(s.reads - s0.reads, 2 * completed);
    // A plan never crosses a chunk end, nor goes past the end or off block alignment.
    assert!(e.plan_read((cb - 1) * B, 2 * B).is_none());
    assert!(e.plan_read(100, B).is_none());
    assert!(e.plan_read(e.capacity(), B).is_none());
    close(e);
}

#[test]
fn planned_read_holds_off_reclaim_and_writes() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(&dir);
    let cb = populate(&e);
    let want = read(&e, 0, 64 * B);
    let before = e.debug_chunk(0);
    let plan = e.plan_read(0, 64 * B).unwrap();
    // A background pass skips the busy chunk.
    assert!(!e.debug_reclaim_chunk(0, false).unwrap(), "skipped");
    let reclaimed = AtomicBool::new(false);
    let written = AtomicBool::new(false);
    std::thread::scope(|s| {
        // An urgent pass waits for the planned read...
        let r = s.spawn(|| {
            let ok = e.debug_reclaim_chunk(0, true).unwrap();
            reclaimed.store(true, Ordering::SeqCst);
            ok
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !reclaimed.load(Ordering::SeqCst),
            "reclaim waits for the read"
        );
        // ...and while it waits, new plans of the chunk are refused (the caller falls back
        // to Engine::read, which queues behind reclaim): the writer is not starved.
        assert!(e.plan_read(0, B).is_none(), "contended: no plan");
        assert!(e.plan_read(cb * B, B).is_some(), "another chunk is free");
        // The zones the plan names still hold the data.
        assert!(run(&e, &plan) == want, "data intact under the plan");
        drop(plan);
        assert!(
            r.join().unwrap(),
            "reclaim went ahead once the plan was dropped"
        );
        // A write of the chunk waits for a plan too.
        let plan = e.plan_read(0, 8 * B).unwrap();
        let w = s.spawn(|| {
            write(&e, 9, 2, 1);
            written.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !written.load(Ordering::SeqCst),
            "the write waits for the read"
        );
        let got = run(&e, &plan);
        assert!(
            got == want[..8 * BS],
            "the planned read sees the data before the write"
        );
        drop(plan);
        w.join().unwrap();
    });
    assert_ne!(e.debug_chunk(0), before, "reclaim moved the chunk");
    assert_eq!(e.stats().reclaim_zones, 1);
    let mut want2 = want.clone();
    pattern(9, 2, &mut want2[2 * BS..3 * BS]);
    let plan = e.plan_read(0, 64 * B).unwrap();
    assert!(
        run(&e, &plan) == want2,
        "a new plan reads the reclaimed zones"
    );
    drop(plan);
    assert!(read(&e, 0, 64 * B) == want2);
    close(e);
}

#[test]
fn devices_without_a_read_source_give_no_plan() {
    let dev = formatted_mem(1024, 16, 6, 1);
    let e = open(dev, test_opts());
    assert!(e.read_source().is_none());
    assert!(
        e.plan_read(0, B).is_none(),
        "a memory device is read by Engine::read"
    );
    close(e);
}
