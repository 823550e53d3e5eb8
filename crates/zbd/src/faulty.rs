//! A fault-injecting wrapper for crash tests: [`FaultyDevice`] wraps any [`ZonedDevice`].
//!
//! - **Errors**: fail the Nth operation of a class ([`FaultyDevice::fail_nth`]) or every
//!   operation matching a predicate ([`FaultyDevice::fail_matching`]) with a chosen errno.
//!   A failed operation does nothing.
//! - **Zone conditions**: [`FaultyDevice::set_condition`] turns a zone read-only or offline
//!   through the wrapped device's [`ZonedDevice::set_zone_condition`]; for a device that
//!   cannot (a real one) the wrapper keeps the condition itself and applies its rules
//!   (reports show it; reads of offline zones, writes and zone operations fail with EIO).
//! - **Power cuts**: every write since the last successful flush is *pending*: it is in the
//!   wrapped device (so reads see it, as they would see a drive's volatile cache) and it is
//!   also recorded here. [`FaultyDevice::power_cut`] drops any chosen subset of the pending
//!   writes; the device then reads exactly as if only the kept writes (plus everything
//!   flushed) had happened. [`FaultyDevice::cut_power_after_writes`] makes the device dead
//!   (every operation fails with EIO) once a given number of writes has completed, so a test
//!   can stop a workload at every write boundary and then choose what survived.
//!
//! What a cut leaves, chosen to match what a drive can show after losing its cache:
//! - A sequential zone's write pointer ends at the end of its highest surviving write (or
//!   at its flushed write pointer when no pending write survived); dropped writes below that
//!   point read as zeros (holes). A zone finished after pending writes stays full.
//! - Zone management (reset, finish) is durable when it completes, as drives do not cache
//!   it: a reset discards the pending writes of its zone.
//! - Conventional zones: each block holds the data of its last surviving write, or what it
//!   held before the first pending write.
//! - After the cut every open zone is closed (power-on), and the device is alive again.
//!
//! Everything is serialised (writes hold a lock while they run), which is fine for tests.

use crate::{Geometry, ReadSource, Result, ZbdError, Zone, ZoneCondition, ZoneOp, ZonedDevice};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};

/// What an operation is, for fault rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    ZoneMgmt(ZoneOp),
    ResetAll,
    Flush,
    Report,
}

/// Classes for [`FaultyDevice::fail_nth`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpClass {
    Read,
    Write,
    /// Zone resets, including `reset_all`.
    Reset,
    /// Open, close and finish.
    Mgmt,
    Flush,
    Report,
    Any,
}

impl OpClass {
    fn matches(self, k: OpKind) -> bool {
        match self {
            OpClass::Any => true,
            OpClass::Read => k == OpKind::Read,
            OpClass::Write => k == OpKind::Write,
            OpClass::Reset => matches!(k, OpKind::ZoneMgmt(ZoneOp::Reset) | OpKind::ResetAll),
            OpClass::Mgmt => matches!(
                k,
                OpKind::ZoneMgmt(ZoneOp::Open | ZoneOp::Close | ZoneOp::Finish)
            ),
            OpClass::Flush => k == OpKind::Flush,
            OpClass::Report => k == OpKind::Report,
        }
    }
}

/// An operation as fault predicates see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    pub kind: OpKind,
    /// Byte offset (reads, writes), zone start (zone ops), 0 otherwise.
    pub offset: u64,
    /// Bytes (reads, writes), 0 otherwise.
    pub len: u64,
    /// The zone concerned (first zone for reports, 0 for flush / reset-all).
    pub zone: u32,
}

type Pred = Box<dyn Fn(&Op) -> bool + Send + Sync>;

enum Rule {
    Nth {
        class: OpClass,
        left: u64,
        errno: i32,
    },
    Matching {
        pred: Pred,
        errno: i32,
    },
}

/// One write since the last flush.
struct Pending {
    zone: u32,
    offset: u64,
    data: Vec<u8>,
    /// Conventional zones: what the range held before this write.
    before: Option<Vec<u8>>,
}

#[derive(Default)]
struct Log {
    pending: Vec<Pending>,
    /// Sequential zones finished after some of their pending writes.
    finished: HashSet<u32>,
    writes: u64,
    die_after: Option<u64>,
    dead: bool,
}

/// See the module docs.
pub struct FaultyDevice<D: ZonedDevice> {
    inner: D,
    sequential: Vec<bool>,
    rules: Mutex<Vec<Rule>>,
    log: Mutex<Log>,
    /// Conditions set here because the wrapped device cannot (read-only / offline).
    overrides: Mutex<HashMap<u32, ZoneCondition>>,
    /// The source handed out ([`FaultyDevice::with_read_source`]); none by default.
    source: Option<ReadSource>,
}

