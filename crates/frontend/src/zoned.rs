//! A zoned backend served as a host-managed zoned ublk device (`zonedd expose`): the kernel
//! sees conventional and sequential zones, write pointers, conditions and open/active limits
//! exactly as the backend (an emulated SMR image) keeps them.
//!
//! ublk on 6.12 serves zoned devices only with user copy (`UBLK_F_ZONED` needs
//! `UBLK_F_USER_COPY`): a request's data is not in a buffer the kernel fills, the daemon
//! reads it from (writes) or writes it to (reads, zone reports) `/dev/ublkcN` at the
//! request's position ([`UblkIOCtx::ublk_user_copy_pos`]). Each tag has one bounce buffer.
//!
//! Requests run on the queue thread: the backend's calls are synchronous (an image in the
//! page cache), and the kernel's zone write plugging already issues one write at a time per
//! zone. With a timing model ([`ZonedShared::with_timing`]) a request is submitted to the
//! model when it arrives (a zone append once it has written at the write pointer: then its
//! place is known), handled, and its tag then waits, on an io_uring timeout at the
//! completion time the model gives, before it completes to the kernel: the queue thread
//! sleeps in its ring wait meanwhile and serves the queue's other tags, so every request in
//! flight on every queue (up to the queue depth) reaches the model's command queue. No lock
//! is held while a tag waits (an append takes its zone's lock only to write at the write
//! pointer). Zone append (the kernel sends it when a filesystem
//! asks for it) is a write at the zone's write pointer under the zone's append lock, and its
//! completion carries the sector written ([`BufDesc::ZonedAppendLba`]).
//!
//! Recovery: none. A write the kernel would re-issue to a new daemon may already be in the
//! image (its write pointer moved), and re-issued it would fail; the device goes with its
//! daemon and the image keeps every completed write.

use crate::device::IO_BUF_BYTES;
use libublk::io::{UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, BufDesc, UblkError};
use parking_lot::Mutex;
use serde::Serialize;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use zbd::timing::{HddClock, ReqKind, Ticket};
use zbd::{AlignedBuf, ZoneCondition, ZoneOp, ZoneType, ZonedDevice};

const SECTOR: u64 = 512;

/// Counters of an exposed device, shown by `zonedd status`.
#[derive(Debug, Default)]
pub struct ZonedStats {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    appends: AtomicU64,
    flushes: AtomicU64,
    reports: AtomicU64,
    zone_ops: AtomicU64,
    errors: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct ZonedStatsSnapshot {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub appends: u64,
    pub flushes: u64,
    pub zone_reports: u64,
    pub zone_ops: u64,
    pub errors: u64,
}

impl ZonedStats {
    pub fn snapshot(&self) -> ZonedStatsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ZonedStatsSnapshot {
            reads: g(&self.reads),
            read_bytes: g(&self.read_bytes),
            writes: g(&self.writes),
            write_bytes: g(&self.write_bytes),
            appends: g(&self.appends),
            flushes: g(&self.flushes),
            zone_reports: g(&self.reports),
            zone_ops: g(&self.zone_ops),
            errors: g(&self.errors),
        }
    }
}

/// What every queue thread of an exposed device shares.
pub struct ZonedShared {
    pub dev: Arc<dyn ZonedDevice>,
    pub stats: Arc<ZonedStats>,
    /// One per zone: appends to a zone are serialised (read the write pointer, write there).
    append_locks: Vec<Mutex<()>>,
    /// Zones with a write pointer (what the open and active limits are about).
    nr_sequential: u32,
    /// The drive timing model requests wait for, if any.
    timing: Option<Arc<HddClock>>,
}

impl ZonedShared {
    pub fn new(
        dev: Arc<dyn ZonedDevice>,
        stats: Arc<ZonedStats>,
    ) -> Result<ZonedShared, zbd::ZbdError> {
        let n = dev.geometry().nr_zones as usize;
        let nr_sequential = dev
            .report_all()?
            .iter()
            .filter(|z| z.zone_type.is_sequential())
            .count() as u32;
        Ok(ZonedShared {
            dev,
            stats,
            append_locks: (0..n).map(|_| Mutex::new(())).collect(),
            nr_sequential,
            timing: None,
        })
    }

