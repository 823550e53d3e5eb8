//! The log layout (`dmz::lsl`): format and detection, refusals, read-back of random writes,
//! overwrites and discards across close/reopen and across a daemon crash, reads of unwritten
//! blocks without device I/O, and GC under sustained random overwrites.

mod common;

use std::sync::Arc;

use common::lsl::*;
use common::*;
use dmz::lsl::{format, is_log_layout, LogEngine, LogOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zbd::{FaultyDevice, OpKind, ZonedDevice};

#[test]
fn format_is_detected_and_other_devices_are_refused() {
    let dev = formatted_lsl(256, 32, 4, 64);
    assert!(is_log_layout(&*dev));
    let e = lopen(dev.clone());
    assert!(e.capacity() > 0);
    e.close().unwrap();

    // A dm-zoned v2 volume is not a log-layout volume, and says why.
    let v2 = formatted_mem(256, 32, 4, 2);
    assert!(!is_log_layout(&*v2));
    let err = LogEngine::open(v2, LogOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("not a log-layout volume") && err.contains("dm-zoned"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");

    let blank = Arc::new(mem_device(256, 32, 4));
    let err = LogEngine::open(blank, LogOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("not formatted"), "{err}");

    // One conventional zone of 64 blocks cannot hold a 64-block log ring and the rest.
    let small = mem_device(256, 32, 1);
    let err = format(&small, &lsl_format_opts(64))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("device too small for the log layout: ")
            && err.contains("conventional blocks needed, 64 available"),
        "{err}"
    );
}

#[test]
fn a_damaged_superblock_falls_back_to_the_other_slot() {
    let dev = formatted_lsl(256, 32, 4, 64);
    let e = lopen(dev.clone());
    let mut m = LModel::new(&e);
    m.write(&e, 3, 5, 1, false);
    e.close().unwrap();
    // The newest slot: after format (gen 1), open (2) and close (3), slot 1 holds gen 3.
    poke(&*dev, BS as u64 + 100, &[0xAA]);
    let e = lopen(dev.clone());
    // Generation 2's checkpoint plus its log half's records give the same data.
    m.verify(&e);
    drop(e);
    // (That open checkpointed into slot 1 again.)
    poke(&*dev, 100, &[0xAA]);
    poke(&*dev, BS as u64 + 100, &[0xAA]);
    let err = LogEngine::open(dev, LogOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("slot 0: bad CRC") && err.contains("slot 1: bad CRC"),
        "{err}"
    );
}

/// Random writes, overwrites and discards; close and reopen, or drop (a daemon crash: the
/// log blocks written are all there) and reopen; every block reads back as last written.
#[test]
fn random_writes_read_back_across_reopen_and_crash() {
    let dev = formatted_lsl(256, 48, 4, 32);
    let mut rng = StdRng::seed_from_u64(7);
    let mut e = lopen(dev.clone());
    let mut m = LModel::new(&e);
    let blocks = m.blocks();
    let (mut gc_zones, mut checkpoints) = (0, 0);
    for round in 0..12u64 {
        for i in 0..150u64 {
            let n = if rng.gen_bool(0.8) {
                rng.gen_range(1..=8)
            } else {
                rng.gen_range(9..=300)
            };
            let n = n.min(blocks);
            let start = rng.gen_range(0..=blocks - n);
            match rng.gen_range(0..10) {
                0 => m.discard(&e, start, n),
                1 => e.flush().unwrap(),
                k => m.write(&e, start, n, round * 1000 + i + 1, k == 2),
            }
        }
        m.verify(&e);
        gc_zones += e.stats().gc_zones_freed;
        checkpoints += e.stats().checkpoints;
        if round % 2 == 0 {
            e.close().unwrap();
        } else {
            drop(e);
        }
        e = lopen(dev.clone());
        m.verify(&e);
    }
    eprintln!("{gc_zones} zones freed by GC, {checkpoints} checkpoints");
    assert!(checkpoints > 24 && gc_zones > 0);
}

#[test]
fn unwritten_and_discarded_blocks_read_zeros_without_device_reads() {
    let dev = formatted_lsl(256, 32, 4, 64);
    let f = Arc::new(FaultyDevice::new(dev.snapshot()).unwrap());
    let e = lopen(f.clone());
    let mut m = LModel::new(&e);
    m.write(&e, 10, 4, 1, false);
    m.discard(&e, 11, 2);
    f.fail_matching(|op| op.kind == OpKind::Read, libc::EIO);
    let mut buf = vec![0xFFu8; 8 * BS];
    e.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    e.read(11 * BS as u64, &mut buf[..2 * BS]).unwrap();
    assert!(buf[..2 * BS].iter().all(|&b| b == 0));
    // A written block does read the device (and fails here).
    assert!(e.read(10 * BS as u64, &mut buf[..BS]).is_err());
    f.clear_faults();
    m.verify(&e);
}

/// Sustained random overwrites of the whole volume, several times its capacity: GC keeps
/// freeing zones, nothing returns ENOSPC, every block reads back as last written, before
/// and after a reopen.
#[test]
fn gc_under_sustained_random_overwrites_keeps_every_block() {
    let dev = formatted_lsl(256, 40, 4, 64);
    let e = lopen(dev.clone());
    let mut m = LModel::new(&e);
    let blocks = m.blocks();
    let mut rng = StdRng::seed_from_u64(11);
    let mut written = 0;
    let mut id = 0;
    while written < 8 * blocks {
        id += 1;
        let n = rng.gen_range(1..=4).min(blocks);
        let start = rng.gen_range(0..=blocks - n);
        m.write(&e, start, n, id, false);
        written += n;
        if id % 500 == 0 {
            m.verify(&e);
        }
    }
    m.verify(&e);
    let s = e.stats();
    eprintln!("{s:?}");
    assert!(s.gc_zones_freed > 10, "{s:?}");
    assert_eq!(
        s.valid_blocks,
        m.ids.iter().filter(|&&i| i != 0).count() as u64
    );
    e.close().unwrap();
    let e = lopen(dev);
    m.verify(&e);
}

#[test]
fn requests_must_be_aligned_and_within_capacity() {
    let dev = formatted_lsl(256, 32, 4, 64);
    let e = lopen(dev as Arc<dyn ZonedDevice>);
    let mut buf = vec![0u8; BS];
    assert!(e.read(100, &mut buf).is_err());
    assert!(e.write(e.capacity(), &buf, false).is_err());
    assert!(e.discard(0, 100).is_err());
}

/// Writers on disjoint ranges, readers everywhere, flushes among them, GC running under
/// them: every block a reader sees is an intact pattern of its own block (or zeros), and
/// at the end (and after a crash and reopen) each writer's blocks hold its last writes.
#[test]
fn concurrent_writers_and_readers_with_gc() {
    let dev = formatted_lsl(256, 40, 4, 64);
    let e = Arc::new(lopen(dev.clone()));
    let blocks = e.capacity() / BS as u64;
    let writers = 4u64;
    let span = blocks / writers;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|t| {
            let (e, stop) = (e.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(100 + t);
                let mut buf = vec![0u8; 16 * BS];
                let mut reads = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let start = rng.gen_range(0..blocks - 16);
                    e.read(start * BS as u64, &mut buf).unwrap();
                    for (i, b) in buf.chunks(BS).enumerate() {
                        block_id(b, start + i as u64).unwrap_or_else(|m| panic!("{m}"));
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let e = e.clone();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(w);
                let mut ids = vec![0u64; span as usize];
                for i in 0..3000u64 {
                    let n = rng.gen_range(1..=4);
                    let off = rng.gen_range(0..=span - n);
                    let id = (w << 32) | (i + 1);
                    match rng.gen_range(0..20) {
                        0 => e.flush().unwrap(),
                        1 => {
                            e.discard((w * span + off) * BS as u64, n * BS as u64)
                                .unwrap();
                            ids[off as usize..(off + n) as usize].fill(0);
                        }
                        k => {
                            lwrite(&e, w * span + off, n, id, k == 2);
                            ids[off as usize..(off + n) as usize].fill(id);
                        }
                    }
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
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    m.verify(&e);
    let s = e.stats();
    eprintln!("{reads} concurrent reads; {s:?}");
    assert!(s.gc_zones_freed > 0);
    e.debug_check().unwrap();
    drop(e);
    let e = lopen(dev);
    m.verify(&e);
}

/// The v2 code refuses a log-layout volume as such (not "not formatted", which invites a
/// format), and `check --repair` leaves it alone.
#[test]
fn the_v2_code_refuses_a_log_layout_volume() {
    let dev = formatted_lsl(256, 32, 4, 64);
    let e = lopen(dev.clone());
    let mut m = LModel::new(&e);
    m.write(&e, 0, 9, 1, true);
    e.close().unwrap();
    let err = dmz::sets::load(&*dev).err().unwrap().to_string();
    assert!(err.contains("a log-layout volume"), "{err}");
    let err = dmz::check::check(&*dev, true).err().unwrap().to_string();
    assert!(err.contains("a log-layout volume"), "{err}");
    let err = dmz::engine::Engine::open(dev.clone(), test_opts())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("a log-layout volume"), "{err}");
    let e = lopen(dev);
    m.verify(&e);
}

/// A 1 TiB volume (4,096 zones of 256 MiB): blocks at both ends, and a discard of the whole
/// device (what mkfs does first) that only visits the pages that map something.
#[test]
fn a_large_volume_and_a_whole_device_discard() {
    let dev = Arc::new(mem_device(256 << 10, 4096, 6));
    format(&*dev, &lsl_format_opts(1024)).unwrap();
    let e = lopen(dev.clone());
    let blocks = e.capacity() / BS as u64;
    let last = blocks - 3;
    lwrite(&e, 0, 3, 1, false);
    lwrite(&e, last, 3, 2, true);
    let t = std::time::Instant::now();
    e.discard(0, (blocks - 1) * BS as u64).unwrap();
    let took = t.elapsed();
    assert!(
        took < std::time::Duration::from_secs(1),
        "whole-device discard took {took:?}"
    );
    let check = |e: &LogEngine, at: u64, ids: [u64; 3]| {
        let mut buf = vec![0u8; 3 * BS];
        e.read(at * BS as u64, &mut buf).unwrap();
        for (i, b) in buf.chunks(BS).enumerate() {
            assert_eq!(
                block_id(b, at + i as u64),
                Ok(ids[i]),
                "block {}",
                at + i as u64
            );
        }
    };
    check(&e, 0, [0, 0, 0]);
    check(&e, last, [0, 0, 2]);
    e.close().unwrap();
    let e = lopen(dev);
    check(&e, last, [0, 0, 2]);
    assert_eq!(e.stats().valid_blocks, 1);
}

/// A ZNS-like device: zone capacity below the zone size (48 of 64 blocks) and at most 4
/// open and 4 active zones. Summaries sit at the end of the capacity; format takes 4
/// frontiers (3 user, 1 GC) for the limit, not 5, and they stay within it (the device
/// refuses a fifth open zone); random overwrites with GC read back across reopen.
#[test]
fn zone_capacity_below_zone_size_and_open_limits() {
    let mut o = zbd::EmulateOptions::new(48 * (256 << 10), 256 << 10);
    o.conventional = 4;
    o.zone_capacity = 192 << 10;
    o.max_open = 4;
    o.max_active = 4;
    let dev = Arc::new(zbd::MemDevice::new(&o).unwrap());
    format(&*dev, &lsl_format_opts(64)).unwrap();
    let mut e = lopen(dev.clone());
    let mut m = LModel::new(&e);
    // 44 data zones of 47 data blocks, 5 kept out (4 frontiers and one more), 7 % OP.
    assert_eq!(m.blocks(), (39.0 * 47.0 / 1.07f64).floor() as u64);
    let mut rng = StdRng::seed_from_u64(3);
    for id in 1..6000u64 {
        let n = rng.gen_range(1..=6);
        let start = rng.gen_range(0..=m.blocks() - n);
        m.write(&e, start, n, id, id % 50 == 0);
        if id % 1500 == 0 {
            let s = e.stats();
            assert!(s.gc_zones_freed > 0, "{s:?}");
            drop(e);
            e = lopen(dev.clone());
            e.debug_check().unwrap();
            m.verify(&e);
        }
    }
    m.verify(&e);
}

/// Not a check, a measurement (`--ignored`): write amplification of uniform random 4 KiB
/// writes after a sequential fill and 2U of warm-up, over 2U measured, on 280 data zones
/// of 255 data blocks at 7 % OP, and the most GC copying one write waited for; with GC
/// paced (the default) and with GC only when a frontier needs a zone. Compare the WA with
/// `logsim gc` for the same geometry (the command is printed).
#[test]
#[ignore]
fn gc_write_amplification_uniform() {
    for paced in [true, false] {
        let dev = formatted_lsl(1024, 285, 5, 1024);
        let opts = dmz::lsl::LogOptions {
            gc_start_zones: if paced { 6 } else { 0 },
            ..dmz::lsl::LogOptions::default()
        };
        let e = LogEngine::open(dev, opts).unwrap();
        let u = e.capacity() / BS as u64;
        let buf = vec![1u8; BS];
        for b in (0..u).step_by(64) {
            let n = 64.min(u - b);
            e.write(b * BS as u64, &vec![1u8; n as usize * BS], false)
                .unwrap();
        }
        let mut rng = StdRng::seed_from_u64(1);
        let mut worst = 0;
        let mut write = |n: u64| {
            for _ in 0..n {
                let before = e.stats().gc_blocks_copied;
                e.write(rng.gen_range(0..u) * BS as u64, &buf, false)
                    .unwrap();
                worst = worst.max(e.stats().gc_blocks_copied - before);
            }
        };
        write(2 * u);
        let s0 = e.stats();
        write(2 * u);
        let s1 = e.stats();
        let user = s1.user_blocks_written - s0.user_blocks_written;
        let gc = s1.gc_blocks_copied - s0.gc_blocks_copied;
        let rho = 280.0 * 255.0 / u as f64 - 1.0;
        eprintln!(
            "paced {paced}: U {u}, physical OP {rho:.4}: engine WA {:.3} over {user} writes, \
             at most {worst} blocks copied in one write; compare `logsim gc --user-blocks \
             {u} --zone-blocks 255 --op {rho:.4} --workload uniform --victim cbz --sep \
             user-gc --warm 2 --measure 2`",
            (user + gc) as f64 / user as f64
        );
    }
}

/// Sequentially written pages land at consecutive device blocks and are stored as one
/// extent in the directory (no page written or read); overwriting part of one makes it a
/// page in its slot again. Data read back across close, crash and reopen.
#[test]
fn sequential_pages_are_stored_as_extents() {
    // 16 MiB zones: 4,092 data blocks, four whole pages per zone and one that straddles.
    let dev = formatted_lsl(16 << 10, 12, 1, 64);
    let e = lopen(dev.clone());
    let mut m = LModel::new(&e);
    let pages = m.blocks() / 1020;
    for p in 0..pages {
        m.write(&e, p * 1020, 1020, p + 1, false);
    }
    e.close().unwrap();
    let e = lopen(dev.clone());
    let extents = e.stats().index_extent_pages;
    assert!(
        extents >= pages / 2,
        "{extents} of {pages} pages are extents"
    );
    m.verify(&e);
    m.write(&e, 1020 + 7, 3, 1000, false);
    e.close().unwrap();
    let e = lopen(dev.clone());
    assert_eq!(e.stats().index_extent_pages, extents - 1);
    m.verify(&e);
    m.write(&e, 5, 1, 1001, false);
    drop(e);
    let e = lopen(dev);
    m.verify(&e);
    e.debug_check().unwrap();
}

/// Formatting a former dm-zoned volume leaves no dm-zoned superblock at the start of any
/// conventional zone (dm-zoned and dmzadm would find the old secondary one), and no old
/// data in the data zones.
#[test]
fn formatting_over_a_v2_volume_leaves_no_dm_zoned_superblock() {
    let dev = formatted_mem(256, 32, 4, 2);
    let has_sb = |dev: &zbd::MemDevice| -> Vec<u32> {
        (0..4)
            .filter(|&z| dmz::format::has_magic(&peek(dev, z as u64 * (256 << 10), BS)))
            .collect()
    };
    assert!(has_sb(&dev).len() >= 2, "the v2 format wrote both sets");
    format(&*dev, &lsl_format_opts(64)).unwrap();
    assert_eq!(has_sb(&dev), Vec::<u32>::new());
    let e = lopen(dev.clone());
    LModel::new(&e).verify(&e);
}

/// GC's reads and what they cost, for `gc_reads_through_gaps_on_a_disk`.
#[derive(Debug, Default, PartialEq)]
struct GcReads {
    reads: u64,
    bytes: u64,
    copied: u64,
}

/// Random single-block writes over 300 blocks (each zone then holds its blocks out of
/// logical order), a third overwritten again, then one victim emptied with
/// `gc_read_gap_blocks` = `gap`: the device reads GC made, and every block read back before
/// and after a reopen.
fn gc_one_victim_with_gap(gap: u32) -> GcReads {
    use std::sync::atomic::{AtomicU64, Ordering};
    // 256 KiB zones: 64 blocks, GC batches of 16 (lsl_test_opts).
    let dev = formatted_lsl(256, 32, 4, 64);
    let f = Arc::new(FaultyDevice::new(dev.snapshot()).unwrap());
    let opts = LogOptions {
        gc_read_gap_blocks: gap,
        ..lsl_test_opts()
    };
    let e = LogEngine::open(f.clone(), opts.clone()).unwrap();
    let mut m = LModel::new(&e);
    let mut rng = StdRng::seed_from_u64(5);
    for id in 1..=600 {
        // Every block once, in a scattered order (7,919 is prime to 300), then at random.
        let b = match id {
            1..=300 => (id - 1) * 7919 % 300,
            _ => rng.gen_range(0..300),
        };
        m.write(&e, b, 1, id, false);
    }
    e.flush().unwrap();
    let (reads, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (r, by) = (reads.clone(), bytes.clone());
    // A rule that never fails anything: it counts the reads.
    f.fail_matching(
        move |op| {
            if op.kind == OpKind::Read {
                r.fetch_add(1, Ordering::Relaxed);
                by.fetch_add(op.len, Ordering::Relaxed);
            }
            false
        },
        libc::EIO,
    );
    let copied = e.stats().gc_blocks_copied;
    assert!(e.debug_gc_one().unwrap(), "a victim");
    f.clear_faults();
    let out = GcReads {
        reads: reads.load(Ordering::Relaxed),
        bytes: bytes.load(Ordering::Relaxed),
        copied: e.stats().gc_blocks_copied - copied,
    };
    m.verify(&e);
    e.close().unwrap();
    let e = LogEngine::open(f, opts).unwrap();
    m.verify(&e);
    out
}

/// With `gc_read_gap_blocks` (a disk's setting), GC reads a randomly written victim's
/// batches through the gaps between their blocks: the same blocks copied with a quarter of
/// the device reads or fewer, more bytes read than without, and every block still reads
/// back as last written (a block taken from the wrong place of a read span would not).
#[test]
fn gc_reads_through_gaps_on_a_disk() {
    let tight = gc_one_victim_with_gap(0);
    let through = gc_one_victim_with_gap(64);
    eprintln!("gap 0: {tight:?}; gap 64: {through:?}");
    assert_eq!(tight.copied, through.copied);
    assert!(tight.copied >= 16, "{tight:?}");
    assert!(through.reads * 4 <= tight.reads, "{tight:?} {through:?}");
    assert!(through.bytes > tight.bytes, "{tight:?} {through:?}");
}
