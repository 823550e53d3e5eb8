//! The log layout's areas and on-disk blocks (docs/design.md, "Log layout"): where each area
//! sits in conventional space, and the superblock, directory, zone table, index page and
//! zone summary blocks, each with its magic and CRC. Records of the metadata log are in
//! `record.rs`; the log block header is the v2 engine's (`engine::meta::log`).

use zbd::{Zone, ZoneCondition, ZoneType, ZonedDevice};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::engine::ids::{Lba, PageId, ZoneId, BLOCK};
use crate::engine::EngineError;

/// Entries per index page, directory block and zone summary block.
pub(crate) const ENTRIES: usize = 1020;
/// Entries per zone table block.
pub(crate) const ZT_ENTRIES: usize = 255;
/// On disk, "nothing here" (unmapped block, unmapped page, summary padding).
pub(crate) const NONE: u32 = 0xFFFF_FFFF;
/// Directory: the page is in its slot of the page area.
pub(crate) const IN_SLOT: u32 = 0xFFFF_FFFE;

pub(crate) const SB_MAGIC: u32 = 0x474F_4C5A; // "ZLOG"
const PAGE_MAGIC: u32 = 0x4750_4C5A; // "ZLPG"
const DIR_MAGIC: u32 = 0x5244_4C5A; // "ZLDR"
const ZT_MAGIC: u32 = 0x545A_4C5A; // "ZLZT"
const SUM_MAGIC: u32 = 0x4D53_4C5A; // "ZLSM"
const SB_VERSION: u32 = 1;
/// Open zones a volume may use (the superblock's `max_frontiers`): its user frontiers and
/// the GC frontier. A volume formatted before several user frontiers existed says 2.
pub(crate) const MIN_FRONTIERS: u32 = 2;
pub(crate) const MAX_FRONTIERS: u32 = 5;
/// Over-provisioning of at least this many zones, whatever `op` says: with less than a zone
/// of spare space, every GC victim is nearly all valid (measured: 1 write a second with 16
/// data zones of 64 MiB at 7 %, docs/PERFORMANCE.md).
pub(crate) const MIN_SPARE_ZONES: u64 = 2;
/// User frontiers format gives a device without open-zone limits.
pub const DEFAULT_USER_FRONTIERS: u32 = MAX_FRONTIERS - 1;

/// A device block (4 KiB) by its absolute number: what the index maps a logical block to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Pba(pub u32);

/// How a volume is formatted.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    pub label: Option<String>,
    /// Over-provisioning: exposed blocks = usable data blocks / (1 + op).
    pub op: f64,
    /// Metadata log ring size in blocks (two halves, one per checkpoint generation parity).
    pub log_blocks: u32,
    /// The volume's UUID; `None`: a random one (a fixed one makes an image reproducible,
    /// as the fuzz targets need).
    pub uuid: Option<[u8; 16]>,
    /// User frontiers (open zones taking new writes, one write in flight on each), 1 to
    /// `MAX_FRONTIERS - 1`; fewer on a device whose open or active zone limit is lower.
    pub user_frontiers: u32,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            label: None,
            op: 0.07,
            log_blocks: 16384,
            uuid: None,
            user_frontiers: DEFAULT_USER_FRONTIERS,
        }
    }
}

/// The sizes and places everything on a log-layout volume is computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub uuid: [u8; 16],
    pub label: [u8; 32],
    /// Zone size in blocks (a power of two): device block = zone * zone_blocks + offset.
    pub zone_blocks: u32,
    /// Writable blocks of a sequential zone (data, then its summary).
    pub zone_cap_blocks: u32,
    pub nr_zones: u32,
    /// The conventional space, in zone order.
    pub conv_zones: Vec<ZoneId>,
    pub user_blocks: u64,
    pub nr_pages: u32,
    pub dir_blocks: u32,
    pub zt_blocks: u32,
    pub summary_blocks: u32,
    pub log_blocks: u32,
    /// Open zones the volume uses: `frontiers - 1` user frontiers and the GC frontier.
    pub frontiers: u32,
}

/// Blocks of the fixed areas before the log ring: superblock slots, directory and zone
/// table copies.
fn fixed_blocks(dir: u32, zt: u32) -> u64 {
    2 + 2 * dir as u64 + 2 * zt as u64
}