    /// Requests complete when `clock`'s model says a drive would complete them.
    pub fn with_timing(mut self, clock: Arc<HddClock>) -> ZonedShared {
        self.timing = Some(clock);
        self
    }

    pub fn timing(&self) -> Option<&Arc<HddClock>> {
        self.timing.as_ref()
    }

    /// The open and active limits as the kernel takes them: 0 (none) for a limit that the
    /// sequential zones cannot reach (ublk refuses a limit above the number of zones), and
    /// never more open zones than active ones.
    fn limits(&self) -> (u32, u32) {
        let geo = self.dev.geometry();
        let cap = |l: u32| if l >= self.nr_sequential { 0 } else { l };
        let active = cap(geo.max_active_zones);
        let open = match cap(geo.max_open_zones) {
            o if active != 0 && (o == 0 || o > active) => active,
            o => o,
        };
        (open, active)
    }

    pub fn capacity(&self) -> u64 {
        self.dev.geometry().capacity()
    }
}

/// Device parameters: 4 KiB blocks, volatile cache with FUA, one zone per chunk, the
/// backend's open/active limits, zone append up to one request; rotational under the hdd
/// timing model, as a real SMR drive says (`queue/rotational` = 1: the kernel's scheduler
/// defaults and zonedd's own reclaim parallelism key on it).
pub(crate) fn set_zoned_params(dev: &mut UblkDev, shared: &ZonedShared, depth: u16) {
    let geo = shared.dev.geometry();
    crate::device::basic_params(dev, geo.capacity());
    let p = &mut dev.tgt.params;
    if shared.timing.is_some() {
        p.basic.attrs |= sys::UBLK_ATTR_ROTATIONAL;
    }
    p.basic.chunk_sectors = (geo.zone_size / SECTOR) as u32;
    p.types |= sys::UBLK_PARAM_TYPE_ZONED;
    let (max_open_zones, max_active_zones) = shared.limits();
    p.zoned = sys::ublk_param_zoned {
        max_open_zones,
        max_active_zones,
        max_zone_append_sectors: (geo.zone_size.min(IO_BUF_BYTES as u64) / SECTOR) as u32,
        reserved: [0; 20],
    };
    // Per tag, at most its ublk command and one timing-model timeout are in flight.
    dev.tgt.sq_depth = depth.saturating_mul(2);
    dev.tgt.cq_depth = depth.saturating_mul(4);
}

/// Body of one queue thread of an exposed device. Returns when the queue is down.
pub(crate) fn run_zoned_queue(qid: u16, dev: &UblkDev, shared: Arc<ZonedShared>) {
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => Rc::new(q),
        Err(e) => {
            tracing::error!("queue {qid}: setup failed: {e}");
            return;
        }
    };
    let cdev = dev.tgt.fds[0];
    let buf_len = dev.dev_info.max_io_buf_bytes as usize;
    let exe = Rc::new(smol::LocalExecutor::new());
    let mut tasks = Vec::new();
    for tag in q.tags() {
        let (q, shared) = (q.clone(), shared.clone());
        tasks.push(exe.spawn(async move {
            match tag_loop(&q, tag, cdev, buf_len, &shared).await {
                Err(UblkError::QueueIsDown) | Ok(()) => {}
                Err(e) => tracing::error!("queue {qid} tag {tag}: {e}"),
            }
        }));
    }
    let exe2 = exe.clone();
    smol::block_on(exe.run(async move {
        let run_ops = || while exe2.try_tick() {};
        let done = || tasks.iter().all(|t| t.is_finished());
        // No idle timeout, as in `queue::run_queue`: an idle device makes no wakeups.
        if let Err(e) = libublk::wait_and_handle_io_events(&q, None, run_ops, done).await {
            tracing::error!("queue {qid}: event loop: {e}");
        }
    }));
    tracing::debug!("queue {qid} down");
}

