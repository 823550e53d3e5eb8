//! An emulated host-managed SMR disk on a regular file or a regular (non-zoned) block device.
//!
//! # Image layout
//!
//! All integers are little-endian. The image has three parts:
//!
//! **Header**, bytes 0..4096:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `ZONEDDEM` |
//! | 8 | 4 | version, 1 |
//! | 12 | 4 | header size, 4096 |
//! | 16 | 8 | zone size in bytes (power of two, >= 1 MiB) |
//! | 24 | 8 | zone capacity in bytes (<= zone size, multiple of 4096) |
//! | 32 | 4 | number of zones |
//! | 36 | 4 | number of conventional zones (zones `0..n`) |
//! | 40 | 4 | max open zones (0 = no limit) |
//! | 44 | 4 | max active zones (0 = no limit) |
//! | 48 | 4 | logical block size, 4096 |
//! | 52 | 4 | zone table entry size, 16 |
//! | 56 | 8 | zone table offset, 4096 |
//! | 64 | 8 | data area offset (a multiple of the zone size) |
//! | 72 | 8 | image size: data offset + zones x zone size |
//! | 80 | 4012 | zero |
//! | 4092 | 4 | CRC-32 (IEEE) of bytes 0..4092 |
//!
//! **Zone table**, from byte 4096: one 16-byte entry per zone, zone `z` at `4096 + 16 z`:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | write pointer, bytes from the zone start (zone size when full; 0 for conventional) |
//! | 8 | 1 | condition, the kernel's `BLK_ZONE_COND_*` code (0 not-wp, 1 empty, 2 implicit open, 3 explicit open, 4 closed, 0xd read-only, 0xe full, 0xf offline) |
//! | 9 | 1 | type, the kernel's `BLK_ZONE_TYPE_*` code (1 conventional, 2 sequential write required) |
//! | 10 | 6 | zero |
//!
//! **Data area**, from the data offset `D` = the table end rounded up to the zone size:
//! zone `z` occupies `D + z * zone_size .. D + (z + 1) * zone_size`. On a file the image is
//! sparse: space is used only by written blocks, and a zone reset punches a hole.
//!
//! # Durability
//!
//! Every completed write updates its zone's table entry with a `pwrite` into the page cache
//! after the data `pwrite`, so if the process holding the image dies (even `kill -9`) every
//! completed write is in the image with the right write pointer, and no write pointer
//! covers data that was never written. [`ZonedDevice::flush`] is `fdatasync` of the whole
//! image (data and table), so after a power loss no write pointer is below data a flush
//! acknowledged. Data written after the last flush may be lost in a power loss while its
//! table entry survives (or the reverse); its blocks then read as zeros or as written, as
//! on a drive with a volatile write cache. On open, open zones become closed (or empty when
//! nothing was written), as on a drive at power-on.
//!
//! # Concurrency
//!
//! Data I/O runs outside the state lock: a per-zone lock serialises writes and zone
//! management on one zone, a short global lock covers conditions, write pointers and the
//! open/active accounting. Reads take only the global lock to learn the write pointer.
//!
//! An image is locked with `flock(LOCK_EX)` (and, on a block device, opened `O_EXCL`) while
//! a handle opened by [`Emulated::open`] or [`Emulated::create`] lives, so two daemons
//! cannot use one image; a second user gets an "in use" error.

use crate::options::{EmulateOptions, MIN_EMULATED_ZONE_SIZE};
use crate::state::{check_io, Changed, ZoneState, ZoneStates};
use crate::{
    Geometry, Result, ZbdError, Zone, ZoneCondition, ZoneOp, ZoneType, ZonedDevice, BLOCK_SIZE,
};
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Magic at byte 0 of an image.
pub const MAGIC: [u8; 8] = *b"ZONEDDEM";
/// Current layout version.
pub const VERSION: u32 = 1;
const HEADER_SIZE: u64 = 4096;
const ENTRY_SIZE: u64 = 16;

