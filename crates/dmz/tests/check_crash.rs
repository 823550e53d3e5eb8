//! Power cuts at every write of a repair and of a set resync: the device always loads
//! afterwards, with either the old metadata or the new one, never a mix.

mod common;

use common::*;
use dmz::check::check;
use dmz::format::*;
use dmz::sets::*;
use zbd::{FaultyDevice, MemDevice, ZonedDevice};

/// 16 zones of 1 MiB, 6 conventional, 2 reserved.
fn base() -> (MemDevice, Layout) {
    let dev = mem_device(1024, 16, 6);
    let l = format_dev(&dev, 2);
    (dev, l)
}

/// Blocks 1.. of a set (everything but the superblock).
fn body(dev: &dyn ZonedDevice, l: &Layout, set: usize) -> Vec<u8> {
    read_set(dev, l, set, 1)
}

/// Run `op` on copies of `dev` cut at every write, with every pending write kept, none kept,
/// and a random half kept; then `load` must give `(gen, body)` equal to `old` or `new`.
fn cut_everywhere(
    dev: &MemDevice,
    l: &Layout,
    old: &(u64, Vec<u8>),
    new: &(u64, Vec<u8>),
    op: &dyn Fn(&dyn ZonedDevice),
) {
    let dry = FaultyDevice::new(dev.snapshot()).unwrap();
    op(&dry);
    let writes = dry.write_count();
    assert!(writes >= 2, "{writes} writes");
    for n in 0..=writes {
        for variant in 0..3u64 {
            let d = FaultyDevice::new(dev.snapshot()).unwrap();
            d.cut_power_after_writes(n);
            op(&d);
            match variant {
                0 => d.power_cut(|_| true).unwrap(),
                1 => d.power_cut(|_| false).unwrap(),
                _ => d.power_cut_random(n * 7 + 1).unwrap(),
            }
            let loaded = load(&d).unwrap_or_else(|e| panic!("cut at write {n}/{variant}: {e}"));
            let got = (loaded.sb.gen, body(&d, l, loaded.primary));
            assert!(
                got == *old || got == *new,
                "cut at write {n} (variant {variant}): gen {} matches neither state",
                got.0
            );
            // After load both sets are the same, and a repair leaves a clean device.
            assert!(
                body(&d, l, 0) == body(&d, l, 1),
                "sets differ after cut at {n}/{variant}"
            );
            check(&d, true).unwrap();
            assert!(check(&d, false).unwrap().errors.is_empty());
        }
    }
}

#[test]
fn repair_survives_a_power_cut_at_every_write() {
    let (dev, l) = base();
    // Corrupt both sets the same way: a chunk pointing past the device, stray bits.
    set_map_entry(&dev, &l, &[0, 1], 0, 99, MAP_UNMAPPED);
    edit_meta_block(&dev, &l, &[0, 1], l.bitmap_block(5, 0), |b| b[0] = 0xF0);
    dev.write_at(&[1u8; BS], 12 << 20).unwrap();
    dev.flush().unwrap();
    let old = (1, body(&dev, &l, 0));
    let fixed = dev.snapshot();
    let r = check(&fixed, true).unwrap();
    assert_eq!(r.fixed.len(), 3);
    let new = (2, body(&fixed, &l, 0));
    assert_ne!(old.1, new.1);
    cut_everywhere(&dev, &l, &old, &new, &|d| {
        let _ = check(d, true);
    });
}

#[test]
fn resync_survives_a_power_cut_at_every_write() {
    let (dev, l) = base();
    // A commit that crashed between its two superblocks: set 1 at gen 2 with new blocks,
    // set 0 at gen 1 with one of them half-logged.
    set_map_entry(&dev, &l, &[1], 3, 2, MAP_UNMAPPED);
    edit_meta_block(&dev, &l, &[1, 0], l.bitmap_block(2, 0), |b| b[0] = 0x0F);
    let mut sb = Superblock::decode(&read_set(&dev, &l, 1, 0)).unwrap();
    sb.gen = 2;
    write_superblock(&dev, &l, 1, &sb).unwrap();
    dev.flush().unwrap();
    let new = (2, body(&dev, &l, 1));
    cut_everywhere(&dev, &l, &new, &new, &|d| {
        let _ = load(d);
    });
}
