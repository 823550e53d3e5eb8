//! `Engine::plan_write` (hop-free writes): the engine plans exactly the overwrites in place
//! that need nothing before their data, the caller's device write plus `complete` + `sync`
//! gives what `Engine::write` gives (read back, and after a daemon crash), and the plan
//! keeps everything else off the chunk until it is completed or dropped.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use dmz::engine::{Engine, WritePlan};
use zbd::{EmulateOptions, Emulated, FaultyDevice, ZonedDevice};

const B: u64 = BS as u64;

fn data(id: u64, block: u64, n: u64) -> Vec<u8> {
    let mut buf = vec![0u8; (n * B) as usize];
    pattern(id, block, &mut buf);
    buf
}

/// `len` bytes of zeros: the data of a plan only asked about.
fn zeros(len: u64) -> Vec<u8> {
    vec![0u8; len as usize]
}

fn read(e: &Engine, block: u64, n: u64) -> Vec<u8> {
    let mut buf = vec![0u8; (n * B) as usize];
    e.read(block * B, &mut buf).unwrap();
    buf
}

/// Put `buf` on the device through the engine's read source with `pwrite`, as a queue
/// thread's ring does, then complete and sync the plan.
fn write_through_source(e: &Engine, plan: WritePlan, buf: &[u8]) {
    let src = e
        .read_source()
        .expect("an emulated image has a read source");
    assert!(
        src.conv_writes,
        "an emulated image takes conventional writes through it"
    );
    let off = src.base + plan.device_offset();
    // SAFETY: `buf` is a live buffer of `buf.len()` bytes, and the read source's descriptor
    // stays open while the engine (its device) lives.
    let n = unsafe { libc::pwrite(src.fd, buf.as_ptr().cast(), buf.len(), off as libc::off_t) };
    assert_eq!(n, buf.len() as isize, "pwrite at {off}");
    let w = plan.complete(buf).unwrap();
    e.sync(w).unwrap();
}

fn emulated_opts() -> EmulateOptions {
    let mut o = EmulateOptions::new(32 << 20, 1 << 20);
    o.conventional = 8;
    o
}

/// Reclaim off; every chunk's first write maps a conventional zone (with small zones a
/// first write anywhere is otherwise an early stream piece, in a sequential zone).
fn opts() -> dmz::engine::EngineOptions {
    let mut opts = test_opts();
    opts.reclaim.enabled = false;
    opts.direct_sequential = false;
    opts
}

#[test]
fn a_planned_write_through_the_read_source_reads_back_and_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.img");
    let dev = Emulated::create(&path, &emulated_opts()).unwrap();
    format_dev(&dev, 2);
    let e = open(Arc::new(dev), opts());
    let chunk = e.chunk_size() / B;
    // Block 5 of chunk 1: not a chunk's start, so the chunk maps a conventional zone.
    let at = chunk + 5;
    e.write(at * B, &data(1, at, 2), false).unwrap();
    e.debug_commit().unwrap();
    // Overwrite the two valid blocks and write the invalid one after them.
    let new = data(2, at, 3);
    let plan = e
        .plan_write(at * B, &new)
        .expect("an overwrite in place is planned");
    write_through_source(&e, plan, &new);
    assert_eq!(read(&e, at, 3), new);
    assert_eq!(e.stats().planned_writes, 1);
    // A daemon crash (no flush, no close): acknowledged means synced, so it is all there.
    crash(e);
    let dev: Arc<dyn ZonedDevice> = Arc::new(Emulated::open(&path).unwrap());
    let e = open(dev, opts());
    assert_eq!(read(&e, at, 3), new);
    close(e);
}

