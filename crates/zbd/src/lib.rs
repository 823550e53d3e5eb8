//! Zoned block backends behind one trait.
//!
//! Everything above this crate (the chunk-mapping engine, the daemon) talks to a
//! [`ZonedDevice`] and must not be able to tell an emulated host-managed disk from a real
//! one. Units: byte offsets and lengths on the device, always multiples of
//! [`BLOCK_SIZE`]; zones are numbered from 0.

use std::fmt;

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

    /// Convenience: report every zone.
    fn report_all(&self) -> Result<Vec<Zone>> {
        self.report_zones(0, self.geometry().nr_zones)
    }
}
