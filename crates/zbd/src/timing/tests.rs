//! The model's figures on the virtual clock: exact arithmetic, no wall time.

use super::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn model(disk: u64, tweak: &[&str]) -> HddModel {
    let mut p = HddParams::default();
    for kv in tweak {
        p.set(kv).unwrap();
    }
    HddModel::new(p, disk).unwrap()
}

/// A seeded xorshift: the same "random" offsets every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn block(&mut self, disk: u64, len: u64) -> u64 {
        self.next() % (disk / len) * len
    }
}

/// Completion time of one request submitted at `at` on its own.
fn one(m: &mut HddModel, at: Nanos, kind: ReqKind, off: u64, len: u64) -> Nanos {
    let t = m.submit(at, kind, off, len);
    let mut now = at;
    while let Poll::At(a) = m.poll(t, now) {
        now = a;
    }
    now
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a / b - 1.0).abs() <= tol
}

#[test]
fn the_seek_curve_meets_the_data_sheet_figures() {
    let m = model(100 * GIB, &[]);
    let p = m.params().clone();
    assert_eq!(m.seek_ns(0), 0.0);
    assert!(close(m.seek_ns(1), p.track_to_track_ms * 1e6, 1e-9));
    assert!(close(m.seek_ns(p.cylinders), p.full_stroke_ms * 1e6, 1e-4));
    // The data sheets' average: over all pairs, distance n weighted by (max + 1 - n).
    let c = p.cylinders;
    let (mut sum, mut w) = (0.0, 0.0);
    for d in (1..c).step_by(7) {
        let weight = (c - d) as f64;
        sum += weight * m.seek_ns(d);
        w += weight;
    }
    assert!(
        close(sum / w, p.avg_seek_ms * 1e6, 2e-3),
        "mean seek {}",
        sum / w / 1e6
    );
    // Monotone.
    assert!(m.seek_ns(1000) < m.seek_ns(100_000) && m.seek_ns(100_000) < m.seek_ns(400_000));
}

#[test]
fn sequential_reads_run_at_the_media_rate_of_their_position() {
    for start in [0, 50 * GIB, 99 * GIB] {
        let mut m = model(100 * GIB, &[]);
        let first = one(&mut m, 0, ReqKind::Read, start, MIB);
        let mut off = start + MIB;
        let end = closed_loop(&mut m, first, 1, 256, || {
            off += MIB;
            (ReqKind::Read, off - MIB, MIB)
        });
        let mbps = (256 * MIB) as f64 / ((end - first) as f64 / 1e9);
        let rate = m.rate_at(start + 129 * MIB);
        assert!(close(mbps, rate, 1e-3), "at {start}: {mbps} vs {rate}");
        assert_eq!(
            m.stats().seeks,
            (start > 0) as u64,
            "only the first read positions"
        );
    }
    // The rate falls linearly from outer to inner.
    let m = model(100 * GIB, &[]);
    assert!(close(m.rate_at(0), 261e6, 1e-9));
    assert!(close(m.rate_at(50 * GIB), (261e6 + 120e6) / 2.0, 1e-9));
}

#[test]
fn sequential_writes_run_at_cache_speed_then_at_the_media_rate() {
    let mut m = model(100 * GIB, &[]);
    let mut off = 0;
    let mut gen = || {
        off += MIB;
        (ReqKind::Write, off - MIB, MIB)
    };
    // The first 256 MiB fit in the 512 MiB cache: interface speed.
    let t1 = closed_loop(&mut m, 0, 1, 256, &mut gen);
    let mbps = (256 * MIB) as f64 / (t1 as f64 / 1e9);
    assert!(close(mbps, 600e6, 1e-3), "cached: {mbps}");
    // Far past the cache size the writes wait for destaging: the media rate.
    let t2 = closed_loop(&mut m, t1, 1, 1024, &mut gen);
    let t3 = closed_loop(&mut m, t2, 1, 1024, &mut gen);
    let mbps = (1024 * MIB) as f64 / ((t3 - t2) as f64 / 1e9);
    let rate = m.rate_at(2 * GIB);
    assert!(close(mbps, rate, 5e-3), "past the cache: {mbps} vs {rate}");
    assert!(m.dirty_bytes() <= 512 * MIB);
}

#[test]
fn qd1_random_reads_pay_a_seek_and_half_a_rotation() {
    let disk = 100 * GIB;
    let mut m = model(disk, &[]);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let n = 20_000;
    let end = closed_loop(&mut m, 0, 1, n, || {
        (ReqKind::Read, rng.block(disk, 4096), 4096)
    });
    let iops = n as f64 / (end as f64 / 1e9);
    let p = m.params();
    let xfer = 4096.0 / ((p.outer_mbps + p.inner_mbps) / 2.0 * 1e6);
    let expect = 1.0 / (p.avg_seek_ms / 1e3 + p.half_rotation_ns() / 1e9 + xfer);
    assert!(close(iops, expect, 0.01), "{iops} IOPS vs {expect}");
    assert_eq!(m.stats().reordered, 0);
}

#[test]
fn qd32_reordering_beats_qd1() {
    let disk = 100 * GIB;
    let iops = |qd: usize, depth: &str| {
        let mut m = model(disk, &[depth]);
        let mut rng = Rng(42);
        let n = 5_000;
        let end = closed_loop(&mut m, 0, qd, n, || {
            (ReqKind::Read, rng.block(disk, 4096), 4096)
        });
        (n as f64 / (end as f64 / 1e9), m.stats().reordered)
    };
    let (qd1, _) = iops(1, "queue_depth=32");
    let (qd32, reordered) = iops(32, "queue_depth=32");
    let (fifo, none) = iops(32, "queue_depth=1");
    assert!(qd32 > 1.5 * qd1, "QD32 {qd32} vs QD1 {qd1}");
    assert!(reordered > 1000);
    // A drive queue of 1 serves in arrival order: QD32 from the host gains nothing.
    assert!(close(fifo, qd1, 0.03), "{fifo} vs {qd1}");
    assert_eq!(none, 0);
}

