//! dm-zoned metadata v2, byte for byte: the superblock, its CRC, map and bitmap blocks, and
//! the layout (sizing and addressing) derived from a zone report.
//!
//! Everything here is pure: no I/O. [`crate::sets`] reads and writes these structures.
//! Units: a "block" is 4 KiB; a metadata block number (`mblk`) is relative to the start of a
//! metadata set; `sb_block` and [`Layout::set_start_block`] are absolute 4 KiB block numbers.

use std::fmt;
use std::mem::offset_of;

use zbd::{Geometry, Zone, ZoneCondition, ZoneType};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `('D'<<24)|('Z'<<16)|('B'<<8)|'D'`, stored little-endian ("DBZD" on disk).
pub const DMZ_MAGIC: u32 = 0x445A_4244;
/// The only metadata version zonedd reads and writes.
pub const META_VERSION: u32 = 2;
/// A map entry field that points nowhere.
pub const MAP_UNMAPPED: u32 = u32::MAX;
/// The metadata (and I/O) block size.
pub const BLOCK: usize = 4096;
/// 8-byte map entries per 4 KiB map block.
pub const MAP_ENTRIES_PER_BLOCK: usize = BLOCK / 8;
/// Validity bits per 4 KiB bitmap block.
pub const BITS_PER_BITMAP_BLOCK: u32 = (BLOCK * 8) as u32;
/// Bytes of the label field (31 characters and a NUL at most).
pub const LABEL_LEN: usize = 32;

/// The superblock block as stored (`struct dmz_super` v2, see docs/design.md, "On-disk
/// format"): little-endian fields from byte 0, then reserved bytes, zero when written and
/// covered by the CRC, to the end of the 4 KiB block.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
struct RawSuperblock {
    magic: U32,
    version: U32,
    gen: U64,
    sb_block: U64,
    nr_meta_blocks: U32,
    nr_reserved_seq: U32,
    nr_chunks: U32,
    nr_map_blocks: U32,
    nr_bitmap_blocks: U32,
    crc: U32,
    label: [u8; LABEL_LEN],
    set_uuid: [u8; 16],
    dev_uuid: [u8; 16],
    reserved: [u8; BLOCK - 112],
}

// One whole block, every field at its dm-zoned offset.
const _: () = assert!(size_of::<RawSuperblock>() == BLOCK);
const _: () = assert!(offset_of!(RawSuperblock, version) == 4);
const _: () = assert!(offset_of!(RawSuperblock, gen) == 8);
const _: () = assert!(offset_of!(RawSuperblock, sb_block) == 16);
const _: () = assert!(offset_of!(RawSuperblock, nr_meta_blocks) == 24);
const _: () = assert!(offset_of!(RawSuperblock, nr_reserved_seq) == 28);
const _: () = assert!(offset_of!(RawSuperblock, nr_chunks) == 32);
const _: () = assert!(offset_of!(RawSuperblock, nr_map_blocks) == 36);
const _: () = assert!(offset_of!(RawSuperblock, nr_bitmap_blocks) == 40);
const _: () = assert!(offset_of!(RawSuperblock, crc) == 44);
const _: () = assert!(offset_of!(RawSuperblock, label) == 48);
const _: () = assert!(offset_of!(RawSuperblock, set_uuid) == 80);
const _: () = assert!(offset_of!(RawSuperblock, dev_uuid) == 96);
const _: () = assert!(offset_of!(RawSuperblock, reserved) == 112);

/// Why metadata (or a device for it) is unacceptable. Messages are one line, for users.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("superblock too short: {0} bytes, need {BLOCK}")]
    Short(usize),
    #[error("bad magic 0x{found:08x} (expected 0x{DMZ_MAGIC:08x})")]
    BadMagic { found: u32 },
    #[error("metadata v1 is not supported (only dm-zoned metadata v2, Linux 5.8 and later)")]
    Version1,
    #[error("unsupported metadata version {0} (expected 2)")]
    BadVersion(u32),
    #[error("bad superblock CRC: stored 0x{stored:08x}, computed 0x{computed:08x}")]
    BadCrc { stored: u32, computed: u32 },
    /// A superblock field disagrees with the device or with the other fields.
    #[error("bad superblock field {field}: {found}, expected {expected}")]
    BadField {
        field: &'static str,
        found: u64,
        expected: String,
    },
    /// The device cannot hold dm-zoned metadata (geometry, zone types, too small).
    #[error("{0}")]
    Device(String),
    /// No dm-zoned superblock at all.
    #[error("{0}")]
    NotFormatted(String),
    /// Superblocks present but unusable, or inconsistent sets.
    #[error("corrupt superblock: {0}")]
    Corrupt(String),
    /// A bad argument (label too long, reserved zones 0, ...).
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Zbd(#[from] zbd::ZbdError),
}

pub type Result<T> = std::result::Result<T, FormatError>;

