//! Real zoned block devices: host-managed SMR (`/dev/sdX`), null_blk (`/dev/nullbN`), NVMe
//! ZNS (`/dev/nvmeXnY`), scsi_debug.
//!
//! - **Zones** through the kernel's zone ioctls (`BLKREPORTZONE`, `BLKRESETZONE`,
//!   `BLKOPENZONE`, `BLKCLOSEZONE`, `BLKFINISHZONE`, `BLKGETZONESZ`, `BLKGETNRZONES`), with
//!   the uapi structs (`struct blk_zone`, `blk_zone_report`, `blk_zone_range`) defined here.
//! - **Limits** from sysfs: `queue/zoned`, `queue/max_open_zones`, `queue/max_active_zones`,
//!   `queue/logical_block_size` (must divide 4096).
//! - **Data** with `O_DIRECT` through io_uring: **one ring per calling thread** (created on
//!   first use, 8 entries, shared by every device that thread touches), one request in
//!   flight per call, `submit_and_wait(1)`. The API is blocking; parallelism comes from the
//!   caller's threads, which never contend on a ring. Where io_uring is unavailable
//!   (seccomp, old kernel) the same calls fall back to `pread`/`pwrite`. Caller buffers that
//!   are not 4096-aligned go through an aligned bounce buffer.
//! - **Reads past the write pointer return zeros** as the trait promises, although devices
//!   differ (null_blk fills them with 0xff): the backend caches each zone's readable end
//!   (write pointer, or capacity when full) from every zone report and from its own writes
//!   and zone operations, reads only below it and zero-fills the rest.
//! - **After a failed write** the zone is re-reported: the kernel (6.12+, zone write
//!   plugging) fails every later write to that zone until a zone report refreshes its
//!   cached write pointer.
//! - The rules of [`ZonedDevice`] are checked here before the kernel sees a request
//!   (alignment to 4096, bounds, no zone crossing: the block layer would silently split a
//!   crossing bio at the zone boundary). Writes to one zone are serialised by a per-zone
//!   lock, so two threads cannot reorder writes at the write pointer; everything else
//!   (write pointer, conditions, limits) is the drive's to enforce.
//! - A smaller last ("runt") zone is not used: the device is exposed as its whole zones.
//! - Zone conditions cannot be set ([`ZonedDevice::set_zone_condition`] is EOPNOTSUPP).

use crate::state::check_io;
use crate::{
    AlignedBuf, Geometry, Result, ZbdError, Zone, ZoneCondition, ZoneOp, ZoneType, ZonedDevice,
};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// `struct blk_zone` (include/uapi/linux/blkzoned.h). Positions in 512-byte sectors.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct BlkZone {
    pub start: u64,
    pub len: u64,
    pub wp: u64,
    pub type_: u8,
    pub cond: u8,
    pub non_seq: u8,
    pub reset: u8,
    pub resv: [u8; 4],
    pub capacity: u64,
    pub reserved: [u8; 24],
}

/// `struct blk_zone_report`, followed in memory by `nr_zones` [`BlkZone`]s.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct BlkZoneReport {
    pub sector: u64,
    pub nr_zones: u32,
    pub flags: u32,
}

/// `struct blk_zone_range`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct BlkZoneRange {
    pub sector: u64,
    pub nr_sectors: u64,
}

const _: () = assert!(std::mem::size_of::<BlkZone>() == 64);
const _: () = assert!(std::mem::size_of::<BlkZoneReport>() == 16);
const _: () = assert!(std::mem::size_of::<BlkZoneRange>() == 16);

/// `BLK_ZONE_REP_CAPACITY`: the report fills `capacity`.
const BLK_ZONE_REP_CAPACITY: u32 = 1;
const SECTOR: u64 = 512;
/// Zones per BLKREPORTZONE call.
const REPORT_CHUNK: u32 = 4096;