/// An emulated host-managed disk on a file or regular block device. See the module docs.
pub struct Emulated {
    file: File,
    path: PathBuf,
    geo: Geometry,
    nr_conv: u32,
    data_offset: u64,
    block_device: bool,
    state: Mutex<ZoneStates>,
    zone_locks: Vec<Mutex<()>>,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ZbdError {
    let what = what.into();
    move |source| ZbdError::Io { what, source }
}

pub(crate) fn cond_code(c: ZoneCondition) -> u8 {
    match c {
        ZoneCondition::NotWp => 0,
        ZoneCondition::Empty => 1,
        ZoneCondition::ImplicitOpen => 2,
        ZoneCondition::ExplicitOpen => 3,
        ZoneCondition::Closed => 4,
        ZoneCondition::ReadOnly => 0xd,
        ZoneCondition::Full => 0xe,
        ZoneCondition::Offline => 0xf,
    }
}

pub(crate) fn cond_from_code(c: u8) -> Option<ZoneCondition> {
    Some(match c {
        0 => ZoneCondition::NotWp,
        1 => ZoneCondition::Empty,
        2 => ZoneCondition::ImplicitOpen,
        3 => ZoneCondition::ExplicitOpen,
        4 => ZoneCondition::Closed,
        0xd => ZoneCondition::ReadOnly,
        0xe => ZoneCondition::Full,
        0xf => ZoneCondition::Offline,
        _ => return None,
    })
}

pub(crate) fn type_code(t: ZoneType) -> u8 {
    match t {
        ZoneType::Conventional => 1,
        ZoneType::SeqWriteRequired => 2,
        ZoneType::SeqWritePreferred => 3,
    }
}

/// Data area offset for `nr_zones` zones of `zone_size`.
fn data_offset(nr_zones: u32, zone_size: u64) -> u64 {
    let table_end = HEADER_SIZE + ENTRY_SIZE * nr_zones as u64;
    table_end.div_ceil(zone_size) * zone_size
}

fn encode_header(geo: &Geometry, nr_conv: u32) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_SIZE as usize];
    let d = data_offset(geo.nr_zones, geo.zone_size);
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
    h[16..24].copy_from_slice(&geo.zone_size.to_le_bytes());
    h[24..32].copy_from_slice(&geo.zone_capacity.to_le_bytes());
    h[32..36].copy_from_slice(&geo.nr_zones.to_le_bytes());
    h[36..40].copy_from_slice(&nr_conv.to_le_bytes());
    h[40..44].copy_from_slice(&geo.max_open_zones.to_le_bytes());
    h[44..48].copy_from_slice(&geo.max_active_zones.to_le_bytes());
    h[48..52].copy_from_slice(&geo.block_size.to_le_bytes());
    h[52..56].copy_from_slice(&(ENTRY_SIZE as u32).to_le_bytes());
    h[56..64].copy_from_slice(&HEADER_SIZE.to_le_bytes());
    h[64..72].copy_from_slice(&d.to_le_bytes());
    h[72..80].copy_from_slice(&(d + geo.capacity()).to_le_bytes());
    let crc = crc32fast::hash(&h[..4092]);
    h[4092..].copy_from_slice(&crc.to_le_bytes());
    h
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// Parses and checks a header: the geometry, conventional zones and data offset.
fn decode_header(h: &[u8], path: &Path) -> Result<(Geometry, u32, u64)> {
    let p = path.display();
    if h.len() < HEADER_SIZE as usize || h[0..8] != MAGIC {
        return Err(ZbdError::Open(format!(
            "{p} is not a zonedd emulated image (no {} magic)",
            String::from_utf8_lossy(&MAGIC)
        )));
    }
    let bad = |why: &str| Err(ZbdError::Open(format!("{p}: corrupt image header: {why}")));
    if u32_at(h, 8) != VERSION {
        return Err(ZbdError::Open(format!(
            "{p}: image version {} is not supported (this zonedd reads version {VERSION})",
            u32_at(h, 8)
        )));
    }
    if crc32fast::hash(&h[..4092]) != u32_at(h, 4092) {
        return bad("checksum mismatch");
    }
    let geo = Geometry {
        zone_size: u64_at(h, 16),
        zone_capacity: u64_at(h, 24),
        nr_zones: u32_at(h, 32),
        block_size: u32_at(h, 48),
        max_open_zones: u32_at(h, 40),
        max_active_zones: u32_at(h, 44),
    };
    let nr_conv = u32_at(h, 36);
    let d = u64_at(h, 64);
    let opts = EmulateOptions {
        size: geo.capacity(),
        zone_size: geo.zone_size,
        conventional: nr_conv,
        zone_capacity: geo.zone_capacity,
        max_open: geo.max_open_zones,
        max_active: geo.max_active_zones,
        force: false,
    };
    if let Err(e) = opts.geometry(MIN_EMULATED_ZONE_SIZE) {
        return bad(&e.to_string());
    }
    if geo.block_size as u64 != BLOCK_SIZE
        || u32_at(h, 52) as u64 != ENTRY_SIZE
        || u64_at(h, 56) != HEADER_SIZE
        || d != data_offset(geo.nr_zones, geo.zone_size)
        || u64_at(h, 72) != d + geo.capacity()
    {
        return bad("inconsistent layout fields");
    }
    Ok((geo, nr_conv, d))
}

