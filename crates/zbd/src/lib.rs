//! Zoned block backends behind one trait.
//!
//! Everything above this crate (the chunk-mapping engine, the daemon) talks to a
//! [`ZonedDevice`] and must not be able to tell an emulated host-managed disk from a real
//! one. Units: byte offsets and lengths on the device, always multiples of
//! [`BLOCK_SIZE`]; zones are numbered from 0.
//!
//! Backends:
//! - [`Emulated`]: a host-managed SMR disk emulated on a (sparse) file or a regular block
//!   device; crash-safe zone table (see its module docs for the image layout).
//! - [`BlockDev`]: a kernel zoned block device (SMR, ZNS, null_blk, scsi_debug).
//! - [`MemDevice`]: the same rules in RAM, for fast tests.
//! - [`FaultyDevice`]: wraps any of them to inject errors, zone failures and power cuts.
//!
//! [`open`] recognises a path (image magic, or `queue/zoned`) and locks it against a second
//! user; [`open_shared`] is for inspection. [`conformance::run`] checks a device against the
//! rules (destructively).
//!
//! [`AlignedBuf`] is a byte buffer whose start is 4096-aligned: I/O from or into one goes to
//! an `O_DIRECT` backend without a bounce copy.
//!
//! Contract for callers: writes to one sequential zone are issued one at a time, each at
//! the write pointer left by the previous one (as with the kernel); writes to different
//! zones, reads and zone operations on other zones may run concurrently from any thread.
//! Errors carry the errno the kernel would give: EIO for a rule a drive enforces (write off
//! the write pointer, full / read-only / offline zone, crossing a zone end), EINVAL for a
//! request no device accepts (unaligned, out of range), ETOOMANYREFS at the open limit,
//! EOVERFLOW at the active limit.

use std::fmt;
use std::path::Path;

mod aligned;
mod blockdev;
pub mod conformance;
mod emulated;
mod faulty;
mod mem;
mod multi;
mod options;
mod regular;
mod state;
mod timed;
pub mod timing;

pub use aligned::AlignedBuf;
pub use blockdev::{BlkZone, BlkZoneRange, BlkZoneReport, BlockDev};
pub use emulated::{has_magic, Emulated, MAGIC as EMULATED_MAGIC};
pub use faulty::{FaultyDevice, Op, OpClass, OpKind};
pub use mem::MemDevice;
pub use multi::MultiDevice;
pub use options::{
    default_conventional, fmt_size, parse_size, EmulateOptions, DEFAULT_MAX_OPEN,
    DEFAULT_ZONE_SIZE, MIN_EMULATED_ZONE_SIZE,
};
pub use regular::RegularDevice;
pub use timed::TimedDevice;

/// zonedd (like dm-zoned) works in 4 KiB blocks.
pub const BLOCK_SIZE: u64 = 4096;

/// The kind of a zone, as the kernel's zone report gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ZoneType {
    /// Randomly writable, no write pointer.
    Conventional,
    /// Host-managed: writes only at the write pointer.
    SeqWriteRequired,
    /// Host-aware: sequential writes preferred; zonedd treats it as sequential.
    SeqWritePreferred,
}

impl ZoneType {
    /// True for zones with a write pointer.
    pub fn is_sequential(self) -> bool {
        !matches!(self, ZoneType::Conventional)
    }
}

/// The condition of a zone, as the kernel's zone report gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ZoneCondition {
    /// Conventional zones have no write pointer.
    NotWp,
    Empty,
    ImplicitOpen,
    ExplicitOpen,
    Closed,
    Full,
    ReadOnly,
    Offline,
}

impl ZoneCondition {
    /// Counts against the max-open limit.
    pub fn is_open(self) -> bool {
        matches!(
            self,
            ZoneCondition::ImplicitOpen | ZoneCondition::ExplicitOpen
        )
    }
    /// Counts against the max-active limit.
    pub fn is_active(self) -> bool {
        self.is_open() || self == ZoneCondition::Closed
    }
}

