//! Planned writes on the log layout (`LogEngine::plan_write`, the frontend's hop-free
//! writes): read back beside writes through the engine, GC, discards and flushes, across a
//! crash; never overtaken by a later write of the same blocks; a plan dropped unwritten
//! records nothing.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::lsl::*;
use common::*;
use dmz::lsl::{LogEngine, LogOptions, LogStats, LogSyncPlan};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zbd::ZonedDevice;

/// A planned write of `pattern(id, start)` to blocks `start..start + n`, made as a queue
/// thread makes it (data through the device, record, log written by the caller or the
/// blocking sync; the record and any GC owed by a pool job when `try_complete` declines);
/// false when the engine gave no plan.
fn planned_write(e: &Arc<LogEngine>, start: u64, n: u64, id: u64) -> bool {
    let mut buf = vec![0u8; n as usize * BS];
    pattern(id, start, &mut buf);
    let Some(mut plan) = e.plan_write(start * BS as u64, &buf) else {
        return false;
    };
    plan.write_for_test(&buf).unwrap();
    // As a queue thread: `try_complete`, and `complete` (its pool job) when declined.
    let seq = match plan.try_complete(&buf) {
        Ok(r) => r.unwrap(),
        Err(plan) => plan.complete(&buf).unwrap(),
    };
    match e.plan_sync(seq).unwrap() {
        LogSyncPlan::Done => {}
        LogSyncPlan::Busy => e.sync(seq).unwrap(),
        LogSyncPlan::Write(w) => w.write_for_test().unwrap(),
    }
    true
}

/// Writes `(start, n, id)` planned as one write group (`LogEngine::plan_writes`), made as
/// a queue thread makes it: one device write of every write placed, in the order placed,
/// the records appended together (`try_complete_parts`, else `complete_parts` as a pool job
/// would) and synced once. Returns which writes were placed (none without a plan), and the
/// device offset of the group's data.
fn planned_group(e: &Arc<LogEngine>, writes: &[(u64, u64, u64)]) -> (Vec<bool>, u64) {
    let asked: Vec<(u64, u64)> = writes
        .iter()
        .map(|&(start, n, _)| (start * BS as u64, n * BS as u64))
        .collect();
    let Some(mut plan) = e.plan_writes(&asked) else {
        return (vec![false; writes.len()], 0);
    };
    let at = plan.device_offset();
    let placed: Vec<usize> = plan.placed().collect();
    let data: Vec<Vec<u8>> = placed
        .iter()
        .map(|&i| {
            let (start, n, id) = writes[i];
            let mut buf = vec![0u8; n as usize * BS];
            pattern(id, start, &mut buf);
            buf
        })
        .collect();
    plan.write_for_test(&data.concat()).unwrap();
    let parts: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let seq = match plan.try_complete_parts(&parts) {
        Ok(r) => r.unwrap(),
        Err(plan) => plan.complete_parts(&parts).unwrap(),
    };
    match e.plan_sync(seq).unwrap() {
        LogSyncPlan::Done => {}
        LogSyncPlan::Busy => e.sync(seq).unwrap(),
        LogSyncPlan::Write(w) => w.write_for_test().unwrap(),
    }
    ((0..writes.len()).map(|i| placed.contains(&i)).collect(), at)
}