/// Size of a file or block device.
pub(crate) fn file_size(file: &File, block_device: bool) -> std::io::Result<u64> {
    if block_device {
        nix::ioctl_read!(blkgetsize64, 0x12, 114, u64);
        let mut size = 0u64;
        // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid.
        unsafe { blkgetsize64(file.as_raw_fd(), &mut size) }.map_err(std::io::Error::from)?;
        Ok(size)
    } else {
        Ok(file.metadata()?.len())
    }
}

/// How long an open waits for a lock held by a process that is only passing through.
///
/// A process that forks while it holds the image open hands the child a copy of the fd
/// (and with it the lock) until the child's `exec` closes it: for that moment a closed
/// image still reads as locked. A zonedd daemon or tool that really holds the image keeps
/// it far longer than this.
pub(crate) const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes the image's exclusive lock, or says it is in use (after [`LOCK_GRACE`]).
pub(crate) fn lock_exclusive(file: &File, path: &Path) -> Result<()> {
    lock_within(file, path, LOCK_GRACE, || {})
}

/// [`lock_exclusive`] with its grace period; `on_busy` runs after each refused attempt.
fn lock_within(
    file: &File,
    path: &Path,
    grace: std::time::Duration,
    mut on_busy: impl FnMut(),
) -> Result<()> {
    let deadline = std::time::Instant::now() + grace;
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        // SAFETY: flock on an fd we own; no memory is passed. The lock lives as long as
        // the open file description.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(ZbdError::Io {
                what: format!("lock {}", path.display()),
                source: e,
            });
        }
        on_busy();
        let now = std::time::Instant::now();
        if now >= deadline {
            return Err(ZbdError::Open(format!(
                "{} is in use by another process (a zonedd daemon?): cannot lock it (EBUSY)",
                path.display()
            )));
        }
        // No event says when another process closes its copy: poll, backing off.
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(std::time::Duration::from_millis(50));
    }
}

/// Makes `len` bytes at `off` read as zeros, freeing space where possible.
fn punch(file: &File, off: u64, len: u64, must_zero: bool) -> Result<()> {
    use nix::fcntl::{fallocate, FallocateFlags};
    if len == 0 {
        return Ok(());
    }
    let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    match fallocate(file.as_raw_fd(), flags, off as i64, len as i64) {
        Ok(()) => Ok(()),
        Err(e) if must_zero => {
            tracing::debug!("punch hole failed ({e}); writing zeros");
            let zeros = vec![0u8; (1 << 20).min(len as usize)];
            let mut done = 0;
            while done < len {
                let n = (len - done).min(zeros.len() as u64) as usize;
                file.write_all_at(&zeros[..n], off + done)
                    .map_err(io_err("zero-fill"))?;
                done += n as u64;
            }
            Ok(())
        }
        Err(e) => {
            tracing::debug!("punch hole failed ({e}); space not freed");
            Ok(())
        }
    }
}

