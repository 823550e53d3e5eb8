//! The `hdd` timing model: what a 7200 rpm host-managed SMR drive would take for each request.
//!
//! [`HddModel`] is arithmetic on a virtual clock (nanoseconds, [`Nanos`]): requests are
//! submitted at a time, and the model says when each completes. It never sleeps and reads no
//! clock, so tests drive it with any timeline and assert its figures exactly.
//! [`HddClock`] puts it on the real (monotonic) clock for a device: the caller submits a
//! request once its data is in the image, then waits until the completion time the model
//! gives (in `frontend::zoned`, an io_uring timeout: no thread blocks, nothing spins).
//!
//! # The drive
//!
//! - **One actuator.** Media operations (reads, writes that bypass or leave the cache) run
//!   one at a time. Each costs *positioning* + *transfer*: no positioning when it starts where
//!   the previous one ended (a sequential stream), else the seek for the cylinder distance
//!   plus half a rotation (the expected rotational latency; the model does not track the
//!   platter's angle).
//! - **Seek curve.** 0 within a cylinder; for `d >= 1` cylinders out of `C`,
//!   `t2t + (full - t2t) * ((d - 1) / (C - 1))^p`, where the exponent `p` is chosen so that
//!   the mean over all seek pairs (the "weighted average of all possible seek combinations"
//!   by which data sheets define the average seek) is exactly `avg_seek_ms`:
//!   `E[x^p] = 2 / ((p + 1)(p + 2))` for the distance density `2 (1 - x)`. With the defaults
//!   `p` is about 0.66, a square-root-like curve.
//! - **Transfer** at a rate falling linearly from `outer_mbps` at byte 0 to `inner_mbps` at
//!   the end of the modelled disk (`disk_size`, the image's size unless set), taken at the
//!   request's middle.
//! - **Command queue** of `queue_depth`: among the oldest `queue_depth` waiting media
//!   requests the actuator takes the one with the shortest positioning time (the oldest on a
//!   tie).
//! - **Volatile write cache** of `cache_mib`: a write that fits completes at interface speed
//!   (`iface_mbps`, one transfer at a time on the link) and its data is dirty. When there is
//!   no host request to serve, the actuator destages dirty data (elevator order from the
//!   head, at most `destage_kib` per operation); a write that does not fit waits until
//!   destaging makes room. A read entirely in dirty data is served from the cache. A FUA
//!   write (or any write when `cache_mib` is 0 or smaller than the write) is a media write.
//! - **Flush**: the queue drains (as a non-queued FLUSH CACHE on SATA): every dirty byte is
//!   destaged, then `flush_ms` of drive overhead; writes arriving meanwhile wait for it.
//! - `overhead_us` per command (default 0: data sheets do not give it).

use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Virtual time in nanoseconds.
pub type Nanos = u64;

/// What a request is, as the drive sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqKind {
    Read,
    /// A write the cache may take.
    Write,
    /// A write that must be on the media when it completes.
    WriteFua,
    Flush,
}

/// A request submitted to the model; ask [`HddModel::poll`] about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

/// What [`HddModel::poll`] says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll {
    /// Complete (its ticket is forgotten).
    Done,
    /// Ask again at this time: the completion time if known, else the next moment the
    /// actuator decides what to do.
    At(Nanos),
}

/// The drive's parameters. Defaults and their sources: docs/hdd-model.md.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HddParams {
    pub rpm: f64,
    pub outer_mbps: f64,
    pub inner_mbps: f64,
    pub track_to_track_ms: f64,
    pub avg_seek_ms: f64,
    pub full_stroke_ms: f64,
    pub cylinders: u64,
    /// Bytes of the modelled disk, the image at its start; 0 = the image's size.
    pub disk_size: u64,
    pub queue_depth: u32,
    pub cache_mib: u64,
    pub iface_mbps: f64,
    pub flush_ms: f64,
    pub destage_kib: u64,
    pub overhead_us: f64,
}

impl Default for HddParams {
    fn default() -> Self {
        HddParams {
            rpm: 7200.0,
            outer_mbps: 261.0,
            inner_mbps: 120.0,
            track_to_track_ms: 0.23,
            avg_seek_ms: 7.4,
            full_stroke_ms: 16.0,
            cylinders: 500_000,
            disk_size: 0,
            queue_depth: 32,
            cache_mib: 512,
            iface_mbps: 600.0,
            flush_ms: 1.0,
            destage_kib: 1024,
            overhead_us: 0.0,
        }
    }
}