/// The conventional zones that can hold metadata, in zone order.
fn usable_conv(zones: &[Zone]) -> Vec<ZoneId> {
    zones
        .iter()
        .filter(|z| z.zone_type == ZoneType::Conventional && z.cond == ZoneCondition::NotWp)
        .map(|z| ZoneId(z.id))
        .collect()
}

/// Whether a zone can hold data: sequential and neither offline nor read-only.
pub(crate) fn is_data_zone(z: &Zone) -> bool {
    z.zone_type.is_sequential()
        && !matches!(z.cond, ZoneCondition::Offline | ZoneCondition::ReadOnly)
}

/// The most zones the device lets be open (or active) at once: the lower of its two limits,
/// `None` when it has neither.
fn zone_limit(geo: &zbd::Geometry) -> Option<u32> {
    [geo.max_open_zones, geo.max_active_zones]
        .into_iter()
        .filter(|&m| m > 0)
        .min()
}

/// Frontiers for a device: `wanted`, fewer when its open or active zone limit is lower (each
/// frontier is an open zone); below [`MIN_FRONTIERS`] the device cannot take the layout.
fn frontiers_for(geo: &zbd::Geometry, wanted: u32) -> u32 {
    zone_limit(geo).map_or(wanted, |m| m.min(wanted))
}

impl Layout {
    /// Whether the device lets this volume's frontiers be open at once: a volume formatted on
    /// a device with higher limits (an image copied to another drive) is refused at open,
    /// not at its first zone open.
    pub fn check_limits(&self, geo: &zbd::Geometry) -> Result<(), EngineError> {
        match zone_limit(geo) {
            Some(m) if m < self.frontiers => Err(EngineError::Invalid(format!(
                "this log-layout volume keeps {} zones open at once (its frontiers), and the \
                 device allows {m}: it was formatted on a device with higher limits, or by a \
                 zonedd that did not check them",
                self.frontiers
            ))),
            _ => Ok(()),
        }
    }

    /// User frontiers (slots `0..users`; the GC frontier is slot `users`).
    pub fn user_frontiers(&self) -> u32 {
        self.frontiers - 1
    }

    /// The layout `opts` gives on a device with these zones, or the one-line refusal.
    pub fn compute(
        zones: &[Zone],
        geo: &zbd::Geometry,
        opts: &FormatOptions,
    ) -> Result<Layout, EngineError> {
        let zone_blocks = (geo.zone_size / BLOCK as u64) as u32;
        let zone_cap_blocks = (geo.zone_capacity / BLOCK as u64) as u32;
        let summary_blocks = zone_cap_blocks.div_ceil(ENTRIES as u32);
        let data_blocks = zone_cap_blocks.saturating_sub(summary_blocks) as u64;
        let data_zones = zones.iter().filter(|z| is_data_zone(z)).count() as u64;
        if !(1..MAX_FRONTIERS).contains(&opts.user_frontiers) {
            return Err(EngineError::Invalid(format!(
                "log layout: {} user frontiers, 1 to {} allowed",
                opts.user_frontiers,
                MAX_FRONTIERS - 1
            )));
        }
        let frontiers = frontiers_for(geo, opts.user_frontiers + 1);
        if frontiers < MIN_FRONTIERS {
            return Err(EngineError::Invalid(format!(
                "the log layout keeps {MIN_FRONTIERS} zones open at once (a user frontier and \
                 GC's), and the device allows {frontiers}"
            )));
        }
        let reserve = frontiers as u64 + 1;
        if data_zones <= reserve + MIN_SPARE_ZONES || data_blocks == 0 {
            return Err(EngineError::Invalid(format!(
                "device too small for the log layout: {} usable sequential zones, {} needed",
                data_zones,
                reserve + MIN_SPARE_ZONES + 1
            )));
        }
        if opts.log_blocks < 4
            || !opts.log_blocks.is_multiple_of(2)
            || !(0.0..=10.0).contains(&opts.op)
        {
            return Err(EngineError::Invalid(format!(
                "log layout: log_blocks {} must be even and >= 4, op {} within 0..10",
                opts.log_blocks, opts.op
            )));
        }
        let avail = data_zones - reserve;
        let user_blocks = ((avail as f64 * data_blocks as f64 / (1.0 + opts.op)).floor() as u64)
            .min((avail - MIN_SPARE_ZONES) * data_blocks);
        let dev_blocks = geo.nr_zones as u64 * zone_blocks as u64;
        if dev_blocks >= NONE as u64 - 1 || user_blocks >= NONE as u64 {
            return Err(EngineError::Invalid(
                "device too large for the log layout: block numbers are 32-bit (16 TiB)".into(),
            ));
        }
        let nr_pages = user_blocks.div_ceil(ENTRIES as u64) as u32;
        let mut label = [0u8; 32];
        if let Some(l) = &opts.label {
            let b = l.as_bytes();
            label[..b.len().min(32)].copy_from_slice(&b[..b.len().min(32)]);
        }
        let layout = Layout {
            uuid: opts
                .uuid
                .unwrap_or_else(|| uuid::Uuid::new_v4().into_bytes()),
            label,
            zone_blocks,
            zone_cap_blocks,
            nr_zones: geo.nr_zones,
            conv_zones: usable_conv(zones),
            user_blocks,
            nr_pages,
            dir_blocks: nr_pages.div_ceil(ENTRIES as u32).max(1),
            zt_blocks: geo.nr_zones.div_ceil(ZT_ENTRIES as u32),
            summary_blocks,
            log_blocks: opts.log_blocks,
            frontiers,
        };
        layout.check_room()?;
        Ok(layout)
    }

