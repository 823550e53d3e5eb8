//! The backend conformance suite, written once for every [`ZonedDevice`]: the rules a
//! host-managed drive enforces, checked on whatever zones the device has. It **destroys
//! all data** on the device.
//!
//! `cargo test` runs it on [`crate::Emulated`], [`crate::MemDevice`] and
//! [`crate::FaultyDevice`]; `zonedd conformance DEV --yes-destroy-data` runs it on real
//! devices (null_blk, scsi_debug, SMR, ZNS). Checks that need something the device lacks
//! (conventional zones, open/active limits, settable zone conditions) are reported as
//! skipped.
//!
//! Accepted errnos: writes off the write pointer, to full / read-only / offline zones fail
//! with EIO (EREMOTEIO through the SCSI stack, where a drive's check condition becomes
//! BLK_STS_TARGET); I/O crossing a zone end with those or EINVAL; unaligned I/O with
//! EINVAL; out-of-range I/O with EINVAL or a drive error; the open limit with
//! ETOOMANYREFS, the active limit with EOVERFLOW.

use crate::{Geometry, ZbdError, Zone, ZoneCondition, ZoneOp, ZoneType, ZonedDevice, BLOCK_SIZE};

/// Counts of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.failed == 0
    }
}

/// One check of the suite.
type CheckFn<'a> = fn(&Ctx<'a>) -> Check;

/// Result of one check.
type Check = std::result::Result<Status, String>;

enum Status {
    Passed,
    Skipped(String),
}

const B: u64 = BLOCK_SIZE;

/// A drive's rejection: EIO, or EREMOTEIO through the SCSI stack (a check condition).
const DRIVE: &[i32] = &[libc::EIO, libc::EREMOTEIO];
/// Crossing a zone end: rejected by the drive or before it.
const CROSS: &[i32] = &[libc::EIO, libc::EREMOTEIO, libc::EINVAL];

/// Runs every check. `report` gets one call per check: its name and `Ok` or the failure.
/// A skipped check is reported `Ok` with a name ending in `(skipped: why)`.
pub fn run<'a>(
    dev: &'a (dyn ZonedDevice + 'a),
    report: &mut dyn FnMut(&str, std::result::Result<(), String>),
) -> Outcome {
    let mut out = Outcome::default();
    let ctx = match Ctx::new(dev) {
        Ok(c) => c,
        Err(e) => {
            report("setup", Err(e));
            out.failed += 1;
            return out;
        }
    };
    let checks: &[(&str, CheckFn<'a>)] = &[
        ("geometry and zone report are consistent", Ctx::geometry),
        ("reset-all empties every sequential zone", Ctx::reset_all),
        ("write at the write pointer advances it", Ctx::write_at_wp),
        (
            "write ahead of the write pointer fails with EIO, writes nothing",
            Ctx::write_ahead,
        ),
        (
            "write behind the write pointer fails with EIO, writes nothing",
            Ctx::write_behind,
        ),
        (
            "reads at and past the write pointer return zeros",
            Ctx::read_past_wp,
        ),
        ("read crossing a zone end fails", Ctx::read_crossing),
        (
            "write crossing a zone end fails, writes nothing",
            Ctx::write_crossing,
        ),
        (
            "a zone written to capacity is full; writes to it fail",
            Ctx::fill_zone,
        ),
        (
            "finish makes a zone full; unwritten blocks read as zeros",
            Ctx::finish,
        ),
        ("reset empties a zone; its blocks read as zeros", Ctx::reset),
        (
            "explicit open, close, implicit open transitions",
            Ctx::open_close,
        ),
        (
            "max-open: implicit open at the limit closes an implicitly open zone",
            Ctx::max_open_implicit,
        ),
        (
            "max-open: explicit opens beyond the limit fail with ETOOMANYREFS",
            Ctx::max_open_explicit,
        ),
        (
            "max-active: opening beyond the limit fails with EOVERFLOW",
            Ctx::max_active,
        ),
        (
            "conventional zones take random writes and no zone operations",
            Ctx::conventional,
        ),
        ("unaligned I/O fails with EINVAL", Ctx::unaligned),
        ("I/O beyond the device end fails", Ctx::out_of_range),
        (
            "read-only zone: reads work, writes and zone operations fail",
            Ctx::read_only,
        ),
        (
            "offline zone: reads, writes and zone operations fail",
            Ctx::offline,
        ),
        ("flush succeeds", Ctx::flush),
    ];
    for (name, check) in checks {
        let r = ctx
            .dev
            .reset_all()
            .map_err(|e| format!("reset-all before the check: {e}"));
        let r = r.and_then(|_| check(&ctx));
        match r {
            Ok(Status::Passed) => {
                out.passed += 1;
                report(name, Ok(()));
            }
            Ok(Status::Skipped(why)) => {
                out.skipped += 1;
                report(&format!("{name} (skipped: {why})"), Ok(()));
            }
            Err(e) => {
                out.failed += 1;
                report(name, Err(e));
            }
        }
    }
    if let Err(e) = ctx.dev.reset_all() {
        out.failed += 1;
        report("final reset-all", Err(e.to_string()));
    }
    out
}

struct Ctx<'a> {
    dev: &'a dyn ZonedDevice,
    geo: Geometry,
    /// Usable sequential zones (not read-only or offline at the start).
    seq: Vec<u32>,
    conv: Vec<u32>,
}