async fn tag_loop(
    q: &UblkQueue<'_>,
    tag: u16,
    cdev: RawFd,
    buf_len: usize,
    shared: &ZonedShared,
) -> Result<(), UblkError> {
    let mut buf = AlignedBuf::new_zeroed(buf_len);
    q.submit_io_prep_cmd(tag, BufDesc::ZonedAppendLba(0), 0, None)
        .await?;
    loop {
        let iod = *q.get_iod(tag);
        let io = Io {
            cdev,
            pos: UblkIOCtx::ublk_user_copy_pos(q.get_qid(), tag, 0),
        };
        // The drive gets a request when it arrives (its service overlaps the copy of its
        // data); a zone append once its place, the write pointer, is known.
        let clock = shared.timing.as_deref();
        let early = clock.and_then(|c| {
            timed_on_arrival(&iod, shared.capacity()).map(|t| c.submit(t.kind, t.offset, t.len))
        });
        let result = handle(shared, &io, &iod, &mut buf);
        if let Some(c) = clock {
            let late = match &result {
                Ok(Done { timed: Some(t), .. }) => Some(c.submit(t.kind, t.offset, t.len)),
                _ => None,
            };
            for ticket in early.into_iter().chain(late) {
                wait_for_model(q, c, ticket).await;
            }
        }
        let (res, lba) = match result {
            Ok(done) => (done.res, done.lba),
            Err(errno) => {
                shared.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    "tag {tag}: op {:#x} sector {} n {}: errno {errno}",
                    iod.op_flags,
                    iod.start_sector,
                    iod.nr_sectors
                );
                (-errno, 0)
            }
        };
        q.submit_io_commit_cmd(tag, BufDesc::ZonedAppendLba(lba), res)
            .await?;
    }
}

/// Waits until the model completes request `t`: an absolute io_uring timeout on the
/// queue's ring at each time the model names (its completion, or the moment its actuator
/// next chooses a request), so the thread serves other tags meanwhile and never spins.
async fn wait_for_model(q: &UblkQueue<'_>, clock: &HddClock, ticket: Ticket) {
    while let Some(at) = clock.poll(ticket) {
        let ts = io_uring::types::Timespec::new()
            .sec(at / 1_000_000_000)
            .nsec((at % 1_000_000_000) as u32);
        // The kernel copies `ts` when it takes the SQE (at the event loop's next submit);
        // `ts` lives in this future until the timeout's completion, so it is valid then.
        let sqe = io_uring::opcode::Timeout::new(&ts)
            .flags(io_uring::types::TimeoutFlags::ABS)
            .build();
        let res = q.ublk_submit_sqe(sqe).await;
        if res != -libc::ETIME && res < 0 {
            // Cancelled (the queue is going down) or refused: complete without the model.
            tracing::debug!("timing wait: io_uring timeout gave {res}");
            return;
        }
    }
}

/// A read, write or flush as the timing model sees it when it arrives (`None` for other
/// operations, and for a request no device would take: the image refuses it).
fn timed_on_arrival(iod: &sys::ublksrv_io_desc, capacity: u64) -> Option<Timed> {
    let (op, offset) = (iod.op_flags & 0xff, iod.start_sector * SECTOR);
    let len = iod.nr_sectors as u64 * SECTOR;
    let kind = match op {
        sys::UBLK_IO_OP_FLUSH => {
            return Some(Timed {
                kind: ReqKind::Flush,
                offset: 0,
                len: 0,
            })
        }
        sys::UBLK_IO_OP_READ => ReqKind::Read,
        sys::UBLK_IO_OP_WRITE if iod.op_flags & sys::UBLK_IO_F_FUA != 0 => ReqKind::WriteFua,
        sys::UBLK_IO_OP_WRITE => ReqKind::Write,
        _ => return None,
    };
    (len > 0 && offset.checked_add(len)? <= capacity).then_some(Timed { kind, offset, len })
}