    /// Refuses a conventional space too small for the areas.
    fn check_room(&self) -> Result<(), EngineError> {
        let needed = self.conv_needed();
        let available = self.conv_zones.len() as u64 * self.zone_blocks as u64;
        if needed > available {
            return Err(EngineError::Invalid(format!(
                "device too small for the log layout: {needed} conventional blocks needed, \
                 {available} available"
            )));
        }
        Ok(())
    }

    /// Conventional blocks the areas take.
    pub fn conv_needed(&self) -> u64 {
        self.page_start() + self.nr_pages as u64
    }

    /// Data blocks of a sequential zone (before its summary).
    pub fn data_blocks(&self) -> u32 {
        self.zone_cap_blocks - self.summary_blocks
    }

    pub fn dir_start(&self, copy: usize) -> u64 {
        2 + copy as u64 * self.dir_blocks as u64
    }

    pub fn zt_start(&self, copy: usize) -> u64 {
        2 + 2 * self.dir_blocks as u64 + copy as u64 * self.zt_blocks as u64
    }

    pub fn log_start(&self) -> u64 {
        fixed_blocks(self.dir_blocks, self.zt_blocks)
    }

    /// Blocks of one half of the log ring.
    pub fn log_half(&self) -> u64 {
        self.log_blocks as u64 / 2
    }

    pub fn page_start(&self) -> u64 {
        self.log_start() + self.log_blocks as u64
    }

    /// Byte offset on the device of conventional block `k`.
    pub fn conv_offset(&self, k: u64) -> u64 {
        let zb = self.zone_blocks as u64;
        let zone = self.conv_zones[(k / zb) as usize];
        (zone.0 as u64 * zb + k % zb) * BLOCK as u64
    }

    /// Byte offset of block `off` of `zone`.
    pub fn zone_offset(&self, zone: ZoneId, off: u32) -> u64 {
        self.pba(zone, off).0 as u64 * BLOCK as u64
    }

    pub fn pba(&self, zone: ZoneId, off: u32) -> Pba {
        Pba(zone.0 * self.zone_blocks + off)
    }

    /// (zone, offset in it) of a device block.
    pub fn zone_of(&self, p: Pba) -> (ZoneId, u32) {
        (ZoneId(p.0 / self.zone_blocks), p.0 % self.zone_blocks)
    }

    pub fn page_of(lba: Lba) -> (PageId, usize) {
        (PageId(lba.0 / ENTRIES as u32), lba.0 as usize % ENTRIES)
    }
}

/// Write whole blocks `data` at conventional blocks `k..`, split where the conventional space
/// crosses a zone.
pub(crate) fn conv_write(
    dev: &dyn ZonedDevice,
    l: &Layout,
    k: u64,
    data: &[u8],
) -> zbd::Result<()> {
    conv_io(l, k, data.len(), |off, r| dev.write_at(&data[r], off))
}

/// Read whole blocks at conventional blocks `k..` into `buf`.
pub(crate) fn conv_read(
    dev: &dyn ZonedDevice,
    l: &Layout,
    k: u64,
    buf: &mut [u8],
) -> zbd::Result<()> {
    let len = buf.len();
    conv_io(l, k, len, |off, r| dev.read_at(&mut buf[r], off))
}

