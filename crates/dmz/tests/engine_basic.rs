//! Basic engine behaviour: round trips, zeros, discard, reopen, errors.

mod common;

use std::sync::Arc;

use common::*;
use zbd::ZonedDevice;

#[test]
fn write_read_reopen() {
    let dev = formatted_mem(1024, 32, 8, 2);
    let e = open(dev.clone(), test_opts());
    let cs = e.chunk_size();
    assert_eq!(cs, 1 << 20);
    assert!(e.capacity() >= 20 * cs);
    let mut w = vec![0u8; 3 * BS];
    pattern(1, 0, &mut w);
    // Aligned first write (sequential zone), unaligned first write (conventional zone),
    // an overwrite (buffer), a write crossing a chunk end.
    e.write(0, &w, false).unwrap();
    e.write(cs + 5 * BS as u64, &w, false).unwrap();
    e.write(BS as u64, &w[..BS], false).unwrap();
    e.write(2 * cs - BS as u64, &w[..2 * BS], false).unwrap();
    let mut r = vec![0u8; 3 * BS];
    e.read(0, &mut r).unwrap();
    assert_eq!(&r[..BS], &w[..BS]);
    assert_eq!(&r[BS..2 * BS], &w[..BS]);
    assert_eq!(&r[2 * BS..], &w[2 * BS..]);
    e.read(3 * cs, &mut r).unwrap();
    assert!(r.iter().all(|&b| b == 0), "never written reads zeros");
    e.discard(0, BS as u64).unwrap();
    e.read(0, &mut r[..BS]).unwrap();
    assert!(r[..BS].iter().all(|&b| b == 0), "discarded reads zeros");
    let s = e.stats();
    assert!(s.zones_buffer >= 1, "{s:?}");
    close(e);

    let e = open(dev.clone(), test_opts());
    let mut r = vec![0u8; 2 * BS];
    e.read(BS as u64, &mut r).unwrap();
    assert_eq!(&r[..BS], &w[..BS]);
    assert_eq!(&r[BS..], &w[2 * BS..]);
    e.read(2 * cs - BS as u64, &mut r).unwrap();
    assert_eq!(&r[..], &w[..2 * BS]);
    e.read(cs + 5 * BS as u64, &mut r).unwrap();
    assert_eq!(&r[..], &w[..2 * BS]);
    close(e);
}

