//! The multi-device composition: a regular cache device and zoned drives as one device.

use std::sync::Arc;
use zbd::{
    FaultyDevice, MemDevice, MultiDevice, RegularDevice, ZoneCondition, ZoneType, ZonedDevice,
};

const ZS: u64 = 1 << 20;

fn cache_mem(zones: u64) -> Arc<dyn ZonedDevice> {
    Arc::new(RegularDevice::new_mem(zones * ZS, ZS).unwrap())
}

fn drive(zones: u32, conv: u32) -> Arc<dyn ZonedDevice> {
    Arc::new(MemDevice::with_zones(ZS, zones, conv).unwrap())
}

#[test]
fn one_address_space_in_member_order() {
    let m = MultiDevice::new(cache_mem(4), vec![drive(8, 0), drive(6, 1)]).unwrap();
    let g = m.geometry();
    assert_eq!(g.nr_zones, 4 + 8 + 6);
    let zones = m.report_all().unwrap();
    for (i, z) in zones.iter().enumerate() {
        assert_eq!(z.id as usize, i);
        assert_eq!(z.start, i as u64 * ZS);
    }
    assert!(zones[..4]
        .iter()
        .all(|z| z.zone_type == ZoneType::Conventional));
    assert!(zones[4..12].iter().all(|z| z.zone_type.is_sequential()));
    assert_eq!(zones[12].zone_type, ZoneType::Conventional);
    let members = m.members();
    assert_eq!(
        members
            .iter()
            .map(|x| (x.first_zone, x.nr_zones, x.cache))
            .collect::<Vec<_>>(),
        vec![(0, 4, true), (4, 8, false), (12, 6, false)]
    );

    // A write to each member lands there and reads back through the volume.
    let a = vec![0xa5u8; 8192];
    m.write_at(&a, 2 * ZS + 4096).unwrap();
    m.write_at(&a, 5 * ZS).unwrap();
    m.write_at(&a, 13 * ZS).unwrap();
    let mut b = vec![0u8; 8192];
    for off in [2 * ZS + 4096, 5 * ZS, 13 * ZS] {
        m.read_at(&mut b, off).unwrap();
        assert_eq!(a, b, "at {off:#x}");
    }
    assert_eq!(m.report_zones(5, 1).unwrap()[0].wp, 5 * ZS + 8192);
    // Off the write pointer of a drive's sequential zone: the drive's rule holds.
    assert_eq!(
        m.write_at(&a, 6 * ZS + 4096).unwrap_err().errno(),
        libc::EIO
    );
    m.zone_mgmt(zbd::ZoneOp::Reset, 5).unwrap();
    assert_eq!(m.report_zones(5, 1).unwrap()[0].wp, 5 * ZS);
}

#[test]
fn trailing_runt_of_the_cache_is_offline() {
    let cache: Arc<dyn ZonedDevice> =
        Arc::new(RegularDevice::new_mem(3 * ZS + 64 * 1024, ZS).unwrap());
    let m = MultiDevice::new(cache, vec![drive(4, 0)]).unwrap();
    let zones = m.report_all().unwrap();
    assert_eq!(zones.len(), 4 + 4);
    assert_eq!(zones[3].cond, ZoneCondition::Offline);
    assert_eq!(zones[3].len, 64 * 1024);
    assert_eq!(
        zones[4].start,
        4 * ZS,
        "the drive starts after the runt zone"
    );
    assert_eq!(
        m.write_at(&[0u8; 4096], 3 * ZS).unwrap_err().errno(),
        libc::EIO
    );
}

#[test]
fn refusals() {
    let e = MultiDevice::new(
        cache_mem(4),
        vec![Arc::new(MemDevice::with_zones(2 * ZS, 4, 0).unwrap())],
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("zone size"), "{e}");
    let e = MultiDevice::new(drive(4, 1), vec![drive(4, 0)])
        .err()
        .unwrap();
    assert!(e.to_string().contains("is a zoned device"), "{e}");
    let e = MultiDevice::new(cache_mem(4), vec![drive(4, 4)])
        .err()
        .unwrap();
    assert!(e.to_string().contains("no sequential zones"), "{e}");
    assert!(MultiDevice::new(cache_mem(4), vec![]).is_err());
}

