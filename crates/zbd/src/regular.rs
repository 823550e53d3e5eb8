//! A regular (randomly writable) device cut into emulated zones: the cache device of a
//! dm-zoned multi-device volume (reference §3.5).
//!
//! [`RegularDevice`] presents a plain file, a regular block device or a RAM buffer as
//! conventional zones of a given size (the zoned drives' zone size). The bytes map one to
//! one (zone `z` is bytes `z * zone_size ..`), with no header, exactly as the kernel's
//! dm-zoned and dmzadm see the device. When the size is not a multiple of the zone size the
//! trailing runt zone is reported shorter and offline, as the kernel marks it: no I/O goes
//! to it. Flush is `fdatasync` (nothing for RAM).
//!
//! A block device is opened `O_DIRECT` (as a zoned drive is, [`crate::BlockDevice`]; its
//! I/O goes through the same per-thread ring and bounce buffers) and then offers a
//! [`crate::ReadSource`], through which the frontend's queue threads read and write the
//! cache zones themselves (docs/design.md, "Hop-free writes on a multi-device volume"). A
//! plain file stays buffered and offers none, as an emulated image's data goes through the
//! pool (`create::ring_fd`); so does a block device that refuses `O_DIRECT`.

use crate::state::check_io;
use crate::{Geometry, Result, ZbdError, Zone, ZoneCondition, ZoneOp, ZoneType, ZonedDevice};
use parking_lot::RwLock;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

enum Backing {
    File {
        file: File,
        path: PathBuf,
        /// Opened `O_DIRECT`: I/O through `blockdev::direct_read`/`direct_write`.
        direct: bool,
    },
    Mem(RwLock<Vec<u8>>),
}

/// A regular device presented as conventional zones (see the module docs).
pub struct RegularDevice {
    geo: Geometry,
    /// Bytes of the device; the last zone is a runt when this is not a zone multiple.
    size: u64,
    backing: Backing,
}

impl RegularDevice {
    /// A RAM device of `size` bytes in zones of `zone_size`.
    pub fn new_mem(size: u64, zone_size: u64) -> Result<RegularDevice> {
        let geo = geometry(size, zone_size, "memory cache device")?;
        let len = usize::try_from(size).map_err(|_| ZbdError::Invalid("size too large".into()))?;
        Ok(RegularDevice {
            geo,
            size,
            backing: Backing::Mem(RwLock::new(vec![0; len])),
        })
    }

    /// Opens a regular file or a regular block device. `exclusive` locks it (`flock`, and
    /// `O_EXCL` on a block device) against a second user. A block device is opened
    /// `O_DIRECT` (buffered when it refuses), a file buffered (see the module docs).
    pub fn open(path: &Path, zone_size: u64, exclusive: bool) -> Result<RegularDevice> {
        Self::open_as(path, zone_size, exclusive, None)
    }

    /// [`RegularDevice::open`], but `O_DIRECT` whatever `path` is, a file too (an error
    /// where the file system refuses it): a file then behaves as a block device would.
    pub fn open_direct(path: &Path, zone_size: u64, exclusive: bool) -> Result<RegularDevice> {
        Self::open_as(path, zone_size, exclusive, Some(true))
    }

    fn open_as(
        path: &Path,
        zone_size: u64,
        exclusive: bool,
        direct: Option<bool>,
    ) -> Result<RegularDevice> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let p = path.display();
        let meta = std::fs::metadata(path).map_err(|e| ZbdError::Open(format!("{p}: {e}")))?;
        let is_blk = meta.file_type().is_block_device();
        let open = |direct: bool| {
            let mut oo = std::fs::OpenOptions::new();
            oo.read(true).write(true);
            let excl = if is_blk && exclusive { libc::O_EXCL } else { 0 };
            oo.custom_flags(excl | if direct { libc::O_DIRECT } else { 0 });
            oo.open(path)
        };
        let (file, direct) = match (direct, open(direct.unwrap_or(is_blk))) {
            // A block device without O_DIRECT (EINVAL): buffered, without a read source.
            (None, Err(e)) if is_blk && e.raw_os_error() == Some(libc::EINVAL) => {
                (open(false), false)
            }
            (d, r) => (r, d.unwrap_or(is_blk)),
        };
        let file = file.map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                ZbdError::Open(format!("{p} is in use by another process: EBUSY"))
            } else {
                ZbdError::Open(format!("{p}: {e}"))
            }
        })?;
        if exclusive {
            crate::emulated::lock_exclusive(&file, path)?;
        }
        let size = crate::emulated::file_size(&file, is_blk).map_err(|e| ZbdError::Io {
            what: format!("size of {p}"),
            source: e,
        })?;
        let geo = geometry(size, zone_size, &p.to_string())?;
        Ok(RegularDevice {
            geo,
            size,
            backing: Backing::File {
                file,
                path: path.to_path_buf(),
                direct,
            },
        })
    }

    /// Whether zone `z` is the offline runt.
    fn is_runt(&self, z: u32) -> bool {
        self.geo.zone_start(z) + self.geo.zone_size > self.size
    }

    fn check(&self, offset: u64, len: u64, what: &str) -> Result<()> {
        let z = check_io(&self.geo, offset, len, what)?;
        if len > 0 && self.is_runt(z) {
            return Err(crate::state::eio(format!(
                "{what} at {offset:#x}: zone {z} is offline (the runt at the device end)"
            )));
        }
        Ok(())
    }
}