#[test]
fn bad_requests_are_einval() {
    let dev = formatted_mem(1024, 16, 6, 1);
    let e = open(dev, test_opts());
    let mut b = vec![0u8; BS];
    assert_eq!(e.read(1, &mut b).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(
        e.write(0, &b[..100], false).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(
        e.write(e.capacity(), &b, false).unwrap_err().errno(),
        libc::EINVAL
    );
    close(e);
}

#[test]
fn whole_chunk_discard_frees_zones() {
    let dev = formatted_mem(1024, 16, 6, 1);
    let e = open(dev, test_opts());
    let free0 = e.stats().zones_free;
    let mut w = vec![0u8; 256 * BS];
    pattern(2, 0, &mut w);
    e.write(0, &w, false).unwrap();
    e.write(e.chunk_size(), &w[..BS], false).unwrap();
    e.discard(0, 2 * e.chunk_size()).unwrap();
    e.flush().unwrap();
    let s = e.stats();
    assert_eq!(s.chunks_mapped, 0);
    assert_eq!(s.zones_free, free0, "{s:?}");
    assert_blocks(&e, 0, 2 * e.chunk_size() / BS as u64, 0);
    close(e);
}

#[test]
fn daemon_crash_keeps_acknowledged_writes_without_flush() {
    let dev = formatted_mem(1024, 32, 8, 2);
    let e = open(dev.clone(), test_opts());
    let mut written = Written::new(&e);
    for i in 0..40u64 {
        let off = (i * 37 % 200) * BS as u64 * 8 % (e.capacity() - 8 * BS as u64);
        written.write(&e, off / BS as u64, 8, i + 1);
    }
    let snap = Arc::new(dev.snapshot());
    let mut model = vec![0u8; e.capacity() as usize];
    e.read(0, &mut model).unwrap();
    crash(e);
    let e2 = open(snap as Arc<dyn ZonedDevice>, test_opts());
    let mut got = vec![0u8; e2.capacity() as usize];
    e2.read(0, &mut got).unwrap();
    assert!(
        got == model,
        "acknowledged writes lost after a daemon crash"
    );
    written.verify(&e2);
    close(e2);
}

/// Group commit across a batch (what the frontend does with the writes of one pool batch):
/// writes done one after another and synced afterwards cost one log write together, where
/// each write synced at once costs its own; and they survive a daemon crash once synced.
#[test]
fn writes_synced_together_share_one_log_write() {
    let dev = formatted_mem(1024, 32, 8, 2);
    let e = open(dev.clone(), power_cut_opts());
    let mut w = vec![0u8; BS];
    let log_writes = |e: &dmz::engine::Engine| e.stats().log_block_writes;
    let before = log_writes(&e);
    for b in 0..8u64 {
        pattern(1, b, &mut w);
        e.write(b * BS as u64, &w, false).unwrap();
    }
    assert_eq!(log_writes(&e) - before, 8, "a write synced at once");
    let before = log_writes(&e);
    let mut pending = Vec::new();
    for b in 8..16u64 {
        pattern(2, b, &mut w);
        pending.push(e.write_unsynced(b * BS as u64, &w, false, &|| {}).unwrap());
    }
    assert_eq!(log_writes(&e), before, "nothing logged before the sync");
    // Synced in any order: the first sync writes every record, the others find theirs done.
    for t in pending.into_iter().rev() {
        e.sync(t).unwrap();
    }
    assert_eq!(log_writes(&e) - before, 1, "eight writes, one log write");
    crash(e);
    let e = open(dev, power_cut_opts());
    assert_blocks(&e, 0, 8, 1);
    assert_blocks(&e, 8, 8, 2);
    close(e);
}

/// An in-place overwrite of blocks a commit made valid changes no metadata: it writes no
/// log block, is counted in `unlogged_overwrites`, and survives a daemon crash (the data is
/// on the device, the sets say the blocks are valid). Before the commit the same overwrite
/// is logged: replay would check the earlier record's CRCs against the new data.
#[test]
fn overwrites_after_a_commit_need_no_log_write() {
    let dev = formatted_mem(1024, 32, 8, 2);
    let mut o = power_cut_opts();
    o.direct_sequential = false; // new chunks in conventional zones
    let e = open(dev.clone(), o.clone());
    let mut w = vec![0u8; 4 * BS];
    pattern(1, 0, &mut w);
    e.write(0, &w, false).unwrap();
    let s0 = e.stats();
    pattern(2, 0, &mut w);
    e.write(0, &w, false).unwrap();
    let s1 = e.stats();
    assert_eq!(
        s1.log_block_writes - s0.log_block_writes,
        1,
        "not committed yet: logged"
    );
    assert_eq!(s1.unlogged_overwrites, 0);
    e.debug_commit().unwrap();
    let s2 = e.stats();
    pattern(3, 0, &mut w);
    e.write(0, &w, false).unwrap();
    // Partly over unwritten blocks: that one validates blocks, so it is logged.
    let mut w2 = vec![0u8; 8 * BS];
    pattern(4, 2, &mut w2);
    e.write(2 * BS as u64, &w2, false).unwrap();
    let s3 = e.stats();
    assert_eq!(s3.unlogged_overwrites, 1, "{s3:?}");
    assert_eq!(s3.log_block_writes - s2.log_block_writes, 1, "{s3:?}");
    crash(e);
    let e = open(dev, o);
    assert_blocks(&e, 0, 2, 3);
    assert_blocks(&e, 2, 8, 4);
    close(e);
}

/// A write without a record still waits for the records logged before it: here reclaim's
/// fallback (no sequential zone free) turns the chunk's buffer into its data zone, and the
/// overwrite of a block it merged there, logged by nothing, must not be acknowledged before
/// that remapping is in the log. After a daemon crash the block reads the overwrite, not the
/// old data zone's copy (which a replay without the remapping would map again).
#[test]
fn an_unlogged_overwrite_waits_for_the_records_before_it() {
    // 9 zones of 1 MiB: 6 conventional (2 for the sets), 3 sequential, one of them
    // reserved; a sequential zone offline takes the reserve's place: 2 for data, none left.
    let dev = formatted_mem(1024, 9, 6, 1);
    dev.set_condition(8, zbd::ZoneCondition::Offline).unwrap();
    let e = open(dev.clone(), power_cut_opts());
    assert_eq!(e.stats().zones_reserved, 0);
    let cs = e.chunk_size() / BS as u64;
    let mut w = Written::new(&e);
    w.write(&e, 0, 10, 1); // chunk 0 streams into a sequential zone
    w.write(&e, 3, 1, 2); // an overwrite below its write pointer: the buffer
    w.write(&e, cs, 4, 3); // chunk 1 takes the last sequential zone
    e.debug_commit().unwrap();
    assert_eq!(e.stats().zones_free_sequential, 0);
    // No sequential zone: the data zone's blocks are copied into the buffer, which becomes
    // the chunk's data zone (the Reclaim record is appended, not written).
    assert!(e.debug_reclaim_chunk(0, true).unwrap());
    let before = e.stats();
    w.write(&e, 5, 1, 4);
    let after = e.stats();
    assert_eq!(
        after.unlogged_overwrites - before.unlogged_overwrites,
        1,
        "{after:?}"
    );
    crash(e);
    let e = open(dev, power_cut_opts());
    w.verify(&e);
    close(e);
}
