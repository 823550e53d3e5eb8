//! The fault-injecting wrapper: error rules, zone conditions, power cuts.

use zbd::{
    EmulateOptions, Emulated, FaultyDevice, MemDevice, OpClass, OpKind, ZoneCondition, ZoneOp,
    ZonedDevice,
};

const Z: u64 = 1 << 20;
const B: usize = 4096;

fn mem() -> MemDevice {
    MemDevice::with_zones(Z, 8, 2).unwrap()
}

fn blk(seed: u8) -> Vec<u8> {
    vec![seed; B]
}

fn read(dev: &dyn ZonedDevice, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0xeeu8; len];
    dev.read_at(&mut b, off).unwrap();
    b
}

fn wp(dev: &dyn ZonedDevice, z: u32) -> u64 {
    let zi = dev.report_zones(z, 1).unwrap()[0];
    zi.wp - zi.start
}

#[test]
fn nth_write_fails_once_and_writes_nothing() {
    let f = FaultyDevice::new(mem()).unwrap();
    f.fail_nth(OpClass::Write, 2, libc::ENOSPC);
    f.write_at(&blk(1), 2 * Z).unwrap();
    let e = f.write_at(&blk(2), 2 * Z + 4096).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC);
    assert_eq!(wp(&f, 2), 4096);
    f.write_at(&blk(3), 2 * Z + 4096).unwrap();
    assert_eq!(read(&f, 2 * Z + 4096, B), blk(3));
    assert_eq!(f.write_count(), 2);
}

#[test]
fn nth_reset_and_flush_fail() {
    let f = FaultyDevice::new(mem()).unwrap();
    f.write_at(&blk(1), 3 * Z).unwrap();
    f.fail_nth(OpClass::Reset, 1, libc::EIO);
    f.fail_nth(OpClass::Flush, 1, libc::EIO);
    assert_eq!(
        f.zone_mgmt(ZoneOp::Reset, 3).unwrap_err().errno(),
        libc::EIO
    );
    assert_eq!(wp(&f, 3), 4096, "a failed reset does nothing");
    assert_eq!(f.flush().unwrap_err().errno(), libc::EIO);
    assert_eq!(
        f.pending_writes(),
        1,
        "a failed flush makes nothing durable"
    );
    f.zone_mgmt(ZoneOp::Reset, 3).unwrap();
    f.flush().unwrap();
    assert_eq!(f.pending_writes(), 0);
}

#[test]
fn predicate_faults_until_cleared() {
    let f = FaultyDevice::new(mem()).unwrap();
    f.write_at(&blk(9), 4 * Z).unwrap();
    f.fail_matching(|op| op.kind == OpKind::Read && op.zone == 4, libc::EIO);
    let mut b = vec![0u8; B];
    for _ in 0..3 {
        assert_eq!(f.read_at(&mut b, 4 * Z).unwrap_err().errno(), libc::EIO);
    }
    f.read_at(&mut b, 5 * Z).unwrap();
    f.clear_faults();
    assert_eq!(read(&f, 4 * Z, B), blk(9));
}

#[test]
fn zones_can_be_made_read_only_or_offline() {
    let f = FaultyDevice::new(mem()).unwrap();
    f.write_at(&blk(1), 2 * Z).unwrap();
    f.set_condition(2, ZoneCondition::ReadOnly).unwrap();
    assert_eq!(read(&f, 2 * Z, B), blk(1));
    assert!(f.write_at(&blk(2), 2 * Z + 4096).is_err());
    f.set_condition(3, ZoneCondition::Offline).unwrap();
    let mut b = vec![0u8; B];
    assert!(f.read_at(&mut b, 3 * Z).is_err());
    assert_eq!(
        f.report_zones(3, 1).unwrap()[0].cond,
        ZoneCondition::Offline
    );
}