/// Linux `crc32_le(seed, data)`: the raw reflected CRC-32 update (poly 0xEDB88320) with no
/// inversion on entry or exit. crc32fast inverts on both ends, hence the `!`s.
pub fn linux_crc32(seed: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(!seed);
    h.update(data);
    !h.finalize()
}

/// True when `block` starts with the dm-zoned magic (whatever else it holds).
pub fn has_magic(block: &[u8]) -> bool {
    U32::read_from_prefix(block).is_ok_and(|(magic, _)| magic.get() == DMZ_MAGIC)
}

/// `struct dmz_super` (v2). Magic and version are implied; the CRC is computed on encode and
/// checked on decode.
#[derive(Clone, PartialEq, Eq)]
pub struct Superblock {
    pub gen: u64,
    /// Absolute 4 KiB block number of this superblock.
    pub sb_block: u64,
    pub nr_meta_blocks: u32,
    pub nr_reserved_seq: u32,
    pub nr_chunks: u32,
    pub nr_map_blocks: u32,
    pub nr_bitmap_blocks: u32,
    /// NUL-padded; the kernel uses it as the DM device name.
    pub label: [u8; LABEL_LEN],
    pub set_uuid: [u8; 16],
    pub dev_uuid: [u8; 16],
}

impl fmt::Debug for Superblock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Superblock")
            .field("gen", &self.gen)
            .field("sb_block", &self.sb_block)
            .field("nr_meta_blocks", &self.nr_meta_blocks)
            .field("nr_reserved_seq", &self.nr_reserved_seq)
            .field("nr_chunks", &self.nr_chunks)
            .field("nr_map_blocks", &self.nr_map_blocks)
            .field("nr_bitmap_blocks", &self.nr_bitmap_blocks)
            .field("label", &self.label_str())
            .field("set_uuid", &uuid_string(&self.set_uuid))
            .field("dev_uuid", &uuid_string(&self.dev_uuid))
            .finish()
    }
}

/// The canonical 8-4-4-4-12 form, lowercase, of a UUID field (bytes in on-disk order).
pub fn uuid_string(u: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*u).hyphenated().to_string()
}

/// Turn a label into the on-disk field: at most 31 bytes, no NUL inside.
pub fn label_field(label: &str) -> Result<[u8; LABEL_LEN]> {
    let b = label.as_bytes();
    if b.is_empty() || b.len() >= LABEL_LEN {
        return Err(FormatError::Invalid(format!(
            "label {label:?} must be 1 to {} bytes long",
            LABEL_LEN - 1
        )));
    }
    if b.contains(&0) || label.contains('/') {
        return Err(FormatError::Invalid(format!(
            "label {label:?} must not contain NUL or '/'"
        )));
    }
    let mut out = [0u8; LABEL_LEN];
    out[..b.len()].copy_from_slice(b);
    Ok(out)
}

impl Superblock {
    /// The label up to its first NUL (lossy for non-UTF-8 bytes).
    pub fn label_str(&self) -> String {
        let end = self.label.iter().position(|&c| c == 0).unwrap_or(LABEL_LEN);
        String::from_utf8_lossy(&self.label[..end]).into_owned()
    }

    /// The full 4 KiB block, CRC included; bytes 112.. are zero.
    pub fn encode(&self) -> Box<[u8; BLOCK]> {
        let mut b = Box::new([0u8; BLOCK]);
        let raw = RawSuperblock::mut_from_bytes(&mut b[..]).expect("a block is a superblock");
        raw.magic = DMZ_MAGIC.into();
        raw.version = META_VERSION.into();
        raw.gen = self.gen.into();
        raw.sb_block = self.sb_block.into();
        raw.nr_meta_blocks = self.nr_meta_blocks.into();
        raw.nr_reserved_seq = self.nr_reserved_seq.into();
        raw.nr_chunks = self.nr_chunks.into();
        raw.nr_map_blocks = self.nr_map_blocks.into();
        raw.nr_bitmap_blocks = self.nr_bitmap_blocks.into();
        raw.label = self.label;
        raw.set_uuid = self.set_uuid;
        raw.dev_uuid = self.dev_uuid;
        // The seed is the generation truncated to 32 bits, like the kernel's crc32_le(gen, ...),
        // over the block with the CRC field still zero.
        raw.crc = linux_crc32(self.gen as u32, raw.as_bytes()).into();
        b
    }