/// One entry of a zone report. All positions are byte offsets on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Zone {
    pub id: u32,
    pub start: u64,
    pub len: u64,
    /// Writable bytes from `start` (ZNS may have capacity < len).
    pub capacity: u64,
    /// Write pointer (absolute byte offset); `start` for conventional zones.
    pub wp: u64,
    #[serde(rename = "type")]
    pub zone_type: ZoneType,
    #[serde(rename = "condition")]
    pub cond: ZoneCondition,
}

/// Static shape of a zoned device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Geometry {
    /// Bytes per zone, a power of two.
    pub zone_size: u64,
    /// Writable bytes per zone (== zone_size on SMR drives).
    pub zone_capacity: u64,
    pub nr_zones: u32,
    /// Logical block size the device accepts I/O in (zonedd requires 4096-byte alignment).
    pub block_size: u32,
    /// 0 means no limit.
    pub max_open_zones: u32,
    /// 0 means no limit.
    pub max_active_zones: u32,
}

impl Geometry {
    pub fn capacity(&self) -> u64 {
        self.zone_size * self.nr_zones as u64
    }
    pub fn zone_blocks(&self) -> u64 {
        self.zone_size / BLOCK_SIZE
    }
    pub fn zone_of(&self, offset: u64) -> u32 {
        (offset / self.zone_size) as u32
    }
    pub fn zone_start(&self, zone: u32) -> u64 {
        zone as u64 * self.zone_size
    }
}

/// Zone management operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneOp {
    Reset,
    Open,
    Close,
    Finish,
}

impl fmt::Display for ZoneOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ZoneOp::Reset => "reset",
            ZoneOp::Open => "open",
            ZoneOp::Close => "close",
            ZoneOp::Finish => "finish",
        };
        f.write_str(s)
    }
}

