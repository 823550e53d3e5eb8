//! A multi-device volume made by dmzadm 2.2.2 and written by the kernel's dm-zoned
//! (tests/vectors/README.md, "Multi-device set"): a regular cache of 8 x 16 MiB zones in front of
//! two zoned drives of 16 x 16 MiB zones. The saved metadata is put back on in-memory devices of
//! the same geometry; zonedd's check is clean on it, the engine opens it, reads the kernel's
//! data where the kernel's map says it is, and writes and reads back its own.

mod common;

use std::sync::Arc;

use common::*;
use dmz::format::{MapEntry, Superblock, BLOCK};
use zbd::{MemDevice, MultiDevice, RegularDevice, ZonedDevice};

const ZS: u64 = 16 << 20;
const ZONE_BLOCKS: u64 = ZS / BLOCK as u64;

struct State {
    set0: &'static [u8],
    set1: &'static [u8],
    drives: [&'static [u8]; 2],
}

const FRESH: State = State {
    set0: include_bytes!("vectors/dmzadm-multi-fresh-set0.bin"),
    set1: include_bytes!("vectors/dmzadm-multi-fresh-set1.bin"),
    drives: [
        include_bytes!("vectors/dmzadm-multi-fresh-drive1-block0.bin"),
        include_bytes!("vectors/dmzadm-multi-fresh-drive2-block0.bin"),
    ],
};

const USED: State = State {
    set0: include_bytes!("vectors/dmzadm-multi-used-set0.bin"),
    set1: include_bytes!("vectors/dmzadm-multi-used-set1.bin"),
    drives: [
        include_bytes!("vectors/dmzadm-multi-used-drive1-block0.bin"),
        include_bytes!("vectors/dmzadm-multi-used-drive2-block0.bin"),
    ],
};

/// The vector's devices with `s` written where dmzadm put it: set 0 at the cache's block 0,
/// set 1 at its zone 1, each drive's tertiary superblock at its block 0.
/// `data` (whole blocks) is first written at zone `zone` of the volume (a zone of a drive, from
/// its start), before the volume is composed.
fn volume(s: &State, data: &[(u32, Vec<u8>)]) -> Arc<MultiDevice> {
    let cache = Arc::new(RegularDevice::new_mem(8 * ZS, ZS).unwrap());
    cache.write_at(s.set0, 0).unwrap();
    cache.write_at(s.set1, ZS).unwrap();
    let drives: Vec<Arc<dyn ZonedDevice>> = s
        .drives
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let d = MemDevice::with_zones(ZS, 16, 0).unwrap();
            d.write_at(b, 0).unwrap();
            for (zone, bytes) in data {
                if (*zone as u64 - 8) / 16 == i as u64 {
                    d.write_at(bytes, (*zone as u64 - 8) % 16 * ZS).unwrap();
                }
            }
            Arc::new(d) as Arc<dyn ZonedDevice>
        })
        .collect();
    Arc::new(MultiDevice::new(cache, drives).unwrap())
}

#[test]
fn dmzadm_superblocks_decode() {
    for s in [&FRESH, &USED] {
        let p = Superblock::decode(&s.set0[..BLOCK]).unwrap();
        let q = Superblock::decode(&s.set1[..BLOCK]).unwrap();
        assert_eq!((p.sb_block, q.sb_block), (0, ZONE_BLOCKS));
        assert_eq!(p.gen, q.gen);
        // 40 zones (8 cache + 2 x 16), one zone per set, 4 reserved.
        assert_eq!(p.nr_chunks, 34);
        assert_eq!(p.nr_reserved_seq, 4);
        assert_eq!(p.label, q.label);
        for (i, b) in s.drives.iter().enumerate() {
            let t = Superblock::decode(&b[..BLOCK]).unwrap();
            assert_eq!(t.gen, 0, "tertiary superblocks keep gen 0");
            assert_eq!(t.sb_block, (8 + 16 * i as u64) * ZONE_BLOCKS);
            assert_eq!((t.set_uuid, &t.label), (p.set_uuid, &p.label));
            assert_eq!(t.nr_chunks, p.nr_chunks);
        }
    }
}