/// The keys [`HddParams::set`] takes, in the order the docs list them.
pub const PARAM_KEYS: &[&str] = &[
    "rpm",
    "outer_mbps",
    "inner_mbps",
    "track_to_track_ms",
    "avg_seek_ms",
    "full_stroke_ms",
    "cylinders",
    "disk_size",
    "queue_depth",
    "cache_mib",
    "iface_mbps",
    "flush_ms",
    "destage_kib",
    "overhead_us",
];

fn num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("--timing-param {key}={v}: {v:?} is not a number"))
}

impl HddParams {
    /// Applies one `KEY=VALUE` override.
    pub fn set(&mut self, kv: &str) -> Result<(), String> {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(format!("--timing-param takes KEY=VALUE, not {kv:?}"));
        };
        match k {
            "rpm" => self.rpm = num(k, v)?,
            "outer_mbps" => self.outer_mbps = num(k, v)?,
            "inner_mbps" => self.inner_mbps = num(k, v)?,
            "track_to_track_ms" => self.track_to_track_ms = num(k, v)?,
            "avg_seek_ms" => self.avg_seek_ms = num(k, v)?,
            "full_stroke_ms" => self.full_stroke_ms = num(k, v)?,
            "cylinders" => self.cylinders = num(k, v)?,
            "disk_size" => {
                self.disk_size = crate::parse_size(v)
                    .map_err(|_| format!("--timing-param {k}={v}: {v:?} is not a size"))?
            }
            "queue_depth" => self.queue_depth = num(k, v)?,
            "cache_mib" => self.cache_mib = num(k, v)?,
            "iface_mbps" => self.iface_mbps = num(k, v)?,
            "flush_ms" => self.flush_ms = num(k, v)?,
            "destage_kib" => self.destage_kib = num(k, v)?,
            "overhead_us" => self.overhead_us = num(k, v)?,
            _ => {
                return Err(format!(
                    "--timing-param: unknown key {k:?} (keys: {})",
                    PARAM_KEYS.join(", ")
                ))
            }
        }
        Ok(())
    }

    /// Checks that the figures describe a drive.
    pub fn validate(&self) -> Result<(), String> {
        let pos = |x: f64| x.is_finite() && x > 0.0;
        let non_neg = |x: f64| x.is_finite() && x >= 0.0;
        if !pos(self.rpm) || !pos(self.outer_mbps) || !pos(self.inner_mbps) || !pos(self.iface_mbps)
        {
            return Err(
                "--timing-param: rpm, outer_mbps, inner_mbps and iface_mbps must be > 0".into(),
            );
        }
        if self.inner_mbps > self.outer_mbps {
            return Err(format!(
                "--timing-param: inner_mbps {} is above outer_mbps {} (the rate falls inwards)",
                self.inner_mbps, self.outer_mbps
            ));
        }
        let (t, a, f) = (
            self.track_to_track_ms,
            self.avg_seek_ms,
            self.full_stroke_ms,
        );
        if !(pos(t) && t < a && a < f && f.is_finite()) {
            return Err(format!(
                "--timing-param: seek times must be 0 < track_to_track_ms < avg_seek_ms < \
                 full_stroke_ms, not {t} / {a} / {f}"
            ));
        }
        if self.cylinders < 2 || !(1..=256).contains(&self.queue_depth) || self.destage_kib < 4 {
            return Err(
                "--timing-param: cylinders must be >= 2, queue_depth 1 to 256, destage_kib >= 4"
                    .into(),
            );
        }
        if !non_neg(self.flush_ms) || !non_neg(self.overhead_us) {
            return Err("--timing-param: flush_ms and overhead_us must be >= 0".into());
        }
        Ok(())
    }

    /// Half a rotation: the expected rotational latency.
    pub fn half_rotation_ns(&self) -> f64 {
        30e9 / self.rpm
    }

    /// The exponent of the seek curve that makes the mean seek `avg_seek_ms`.
    pub fn seek_exponent(&self) -> f64 {
        let m = (self.avg_seek_ms - self.track_to_track_ms)
            / (self.full_stroke_ms - self.track_to_track_ms);
        (-3.0 + (1.0 + 8.0 / m).sqrt()) / 2.0
    }
}

