//! The conformance suite on every emulated backend and on the fault-injecting wrapper, in
//! geometries that exercise each check (limits, conventional zones, capacity < size).

use zbd::conformance::{run, Outcome};
use zbd::{EmulateOptions, Emulated, FaultyDevice, MemDevice, ZonedDevice};

fn suite(dev: &dyn ZonedDevice) -> Outcome {
    let mut failures = Vec::new();
    let out = run(dev, &mut |name, r| {
        if let Err(e) = r {
            failures.push(format!("{name}: {e}"));
        }
    });
    assert!(failures.is_empty(), "{}: {failures:#?}", dev.describe());
    out
}

/// 32 zones of 1 MiB, 2 conventional, max-open 4, max-active 6: every check runs.
fn limited() -> EmulateOptions {
    let mut o = EmulateOptions::new(32 << 20, 1 << 20);
    o.conventional = 2;
    o.max_open = 4;
    o.max_active = 6;
    o
}

/// No conventional zones, zone capacity below the zone size, open limit only.
fn zns_like() -> EmulateOptions {
    let mut o = EmulateOptions::new(16 << 20, 1 << 20);
    o.conventional = 0;
    o.zone_capacity = 768 << 10;
    o.max_open = 3;
    o.max_active = 0;
    o
}

#[test]
fn mem_device_conforms() {
    let out = suite(&MemDevice::new(&limited()).unwrap());
    assert_eq!(out.skipped, 0, "{out:?}");
    let out = suite(&MemDevice::new(&zns_like()).unwrap());
    // No conventional zones, no max-active limit.
    assert_eq!(out.skipped, 2, "{out:?}");
}

#[test]
fn emulated_image_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let out = suite(&Emulated::create(&dir.path().join("a.img"), &limited()).unwrap());
    assert_eq!(out.skipped, 0, "{out:?}");
    let out = suite(&Emulated::create(&dir.path().join("b.img"), &zns_like()).unwrap());
    assert_eq!(out.skipped, 2, "{out:?}");
}

#[test]
fn faulty_wrapper_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let f = FaultyDevice::new(MemDevice::new(&limited()).unwrap()).unwrap();
    assert_eq!(suite(&f).skipped, 0);
    let e = Emulated::create(&dir.path().join("c.img"), &limited()).unwrap();
    let f = FaultyDevice::new(e).unwrap();
    assert_eq!(suite(&f).skipped, 0);
}

#[test]
fn default_geometry_conforms() {
    // `zonedd emulate` defaults scaled down: max-open 128 is above the zone count, so the
    // limit checks are skipped, everything else runs.
    let dir = tempfile::tempdir().unwrap();
    let o = EmulateOptions::new(64 << 20, 1 << 20);
    let out = suite(&Emulated::create(&dir.path().join("d.img"), &o).unwrap());
    assert_eq!(out.skipped, 3, "{out:?}");
}

/// The suite must notice a broken backend: a wrapper that lets writes ahead of the write
/// pointer through (by writing zeros up to it) fails the suite.
#[test]
fn suite_catches_a_broken_rule() {
    struct Lenient(MemDevice);
    impl ZonedDevice for Lenient {
        fn geometry(&self) -> zbd::Geometry {
            self.0.geometry()
        }
        fn report_zones(&self, f: u32, n: u32) -> zbd::Result<Vec<zbd::Zone>> {
            self.0.report_zones(f, n)
        }
        fn read_at(&self, b: &mut [u8], o: u64) -> zbd::Result<()> {
            self.0.read_at(b, o)
        }
        fn write_at(&self, b: &[u8], o: u64) -> zbd::Result<()> {
            let g = self.0.geometry();
            if let Some(z) = self.0.report_zones(g.zone_of(o), 1)?.first() {
                if z.zone_type.is_sequential() && o > z.wp && o < z.start + z.capacity {
                    self.0.write_at(&vec![0; (o - z.wp) as usize], z.wp)?;
                }
            }
            self.0.write_at(b, o)
        }
        fn zone_mgmt(&self, op: zbd::ZoneOp, z: u32) -> zbd::Result<()> {
            self.0.zone_mgmt(op, z)
        }
        fn reset_all(&self) -> zbd::Result<()> {
            self.0.reset_all()
        }
        fn flush(&self) -> zbd::Result<()> {
            self.0.flush()
        }
        fn describe(&self) -> String {
            "lenient".into()
        }
    }
    let dev = Lenient(MemDevice::new(&limited()).unwrap());
    let mut failed = Vec::new();
    let out = run(&dev, &mut |name, r| {
        if r.is_err() {
            failed.push(name.to_string());
        }
    });
    assert!(!out.ok());
    assert!(
        failed
            .iter()
            .any(|n| n.contains("ahead of the write pointer")),
        "{failed:?}"
    );
}

/// A device that cannot set zone conditions (like a real one): the wrapper emulates them,
/// and the read-only / offline checks run against the wrapper's rules.
#[test]
fn faulty_wrapper_emulates_zone_conditions_for_real_devices() {
    struct NoConditions(MemDevice);
    impl ZonedDevice for NoConditions {
        fn geometry(&self) -> zbd::Geometry {
            self.0.geometry()
        }
        fn report_zones(&self, f: u32, n: u32) -> zbd::Result<Vec<zbd::Zone>> {
            self.0.report_zones(f, n)
        }
        fn read_at(&self, b: &mut [u8], o: u64) -> zbd::Result<()> {
            self.0.read_at(b, o)
        }
        fn write_at(&self, b: &[u8], o: u64) -> zbd::Result<()> {
            self.0.write_at(b, o)
        }
        fn zone_mgmt(&self, op: zbd::ZoneOp, z: u32) -> zbd::Result<()> {
            self.0.zone_mgmt(op, z)
        }
        fn reset_all(&self) -> zbd::Result<()> {
            self.0.reset_all()
        }
        fn flush(&self) -> zbd::Result<()> {
            self.0.flush()
        }
        fn describe(&self) -> String {
            "no conditions".into()
        }
    }
    let bare = NoConditions(MemDevice::new(&limited()).unwrap());
    assert_eq!(
        suite(&bare).skipped,
        2,
        "read-only and offline are skipped on the bare device"
    );
    let f = FaultyDevice::new(bare).unwrap();
    assert_eq!(suite(&f).skipped, 0);
}
