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
    // A failing drive flush fails the volume's flush and stays due; the members flushed
    // beside it (on the caller's thread and on a flush thread) are flushed all the same.
    m.write_at(&a, ZS).unwrap();
    m.write_at(&a, 5 * ZS).unwrap();
    m.write_at(&a, 9 * ZS).unwrap();
    d2.fail_nth(zbd::OpClass::Flush, 1, libc::EIO);
    assert_eq!(m.flush().unwrap_err().errno(), libc::EIO);
    assert_eq!(
        (c.pending_writes(), d1.pending_writes(), d2.pending_writes()),
        (0, 0, 1)
    );
    m.flush().unwrap();
    assert_eq!(d2.pending_writes(), 0);
    // The flush threads end with the volume: nothing holds its members afterwards.
    drop(m);
    assert_eq!(
        (Arc::strong_count(&d1), Arc::strong_count(&d2)),
        (1, 1),
        "a flush thread outlived the volume"
    );
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

/// The volume hands out its cache's source, limited to the cache's usable zones (the
/// runt excluded), and since writes through it pass the volume by, flushes the cache at
/// every flush: none of them is lost to a power cut after the volume's flush.
#[test]
fn a_cache_source_is_limited_to_the_cache_and_always_flushed() {
    // A cache that hands out a source, as an `O_DIRECT` cache block device does (a
    // stand-in: the test writes "through it" on the injector itself).
    let c = Arc::new(
        FaultyDevice::new(RegularDevice::new_mem(4 * ZS + ZS / 2, ZS).unwrap())
            .unwrap()
            .with_read_source(zbd::ReadSource {
                fd: 0,
                base: 0,
                end: None,
                direct: true,
                conv_writes: true,
                seq_writes: false,
            }),
    );
    let d = Arc::new(FaultyDevice::new(MemDevice::with_zones(ZS, 4, 0).unwrap()).unwrap());
    let m = MultiDevice::new(c.clone(), vec![d.clone()]).unwrap();
    let src = m.read_source().expect("the cache's source");
    assert_eq!(src.end, Some(4 * ZS), "up to the runt zone");
    assert!(!src.whole() && !src.seq_writes && src.conv_writes);
    assert!(src.covers(4 * ZS - 4096, 4096));
    assert!(!src.covers(4 * ZS - 4096, 8192));
    assert!(!src.covers(5 * ZS, 4096), "not the drive's zones");
    // A write "through the source": straight to the cache, not through the volume.
    let a = vec![0x5au8; 4096];
    c.write_at(&a, ZS).unwrap();
    assert_eq!(c.pending_writes(), 1);
    m.flush().unwrap();
    assert_eq!(
        c.pending_writes(),
        0,
        "flushed although no write went through the volume"
    );
    c.write_at(&a, 2 * ZS).unwrap();
    m.flush_member(0).unwrap();
    assert_eq!(c.pending_writes(), 0);
    // The drives still flush only when written.
    m.write_at(&a, 5 * ZS).unwrap();
    assert_eq!(d.pending_writes(), 1);
    m.flush().unwrap();
    assert_eq!(d.pending_writes(), 0);
    c.power_cut(|_| false).unwrap();
    let mut b = vec![0u8; 4096];
    for off in [ZS, 2 * ZS, 5 * ZS] {
        m.read_at(&mut b, off).unwrap();
        assert_eq!(a, b, "at {off:#x}");
    }
    // A cache without a source (memory): no source for the volume either.
    let m = MultiDevice::new(cache_mem(4), vec![drive(4, 0)]).unwrap();
    assert!(m.read_source().is_none());
}