/// A request as the timing model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timed {
    kind: ReqKind,
    offset: u64,
    len: u64,
}

/// A handled request: its result, the sector an append wrote at, and for an append what
/// the model charges.
struct Done {
    res: i32,
    lba: u64,
    timed: Option<Timed>,
}

impl Done {
    fn untimed(res: i32) -> Done {
        Done {
            res,
            lba: 0,
            timed: None,
        }
    }
    /// A zone append of `len` bytes at byte `offset`, to be timed now that its place is known.
    fn append(len: u64, offset: u64, fua: bool) -> Done {
        let kind = if fua {
            ReqKind::WriteFua
        } else {
            ReqKind::Write
        };
        Done {
            res: len as i32,
            lba: offset / SECTOR,
            timed: Some(Timed { kind, offset, len }),
        }
    }
}

/// Where a request's data is exchanged with the kernel: `/dev/ublkcN` at `pos`.
struct Io {
    cdev: RawFd,
    pos: u64,
}

impl Io {
    /// The request's data (a write's), into `buf`.
    fn fetch(&self, buf: &mut [u8]) -> Result<(), i32> {
        let n = nix::sys::uio::pread(fd(self.cdev), buf, self.pos as i64).map_err(|e| e as i32)?;
        if n == buf.len() {
            Ok(())
        } else {
            Err(libc::EIO)
        }
    }

    /// `buf` to the request (a read's data, a zone report).
    fn deliver(&self, buf: &[u8]) -> Result<(), i32> {
        let n = nix::sys::uio::pwrite(fd(self.cdev), buf, self.pos as i64).map_err(|e| e as i32)?;
        if n == buf.len() {
            Ok(())
        } else {
            Err(libc::EIO)
        }
    }
}

fn fd(raw: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: `raw` is libublk's descriptor of /dev/ublkcN, open for as long as the
    // `UblkDev` that the queue threads borrow, and every queue thread returns before it is
    // dropped: the borrow never outlives the descriptor.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) }
}