/// A write group places its writes one after the other at one frontier, in the order
/// asked, leaving out a write that overlaps a planned write in flight or an earlier write
/// of the group; each reads back, before and after a crash, and one log block holds the
/// group's records.
#[test]
fn a_write_group_places_its_writes_together() {
    let dev = formatted_lsl(256, 40, 4, 64);
    let e = Arc::new(lopen(dev.clone()));
    lwrite(&e, 100, 1, 1, false);
    // A plan in flight over block 50 (on the first frontier's turn); a write through the
    // engine meanwhile opens a second frontier, which the group then takes.
    let mut held = vec![0u8; BS];
    pattern(9, 50, &mut held);
    let in_flight = e.plan_write(50 * BS as u64, &held).expect("a plan");
    lwrite(&e, 101, 1, 1, false);
    let writes = [(10, 2, 2), (11, 1, 3), (50, 1, 4), (30, 3, 5), (7, 1, 6)];
    let asked: Vec<(u64, u64)> = writes
        .iter()
        .map(|&(start, n, _)| (start * BS as u64, n * BS as u64))
        .collect();
    let plan = e.plan_writes(&asked).expect("a group plan");
    assert_eq!(plan.placed().collect::<Vec<_>>(), [0, 3, 4]);
    drop(plan);
    drop(in_flight);
    let logged = e.stats().log_blocks_written;
    let (placed, at) = planned_group(&e, &writes);
    assert_eq!(placed, [true, false, true, true, true]);
    assert_eq!(
        e.stats().log_blocks_written,
        logged + 1,
        "one log write for the group"
    );
    let s = e.stats();
    assert_eq!((s.planned_writes, s.planned_groups), (4, 1), "{s:?}");
    // On the device, one after the other in the order placed.
    let mut want = Vec::new();
    for &(start, n, id) in [writes[0], writes[2], writes[3], writes[4]].iter() {
        let mut buf = vec![0u8; n as usize * BS];
        pattern(id, start, &mut buf);
        want.extend(buf);
    }
    let mut got = vec![0u8; want.len()];
    dev.read_at(&mut got, at).unwrap();
    assert!(got == want, "the group's data is not where it was placed");
    let mut m = LModel::new(&e);
    m.ids[100] = 1;
    m.ids[101] = 1;
    m.ids[10] = 2;
    m.ids[11] = 2;
    m.ids[50] = 4;
    m.ids[30..33].fill(5);
    m.ids[7] = 6;
    m.verify(&e);
    e.debug_check().unwrap();
    drop(e);
    m.verify(&lopen(dev));
}

/// Writers on disjoint ranges, each making half its writes planned (the other half, and
/// every write that gets no plan, through the engine), with discards and flushes, readers
/// everywhere, GC under them: everything reads back, at the end and after a crash.
#[test]
fn planned_writes_read_back_beside_engine_writes_and_gc() {
    mixed_writers_and_readers(40, lsl_test_opts());
}

/// The same with the index paged (a cache of one page for the volume's 5): readers,
/// writers, GC and write-backs read and write pages concurrently.
#[test]
fn the_same_with_a_paged_index() {
    let s = mixed_writers_and_readers(
        80,
        LogOptions {
            index_memory: 0,
            ..lsl_test_opts()
        },
    );
    assert!(
        s.index_page_reads > 100 && s.index_pages_written_back > 100,
        "the index was not paged: {s:?}"
    );
}

/// [`planned_writes_read_back_beside_engine_writes_and_gc`] on `zones` zones of 256 KiB.
fn mixed_writers_and_readers(zones: u32, opts: LogOptions) -> LogStats {
    let dev = formatted_lsl(256, zones, 4, 64);
    let e = Arc::new(LogEngine::open(dev.clone(), opts.clone()).unwrap());
    let blocks = e.capacity() / BS as u64;
    let writers = 4u64;
    let span = blocks / writers;
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|t| {
            let (e, stop) = (e.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(200 + t);
                let mut buf = vec![0u8; 8 * BS];
                while !stop.load(Ordering::Relaxed) {
                    let start = rng.gen_range(0..blocks - 8);
                    e.read(start * BS as u64, &mut buf).unwrap();
                    for (i, b) in buf.chunks(BS).enumerate() {
                        block_id(b, start + i as u64).unwrap_or_else(|m| panic!("{m}"));
                    }
                }
            })
        })
        .collect();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let e = e.clone();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(w + 7);
                let mut ids = vec![0u64; span as usize];
                for i in 0..2500u64 {
                    let n = rng.gen_range(1..=4);
                    let off = rng.gen_range(0..=span - n);
                    let start = w * span + off;
                    let id = (w << 32) | (i + 1);
                    let put = match rng.gen_range(0..20) {
                        0 => {
                            e.flush().unwrap();
                            continue;
                        }
                        1 => {
                            e.discard(start * BS as u64, n * BS as u64).unwrap();
                            0
                        }
                        // A write group of this write and the next one.
                        4 => {
                            let n2 = rng.gen_range(1..=4);
                            let off2 = rng.gen_range(0..=span - n2);
                            let writes = [(start, n, id), (w * span + off2, n2, id + (1 << 20))];
                            for (&(s, k, id), placed) in
                                writes.iter().zip(planned_group(&e, &writes).0)
                            {
                                if !placed {
                                    lwrite(&e, s, k, id, false);
                                }
                                let o = (s - w * span) as usize;
                                ids[o..o + k as usize].fill(id);
                            }
                            continue;
                        }
                        k if k % 2 == 0 && planned_write(&e, start, n, id) => id,
                        _ => {
                            lwrite(&e, start, n, id, false);
                            id
                        }
                    };
                    ids[off as usize..(off + n) as usize].fill(put);
                }
                ids
            })
        })
        .collect();
    let mut m = LModel::new(&e);
    for (w, h) in handles.into_iter().enumerate() {
        let ids = h.join().unwrap();
        m.ids[w * span as usize..(w + 1) * span as usize].copy_from_slice(&ids);
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    m.verify(&e);
    e.debug_check().unwrap();
    let s = e.stats();
    eprintln!("{s:?}");
    assert!(s.gc_zones_freed > 0, "{s:?}");
    assert!(s.planned_writes > 100, "too few writes were planned: {s:?}");
    assert!(
        s.planned_writes - s.planned_groups > 20,
        "too few write groups: {s:?}"
    );
    // A crash: no close, no checkpoint; the log gives every acknowledged write back.
    drop(e);
    let e = LogEngine::open(dev, opts).unwrap();
    m.verify(&e);
    s
}