impl Emulated {
    /// Creates an image at `path` (a new or `force`d file, or a regular block device with
    /// `force`) and opens it, locked.
    pub fn create(path: &Path, opts: &EmulateOptions) -> Result<Emulated> {
        let p = path.display();
        let meta = std::fs::metadata(path).ok();
        let block_device = meta
            .as_ref()
            .is_some_and(|m| m.file_type().is_block_device());
        if let Some(m) = &meta {
            if !m.is_file() && !block_device {
                return Err(ZbdError::Open(format!(
                    "{p} is neither a regular file nor a block device"
                )));
            }
            if !opts.force && block_device {
                return Err(ZbdError::Open(format!(
                    "{p} is a block device; pass --force to overwrite its contents"
                )));
            }
            if !opts.force {
                return Err(ZbdError::Open(format!(
                    "{p} already exists; pass --force to overwrite it"
                )));
            }
        }
        if block_device {
            if let Some(model) = crate::sysfs_zoned_model(path) {
                if model != "none" {
                    return Err(ZbdError::Open(format!(
                        "{p} is already a zoned block device ({model}); use it directly"
                    )));
                }
            }
        }
        if !block_device {
            // Refuse bad options before creating anything.
            opts.geometry(MIN_EMULATED_ZONE_SIZE)?;
        }
        let mut oo = OpenOptions::new();
        oo.read(true).write(true);
        if block_device {
            oo.custom_flags(libc::O_EXCL);
        } else {
            oo.create(true);
        }
        let file = oo.open(path).map_err(io_err(format!("open {p}")))?;
        lock_exclusive(&file, path)?;
        let mut opts = opts.clone();
        if block_device {
            let dev = file_size(&file, true).map_err(io_err(format!("size of {p}")))?;
            let fit = |nr: u64| data_offset(nr as u32, opts.zone_size) + nr * opts.zone_size;
            let mut nr = dev / opts.zone_size.max(1);
            while nr > 0 && fit(nr) > dev {
                nr -= 1;
            }
            if opts.size == 0 {
                opts.size = nr * opts.zone_size;
                if opts.conventional == 0 {
                    opts.conventional = crate::options::default_conventional(nr as u32);
                }
            } else if opts.size > nr * opts.zone_size {
                return Err(ZbdError::Open(format!(
                    "{p} holds at most {} of zones plus the zone table; {} does not fit",
                    crate::options::fmt_size(nr * opts.zone_size),
                    crate::options::fmt_size(opts.size)
                )));
            }
        }
        let (geo, nr_conv) = opts.geometry(MIN_EMULATED_ZONE_SIZE)?;
        let d = data_offset(geo.nr_zones, geo.zone_size);
        if !block_device {
            // Truncate first so old data cannot show through the new (sparse) image.
            file.set_len(0).map_err(io_err(format!("truncate {p}")))?;
            file.set_len(d + geo.capacity())
                .map_err(io_err(format!("size {p}")))?;
        }
        let state = ZoneStates::fresh(geo, nr_conv);
        let mut table = vec![0u8; (ENTRY_SIZE * geo.nr_zones as u64) as usize];
        for z in 0..geo.nr_zones {
            encode_entry(&state, z, &mut table[(z as u64 * ENTRY_SIZE) as usize..]);
        }
        file.write_all_at(&table, HEADER_SIZE)
            .map_err(io_err(format!("write zone table of {p}")))?;
        if block_device {
            // Stale data past the table in the first zone-size region is never read; the
            // sequential zones read as zeros past their write pointers by construction.
            file.sync_data().map_err(io_err(format!("sync {p}")))?;
        }
        // Header last: an interrupted create leaves no valid image behind.
        file.write_all_at(&encode_header(&geo, nr_conv), 0)
            .map_err(io_err(format!("write header of {p}")))?;
        file.sync_all().map_err(io_err(format!("sync {p}")))?;
        Ok(Emulated::assemble(
            file,
            path,
            geo,
            nr_conv,
            d,
            block_device,
            state,
        ))
    }

    /// Opens an existing image, locked against other users.
    pub fn open(path: &Path) -> Result<Emulated> {
        Self::open_with(path, true)
    }