#[test]
fn power_cut_drops_chosen_unflushed_writes() {
    let f = FaultyDevice::new(mem()).unwrap();
    // Flushed: two blocks in zone 2, one in conventional zone 0.
    f.write_at(&blk(1), 2 * Z).unwrap();
    f.write_at(&blk(2), 2 * Z + 4096).unwrap();
    f.write_at(&blk(3), 0).unwrap();
    f.flush().unwrap();
    // Pending: 0,1,2 in zone 2; 3 overwrites conventional block 0; 4 in zone 3.
    for i in 0..3u8 {
        f.write_at(&blk(10 + i), 2 * Z + (2 + i as u64) * 4096)
            .unwrap();
    }
    f.write_at(&blk(20), 0).unwrap();
    f.write_at(&blk(30), 3 * Z).unwrap();
    assert_eq!(f.pending_writes(), 5);
    // Pending writes are visible before the cut, like a volatile cache.
    assert_eq!(read(&f, 0, B), blk(20));
    // Keep write 2 only in zone 2 (a hole at 1..), drop the conventional overwrite and zone 3.
    f.power_cut(|i| i == 0 || i == 2).unwrap();
    assert_eq!(
        wp(&f, 2),
        5 * 4096,
        "wp = end of the highest surviving write"
    );
    assert_eq!(read(&f, 2 * Z, B), blk(1));
    assert_eq!(read(&f, 2 * Z + 4096, B), blk(2));
    assert_eq!(read(&f, 2 * Z + 2 * 4096, B), blk(10));
    assert_eq!(
        read(&f, 2 * Z + 3 * 4096, B),
        vec![0; B],
        "dropped write reads as zeros"
    );
    assert_eq!(read(&f, 2 * Z + 4 * 4096, B), blk(12));
    assert_eq!(
        read(&f, 0, B),
        blk(3),
        "conventional block back to its flushed data"
    );
    assert_eq!(wp(&f, 3), 0);
    assert_eq!(f.report_zones(3, 1).unwrap()[0].cond, ZoneCondition::Empty);
    assert_eq!(f.report_zones(2, 1).unwrap()[0].cond, ZoneCondition::Closed);
    assert_eq!(f.pending_writes(), 0);
    // Writing continues at the new write pointer.
    f.write_at(&blk(40), 2 * Z + 5 * 4096).unwrap();
}

#[test]
fn conventional_overlaps_keep_the_last_surviving_write() {
    let f = FaultyDevice::new(mem()).unwrap();
    f.write_at(&[blk(1), blk(1)].concat(), 0).unwrap();
    f.flush().unwrap();
    f.write_at(&[blk(2), blk(2)].concat(), 0).unwrap(); // 0: dropped
    f.write_at(&blk(3), 4096).unwrap(); // 1: kept
    f.write_at(&blk(4), 0).unwrap(); // 2: dropped
    f.power_cut(|i| i == 1).unwrap();
    assert_eq!(read(&f, 0, B), blk(1));
    assert_eq!(read(&f, 4096, B), blk(3));
}

#[test]
fn reset_and_finish_are_durable() {
    let f = FaultyDevice::new(mem()).unwrap();
    f.write_at(&blk(1), 2 * Z).unwrap();
    f.zone_mgmt(ZoneOp::Reset, 2).unwrap();
    f.write_at(&blk(2), 3 * Z).unwrap();
    f.zone_mgmt(ZoneOp::Finish, 3).unwrap();
    assert_eq!(
        f.pending_writes(),
        1,
        "the reset discarded zone 2's pending write"
    );
    f.power_cut(|_| false).unwrap();
    assert_eq!(wp(&f, 2), 0);
    let z3 = f.report_zones(3, 1).unwrap()[0];
    assert_eq!(z3.cond, ZoneCondition::Full);
    assert_eq!(
        read(&f, 3 * Z, B),
        vec![0; B],
        "the dropped write is gone, the zone full"
    );
}