/// A cache opened `O_DIRECT` (a block device by default; a file here) gives a source whose
/// file holds the cache's bytes at the volume's offsets, and its own I/O works unaligned.
#[test]
fn a_direct_cache_file_is_read_and_written_through_its_source() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(3 * ZS + ZS / 2)
        .unwrap();
    let cache = match RegularDevice::open_direct(&path, ZS, true) {
        Ok(c) => c,
        Err(e) if e.to_string().contains("Invalid argument") => {
            eprintln!("SKIP: no O_DIRECT here ({e})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let own = cache.read_source().expect("a direct cache has a source");
    assert!(own.whole() && own.direct);
    // Buffered, a file gives none.
    assert!(RegularDevice::open(&path, ZS, false)
        .unwrap()
        .read_source()
        .is_none());
    let m = MultiDevice::new(Arc::new(cache), vec![drive(4, 0)]).unwrap();
    let src = m.read_source().unwrap();
    assert_eq!((src.end, src.fd), (Some(3 * ZS), own.fd));
    // Written through the device (an unaligned buffer: bounced), read through the file.
    let data: Vec<u8> = (0..8192 + 1).map(|i| (i * 7 % 251) as u8).collect();
    m.write_at(&data[1..], 2 * ZS + 4096).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let mut b = vec![0u8; 8192];
    f.read_exact_at(&mut b, src.base + 2 * ZS + 4096).unwrap();
    assert_eq!(b, data[1..]);
    // Written through the file, read through the device.
    let mut w = zbd::AlignedBuf::new_zeroed(4096);
    w.fill(0xc3);
    // SAFETY: w is a live, 4096-aligned buffer of 4096 bytes; fd is the open cache file.
    let n = unsafe { libc::pwrite(src.fd, w.as_ptr().cast(), 4096, (src.base + ZS) as i64) };
    assert_eq!(n, 4096);
    m.read_at(&mut b[..4096], ZS).unwrap();
    assert_eq!(&b[..4096], &w[..]);
}

/// A flush that finds a drive being flushed by another caller waits for that flush: the
/// other caller cleared the drive's dirty flag before its device flush, and returning at
/// once would report writes durable that are not yet.
#[test]
fn a_flush_waits_for_the_flush_in_flight_of_a_member() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Mutex};
    use std::time::Duration;
    let d1 = Arc::new(FaultyDevice::new(MemDevice::with_zones(ZS, 4, 0).unwrap()).unwrap());
    let m = Arc::new(MultiDevice::new(cache_mem(4), vec![d1.clone(), drive(4, 0)]).unwrap());
    m.write_at(&[0x22u8; 4096], 4 * ZS).unwrap();
    // d1's device flush stops until released, then marks itself done (the observer runs
    // before the flush itself; the member stays locked until the device flush returns).
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let done = Arc::new(AtomicBool::new(false));
    let done2 = done.clone();
    d1.fail_matching(
        move |op| {
            if op.kind == zbd::OpKind::Flush {
                let _ = entered_tx.send(());
                let _ = release_rx.lock().unwrap().recv();
                done2.store(true, Ordering::SeqCst);
            }
            false
        },
        libc::EIO,
    );
    let first = {
        let m = m.clone();
        std::thread::spawn(move || m.flush())
    };
    entered.recv().unwrap();
    let (returned_tx, returned) = mpsc::channel();
    let second = {
        let (m, done) = (m.clone(), done.clone());
        std::thread::spawn(move || {
            let r = m.flush();
            returned_tx.send(done.load(Ordering::SeqCst)).unwrap();
            r
        })
    };
    // Give the second flush time to return early (it must not); it waits for the release
    // otherwise, and the verdict below does not depend on this wait's length.
    let early = returned.recv_timeout(Duration::from_millis(300)).ok();
    release.send(()).unwrap();
    let flushed_first = early.unwrap_or_else(|| returned.recv().unwrap());
    assert!(
        flushed_first,
        "the second flush returned before the first one's device flush"
    );
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
}

/// A flush thread that dies in a member's flush (a panic in the device) fails the volume's
/// flush with EIO; it does not leave the caller waiting for a reply that never comes.
#[test]
fn a_flush_thread_that_panics_fails_the_flush() {
    let d1 = Arc::new(FaultyDevice::new(MemDevice::with_zones(ZS, 4, 0).unwrap()).unwrap());
    let d2 = Arc::new(FaultyDevice::new(MemDevice::with_zones(ZS, 4, 0).unwrap()).unwrap());
    let m = MultiDevice::new(cache_mem(4), vec![d1.clone(), d2.clone()]).unwrap();
    m.write_at(&[0x33u8; 4096], 4 * ZS).unwrap();
    m.write_at(&[0x33u8; 4096], 8 * ZS).unwrap();
    // d1 is flushed on the caller's thread, d2 on its flush thread, which panics.
    d2.fail_matching(
        |op| {
            assert!(
                op.kind != zbd::OpKind::Flush,
                "injected panic in d2's flush"
            );
            false
        },
        libc::EIO,
    );
    // On a thread, so that a regression fails here instead of hanging the test run.
    let (tx, rx) = std::sync::mpsc::channel();
    let m = Arc::new(m);
    let m2 = m.clone();
    std::thread::spawn(move || tx.send(m2.flush().map_err(|e| e.errno())));
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("the flush waits for good for the reply of a flush thread that died");
    assert_eq!(r, Err(libc::EIO));
    assert_eq!(
        d1.pending_writes(),
        0,
        "the other drive is flushed all the same"
    );
}