    /// Opens an existing image without taking the lock: for inspection (`zonedd report`)
    /// while a daemon may hold it. Do not write through such a handle.
    pub fn open_unlocked(path: &Path) -> Result<Emulated> {
        Self::open_with(path, false)
    }

    fn open_with(path: &Path, lock: bool) -> Result<Emulated> {
        let p = path.display();
        let meta = std::fs::metadata(path).map_err(io_err(format!("open {p}")))?;
        let block_device = meta.file_type().is_block_device();
        let mut oo = OpenOptions::new();
        oo.read(true).write(true);
        if block_device && lock {
            // flock is per device node; O_EXCL holds the device itself.
            oo.custom_flags(libc::O_EXCL);
        }
        let file = oo.open(path).map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                ZbdError::Open(format!("{p} is in use by another process: EBUSY"))
            } else {
                ZbdError::Io {
                    what: format!("open {p}"),
                    source: e,
                }
            }
        })?;
        if lock {
            lock_exclusive(&file, path)?;
        }
        let mut h = vec![0u8; HEADER_SIZE as usize];
        let n = read_up_to(&file, &mut h, 0).map_err(io_err(format!("read {p}")))?;
        h.truncate(n);
        let (geo, nr_conv, d) = decode_header(&h, path)?;
        let size = file_size(&file, block_device).map_err(io_err(format!("size of {p}")))?;
        if size < d + geo.capacity() {
            return Err(ZbdError::Open(format!(
                "{p}: image is truncated ({size} bytes, the header says {})",
                d + geo.capacity()
            )));
        }
        let mut table = vec![0u8; (ENTRY_SIZE * geo.nr_zones as u64) as usize];
        file.read_exact_at(&mut table, HEADER_SIZE)
            .map_err(io_err(format!("read zone table of {p}")))?;
        let mut zones = Vec::with_capacity(geo.nr_zones as usize);
        for z in 0..geo.nr_zones {
            let e = &table[(z as u64 * ENTRY_SIZE) as usize..][..ENTRY_SIZE as usize];
            let wp = u64_at(e, 0);
            let conv = z < nr_conv;
            let cond = cond_from_code(e[8]);
            let ok_type = e[9] == if conv { 1 } else { 2 };
            let Some(cond) = cond.filter(|c| {
                ok_type
                    && wp <= geo.zone_size
                    && wp.is_multiple_of(BLOCK_SIZE)
                    && match c {
                        ZoneCondition::NotWp => conv,
                        ZoneCondition::ReadOnly | ZoneCondition::Offline => true,
                        _ => !conv,
                    }
            }) else {
                return Err(ZbdError::Open(format!(
                    "{p}: corrupt zone table entry for zone {z}"
                )));
            };
            zones.push(ZoneState { cond, wp });
        }
        let state = ZoneStates::new(geo, nr_conv, zones);
        Ok(Emulated::assemble(
            file,
            path,
            geo,
            nr_conv,
            d,
            block_device,
            state,
        ))
    }

    fn assemble(
        file: File,
        path: &Path,
        geo: Geometry,
        nr_conv: u32,
        data_offset: u64,
        block_device: bool,
        state: ZoneStates,
    ) -> Emulated {
        Emulated {
            file,
            path: path.to_path_buf(),
            geo,
            nr_conv,
            data_offset,
            block_device,
            state: Mutex::new(state),
            zone_locks: (0..geo.nr_zones).map(|_| Mutex::new(())).collect(),
        }
    }

    /// Number of conventional zones (zones `0..n`).
    pub fn nr_conventional(&self) -> u32 {
        self.nr_conv
    }

    /// The image path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Test hook: force a zone read-only or offline (or back to empty / not-wp). Persisted.
    pub fn set_condition(&self, zone: u32, cond: ZoneCondition) -> Result<()> {
        let _zl = self.zone_lock(zone)?;
        let mut st = self.state.lock();
        let ch = st.set_condition(zone, cond)?;
        self.persist(&st, &ch)?;
        drop(st);
        if cond == ZoneCondition::Empty {
            self.punch_zone(zone, 0, false)?;
        }
        Ok(())
    }

    fn zone_lock(&self, zone: u32) -> Result<parking_lot::MutexGuard<'_, ()>> {
        self.zone_locks
            .get(zone as usize)
            .map(|l| l.lock())
            .ok_or_else(|| {
                ZbdError::Invalid(format!(
                    "zone {zone} does not exist ({} zones)",
                    self.geo.nr_zones
                ))
            })
    }

    /// Writes the table entries of `zones`. Called with the state lock held, so entries of
    /// one zone reach the table in the order of their changes.
    fn persist(&self, st: &ZoneStates, zones: &Changed) -> Result<()> {
        let mut e = [0u8; ENTRY_SIZE as usize];
        for &z in zones {
            encode_entry(st, z, &mut e);
            self.file
                .write_all_at(&e, HEADER_SIZE + z as u64 * ENTRY_SIZE)
                .map_err(io_err(format!("update zone table entry {z}")))?;
        }
        Ok(())
    }

    fn punch_zone(&self, zone: u32, from: u64, must_zero: bool) -> Result<()> {
        let start = self.data_offset + self.geo.zone_start(zone);
        punch(
            &self.file,
            start + from,
            self.geo.zone_size - from,
            must_zero,
        )
    }

    /// Writes `bufs` (total `len`) at device offset `offset`, with the zone rules.
    fn write_bufs(&self, bufs: &[&[u8]], offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            check_io(&self.geo, offset, 0, "write")?;
            return Ok(());
        }
        let z = check_io(&self.geo, offset, len, "write")?;
        let rel = offset - self.geo.zone_start(z);
        // Sequential zones: one writer (or zone operation) at a time.
        let _zl = if z >= self.nr_conv {
            Some(self.zone_locks[z as usize].lock())
        } else {
            None
        };
        {
            let mut st = self.state.lock();
            let ch = st.prepare_write(z, rel, len)?;
            self.persist(&st, &ch)?;
        }
        self.pwritev(bufs, self.data_offset + offset)?;
        if z >= self.nr_conv {
            let mut st = self.state.lock();
            let ch = st.complete_write(z, len);
            self.persist(&st, &ch)?;
        }
        Ok(())
    }

    fn pwritev(&self, bufs: &[&[u8]], mut pos: u64) -> Result<()> {
        if let [one] = bufs {
            return self
                .file
                .write_all_at(one, pos)
                .map_err(io_err(format!("write {}", self.path.display())));
        }
        for group in bufs.chunks(1024) {
            let iov: Vec<std::io::IoSlice<'_>> =
                group.iter().map(|b| std::io::IoSlice::new(b)).collect();
            let total: u64 = group.iter().map(|b| b.len() as u64).sum();
            let n =
                nix::sys::uio::pwritev(&self.file, &iov, pos as i64).map_err(|e| ZbdError::Io {
                    what: format!("write {}", self.path.display()),
                    source: e.into(),
                })? as u64;
            if n < total {
                // Short write: finish buffer by buffer.
                let mut skip = n;
                let mut p = pos + n;
                for b in group {
                    let bl = b.len() as u64;
                    if skip >= bl {
                        skip -= bl;
                        continue;
                    }
                    self.file
                        .write_all_at(&b[skip as usize..], p)
                        .map_err(io_err(format!("write {}", self.path.display())))?;
                    p += bl - skip;
                    skip = 0;
                }
            }
            pos += total;
        }
        Ok(())
    }
}