    /// Parse and verify magic, version and CRC of a superblock block (the first 4096 bytes of
    /// `block`). Field consistency against a device is [`Layout::from_superblock`]'s job.
    pub fn decode(block: &[u8]) -> Result<Superblock> {
        if block.len() < BLOCK {
            return Err(FormatError::Short(block.len()));
        }
        // A copy: the CRC is computed with its own field zeroed.
        let mut raw =
            RawSuperblock::read_from_bytes(&block[..BLOCK]).expect("a block is a superblock");
        let magic = raw.magic.get();
        if magic != DMZ_MAGIC {
            return Err(FormatError::BadMagic { found: magic });
        }
        match raw.version.get() {
            META_VERSION => {}
            1 => return Err(FormatError::Version1),
            v => return Err(FormatError::BadVersion(v)),
        }
        let gen = raw.gen.get();
        let stored = raw.crc.get();
        raw.crc = U32::new(0);
        let computed = linux_crc32(gen as u32, raw.as_bytes());
        if stored != computed {
            return Err(FormatError::BadCrc { stored, computed });
        }
        Ok(Superblock {
            gen,
            sb_block: raw.sb_block.get(),
            nr_meta_blocks: raw.nr_meta_blocks.get(),
            nr_reserved_seq: raw.nr_reserved_seq.get(),
            nr_chunks: raw.nr_chunks.get(),
            nr_map_blocks: raw.nr_map_blocks.get(),
            nr_bitmap_blocks: raw.nr_bitmap_blocks.get(),
            label: raw.label,
            set_uuid: raw.set_uuid,
            dev_uuid: raw.dev_uuid,
        })
    }
}

/// A map entry as stored (`struct dmz_map`): two little-endian zone numbers.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
struct RawMapEntry {
    dzone: U32,
    bzone: U32,
}

const MAP_ENTRY_LEN: usize = size_of::<RawMapEntry>();
const _: () = assert!(MAP_ENTRY_LEN == 8);
const _: () = assert!(offset_of!(RawMapEntry, bzone) == 4);
const _: () = assert!(MAP_ENTRIES_PER_BLOCK * MAP_ENTRY_LEN == BLOCK);

/// One chunk mapping entry (`struct dmz_map`): data zone and optional buffer zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MapEntry {
    pub dzone: u32,
    pub bzone: u32,
}

impl MapEntry {
    pub const UNMAPPED: MapEntry = MapEntry {
        dzone: MAP_UNMAPPED,
        bzone: MAP_UNMAPPED,
    };

    pub fn is_mapped(&self) -> bool {
        self.dzone != MAP_UNMAPPED
    }

    pub fn has_buffer(&self) -> bool {
        self.bzone != MAP_UNMAPPED
    }

    /// Entry `index` (0..512) of a map block.
    pub fn read(block: &[u8], index: usize) -> MapEntry {
        let (raw, _) = RawMapEntry::ref_from_prefix(&block[index * MAP_ENTRY_LEN..])
            .expect("map entry inside the block");
        MapEntry {
            dzone: raw.dzone.get(),
            bzone: raw.bzone.get(),
        }
    }

    /// Store this entry at `index` (0..512) of a map block.
    pub fn write(&self, block: &mut [u8], index: usize) {
        let raw = RawMapEntry {
            dzone: self.dzone.into(),
            bzone: self.bzone.into(),
        };
        raw.write_to_prefix(&mut block[index * MAP_ENTRY_LEN..])
            .expect("map entry inside the block");
    }
}

/// The 512 entries of a map block.
pub fn decode_map_block(block: &[u8]) -> Vec<MapEntry> {
    (0..MAP_ENTRIES_PER_BLOCK)
        .map(|i| MapEntry::read(block, i))
        .collect()
}

/// A map block from up to 512 entries; missing entries are unmapped (all 0xFF).
pub fn encode_map_block(entries: &[MapEntry]) -> Box<[u8; BLOCK]> {
    let mut b = Box::new([0xFFu8; BLOCK]);
    for (i, e) in entries.iter().take(MAP_ENTRIES_PER_BLOCK).enumerate() {
        e.write(&mut b[..], i);
    }
    b
}

/// Bit `bit` of a bitmap (LSB-first bytes, as Linux `test_bit` on little-endian).
pub fn test_bit(bitmap: &[u8], bit: u32) -> bool {
    bitmap[(bit >> 3) as usize] & (1 << (bit & 7)) != 0
}

pub fn set_bit(bitmap: &mut [u8], bit: u32) {
    bitmap[(bit >> 3) as usize] |= 1 << (bit & 7);
}

pub fn clear_bit(bitmap: &mut [u8], bit: u32) {
    bitmap[(bit >> 3) as usize] &= !(1 << (bit & 7));
}

/// Number of set bits in `bitmap`.
pub fn count_bits(bitmap: &[u8]) -> u64 {
    bitmap.iter().map(|b| b.count_ones() as u64).sum()
}

/// Set bits among the first `nbits` of `bitmap`, in increasing order.
pub fn iter_set_bits(bitmap: &[u8], nbits: u32) -> impl Iterator<Item = u32> + '_ {
    let nbytes = nbits.div_ceil(8) as usize;
    bitmap[..nbytes.min(bitmap.len())]
        .iter()
        .enumerate()
        .filter(|(_, &b)| b != 0)
        .flat_map(move |(i, &b)| {
            (0..8u32)
                .filter(move |k| b & (1 << k) != 0)
                .map(move |k| i as u32 * 8 + k)
        })
        .filter(move |&bit| bit < nbits)
}