/// One request, its data in the image: what to complete it with, or an errno.
fn handle(
    shared: &ZonedShared,
    io: &Io,
    iod: &sys::ublksrv_io_desc,
    buf: &mut [u8],
) -> Result<Done, i32> {
    let op = iod.op_flags & 0xff;
    let fua = iod.op_flags & sys::UBLK_IO_F_FUA != 0;
    let geo = shared.dev.geometry();
    let offset = iod.start_sector * SECTOR;
    let zone_of = |off: u64| -> Result<u32, i32> {
        if off >= geo.capacity() {
            return Err(libc::EINVAL);
        }
        Ok(geo.zone_of(off))
    };
    let dev = &*shared.dev;
    let st = &shared.stats;
    match op {
        sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_OP_ZONE_APPEND => {
            let len = iod.nr_sectors as u64 * SECTOR;
            if len > buf.len() as u64 || offset + len > geo.capacity() {
                return Err(libc::EINVAL);
            }
            let data = &mut buf[..len as usize];
            match op {
                sys::UBLK_IO_OP_READ => {
                    dev.read_at(data, offset).map_err(|e| e.errno())?;
                    io.deliver(data)?;
                    st.reads.fetch_add(1, Ordering::Relaxed);
                    st.read_bytes.fetch_add(len, Ordering::Relaxed);
                    Ok(Done::untimed(len as i32))
                }
                sys::UBLK_IO_OP_WRITE => {
                    io.fetch(data)?;
                    dev.write_at(data, offset).map_err(|e| e.errno())?;
                    if fua {
                        dev.flush().map_err(|e| e.errno())?;
                    }
                    st.writes.fetch_add(1, Ordering::Relaxed);
                    st.write_bytes.fetch_add(len, Ordering::Relaxed);
                    Ok(Done::untimed(len as i32))
                }
                _ => {
                    io.fetch(data)?;
                    let at = append(shared, zone_of(offset)?, data)?;
                    if fua {
                        dev.flush().map_err(|e| e.errno())?;
                    }
                    st.appends.fetch_add(1, Ordering::Relaxed);
                    st.write_bytes.fetch_add(len, Ordering::Relaxed);
                    Ok(Done::append(len, at, fua))
                }
            }
        }
        sys::UBLK_IO_OP_FLUSH => {
            dev.flush().map_err(|e| e.errno())?;
            st.flushes.fetch_add(1, Ordering::Relaxed);
            Ok(Done::untimed(0))
        }
        sys::UBLK_IO_OP_REPORT_ZONES => {
            // For this op the descriptor's nr_sectors holds the number of zones asked for.
            let n = report_zones(dev, zone_of(offset)?, iod.nr_sectors, buf)?;
            io.deliver(&buf[..n])?;
            st.reports.fetch_add(1, Ordering::Relaxed);
            Ok(Done::untimed(n as i32))
        }
        sys::UBLK_IO_OP_ZONE_RESET_ALL => {
            dev.reset_all().map_err(|e| e.errno())?;
            if let Some(clock) = &shared.timing {
                clock.discard(0, geo.capacity());
            }
            st.zone_ops.fetch_add(1, Ordering::Relaxed);
            Ok(Done::untimed(0))
        }
        sys::UBLK_IO_OP_ZONE_RESET
        | sys::UBLK_IO_OP_ZONE_OPEN
        | sys::UBLK_IO_OP_ZONE_CLOSE
        | sys::UBLK_IO_OP_ZONE_FINISH => {
            let zop = match op {
                sys::UBLK_IO_OP_ZONE_RESET => ZoneOp::Reset,
                sys::UBLK_IO_OP_ZONE_OPEN => ZoneOp::Open,
                sys::UBLK_IO_OP_ZONE_CLOSE => ZoneOp::Close,
                _ => ZoneOp::Finish,
            };
            let zone = zone_of(offset)?;
            // A reset or finish moves the write pointer under a waiting append: take its lock.
            let _g = shared.append_locks[zone as usize].lock();
            dev.zone_mgmt(zop, zone).map_err(|e| e.errno())?;
            if let (Some(clock), ZoneOp::Reset) = (&shared.timing, zop) {
                // The zone's data still in the drive's cache need not reach the media.
                clock.discard(geo.zone_start(zone), geo.zone_size);
            }
            st.zone_ops.fetch_add(1, Ordering::Relaxed);
            Ok(Done::untimed(0))
        }
        _ => Err(libc::EOPNOTSUPP),
    }
}

/// Zone append: `data` at `zone`'s write pointer; returns the byte offset written.
fn append(shared: &ZonedShared, zone: u32, data: &[u8]) -> Result<u64, i32> {
    let _g = shared.append_locks[zone as usize].lock();
    let z = shared
        .dev
        .report_zones(zone, 1)
        .map_err(|e| e.errno())?
        .pop()
        .ok_or(libc::EIO)?;
    if !z.zone_type.is_sequential() {
        return Err(libc::EINVAL);
    }
    shared.dev.write_at(data, z.wp).map_err(|e| e.errno())?;
    Ok(z.wp)
}

/// `struct blk_zone` entries for up to `nr` zones from `first` into `buf`; bytes used. The
/// kernel stops at the first entry of length 0, so a short report ends with zeros.
fn report_zones(dev: &dyn ZonedDevice, first: u32, nr: u32, buf: &mut [u8]) -> Result<usize, i32> {
    const ENTRY: usize = std::mem::size_of::<sys::blk_zone>();
    let geo = dev.geometry();
    let fit = (buf.len() / ENTRY) as u32;
    let nr = nr.min(fit).min(geo.nr_zones - first);
    let zones = dev.report_zones(first, nr).map_err(|e| e.errno())?;
    let used = nr as usize * ENTRY;
    buf[..used].fill(0);
    for (i, z) in zones.iter().enumerate() {
        let e = blk_zone(z);
        // SAFETY: `blk_zone` is a plain C struct of integers and byte arrays with no padding
        // (3 x 8 + 4 + 4 + 8 + 24 = 64 bytes): all its bytes are initialised, and the slice is
        // exactly its size, borrowed while `e` lives.
        let bytes =
            unsafe { std::slice::from_raw_parts(&e as *const sys::blk_zone as *const u8, ENTRY) };
        buf[i * ENTRY..(i + 1) * ENTRY].copy_from_slice(bytes);
    }
    Ok(used)
}

