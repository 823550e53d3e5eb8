//! The emulated image backend: layout, persistence across clean restarts and crashes,
//! locking, sparseness, validation.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use zbd::{EmulateOptions, Emulated, ZoneCondition, ZoneOp, ZonedDevice};

const Z: u64 = 1 << 20;

fn opts() -> EmulateOptions {
    let mut o = EmulateOptions::new(16 * Z, Z);
    o.conventional = 2;
    o.max_open = 4;
    o
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 / 7)) as u8 | 1)
        .collect()
}

fn read(dev: &dyn ZonedDevice, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0xeeu8; len];
    dev.read_at(&mut b, off).unwrap();
    b
}

#[test]
fn header_and_table_follow_the_documented_layout() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.img");
    let dev = Emulated::create(&p, &opts()).unwrap();
    dev.write_at(&pattern(1, 8192), 3 * Z).unwrap();
    // No flush: the entry is in the file (page cache) as soon as the write returns.
    let f = std::fs::File::open(&p).unwrap();
    let mut h = vec![0u8; 4096];
    f.read_exact_at(&mut h, 0).unwrap();
    assert_eq!(&h[0..8], b"ZONEDDEM");
    assert_eq!(u32::from_le_bytes(h[8..12].try_into().unwrap()), 1);
    assert_eq!(u64::from_le_bytes(h[16..24].try_into().unwrap()), Z);
    assert_eq!(u32::from_le_bytes(h[32..36].try_into().unwrap()), 16);
    assert_eq!(u32::from_le_bytes(h[36..40].try_into().unwrap()), 2);
    let data_off = u64::from_le_bytes(h[64..72].try_into().unwrap());
    assert_eq!(data_off, Z); // 4096 + 16 * 16 rounded up to the zone size
    assert_eq!(f.metadata().unwrap().len(), data_off + 16 * Z);
    let mut e = [0u8; 16];
    f.read_exact_at(&mut e, 4096 + 3 * 16).unwrap();
    assert_eq!(u64::from_le_bytes(e[0..8].try_into().unwrap()), 8192);
    assert_eq!(e[8], 2, "implicit open");
    assert_eq!(e[9], 2, "sequential write required");
    f.read_exact_at(&mut e, 4096).unwrap();
    assert_eq!((e[8], e[9]), (0, 1), "conventional, not-wp");
    let mut d = vec![0u8; 8192];
    f.read_exact_at(&mut d, data_off + 3 * Z).unwrap();
    assert_eq!(d, pattern(1, 8192));
}

#[test]
fn state_survives_a_clean_restart() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.img");
    let dev = Emulated::create(&p, &opts()).unwrap();
    dev.write_at(&pattern(1, 4096), 5 * 4096).unwrap(); // conventional, random offset
    dev.write_at(&pattern(2, 12288), 2 * Z).unwrap(); // implicit open
    dev.write_at(&pattern(3, 4096), 3 * Z).unwrap();
    dev.zone_mgmt(ZoneOp::Close, 3).unwrap(); // closed
    dev.write_at(&pattern(4, 4096), 4 * Z).unwrap();
    dev.zone_mgmt(ZoneOp::Finish, 4).unwrap(); // full
    dev.zone_mgmt(ZoneOp::Open, 5).unwrap(); // explicit open, empty
    dev.write_at(&pattern(5, 4096), 6 * Z).unwrap();
    dev.set_condition(6, ZoneCondition::ReadOnly).unwrap();
    dev.set_condition(7, ZoneCondition::Offline).unwrap();
    dev.flush().unwrap();
    drop(dev);

    let dev = Emulated::open(&p).unwrap();
    let zones = dev.report_all().unwrap();
    let c = |z: usize| (zones[z].cond, zones[z].wp - zones[z].start);
    assert_eq!(c(0), (ZoneCondition::NotWp, 0));
    assert_eq!(
        c(2),
        (ZoneCondition::Closed, 12288),
        "open zones come back closed"
    );
    assert_eq!(c(3), (ZoneCondition::Closed, 4096));
    assert_eq!(c(4), (ZoneCondition::Full, Z));
    assert_eq!(
        c(5),
        (ZoneCondition::Empty, 0),
        "explicitly open empty zone comes back empty"
    );
    assert_eq!(c(6).0, ZoneCondition::ReadOnly);
    assert_eq!(c(7).0, ZoneCondition::Offline);
    assert_eq!(c(8), (ZoneCondition::Empty, 0));
    assert_eq!(read(&dev, 5 * 4096, 4096), pattern(1, 4096));
    assert_eq!(read(&dev, 2 * Z, 12288), pattern(2, 12288));
    assert_eq!(read(&dev, 4 * Z, 4096), pattern(4, 4096));
    assert_eq!(read(&dev, 6 * Z, 4096), pattern(5, 4096));
    assert!(read(&dev, 4 * Z + 4096, 8192).iter().all(|&b| b == 0));
    // Writes continue at the persisted write pointer.
    dev.write_at(&pattern(6, 4096), 2 * Z + 12288).unwrap();
    assert!(
        dev.write_at(&pattern(6, 4096), 6 * Z + 4096).is_err(),
        "still read-only"
    );
}