#[test]
fn a_flush_costs_the_destaging_of_the_dirty_data_plus_its_overhead() {
    let mut m = model(100 * GIB, &[]);
    // A clean cache: only the drive's overhead.
    assert_eq!(one(&mut m, 0, ReqKind::Flush, 0, 0), 1_000_000);
    // 16 MiB written at one instant (all in the cache), then a flush at the same instant.
    let at = 10_000_000;
    let writes: Vec<Ticket> = (0..16)
        .map(|i| m.submit(at, ReqKind::Write, GIB + i * MIB, MIB))
        .collect();
    let f = m.submit(at, ReqKind::Flush, 0, 0);
    let mut now = at;
    while let Poll::At(a) = m.poll(f, now) {
        now = a;
    }
    let (seek, rot) = m.positioning(0, GIB);
    let xfer: f64 = (0..16)
        .map(|i| MIB as f64 * 1e9 / m.rate_at(GIB + i * MIB + MIB / 2))
        .sum();
    let expect = at as f64 + seek + rot + xfer + 1e6;
    assert!((now as f64 - expect).abs() < 100.0, "{now} vs {expect}");
    assert_eq!(m.dirty_bytes(), 0);
    for w in writes {
        assert_eq!(m.poll(w, now), Poll::Done);
    }
}

#[test]
fn fua_writes_pay_the_media_write_and_cached_writes_do_not() {
    let mut m = model(100 * GIB, &[]);
    let off = 40 * GIB;
    let cached = one(&mut m, 0, ReqKind::Write, off, 4096);
    assert_eq!(cached, (4096.0f64 * 1e9 / 600e6).round() as Nanos);
    // Let the idle drive destage it, then a FUA write elsewhere.
    let at = 100_000_000;
    let head = off + 4096;
    let fua = one(&mut m, at, ReqKind::WriteFua, 70 * GIB, 4096) - at;
    let (seek, rot) = m.positioning(head, 70 * GIB);
    let xfer = 4096.0 * 1e9 / m.rate_at(70 * GIB + 2048);
    assert!((fua as f64 - (seek + rot + xfer)).abs() < 2.0, "{fua}");
    assert!(fua > 10 * cached);
}

#[test]
fn reads_of_dirty_data_come_from_the_cache_and_a_full_cache_makes_writes_wait() {
    let mut m = model(100 * GIB, &["cache_mib=4"]);
    // Four 1 MiB writes at one instant fill the cache; the fifth waits for destaging.
    let ts: Vec<Nanos> = (0..5)
        .map(|i| {
            let t = m.submit(0, ReqKind::Write, GIB + i * MIB, MIB);
            match m.poll(t, 0) {
                Poll::At(a) => a,
                Poll::Done => 0,
            }
        })
        .collect();
    let link = (MIB as f64 * 1e9 / 600e6).round() as Nanos;
    assert_eq!(&ts[..4], &[link, 2 * link, 3 * link, 4 * link]);
    assert!(ts[4] > 4 * link, "the fifth write did not wait: {ts:?}");
    // Still dirty at 0: a read of it is a cache hit at interface speed.
    let hit = one(&mut m, 0, ReqKind::Read, GIB + 3 * MIB, 4096);
    assert_eq!(m.stats().cache_hits, 1);
    assert!(hit < 10 * link);
    // A zone reset drops dirty data: nothing left to destage there.
    m.discard(GIB, 64 * MIB);
    assert_eq!(m.dirty_bytes(), 0);
}

#[test]
fn write_through_when_the_cache_is_off() {
    let mut m = model(100 * GIB, &["cache_mib=0"]);
    let t = one(&mut m, 0, ReqKind::Write, 0, MIB);
    assert_eq!(t, (MIB as f64 * 1e9 / m.rate_at(MIB / 2)).round() as Nanos);
    assert_eq!(m.stats().cached_writes, 0);
}

#[test]
fn parameters_parse_and_impossible_drives_are_refused() {
    let mut p = HddParams::default();
    p.set("rpm=5400").unwrap();
    p.set("disk_size=20T").unwrap();
    assert_eq!((p.rpm, p.disk_size), (5400.0, 20 << 40));
    assert!(p
        .set("bogus=1")
        .unwrap_err()
        .contains("unknown key \"bogus\""));
    assert!(p.set("rpm=fast").unwrap_err().contains("not a number"));
    assert!(p.set("rpm").unwrap_err().contains("KEY=VALUE"));
    let bad = |kv: &str| {
        let mut p = HddParams::default();
        p.set(kv).unwrap();
        p.validate().unwrap_err()
    };
    assert!(bad("avg_seek_ms=20").contains("track_to_track_ms < avg_seek_ms < full_stroke_ms"));
    assert!(bad("inner_mbps=300").contains("above outer_mbps"));
    assert!(bad("rpm=0").contains("must be > 0"));
    assert!(bad("queue_depth=0").contains("queue_depth 1 to 256"));
    let mut p = HddParams::default();
    p.set("disk_size=1G").unwrap();
    assert!(HddModel::new(p, 2 * GIB)
        .unwrap_err()
        .contains("smaller than the image"));
}