/// A write through the engine over blocks a planned write holds waits until that one has
/// logged its record: the later write is the one that stays (without the wait, it would
/// log first and the older planned write would win).
#[test]
fn a_write_over_a_planned_write_waits_for_it() {
    let dev = formatted_lsl(256, 40, 4, 64);
    let e = Arc::new(lopen(dev.clone()));
    // A first write opens a user frontier (a plan needs room at one).
    lwrite(&e, 100, 1, 1, false);
    let mut old = vec![0u8; 2 * BS];
    pattern(2, 10, &mut old);
    let mut plan = e.plan_write(10 * BS as u64, &old).expect("a plan");
    plan.write_for_test(&old).unwrap();
    let later = {
        let e = e.clone();
        std::thread::spawn(move || lwrite(&e, 11, 1, 3, false))
    };
    // Until the later write either finished (it did not wait) or is seen waiting.
    while !later.is_finished() && e.stats().planned_write_waits == 0 {
        std::thread::yield_now();
    }
    let seq = plan.complete(&old).unwrap();
    e.sync(seq).unwrap();
    later.join().unwrap();
    let mut m = LModel::new(&e);
    m.ids[100] = 1;
    m.ids[10] = 2;
    m.ids[11] = 3;
    m.verify(&e);
    assert_eq!(e.stats().planned_write_waits, 1);
    drop(e);
    m.verify(&lopen(dev));
}

/// A plan dropped without its data written (the caller's device write failed, or another
/// piece of its request got no plan) records nothing, and the next plan takes the same
/// place: the frontier's write pointer stays where the device's is.
#[test]
fn a_dropped_plan_records_nothing_and_gives_its_place_back() {
    let dev = formatted_lsl(256, 40, 4, 64);
    let e = Arc::new(lopen(dev.clone()));
    lwrite(&e, 20, 2, 1, false);
    let mut buf = vec![0u8; 2 * BS];
    pattern(2, 20, &mut buf);
    let plan = e.plan_write(20 * BS as u64, &buf).expect("a plan");
    let at = plan.device_offset();
    drop(plan);
    let mut m = LModel::new(&e);
    m.ids[20] = 1;
    m.ids[21] = 1;
    m.verify(&e);
    assert!(planned_write(&e, 20, 2, 2));
    m.ids[20] = 2;
    m.ids[21] = 2;
    m.verify(&e);
    let s = e.stats();
    assert_eq!(s.planned_writes, 1, "{s:?}");
    e.debug_check().unwrap();
    // The second plan was placed where the first was.
    let again = e.plan_write(30 * BS as u64, &buf).expect("a plan");
    assert_eq!(again.device_offset(), at + 2 * BS as u64);
    drop(again);
    drop(e);
    m.verify(&lopen(dev));
}