/// Reads as much as the file has (short at its end).
fn read_up_to(file: &File, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], pos + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn encode_entry(st: &ZoneStates, z: u32, e: &mut [u8]) {
    let zs = st.zones[z as usize];
    e[..ENTRY_SIZE as usize].fill(0);
    e[0..8].copy_from_slice(&zs.wp.to_le_bytes());
    e[8] = cond_code(zs.cond);
    e[9] = type_code(st.zone_type(z));
}

/// True when `head` (the first bytes of a file or device) starts with the image magic.
pub fn has_magic(head: &[u8]) -> bool {
    head.len() >= MAGIC.len() && head[..MAGIC.len()] == MAGIC
}

impl ZonedDevice for Emulated {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn report_zones(&self, first: u32, nr: u32) -> Result<Vec<Zone>> {
        Ok(self.state.lock().report(first, nr))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        let z = check_io(&self.geo, offset, len, "read")?;
        if len == 0 {
            return Ok(());
        }
        let rel = offset - self.geo.zone_start(z);
        let limit = self.state.lock().read_limit(z)?;
        let n = limit.saturating_sub(rel).min(len) as usize;
        if n > 0 {
            self.file
                .read_exact_at(&mut buf[..n], self.data_offset + offset)
                .map_err(io_err(format!("read {}", self.path.display())))?;
        }
        buf[n..].fill(0);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_bufs(&[buf], offset, buf.len() as u64)
    }