/// Everything derived from a zone report and a superblock: sizes and addresses.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Layout {
    /// 4 KiB blocks per zone (a power of two).
    pub zone_blocks: u32,
    /// log2(zone_blocks).
    pub zone_blocks_shift: u32,
    pub nr_zones: u32,
    /// Zones dm-zoned can use: all but offline, read-only and runt zones.
    pub nr_usable_zones: u32,
    /// Usable conventional (randomly writable) zones, metadata zones included.
    pub nr_rnd_zones: u32,
    /// Bitmap blocks per zone: max(1, zone_blocks / 32768).
    pub zone_bitmap_blocks: u32,
    pub nr_map_blocks: u32,
    pub nr_bitmap_blocks: u32,
    /// Blocks per set: 1 + map + bitmap.
    pub nr_meta_blocks: u32,
    /// Zones per set.
    pub nr_meta_zones: u32,
    pub nr_chunks: u32,
    pub nr_reserved_seq: u32,
    /// First zone of set 0 (primary location) and set 1 (right after it).
    pub set_zone: [u32; 2],
    /// Zones that went offline or read-only after the format, that the superblock's sizing
    /// still counts as usable: the volume runs degraded, with fewer spare zones. 0 when the
    /// layout satisfies the kernel's rules as they stand.
    pub nr_lost_zones: u32,
    /// Multi-device volumes: the first zone of each zoned drive, holding its tertiary
    /// superblock (a metadata zone, never data). Empty on a single device.
    pub tertiary_zones: Vec<u32>,
}

/// Which zones of a device are the cache device and where each zoned drive starts, from
/// [`zbd::ZonedDevice::members`]: a single device has neither.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    /// Zones `0..n` are the regular cache device's (runt included).
    pub cache_zones: Option<u32>,
    /// First zone of each zoned drive.
    pub drive_starts: Vec<u32>,
}

impl Shape {
    pub fn of(members: &[zbd::Member]) -> Shape {
        match members {
            [cache, drives @ ..] if cache.cache && !drives.is_empty() => Shape {
                cache_zones: Some(cache.nr_zones),
                drive_starts: drives.iter().map(|m| m.first_zone).collect(),
            },
            _ => Shape::default(),
        }
    }
}

/// What the sizing depends on, gathered from a zone report.
#[derive(Clone, Copy)]
struct ZoneCensus {
    zone_blocks: u32,
    shift: u32,
    nr_zones: u32,
    usable: u32,
    rnd: u32,
    first_rnd: Option<u32>,
    /// Full-size zones offline or read-only (not counted in `usable`), and the conventional
    /// ones among them.
    lost: u32,
    lost_rnd: u32,
    first_lost_rnd: Option<u32>,
}

impl ZoneCensus {
    /// The census as it was before the lost zones were lost.
    fn with_lost(&self) -> ZoneCensus {
        ZoneCensus {
            usable: self.usable + self.lost,
            rnd: self.rnd + self.lost_rnd,
            first_rnd: match (self.first_rnd, self.first_lost_rnd) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            lost: 0,
            lost_rnd: 0,
            first_lost_rnd: None,
            ..*self
        }
    }
}

/// The sizes dmzadm derives from usable zones, bitmap size and reserved zones.
struct Sizing {
    nr_chunks: u32,
    nr_map_blocks: u32,
    nr_meta_blocks: u32,
    nr_meta_zones: u32,
}

fn bad_field(field: &'static str, found: u64, expected: String) -> FormatError {
    FormatError::BadField {
        field,
        found,
        expected,
    }
}

fn dev_err(msg: impl Into<String>) -> FormatError {
    FormatError::Device(msg.into())
}