/// What a backend operation can fail with. Each error carries the errno a kernel block
/// device would return, so the layers above can pass it on unchanged.
#[derive(Debug, thiserror::Error)]
pub enum ZbdError {
    /// A device error (EIO, ETOOMANYREFS, EOVERFLOW, EROFS, ...), with what was attempted.
    #[error("{what}: {}", std::io::Error::from_raw_os_error(*errno))]
    Device { what: String, errno: i32 },
    /// A request that no device would accept (unaligned, out of range).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Opening or recognising the backend failed; the message is for the user.
    #[error("{0}")]
    Open(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl ZbdError {
    /// The errno to report to a block-layer caller.
    pub fn errno(&self) -> i32 {
        match self {
            ZbdError::Device { errno, .. } => *errno,
            ZbdError::Invalid(_) => libc::EINVAL,
            ZbdError::Open(_) => libc::ENODEV,
            ZbdError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
    pub fn device(what: impl Into<String>, errno: i32) -> Self {
        ZbdError::Device {
            what: what.into(),
            errno,
        }
    }
}

pub type Result<T> = std::result::Result<T, ZbdError>;

/// A file descriptor that reads a device's data without the device's help: `len` bytes at
/// device offset `off` are the bytes at file offset `base + off` of `fd`. This holds for
/// blocks below a sequential zone's write pointer and for conventional zones (the only
/// blocks the engine reads: valid ones), not past a write pointer (where
/// [`ZonedDevice::read_at`] gives zeros). The descriptor lives as long as the device; it is
/// never closed by the caller, and written through only where `conv_writes` says so. It
/// may cover only the device's first bytes (`end`: a multi-device volume's cache device,
/// [`crate::MultiDevice`]); a caller reads or writes through it only what
/// [`ReadSource::covers`]. A device whose source covers it whole ([`ReadSource::whole`])
/// also promises that its [`ZonedDevice::flush`] is an `fdatasync` of `fd` and nothing more:
/// a caller may flush it on its own ring instead (the frontend's flushes, docs/design.md
/// "Flushes on the ring"); a partial source promises that the device's flush also makes
/// durable every write made through `fd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadSource {
    pub fd: std::os::fd::RawFd,
    pub base: u64,
    /// Device offsets from this one on are not in `fd` (`None`: every offset is).
    pub end: Option<u64>,
    /// Opened `O_DIRECT`: buffers, offsets and lengths must be 4096-aligned.
    pub direct: bool,
    /// Conventional zones may also be written through `fd` (same offsets): the device keeps
    /// no state for those writes, so a write there is what [`ZonedDevice::write_at`] would
    /// do. It skips the device's own checks of the zone's condition: the caller writes only
    /// zones it has not retired. Never for sequential zones (their write pointers).
    pub conv_writes: bool,
    /// Sequential zones may be written through `fd` too, at their write pointer, one write
    /// per zone at a time (the caller orders them), each reported once it completed with
    /// [`ZonedDevice::source_written`]: the device's own writes keep its state of the zone,
    /// so it must learn of these. Real zoned block devices only (the drive keeps the write
    /// pointer; an emulated image keeps it in its own state).
    pub seq_writes: bool,
}

impl ReadSource {
    /// Whether the `len` bytes at device offset `offset` are in `fd`.
    pub fn covers(&self, offset: u64, len: u64) -> bool {
        self.end
            .is_none_or(|end| offset.checked_add(len).is_some_and(|e| e <= end))
    }

    /// Whether the source covers the whole device (and the device's flush is an
    /// `fdatasync` of `fd`).
    pub fn whole(&self) -> bool {
        self.end.is_none()
    }
}

/// One device of a (possibly multi-device) volume, as [`ZonedDevice::members`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Member {
    /// 0 for the cache device (or the only device), 1.. for the zoned drives.
    pub index: usize,
    pub name: String,
    /// Its zones are `first_zone .. first_zone + nr_zones` of the volume.
    pub first_zone: u32,
    pub nr_zones: u32,
    /// The regular cache device of a multi-device volume.
    pub cache: bool,
}

/// `device 0 (cache): zones 0-7: /dev/nullb0`, as `format`, `report` and `status` list members.
impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device {} ({}): zones {}-{}: {}",
            self.index,
            if self.cache { "cache" } else { "zoned" },
            self.first_zone,
            (self.first_zone + self.nr_zones).saturating_sub(1),
            self.name
        )
    }
}

/// A zoned block device: emulated, real, or a test wrapper around either.
///
/// Implementations are shared between threads (`&self` everywhere) and enforce the rules a
/// host-managed drive enforces. Data calls block until the I/O is complete (for writes:
/// complete in the device, not necessarily durable until [`ZonedDevice::flush`]).
pub trait ZonedDevice: Send + Sync {
    fn geometry(&self) -> Geometry;

    /// Report `nr` zones starting at zone `first` (fewer at the end of the device).
    fn report_zones(&self, first: u32, nr: u32) -> Result<Vec<Zone>>;

    /// Read `buf.len()` bytes at `offset`. Must not cross a zone end. Blocks at or past a
    /// sequential zone's write pointer read as zeros.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;

    /// Write `buf` at `offset`. Must not cross a zone end; in a sequential zone `offset`
    /// must equal the write pointer.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;