impl<D: ZonedDevice> FaultyDevice<D> {
    /// Wraps `inner`; no faults armed.
    pub fn new(inner: D) -> Result<FaultyDevice<D>> {
        let sequential = inner
            .report_all()?
            .iter()
            .map(|z| z.zone_type.is_sequential())
            .collect();
        Ok(FaultyDevice {
            inner,
            sequential,
            rules: Mutex::new(Vec::new()),
            log: Mutex::new(Log::default()),
            overrides: Mutex::new(HashMap::new()),
            source: None,
        })
    }

    /// Hand out `source` from [`ZonedDevice::read_source`], as an `O_DIRECT` block device
    /// does, for tests of the code that plans I/O through a source: its `fd` need not be
    /// real (the test makes the planned I/O itself, on this wrapper, passing by whatever
    /// wraps it, as a queue thread's ring does). Nothing here reads or writes through it.
    pub fn with_read_source(mut self, source: ReadSource) -> FaultyDevice<D> {
        self.source = Some(source);
        self
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Fails the `n`th (1-based, counted from now) operation of `class` with `errno`, once.
    pub fn fail_nth(&self, class: OpClass, n: u64, errno: i32) {
        self.rules.lock().push(Rule::Nth {
            class,
            left: n.max(1),
            errno,
        });
    }

    /// Fails every operation for which `pred` is true with `errno`, until
    /// [`FaultyDevice::clear_faults`].
    pub fn fail_matching(&self, pred: impl Fn(&Op) -> bool + Send + Sync + 'static, errno: i32) {
        self.rules.lock().push(Rule::Matching {
            pred: Box::new(pred),
            errno,
        });
    }

    /// Removes every armed fault rule.
    pub fn clear_faults(&self) {
        self.rules.lock().clear();
    }

    /// Turns a zone read-only or offline (or back: `Empty` resets a sequential zone,
    /// `NotWp` restores a conventional one); see [`ZonedDevice::set_zone_condition`].
    pub fn set_condition(&self, zone: u32, cond: ZoneCondition) -> Result<()> {
        match self.inner.set_zone_condition(zone, cond) {
            Err(e) if e.errno() == libc::EOPNOTSUPP => {}
            r => {
                self.overrides.lock().remove(&zone);
                return r;
            }
        }
        if zone as usize >= self.sequential.len() {
            return Err(ZbdError::Invalid(format!("zone {zone} does not exist")));
        }
        match cond {
            ZoneCondition::ReadOnly | ZoneCondition::Offline => {
                self.overrides.lock().insert(zone, cond);
                Ok(())
            }
            ZoneCondition::Empty if self.sequential[zone as usize] => {
                self.overrides.lock().remove(&zone);
                self.inner.zone_mgmt(ZoneOp::Reset, zone)
            }
            ZoneCondition::NotWp if !self.sequential[zone as usize] => {
                self.overrides.lock().remove(&zone);
                Ok(())
            }
            _ => Err(ZbdError::Invalid(format!(
                "zone {zone} cannot be set to {cond:?}"
            ))),
        }
    }

    /// The wrapper's own condition for `zone`, if it set one.
    fn overridden(&self, zone: u32) -> Option<ZoneCondition> {
        self.overrides.lock().get(&zone).copied()
    }

    /// EIO when the wrapper's condition for `zone` forbids `kind`.
    fn check_override(&self, zone: u32, kind: OpKind) -> Result<()> {
        let bad = match (self.overridden(zone), kind) {
            (Some(ZoneCondition::Offline), _) => "offline",
            (Some(ZoneCondition::ReadOnly), OpKind::Write | OpKind::ZoneMgmt(_)) => "read-only",
            _ => return Ok(()),
        };
        Err(ZbdError::device(
            format!("{kind:?} on zone {zone}: zone is {bad} (fault injection)"),
            libc::EIO,
        ))
    }

    /// Writes completed through this wrapper since it was created.
    pub fn write_count(&self) -> u64 {
        self.log.lock().writes
    }

    /// Writes since the last successful flush (the ones a power cut may drop).
    pub fn pending_writes(&self) -> usize {
        self.log.lock().pending.len()
    }

    /// Once `n` writes in total have completed, the device dies: every later operation
    /// fails with EIO until [`FaultyDevice::power_cut`]. If `n` writes are already done it
    /// dies now.
    pub fn cut_power_after_writes(&self, n: u64) {
        let mut log = self.log.lock();
        log.die_after = Some(n);
        if log.writes >= n {
            log.dead = true;
        }
    }

    /// True while the device is dead (after [`FaultyDevice::cut_power_after_writes`]).
    pub fn is_dead(&self) -> bool {
        self.log.lock().dead
    }

    /// Simulates losing power: keeps the pending writes whose index (0 = oldest since the
    /// last flush) `keep` accepts, drops the others, closes open zones and revives the
    /// device. See the module docs for what the device shows afterwards.
    pub fn power_cut(&self, keep: impl Fn(usize) -> bool) -> Result<()> {
        let mut log = self.log.lock();
        let pending = std::mem::take(&mut log.pending);
        let finished = std::mem::take(&mut log.finished);
        log.dead = false;
        log.die_after = None;
        // Power-on: open zones are closed.
        self.close_open_zones()?;

        let mut by_zone: BTreeMap<u32, Vec<(usize, &Pending)>> = BTreeMap::new();
        for (i, p) in pending.iter().enumerate() {
            by_zone.entry(p.zone).or_default().push((i, p));
        }
        let zs = self.inner.geometry().zone_size;
        for (&zone, writes) in &by_zone {
            if self.sequential[zone as usize] {
                self.rebuild_seq_zone(zone, writes, &keep, finished.contains(&zone))?;
            } else {
                // Base: each block as before its first pending write; then kept writes.
                let mut blocks: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
                for (_, p) in writes {
                    let before = p.before.as_deref().unwrap_or(&[]);
                    for (j, b) in before.chunks(crate::BLOCK_SIZE as usize).enumerate() {
                        let off = p.offset + j as u64 * crate::BLOCK_SIZE;
                        blocks.entry(off).or_insert_with(|| b.to_vec());
                    }
                }
                for (i, p) in writes {
                    if keep(*i) {
                        for (j, b) in p.data.chunks(crate::BLOCK_SIZE as usize).enumerate() {
                            blocks.insert(p.offset + j as u64 * crate::BLOCK_SIZE, b.to_vec());
                        }
                    }
                }
                for (off, b) in blocks {
                    debug_assert_eq!(off / zs, zone as u64);
                    self.inner.write_at(&b, off)?;
                }
            }
        }
        self.close_open_zones()?;
        Ok(())
    }

    /// [`FaultyDevice::power_cut`] keeping each pending write with probability 1/2, chosen
    /// by `seed` (same seed, same choice).
    pub fn power_cut_random(&self, seed: u64) -> Result<()> {
        let n = self.pending_writes();
        let mut x = seed ^ 0x9e37_79b9_7f4a_7c15;
        let keep: Vec<bool> = (0..n)
            .map(|_| {
                // splitmix64
                x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                (z ^ (z >> 31)) & 1 == 1
            })
            .collect();
        self.power_cut(|i| keep[i])
    }

    fn close_open_zones(&self) -> Result<()> {
        for z in self.inner.report_all()? {
            if z.cond.is_open() {
                self.inner.zone_mgmt(ZoneOp::Close, z.id)?;
            }
        }
        Ok(())
    }

    /// Rewrites a sequential zone: flushed prefix, then kept writes with zeros in the holes.
    fn rebuild_seq_zone(
        &self,
        zone: u32,
        writes: &[(usize, &Pending)],
        keep: &impl Fn(usize) -> bool,
        finished: bool,
    ) -> Result<()> {
        let info = self.inner.report_zones(zone, 1)?[0];
        if matches!(info.cond, ZoneCondition::ReadOnly | ZoneCondition::Offline) {
            return Ok(());
        }
        let durable = writes
            .iter()
            .map(|(_, p)| p.offset)
            .min()
            .unwrap_or(info.start);
        let end = writes
            .iter()
            .filter(|(i, _)| keep(*i))
            .map(|(_, p)| p.offset + p.data.len() as u64)
            .max()
            .unwrap_or(durable);
        let mut image = vec![0u8; (end - info.start) as usize];
        if durable > info.start {
            self.inner
                .read_at(&mut image[..(durable - info.start) as usize], info.start)?;
        }
        for (i, p) in writes {
            if keep(*i) {
                let o = (p.offset - info.start) as usize;
                image[o..o + p.data.len()].copy_from_slice(&p.data);
            }
        }
        self.inner.zone_mgmt(ZoneOp::Reset, zone)?;
        for (j, chunk) in image.chunks(4 << 20).enumerate() {
            self.inner
                .write_at(chunk, info.start + j as u64 * (4 << 20))?;
        }
        if finished {
            self.inner.zone_mgmt(ZoneOp::Finish, zone)?;
        }
        Ok(())
    }

    /// Applies the fault rules (and the dead state) to `op`.
    fn check(&self, op: Op, log: &Log) -> Result<()> {
        if log.dead {
            return Err(ZbdError::device(
                format!("{:?}: device lost power (fault injection)", op.kind),
                libc::EIO,
            ));
        }
        let mut rules = self.rules.lock();
        let mut fail = None;
        rules.retain_mut(|r| match r {
            Rule::Nth { class, left, errno } if fail.is_none() && class.matches(op.kind) => {
                *left -= 1;
                if *left == 0 {
                    fail = Some(*errno);
                    false
                } else {
                    true
                }
            }
            Rule::Matching { pred, errno } if fail.is_none() && pred(&op) => {
                fail = Some(*errno);
                true
            }
            _ => true,
        });
        match fail {
            Some(errno) => Err(ZbdError::device(
                format!("{:?} at {:#x} (injected fault)", op.kind, op.offset),
                errno,
            )),
            None => Ok(()),
        }
    }

    fn zone_of(&self, offset: u64) -> u32 {
        self.inner.geometry().zone_of(offset)
    }

    fn write_inner(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let zone = self.zone_of(offset);
        let mut log = self.log.lock();
        self.check(
            Op {
                kind: OpKind::Write,
                offset,
                len,
                zone,
            },
            &log,
        )?;
        self.check_override(zone, OpKind::Write)?;
        let conv = !self.sequential.get(zone as usize).copied().unwrap_or(true);
        let before = if conv && len > 0 {
            let mut b = vec![0u8; len as usize];
            // A failing read means the write would fail too; let the write report it.
            self.inner.read_at(&mut b, offset).ok().map(|_| b)
        } else {
            None
        };
        self.inner.writev_at(bufs, offset)?;
        log.writes += 1;
        if len > 0 {
            log.pending.push(Pending {
                zone,
                offset,
                data: bufs.concat(),
                before,
            });
        }
        if log.die_after.is_some_and(|n| log.writes >= n) {
            log.dead = true;
        }
        Ok(())
    }
}

impl<D: ZonedDevice> ZonedDevice for FaultyDevice<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn report_zones(&self, first: u32, nr: u32) -> Result<Vec<Zone>> {
        self.check(
            Op {
                kind: OpKind::Report,
                offset: 0,
                len: 0,
                zone: first,
            },
            &self.log.lock(),
        )?;
        let mut zones = self.inner.report_zones(first, nr)?;
        let ov = self.overrides.lock();
        if !ov.is_empty() {
            for z in &mut zones {
                if let Some(&c) = ov.get(&z.id) {
                    z.cond = c;
                }
            }
        }
        Ok(zones)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(
            Op {
                kind: OpKind::Read,
                offset,
                len: buf.len() as u64,
                zone: self.zone_of(offset),
            },
            &self.log.lock(),
        )?;
        self.check_override(self.zone_of(offset), OpKind::Read)?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_inner(&[buf], offset)
    }