mod ioctl {
    use super::{BlkZoneRange, BlkZoneReport};
    nix::ioctl_readwrite!(report_zone, 0x12, 130, BlkZoneReport);
    nix::ioctl_write_ptr!(reset_zone, 0x12, 131, BlkZoneRange);
    nix::ioctl_read!(get_zone_sz, 0x12, 132, u32);
    nix::ioctl_read!(get_nr_zones, 0x12, 133, u32);
    nix::ioctl_write_ptr!(open_zone, 0x12, 134, BlkZoneRange);
    nix::ioctl_write_ptr!(close_zone, 0x12, 135, BlkZoneRange);
    nix::ioctl_write_ptr!(finish_zone, 0x12, 136, BlkZoneRange);
    nix::ioctl_read!(get_size64, 0x12, 114, u64);
}

fn zone_type(t: u8) -> Option<ZoneType> {
    Some(match t {
        1 => ZoneType::Conventional,
        2 => ZoneType::SeqWriteRequired,
        3 => ZoneType::SeqWritePreferred,
        _ => return None,
    })
}

/// Converts a kernel zone entry; `None` for types or conditions we do not know.
pub(crate) fn to_zone(id: u32, z: &BlkZone, has_capacity: bool) -> Option<Zone> {
    let zone_type = zone_type(z.type_)?;
    let cond = crate::emulated::cond_from_code(z.cond)?;
    let start = z.start * SECTOR;
    let len = z.len * SECTOR;
    let wp = match (zone_type, cond) {
        (ZoneType::Conventional, _) => start,
        // Drives report anything for a full zone (ZNS: undefined); use its end.
        (_, ZoneCondition::Full) => start + len,
        _ => (z.wp * SECTOR).clamp(start, start + len),
    };
    Some(Zone {
        id,
        start,
        len,
        capacity: if has_capacity {
            z.capacity * SECTOR
        } else {
            len
        },
        wp,
        zone_type,
        cond,
    })
}

fn sys_err(what: String) -> impl FnOnce(nix::errno::Errno) -> ZbdError {
    move |e| ZbdError::device(what, e as i32)
}

/// Bounce buffers are at most this large; bigger unaligned I/O goes in pieces.
const BOUNCE_MAX: usize = 1 << 20;

thread_local! {
    /// This thread's ring: `None` until first use, `Some(None)` when io_uring is unavailable.
    static RING: RefCell<Option<Option<io_uring::IoUring>>> = const { RefCell::new(None) };
    /// This thread's bounce buffer, grown to the largest unaligned I/O it did (at most
    /// `BOUNCE_MAX`). A fresh one per call cost an allocation, its page faults and zeroing
    /// on every unaligned I/O: in the VM profile of sustained random writes, a quarter of
    /// the reclaim thread's time.
    static BOUNCE: RefCell<AlignedBuf> = const { RefCell::new(AlignedBuf::new()) };
}

/// Run `f` with this thread's bounce buffer, at least `len.min(BOUNCE_MAX)` bytes.
fn with_bounce<T>(len: usize, f: impl FnOnce(&mut AlignedBuf) -> T) -> T {
    let want = len.min(BOUNCE_MAX);
    BOUNCE.with(|cell| {
        let mut bounce = cell.borrow_mut();
        if bounce.len() < want {
            *bounce = AlignedBuf::new_zeroed(want.next_power_of_two());
        }
        f(&mut bounce)
    })
}