    /// Write several buffers back to back from `offset` (one submission where it pays).
    fn writev_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        let mut off = offset;
        for b in bufs {
            self.write_at(b, off)?;
            off += b.len() as u64;
        }
        Ok(())
    }

    /// Zone management on one zone.
    fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> Result<()>;

    /// Reset every sequential zone.
    fn reset_all(&self) -> Result<()>;

    /// Make every completed write durable.
    fn flush(&self) -> Result<()>;

    /// A short human description ("emulated SMR image /tmp/d.img", "/dev/sda (host-managed)").
    fn describe(&self) -> String;

    /// The devices this one is made of: itself alone (the default), or a
    /// [`MultiDevice`]'s cache device and zoned drives.
    fn members(&self) -> Vec<Member> {
        vec![Member {
            index: 0,
            name: self.describe(),
            first_zone: 0,
            nr_zones: self.geometry().nr_zones,
            cache: false,
        }]
    }

    /// Flush member `index` of [`ZonedDevice::members`] only (the default: the whole device).
    fn flush_member(&self, index: usize) -> Result<()> {
        let _ = index;
        self.flush()
    }

    /// Where a caller with its own io_uring may read this device's data itself (see
    /// [`ReadSource`]); `None` (the default) when reads must go through [`ZonedDevice::read_at`]:
    /// memory devices, and wrappers that change what reads see (fault injection, power cuts;
    /// [`FaultyDevice::with_read_source`] hands out a stand-in for tests).
    fn read_source(&self) -> Option<ReadSource> {
        None
    }

    /// A write of `len` bytes at `offset` of a sequential zone, made through the
    /// [`ReadSource`] (`seq_writes`), completed: the device updates what it keeps of the
    /// zone (its readable end) as [`ZonedDevice::write_at`] would have. An error when the
    /// write was not at the write pointer the device knew. Default (no `seq_writes`):
    /// EOPNOTSUPP.
    fn source_written(&self, offset: u64, len: u64) -> Result<()> {
        let _ = (offset, len);
        Err(ZbdError::device(
            format!(
                "{}: no writes of sequential zones through its read source",
                self.describe()
            ),
            libc::EOPNOTSUPP,
        ))
    }

    /// Convenience: report every zone.
    fn report_all(&self) -> Result<Vec<Zone>> {
        self.report_zones(0, self.geometry().nr_zones)
    }

    /// Test hook: force a zone read-only or offline, or bring it back (`Empty` for a
    /// sequential zone, `NotWp` for a conventional one). Emulated backends support it; real
    /// devices fail with EOPNOTSUPP.
    fn set_zone_condition(&self, zone: u32, cond: ZoneCondition) -> Result<()> {
        let _ = (zone, cond);
        Err(ZbdError::device(
            format!("{}: zone conditions cannot be set", self.describe()),
            libc::EOPNOTSUPP,
        ))
    }
}

macro_rules! forward_zoned_device {
    ($ptr:ty) => {
        /// Forwards everything to the pointee, so `FaultyDevice<Arc<dyn ZonedDevice>>` and
        /// the like work.
        impl<T: ZonedDevice + ?Sized> ZonedDevice for $ptr {
            fn geometry(&self) -> Geometry {
                (**self).geometry()
            }
            fn report_zones(&self, first: u32, nr: u32) -> Result<Vec<Zone>> {
                (**self).report_zones(first, nr)
            }
            fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
                (**self).read_at(buf, offset)
            }
            fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
                (**self).write_at(buf, offset)
            }
            fn writev_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
                (**self).writev_at(bufs, offset)
            }
            fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> Result<()> {
                (**self).zone_mgmt(op, zone)
            }
            fn reset_all(&self) -> Result<()> {
                (**self).reset_all()
            }
            fn flush(&self) -> Result<()> {
                (**self).flush()
            }
            fn describe(&self) -> String {
                (**self).describe()
            }
            fn members(&self) -> Vec<Member> {
                (**self).members()
            }
            fn flush_member(&self, index: usize) -> Result<()> {
                (**self).flush_member(index)
            }
            fn report_all(&self) -> Result<Vec<Zone>> {
                (**self).report_all()
            }
            fn read_source(&self) -> Option<ReadSource> {
                (**self).read_source()
            }
            fn source_written(&self, offset: u64, len: u64) -> Result<()> {
                (**self).source_written(offset, len)
            }
            fn set_zone_condition(&self, zone: u32, cond: ZoneCondition) -> Result<()> {
                (**self).set_zone_condition(zone, cond)
            }
        }
    };
}

forward_zoned_device!(Box<T>);
forward_zoned_device!(std::sync::Arc<T>);
forward_zoned_device!(&T);

