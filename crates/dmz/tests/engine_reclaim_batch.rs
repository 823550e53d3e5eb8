//! Reclaim's copy batches (`ReclaimOptions::copy_batch_blocks`): a copy within one device
//! reads, then writes, that many blocks at a time (at most a zone's), because on a disk each
//! switch between source and destination is a seek; a copy from a multi-device volume's
//! cache onto a drive goes 1 MiB at a time. Each case counts the destination's writes and
//! reads the chunk back.

mod common;

use std::sync::Arc;

use common::*;
use dmz::engine::Engine;
use dmz::sets::{format_device, FormatOptions};
use parking_lot::Mutex;
use zbd::{FaultyDevice, MemDevice, MultiDevice, OpKind, RegularDevice, ZonedDevice};

/// 2 MiB zones: 512 blocks, two of the 1 MiB batches of a copy between devices.
const ZS: u64 = 2 << 20;
const ZONE_BLOCKS: u64 = ZS / BS as u64;

/// The lengths of the writes `dev` takes into zones from `first_zone` on, from now on.
fn record_writes<D: ZonedDevice>(dev: &FaultyDevice<D>, first_zone: u32) -> Arc<Mutex<Vec<u64>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    dev.fail_matching(
        move |op| {
            if op.kind == OpKind::Write && op.zone >= first_zone {
                s.lock().push(op.len);
            }
            false
        },
        libc::EIO,
    );
    seen
}

/// Writes chunk 0 whole into a conventional (cache) zone (its first write is its last block:
/// not the start of a stream), then moves it with a forced reclaim and reads it back; returns
/// the lengths of the writes that `arm`, called after the fill, records.
fn fill_and_reclaim(e: &Engine, arm: impl FnOnce() -> Arc<Mutex<Vec<u64>>>) -> Vec<u64> {
    let mut written = Written::new(e);
    written.write(e, ZONE_BLOCKS - 1, 1, 3);
    written.write(e, 0, ZONE_BLOCKS - 1, 4);
    e.flush().unwrap();
    let seen = arm();
    e.trigger_reclaim();
    e.wait_reclaim_idle();
    assert_eq!(e.stats().reclaim_zones, 1, "{:?}", e.stats());
    written.verify(e);
    let lens = seen.lock().clone();
    lens
}

fn single(batch: Option<u32>) -> Vec<u64> {
    let dev = Arc::new(FaultyDevice::new(mem_device(ZS >> 10, 16, 6)).unwrap());
    format_dev(&*dev, 2);
    let mut o = test_opts();
    if let Some(b) = batch {
        o.reclaim.copy_batch_blocks = b;
    }
    let e = open(dev.clone(), o);
    let lens = fill_and_reclaim(&e, || record_writes(&*dev, 6));
    close(e);
    lens
}

#[test]
fn a_copy_within_one_device_goes_in_batches_of_copy_batch_blocks() {
    // The default (8 MiB) is more than a zone: the whole chunk in one write.
    assert_eq!(single(None), vec![ZS]);
    assert_eq!(single(Some(128)), vec![ZS / 4; 4]);
}

#[test]
fn a_copy_from_the_cache_onto_a_drive_goes_1_mib_at_a_time() {
    let cache = RegularDevice::new_mem(8 * ZS, ZS).unwrap();
    let drive = Arc::new(FaultyDevice::new(MemDevice::with_zones(ZS, 8, 0).unwrap()).unwrap());
    let dev = Arc::new(MultiDevice::new(Arc::new(cache), vec![drive.clone()]).unwrap());
    let fo = FormatOptions {
        label: Some("batch".into()),
        reserved_seq: 1,
    };
    format_device(&*dev, &fo, &mut |_, _| {}).unwrap();
    let e = open(dev, test_opts());
    // Block 0 of the drive holds its tertiary superblock: copies go to zones 1 and up.
    let lens = fill_and_reclaim(&e, || record_writes(&*drive, 1));
    assert_eq!(lens, vec![1 << 20; 2]);
    close(e);
}

/// Reclaim keeps its copy buffer between copies (`Inner::copy_bufs`): after two chunks are
/// reclaimed one after the other, one buffer of one batch is kept, not none (dropped after
/// each copy) and not two (a new one for each copy); and both chunks read back as written.
/// (A copy batch's bytes are all read or zero-filled before it is written; holes of a
/// sequential destination are invalid blocks, which read as zeros whatever they hold, so a
/// missing zero-fill would not show here.)
#[test]
fn reclaim_keeps_one_copy_buffer_between_copies() {
    for (batch, kept) in [(None, ZS), (Some(128), 128 * BS as u64)] {
        let dev = Arc::new(mem_device(ZS >> 10, 16, 6));
        format_dev(&*dev, 2);
        let mut o = test_opts();
        if let Some(b) = batch {
            o.reclaim.copy_batch_blocks = b;
        }
        let e = open(dev, o);
        assert_eq!(e.stats().reclaim_buffer_bytes, 0);
        let mut written = Written::new(&e);
        for chunk in [0u64, 1] {
            let first = chunk * ZONE_BLOCKS;
            written.write(&e, first + ZONE_BLOCKS - 1, 1, 10 + chunk);
            written.write(&e, first, ZONE_BLOCKS - 1, 20 + chunk);
            e.flush().unwrap();
            e.trigger_reclaim();
            e.wait_reclaim_idle();
            let s = e.stats();
            assert_eq!(s.reclaim_zones, chunk + 1, "{s:?}");
            assert_eq!(
                s.reclaim_buffer_bytes, kept,
                "batch {batch:?}, after chunk {chunk}"
            );
        }
        written.verify(&e);
        close(e);
    }
}