/// One plain pread/pwrite on the calling thread.
fn rw_sync(fd: RawFd, ptr: *mut u8, len: usize, pos: u64, write: bool) -> std::io::Result<usize> {
    // SAFETY: ptr/len describe a live buffer the caller owns for this call.
    let n = unsafe {
        if write {
            libc::pwrite(fd, ptr as *const libc::c_void, len, pos as libc::off_t)
        } else {
            libc::pread(fd, ptr as *mut libc::c_void, len, pos as libc::off_t)
        }
    };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// One blocking read or write at `pos` through this thread's ring (or pread/pwrite).
/// Returns the bytes transferred.
///
/// The request carries `RWF_NOWAIT`: when the block layer would block (no free tag, a busy
/// zone write plug), io_uring completes it with EAGAIN instead of handing it to an io-wq
/// worker thread, and we do it with pwrite/pread on this thread, which blocks anyway. Each
/// thread that ever had a request punted keeps an idle `iou-wrk` thread that wakes every
/// 5 s for good: measured in the VM, that was nearly all of an idle daemon's wakeups.
fn rw_once(fd: RawFd, ptr: *mut u8, len: usize, pos: u64, write: bool) -> std::io::Result<usize> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        let ring = slot.get_or_insert_with(|| match io_uring::IoUring::new(8) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::debug!("io_uring unavailable ({e}); using pread/pwrite");
                None
            }
        });
        let Some(ring) = ring.as_mut() else {
            return rw_sync(fd, ptr, len, pos, write);
        };
        let len32 = len.min(u32::MAX as usize & !4095) as u32;
        let ufd = io_uring::types::Fd(fd);
        let sqe = if write {
            io_uring::opcode::Write::new(ufd, ptr as *const u8, len32)
                .offset(pos)
                .rw_flags(libc::RWF_NOWAIT)
                .build()
        } else {
            io_uring::opcode::Read::new(ufd, ptr, len32)
                .offset(pos)
                .rw_flags(libc::RWF_NOWAIT)
                .build()
        };
        // SAFETY: the buffer stays valid until the completion is reaped below, before
        // this function returns; the ring holds no other request.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| std::io::Error::other("io_uring submission queue full"))?;
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
        let cqe = ring
            .completion()
            .next()
            .ok_or_else(|| std::io::Error::other("io_uring: no completion"))?;
        let res = cqe.result();
        if res == -libc::EAGAIN || res == -libc::EOPNOTSUPP {
            // Would block, or the device takes no non-blocking I/O: nothing was transferred.
            return rw_sync(fd, ptr, len, pos, write);
        }
        if res < 0 {
            Err(std::io::Error::from_raw_os_error(-res))
        } else {
            Ok(res as usize)
        }
    })
}

/// Reads all of `buf` at `pos`, bouncing an unaligned buffer.
pub(crate) fn direct_read(fd: RawFd, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
    if (buf.as_ptr() as usize).is_multiple_of(AlignedBuf::ALIGN) {
        return rw_all(fd, buf.as_mut_ptr(), buf.len(), pos, false);
    }
    with_bounce(buf.len(), |bounce| {
        for (i, chunk) in buf.chunks_mut(BOUNCE_MAX).enumerate() {
            let b = &mut bounce[..chunk.len()];
            rw_all(
                fd,
                b.as_mut_ptr(),
                b.len(),
                pos + (i * BOUNCE_MAX) as u64,
                false,
            )?;
            chunk.copy_from_slice(b);
        }
        Ok(())
    })
}

/// Writes all of `buf` at `pos`, bouncing an unaligned buffer.
pub(crate) fn direct_write(fd: RawFd, buf: &[u8], pos: u64) -> std::io::Result<()> {
    if (buf.as_ptr() as usize).is_multiple_of(AlignedBuf::ALIGN) {
        // The kernel only reads through this pointer.
        return rw_all(fd, buf.as_ptr() as *mut u8, buf.len(), pos, true);
    }
    with_bounce(buf.len(), |bounce| {
        for (i, chunk) in buf.chunks(BOUNCE_MAX).enumerate() {
            let b = &mut bounce[..chunk.len()];
            b.copy_from_slice(chunk);
            rw_all(
                fd,
                b.as_mut_ptr(),
                b.len(),
                pos + (i * BOUNCE_MAX) as u64,
                true,
            )?;
        }
        Ok(())
    })
}