fn census(zones: &[Zone], geometry: &Geometry, shape: &Shape) -> Result<ZoneCensus> {
    let zs = geometry.zone_size;
    if !zs.is_power_of_two() || zs < BLOCK as u64 {
        return Err(dev_err(format!(
            "zone size {zs} bytes is not a power of two multiple of 4096; dm-zoned needs one"
        )));
    }
    if geometry.zone_capacity != zs {
        return Err(dev_err(
            "zone capacity < zone size (ZNS) is not supported by the v2 format",
        ));
    }
    if !geometry.block_size.is_power_of_two() || geometry.block_size > BLOCK as u32 {
        return Err(dev_err(format!(
            "logical block size {} does not divide 4096",
            geometry.block_size
        )));
    }
    let zone_blocks = zs / BLOCK as u64;
    let zone_blocks = u32::try_from(zone_blocks)
        .map_err(|_| dev_err(format!("zone size {zs} bytes is too large")))?;
    if zones.len() != geometry.nr_zones as usize {
        return Err(dev_err(format!(
            "zone report has {} zones, geometry says {}",
            zones.len(),
            geometry.nr_zones
        )));
    }
    let mut c = ZoneCensus {
        zone_blocks,
        shift: zone_blocks.trailing_zeros(),
        nr_zones: geometry.nr_zones,
        usable: 0,
        rnd: 0,
        first_rnd: None,
        lost: 0,
        lost_rnd: 0,
        first_lost_rnd: None,
    };
    for (i, z) in zones.iter().enumerate() {
        if z.id as usize != i || z.start != i as u64 * zs {
            return Err(dev_err(format!(
                "zone report entry {i} is zone {} at byte {}: not contiguous",
                z.id, z.start
            )));
        }
        if z.len == zs && z.capacity != z.len {
            return Err(dev_err(
                "zone capacity < zone size (ZNS) is not supported by the v2 format",
            ));
        }
        // Multi-device (reference §3.5): every zone of the cache device is a cache zone and
        // usable, the runt included (the kernel and dmzadm count it; the kernel then keeps it
        // offline); only cache zones can hold metadata. Conventional zones of the drives
        // are usable data zones, not cache zones.
        if let Some(n) = shape.cache_zones {
            if z.id < n {
                c.usable += 1;
                c.rnd += 1;
                if c.first_rnd.is_none() && z.len == zs {
                    c.first_rnd = Some(z.id);
                }
                continue;
            }
        }
        // Like the kernel: a runt zone is offline; offline and read-only zones are not usable.
        if z.len != zs {
            continue;
        }
        if matches!(z.cond, ZoneCondition::Offline | ZoneCondition::ReadOnly) {
            c.lost += 1;
            if z.zone_type == ZoneType::Conventional && shape.cache_zones.is_none() {
                c.lost_rnd += 1;
                c.first_lost_rnd.get_or_insert(z.id);
            }
            continue;
        }
        c.usable += 1;
        if z.zone_type == ZoneType::Conventional && shape.cache_zones.is_none() {
            c.rnd += 1;
            if c.first_rnd.is_none() {
                c.first_rnd = Some(z.id);
            }
        }
    }
    Ok(c)
}

fn zone_bitmap_blocks(zone_blocks: u32) -> u32 {
    (zone_blocks / BITS_PER_BITMAP_BLOCK).max(1)
}

/// dmzadm's two-step sizing: estimate the map with the bitmap zones only, size the sets, then
/// fix the chunk count and the map.
fn size(c: &ZoneCensus, nr_bitmap_blocks: u32, reserved: u32) -> Result<Sizing> {
    let zb = c.zone_blocks;
    let bitmap_zones = nr_bitmap_blocks.div_ceil(zb);
    if bitmap_zones as u64 + reserved as u64 >= c.usable as u64 {
        return Err(dev_err(format!(
            "not enough zones: {} usable, {bitmap_zones} needed for bitmaps and {reserved} reserved",
            c.usable
        )));
    }
    let est_chunks = c.usable - bitmap_zones - reserved;
    let est_map = est_chunks.div_ceil(MAP_ENTRIES_PER_BLOCK as u32);
    let est_meta_blocks = 1u64 + est_map as u64 + nr_bitmap_blocks as u64;
    let meta_zones = est_meta_blocks.div_ceil(zb as u64) as u32;
    let overhead = 2 * meta_zones as u64 + reserved as u64;
    if overhead >= c.usable as u64 {
        return Err(dev_err(format!(
            "not enough zones: {} usable, {} needed for metadata and {reserved} reserved",
            c.usable,
            2 * meta_zones
        )));
    }
    let nr_chunks = c.usable - overhead as u32;
    let nr_map_blocks = nr_chunks.div_ceil(MAP_ENTRIES_PER_BLOCK as u32);
    let nr_meta_blocks = 1u64 + nr_map_blocks as u64 + nr_bitmap_blocks as u64;
    let nr_meta_blocks = u32::try_from(nr_meta_blocks)
        .map_err(|_| dev_err("metadata does not fit 32-bit block counts"))?;
    Ok(Sizing {
        nr_chunks,
        nr_map_blocks,
        nr_meta_blocks,
        nr_meta_zones: nr_meta_blocks.div_ceil(zb),
    })
}

impl Layout {
    /// Whether the device can hold dm-zoned metadata at all (zone size, capacity, report),
    /// whatever its superblocks say.
    pub fn check_device(zones: &[Zone], geometry: &Geometry) -> Result<()> {
        census(zones, geometry, &Shape::default()).map(|_| ())
    }

    /// [`Layout::compute_on`] for a single device.
    pub fn compute(zones: &[Zone], geometry: &Geometry, reserved_seq: u32) -> Result<Layout> {
        Self::compute_on(zones, geometry, &Shape::default(), reserved_seq)
    }

    /// [`Layout::from_superblock_on`] for a single device.
    pub fn from_superblock(sb: &Superblock, zones: &[Zone], geometry: &Geometry) -> Result<Layout> {
        Self::from_superblock_on(sb, zones, geometry, &Shape::default())
    }