#[test]
fn only_writes_that_need_nothing_first_are_planned() {
    let e = open(formatted_mem(1024, 16, 6, 2), opts());
    let chunk = e.chunk_size() / B;
    let at = 2 * chunk + 10;
    assert!(
        e.plan_write(at * B, &zeros(B)).is_none(),
        "an unmapped chunk needs a zone"
    );
    e.write(at * B, &data(2, at, 1), false).unwrap();
    // Unflushed records: a new block may be written in place, an overwrite of a valid one
    // needs its record ahead of the data, and a run mixing both is cut by a write step.
    assert!(e.plan_write((at + 1) * B, &zeros(B)).is_some());
    let ahead = e
        .plan_write(at * B, &data(3, at, 1))
        .expect("written ahead");
    assert!(
        ahead.sync_first().is_some(),
        "its record goes ahead of the data"
    );
    drop(ahead);
    assert!(
        e.plan_write(at * B, &zeros(2 * B)).is_none(),
        "validity changes"
    );
    assert!(
        e.plan_write((3 * chunk - 1) * B, &zeros(2 * B)).is_none(),
        "crosses a chunk end"
    );
    e.flush().unwrap();
    assert!(
        e.plan_write((at + 1) * B, &zeros(B)).is_none(),
        "flushed records not proven yet need a proof block first"
    );
    e.debug_commit().unwrap();
    assert!(e.plan_write(at * B, &zeros(B)).is_some(), "folded: proven");
    assert!(e.plan_write(at * B, &zeros(2 * B)).is_some());
    assert_eq!(e.stats().planned_writes, 0, "plans dropped record nothing");
    close(e);
}

/// Plans of one chunk are in flight together over different blocks, never over the same
/// ones, and everything that takes the chunk exclusive (here a write through the pool)
/// waits until the last of them ends.
#[test]
fn plans_of_one_chunk_share_it_and_hold_off_the_rest() {
    let e = Arc::new(open(formatted_mem(1024, 16, 6, 2), opts()));
    let chunk = e.chunk_size() / B;
    let at = chunk + 3;
    e.write(at * B, &data(1, at, 1), false).unwrap();
    e.debug_commit().unwrap();
    let new = data(3, at + 2, 2);
    let p1 = e.plan_write((at + 1) * B, &data(9, at + 1, 1)).unwrap();
    let p2 = e.plan_write((at + 2) * B, &new).unwrap();
    assert!(
        e.plan_write((at + 3) * B, &zeros(B)).is_none(),
        "overlaps the second plan"
    );
    assert!(
        e.plan_write(at * B, &zeros(2 * B)).is_none(),
        "overlaps the first plan"
    );
    // The first plan's data reaches the device, but the plan is dropped: nothing recorded.
    p1.write_for_test(&data(9, at + 1, 1)).unwrap();
    p2.write_for_test(&new).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let t = {
        let (e, done) = (e.clone(), done.clone());
        std::thread::spawn(move || {
            e.write(at * B, &data(2, at, 1), false).unwrap();
            done.store(true, Ordering::SeqCst);
        })
    };
    // The writer cannot pass the plans: it waits for the chunk lock, which only the end of
    // both releases (no timing: the flag can only be set after that).
    assert!(!done.load(Ordering::SeqCst));
    drop(p1);
    assert!(!done.load(Ordering::SeqCst));
    let w = p2.complete(&new).unwrap();
    e.sync(w).unwrap();
    t.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    assert_eq!(read(&e, at, 1), data(2, at, 1));
    assert_eq!(
        read(&e, at + 1, 1),
        vec![0u8; BS],
        "a dropped plan records nothing"
    );
    assert_eq!(read(&e, at + 2, 2), new);
    let e = Arc::try_unwrap(e).ok().unwrap();
    close(e);
}

/// Two plans in a proven zone: the first (new blocks: a record) completed and flushed while
/// the second is in flight. That flush must prove the first one's record: otherwise the
/// second one's record follows it unflushed, the zone reads as `Unflushed` instead of
/// "flushed, unproven", and a later overwrite of the first one's block through the pool
/// skips its proof flush; a power cut that keeps that overwrite's data but not its log
/// block then fails the first record's CRC check, and the flushed write reads as zeros.
#[test]
fn a_flush_while_a_plan_is_in_flight_proves_what_other_plans_recorded() {
    flush_with_plans_in_flight(|e, _| e.flush().unwrap());
}

