//! Stream pipelines on the log layout (`LogOptions::stream_pipelines`, docs/design.md
//! "Planned writes"): a thread's planned writes that continue a stream go behind one another
//! at the stream's frontier, several in flight together; they complete in any order while
//! the device learns of them in write-pointer order; a plan dropped unrecorded breaks the
//! pipeline, which gives the frontier its room back when it ends; no other thread and no
//! other write joins it.

mod common;

use std::sync::Arc;

use common::lsl::*;
use common::*;
use dmz::lsl::{LogEngine, LogOptions, LogWritePlan};
use parking_lot::Mutex;
use zbd::{Geometry, MemDevice, Result as ZResult, ZbdError, Zone, ZoneOp, ZoneType, ZonedDevice};

const ZONE_KIB: u64 = 256;
const ZONE_BYTES: u64 = ZONE_KIB * 1024;

/// A zoned device whose sequential zones are also written behind its back (as a queue
/// ring writes a block device's fd, `ReadSource::seq_writes`): such writes must be told to
/// it in write-pointer order with `source_written`, as `zbd::BlockDevice` requires.
struct SourceDev {
    inner: Arc<MemDevice>,
    /// Per zone, the write pointer it knows (bytes into the zone); `None`: conventional.
    known: Mutex<Vec<Option<u64>>>,
}

impl SourceDev {
    fn new(inner: Arc<MemDevice>) -> SourceDev {
        let known = inner
            .report_all()
            .unwrap()
            .iter()
            .map(|z| (z.zone_type != ZoneType::Conventional).then_some(z.wp - z.start))
            .collect();
        SourceDev {
            inner,
            known: Mutex::new(known),
        }
    }

    fn set(&self, zone: u32, to: impl FnOnce(u64) -> u64) {
        if let Some(k) = &mut self.known.lock()[zone as usize] {
            *k = to(*k);
        }
    }
}