/// Counters of what the model did (`zonedd status` shows them).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct HddStats {
    pub requests: u64,
    pub media_ops: u64,
    /// Media operations that needed positioning (not a continuation).
    pub seeks: u64,
    /// Media operations taken out of arrival order by the command queue.
    pub reordered: u64,
    pub cache_hits: u64,
    pub cached_writes: u64,
    pub destaged_bytes: u64,
    pub flushes: u64,
    pub seek_ns: u64,
    pub rotation_ns: u64,
    pub transfer_ns: u64,
    /// Virtual time the actuator was busy.
    pub busy_ns: u64,
    /// Requests found complete by [`HddModel::poll`], and by how much time after their
    /// completion time they were found in total and at most: on a device, how late the
    /// waits wake (what the host adds to the model's timing).
    pub polled_done: u64,
    pub lag_ns_total: u64,
    pub lag_ns_max: u64,
}

#[derive(Debug, Clone, Copy)]
struct Req {
    id: u64,
    arrival: Nanos,
    offset: u64,
    len: u64,
    write: bool,
}

/// The drive model on a virtual clock. See the module docs.
#[derive(Debug)]
pub struct HddModel {
    p: HddParams,
    disk: u64,
    exponent: f64,
    head: u64,
    /// When the actuator finishes its current operation.
    free_at: Nanos,
    /// When the interface finishes its current cache transfer.
    link_free: Nanos,
    /// Media requests (reads, media writes) in arrival order.
    queue: VecDeque<Req>,
    /// Writes waiting for cache room or for a flush.
    cache_wait: VecDeque<Req>,
    /// Flushes waiting: (id, arrival).
    flushes: Vec<(u64, Nanos)>,
    /// Dirty cache extents, offset -> length, coalesced.
    dirty: BTreeMap<u64, u64>,
    dirty_bytes: u64,
    done: HashMap<u64, Nanos>,
    next_id: u64,
    stats: HddStats,
}

impl HddModel {
    /// A model of `params` for an image of `image_bytes`.
    pub fn new(params: HddParams, image_bytes: u64) -> Result<HddModel, String> {
        params.validate()?;
        let disk = if params.disk_size == 0 {
            image_bytes
        } else {
            params.disk_size
        };
        if disk < image_bytes || disk == 0 {
            return Err(format!(
                "--timing-param disk_size={} is smaller than the image ({})",
                crate::fmt_size(disk),
                crate::fmt_size(image_bytes)
            ));
        }
        Ok(HddModel {
            exponent: params.seek_exponent(),
            p: params,
            disk,
            head: 0,
            free_at: 0,
            link_free: 0,
            queue: VecDeque::new(),
            cache_wait: VecDeque::new(),
            flushes: Vec::new(),
            dirty: BTreeMap::new(),
            dirty_bytes: 0,
            done: HashMap::new(),
            next_id: 0,
            stats: HddStats::default(),
        })
    }

    pub fn params(&self) -> &HddParams {
        &self.p
    }

    pub fn stats(&self) -> HddStats {
        self.stats
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes
    }

    fn cache_bytes(&self) -> u64 {
        self.p.cache_mib << 20
    }

    /// Submits a request arriving at `now` (never earlier than a previous call's `now`).
    /// For a flush, `offset` and `len` are ignored.
    pub fn submit(&mut self, now: Nanos, kind: ReqKind, offset: u64, len: u64) -> Ticket {
        self.advance(now);
        let id = self.next_id;
        self.next_id += 1;
        self.stats.requests += 1;
        let req = |write| Req {
            id,
            arrival: now,
            offset,
            len,
            write,
        };
        match kind {
            ReqKind::Read if self.covered(offset, len) => {
                self.stats.cache_hits += 1;
                let t = self.link_transfer(now, len);
                self.done.insert(id, t);
            }
            ReqKind::Read => self.queue.push_back(req(false)),
            ReqKind::Write if len > self.cache_bytes() => self.queue.push_back(req(true)),
            ReqKind::Write => {
                let blocked = !self.flushes.is_empty() || !self.cache_wait.is_empty();
                if blocked || self.dirty_bytes + len > self.cache_bytes() {
                    self.cache_wait.push_back(req(true));
                } else {
                    self.admit(req(true), now);
                }
            }
            ReqKind::WriteFua => self.queue.push_back(req(true)),
            ReqKind::Flush => self.flushes.push((id, now)),
        }
        self.advance(now);
        Ticket(id)
    }