/// Two plans of a proven zone in flight, the first completed, then `flush` (which must
/// prove the first plan's record: one proof flush), the second completed; an overwrite of
/// the first plan's block through the pool, then a power cut that keeps only the last write
/// since the flush (that overwrite's data): the flushed planned write must survive.
fn flush_with_plans_in_flight(flush: impl Fn(&Engine, &dyn ZonedDevice)) {
    let dev = Arc::new(FaultyDevice::new(formatted_mem(1024, 16, 6, 2)).unwrap());
    let e = open(dev.clone(), opts());
    let chunk = e.chunk_size() / B;
    let at = chunk + 3;
    e.write(at * B, &data(1, at, 2), false).unwrap();
    e.debug_commit().unwrap();
    let first = data(2, at + 5, 1);
    let a = e
        .plan_write((at + 5) * B, &first)
        .expect("new blocks of a proven zone");
    let b = e
        .plan_write(at * B, &data(3, at, 1))
        .expect("an overwrite in a proven zone");
    a.write_for_test(&first).unwrap();
    b.write_for_test(&data(3, at, 1)).unwrap();
    e.sync(a.complete(&first).unwrap()).unwrap();
    let proofs = e.stats().proof_flushes;
    flush(&e, &*dev);
    assert_eq!(
        e.stats().proof_flushes,
        proofs + 1,
        "the flush proved the first plan's record"
    );
    e.sync(b.complete(&data(3, at, 1)).unwrap()).unwrap();
    e.write((at + 5) * B, &data(4, at + 5, 1), false).unwrap();
    let pending = dev.pending_writes();
    e.crash_for_test();
    dev.power_cut(|i| i + 1 == pending).unwrap();
    let e = open(dev, opts());
    let got = read(&e, at + 5, 1);
    assert!(
        got == first || got == data(4, at + 5, 1),
        "the flushed planned write is lost"
    );
    close(e);
}

#[test]
fn a_planned_write_of_new_blocks_survives_a_daemon_crash() {
    let dev = formatted_mem(1024, 16, 6, 2);
    let e = open(dev.clone(), opts());
    let chunk = e.chunk_size() / B;
    let at = 3 * chunk + 7;
    e.write(at * B, &data(1, at, 1), false).unwrap();
    // Unflushed: the new blocks' record is appended by complete and written by sync.
    let new = data(2, at + 1, 4);
    let plan = e.plan_write((at + 1) * B, &new).unwrap();
    plan.write_for_test(&new).unwrap();
    let w = plan.complete(&new).unwrap();
    e.sync(w).unwrap();
    crash(e);
    let e = open(dev, opts());
    assert_eq!(read(&e, at, 1), data(1, at, 1));
    assert_eq!(read(&e, at + 1, 4), new);
    close(e);
}

/// Below a sequential data zone's write pointer a write goes to the chunk's (conventional)
/// buffer zone in place: planned once the buffer exists, never at or past the write
/// pointer, and not when it would empty the data zone.
#[test]
fn overwrites_below_a_sequential_write_pointer_are_planned_into_the_buffer() {
    let mut o = opts();
    o.direct_sequential = true;
    let dev = formatted_mem(1024, 16, 6, 2);
    let e = open(dev.clone(), o.clone());
    let chunk = e.chunk_size() / B;
    let c = 2 * chunk;
    e.write(c * B, &data(1, c, 16), false).unwrap();
    assert!(
        e.plan_write(c * B, &zeros(B)).is_none(),
        "no buffer zone yet"
    );
    e.write((c + 3) * B, &data(2, c + 3, 1), false).unwrap();
    e.debug_commit().unwrap();
    assert!(
        e.plan_write((c + 16) * B, &zeros(B)).is_none(),
        "at the write pointer"
    );
    assert!(
        e.plan_write((c + 15) * B, &zeros(2 * B)).is_none(),
        "past it"
    );
    assert!(
        e.plan_write(c * B, &zeros(16 * B)).is_none(),
        "would empty the data zone"
    );
    // The data zone holds 15 valid blocks: two plans of 8 could empty it together.
    let half = e
        .plan_write(c * B, &zeros(8 * B))
        .expect("half the data zone");
    assert!(
        e.plan_write((c + 8) * B, &zeros(8 * B)).is_none(),
        "with the first plan in flight, could empty the data zone"
    );
    drop(half);
    assert!(e.plan_write((c + 8) * B, &zeros(8 * B)).is_some());
    // The committed buffer block first (an overwrite needing no record), then new blocks
    // of the buffer. The other way round the overwrite would follow an unflushed record
    // of its zone and need its own record ahead of the data: not planned.
    assert!(common::powercut::write_planned(&e, (c + 3) * B, &data(4, c + 3, 1)).unwrap());
    let new = data(3, c + 5, 2);
    assert!(common::powercut::write_planned(&e, (c + 5) * B, &new).unwrap());
    assert!(
        e.plan_write((c + 3) * B, &data(5, c + 3, 1))
            .expect("an overwrite after an unflushed record of its zone")
            .sync_first()
            .is_some(),
        "its record goes ahead of the data"
    );
    let mut want = data(1, c, 16);
    want[3 * BS..4 * BS].copy_from_slice(&data(4, c + 3, 1));
    want[5 * BS..7 * BS].copy_from_slice(&new);
    assert_eq!(read(&e, c, 16), want);
    crash(e);
    let e = open(dev, o);
    assert_eq!(read(&e, c, 16), want);
    close(e);
}