    /// Size a new format of a device, exactly as dmzadm does (reference §1.6): at least 3
    /// conventional zones, reserved zones clamped to the conventional count − 1, two sets of
    /// `nr_meta_zones` contiguous conventional zones from the first conventional zone. On a
    /// multi-device `shape` "conventional" reads "cache": the sets go at the start of the
    /// cache device, and each drive's first zone holds a tertiary superblock.
    pub fn compute_on(
        zones: &[Zone],
        geometry: &Geometry,
        shape: &Shape,
        reserved_seq: u32,
    ) -> Result<Layout> {
        let c = census(zones, geometry, shape)?;
        if c.rnd < 3 {
            return Err(dev_err(format!(
                "not enough conventional zones: {} usable, dm-zoned needs at least 3",
                c.rnd
            )));
        }
        if reserved_seq == 0 {
            return Err(FormatError::Invalid(
                "the number of reserved sequential zones must be at least 1".into(),
            ));
        }
        let reserved = if reserved_seq > c.rnd {
            c.rnd - 1
        } else {
            reserved_seq
        };
        let zbb = zone_bitmap_blocks(c.zone_blocks);
        let nr_bitmap_blocks = u32::try_from(c.nr_zones as u64 * zbb as u64)
            .map_err(|_| dev_err("too many zones for 32-bit bitmap block counts"))?;
        let s = size(&c, nr_bitmap_blocks, reserved)?;
        let first = c.first_rnd.expect("rnd >= 3");
        let layout = Layout {
            zone_blocks: c.zone_blocks,
            zone_blocks_shift: c.shift,
            nr_zones: c.nr_zones,
            nr_usable_zones: c.usable,
            nr_rnd_zones: c.rnd,
            zone_bitmap_blocks: zbb,
            nr_map_blocks: s.nr_map_blocks,
            nr_bitmap_blocks,
            nr_meta_blocks: s.nr_meta_blocks,
            nr_meta_zones: s.nr_meta_zones,
            nr_chunks: s.nr_chunks,
            nr_reserved_seq: reserved,
            set_zone: [first, first + s.nr_meta_zones],
            nr_lost_zones: 0,
            tertiary_zones: shape.drive_starts.clone(),
        };
        layout.check_meta_zones(zones)?;
        Ok(layout)
    }

    /// Validate a superblock against the device like the kernel's `dmz_check_sb` and dmzadm's
    /// check (exact chunk, map and bitmap counts), and derive the layout from it. The caller
    /// checks `sb.sb_block` against the set it read the superblock from.
    ///
    /// Unlike the kernel, a volume whose zones went offline or read-only after the format
    /// still loads, degraded (`nr_lost_zones`), if the superblock matches the device with
    /// those zones counted as usable and every chunk still fits the usable zones: the lost
    /// zones come out of the reserved pool. What is written (format) keeps the kernel's rules.
    pub fn from_superblock_on(
        sb: &Superblock,
        zones: &[Zone],
        geometry: &Geometry,
        shape: &Shape,
    ) -> Result<Layout> {
        let c = census(zones, geometry, shape)?;
        let exact = Self::from_superblock_census(sb, zones, &c, shape);
        if exact.is_ok() || c.lost == 0 {
            return exact;
        }
        let Ok(layout) = Self::from_superblock_census(sb, zones, &c.with_lost(), shape) else {
            return exact;
        };
        let data_zones = (c.usable as u64).saturating_sub(2 * layout.nr_meta_zones as u64);
        if sb.nr_chunks as u64 > data_zones {
            return Err(bad_field(
                "nr_chunks",
                sb.nr_chunks as u64,
                format!(
                    "at most {data_zones} (usable zones - metadata): {} zones went offline or \
                     read-only, more than the volume's spare zones",
                    c.lost
                ),
            ));
        }
        Ok(Layout {
            nr_usable_zones: c.usable,
            nr_rnd_zones: c.rnd,
            nr_lost_zones: c.lost,
            ..layout
        })
    }

    fn from_superblock_census(
        sb: &Superblock,
        zones: &[Zone],
        c: &ZoneCensus,
        shape: &Shape,
    ) -> Result<Layout> {
        let c = *c;
        if sb.set_uuid == [0; 16] {
            return Err(FormatError::Corrupt("null set UUID".into()));
        }
        if sb.dev_uuid == [0; 16] {
            return Err(FormatError::Corrupt("null device UUID".into()));
        }
        let first = c
            .first_rnd
            .ok_or_else(|| dev_err("no usable conventional zone"))?;
        let meta_zones = Self::check_sb_bounds(sb, &c)?;
        Self::check_sb_sizes(sb, &c)?;
        let layout = Layout {
            zone_blocks: c.zone_blocks,
            zone_blocks_shift: c.shift,
            nr_zones: c.nr_zones,
            nr_usable_zones: c.usable,
            nr_rnd_zones: c.rnd,
            zone_bitmap_blocks: zone_bitmap_blocks(c.zone_blocks),
            nr_map_blocks: sb.nr_map_blocks,
            nr_bitmap_blocks: sb.nr_bitmap_blocks,
            nr_meta_blocks: sb.nr_meta_blocks,
            nr_meta_zones: meta_zones,
            nr_chunks: sb.nr_chunks,
            nr_reserved_seq: sb.nr_reserved_seq,
            set_zone: [first, first + meta_zones],
            nr_lost_zones: 0,
            tertiary_zones: shape.drive_starts.clone(),
        };
        layout.check_meta_zones(zones)?;
        Ok(layout)
    }

