//! Multi-device volumes (a regular cache device in front of zoned drives, dm-zoned v2):
//! layout and tertiary superblocks, data through the engine and back after reopen, the
//! refusals of a missing, foreign or misplaced drive, kill -9, and power cuts at every
//! device-write boundary where each device loses its unflushed writes independently.

mod common;

use std::sync::Arc;

use common::powercut::{run, verify, Op};
use common::*;
use dmz::engine::Engine;
use dmz::format::{Layout, Superblock, BLOCK};
use dmz::sets::{format_device, FormatOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zbd::{FaultyDevice, MemDevice, MultiDevice, RegularDevice, ZonedDevice};

const ZS: u64 = 256 << 10;

type Cache = Arc<FaultyDevice<RegularDevice>>;
type Drive = Arc<FaultyDevice<MemDevice>>;

/// A cache of `cache_zones` zones and drives of `drives[i]` zones (no conventional zones),
/// each member behind its own fault injector.
fn members(cache_zones: u64, drives: &[u32]) -> (Cache, Vec<Drive>) {
    let c =
        Arc::new(FaultyDevice::new(RegularDevice::new_mem(cache_zones * ZS, ZS).unwrap()).unwrap());
    let d = drives
        .iter()
        .map(|&n| Arc::new(FaultyDevice::new(MemDevice::with_zones(ZS, n, 0).unwrap()).unwrap()))
        .collect();
    (c, d)
}

fn compose(c: &Cache, d: &[Drive]) -> Arc<MultiDevice> {
    let drives: Vec<Arc<dyn ZonedDevice>> = d
        .iter()
        .map(|x| x.clone() as Arc<dyn ZonedDevice>)
        .collect();
    Arc::new(MultiDevice::new(c.clone(), drives).unwrap())
}

fn format(dev: &dyn ZonedDevice, reserved: u32) -> Layout {
    let opts = FormatOptions {
        label: Some("multi".into()),
        reserved_seq: reserved,
    };
    format_device(dev, &opts, &mut |_, _| {}).expect("format")
}

#[test]
fn layout_and_tertiary_superblocks() {
    let (c, d) = members(8, &[12, 12]);
    let m = compose(&c, &d);
    // dmzadm's arithmetic: 32 usable zones (8 cache + 24), 64 blocks per zone, one bitmap
    // block per zone (32), one map block: 34 metadata blocks, one zone per set; reserved
    // 16 is clamped to cache zones - 1 = 7; chunks = 32 - 2 - 7 = 23.
    let l = format(&*m, 16);
    assert_eq!(l.nr_zones, 32);
    assert_eq!(l.nr_usable_zones, 32);
    assert_eq!(l.nr_rnd_zones, 8, "cache zones");
    assert_eq!(l.nr_reserved_seq, 7);
    assert_eq!(l.set_zone, [0, 1]);
    assert_eq!(l.nr_chunks, 23);
    assert_eq!(l.tertiary_zones, vec![8, 20]);
    assert!(l.is_meta_zone(8) && l.is_meta_zone(20) && !l.is_meta_zone(9));
    let primary = Superblock::decode(&peek(&*m, 0, BLOCK)).unwrap();
    assert_eq!((primary.gen, primary.sb_block), (1, 0));
    for (i, &z) in [8u32, 20].iter().enumerate() {
        let t = Superblock::decode(&peek(&*m, z as u64 * ZS, BLOCK)).unwrap();
        assert_eq!(t.gen, 0, "tertiary superblocks have gen 0");
        assert_eq!(t.sb_block, z as u64 * ZS / BLOCK as u64);
        assert_eq!(t.set_uuid, primary.set_uuid);
        assert_eq!(t.label, primary.label);
        assert_ne!(t.dev_uuid, primary.dev_uuid, "each drive has its own UUID");
        assert_eq!(t.nr_chunks, primary.nr_chunks);
        // Block 0 of the drive itself.
        let mut b = vec![0u8; BLOCK];
        d[i].read_at(&mut b, 0).unwrap();
        assert_eq!(Superblock::decode(&b).unwrap(), t);
    }
    let r = dmz::check::check(&*m, false).unwrap();
    assert!(r.summary.clean, "{:?}", r.errors);
}

/// A cache device whose size is not a whole number of zones: its trailing runt zone is
/// offline. Probing the blank volume (the secondary-superblock scan walks the cache zones)
/// must not read it; format counts it as a usable cache zone, as the kernel's dm-zoned does
/// (the VM scenario dmzoned-multi has the kernel open such a volume), and no chunk maps to it.
#[test]
fn a_cache_with_a_runt_zone() {
    let cache = RegularDevice::new_mem(8 * ZS + ZS / 2, ZS).unwrap();
    let c = Arc::new(FaultyDevice::new(cache).unwrap());
    let d = vec![Arc::new(
        FaultyDevice::new(MemDevice::with_zones(ZS, 12, 0).unwrap()).unwrap(),
    )];
    let m = compose(&c, &d);
    let zones = m.report_all().unwrap();
    assert_eq!(
        zones[8].cond,
        zbd::ZoneCondition::Offline,
        "the runt is offline"
    );
    // Blank: no primary superblock, so probe scans for a secondary one over the cache zones.
    let p = dmz::sets::probe(&*m).expect("probe of a blank volume reads no offline zone");
    assert!(p.sets.iter().all(|s| s.valid.is_none()));
    let l = format(&*m, 4);
    assert_eq!((l.nr_zones, l.nr_rnd_zones, l.nr_usable_zones), (21, 9, 21));
    assert_eq!(l.nr_chunks, 21 - 2 - 4);
    let e = open(m.clone(), test_opts());
    let mut w = Written::new(&e);
    let chunk = e.chunk_size() / BS as u64;
    for k in 0..l.nr_chunks as u64 {
        w.write(&e, k * chunk + 1, 3, k + 1);
    }
    w.verify(&e);
    e.close().unwrap();
    assert!(dmz::check::check(&*m, false).unwrap().summary.clean);
}

/// Data written through the engine reads back, also after a clean reopen and after a
/// kill -9; random writes land in cache zones, and reclaim moves them to the drives.
#[test]
fn data_round_trip_reopen_and_kill9() {
    let (c, d) = members(8, &[12, 12]);
    let m = compose(&c, &d);
    format(&*m, 4);
    // No reclaim at first, so the cache zones keep what they took.
    let mut first = test_opts();
    first.reclaim.enabled = false;
    let e = open(m.clone(), first);
    let mut w = Written::new(&e);
    let chunk = e.chunk_size() / BS as u64;
    let blocks = e.capacity() / BS as u64;
    // Unaligned small writes in many chunks (cache zones), one whole chunk (a stream).
    let mut id = 1;
    for k in 0..5u64 {
        w.write(&e, k * 2 * chunk + 3, 5, id);
        id += 1;
    }
    w.write(&e, 11 * chunk, chunk, id);
    id += 1;
    w.verify(&e);
    // The 6 cache zones after the two sets: the unaligned first writes took some.
    let s = e.stats();
    assert!(s.zones_free_conventional < 6, "{s:?}");
    close(e);

    let e = open(m.clone(), test_opts());
    w.verify(&e);
    // Reclaim everything it can: cached chunks move to sequential zones on the drives.
    for ch in 0..(blocks / chunk) as u32 {
        e.debug_reclaim_chunk(ch, true).unwrap();
    }
    // Freed zones are reusable once a flush made the moves durable.
    e.flush().unwrap();
    let s = e.stats();
    assert_eq!(
        s.zones_free_conventional, 6,
        "cache drained to the drives: {s:?}"
    );
    w.verify(&e);
    for k in 0..5u64 {
        w.write(&e, k * 3 * chunk + 7, 3, id);
        id += 1;
    }
    e.flush().unwrap();
    crash(e);

    let e = open(m.clone(), test_opts());
    w.verify(&e);
    close(e);
    let r = dmz::check::check(&*m, false).unwrap();
    assert!(r.summary.clean, "{:?}", r.errors);
}

/// Sequential zones written on each drive, the tertiary superblock's zone left out.
fn data_zones_written(d: &Drive) -> usize {
    d.report_all().unwrap()[1..]
        .iter()
        .filter(|z| z.zone_type.is_sequential() && z.wp > z.start)
        .count()
}

/// Streams of two chunks and reclaim's destinations go to both drives, not the first one
/// until it is full; with spreading off, the first drive takes everything. The data reads
/// back after a reopen either way.
#[test]
fn streams_and_reclaim_destinations_are_spread_over_the_drives() {
    for spread in [true, false] {
        let (c, d) = members(8, &[12, 12]);
        let m = compose(&c, &d);
        format(&*m, 2);
        let mut o = test_opts();
        o.reclaim.enabled = false;
        o.spread_over_drives = spread;
        let e = open(m.clone(), o.clone());
        let chunk = e.chunk_size() / BS as u64;
        let mut w = Written::new(&e);
        // Two streams, each half a chunk from the chunk's first block.
        w.write(&e, 0, chunk / 2, 1);
        w.write(&e, chunk, chunk / 2, 2);
        let per_drive: Vec<usize> = d.iter().map(data_zones_written).collect();
        assert_eq!(
            per_drive,
            if spread { [1, 1] } else { [2, 0] },
            "spread {spread}"
        );
        // Two chunks in cache zones (first written past their start), moved by reclaim.
        w.write(&e, 4 * chunk + 9, 3, 3);
        w.write(&e, 5 * chunk + 9, 3, 4);
        e.debug_reclaim_chunk(4, true).unwrap();
        e.debug_reclaim_chunk(5, true).unwrap();
        let per_drive: Vec<usize> = d.iter().map(data_zones_written).collect();
        assert_eq!(
            per_drive,
            if spread { [2, 2] } else { [4, 0] },
            "spread {spread}"
        );
        w.verify(&e);
        close(e);
        let e = open(m.clone(), o);
        w.verify(&e);
        close(e);
        let r = dmz::check::check(&*m, false).unwrap();
        assert!(r.summary.clean, "{:?}", r.errors);
    }
}

#[test]
fn a_missing_foreign_or_misplaced_drive_is_refused() {
    let (c, d) = members(8, &[12, 12]);
    format(&*compose(&c, &d), 4);
    // One drive missing: the zone count differs from the volume's.
    let e = Engine::open(compose(&c, &d[..1]), test_opts())
        .err()
        .unwrap();
    assert!(e.to_string().contains("a zoned drive is missing"), "{e}");
    // Drives swapped: the tertiary superblocks are out of place.
    let swapped = vec![d[1].clone(), d[0].clone()];
    let e = Engine::open(compose(&c, &swapped), test_opts())
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("in the order they were formatted"),
        "{e}"
    );
    // A drive of another volume.
    let (c2, d2) = members(8, &[12, 12]);
    format(&*compose(&c2, &d2), 4);
    let mixed = vec![d[0].clone(), d2[1].clone()];
    let e = Engine::open(compose(&c, &mixed), test_opts())
        .err()
        .unwrap();
    assert!(e.to_string().contains("of another volume"), "{e}");
    // A blank drive.
    let (_, blank) = members(1, &[12]);
    let mixed = vec![d[0].clone(), blank[0].clone()];
    let e = Engine::open(compose(&c, &mixed), test_opts())
        .err()
        .unwrap();
    assert!(e.to_string().contains("no tertiary superblock"), "{e}");
    // The right set still opens.
    let e = open(compose(&c, &d), test_opts());
    close(e);
}