/// `kill -9` after a planned write's data reached the device but before its record (the
/// plan dropped uncompleted records nothing, as a killed daemon would): in every proof
/// state of the zone, for an overwrite of acknowledged blocks and for new blocks, each block
/// reads its acknowledged data or the new data, never neither. Planning an overwrite of
/// valid blocks whose records are not flushed (which needs its record ahead of the data)
/// would fail it: the replayed record no longer matches the block, which reads as zeros.
#[test]
fn a_daemon_killed_between_a_planned_write_s_data_and_its_record_keeps_what_was_acknowledged() {
    let mut planned = 0;
    for state in [
        "unflushed",
        "flushed",
        "proven",
        "proven, then a new record",
    ] {
        let dev = formatted_mem(1024, 16, 6, 2);
        let e = open(dev.clone(), opts());
        let chunk = e.chunk_size() / B;
        let at = chunk + 5;
        e.write(at * B, &data(1, at, 2), false).unwrap();
        match state {
            "unflushed" => {}
            "flushed" => e.flush().unwrap(),
            "proven" => e.debug_commit().unwrap(),
            _ => {
                e.debug_commit().unwrap();
                e.write((at + 6) * B, &data(1, at + 6, 1), false).unwrap();
            }
        }
        // Blocks at, at+1: acknowledged; at+3: never written.
        let old = read(&e, at, 4);
        let new = data(2, at, 4);
        for (b, n) in [(at, 2), (at + 3, 1)] {
            let i = ((b - at) * B) as usize..((b - at + n) * B) as usize;
            if let Some(plan) = e.plan_write(b * B, &new[i.clone()]) {
                // As the frontend does: a record that goes ahead of the data, first.
                if let Some(w) = plan.sync_first() {
                    e.sync(w).unwrap();
                }
                plan.write_for_test(&new[i]).unwrap();
                planned += 1;
            }
        }
        crash(e);
        let e = open(dev, opts());
        let back = read(&e, at, 4);
        for k in [0usize, 1, 3] {
            let r = k * BS..(k + 1) * BS;
            assert!(
                back[r.clone()] == old[r.clone()] || back[r.clone()] == new[r.clone()],
                "{state}: block {} reads neither its acknowledged nor its new data",
                at + k as u64
            );
        }
        close(e);
    }
    assert!(planned >= 3, "only {planned} writes were planned");
}