    /// Where `t` stands at `now`.
    pub fn poll(&mut self, t: Ticket, now: Nanos) -> Poll {
        self.advance(now);
        match self.done.get(&t.0) {
            Some(&c) if c <= now => {
                self.done.remove(&t.0);
                let st = &mut self.stats;
                st.polled_done += 1;
                st.lag_ns_total += now - c;
                st.lag_ns_max = st.lag_ns_max.max(now - c);
                Poll::Done
            }
            Some(&c) => Poll::At(c),
            // Not dispatched yet: the actuator is busy past `now` (advance made every
            // decision up to `now`), and decides again when it is free.
            None if self.waiting(t.0) => Poll::At(self.free_at.max(now + 1)),
            None => Poll::Done,
        }
    }

    fn waiting(&self, id: u64) -> bool {
        self.queue
            .iter()
            .chain(&self.cache_wait)
            .any(|r| r.id == id)
            || self.flushes.iter().any(|f| f.0 == id)
    }

    /// Zone reset: the range's dirty data need not reach the media.
    pub fn discard(&mut self, offset: u64, len: u64) {
        self.dirty_remove(offset, len);
    }

    /// Makes every decision the actuator takes up to `now`.
    fn advance(&mut self, now: Nanos) {
        while self.free_at <= now {
            match self.next_work(self.free_at) {
                Some(s) if s <= now => self.dispatch(s),
                // Nothing to do before `now` (every arrival is at or before it): idle.
                _ => {
                    self.free_at = now;
                    break;
                }
            }
        }
    }

    /// The earliest moment from `t` at which the actuator has something to do.
    fn next_work(&self, t: Nanos) -> Option<Nanos> {
        let dirty = (!self.dirty.is_empty()).then_some(t);
        let flush = self.flushes.iter().map(|f| f.1.max(t)).min();
        let media = self.queue.iter().map(|r| r.arrival.max(t)).min();
        [dirty, flush, media].into_iter().flatten().min()
    }

    /// The actuator's choice at `s`: a flush's destaging, room for waiting writes, a host
    /// request, idle destaging.
    fn dispatch(&mut self, s: Nanos) {
        if self.flushes.iter().any(|f| f.1 <= s) {
            if self.dirty.is_empty() {
                self.finish_flushes(s);
            } else {
                self.destage(s);
            }
            return;
        }
        if !self.cache_wait.is_empty() && !self.dirty.is_empty() {
            self.destage(s);
            return;
        }
        if let Some(i) = self.pick(s) {
            let r = self.queue.remove(i).expect("picked index");
            if i > 0 && self.queue.iter().take(i).any(|q| q.arrival <= s) {
                self.stats.reordered += 1;
            }
            let end = self.media_op(s, r.offset, r.len);
            if r.write {
                self.dirty_remove(r.offset, r.len);
            }
            self.done.insert(r.id, end);
        } else if !self.dirty.is_empty() {
            self.destage(s);
        }
    }

    /// Shortest positioning first among the oldest `queue_depth` requests arrived by `s`.
    fn pick(&self, s: Nanos) -> Option<usize> {
        let window = self
            .queue
            .iter()
            .enumerate()
            .filter(|(_, r)| r.arrival <= s)
            .take(self.p.queue_depth as usize);
        let cost = |r: &Req| {
            let (seek, rot) = self.positioning(self.head, r.offset);
            seek + rot
        };
        window
            .min_by(|a, b| cost(a.1).total_cmp(&cost(b.1)).then(a.0.cmp(&b.0)))
            .map(|(i, _)| i)
    }

    fn finish_flushes(&mut self, s: Nanos) {
        let end = s + (self.p.flush_ms * 1e6).round() as Nanos;
        let (now_done, later): (Vec<_>, Vec<_>) = self.flushes.drain(..).partition(|f| f.1 <= s);
        self.flushes = later;
        for (id, _) in now_done {
            self.stats.flushes += 1;
            self.done.insert(id, end);
        }
        self.stats.busy_ns += end - s;
        self.free_at = end;
        self.admit_waiting(end);
    }