#[test]
fn device_dies_after_n_writes_until_the_cut() {
    let f = FaultyDevice::new(mem()).unwrap();
    f.cut_power_after_writes(3);
    for i in 0..3u64 {
        f.write_at(&blk(i as u8 + 1), 2 * Z + i * 4096).unwrap();
    }
    assert!(f.is_dead());
    assert_eq!(
        f.write_at(&blk(9), 2 * Z + 3 * 4096).unwrap_err().errno(),
        libc::EIO
    );
    let mut b = vec![0u8; B];
    assert!(f.read_at(&mut b, 2 * Z).is_err());
    assert!(f.flush().is_err());
    f.power_cut(|i| i < 2).unwrap();
    assert!(!f.is_dead());
    assert_eq!(wp(&f, 2), 2 * 4096);
}

/// A small workload cut after every write, with a random subset of the pending writes
/// kept: flushed data is always intact, write pointers never pass the kept data.
#[test]
fn cut_at_every_write_boundary() {
    // Each step: (zone, flush after?)
    let steps: Vec<(u32, bool)> = (0..24).map(|i| (2 + (i % 3) as u32, i % 5 == 4)).collect();
    for cut in 0..=steps.len() as u64 {
        for seed in 0..3 {
            let f = FaultyDevice::new(mem()).unwrap();
            f.cut_power_after_writes(cut);
            let mut next = [0u64; 8];
            let mut durable = [0u64; 8];
            for (i, &(z, flush)) in steps.iter().enumerate() {
                let off = z as u64 * Z + next[z as usize];
                if f.write_at(&blk(i as u8 + 1), off).is_err() {
                    break;
                }
                next[z as usize] += 4096;
                if flush && f.flush().is_ok() {
                    durable = next;
                }
            }
            f.power_cut_random(seed).unwrap();
            for z in 2..5u32 {
                let w = wp(&f, z);
                assert!(
                    w >= durable[z as usize],
                    "cut {cut}: zone {z} lost flushed data"
                );
                assert!(
                    w <= next[z as usize],
                    "cut {cut}: zone {z} wp past written data"
                );
                for (i, &(sz, _)) in steps.iter().enumerate() {
                    let nth = steps[..i].iter().filter(|s| s.0 == sz).count() as u64 * 4096;
                    if sz == z && nth < durable[z as usize] {
                        assert_eq!(read(&f, z as u64 * Z + nth, B), blk(i as u8 + 1));
                    }
                }
            }
        }
    }
}

#[test]
fn power_cut_over_an_emulated_image() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = EmulateOptions::new(8 * Z, Z);
    o.conventional = 1;
    let f = FaultyDevice::new(Emulated::create(&dir.path().join("d.img"), &o).unwrap()).unwrap();
    f.write_at(&blk(1), 2 * Z).unwrap();
    f.flush().unwrap();
    f.write_at(&blk(2), 2 * Z + 4096).unwrap();
    f.write_at(&blk(3), 2 * Z + 8192).unwrap();
    f.power_cut(|i| i == 0).unwrap();
    assert_eq!(wp(&f, 2), 8192);
    assert_eq!(read(&f, 2 * Z + 4096, B), blk(2));
    assert_eq!(read(&f, 2 * Z + 8192, B), vec![0; B]);
}

#[test]
fn mem_snapshot_is_a_power_cycled_copy() {
    let m = mem();
    m.write_at(&blk(1), 2 * Z).unwrap();
    m.write_at(&blk(2), 4096).unwrap();
    let s = m.snapshot();
    m.write_at(&blk(3), 2 * Z + 4096).unwrap();
    assert_eq!(wp(&s, 2), 4096);
    assert_eq!(s.report_zones(2, 1).unwrap()[0].cond, ZoneCondition::Closed);
    assert_eq!(read(&s, 2 * Z, B), blk(1));
    assert_eq!(read(&s, 4096, B), blk(2));
    assert_eq!(read(&s, 2 * Z + 4096, B), vec![0; B]);
    assert_eq!(wp(&m, 2), 8192);
}