fn geometry(size: u64, zone_size: u64, what: &str) -> Result<Geometry> {
    if !zone_size.is_power_of_two() || zone_size < crate::BLOCK_SIZE {
        return Err(ZbdError::Invalid(format!(
            "{what}: zone size {zone_size} is not a power of two of at least 4096 bytes"
        )));
    }
    let nr_zones = u32::try_from(size.div_ceil(zone_size))
        .map_err(|_| ZbdError::Open(format!("{what}: too many zones")))?;
    if nr_zones == 0 {
        return Err(ZbdError::Open(format!("{what}: the device is empty")));
    }
    Ok(Geometry {
        zone_size,
        zone_capacity: zone_size,
        nr_zones,
        block_size: crate::BLOCK_SIZE as u32,
        max_open_zones: 0,
        max_active_zones: 0,
    })
}

impl ZonedDevice for RegularDevice {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn report_zones(&self, first: u32, nr: u32) -> Result<Vec<Zone>> {
        let end = first.saturating_add(nr).min(self.geo.nr_zones);
        Ok((first..end)
            .map(|z| {
                let start = self.geo.zone_start(z);
                let runt = self.is_runt(z);
                let len = if runt {
                    self.size - start
                } else {
                    self.geo.zone_size
                };
                Zone {
                    id: z,
                    start,
                    len,
                    capacity: len,
                    wp: start,
                    zone_type: ZoneType::Conventional,
                    cond: if runt {
                        ZoneCondition::Offline
                    } else {
                        ZoneCondition::NotWp
                    },
                }
            })
            .collect())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64, "read")?;
        match &self.backing {
            Backing::File { file, path, direct } => if *direct {
                crate::blockdev::direct_read(file.as_raw_fd(), buf, offset)
            } else {
                file.read_exact_at(buf, offset)
            }
            .map_err(|e| ZbdError::Io {
                what: format!("read {} at {offset:#x}", path.display()),
                source: e,
            }),
            Backing::Mem(m) => {
                let o = offset as usize;
                buf.copy_from_slice(&m.read()[o..o + buf.len()]);
                Ok(())
            }
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64, "write")?;
        match &self.backing {
            Backing::File { file, path, direct } => if *direct {
                crate::blockdev::direct_write(file.as_raw_fd(), buf, offset)
            } else {
                file.write_all_at(buf, offset)
            }
            .map_err(|e| ZbdError::Io {
                what: format!("write {} at {offset:#x}", path.display()),
                source: e,
            }),
            Backing::Mem(m) => {
                let o = offset as usize;
                m.write()[o..o + buf.len()].copy_from_slice(buf);
                Ok(())
            }
        }
    }

    fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> Result<()> {
        if zone >= self.geo.nr_zones {
            return Err(ZbdError::Invalid(format!("zone {zone} does not exist")));
        }
        // Like the kernel on a conventional zone: a reset is a no-op, the rest is refused.
        match op {
            ZoneOp::Reset => Ok(()),
            _ => Err(crate::state::eio(format!(
                "{op} of zone {zone}: a regular device has no write pointers"
            ))),
        }
    }

    fn reset_all(&self) -> Result<()> {
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        match &self.backing {
            Backing::File { file, path, .. } => file.sync_data().map_err(|e| ZbdError::Io {
                what: format!("flush {}", path.display()),
                source: e,
            }),
            Backing::Mem(_) => Ok(()),
        }
    }

    /// Only an `O_DIRECT` block device (see the module docs). Its bytes map one to one.
    fn read_source(&self) -> Option<crate::ReadSource> {
        match &self.backing {
            Backing::File {
                file, direct: true, ..
            } => Some(crate::ReadSource {
                fd: file.as_raw_fd(),
                base: 0,
                end: None,
                direct: true,
                conv_writes: true,
                seq_writes: false,
            }),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match &self.backing {
            Backing::File { path, .. } => format!("regular device {}", path.display()),
            Backing::Mem(_) => "regular device in memory".to_string(),
        }
    }
}