/// Each member flushes only when it took writes; a power cut of one drive loses only that
/// drive's unflushed writes.
#[test]
fn per_member_flush_and_power_cut() {
    let c = Arc::new(FaultyDevice::new(RegularDevice::new_mem(4 * ZS, ZS).unwrap()).unwrap());
    let d1 = Arc::new(FaultyDevice::new(MemDevice::with_zones(ZS, 4, 0).unwrap()).unwrap());
    let d2 = Arc::new(FaultyDevice::new(MemDevice::with_zones(ZS, 4, 0).unwrap()).unwrap());
    let m = MultiDevice::new(c.clone(), vec![d1.clone(), d2.clone()]).unwrap();
    let a = vec![0x11u8; 4096];
    m.write_at(&a, 0).unwrap();
    m.write_at(&a, 4 * ZS).unwrap();
    m.write_at(&a, 8 * ZS).unwrap();
    assert_eq!(
        (c.pending_writes(), d1.pending_writes(), d2.pending_writes()),
        (1, 1, 1)
    );
    m.flush_member(1).unwrap();
    assert_eq!(
        (c.pending_writes(), d1.pending_writes(), d2.pending_writes()),
        (1, 0, 1)
    );
    d2.power_cut(|_| false).unwrap();
    let mut b = vec![0u8; 4096];
    m.read_at(&mut b, 4 * ZS).unwrap();
    assert_eq!(a, b, "flushed drive keeps its write");
    m.read_at(&mut b, 8 * ZS).unwrap();
    assert!(
        b.iter().all(|&x| x == 0),
        "cut drive lost its unflushed write"
    );
    m.read_at(&mut b, 0).unwrap();
    assert_eq!(a, b, "the cache still has its (unflushed, uncut) write");
    m.flush().unwrap();
    assert_eq!(
        (c.pending_writes(), d1.pending_writes(), d2.pending_writes()),
        (0, 0, 0)
    );
    // A failing drive flush fails the volume's flush and stays due.
    m.write_at(&a, 9 * ZS).unwrap();
    d2.fail_nth(zbd::OpClass::Flush, 1, libc::EIO);
    assert_eq!(m.flush().unwrap_err().errno(), libc::EIO);
    m.flush().unwrap();
    assert_eq!(d2.pending_writes(), 0);
}

#[test]
fn open_multi_refuses_bad_device_lists() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = zbd::EmulateOptions::new(8 * ZS, ZS);
    o.conventional = 0;
    let z1 = dir.path().join("z1.img");
    let z2 = dir.path().join("z2.img");
    zbd::Emulated::create(&z1, &o).unwrap();
    let mut o2 = zbd::EmulateOptions::new(16 * ZS, 2 * ZS);
    o2.conventional = 0;
    zbd::Emulated::create(&z2, &o2).unwrap();
    let cache = dir.path().join("cache.img");
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(4 * ZS)
        .unwrap();
    let msg = |r: zbd::Result<MultiDevice>| r.err().unwrap().to_string();
    assert!(msg(zbd::open_multi(&cache, &[&z1, &z1], true)).contains("given twice"));
    assert!(msg(zbd::open_multi(&z1, &[&cache], true)).contains("is a zoned device"));
    assert!(msg(zbd::open_multi(&cache, &[&cache], true)).contains("given twice"));
    let cache2 = dir.path().join("cache2.img");
    std::fs::File::create(&cache2)
        .unwrap()
        .set_len(4 * ZS)
        .unwrap();
    assert!(msg(zbd::open_multi(&cache, &[&cache2], true)).contains("regular device"));
    assert!(msg(zbd::open_multi(&cache, &[&z1, &z2], true)).contains("zone size"));
    let missing = dir.path().join("nope.img");
    assert!(msg(zbd::open_multi(&cache, &[&missing], true)).contains("nope.img"));
    let m = zbd::open_multi(&cache, &[&z1], true).unwrap();
    assert_eq!(m.geometry().nr_zones, 12);
    // Held: a second exclusive open of the same set is refused.
    assert!(msg(zbd::open_multi(&cache, &[&z1], true)).contains("in use"));
}