    fn writev_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        self.write_inner(bufs, offset)
    }

    fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> Result<()> {
        let mut log = self.log.lock();
        self.check(
            Op {
                kind: OpKind::ZoneMgmt(op),
                offset: self.inner.geometry().zone_start(zone),
                len: 0,
                zone,
            },
            &log,
        )?;
        self.check_override(zone, OpKind::ZoneMgmt(op))?;
        self.inner.zone_mgmt(op, zone)?;
        match op {
            ZoneOp::Reset => {
                log.pending.retain(|p| p.zone != zone);
                log.finished.remove(&zone);
            }
            ZoneOp::Finish if log.pending.iter().any(|p| p.zone == zone) => {
                log.finished.insert(zone);
            }
            _ => {}
        }
        Ok(())
    }

    fn reset_all(&self) -> Result<()> {
        let mut log = self.log.lock();
        self.check(
            Op {
                kind: OpKind::ResetAll,
                offset: 0,
                len: 0,
                zone: 0,
            },
            &log,
        )?;
        let ov = self.overrides.lock().clone();
        if ov.is_empty() {
            self.inner.reset_all()?;
        } else {
            for z in self.inner.report_all()? {
                if z.zone_type.is_sequential()
                    && !ov.contains_key(&z.id)
                    && !matches!(
                        z.cond,
                        ZoneCondition::Empty | ZoneCondition::ReadOnly | ZoneCondition::Offline
                    )
                {
                    self.inner.zone_mgmt(ZoneOp::Reset, z.id)?;
                }
            }
        }
        let seq = &self.sequential;
        log.pending.retain(|p| !seq[p.zone as usize]);
        log.finished.clear();
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let mut log = self.log.lock();
        self.check(
            Op {
                kind: OpKind::Flush,
                offset: 0,
                len: 0,
                zone: 0,
            },
            &log,
        )?;
        self.inner.flush()?;
        log.pending.clear();
        log.finished.clear();
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{} (fault injection)", self.inner.describe())
    }

    fn read_source(&self) -> Option<ReadSource> {
        self.source
    }

    /// The wrapped device's members: a wrapped multi-device volume keeps its shape. (A
    /// member flush is this wrapper's whole flush, the default.)
    fn members(&self) -> Vec<crate::Member> {
        self.inner.members()
    }

    fn set_zone_condition(&self, zone: u32, cond: ZoneCondition) -> Result<()> {
        self.set_condition(zone, cond)
    }
}