type R<T> = std::result::Result<T, String>;

fn pattern(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> R<()> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

fn expect_err(r: crate::Result<()>, errnos: &[i32], what: &str) -> R<()> {
    match r {
        Ok(()) => Err(format!("{what}: succeeded, expected an error")),
        Err(e) if errnos.contains(&e.errno()) => Ok(()),
        Err(e) => Err(format!(
            "{what}: failed with errno {} ({e}), expected {}",
            e.errno(),
            errnos
                .iter()
                .map(|n| std::io::Error::from_raw_os_error(*n).to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        )),
    }
}

fn ok<T>(r: crate::Result<T>, what: &str) -> R<T> {
    r.map_err(|e: ZbdError| format!("{what}: {e}"))
}

impl<'a> Ctx<'a> {
    fn new(dev: &'a dyn ZonedDevice) -> R<Self> {
        let geo = dev.geometry();
        let zones = ok(dev.report_all(), "report zones")?;
        let usable = |z: &Zone| !matches!(z.cond, ZoneCondition::ReadOnly | ZoneCondition::Offline);
        Ok(Ctx {
            dev,
            geo,
            seq: zones
                .iter()
                .filter(|z| z.zone_type.is_sequential() && usable(z))
                .map(|z| z.id)
                .collect(),
            conv: zones
                .iter()
                .filter(|z| z.zone_type == ZoneType::Conventional && usable(z))
                .map(|z| z.id)
                .collect(),
        })
    }

    fn zone(&self, z: u32) -> R<Zone> {
        let v = ok(self.dev.report_zones(z, 1), "report zone")?;
        v.first()
            .copied()
            .ok_or_else(|| format!("zone {z} missing from the report"))
    }

    fn seq_zone(&self, i: usize) -> R<Zone> {
        let z = *self
            .seq
            .get(i)
            .ok_or_else(|| format!("need {} usable sequential zones", i + 1))?;
        self.zone(z)
    }

    fn expect_zone(&self, z: u32, cond: ZoneCondition, wp_rel: Option<u64>) -> R<()> {
        let zi = self.zone(z)?;
        ensure(zi.cond == cond, || {
            format!("zone {z}: condition {:?}, expected {cond:?}", zi.cond)
        })?;
        if let Some(w) = wp_rel {
            ensure(zi.wp == zi.start + w, || {
                format!(
                    "zone {z}: write pointer at +{:#x}, expected +{w:#x}",
                    zi.wp - zi.start
                )
            })?;
        }
        Ok(())
    }

    fn read(&self, off: u64, len: u64) -> R<Vec<u8>> {
        let mut b = vec![0xa5u8; len as usize];
        ok(
            self.dev.read_at(&mut b, off),
            &format!("read {len} at {off:#x}"),
        )?;
        Ok(b)
    }

    fn expect_data(&self, off: u64, want: &[u8]) -> R<()> {
        let got = self.read(off, want.len() as u64)?;
        match got.iter().zip(want).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(i) => Err(format!(
                "data at {:#x} differs from what was written (first at +{i:#x})",
                off
            )),
        }
    }

    fn expect_zeros(&self, off: u64, len: u64) -> R<()> {
        let got = self.read(off, len)?;
        match got.iter().position(|&b| b != 0) {
            None => Ok(()),
            Some(i) => Err(format!(
                "expected zeros at {:#x}, found data at +{i:#x}",
                off
            )),
        }
    }

    fn write(&self, off: u64, data: &[u8]) -> R<()> {
        ok(
            self.dev.write_at(data, off),
            &format!("write {} at {off:#x}", data.len()),
        )
    }

    fn mgmt(&self, op: ZoneOp, z: u32) -> R<()> {
        ok(self.dev.zone_mgmt(op, z), &format!("{op} zone {z}"))
    }

    /// Writes `len` bytes of pattern at the zone's write pointer in chunks of 4 MiB.
    fn fill(&self, from: u64, len: u64) -> R<()> {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(4 << 20);
            self.write(from + done, &pattern(from + done, n))?;
            done += n;
        }
        Ok(())
    }

    fn geometry(&self) -> Check {
        let g = self.geo;
        let zones = ok(self.dev.report_all(), "report zones")?;
        ensure(
            g.zone_size.is_power_of_two() && g.zone_size.is_multiple_of(B),
            || {
                format!(
                    "zone size {} is not a power of two multiple of 4096",
                    g.zone_size
                )
            },
        )?;
        ensure(
            g.block_size > 0 && B.is_multiple_of(g.block_size as u64),
            || format!("logical block size {} does not divide 4096", g.block_size),
        )?;
        ensure(
            g.zone_capacity <= g.zone_size && g.zone_capacity.is_multiple_of(B),
            || format!("zone capacity {} is invalid", g.zone_capacity),
        )?;
        ensure(zones.len() == g.nr_zones as usize, || {
            format!(
                "report has {} zones, geometry says {}",
                zones.len(),
                g.nr_zones
            )
        })?;
        for (i, z) in zones.iter().enumerate() {
            ensure(
                z.id == i as u32 && z.start == i as u64 * g.zone_size && z.len == g.zone_size,
                || {
                    format!(
                        "zone {i} has id {} start {:#x} len {:#x}",
                        z.id, z.start, z.len
                    )
                },
            )?;
            ensure(z.capacity <= z.len, || {
                format!("zone {i}: capacity above length")
            })?;
            if z.zone_type.is_sequential() {
                ensure(z.wp >= z.start && z.wp <= z.start + z.len, || {
                    format!("zone {i}: write pointer {:#x} outside the zone", z.wp)
                })?;
            } else {
                ensure(
                    matches!(
                        z.cond,
                        ZoneCondition::NotWp | ZoneCondition::ReadOnly | ZoneCondition::Offline
                    ),
                    || format!("conventional zone {i} has condition {:?}", z.cond),
                )?;
            }
        }
        // A partial report starting mid-device.
        if g.nr_zones >= 2 {
            let part = ok(self.dev.report_zones(g.nr_zones - 1, 5), "report last zone")?;
            ensure(part.len() == 1 && part[0].id == g.nr_zones - 1, || {
                "report of the last zone returned the wrong zones".into()
            })?;
        }
        ensure(!self.seq.is_empty(), || "no usable sequential zone".into())?;
        Ok(Status::Passed)
    }

    fn reset_all(&self) -> Check {
        let n = self.seq.len().min(3);
        for i in 0..n {
            let z = self.seq_zone(i)?;
            self.write(z.start, &pattern(1, B))?;
        }
        ok(self.dev.reset_all(), "reset-all")?;
        for z in ok(self.dev.report_all(), "report zones")? {
            if z.zone_type.is_sequential() && self.seq.contains(&z.id) {
                self.expect_zone(z.id, ZoneCondition::Empty, Some(0))?;
            }
        }
        for i in 0..n {
            self.expect_zeros(self.seq_zone(i)?.start, B)?;
        }
        Ok(Status::Passed)
    }

    fn write_at_wp(&self) -> Check {
        let z = self.seq_zone(0)?;
        let a = pattern(2, 2 * B);
        self.write(z.start, &a)?;
        self.expect_zone(z.id, ZoneCondition::ImplicitOpen, Some(2 * B))?;
        let b1 = pattern(3, B);
        let b2 = pattern(4, 2 * B);
        ok(
            self.dev.writev_at(&[&b1, &b2], z.start + 2 * B),
            "writev at the write pointer",
        )?;
        self.expect_zone(z.id, ZoneCondition::ImplicitOpen, Some(5 * B))?;
        self.expect_data(z.start, &a)?;
        self.expect_data(z.start + 2 * B, &b1)?;
        self.expect_data(z.start + 3 * B, &b2)?;
        Ok(Status::Passed)
    }

    fn write_ahead(&self) -> Check {
        let z = self.seq_zone(0)?;
        expect_err(
            self.dev.write_at(&pattern(5, B), z.start + B),
            DRIVE,
            "write one block past the write pointer of an empty zone",
        )?;
        self.expect_zone(z.id, ZoneCondition::Empty, Some(0))?;
        self.write(z.start, &pattern(6, B))?;
        expect_err(
            self.dev.write_at(&pattern(7, B), z.start + 2 * B),
            DRIVE,
            "write one block past the write pointer",
        )?;
        self.expect_zone(z.id, ZoneCondition::ImplicitOpen, Some(B))?;
        self.expect_zeros(z.start + B, 2 * B)?;
        Ok(Status::Passed)
    }

    fn write_behind(&self) -> Check {
        let z = self.seq_zone(0)?;
        let a = pattern(8, 2 * B);
        self.write(z.start, &a)?;
        expect_err(
            self.dev.write_at(&pattern(9, B), z.start + B),
            DRIVE,
            "rewrite a block below the write pointer",
        )?;
        self.expect_zone(z.id, ZoneCondition::ImplicitOpen, Some(2 * B))?;
        self.expect_data(z.start, &a)?;
        Ok(Status::Passed)
    }

    fn read_past_wp(&self) -> Check {
        let z = self.seq_zone(0)?;
        self.expect_zeros(z.start, 4 * B)?;
        let a = pattern(10, B);
        self.write(z.start, &a)?;
        let got = self.read(z.start, 4 * B)?;
        ensure(got[..B as usize] == a[..], || {
            "written block reads back wrong".into()
        })?;
        ensure(got[B as usize..].iter().all(|&b| b == 0), || {
            "blocks past the write pointer do not read as zeros".into()
        })?;
        // The last block of the zone, far past the write pointer.
        self.expect_zeros(z.start + z.len - B, B)?;
        Ok(Status::Passed)
    }

    fn read_crossing(&self) -> Check {
        if self.geo.nr_zones < 2 {
            return Ok(Status::Skipped("one zone only".into()));
        }
        let mut b = vec![0u8; 2 * B as usize];
        expect_err(
            self.dev.read_at(&mut b, self.geo.zone_size - B),
            CROSS,
            "read across the end of zone 0",
        )?;
        Ok(Status::Passed)
    }

    fn write_crossing(&self) -> Check {
        // Conventional: the last block of a zone followed by the next zone.
        if let Some(&c) = self.conv.iter().find(|&&c| c + 1 < self.geo.nr_zones) {
            let end = self.geo.zone_start(c + 1);
            let a = pattern(11, B);
            self.write(end - B, &a)?;
            expect_err(
                self.dev.write_at(&pattern(12, 2 * B), end - B),
                CROSS,
                "write across the end of a conventional zone",
            )?;
            self.expect_data(end - B, &a)?;
        }
        // Sequential: fill to one block below the capacity, then write two.
        let z = self.seq_zone(0)?;
        if z.id + 1 >= self.geo.nr_zones && z.capacity == z.len {
            return Ok(Status::Passed);
        }
        self.fill(z.start, z.capacity - B)?;
        expect_err(
            self.dev
                .write_at(&pattern(13, 2 * B), z.start + z.capacity - B),
            CROSS,
            "write across the end (capacity) of a sequential zone",
        )?;
        self.expect_zone(z.id, ZoneCondition::ImplicitOpen, Some(z.capacity - B))?;
        if z.id + 1 < self.geo.nr_zones {
            let next = self.zone(z.id + 1)?;
            if next.zone_type.is_sequential() {
                ensure(next.wp == next.start, || {
                    "the crossing write moved the next zone's write pointer".into()
                })?;
            }
        }
        Ok(Status::Passed)
    }

    fn fill_zone(&self) -> Check {
        let z = self.seq_zone(0)?;
        self.fill(z.start, z.capacity)?;
        self.expect_zone(z.id, ZoneCondition::Full, None)?;
        if z.capacity < z.len {
            expect_err(
                self.dev.write_at(&pattern(14, B), z.start + z.capacity),
                CROSS,
                "write past the capacity of a full zone",
            )?;
        }
        expect_err(
            self.dev.write_at(&pattern(14, B), z.start),
            DRIVE,
            "write at the start of a full zone",
        )?;
        // `fill` seeds each 4 MiB chunk by its offset: check the last chunk.
        let chunk = (z.capacity - B) / (4 << 20) * (4 << 20);
        self.expect_data(
            z.start + chunk,
            &pattern(z.start + chunk, z.capacity - chunk),
        )?;
        Ok(Status::Passed)
    }

    fn finish(&self) -> Check {
        let z = self.seq_zone(0)?;
        let a = pattern(15, B);
        self.write(z.start, &a)?;
        self.mgmt(ZoneOp::Finish, z.id)?;
        self.expect_zone(z.id, ZoneCondition::Full, None)?;
        self.expect_data(z.start, &a)?;
        self.expect_zeros(z.start + B, 3 * B)?;
        expect_err(
            self.dev.write_at(&pattern(16, B), z.start + B),
            DRIVE,
            "write to a finished zone",
        )?;
        // Finish of an empty zone.
        let z2 = self.seq_zone(1)?;
        self.mgmt(ZoneOp::Finish, z2.id)?;
        self.expect_zone(z2.id, ZoneCondition::Full, None)?;
        self.expect_zeros(z2.start, 2 * B)?;
        Ok(Status::Passed)
    }

    fn reset(&self) -> Check {
        let z = self.seq_zone(0)?;
        self.write(z.start, &pattern(17, 3 * B))?;
        self.mgmt(ZoneOp::Reset, z.id)?;
        self.expect_zone(z.id, ZoneCondition::Empty, Some(0))?;
        self.expect_zeros(z.start, 3 * B)?;
        let a = pattern(18, B);
        self.write(z.start, &a)?;
        self.expect_data(z.start, &a)?;
        // Reset of a full zone.
        self.mgmt(ZoneOp::Finish, z.id)?;
        self.mgmt(ZoneOp::Reset, z.id)?;
        self.expect_zone(z.id, ZoneCondition::Empty, Some(0))?;
        self.expect_zeros(z.start, 2 * B)?;
        Ok(Status::Passed)
    }

    fn open_close(&self) -> Check {
        use ZoneCondition as C;
        let z = self.seq_zone(0)?;
        self.mgmt(ZoneOp::Open, z.id)?;
        self.expect_zone(z.id, C::ExplicitOpen, Some(0))?;
        self.mgmt(ZoneOp::Close, z.id)?;
        self.expect_zone(z.id, C::Empty, Some(0))?;
        self.write(z.start, &pattern(19, B))?;
        self.expect_zone(z.id, C::ImplicitOpen, Some(B))?;
        self.mgmt(ZoneOp::Close, z.id)?;
        self.expect_zone(z.id, C::Closed, Some(B))?;
        self.write(z.start + B, &pattern(20, B))?;
        self.expect_zone(z.id, C::ImplicitOpen, Some(2 * B))?;
        self.mgmt(ZoneOp::Open, z.id)?;
        self.expect_zone(z.id, C::ExplicitOpen, Some(2 * B))?;
        self.write(z.start + 2 * B, &pattern(21, B))?;
        self.expect_zone(z.id, C::ExplicitOpen, Some(3 * B))?;
        self.mgmt(ZoneOp::Close, z.id)?;
        self.expect_zone(z.id, C::Closed, Some(3 * B))?;
        self.mgmt(ZoneOp::Open, z.id)?;
        self.expect_zone(z.id, C::ExplicitOpen, Some(3 * B))?;
        self.mgmt(ZoneOp::Finish, z.id)?;
        self.expect_zone(z.id, C::Full, None)?;
        Ok(Status::Passed)
    }

    /// Skips unless the device has an open limit and enough zones to pass it.
    fn open_limit(&self) -> std::result::Result<u32, Status> {
        let mo = self.geo.max_open_zones;
        if mo == 0 {
            return Err(Status::Skipped("no max-open limit".into()));
        }
        if self.seq.len() < mo as usize + 2 {
            return Err(Status::Skipped("not enough sequential zones".into()));
        }
        let ma = self.geo.max_active_zones;
        if ma != 0 && ma <= mo {
            return Err(Status::Skipped("max-active is not above max-open".into()));
        }
        Ok(mo)
    }

    fn count_open(&self) -> R<(usize, usize)> {
        let zs = ok(self.dev.report_all(), "report zones")?;
        Ok((
            zs.iter()
                .filter(|z| z.cond == ZoneCondition::ImplicitOpen)
                .count(),
            zs.iter()
                .filter(|z| z.cond == ZoneCondition::ExplicitOpen)
                .count(),
        ))
    }

    fn max_open_implicit(&self) -> Check {
        let mo = match self.open_limit() {
            Ok(m) => m,
            Err(s) => return Ok(s),
        };
        for i in 0..mo as usize {
            let z = self.seq_zone(i)?;
            self.write(z.start, &pattern(22, B))?;
        }
        let (imp, _) = self.count_open()?;
        ensure(imp == mo as usize, || {
            format!("{imp} zones implicitly open, expected {mo}")
        })?;
        let extra = self.seq_zone(mo as usize)?;
        self.write(extra.start, &pattern(23, B))?;
        self.expect_zone(extra.id, ZoneCondition::ImplicitOpen, Some(B))?;
        let (imp, exp) = self.count_open()?;
        ensure(imp + exp == mo as usize, || {
            format!(
                "{} zones open after passing the limit, expected {mo}",
                imp + exp
            )
        })?;
        let mut closed = 0;
        for i in 0..mo as usize {
            let z = self.seq_zone(i)?;
            if z.cond == ZoneCondition::Closed {
                ensure(z.wp == z.start + B, || {
                    "implicit close moved a write pointer".into()
                })?;
                closed += 1;
            }
        }
        ensure(closed == 1, || {
            format!("{closed} zones were implicitly closed, expected 1")
        })?;
        Ok(Status::Passed)
    }

    fn max_open_explicit(&self) -> Check {
        let mo = match self.open_limit() {
            Ok(m) => m,
            Err(s) => return Ok(s),
        };
        for i in 0..mo as usize {
            self.mgmt(ZoneOp::Open, self.seq[i])?;
        }
        let extra = self.seq_zone(mo as usize)?;
        expect_err(
            self.dev.zone_mgmt(ZoneOp::Open, extra.id),
            &[libc::ETOOMANYREFS],
            "explicit open beyond max-open",
        )?;
        expect_err(
            self.dev.write_at(&pattern(24, B), extra.start),
            &[libc::ETOOMANYREFS],
            "write to an empty zone with max-open zones explicitly open",
        )?;
        self.expect_zone(extra.id, ZoneCondition::Empty, Some(0))?;
        self.mgmt(ZoneOp::Close, self.seq[0])?;
        self.mgmt(ZoneOp::Open, extra.id)?;
        self.expect_zone(extra.id, ZoneCondition::ExplicitOpen, Some(0))?;
        Ok(Status::Passed)
    }

    fn max_active(&self) -> Check {
        let ma = self.geo.max_active_zones;
        if ma == 0 {
            return Ok(Status::Skipped("no max-active limit".into()));
        }
        if self.seq.len() < ma as usize + 2 {
            return Ok(Status::Skipped("not enough sequential zones".into()));
        }
        for i in 0..ma as usize {
            let z = self.seq_zone(i)?;
            self.write(z.start, &pattern(25, B))?;
            self.mgmt(ZoneOp::Close, z.id)?;
            self.expect_zone(z.id, ZoneCondition::Closed, Some(B))?;
        }
        let extra = self.seq_zone(ma as usize)?;
        expect_err(
            self.dev.write_at(&pattern(26, B), extra.start),
            &[libc::EOVERFLOW],
            "write to an empty zone with max-active zones active",
        )?;
        self.expect_zone(extra.id, ZoneCondition::Empty, Some(0))?;
        expect_err(
            self.dev.zone_mgmt(ZoneOp::Open, extra.id),
            &[libc::EOVERFLOW],
            "explicit open of an empty zone with max-active zones active",
        )?;
        // A closed (active) zone can still be written.
        let first = self.seq_zone(0)?;
        self.write(first.start + B, &pattern(27, B))?;
        // Finishing one frees an active slot.
        self.mgmt(ZoneOp::Finish, first.id)?;
        self.write(extra.start, &pattern(28, B))?;
        self.expect_zone(extra.id, ZoneCondition::ImplicitOpen, Some(B))?;
        // And resetting another frees one too.
        let extra2 = self.seq_zone(ma as usize + 1)?;
        expect_err(
            self.dev.write_at(&pattern(29, B), extra2.start),
            &[libc::EOVERFLOW],
            "write to an empty zone with max-active zones active",
        )?;
        self.mgmt(ZoneOp::Reset, self.seq[1])?;
        self.write(extra2.start, &pattern(30, B))?;
        Ok(Status::Passed)
    }

    fn conventional(&self) -> Check {
        let Some(&c) = self.conv.first() else {
            return Ok(Status::Skipped("no conventional zones".into()));
        };
        let start = self.geo.zone_start(c);
        let a = pattern(31, 2 * B);
        let b = pattern(32, B);
        let d = pattern(33, B);
        self.write(start + 8 * B, &a)?;
        self.write(start + 2 * B, &b)?;
        self.write(start + 9 * B, &d)?;
        self.expect_data(start + 8 * B, &a[..B as usize])?;
        self.expect_data(start + 9 * B, &d)?;
        self.expect_data(start + 2 * B, &b)?;
        let zi = self.zone(c)?;
        ensure(zi.cond == ZoneCondition::NotWp, || {
            format!("conventional zone condition {:?} after writes", zi.cond)
        })?;
        for op in [ZoneOp::Reset, ZoneOp::Open, ZoneOp::Close, ZoneOp::Finish] {
            ensure(self.dev.zone_mgmt(op, c).is_err(), || {
                format!("{op} of a conventional zone succeeded")
            })?;
        }
        self.expect_data(start + 2 * B, &b)?;
        Ok(Status::Passed)
    }

    fn unaligned(&self) -> Check {
        let z = self.seq_zone(0)?;
        let mut b = vec![0u8; 512];
        expect_err(
            self.dev.read_at(&mut b, z.start),
            &[libc::EINVAL],
            "read of 512 bytes",
        )?;
        expect_err(
            self.dev.write_at(&b, z.start),
            &[libc::EINVAL],
            "write of 512 bytes",
        )?;
        let mut b = vec![0u8; B as usize];
        expect_err(
            self.dev.read_at(&mut b, z.start + 512),
            &[libc::EINVAL],
            "read at a 512-byte offset",
        )?;
        self.expect_zone(z.id, ZoneCondition::Empty, Some(0))?;
        Ok(Status::Passed)
    }

    fn out_of_range(&self) -> Check {
        let end = self.geo.capacity();
        let mut b = vec![0u8; B as usize];
        expect_err(
            self.dev.read_at(&mut b, end),
            CROSS,
            "read at the device end",
        )?;
        expect_err(self.dev.write_at(&b, end), CROSS, "write at the device end")?;
        ensure(
            self.dev
                .zone_mgmt(ZoneOp::Reset, self.geo.nr_zones)
                .is_err(),
            || "reset of a zone past the last succeeded".into(),
        )?;
        Ok(Status::Passed)
    }

    fn set_cond(&self, z: u32, cond: ZoneCondition) -> std::result::Result<bool, String> {
        match self.dev.set_zone_condition(z, cond) {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == libc::EOPNOTSUPP => Ok(false),
            Err(e) => Err(format!("set zone {z} {cond:?}: {e}")),
        }
    }

    fn read_only(&self) -> Check {
        let z = self.seq_zone(0)?;
        let a = pattern(34, B);
        self.write(z.start, &a)?;
        if !self.set_cond(z.id, ZoneCondition::ReadOnly)? {
            return Ok(Status::Skipped("zone conditions cannot be set".into()));
        }
        let r = (|| {
            self.expect_zone(z.id, ZoneCondition::ReadOnly, None)?;
            self.expect_data(z.start, &a)?;
            expect_err(
                self.dev.write_at(&pattern(35, B), z.start + B),
                DRIVE,
                "write to a read-only zone",
            )?;
            expect_err(
                self.dev.zone_mgmt(ZoneOp::Reset, z.id),
                DRIVE,
                "reset of a read-only zone",
            )?;
            self.expect_data(z.start, &a)
        })();
        self.set_cond(z.id, ZoneCondition::Empty)?;
        r?;
        self.expect_zone(z.id, ZoneCondition::Empty, Some(0))?;
        Ok(Status::Passed)
    }

    fn offline(&self) -> Check {
        let z = self.seq_zone(0)?;
        self.write(z.start, &pattern(36, B))?;
        if !self.set_cond(z.id, ZoneCondition::Offline)? {
            return Ok(Status::Skipped("zone conditions cannot be set".into()));
        }
        let r = (|| {
            self.expect_zone(z.id, ZoneCondition::Offline, None)?;
            let mut b = vec![0u8; B as usize];
            expect_err(
                self.dev.read_at(&mut b, z.start),
                DRIVE,
                "read from an offline zone",
            )?;
            expect_err(
                self.dev.write_at(&b, z.start + B),
                DRIVE,
                "write to an offline zone",
            )?;
            for op in [ZoneOp::Reset, ZoneOp::Open, ZoneOp::Finish] {
                expect_err(
                    self.dev.zone_mgmt(op, z.id),
                    DRIVE,
                    &format!("{op} of an offline zone"),
                )?;
            }
            // reset-all skips it and still succeeds.
            ok(self.dev.reset_all(), "reset-all with an offline zone")
        })();
        self.set_cond(z.id, ZoneCondition::Empty)?;
        r?;
        Ok(Status::Passed)
    }

    fn flush(&self) -> Check {
        let z = self.seq_zone(0)?;
        self.write(z.start, &pattern(37, B))?;
        ok(self.dev.flush(), "flush")?;
        self.expect_data(z.start, &pattern(37, B))?;
        Ok(Status::Passed)
    }
}