fn conv_io(
    l: &Layout,
    k: u64,
    len: usize,
    mut io: impl FnMut(u64, std::ops::Range<usize>) -> zbd::Result<()>,
) -> zbd::Result<()> {
    let zb = l.zone_blocks as u64;
    let blocks = (len / BLOCK) as u64;
    let mut done = 0u64;
    while done < blocks {
        let b = k + done;
        let n = (zb - b % zb).min(blocks - done);
        let r = done as usize * BLOCK..(done + n) as usize * BLOCK;
        io(l.conv_offset(b), r)?;
        done += n;
    }
    Ok(())
}

/// CRC of `le32 index ‖ block with the 4 bytes at `crc_at` zero`: a block in the wrong slot
/// fails.
fn block_crc(index: Option<u32>, b: &[u8], crc_at: usize) -> u32 {
    let mut h = crc32fast::Hasher::new();
    if let Some(i) = index {
        h.update(&i.to_le_bytes());
    }
    h.update(&b[..crc_at]);
    h.update(&[0; 4]);
    h.update(&b[crc_at + 4..]);
    h.finalize()
}

// ---------------------------------------------------------------------------------------
// Superblock

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct RawSb {
    magic: U32,
    version: U32,
    gen: U64,
    crc: U32,
    slot: U32,
    uuid: [u8; 16],
    label: [u8; 32],
    user_blocks: U64,
    zone_blocks: U32,
    nr_zones: U32,
    nr_pages: U32,
    dir_blocks: U32,
    zone_table_blocks: U32,
    summary_blocks: U32,
    max_frontiers: U32,
    log_blocks: U32,
    ckpt_seq: U64,
    log_start: U64,
    clock: U64,
    zone_cap_blocks: U32,
    nr_conv_zones: U32,
    reserved: [u8; 3952],
}
const _: () = assert!(std::mem::size_of::<RawSb>() == BLOCK);
const SB_CRC_AT: usize = std::mem::offset_of!(RawSb, crc);

/// A checkpoint: the generation, the first record it does not hold, and the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub gen: u64,
    pub ckpt_seq: u64,
    pub clock: u64,
}