/// One zone as the kernel reports it, in 512-byte sectors. A conventional zone's write
/// pointer is its end, as null_blk and SCSI drives report it.
fn blk_zone(z: &zbd::Zone) -> sys::blk_zone {
    let wp = if z.zone_type.is_sequential() {
        z.wp
    } else {
        z.start + z.len
    };
    let type_ = match z.zone_type {
        ZoneType::Conventional => sys::BLK_ZONE_TYPE_CONVENTIONAL,
        ZoneType::SeqWriteRequired => sys::BLK_ZONE_TYPE_SEQWRITE_REQ,
        ZoneType::SeqWritePreferred => sys::BLK_ZONE_TYPE_SEQWRITE_PREF,
    };
    let cond = match z.cond {
        ZoneCondition::NotWp => sys::BLK_ZONE_COND_NOT_WP,
        ZoneCondition::Empty => sys::BLK_ZONE_COND_EMPTY,
        ZoneCondition::ImplicitOpen => sys::BLK_ZONE_COND_IMP_OPEN,
        ZoneCondition::ExplicitOpen => sys::BLK_ZONE_COND_EXP_OPEN,
        ZoneCondition::Closed => sys::BLK_ZONE_COND_CLOSED,
        ZoneCondition::Full => sys::BLK_ZONE_COND_FULL,
        ZoneCondition::ReadOnly => sys::BLK_ZONE_COND_READONLY,
        ZoneCondition::Offline => sys::BLK_ZONE_COND_OFFLINE,
    };
    sys::blk_zone {
        start: z.start / SECTOR,
        len: z.len / SECTOR,
        wp: wp / SECTOR,
        type_: type_ as u8,
        cond: cond as u8,
        capacity: z.capacity / SECTOR,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(dir: &std::path::Path) -> Arc<dyn ZonedDevice> {
        let opts = zbd::EmulateOptions {
            size: 16 << 20,
            zone_size: 1 << 20,
            conventional: 2,
            zone_capacity: 0,
            max_open: 0,
            max_active: 0,
            force: false,
        };
        Arc::new(zbd::Emulated::create(&dir.join("z.img"), &opts).unwrap())
    }

    #[test]
    fn zone_report_entries_match_the_backend() {
        let dir = tempfile::tempdir().unwrap();
        let dev = image(dir.path());
        dev.write_at(&vec![7u8; 8192], 3 << 20).unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let n = report_zones(&*dev, 1, 4, &mut buf).unwrap();
        let entry = std::mem::size_of::<sys::blk_zone>();
        assert_eq!(n, 4 * entry);
        // SAFETY: `buf` holds 4 entries written by `report_zones`; read unaligned copies.
        let e = |i: usize| unsafe {
            std::ptr::read_unaligned(buf[i * entry..].as_ptr() as *const sys::blk_zone)
        };
        let conv = e(0); // zone 1: conventional
        assert_eq!(conv.start, 2048);
        assert_eq!(conv.wp, 4096);
        assert_eq!(conv.type_ as u32, sys::BLK_ZONE_TYPE_CONVENTIONAL);
        assert_eq!(conv.cond as u32, sys::BLK_ZONE_COND_NOT_WP);
        let empty = e(1); // zone 2: sequential, empty
        assert_eq!((empty.start, empty.wp, empty.len), (4096, 4096, 2048));
        assert_eq!(empty.cond as u32, sys::BLK_ZONE_COND_EMPTY);
        let open = e(2); // zone 3: 8 KiB written
        assert_eq!(open.wp, 6144 + 16);
        assert_eq!(open.cond as u32, sys::BLK_ZONE_COND_IMP_OPEN);
        assert_eq!(open.type_ as u32, sys::BLK_ZONE_TYPE_SEQWRITE_REQ);
    }

    #[test]
    fn limits_the_zones_cannot_reach_are_none() {
        let dir = tempfile::tempdir().unwrap();
        // One image per call: a test beside this one that spawns a process can hold a copy of
        // the previous image's fd (and its flock) between fork and exec.
        let limits = |max_open: u32, max_active: u32| {
            let opts = zbd::EmulateOptions {
                size: 16 << 20,
                zone_size: 1 << 20,
                conventional: 2,
                zone_capacity: 0,
                max_open,
                max_active,
                force: true,
            };
            let path = dir.path().join(format!("l-{max_open}-{max_active}.img"));
            let dev = Arc::new(zbd::Emulated::create(&path, &opts).unwrap());
            ZonedShared::new(dev, Arc::default()).unwrap().limits()
        };
        // 14 sequential zones
        assert_eq!(limits(128, 0), (0, 0));
        assert_eq!(limits(14, 0), (0, 0));
        assert_eq!(limits(4, 0), (4, 0));
        assert_eq!(limits(0, 6), (6, 6));
        assert_eq!(limits(3, 6), (3, 6));
    }

    #[test]
    fn requests_reach_the_timing_model_as_the_drive_sees_them() {
        let iod = |op: u32, sector: u64, nr: u32| sys::ublksrv_io_desc {
            op_flags: op,
            nr_sectors: nr,
            start_sector: sector,
            ..Default::default()
        };
        let cap = 16 << 20;
        let t = |d| timed_on_arrival(&d, cap).map(|t| (t.kind, t.offset, t.len));
        assert_eq!(
            t(iod(sys::UBLK_IO_OP_READ, 8, 16)),
            Some((ReqKind::Read, 4096, 8192))
        );
        assert_eq!(
            t(iod(sys::UBLK_IO_OP_WRITE, 0, 8)),
            Some((ReqKind::Write, 0, 4096))
        );
        let fua = sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_F_FUA;
        assert_eq!(t(iod(fua, 0, 8)), Some((ReqKind::WriteFua, 0, 4096)));
        assert_eq!(
            t(iod(sys::UBLK_IO_OP_FLUSH, 0, 0)),
            Some((ReqKind::Flush, 0, 0))
        );
        // Appends are timed once written; zone management and reports cost nothing; a
        // request past the end is refused by the image, not timed.
        assert_eq!(t(iod(sys::UBLK_IO_OP_ZONE_APPEND, 0, 8)), None);
        assert_eq!(t(iod(sys::UBLK_IO_OP_ZONE_RESET, 0, 0)), None);
        assert_eq!(t(iod(sys::UBLK_IO_OP_READ, cap / 512, 8)), None);
        assert_eq!(t(iod(sys::UBLK_IO_OP_READ, 0, 0)), None);
    }

    #[test]
    fn a_report_past_the_last_zone_is_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let dev = image(dir.path());
        let mut buf = vec![0xffu8; 64 * 1024];
        let entry = std::mem::size_of::<sys::blk_zone>();
        assert_eq!(report_zones(&*dev, 14, 8, &mut buf).unwrap(), 2 * entry);
    }

    #[test]
    fn appends_land_at_the_write_pointer_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let shared = ZonedShared::new(image(dir.path()), Arc::default()).unwrap();
        let a = append(&shared, 5, &[1u8; 4096]).unwrap();
        let b = append(&shared, 5, &[2u8; 8192]).unwrap();
        assert_eq!((a, b), (5 << 20, (5 << 20) + 4096));
        let mut back = vec![0u8; 12288];
        shared.dev.read_at(&mut back, 5 << 20).unwrap();
        assert!(back[..4096].iter().all(|&x| x == 1));
        assert!(back[4096..].iter().all(|&x| x == 2));
        // conventional zones take no appends
        assert_eq!(append(&shared, 0, &[0u8; 4096]), Err(libc::EINVAL));
    }
}