    /// Writes back up to `destage_kib` of dirty data, the next extent from the head.
    fn destage(&mut self, s: Nanos) {
        let (&start, &len) = self
            .dirty
            .range(self.head..)
            .next()
            .or_else(|| self.dirty.iter().next())
            .expect("dirty data to destage");
        let n = len.min(self.p.destage_kib << 10);
        self.dirty_remove(start, n);
        self.stats.destaged_bytes += n;
        let end = self.media_op(s, start, n);
        self.admit_waiting(end);
    }

    /// One media operation from `s`; returns its end and leaves the head after it.
    fn media_op(&mut self, s: Nanos, offset: u64, len: u64) -> Nanos {
        let (seek, rot) = self.positioning(self.head, offset);
        let xfer = self.transfer_ns(offset, len);
        let cost = (seek + rot + xfer + self.p.overhead_us * 1e3).round() as Nanos;
        let st = &mut self.stats;
        st.media_ops += 1;
        if offset != self.head {
            st.seeks += 1;
        }
        st.seek_ns += seek.round() as u64;
        st.rotation_ns += rot.round() as u64;
        st.transfer_ns += xfer.round() as u64;
        st.busy_ns += cost;
        self.head = offset + len;
        self.free_at = s + cost;
        self.free_at
    }

    /// (seek, rotational latency) in ns from byte `from` to byte `to`.
    pub fn positioning(&self, from: u64, to: u64) -> (f64, f64) {
        if from == to {
            return (0.0, 0.0);
        }
        let d = self.cylinder(from).abs_diff(self.cylinder(to));
        (self.seek_ns(d), self.p.half_rotation_ns())
    }

    fn cylinder(&self, offset: u64) -> u64 {
        let c = offset.min(self.disk - 1) as u128 * self.p.cylinders as u128 / self.disk as u128;
        c as u64
    }

    /// Seek time in ns over `d` cylinders.
    pub fn seek_ns(&self, d: u64) -> f64 {
        if d == 0 {
            return 0.0;
        }
        let x = (d - 1) as f64 / (self.p.cylinders - 1) as f64;
        let (t, f) = (self.p.track_to_track_ms, self.p.full_stroke_ms);
        (t + (f - t) * x.powf(self.exponent)) * 1e6
    }

    /// Media transfer rate at byte `offset`, bytes per second.
    pub fn rate_at(&self, offset: u64) -> f64 {
        let f = offset as f64 / self.disk as f64;
        (self.p.outer_mbps - (self.p.outer_mbps - self.p.inner_mbps) * f) * 1e6
    }

    fn transfer_ns(&self, offset: u64, len: u64) -> f64 {
        len as f64 * 1e9 / self.rate_at(offset + len / 2)
    }

    /// A transfer over the interface (cache to host or host to cache) arriving at `at`.
    fn link_transfer(&mut self, at: Nanos, len: u64) -> Nanos {
        let xfer = len as f64 * 1e9 / (self.p.iface_mbps * 1e6) + self.p.overhead_us * 1e3;
        self.link_free = self.link_free.max(at) + xfer.round() as Nanos;
        self.link_free
    }

    /// A write taken by the cache at `at`.
    fn admit(&mut self, r: Req, at: Nanos) {
        self.stats.cached_writes += 1;
        let t = self.link_transfer(at.max(r.arrival), r.len);
        self.dirty_insert(r.offset, r.len);
        self.done.insert(r.id, t);
    }

    /// Waiting writes that now fit, in order, from `at` (unless a flush holds them).
    fn admit_waiting(&mut self, at: Nanos) {
        if self.flushes.iter().any(|f| f.1 <= at) {
            return;
        }
        while let Some(r) = self.cache_wait.front().copied() {
            if self.dirty_bytes + r.len > self.cache_bytes() {
                break;
            }
            self.cache_wait.pop_front();
            self.admit(r, at);
        }
    }

    fn covered(&self, offset: u64, len: u64) -> bool {
        self.dirty
            .range(..=offset)
            .next_back()
            .is_some_and(|(&s, &l)| s + l >= offset + len)
    }

    fn dirty_insert(&mut self, offset: u64, len: u64) {
        self.dirty_remove(offset, len);
        let (mut start, mut end) = (offset, offset + len);
        if let Some((&s, &l)) = self.dirty.range(..start).next_back() {
            if s + l == start {
                self.dirty.remove(&s);
                start = s;
            }
        }
        if let Some(l) = self.dirty.remove(&end) {
            end += l;
        }
        self.dirty.insert(start, end - start);
        self.dirty_bytes += len;
    }