pub(crate) fn encode_sb(l: &Layout, c: &Checkpoint) -> Box<[u8; BLOCK]> {
    let raw = RawSb {
        magic: SB_MAGIC.into(),
        version: SB_VERSION.into(),
        gen: c.gen.into(),
        crc: 0.into(),
        slot: ((c.gen % 2) as u32).into(),
        uuid: l.uuid,
        label: l.label,
        user_blocks: l.user_blocks.into(),
        zone_blocks: l.zone_blocks.into(),
        nr_zones: l.nr_zones.into(),
        nr_pages: l.nr_pages.into(),
        dir_blocks: l.dir_blocks.into(),
        zone_table_blocks: l.zt_blocks.into(),
        summary_blocks: l.summary_blocks.into(),
        max_frontiers: l.frontiers.into(),
        log_blocks: l.log_blocks.into(),
        ckpt_seq: c.ckpt_seq.into(),
        log_start: (l.log_start() + (c.gen % 2) * l.log_half()).into(),
        clock: c.clock.into(),
        zone_cap_blocks: l.zone_cap_blocks.into(),
        nr_conv_zones: (l.conv_zones.len() as u32).into(),
        reserved: [0; 3952],
    };
    let mut b = Box::new([0u8; BLOCK]);
    b.copy_from_slice(raw.as_bytes());
    let crc = block_crc(None, &b[..], SB_CRC_AT);
    b[SB_CRC_AT..SB_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decode superblock slot `slot` against the device's zones: the layout and checkpoint, or
/// why it is not a valid log-layout superblock.
pub(crate) fn decode_sb(
    b: &[u8],
    slot: u32,
    zones: &[Zone],
    geo: &zbd::Geometry,
) -> Result<(Layout, Checkpoint), String> {
    let (raw, _) = RawSb::ref_from_prefix(b).map_err(|_| "short block".to_string())?;
    let magic = raw.magic.get();
    if magic != SB_MAGIC {
        return Err(match magic {
            0x445A_4244 => "dm-zoned superblock (a v2 volume, not the log layout)".into(),
            0 => "zeros (not formatted)".into(),
            m => format!("bad magic {m:#010x}"),
        });
    }
    if raw.version.get() != SB_VERSION {
        return Err(format!("unknown log layout version {}", raw.version.get()));
    }
    if block_crc(None, b, SB_CRC_AT) != raw.crc.get() {
        return Err("bad CRC".into());
    }
    let gen = raw.gen.get();
    if raw.slot.get() != slot || gen % 2 != slot as u64 {
        return Err(format!("generation {gen} in slot {slot}"));
    }
    let l = Layout {
        uuid: raw.uuid,
        label: raw.label,
        zone_blocks: raw.zone_blocks.get(),
        zone_cap_blocks: raw.zone_cap_blocks.get(),
        nr_zones: raw.nr_zones.get(),
        conv_zones: usable_conv(zones),
        user_blocks: raw.user_blocks.get(),
        nr_pages: raw.nr_pages.get(),
        dir_blocks: raw.dir_blocks.get(),
        zt_blocks: raw.zone_table_blocks.get(),
        summary_blocks: raw.summary_blocks.get(),
        log_blocks: raw.log_blocks.get(),
        frontiers: raw.max_frontiers.get(),
    };
    let c = Checkpoint {
        gen,
        ckpt_seq: raw.ckpt_seq.get(),
        clock: raw.clock.get(),
    };
    check_sb_fields(&l, raw, geo)?;
    let data_zones = zones.iter().filter(|z| is_data_zone(z)).count() as u64;
    let most = data_zones.saturating_sub(l.frontiers as u64 + 1) * l.data_blocks() as u64;
    if l.user_blocks == 0 || l.user_blocks > most {
        return Err(format!(
            "exposed capacity {} blocks does not fit the device's {data_zones} data zones",
            l.user_blocks
        ));
    }
    Ok((l, c))
}

/// The superblock's sizes are the ones its fields and the device give.
fn check_sb_fields(l: &Layout, raw: &RawSb, geo: &zbd::Geometry) -> Result<(), String> {
    let zb = (geo.zone_size / BLOCK as u64) as u32;
    let cap = (geo.zone_capacity / BLOCK as u64) as u32;
    let mismatch = if l.zone_blocks != zb || l.zone_cap_blocks != cap {
        Some("zone size")
    } else if l.nr_zones != geo.nr_zones {
        Some("zone count")
    } else if l.conv_zones.len() as u32 != raw.nr_conv_zones.get() {
        Some("conventional zone count")
    } else if l.nr_pages as u64 != l.user_blocks.div_ceil(ENTRIES as u64)
        || l.dir_blocks != l.nr_pages.div_ceil(ENTRIES as u32).max(1)
        || l.zt_blocks != l.nr_zones.div_ceil(ZT_ENTRIES as u32)
        || l.summary_blocks != cap.div_ceil(ENTRIES as u32)
        || l.summary_blocks >= cap
        || !(MIN_FRONTIERS..=MAX_FRONTIERS).contains(&l.frontiers)
    {
        Some("area sizes")
    } else if l.log_blocks < 4 || !l.log_blocks.is_multiple_of(2) {
        Some("log size")
    } else if raw.log_start.get() != l.log_start() + (raw.gen.get() % 2) * l.log_half() {
        Some("log start")
    } else {
        None
    };
    if let Some(m) = mismatch {
        return Err(format!("{m} does not match the device"));
    }
    l.check_room().map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------
// Index pages

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct RawPage {
    magic: U32,
    crc: U32,
    seq: U64,
    pba: [U32; ENTRIES],
}
const _: () = assert!(std::mem::size_of::<RawPage>() == BLOCK);
const PAGE_CRC_AT: usize = std::mem::offset_of!(RawPage, crc);

/// A page image: `entries` (on-disk values, `NONE` unmapped) folded up to record `seq`.
pub(crate) fn encode_page(p: PageId, seq: u64, entries: &[u32; ENTRIES]) -> Box<[u8; BLOCK]> {
    let raw = RawPage {
        magic: PAGE_MAGIC.into(),
        crc: 0.into(),
        seq: seq.into(),
        pba: entries.map(U32::new),
    };
    seal(raw.as_bytes(), Some(p.0), PAGE_CRC_AT)
}

/// (seq, entries) of page `p`'s image, or why not.
pub(crate) fn decode_page(p: PageId, b: &[u8]) -> Result<(u64, Box<[u32; ENTRIES]>), String> {
    let (raw, _) = RawPage::ref_from_prefix(b).map_err(|_| "short block")?;
    if raw.magic.get() != PAGE_MAGIC || block_crc(Some(p.0), b, PAGE_CRC_AT) != raw.crc.get() {
        return Err(format!("index page {}: bad magic or CRC", p.0));
    }
    Ok((raw.seq.get(), Box::new(raw.pba.map(|v| v.get()))))
}

fn seal(bytes: &[u8], index: Option<u32>, crc_at: usize) -> Box<[u8; BLOCK]> {
    let mut b = Box::new([0u8; BLOCK]);
    b.copy_from_slice(bytes);
    let crc = block_crc(index, &b[..], crc_at);
    b[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Recompute, in place, the CRC that conventional block `k`'s area wants in image `b`
/// (superblock slot, directory or zone table copy, log ring, index page), so that patched
/// contents reach the decoders (fuzzing). Without a layout only the superblock slots are
/// known. False when `k` is in no area.
pub(crate) fn reseal(l: Option<&Layout>, k: u64, b: &mut [u8]) -> bool {
    if b.len() != BLOCK {
        return false;
    }
    let (index, crc_at) = match l {
        _ if k < 2 => (None, SB_CRC_AT),
        None => return false,
        Some(l) => {
            let within = |start: u64, n: u32| (start..start + n as u64).contains(&k);
            if let Some(c) = (0..2).find(|&c| within(l.dir_start(c), l.dir_blocks)) {
                (Some((k - l.dir_start(c)) as u32), DIR_CRC_AT)
            } else if let Some(c) = (0..2).find(|&c| within(l.zt_start(c), l.zt_blocks)) {
                (Some((k - l.zt_start(c)) as u32), ZT_CRC_AT)
            } else if within(l.log_start(), l.log_blocks) {
                crate::engine::meta::log::reseal_block(b);
                return true;
            } else if within(l.page_start(), l.nr_pages) {
                (Some((k - l.page_start()) as u32), PAGE_CRC_AT)
            } else {
                return false;
            }
        }
    };
    let crc = block_crc(index, b, crc_at);
    b[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    true
}

// ---------------------------------------------------------------------------------------
// Directory and zone table blocks

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct RawDir {
    magic: U32,
    crc: U32,
    gen: U64,
    entries: [U32; ENTRIES],
}
const _: () = assert!(std::mem::size_of::<RawDir>() == BLOCK);
const DIR_CRC_AT: usize = std::mem::offset_of!(RawDir, crc);

/// Directory block `j` of generation `gen`.
pub(crate) fn encode_dir(j: u32, gen: u64, entries: &[u32; ENTRIES]) -> Box<[u8; BLOCK]> {
    let raw = RawDir {
        magic: DIR_MAGIC.into(),
        crc: 0.into(),
        gen: gen.into(),
        entries: entries.map(U32::new),
    };
    seal(raw.as_bytes(), Some(j), DIR_CRC_AT)
}

pub(crate) fn decode_dir(j: u32, gen: u64, b: &[u8]) -> Result<[u32; ENTRIES], String> {
    let (raw, _) = RawDir::ref_from_prefix(b).map_err(|_| "short block")?;
    if raw.magic.get() != DIR_MAGIC || block_crc(Some(j), b, DIR_CRC_AT) != raw.crc.get() {
        return Err(format!("directory block {j}: bad magic or CRC"));
    }
    if raw.gen.get() != gen {
        return Err(format!(
            "directory block {j}: generation {} not {gen}",
            raw.gen.get()
        ));
    }
    Ok(raw.entries.map(|v| v.get()))
}

/// A zone table entry as stored.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy)]
#[repr(C)]
pub(crate) struct RawZte {
    pub valid: U32,
    pub last_append: U64,
    pub class: u8,
    pub gen: u8,
    pub state: u8,
    pub pad: u8,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct RawZt {
    magic: U32,
    crc: U32,
    gen: U64,
    entries: [RawZte; ZT_ENTRIES],
}
const _: () = assert!(std::mem::size_of::<RawZt>() == BLOCK);
const ZT_CRC_AT: usize = std::mem::offset_of!(RawZt, crc);

pub(crate) fn encode_zt(j: u32, gen: u64, entries: &[RawZte; ZT_ENTRIES]) -> Box<[u8; BLOCK]> {
    let raw = RawZt {
        magic: ZT_MAGIC.into(),
        crc: 0.into(),
        gen: gen.into(),
        entries: *entries,
    };
    seal(raw.as_bytes(), Some(j), ZT_CRC_AT)
}

pub(crate) fn decode_zt(j: u32, gen: u64, b: &[u8]) -> Result<[RawZte; ZT_ENTRIES], String> {
    let (raw, _) = RawZt::ref_from_prefix(b).map_err(|_| "short block")?;
    if raw.magic.get() != ZT_MAGIC || block_crc(Some(j), b, ZT_CRC_AT) != raw.crc.get() {
        return Err(format!("zone table block {j}: bad magic or CRC"));
    }
    if raw.gen.get() != gen {
        return Err(format!(
            "zone table block {j}: generation {} not {gen}",
            raw.gen.get()
        ));
    }
    Ok(raw.entries)
}

// ---------------------------------------------------------------------------------------
// Zone summaries

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct RawSum {
    magic: U32,
    crc: U32,
    zone: U32,
    index: U32,
    lba: [U32; ENTRIES],
}
const _: () = assert!(std::mem::size_of::<RawSum>() == BLOCK);
const SUM_CRC_AT: usize = std::mem::offset_of!(RawSum, crc);

/// Summary block `index` of `zone`: the logical block of each of its data blocks
/// `index * 1020 ..` (`None`, `NONE` on disk: padding, or not live when the summary was
/// rebuilt).
pub(crate) fn encode_summary(zone: ZoneId, index: u32, lbas: &[Option<Lba>]) -> Box<[u8; BLOCK]> {
    let mut e = [U32::new(NONE); ENTRIES];
    for (d, s) in e.iter_mut().zip(lbas) {
        *d = U32::new(s.map_or(NONE, |l| l.0));
    }
    let raw = RawSum {
        magic: SUM_MAGIC.into(),
        crc: 0.into(),
        zone: zone.0.into(),
        index: index.into(),
        lba: e,
    };
    seal(raw.as_bytes(), None, SUM_CRC_AT)
}

pub(crate) fn decode_summary(zone: ZoneId, index: u32, b: &[u8]) -> Option<Vec<Option<Lba>>> {
    let (raw, _) = RawSum::ref_from_prefix(b).ok()?;
    let ok = raw.magic.get() == SUM_MAGIC
        && block_crc(None, b, SUM_CRC_AT) == raw.crc.get()
        && raw.zone.get() == zone.0
        && raw.index.get() == index;
    ok.then(|| {
        raw.lba
            .iter()
            .map(|v| (v.get() != NONE).then_some(Lba(v.get())))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zbd::MemDevice;

    fn device() -> MemDevice {
        MemDevice::with_zones(256 << 10, 32, 4).unwrap()
    }

    fn layout(dev: &MemDevice) -> (Layout, Vec<Zone>) {
        let zones = dev.report_all().unwrap();
        let l = Layout::compute(
            &zones,
            &dev.geometry(),
            &FormatOptions {
                log_blocks: 64,
                ..FormatOptions::default()
            },
        )
        .unwrap();
        (l, zones)
    }

    #[test]
    fn sizes_follow_the_device() {
        let dev = device();
        let (l, _) = layout(&dev);
        // 28 data zones of 64 blocks: 63 data + 1 summary; 6 zones kept out (5 frontiers,
        // one more); 7 % OP of 22 zones is under 2 zones, so 2 zones of spare.
        assert_eq!((l.summary_blocks, l.data_blocks()), (1, 63));
        assert_eq!(l.frontiers, MAX_FRONTIERS);
        assert_eq!(l.user_blocks, 20 * 63);
        assert_eq!(l.nr_pages, 2);
        assert_eq!((l.dir_blocks, l.zt_blocks), (1, 1));
        assert_eq!((l.log_start(), l.page_start()), (6, 70));
        assert_eq!(l.conv_needed(), 72);
        assert_eq!(l.conv_offset(65), (64 + 1) * BLOCK as u64);
    }

    #[test]
    fn frontiers_follow_the_open_zone_limits_and_the_option() {
        let zones = device().report_all().unwrap();
        let with = |max_open, max_active, user_frontiers| {
            let geo = zbd::Geometry {
                max_open_zones: max_open,
                max_active_zones: max_active,
                ..device().geometry()
            };
            let opts = FormatOptions {
                log_blocks: 64,
                user_frontiers,
                ..FormatOptions::default()
            };
            Layout::compute(&zones, &geo, &opts).map(|l| l.frontiers)
        };
        assert_eq!(with(0, 0, 4).unwrap(), 5);
        assert_eq!(with(0, 0, 1).unwrap(), 2);
        assert_eq!(with(3, 0, 4).unwrap(), 3);
        assert_eq!(with(0, 4, 4).unwrap(), 4);
        assert_eq!(with(2, 0, 4).unwrap(), MIN_FRONTIERS);
        // Below two open zones the device cannot hold a user frontier and GC's: refused.
        let e = with(1, 0, 4).unwrap_err().to_string();
        assert!(
            e.contains("keeps 2 zones open") && e.contains("allows 1"),
            "{e}"
        );
        assert!(with(0, 1, 1).is_err());
        assert!(with(0, 0, 0).is_err());
        assert!(with(0, 0, 5).is_err());
    }

    /// A volume whose frontiers exceed the device's limits (formatted elsewhere) is refused
    /// by `check_limits`, which open calls; within them, or without limits, it passes.
    #[test]
    fn a_volume_with_more_frontiers_than_the_device_allows_is_refused() {
        let dev = device();
        let (l, _) = layout(&dev);
        assert_eq!(l.frontiers, MAX_FRONTIERS);
        let geo = |max_open, max_active| zbd::Geometry {
            max_open_zones: max_open,
            max_active_zones: max_active,
            ..dev.geometry()
        };
        assert!(l.check_limits(&geo(0, 0)).is_ok());
        assert!(l.check_limits(&geo(5, 0)).is_ok());
        assert!(l.check_limits(&geo(128, 5)).is_ok());
        for (o, a) in [(4, 0), (0, 3), (8, 4)] {
            let e = l.check_limits(&geo(o, a)).unwrap_err().to_string();
            assert!(e.contains("keeps 5 zones open"), "{e}");
        }
    }

    #[test]
    fn superblock_round_trips_and_guards_its_slot() {
        let dev = device();
        let (l, zones) = layout(&dev);
        let c = Checkpoint {
            gen: 7,
            ckpt_seq: 99,
            clock: 1234,
        };
        let b = encode_sb(&l, &c);
        let (l2, c2) = decode_sb(&b[..], 1, &zones, &dev.geometry()).unwrap();
        assert_eq!((l2, c2), (l.clone(), c));
        assert!(decode_sb(&b[..], 0, &zones, &dev.geometry())
            .unwrap_err()
            .contains("generation 7 in slot 0"));
        let mut bad = b.clone();
        bad[200] ^= 1;
        assert_eq!(
            decode_sb(&bad[..], 1, &zones, &dev.geometry()).unwrap_err(),
            "bad CRC"
        );
        // Same fields, another device shape: refused.
        let other = MemDevice::with_zones(256 << 10, 33, 4).unwrap();
        let z = other.report_all().unwrap();
        assert!(decode_sb(&b[..], 1, &z, &other.geometry())
            .unwrap_err()
            .contains("zone count"));
    }

    #[test]
    fn pages_directory_and_summaries_reject_the_wrong_place() {
        let mut e = [NONE; ENTRIES];
        e[5] = 77;
        let p = encode_page(PageId(3), 42, &e);
        let (seq, got) = decode_page(PageId(3), &p[..]).unwrap();
        assert_eq!((seq, got[5], got[6]), (42, 77, NONE));
        assert!(decode_page(PageId(4), &p[..]).is_err());
        let d = encode_dir(1, 9, &e);
        assert_eq!(decode_dir(1, 9, &d[..]).unwrap()[5], 77);
        assert!(decode_dir(0, 9, &d[..]).is_err());
        assert!(decode_dir(1, 8, &d[..]).unwrap_err().contains("generation"));
        let s = encode_summary(ZoneId(6), 0, &[Some(Lba(10)), None, Some(Lba(11))]);
        let got = decode_summary(ZoneId(6), 0, &s[..]).unwrap();
        assert_eq!(&got[..4], &[Some(Lba(10)), None, Some(Lba(11)), None]);
        assert!(decode_summary(ZoneId(7), 0, &s[..]).is_none());
        assert!(decode_summary(ZoneId(6), 1, &s[..]).is_none());
    }
}