#[test]
fn dmzadm_fresh_volume_checks_clean_and_takes_data() {
    let m = volume(&FRESH, &[]);
    let r = dmz::check::check(&*m, false).unwrap();
    assert!(r.summary.clean, "{:?}", r.errors);
    assert_eq!(r.summary.nr_chunks, 34);
    let e = open(m.clone(), test_opts());
    assert_eq!(e.capacity(), 34 * ZS);
    let mut w = Written::new(&e);
    w.write(&e, 0, ZONE_BLOCKS, 1); // a stream: a drive's sequential zone
    w.write(&e, 5 * ZONE_BLOCKS + 3, 7, 2); // unaligned: a cache zone
    w.write(&e, 31 * ZONE_BLOCKS, 64, 3);
    w.verify(&e);
    close(e);
    let e = open(m.clone(), test_opts());
    w.verify(&e);
    close(e);
    let r = dmz::check::check(&*m, false).unwrap();
    assert!(r.summary.clean, "{:?}", r.errors);
}

/// What dm-zoned wrote (tests/vectors/vm-dmzadm-multi-capture.sh): 1 MiB of 0xA1 at chunk 0,
/// 8 KiB of 0xB2 at block 2 of chunk 1, 4 KiB of 0xC3 at chunk 30; (chunk, first block, blocks,
/// byte).
const KERNEL_WRITES: [(u32, u64, u64, u8); 3] =
    [(0, 0, 256, 0xa1), (1, 2, 2, 0xb2), (30, 0, 1, 0xc3)];

#[test]
fn kernel_written_volume_reads_back_in_zonedd() {
    // The map (set 0's block 1) says where each chunk went: the kernel's reclaim had moved
    // all three onto sequential zones of the drives (zones 8-23 drive 1, 24-39 drive 2). The
    // data is put back there, written from the zone's start (zeros before it) as reclaim does.
    let map = &USED.set0[BLOCK..2 * BLOCK];
    let mut data = Vec::new();
    for &(chunk, first, n, byte) in &KERNEL_WRITES {
        let me = MapEntry::read(map, chunk as usize);
        assert!(
            (8..40).contains(&me.dzone),
            "chunk {chunk} in zone {}: {me:?}",
            me.dzone
        );
        assert_eq!(
            me.bzone,
            MapEntry::UNMAPPED.bzone,
            "chunk {chunk} has no buffer zone"
        );
        let mut b = vec![0u8; (first + n) as usize * BLOCK];
        b[first as usize * BLOCK..].fill(byte);
        data.push((me.dzone, b));
    }
    let drive_zones: Vec<u32> = data.iter().map(|d| d.0).collect();
    assert_eq!(drive_zones, [25, 13, 26], "where dm-zoned left the chunks");
    let m = volume(&USED, &data);
    let r = dmz::check::check(&*m, false).unwrap();
    assert!(r.summary.clean, "{:?}", r.errors);
    assert_eq!(r.summary.mapped_chunks, 3);
    let e = open(m.clone(), test_opts());
    for &(chunk, first, n, byte) in &KERNEL_WRITES {
        let mut b = vec![0u8; 2 * ZONE_BLOCKS as usize * BLOCK / 16];
        e.read(chunk as u64 * ZS, &mut b).unwrap();
        let (lo, hi) = ((first as usize) * BLOCK, (first + n) as usize * BLOCK);
        assert!(
            b[..lo].iter().all(|&x| x == 0),
            "chunk {chunk}: not zeros before"
        );
        let bad = b[lo..hi].iter().position(|&x| x != byte);
        assert!(
            bad.is_none(),
            "chunk {chunk}: data differs at {bad:?}: {:#x}",
            b[lo + bad.unwrap_or(0)]
        );
        assert!(
            b[hi..].iter().all(|&x| x == 0),
            "chunk {chunk}: not zeros after"
        );
    }
    // zonedd writes on top and reads everything back after a reopen.
    let mut w = Written::new(&e);
    w.write(&e, ZONE_BLOCKS + 100, 4, 7);
    w.write(&e, 20 * ZONE_BLOCKS, 32, 8);
    close(e);
    let e = open(m.clone(), test_opts());
    let mut b = vec![0u8; BLOCK];
    e.read(ZS + 2 * BLOCK as u64, &mut b).unwrap();
    assert!(
        b.iter().all(|&x| x == 0xb2),
        "kernel data in chunk 1 survives zonedd's write"
    );
    verify_blocks(&e, ZONE_BLOCKS + 100, 4, |blk, got| expect_id(blk, got, 7));
    verify_blocks(&e, 20 * ZONE_BLOCKS, 32, |blk, got| expect_id(blk, got, 8));
    close(e);
    let r = dmz::check::check(&*m, false).unwrap();
    assert!(r.summary.clean, "{:?}", r.errors);
}