    fn writev_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.write_bufs(bufs, offset, len)
    }

    fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> Result<()> {
        let _zl = self.zone_lock(zone)?;
        if op == ZoneOp::Finish {
            // Blocks past the write pointer must read as zeros once the zone is full; where a
            // reset could not punch a hole (block devices) they may hold stale data. Zero
            // them before the state says full.
            let st = self.state.lock();
            let z = st.zones[zone as usize];
            let finishable = zone >= self.nr_conv
                && !matches!(
                    z.cond,
                    ZoneCondition::Full | ZoneCondition::ReadOnly | ZoneCondition::Offline
                );
            drop(st);
            if finishable {
                self.punch_zone(zone, z.wp, true)?;
            }
        }
        let mut st = self.state.lock();
        let ch = st.mgmt(op, zone)?;
        self.persist(&st, &ch)?;
        drop(st);
        if op == ZoneOp::Reset && !ch.is_empty() {
            // Only to free space: blocks past the write pointer read as zeros anyway.
            self.punch_zone(zone, 0, false)?;
        }
        Ok(())
    }

    fn reset_all(&self) -> Result<()> {
        let zones = self.state.lock().zones_to_reset();
        for z in zones {
            self.zone_mgmt(ZoneOp::Reset, z)?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(io_err(format!("flush {}", self.path.display())))
    }

    /// Data zone `z` sits at `data_offset + zone_start(z)` of the image, and `read_at` is a
    /// plain `pread` there below the write pointer.
    fn read_source(&self) -> Option<crate::ReadSource> {
        Some(crate::ReadSource {
            fd: self.file.as_raw_fd(),
            base: self.data_offset,
            direct: false,
            end: None,
            conv_writes: true,
            seq_writes: false,
        })
    }

    fn describe(&self) -> String {
        let on = if self.block_device {
            " (on a block device)"
        } else {
            ""
        };
        format!("emulated SMR image {}{on}", self.path.display())
    }

    fn set_zone_condition(&self, zone: u32, cond: ZoneCondition) -> Result<()> {
        self.set_condition(zone, cond)
    }
}

#[cfg(test)]
mod lock_tests {
    use super::*;
    use std::time::Duration;

    fn open(path: &Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap()
    }

    #[test]
    fn a_lock_released_while_waiting_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i.img");
        // Another open file description holds the lock, as a forked child's copy would.
        let mut holder = Some(open(&path));
        lock_within(holder.as_ref().unwrap(), &path, Duration::ZERO, || {}).unwrap();
        let mine = open(&path);
        let mut refused = 0;
        lock_within(&mine, &path, Duration::from_secs(600), || {
            refused += 1;
            holder = None; // the child execs: its copy closes
        })
        .unwrap();
        assert_eq!(refused, 1, "the first attempt met the other holder");
    }

    #[test]
    fn a_lock_held_past_the_grace_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i.img");
        let holder = open(&path);
        lock_exclusive(&holder, &path).unwrap();
        let mine = open(&path);
        let mut refused = 0;
        let e = lock_within(&mine, &path, Duration::from_millis(20), || refused += 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("in use by another process") && e.contains("EBUSY"),
            "{e}"
        );
        assert!(refused >= 1);
    }
}