#[test]
fn a_copy_taken_mid_way_reopens_at_that_point() {
    // What a crash of the process at that moment leaves: the file as the page cache has it.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.img");
    let dev = Emulated::create(&p, &opts()).unwrap();
    for i in 0..6u64 {
        dev.write_at(&pattern(i, 8192), 2 * Z + i * 8192).unwrap();
    }
    dev.zone_mgmt(ZoneOp::Finish, 3).unwrap();
    let copy = dir.path().join("copy.img");
    std::fs::copy(&p, &copy).unwrap();
    for i in 6..10u64 {
        dev.write_at(&pattern(i, 8192), 2 * Z + i * 8192).unwrap();
    }
    dev.zone_mgmt(ZoneOp::Reset, 3).unwrap();
    // Dropped without a flush.
    drop(dev);

    let c = Emulated::open(&copy).unwrap();
    let z = c.report_zones(2, 2).unwrap();
    assert_eq!(
        (z[0].cond, z[0].wp - z[0].start),
        (ZoneCondition::Closed, 6 * 8192)
    );
    assert_eq!(z[1].cond, ZoneCondition::Full);
    for i in 0..6u64 {
        assert_eq!(read(&c, 2 * Z + i * 8192, 8192), pattern(i, 8192));
    }
    assert!(read(&c, 2 * Z + 6 * 8192, 8192).iter().all(|&b| b == 0));

    let d = Emulated::open(&p).unwrap();
    let z = d.report_zones(2, 2).unwrap();
    assert_eq!(
        z[0].wp - z[0].start,
        10 * 8192,
        "drop without flush loses nothing"
    );
    assert_eq!(z[1].cond, ZoneCondition::Empty);
}

#[test]
fn one_user_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.img");
    let dev = Emulated::create(&p, &opts()).unwrap();
    let e = Emulated::open(&p).err().expect("second open must fail");
    assert!(e.to_string().contains("in use"), "{e}");
    let e = zbd::open(&p).err().expect("second open must fail");
    assert!(e.to_string().contains("in use"), "{e}");
    // Inspection does not need the lock.
    let shared = zbd::open_shared(&p).unwrap();
    assert_eq!(shared.geometry(), dev.geometry());
    drop(dev);
    assert!(zbd::open(&p).is_ok());
}

#[test]
fn images_are_sparse_and_reset_frees_space() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.img");
    let o = EmulateOptions::new(10 << 40, 256 << 20);
    let dev = Emulated::create(&p, &o).unwrap();
    assert_eq!(dev.geometry().nr_zones, 40960);
    assert_eq!(dev.nr_conventional(), 409);
    let used = |p: &Path| std::fs::metadata(p).unwrap().blocks() * 512;
    assert!(
        used(&p) < 4 << 20,
        "a fresh 10T image uses {} bytes",
        used(&p)
    );
    let z = dev.nr_conventional();
    let start = z as u64 * (256 << 20);
    dev.write_at(&vec![7u8; 8 << 20], start).unwrap();
    dev.flush().unwrap();
    let before = used(&p);
    assert!(before >= 8 << 20);
    dev.zone_mgmt(ZoneOp::Reset, z).unwrap();
    let after = used(&p);
    assert!(
        before - after >= 8 << 20,
        "reset freed {} bytes",
        before - after
    );
}

#[test]
fn bad_images_are_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    std::fs::write(&plain, vec![0u8; 1 << 20]).unwrap();
    let e = zbd::open(&plain).err().unwrap().to_string();
    assert!(
        e.contains("without the zonedd image header") && e.contains("zonedd emulate"),
        "{e}"
    );

    let p = dir.path().join("d.img");
    drop(Emulated::create(&p, &opts()).unwrap());
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&[0x55], 20).unwrap(); // zone size field
    let e = Emulated::open(&p).err().unwrap().to_string();
    assert!(e.contains("corrupt image header"), "{e}");

    let q = dir.path().join("t.img");
    drop(Emulated::create(&q, &opts()).unwrap());
    let f = std::fs::OpenOptions::new().write(true).open(&q).unwrap();
    f.set_len(4 * Z).unwrap();
    let e = Emulated::open(&q).err().unwrap().to_string();
    assert!(e.contains("truncated"), "{e}");

    let e = Emulated::create(&q, &opts()).err().unwrap().to_string();
    assert!(e.contains("--force"), "{e}");
    let mut o = opts();
    o.force = true;
    assert!(Emulated::create(&q, &o).is_ok());
}

#[test]
fn concurrent_writers_on_different_zones() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts();
    o.max_open = 0;
    let dev = Emulated::create(&dir.path().join("d.img"), &o).unwrap();
    std::thread::scope(|s| {
        for z in 2..10u32 {
            let dev = &dev;
            s.spawn(move || {
                for i in 0..32u64 {
                    dev.write_at(&pattern(z as u64 * 100 + i, 4096), z as u64 * Z + i * 4096)
                        .unwrap();
                }
            });
        }
    });
    for z in 2..10u32 {
        let zi = dev.report_zones(z, 1).unwrap()[0];
        assert_eq!(zi.wp - zi.start, 32 * 4096);
        for i in 0..32u64 {
            assert_eq!(
                read(&dev, z as u64 * Z + i * 4096, 4096),
                pattern(z as u64 * 100 + i, 4096)
            );
        }
    }
}