fn rw_all(fd: RawFd, ptr: *mut u8, len: usize, pos: u64, write: bool) -> std::io::Result<()> {
    let mut done = 0;
    while done < len {
        // SAFETY: done < len, so the pointer stays inside the caller's buffer.
        let p = unsafe { ptr.add(done) };
        match rw_once(fd, p, len - done, pos + done as u64, write) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "I/O past the device end",
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A kernel zoned block device.
pub struct BlockDev {
    file: File,
    path: PathBuf,
    geo: Geometry,
    model: String,
    sequential: Vec<bool>,
    zone_locks: Vec<Mutex<()>>,
    /// Per zone: bytes from the zone start that hold data ([`OFFLINE`] for offline zones).
    readable: Vec<AtomicU64>,
}

/// `readable` value of an offline zone: reads go to the device, which fails them.
const OFFLINE: u64 = u64::MAX;

fn read_u32_attr(path: &Path, attr: &str) -> u32 {
    crate::sysfs_queue_attr(path, attr)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

impl BlockDev {
    /// Opens a zoned block device; `exclusive` opens it `O_EXCL` (EBUSY when another
    /// exclusive user, e.g. a mounted filesystem or another daemon, holds it).
    pub fn open(path: &Path, exclusive: bool) -> Result<BlockDev> {
        let p = path.display();
        let model = crate::sysfs_zoned_model(path).unwrap_or_else(|| "unknown".into());
        if !matches!(model.as_str(), "host-managed" | "host-aware") {
            return Err(ZbdError::Open(format!(
                "{p} is not a zoned block device (queue/zoned = {model})"
            )));
        }
        let lbs = read_u32_attr(path, "logical_block_size");
        if lbs == 0 || 4096 % lbs != 0 {
            return Err(ZbdError::Open(format!(
                "{p}: logical block size {lbs} does not divide 4096"
            )));
        }
        let mut oo = OpenOptions::new();
        oo.read(true).write(true);
        oo.custom_flags(libc::O_DIRECT | if exclusive { libc::O_EXCL } else { 0 });
        let file = oo.open(path).map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                ZbdError::Open(format!(
                    "{p} is in use (a mounted filesystem, device mapper or another zonedd \
                     daemon holds it): EBUSY"
                ))
            } else {
                ZbdError::Open(format!("open {p}: {e}"))
            }
        })?;
        let fd = file.as_raw_fd();
        let mut zone_sectors = 0u32;
        let mut nr = 0u32;
        let mut size = 0u64;
        // SAFETY: each ioctl writes one integer through a valid pointer to a local.
        unsafe {
            ioctl::get_zone_sz(fd, &mut zone_sectors)
                .map_err(sys_err(format!("{p}: BLKGETZONESZ")))?;
            ioctl::get_nr_zones(fd, &mut nr).map_err(sys_err(format!("{p}: BLKGETNRZONES")))?;
            ioctl::get_size64(fd, &mut size).map_err(sys_err(format!("{p}: BLKGETSIZE64")))?;
        }
        let zone_size = zone_sectors as u64 * SECTOR;
        if !zone_size.is_power_of_two() || zone_size < 4096 {
            return Err(ZbdError::Open(format!(
                "{p}: zone size {zone_size} bytes is not a power of two of at least 4096"
            )));
        }
        // Drop a runt last zone.
        let nr = nr.min((size / zone_size) as u32);
        let mut dev = BlockDev {
            file,
            path: path.to_path_buf(),
            geo: Geometry {
                zone_size,
                zone_capacity: zone_size,
                nr_zones: nr,
                block_size: lbs,
                max_open_zones: read_u32_attr(path, "max_open_zones"),
                max_active_zones: read_u32_attr(path, "max_active_zones"),
            },
            model,
            sequential: Vec::new(),
            zone_locks: (0..nr).map(|_| Mutex::new(())).collect(),
            readable: (0..nr).map(|_| AtomicU64::new(OFFLINE)).collect(),
        };
        let zones = dev.report_zones(0, nr)?;
        dev.sequential = zones.iter().map(|z| z.zone_type.is_sequential()).collect();
        if let Some(z) = zones.iter().find(|z| z.zone_type.is_sequential()) {
            dev.geo.zone_capacity = z.capacity;
        }
        if let Some(z) = zones
            .iter()
            .find(|z| z.zone_type.is_sequential() && z.capacity != dev.geo.zone_capacity)
        {
            return Err(ZbdError::Open(format!(
                "{p}: zone {} has capacity {} bytes, zone {} has {}: mixed capacities are not \
                 supported",
                z.id,
                z.capacity,
                zones
                    .iter()
                    .position(|z| z.zone_type.is_sequential())
                    .unwrap_or(0),
                dev.geo.zone_capacity
            )));
        }
        Ok(dev)
    }

    /// Records what a zone report says about a zone's readable end.
    fn note_zone(&self, z: &Zone) {
        let Some(slot) = self.readable.get(z.id as usize) else {
            return;
        };
        let v = match (z.zone_type, z.cond) {
            (_, ZoneCondition::Offline) => OFFLINE,
            (ZoneType::Conventional, _) => self.geo.zone_size,
            (_, ZoneCondition::Full) => z.capacity,
            _ => z.wp - z.start,
        };
        slot.store(v, Ordering::Release);
    }

    /// Re-reads one zone (refreshing the caches, the kernel's included); errors are only
    /// logged, the caller reports its own.
    fn refresh(&self, zone: u32) {
        if let Err(e) = self.report_zones(zone, 1) {
            tracing::warn!("{}: report of zone {zone} failed: {e}", self.path.display());
        }
    }

    fn range(&self, zone: u32) -> BlkZoneRange {
        BlkZoneRange {
            sector: self.geo.zone_start(zone) / SECTOR,
            nr_sectors: self.geo.zone_size / SECTOR,
        }
    }
}