    /// The kernel's bounds (`dmz_check_sb`): metadata zones, reserved zones, chunks and
    /// bitmap blocks within what the device can hold. Returns the metadata zones per set.
    fn check_sb_bounds(sb: &Superblock, c: &ZoneCensus) -> Result<u32> {
        let zb = c.zone_blocks;
        let meta_zones = sb.nr_meta_blocks.div_ceil(zb);
        if meta_zones == 0 || meta_zones >= c.rnd {
            return Err(bad_field(
                "nr_meta_blocks",
                sb.nr_meta_blocks as u64,
                format!(
                    "1 to {} blocks ({} conventional zones)",
                    (c.rnd as u64 - 1) * zb as u64,
                    c.rnd
                ),
            ));
        }
        if sb.nr_reserved_seq == 0 || sb.nr_reserved_seq >= c.usable - meta_zones {
            return Err(bad_field(
                "nr_reserved_seq",
                sb.nr_reserved_seq as u64,
                format!("1 to {}", c.usable - meta_zones - 1),
            ));
        }
        let data_zones =
            (c.usable as u64).saturating_sub(2 * meta_zones as u64 + sb.nr_reserved_seq as u64);
        if sb.nr_chunks as u64 > data_zones {
            return Err(bad_field(
                "nr_chunks",
                sb.nr_chunks as u64,
                format!("at most {data_zones} (usable zones - metadata - reserved)"),
            ));
        }
        let zbb = zone_bitmap_blocks(zb);
        let bitmap = c.nr_zones as u64 * zbb as u64;
        if sb.nr_bitmap_blocks as u64 != bitmap {
            return Err(bad_field(
                "nr_bitmap_blocks",
                sb.nr_bitmap_blocks as u64,
                format!("{bitmap} ({} zones x {zbb})", c.nr_zones),
            ));
        }
        Ok(meta_zones)
    }

    /// dmzadm's exact sizing for the reserved count on disk: chunks, map and metadata blocks.
    fn check_sb_sizes(sb: &Superblock, c: &ZoneCensus) -> Result<()> {
        let s = size(c, sb.nr_bitmap_blocks, sb.nr_reserved_seq)?;
        if sb.nr_chunks != s.nr_chunks {
            return Err(bad_field(
                "nr_chunks",
                sb.nr_chunks as u64,
                format!("{} for this device", s.nr_chunks),
            ));
        }
        if sb.nr_map_blocks != s.nr_map_blocks {
            return Err(bad_field(
                "nr_map_blocks",
                sb.nr_map_blocks as u64,
                format!("{} for {} chunks", s.nr_map_blocks, sb.nr_chunks),
            ));
        }
        let meta = 1u64 + sb.nr_map_blocks as u64 + sb.nr_bitmap_blocks as u64;
        if sb.nr_meta_blocks as u64 != meta {
            return Err(bad_field(
                "nr_meta_blocks",
                sb.nr_meta_blocks as u64,
                format!("{meta} (1 + map + bitmap)"),
            ));
        }
        Ok(())
    }

    /// All `2 * nr_meta_zones` zones from the primary set's zone must be usable conventional
    /// zones ("metadata zone N is not random" in the kernel).
    fn check_meta_zones(&self, zones: &[Zone]) -> Result<()> {
        for &z in &self.tertiary_zones {
            let ok = zones.get(z as usize).is_some_and(|zone| {
                !matches!(zone.cond, ZoneCondition::Offline | ZoneCondition::ReadOnly)
            });
            if !ok {
                return Err(dev_err(format!(
                    "zone {z}, the first zone of a zoned drive, is offline or read-only: it \
                     must hold the drive's tertiary superblock"
                )));
            }
        }
        for z in self.meta_zones() {
            let ok = zones.get(z as usize).is_some_and(|zone| {
                zone.zone_type == ZoneType::Conventional
                    && !matches!(zone.cond, ZoneCondition::Offline | ZoneCondition::ReadOnly)
            });
            if !ok {
                return Err(dev_err(format!(
                    "metadata zone {z} is not a usable conventional zone: the {} metadata zones \
                     from zone {} must be contiguous conventional zones",
                    2 * self.nr_meta_zones,
                    self.set_zone[0]
                )));
            }
        }
        Ok(())
    }

    /// The zones holding both metadata sets.
    pub fn meta_zones(&self) -> std::ops::Range<u32> {
        self.set_zone[0]..self.set_zone[0] + 2 * self.nr_meta_zones
    }

    /// A zone of either set, or a drive's tertiary superblock zone.
    pub fn is_meta_zone(&self, zone: u32) -> bool {
        self.meta_zones().contains(&zone) || self.tertiary_zones.contains(&zone)
    }