impl ZonedDevice for SourceDev {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn report_zones(&self, first: u32, nr: u32) -> ZResult<Vec<Zone>> {
        self.inner.report_zones(first, nr)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> ZResult<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> ZResult<()> {
        self.inner.write_at(buf, offset)?;
        let z = (offset / ZONE_BYTES) as u32;
        self.set(z, |_| offset % ZONE_BYTES + buf.len() as u64);
        Ok(())
    }
    fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> ZResult<()> {
        self.inner.zone_mgmt(op, zone)?;
        match op {
            ZoneOp::Reset => self.set(zone, |_| 0),
            ZoneOp::Finish => self.set(zone, |_| ZONE_BYTES),
            ZoneOp::Open | ZoneOp::Close => {}
        }
        Ok(())
    }
    fn reset_all(&self) -> ZResult<()> {
        self.inner.reset_all()?;
        for k in self.known.lock().iter_mut().flatten() {
            *k = 0;
        }
        Ok(())
    }
    fn flush(&self) -> ZResult<()> {
        self.inner.flush()
    }
    fn describe(&self) -> String {
        "memory device written behind its back".into()
    }
    fn source_written(&self, offset: u64, len: u64) -> ZResult<()> {
        let z = (offset / ZONE_BYTES) as usize;
        let rel = offset % ZONE_BYTES;
        let mut known = self.known.lock();
        match known[z] {
            Some(k) if k == rel => {
                known[z] = Some(rel + len);
                Ok(())
            }
            k => Err(ZbdError::Invalid(format!(
                "a write at {offset:#x} told out of order (zone {z} known at {k:?})"
            ))),
        }
    }
}

/// A volume of 40 zones of 256 KiB on a [`SourceDev`], with stream pipelines as `opts`
/// say, and the memory device under it (which takes the "ring's" writes, and a crash).
fn volume(opts: LogOptions) -> (Arc<LogEngine>, Arc<MemDevice>) {
    let dev = formatted_lsl(ZONE_KIB, 40, 4, 64);
    let src = Arc::new(SourceDev::new(dev.clone()));
    (Arc::new(LogEngine::open(src, opts).unwrap()), dev)
}

/// A plan of `pattern(id, start)` over blocks `start..start + n`, and its data.
fn plan(e: &Arc<LogEngine>, start: u64, n: u64, id: u64) -> Option<(LogWritePlan, Vec<u8>)> {
    let mut buf = vec![0u8; n as usize * BS];
    pattern(id, start, &mut buf);
    let p = e.plan_write(start * BS as u64, &buf)?;
    Some((p, buf))
}

/// The plan's data written behind the device's back, at its place (as the queue ring
/// writes it).
fn write_data(dev: &MemDevice, (p, buf): &(LogWritePlan, Vec<u8>)) {
    dev.write_at(buf, p.device_offset()).unwrap();
}

/// Complete and sync the plan; the error of either.
fn complete(e: &LogEngine, (p, buf): (LogWritePlan, Vec<u8>)) -> Result<(), String> {
    let seq = p.complete(&buf).map_err(|err| err.to_string())?;
    e.sync(seq).map_err(|err| err.to_string())
}

fn zone_of(p: &(LogWritePlan, Vec<u8>)) -> u64 {
    p.0.device_offset() / ZONE_BYTES
}

/// A stream's plans queue behind one another in logical order at its frontier, while a
/// random write takes another frontier; completed last first, each is told to the device in
/// write-pointer order, and all read back, before and after a crash.
#[test]
fn a_stream_s_plans_queue_at_its_frontier_and_complete_in_any_order() {
    let (e, dev) = volume(lsl_test_opts());
    lwrite(&e, 0, 8, 1, false);
    let a = plan(&e, 8, 8, 2).expect("a plan");
    // A write through the engine meanwhile opens a second frontier.
    lwrite(&e, 200, 1, 3, false);
    let b = plan(&e, 16, 8, 4).expect("a plan behind the first");
    let c = plan(&e, 24, 4, 5).expect("a plan behind the second");
    let r = plan(&e, 300, 1, 6).expect("a plan for a random write");
    let bs = BS as u64;
    assert_eq!(b.0.device_offset(), a.0.device_offset() + 8 * bs);
    assert_eq!(c.0.device_offset(), b.0.device_offset() + 8 * bs);
    assert_ne!(zone_of(&r), zone_of(&a), "a random write joined the stream");
    assert_eq!(e.stats().planned_pipelined, 2);
    let stream_zone = zone_of(&a);
    for p in [&a, &b, &c, &r] {
        write_data(&dev, p);
    }
    // The last first: it tells the device of the whole run from the first plan's place.
    complete(&e, c).expect("the last plan, completed first");
    complete(&e, r).unwrap();
    complete(&e, a).unwrap();
    complete(&e, b).unwrap();
    let mut m = LModel::new(&e);
    m.ids[0..8].fill(1);
    m.ids[8..16].fill(2);
    m.ids[200] = 3;
    m.ids[16..24].fill(4);
    m.ids[24..28].fill(5);
    m.ids[300] = 6;
    m.verify(&e);
    e.debug_check().unwrap();
    // The stream goes on at the same frontier once the pipeline is gone.
    let d = plan(&e, 28, 4, 7).expect("a plan");
    assert_eq!(zone_of(&d), stream_zone);
    drop(d);
    drop(e);
    m.verify(&lopen(dev));
}

/// A plan dropped unrecorded breaks its pipeline: the stream's next write goes elsewhere,
/// and when the pipeline's last plan is gone the frontier's room comes back from the hole,
/// where the stream's next plan then goes.
#[test]
fn a_broken_pipeline_takes_no_plan_and_gives_its_room_back() {
    let (e, dev) = volume(lsl_test_opts());
    lwrite(&e, 0, 8, 1, false);
    let a = plan(&e, 8, 8, 2).expect("a plan");
    lwrite(&e, 200, 1, 3, false);
    let b = plan(&e, 16, 8, 4).expect("a plan behind the first");
    let hole = a.0.device_offset();
    // The first is dropped unwritten: the second's write fails at the device then.
    drop(a);
    let c = plan(&e, 24, 8, 5).expect("a plan elsewhere");
    assert_ne!(
        zone_of(&c),
        hole / ZONE_BYTES,
        "a broken pipeline took a plan"
    );
    drop(c);
    drop(b);
    let again = plan(&e, 8, 8, 6).expect("a plan");
    assert_eq!(again.0.device_offset(), hole, "the room did not come back");
    write_data(&dev, &again);
    complete(&e, again).unwrap();
    let mut m = LModel::new(&e);
    m.ids[0..8].fill(1);
    m.ids[200] = 3;
    m.ids[8..16].fill(6);
    m.verify(&e);
    e.debug_check().unwrap();
    drop(e);
    m.verify(&lopen(dev));
}

/// Only the thread that started a pipeline adds to it (its ring submits their data in
/// order), and without `stream_pipelines` no plan waits behind another.
#[test]
fn no_other_thread_and_no_volume_without_the_option_joins_a_pipeline() {
    for on in [true, false] {
        let opts = LogOptions {
            stream_pipelines: on,
            ..lsl_test_opts()
        };
        let (e, _dev) = volume(opts);
        lwrite(&e, 0, 8, 1, false);
        let a = plan(&e, 8, 8, 2).expect("a plan");
        lwrite(&e, 200, 1, 3, false);
        let other = {
            let e = e.clone();
            std::thread::spawn(move || plan(&e, 16, 8, 4).map(|p| zone_of(&p)))
                .join()
                .unwrap()
        };
        assert_ne!(
            other,
            Some(zone_of(&a)),
            "another thread joined (option {on})"
        );
        let mine = plan(&e, 16, 8, 4).map(|p| zone_of(&p));
        assert_eq!(mine == Some(zone_of(&a)), on, "option {on}");
        assert_eq!(e.stats().planned_pipelined, on as u64);
    }
}

/// A write through the engine waiting for the turn a stream's pipeline holds gets it: the
/// pipeline takes no more plans meanwhile, so it ends (a stream would otherwise hold the
/// turn until its zone is full).
#[test]
fn a_pipeline_takes_no_plan_while_a_write_waits_for_its_turn() {
    let (e, dev) = volume(lsl_test_opts());
    lwrite(&e, 0, 8, 1, false);
    let a = plan(&e, 8, 8, 2).expect("a plan");
    // Every other frontier opened and its turn held by a plan of its own.
    let mut held = Vec::new();
    for (i, start) in [200u64, 300, 400].into_iter().enumerate() {
        lwrite(&e, start, 1, 3 + i as u64, false);
        held.push(plan(&e, start + 1, 1, 6 + i as u64).expect("a plan"));
    }
    let zones: Vec<u64> = held.iter().map(zone_of).collect();
    assert!(!zones.contains(&zone_of(&a)) && zones.windows(2).all(|w| w[0] != w[1]));
    let waiter = {
        let e = e.clone();
        std::thread::spawn(move || lwrite(&e, 500, 1, 9, false))
    };
    while e.stats().turn_waits == 0 {
        std::thread::yield_now();
    }
    // The waiter waits for the first frontier's turn (the rotation starts there).
    let b = plan(&e, 16, 8, 10);
    assert!(b.is_none(), "the pipeline took a plan while a write waited");
    for p in [&a].into_iter().chain(&held) {
        write_data(&dev, p);
    }
    complete(&e, a).unwrap();
    waiter.join().unwrap();
    for p in held {
        complete(&e, p).unwrap();
    }
    let mut m = LModel::new(&e);
    m.ids[0..8].fill(1);
    m.ids[8..16].fill(2);
    for (i, start) in [200usize, 300, 400].into_iter().enumerate() {
        m.ids[start] = 3 + i as u64;
        m.ids[start + 1] = 6 + i as u64;
    }
    m.ids[500] = 9;
    m.verify(&e);
    e.debug_check().unwrap();
}

/// A crash after a pipeline's last plan was recorded and synced while the plans before it
/// never were (their data on the device, their records never appended): the recorded plan
/// reads back, and the others read as they were before, both live and after the crash.
#[test]
fn a_later_plan_recorded_before_the_earlier_ones_survives_a_crash_alone() {
    let (e, dev) = volume(lsl_test_opts());
    lwrite(&e, 0, 8, 1, false);
    lwrite(&e, 8, 16, 2, false);
    let a = plan(&e, 24, 8, 3).expect("a plan");
    let b = plan(&e, 32, 8, 4).expect("a plan behind it");
    let b_end = b.0.device_offset() + 8 * BS as u64;
    for p in [&a, &b] {
        write_data(&dev, p);
    }
    complete(&e, b).unwrap();
    // The first plan is dropped after its data was written: a hole the pipeline keeps
    // (a plan past it is recorded), mapping nothing.
    drop(a);
    let mut m = LModel::new(&e);
    m.ids[0..8].fill(1);
    m.ids[8..24].fill(2);
    m.ids[32..40].fill(4);
    m.verify(&e);
    e.debug_check().unwrap();
    // The stream goes on after the recorded plan, in the same zone.
    let d = plan(&e, 40, 8, 6).expect("a plan");
    assert_eq!(d.0.device_offset(), b_end);
    drop(d);
    drop(e);
    let e = lopen(dev);
    m.verify(&e);
    e.debug_check().unwrap();
}
