use zbd::{EmulateOptions, Emulated, MemDevice, ZoneCondition, ZonedDevice};

fn exercise(dev: &dyn ZonedDevice) {
    let g = dev.geometry();
    let z = dev.report_all().unwrap();
    let seq = z.iter().find(|z| z.zone_type.is_sequential()).unwrap();
    let data = vec![7u8; 8192];
    dev.write_at(&data, seq.start).unwrap();
    let mut buf = vec![1u8; 16384];
    dev.read_at(&mut buf, seq.start).unwrap();
    assert_eq!(&buf[..8192], &data[..]);
    assert!(buf[8192..].iter().all(|&b| b == 0));
    let z2 = dev.report_zones(seq.id, 1).unwrap()[0];
    assert_eq!(z2.wp, seq.start + 8192);
    assert_eq!(z2.cond, ZoneCondition::ImplicitOpen);
    assert!(dev.write_at(&data, seq.start).is_err());
    assert_eq!(g.nr_zones as usize, z.len());
}

#[test]
fn mem_and_emulated_smoke() {
    let mut o = EmulateOptions::new(16 << 20, 1 << 20);
    o.conventional = 2;
    exercise(&MemDevice::new(&o).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.img");
    let e = Emulated::create(&p, &o).unwrap();
    exercise(&e);
    drop(e);
    let e = Emulated::open(&p).unwrap();
    let z = e.report_zones(2, 1).unwrap()[0];
    assert_eq!(z.wp, z.start + 8192);
    assert_eq!(z.cond, ZoneCondition::Closed);
}

fn run_suite(dev: &dyn ZonedDevice) -> zbd::conformance::Outcome {
    let mut lines = Vec::new();
    let out = zbd::conformance::run(dev, &mut |name, r| lines.push(format!("{name}: {r:?}")));
    for l in &lines {
        eprintln!("{l}");
    }
    out
}

#[test]
fn conformance_mem() {
    let mut o = EmulateOptions::new(32 << 20, 1 << 20);
    o.conventional = 2;
    o.max_open = 4;
    o.max_active = 6;
    let out = run_suite(&MemDevice::new(&o).unwrap());
    assert!(out.ok(), "{out:?}");
}