    /// Absolute 4 KiB block of the tertiary superblock of zoned drive `i` (0-based).
    pub fn tertiary_block(&self, i: usize) -> u64 {
        (self.tertiary_zones[i] as u64) << self.zone_blocks_shift
    }

    /// The tertiary superblock of zoned drive `i`: gen 0, at block 0 of the drive, the
    /// volume's sizes, label and set UUID, the drive's own UUID.
    pub fn tertiary_superblock(
        &self,
        i: usize,
        label: [u8; LABEL_LEN],
        set_uuid: [u8; 16],
        dev_uuid: [u8; 16],
    ) -> Superblock {
        Superblock {
            sb_block: self.tertiary_block(i),
            ..self.superblock(0, 0, label, set_uuid, dev_uuid)
        }
    }

    /// Absolute 4 KiB block of a set's superblock (its `sb_block`).
    pub fn set_start_block(&self, set: usize) -> u64 {
        (self.set_zone[set] as u64) << self.zone_blocks_shift
    }

    /// Byte offset on the device of metadata block `mblk` of `set`.
    pub fn mblk_offset(&self, set: usize, mblk: u32) -> u64 {
        (self.set_start_block(set) + mblk as u64) * BLOCK as u64
    }

    /// Map block number (within a set) and entry index of a chunk.
    pub fn map_block(&self, chunk: u32) -> (u32, usize) {
        (
            1 + chunk / MAP_ENTRIES_PER_BLOCK as u32,
            chunk as usize % MAP_ENTRIES_PER_BLOCK,
        )
    }

    /// First bitmap block (within a set).
    pub fn first_bitmap_block(&self) -> u32 {
        1 + self.nr_map_blocks
    }

    /// Bitmap block (within a set) holding the bit of block `chunk_block` of `zone`; the bit
    /// inside it is `chunk_block % bits_per_bitmap_block()`.
    pub fn bitmap_block(&self, zone: u32, chunk_block: u32) -> u32 {
        self.first_bitmap_block()
            + zone * self.zone_bitmap_blocks
            + chunk_block / BITS_PER_BITMAP_BLOCK
    }

    /// Bits used in one bitmap block: min(zone_blocks, 32768).
    pub fn bits_per_bitmap_block(&self) -> u32 {
        self.zone_blocks.min(BITS_PER_BITMAP_BLOCK)
    }

    /// Capacity exposed to the user, in bytes.
    pub fn exposed_bytes(&self) -> u64 {
        (self.nr_chunks as u64) << (self.zone_blocks_shift + 12)
    }

    /// The superblock of `set` for this layout.
    pub fn superblock(
        &self,
        set: usize,
        gen: u64,
        label: [u8; LABEL_LEN],
        set_uuid: [u8; 16],
        dev_uuid: [u8; 16],
    ) -> Superblock {
        Superblock {
            gen,
            sb_block: self.set_start_block(set),
            nr_meta_blocks: self.nr_meta_blocks,
            nr_reserved_seq: self.nr_reserved_seq,
            nr_chunks: self.nr_chunks,
            nr_map_blocks: self.nr_map_blocks,
            nr_bitmap_blocks: self.nr_bitmap_blocks,
            label,
            set_uuid,
            dev_uuid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_is_raw_update_without_inversion() {
        // crc32_le(0, "") is the seed itself; zlib's would be 0 too, so use data.
        assert_eq!(linux_crc32(7, &[]), 7);
        // Bitwise reference: dmzadm's loop, written from the polynomial.
        fn bitwise(mut crc: u32, data: &[u8]) -> u32 {
            for &b in data {
                crc ^= b as u32;
                for _ in 0..8 {
                    crc = (crc >> 1) ^ if crc & 1 != 0 { 0xEDB8_8320 } else { 0 };
                }
            }
            crc
        }
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 31 + 7) as u8).collect();
        for seed in [0u32, 1, 2, 0xdead_beef] {
            assert_eq!(linux_crc32(seed, &data), bitwise(seed, &data));
        }
    }

    #[test]
    fn bits_are_lsb_first() {
        let mut b = [0u8; 4];
        set_bit(&mut b, 2);
        set_bit(&mut b, 3);
        set_bit(&mut b, 9);
        assert_eq!(b, [0x0c, 0x02, 0, 0]);
        assert!(test_bit(&b, 9) && !test_bit(&b, 8));
        assert_eq!(iter_set_bits(&b, 32).collect::<Vec<_>>(), vec![2, 3, 9]);
        assert_eq!(iter_set_bits(&b, 9).collect::<Vec<_>>(), vec![2, 3]);
        clear_bit(&mut b, 3);
        assert_eq!(count_bits(&b), 2);
    }

    #[test]
    fn labels() {
        assert!(label_field("").is_err());
        assert!(label_field(&"x".repeat(32)).is_err());
        let l = label_field(&"x".repeat(31)).unwrap();
        assert_eq!(l[31], 0);
    }
}