// ---------------------------------------------------------------------------------------
// Power cuts

fn workload(seed: u64, n: usize, blocks: u64, chunk: u64) -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let len = if rng.gen_bool(0.8) {
                rng.gen_range(1..=8)
            } else {
                chunk
            };
            let start = if rng.gen_bool(0.2) {
                rng.gen_range(0..blocks / chunk) * chunk
            } else {
                rng.gen_range(0..blocks - len)
            };
            match rng.gen_range(0..100) {
                0..=64 => Op::Write {
                    start,
                    len,
                    fua: false,
                },
                65..=79 => Op::Write {
                    start,
                    len,
                    fua: true,
                },
                _ => Op::Flush,
            }
        })
        .collect()
}

/// Stop the workload after every device write (counted over all devices), then cut each
/// device's power on its own: it keeps all, none or a random part of its unflushed writes.
#[test]
fn power_cut_each_device_independently_at_every_write() {
    let release = !cfg!(debug_assertions);
    let seeds = if release { 2 } else { 1 };
    let nops = if release { 40 } else { 25 };
    let mut points = 0;
    for seed in 0..seeds {
        let fresh = || {
            let (c, d) = members(8, &[12, 12]);
            format(&*compose(&c, &d), 4);
            (c, d)
        };
        let (c, d) = fresh();
        let outer = Arc::new(FaultyDevice::new(compose(&c, &d)).unwrap());
        let e = open(outer.clone(), power_cut_opts());
        let blocks = e.capacity() / BS as u64;
        let ops = workload(seed, nops, blocks, e.chunk_size() / BS as u64);
        assert_eq!(run(&e, &ops), ops.len());
        crash(e);
        let total = outer.write_count();
        for k in (0..=total).step_by(if release { 1 } else { 4 }) {
            let pat = k % 3;
            let (c, d) = fresh();
            let outer = Arc::new(FaultyDevice::new(compose(&c, &d)).unwrap());
            outer.cut_power_after_writes(k);
            let done = match Engine::open(outer.clone(), power_cut_opts()) {
                Ok(e) => {
                    let n = run(&e, &ops);
                    e.crash_for_test();
                    n
                }
                Err(_) => 0,
            };
            let mut rng = StdRng::seed_from_u64(seed * 7919 + k);
            let mut cut = |n: usize| -> Vec<bool> {
                (0..n)
                    .map(|_| match pat {
                        0 => true,
                        1 => false,
                        _ => rng.gen_bool(0.5),
                    })
                    .collect()
            };
            let keep = cut(c.pending_writes());
            c.power_cut(|i| keep[i]).unwrap();
            for x in &d {
                // Each drive on its own draw: one keeps its cache, another loses it.
                let keep = cut(x.pending_writes());
                x.power_cut(|i| keep[i]).unwrap();
            }
            let what = format!("seed {seed} cut after write {k} pattern {pat}");
            let e = Engine::open(compose(&c, &d), power_cut_opts())
                .unwrap_or_else(|err| panic!("{what}: reopen: {err}"));
            verify(&e, &ops, done, blocks, &what);
            crash(e);
            points += 1;
        }
    }
    eprintln!("multi-device power cuts: {points} crash points verified");
    // Debug builds take every fourth write of a shorter workload.
    let least = if release { 100 } else { 10 };
    assert!(points > least, "only {points} crash points");
}