/// The zoned model sysfs gives for a block device (`none`, `host-managed`, `host-aware`),
/// `None` when `path` is not a block device or sysfs does not say.
pub fn sysfs_zoned_model(path: &Path) -> Option<String> {
    sysfs_queue_attr(path, "zoned")
}

/// Whether sysfs says the block device at `path` spins (`queue/rotational`): `None` when
/// `path` is not a block device or sysfs does not say.
pub fn sysfs_rotational(path: &Path) -> Option<bool> {
    sysfs_queue_attr(path, "rotational").map(|s| s != "0")
}

/// Whether the running kernel keeps each zone's writes in the order they were submitted,
/// several in flight together (zone write plugging: Linux 6.10 and later; `RWF_NOWAIT`
/// writes are plugged too, never turned away). `None` when the release cannot be read.
pub fn kernel_orders_zone_writes() -> Option<bool> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    release_at_least(&release, (6, 10))
}

/// Whether a kernel release string (`6.12.95+deb12-amd64`) is `want` (major, minor) or
/// later; `None` when it does not start with `MAJOR.MINOR`.
fn release_at_least(release: &str, want: (u32, u32)) -> Option<bool> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    Some((major, minor) >= want)
}

/// `/sys/dev/block/MAJ:MIN/queue/<attr>` of a block device (or of its disk for a partition).
pub(crate) fn sysfs_queue_attr(path: &Path, attr: &str) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let rdev = meta.rdev();
    let dev = format!(
        "/sys/dev/block/{}:{}",
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev)
    );
    for dir in [format!("{dev}/queue"), format!("{dev}/../queue")] {
        if let Ok(s) = std::fs::read_to_string(format!("{dir}/{attr}")) {
            return Some(s.trim().to_string());
        }
    }
    None
}

/// Opens a backend for exclusive use (a daemon, format, check): an emulated image (locked
/// with `flock`) or a zoned block device (opened `O_EXCL`). Anything else gets an error that
/// says what it is. A second exclusive opener gets an "in use" (EBUSY) error.
pub fn open(path: &Path) -> Result<Box<dyn ZonedDevice>> {
    open_backend(path, true)
}

/// Opens a backend without locking it, for inspection while a daemon may hold it
/// (`zonedd report`). Do not write through it.
pub fn open_shared(path: &Path) -> Result<Box<dyn ZonedDevice>> {
    open_backend(path, false)
}

/// Opens a multi-device volume's devices (reference §3.5): `cache`, a regular file or
/// block device cut into zones of the zoned drives' size, then each of `zoned` (a zoned
/// block device or an emulated image), in the order given. Refuses, naming the device: a
/// device given twice, a zoned device as the cache, a regular one as a zoned drive, a
/// missing one, and zone sizes that differ.
pub fn open_multi(cache: &Path, zoned: &[&Path], exclusive: bool) -> Result<MultiDevice> {
    let mut seen: Vec<(&Path, (u64, u64))> = Vec::new();
    for p in std::iter::once(cache).chain(zoned.iter().copied()) {
        let id = device_identity(p)?;
        if let Some((q, _)) = seen.iter().find(|(_, i)| *i == id) {
            return Err(ZbdError::Open(format!(
                "{} is given twice (also as {}): each device of a volume must be distinct",
                p.display(),
                q.display()
            )));
        }
        seen.push((p, id));
    }
    if is_zoned_path(cache)? {
        return Err(ZbdError::Open(format!(
            "{} is a zoned device: --cache takes a regular block device or file",
            cache.display()
        )));
    }
    let mut drives: Vec<std::sync::Arc<dyn ZonedDevice>> = Vec::new();
    for p in zoned {
        if !is_zoned_path(p)? {
            return Err(ZbdError::Open(format!(
                "{} is a regular device or file: --backend takes a zoned device (give a \
                 regular one as --cache)",
                p.display()
            )));
        }
        drives.push(std::sync::Arc::from(open_backend(p, exclusive)?));
    }
    let zone_size = drives[0].geometry().zone_size;
    let cache_dev = RegularDevice::open(cache, zone_size, exclusive)?;
    MultiDevice::new(std::sync::Arc::new(cache_dev), drives)
}