impl ZonedDevice for BlockDev {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn report_zones(&self, first: u32, nr: u32) -> Result<Vec<Zone>> {
        let end = first.saturating_add(nr).min(self.geo.nr_zones);
        let mut out = Vec::with_capacity(end.saturating_sub(first) as usize);
        let mut next = first;
        let hdr = std::mem::size_of::<BlkZoneReport>();
        let ent = std::mem::size_of::<BlkZone>();
        while next < end {
            let want = (end - next).min(REPORT_CHUNK);
            // u64 storage keeps the header and entries 8-byte aligned.
            let mut buf = vec![0u64; (hdr + want as usize * ent) / 8];
            let rep = buf.as_mut_ptr() as *mut BlkZoneReport;
            // SAFETY: buf is large and aligned enough for the header plus `want` entries,
            // which is what nr_zones tells the kernel it may fill.
            unsafe {
                (*rep).sector = self.geo.zone_start(next) / SECTOR;
                (*rep).nr_zones = want;
                ioctl::report_zone(self.file.as_raw_fd(), rep)
                    .map_err(sys_err(format!("{}: BLKREPORTZONE", self.path.display())))?;
            }
            // SAFETY: the kernel wrote the header; entries follow it in the same buffer.
            let (got, flags) = unsafe { ((*rep).nr_zones.min(want), (*rep).flags) };
            if got == 0 {
                break;
            }
            for i in 0..got as usize {
                // SAFETY: i < got <= want entries lie inside buf after the header.
                let z =
                    unsafe { &*((buf.as_ptr() as *const u8).add(hdr + i * ent) as *const BlkZone) };
                let id = next + i as u32;
                let zone = to_zone(id, z, flags & BLK_ZONE_REP_CAPACITY != 0).ok_or_else(|| {
                    ZbdError::device(
                        format!(
                            "{}: zone {id} has unknown type {} or condition {}",
                            self.path.display(),
                            z.type_,
                            z.cond
                        ),
                        libc::EIO,
                    )
                })?;
                self.note_zone(&zone);
                out.push(zone);
            }
            next += got;
        }
        out.retain(|z| z.id < end);
        Ok(out)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let z = check_io(&self.geo, offset, buf.len() as u64, "read")?;
        if buf.is_empty() {
            return Ok(());
        }
        let rel = offset - self.geo.zone_start(z);
        let limit = self.readable[z as usize].load(Ordering::Acquire);
        let n = if limit == OFFLINE {
            buf.len()
        } else {
            limit.saturating_sub(rel).min(buf.len() as u64) as usize
        };
        buf[n..].fill(0);
        if n == 0 {
            return Ok(());
        }
        direct_read(self.file.as_raw_fd(), &mut buf[..n], offset).map_err(|source| ZbdError::Io {
            what: format!("read {} at {offset:#x}", self.path.display()),
            source,
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.writev_at(&[buf], offset)
    }

    fn writev_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let z = check_io(&self.geo, offset, len, "write")?;
        if len == 0 {
            return Ok(());
        }
        let _zl = self.sequential[z as usize].then(|| self.zone_locks[z as usize].lock());
        let mut pos = offset;
        for b in bufs {
            if let Err(source) = direct_write(self.file.as_raw_fd(), b, pos) {
                if self.sequential[z as usize] {
                    self.refresh(z);
                }
                return Err(ZbdError::Io {
                    what: format!("write {} at {pos:#x}", self.path.display()),
                    source,
                });
            }
            pos += b.len() as u64;
        }
        if self.sequential[z as usize] {
            let end = offset + len - self.geo.zone_start(z);
            let slot = &self.readable[z as usize];
            // Writes to this zone are serialised by its lock.
            if slot.load(Ordering::Acquire) != OFFLINE {
                slot.store(end.min(self.geo.zone_capacity), Ordering::Release);
            }
        }
        Ok(())
    }

    fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> Result<()> {
        if zone >= self.geo.nr_zones {
            return Err(ZbdError::Invalid(format!(
                "{op} zone {zone}: the device has {} zones",
                self.geo.nr_zones
            )));
        }
        if !self.sequential[zone as usize] {
            return Err(ZbdError::device(
                format!("{op} zone {zone}: conventional zone"),
                libc::EIO,
            ));
        }
        let _zl = self.zone_locks[zone as usize].lock();
        let range = self.range(zone);
        let fd = self.file.as_raw_fd();
        let what = format!("{}: {op} zone {zone}", self.path.display());
        // SAFETY: each ioctl reads one blk_zone_range from a valid pointer to a local.
        let r = unsafe {
            match op {
                ZoneOp::Reset => ioctl::reset_zone(fd, &range),
                ZoneOp::Open => ioctl::open_zone(fd, &range),
                ZoneOp::Close => ioctl::close_zone(fd, &range),
                ZoneOp::Finish => ioctl::finish_zone(fd, &range),
            }
        }
        .map_err(sys_err(what));
        // Whatever happened, learn the zone's new state (and let the kernel resync).
        self.refresh(zone);
        r.map(|_| ())
    }

    fn reset_all(&self) -> Result<()> {
        // Zone by zone: a whole-device reset fails on some devices when a zone is offline
        // or read-only, and resetting empty zones is wasted work.
        for z in self.report_all()? {
            if z.zone_type.is_sequential()
                && !matches!(
                    z.cond,
                    ZoneCondition::Empty | ZoneCondition::ReadOnly | ZoneCondition::Offline
                )
            {
                self.zone_mgmt(ZoneOp::Reset, z.id)?;
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.file.sync_data().map_err(|source| ZbdError::Io {
            what: format!("flush {}", self.path.display()),
            source,
        })
    }

    fn read_source(&self) -> Option<crate::ReadSource> {
        Some(crate::ReadSource {
            fd: self.file.as_raw_fd(),
            base: 0,
            direct: true,
            end: None,
            conv_writes: true,
            seq_writes: true,
        })
    }

    fn source_written(&self, offset: u64, len: u64) -> Result<()> {
        let z = check_io(&self.geo, offset, len, "write")?;
        if !self.sequential[z as usize] || len == 0 {
            return Ok(());
        }
        let _zl = self.zone_locks[z as usize].lock();
        let rel = offset - self.geo.zone_start(z);
        let slot = &self.readable[z as usize];
        let known = slot.load(Ordering::Acquire);
        if known == OFFLINE {
            return Ok(());
        }
        if known != rel {
            // The drive took the write (it checks the write pointer itself): what this
            // device knew is stale, so learn the zone again.
            self.refresh(z);
            return Err(ZbdError::Invalid(format!(
                "{}: a write through the read source at {offset:#x} was not at the write \
                 pointer known ({known:#x} into zone {z})",
                self.path.display()
            )));
        }
        slot.store((rel + len).min(self.geo.zone_capacity), Ordering::Release);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{} ({})", self.path.display(), self.model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uapi_layouts_match_the_kernel() {
        assert_eq!(std::mem::size_of::<BlkZone>(), 64);
        assert_eq!(std::mem::size_of::<BlkZoneReport>(), 16);
        assert_eq!(std::mem::size_of::<BlkZoneRange>(), 16);
        assert_eq!(std::mem::offset_of!(BlkZone, type_), 24);
        assert_eq!(std::mem::offset_of!(BlkZone, capacity), 32);
        assert_eq!(std::mem::offset_of!(BlkZoneReport, flags), 12);
        // The request numbers of include/uapi/linux/fs.h + blkzoned.h.
        assert_eq!(nix::request_code_readwrite!(0x12, 130, 16), 0xc010_1282);
        assert_eq!(nix::request_code_write!(0x12, 131, 16), 0x4010_1283);
        assert_eq!(nix::request_code_read!(0x12, 132, 4), 0x8004_1284);
        assert_eq!(nix::request_code_read!(0x12, 133, 4), 0x8004_1285);
        assert_eq!(nix::request_code_write!(0x12, 134, 16), 0x4010_1286);
        assert_eq!(nix::request_code_write!(0x12, 135, 16), 0x4010_1287);
        assert_eq!(nix::request_code_write!(0x12, 136, 16), 0x4010_1288);
    }

    #[test]
    fn zone_entries_convert() {
        let z = BlkZone {
            start: 2048,
            len: 2048,
            wp: 2048 + 16,
            type_: 2,
            cond: 2,
            capacity: 1536,
            ..Default::default()
        };
        let zone = to_zone(1, &z, true).unwrap();
        assert_eq!(zone.start, 1 << 20);
        assert_eq!(zone.wp, (1 << 20) + 8192);
        assert_eq!(zone.capacity, 768 << 10);
        assert_eq!(zone.cond, ZoneCondition::ImplicitOpen);
        assert_eq!(to_zone(1, &z, false).unwrap().capacity, 1 << 20);
        let full = BlkZone {
            cond: 0xe,
            wp: u64::MAX / 512,
            ..z
        };
        assert_eq!(to_zone(1, &full, true).unwrap().wp, 2 << 20);
        let conv = BlkZone {
            type_: 1,
            cond: 0,
            ..z
        };
        let c = to_zone(1, &conv, true).unwrap();
        assert_eq!((c.zone_type, c.wp), (ZoneType::Conventional, 1 << 20));
        assert!(to_zone(1, &BlkZone { type_: 9, ..z }, true).is_none());
    }

    #[test]
    fn direct_io_path_on_a_regular_file() {
        // The data path (ring, O_DIRECT, bounce buffers) works on any file system that
        // supports O_DIRECT; the zone ioctls need a zoned kernel device.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![0u8; 4 << 20]).unwrap();
        let f = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
        {
            Ok(f) => f,
            Err(_) => return, // tmpfs without O_DIRECT
        };
        let fd = f.as_raw_fd();
        let data: Vec<u8> = (0..(2 << 20) + 8192).map(|i| (i % 251) as u8).collect();
        // Unaligned source (Vec data may or may not be aligned: force an offset).
        let mut v = vec![0u8; data.len() + 1];
        v[1..].copy_from_slice(&data);
        direct_write(fd, &v[1..], 4096).unwrap();
        let mut a = AlignedBuf::new_zeroed(data.len());
        direct_read(fd, &mut a, 4096).unwrap();
        assert_eq!(&a[..], &data[..]);
        let mut u = vec![0u8; 8193];
        direct_read(fd, &mut u[1..], 4096 + 4096).unwrap();
        assert_eq!(&u[1..], &data[4096..8192 + 4096]);
        let uring = RING.with(|c| matches!(*c.borrow(), Some(Some(_))));
        eprintln!("data path used io_uring: {uring}");
        // Another thread gets its own ring.
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut b = vec![0u8; 4097];
                direct_read(fd, &mut b[1..], 4096).unwrap();
                assert_eq!(&b[1..], &data[..4096]);
            });
        });
    }
}