/// A log write the caller makes itself (`Engine::plan_sync`, as the frontend's queue
/// threads do on their rings): one writer at a time (`Busy` meanwhile), the write's
/// records survive a daemon crash once it is completed, and an abandoned one stops the
/// engine (the records it took are no longer pending: they must never read as written).
#[test]
fn a_log_write_made_by_the_caller_makes_writes_survive_a_crash() {
    use dmz::engine::SyncPlan;
    let dev = formatted_mem(1024, 16, 6, 2);
    let e = open(dev.clone(), opts());
    let at = e.chunk_size() / B + 7;
    let w = e
        .write_unsynced(at * B, &data(1, at, 2), false, &|| {})
        .unwrap();
    let SyncPlan::Write(log) = e.plan_sync(w).unwrap() else {
        panic!("the write's record is not written yet")
    };
    assert!(
        matches!(e.plan_sync(w).unwrap(), SyncPlan::Busy),
        "one log writer at a time"
    );
    assert!(log.blocks().all(|(off, b)| off % B == 0 && b.len() == BS));
    log.write_for_test().unwrap();
    log.complete();
    assert!(matches!(e.plan_sync(w).unwrap(), SyncPlan::Done));
    crash(e);
    let e = open(dev, opts());
    assert_eq!(read(&e, at, 2), data(1, at, 2));
    close(e);

    let e = open(formatted_mem(1024, 16, 6, 2), opts());
    let w = e
        .write_unsynced(at * B, &data(1, at, 1), false, &|| {})
        .unwrap();
    let SyncPlan::Write(log) = e.plan_sync(w).unwrap() else {
        panic!("the write's record is not written yet")
    };
    drop(log);
    assert!(
        e.sync(w).is_err(),
        "an abandoned log write stops the engine"
    );
    assert!(e.write(at * B, &data(2, at, 1), false).is_err());
    e.crash_for_test();
}

/// Drive `Engine::plan_flush` as a queue thread's ring does (log blocks written through
/// the device, the device flushed by the caller); returns (log writes, device flushes).
fn flush_on_ring(e: &Engine, dev: &dyn ZonedDevice) -> (usize, usize) {
    use dmz::engine::FlushStep;
    let mut plan = e.plan_flush().unwrap();
    let (mut logs, mut flushes) = (0, 0);
    loop {
        match plan.step().unwrap() {
            FlushStep::Log(log) => {
                log.write_for_test().unwrap();
                log.complete();
                logs += 1;
            }
            FlushStep::Device => {
                flushes += 1;
                plan.device_flushed(dev.flush().map_err(std::io::Error::other))
                    .unwrap();
            }
            FlushStep::Done => return (logs, flushes),
        }
    }
}

#[test]
fn a_flush_on_the_caller_s_ring_makes_writes_durable() {
    let dev = Arc::new(FaultyDevice::new(formatted_mem(1024, 16, 6, 2)).unwrap());
    let e = open(dev.clone(), opts());
    let at = e.chunk_size() / B + 7;
    e.write(at * B, &data(1, at, 2), false).unwrap();
    assert_eq!(
        flush_on_ring(&e, &*dev),
        (1, 1),
        "one log write, one device flush"
    );
    e.crash_for_test();
    // Everything not flushed is lost: the write and its record must have been.
    dev.power_cut(|_| false).unwrap();
    let e = open(dev, opts());
    assert_eq!(read(&e, at, 2), data(1, at, 2), "the flushed write is lost");
    close(e);
}

/// The proof round of `a_flush_while_a_plan_is_in_flight_proves_what_other_plans_recorded`,
/// with the flush driven on the caller's ring: two log writes and two device flushes.
#[test]
fn a_flush_on_the_caller_s_ring_proves_what_plans_in_flight_recorded() {
    flush_with_plans_in_flight(|e, dev| {
        assert_eq!(flush_on_ring(e, dev), (2, 2), "a proof round");
    });
}

/// A device flush that failed on the caller's ring stops the engine, as a failed flush
/// of its own does.
#[test]
fn a_device_flush_failed_on_the_caller_s_ring_stops_the_engine() {
    use dmz::engine::FlushStep;
    let e = open(formatted_mem(1024, 16, 6, 2), opts());
    let at = e.chunk_size() / B + 7;
    e.write(at * B, &data(1, at, 1), false).unwrap();
    let mut plan = e.plan_flush().unwrap();
    let FlushStep::Log(log) = plan.step().unwrap() else {
        panic!("a flush writes the log first")
    };
    log.write_for_test().unwrap();
    log.complete();
    assert!(matches!(plan.step().unwrap(), FlushStep::Device));
    let err = std::io::Error::from_raw_os_error(libc::EIO);
    assert!(plan.device_flushed(Err(err)).is_err());
    assert!(e.write(at * B, &data(2, at, 1), false).is_err());
    assert!(e.flush().is_err());
    e.crash_for_test();
}