    fn dirty_remove(&mut self, offset: u64, len: u64) {
        let end = offset + len;
        let first = self
            .dirty
            .range(..offset)
            .next_back()
            .filter(|(&s, &l)| s + l > offset)
            .map(|(&s, _)| s)
            .unwrap_or(offset);
        let hit: Vec<(u64, u64)> = self
            .dirty
            .range(first..end)
            .map(|(&s, &l)| (s, l))
            .collect();
        for (s, l) in hit {
            self.dirty.remove(&s);
            let e = s + l;
            if s < offset {
                self.dirty.insert(s, offset - s);
            }
            if e > end {
                self.dirty.insert(end, e - end);
            }
            self.dirty_bytes -= e.min(end) - s.max(offset);
        }
    }
}

/// Drives `m` like a benchmark with `qd` requests in flight: `n` requests from `gen`, the
/// first at `start`, a new one as soon as one completes. Returns the virtual time the last
/// one completes (what the model predicts for the workload; its tests and
/// `examples/hdd_model.rs` use it).
pub fn closed_loop(
    m: &mut HddModel,
    start: Nanos,
    qd: usize,
    n: usize,
    mut gen: impl FnMut() -> (ReqKind, u64, u64),
) -> Nanos {
    let (mut now, mut issued, mut done) = (start, 0, 0);
    let mut inflight = Vec::new();
    loop {
        while inflight.len() < qd.max(1) && issued < n {
            let (k, off, len) = gen();
            inflight.push(m.submit(now, k, off, len));
            issued += 1;
        }
        let mut wake = Nanos::MAX;
        inflight.retain(|&t| match m.poll(t, now) {
            Poll::Done => {
                done += 1;
                false
            }
            Poll::At(a) => {
                wake = wake.min(a);
                true
            }
        });
        if done == n {
            return now;
        }
        if inflight.len() == qd.max(1) || issued == n {
            now = wake;
        }
    }
}

/// What `zonedd status` shows of a model.
#[derive(Debug, Clone, Serialize)]
pub struct HddReport {
    pub model: &'static str,
    pub params: HddParams,
    pub disk_bytes: u64,
    pub dirty_bytes: u64,
    pub stats: HddStats,
}

/// A model on the monotonic clock, shared by a device's queue threads.
pub struct HddClock {
    model: parking_lot::Mutex<HddModel>,
    /// CLOCK_MONOTONIC at virtual time 0, ns.
    epoch: u64,
}

/// CLOCK_MONOTONIC in ns (what io_uring's absolute timeouts use).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through the pointer, a valid local.
    // CLOCK_MONOTONIC always exists on Linux, so it cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl HddClock {
    pub fn new(model: HddModel) -> HddClock {
        HddClock {
            model: parking_lot::Mutex::new(model),
            epoch: monotonic_ns(),
        }
    }

    /// Submits a request arriving now. The clock is read under the lock, so the model's
    /// times never go backwards.
    pub fn submit(&self, kind: ReqKind, offset: u64, len: u64) -> Ticket {
        let mut m = self.model.lock();
        let now = monotonic_ns().saturating_sub(self.epoch);
        m.submit(now, kind, offset, len)
    }

    /// `None` when `t` is complete, else the CLOCK_MONOTONIC time (ns) to ask again at.
    pub fn poll(&self, t: Ticket) -> Option<u64> {
        let mut m = self.model.lock();
        let now = monotonic_ns().saturating_sub(self.epoch);
        match m.poll(t, now) {
            Poll::Done => None,
            Poll::At(at) => Some(self.epoch + at),
        }
    }

    /// Waits for `t` on this thread (sleeping, for callers without an event loop).
    pub fn wait_blocking(&self, t: Ticket) {
        while let Some(at) = self.poll(t) {
            let now = monotonic_ns();
            std::thread::sleep(std::time::Duration::from_nanos(at.saturating_sub(now)));
        }
    }

    pub fn discard(&self, offset: u64, len: u64) {
        self.model.lock().discard(offset, len);
    }

    pub fn report(&self) -> HddReport {
        let m = self.model.lock();
        HddReport {
            model: "hdd",
            params: m.p.clone(),
            disk_bytes: m.disk,
            dirty_bytes: m.dirty_bytes,
            stats: m.stats,
        }
    }
}

#[cfg(test)]
mod tests;