/// What identifies a device whatever path names it: the device number of a block device,
/// (st_dev, st_ino) of a file.
fn device_identity(path: &Path) -> Result<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m =
        std::fs::metadata(path).map_err(|e| ZbdError::Open(format!("{}: {e}", path.display())))?;
    Ok(if m.file_type().is_block_device() {
        (u64::MAX, m.rdev())
    } else {
        (m.dev(), m.ino())
    })
}

/// A zoned block device (sysfs says so) or an emulated image (its magic).
fn is_zoned_path(path: &Path) -> Result<bool> {
    use std::os::unix::fs::FileExt;
    if matches!(
        sysfs_zoned_model(path).as_deref(),
        Some("host-managed" | "host-aware")
    ) {
        return Ok(true);
    }
    let f = std::fs::File::open(path)
        .map_err(|e| ZbdError::Open(format!("{}: {e}", path.display())))?;
    let mut head = [0u8; 8];
    let n = f.read_at(&mut head, 0).unwrap_or(0);
    Ok(has_magic(&head[..n]))
}

fn open_backend(path: &Path, exclusive: bool) -> Result<Box<dyn ZonedDevice>> {
    use std::os::unix::fs::{FileExt, FileTypeExt};
    let p = path.display();
    let meta = std::fs::metadata(path).map_err(|e| ZbdError::Open(format!("{p}: {e}")))?;
    let ft = meta.file_type();
    if !ft.is_file() && !ft.is_block_device() {
        return Err(ZbdError::Open(format!(
            "{p} is neither a zoned block device nor an emulated image (create one with \
             `zonedd emulate PATH --size SIZE`)"
        )));
    }
    if ft.is_block_device() {
        let model = sysfs_zoned_model(path);
        if matches!(model.as_deref(), Some("host-managed" | "host-aware")) {
            return open_zoned_blockdev(path, exclusive);
        }
    }
    let mut head = [0u8; 8];
    let f = std::fs::File::open(path).map_err(|e| ZbdError::Open(format!("{p}: {e}")))?;
    let n = f.read_at(&mut head, 0).unwrap_or(0);
    drop(f);
    if has_magic(&head[..n]) {
        let e = if exclusive {
            Emulated::open(path)?
        } else {
            Emulated::open_unlocked(path)?
        };
        return Ok(Box::new(e));
    }
    if ft.is_block_device() {
        let model = sysfs_zoned_model(path).unwrap_or_else(|| "unknown".into());
        return Err(ZbdError::Open(format!(
            "{p} is a regular block device (queue/zoned = {model}), not zoned; to use it \
             create an emulated SMR disk on it with `zonedd emulate {p} --force`"
        )));
    }
    Err(ZbdError::Open(format!(
        "{p} is a regular file without the zonedd image header; create an emulated SMR disk \
         with `zonedd emulate {p} --size SIZE`"
    )))
}

fn open_zoned_blockdev(path: &Path, exclusive: bool) -> Result<Box<dyn ZonedDevice>> {
    Ok(Box::new(BlockDev::open(path, exclusive)?))
}

#[cfg(test)]
mod tests {
    use super::release_at_least;

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert_eq!(
            release_at_least("6.12.95+deb12-amd64\n", (6, 10)),
            Some(true)
        );
        assert_eq!(release_at_least("6.10.0", (6, 10)), Some(true));
        assert_eq!(release_at_least("6.9.12-arch1", (6, 10)), Some(false));
        assert_eq!(release_at_least("5.15.0-91-generic", (6, 10)), Some(false));
        assert_eq!(release_at_least("7.0-rc1", (6, 10)), Some(true));
        assert_eq!(release_at_least("garbage", (6, 10)), None);
    }
}
