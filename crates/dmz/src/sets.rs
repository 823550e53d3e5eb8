//! The two metadata sets on a device: formatting them, reading and validating both
//! superblocks, choosing the primary, and bringing the other set back in line.
//!
//! Crash rules (docs/design.md, "Set selection and resync"): a set whose superblock is bad is
//! rebuilt from the good one; when both are good but their generations differ (a crash between
//! the two superblock writes of a commit), the newer set is copied in full onto the older one,
//! which dm-zoned itself does not do.

use tracing::{info, warn};
use zbd::{Geometry, Zone, ZoneCondition, ZoneType, ZonedDevice};

use crate::format::{
    has_magic, label_field, linux_crc32, uuid_string, FormatError, Layout, Result, Shape,
    Superblock, BLOCK,
};

/// Largest single write or read of metadata (1 MiB): big enough to stream, small enough to
/// keep progress moving and memory flat.
const MAX_IO_BLOCKS: u32 = 256;

/// Options of `zonedd format`.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// At most 31 bytes; default "zonedd-" and a hash of the device description.
    pub label: Option<String>,
    /// Sequential zones kept free for reclaim (dmzadm `--seq`, default 16).
    pub reserved_seq: u32,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            label: None,
            reserved_seq: 16,
        }
    }
}

/// The default label: stable for a given device description, short enough for the field.
pub fn default_label(dev: &dyn ZonedDevice) -> String {
    format!("zonedd-{:08x}", linux_crc32(0, dev.describe().as_bytes()))
}

/// Split `nblocks` metadata blocks of `set` from `first_mblk` into device extents that never
/// cross a zone end nor exceed [`MAX_IO_BLOCKS`]: yields (byte offset, first block index, count).
fn extents(layout: &Layout, set: usize, first_mblk: u32, nblocks: u32) -> Vec<(u64, u32, u32)> {
    let mut out = Vec::new();
    let mut done = 0u32;
    while done < nblocks {
        let abs = layout.set_start_block(set) + (first_mblk + done) as u64;
        let to_zone_end = layout.zone_blocks as u64 - (abs & (layout.zone_blocks as u64 - 1));
        let n = (nblocks - done)
            .min(MAX_IO_BLOCKS)
            .min(to_zone_end.min(u32::MAX as u64) as u32);
        out.push((abs * BLOCK as u64, done, n));
        done += n;
    }
    out
}

fn check_range(layout: &Layout, first_mblk: u32, len: usize) -> Result<u32> {
    if len & (BLOCK - 1) != 0 {
        return Err(FormatError::Invalid(format!(
            "metadata buffer of {len} bytes is not a whole number of blocks"
        )));
    }
    let n = (len / BLOCK) as u64;
    if first_mblk as u64 + n > layout.nr_meta_blocks as u64 {
        return Err(FormatError::Invalid(format!(
            "metadata blocks {first_mblk}..{} past the end of the set ({} blocks)",
            first_mblk as u64 + n,
            layout.nr_meta_blocks
        )));
    }
    Ok(n as u32)
}

/// Read metadata blocks `first_mblk..` of `set` into `buf` (a multiple of 4096 bytes).
pub fn read_meta_blocks(
    dev: &dyn ZonedDevice,
    layout: &Layout,
    set: usize,
    first_mblk: u32,
    buf: &mut [u8],
) -> Result<()> {
    let n = check_range(layout, first_mblk, buf.len())?;
    for (off, idx, cnt) in extents(layout, set, first_mblk, n) {
        let b = idx as usize * BLOCK;
        dev.read_at(&mut buf[b..b + cnt as usize * BLOCK], off)?;
    }
    Ok(())
}

/// Write `buf` (a multiple of 4096 bytes) as metadata blocks `first_mblk..` of `set`. Not
/// durable until `dev.flush()`.
pub fn write_meta_blocks(
    dev: &dyn ZonedDevice,
    layout: &Layout,
    set: usize,
    first_mblk: u32,
    buf: &[u8],
) -> Result<()> {
    let n = check_range(layout, first_mblk, buf.len())?;
    for (off, idx, cnt) in extents(layout, set, first_mblk, n) {
        let b = idx as usize * BLOCK;
        dev.write_at(&buf[b..b + cnt as usize * BLOCK], off)?;
    }
    Ok(())
}

/// Write `sb` as the superblock of `set` (its `sb_block` is set to that set's location).
/// Not durable until `dev.flush()`.
pub fn write_superblock(
    dev: &dyn ZonedDevice,
    layout: &Layout,
    set: usize,
    sb: &Superblock,
) -> Result<()> {
    let mut sb = sb.clone();
    sb.sb_block = layout.set_start_block(set);
    write_meta_blocks(dev, layout, set, 0, &sb.encode()[..])
}

/// Format `dev`: reset every sequential zone, then write the primary set and the secondary
/// set (map all unmapped, bitmaps empty, superblock gen 1, written last in each set), then
/// flush. `progress(done, total)` counts metadata blocks written.
pub fn format_device(
    dev: &dyn ZonedDevice,
    opts: &FormatOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Layout> {
    let geometry = dev.geometry();
    let zones = dev.report_all()?;
    let shape = Shape::of(&dev.members());
    let layout = Layout::compute_on(&zones, &geometry, &shape, opts.reserved_seq)?;
    let label = match &opts.label {
        Some(l) => label_field(l)?,
        None => label_field(&default_label(dev))?,
    };
    let set_uuid = uuid::Uuid::new_v4().into_bytes();
    let dev_uuid = uuid::Uuid::new_v4().into_bytes();
    let total = 2 * layout.nr_meta_blocks as u64;
    progress(0, total);
    dev.reset_all()?;

    // Map blocks are all 0xFF (unmapped), bitmap blocks all zero. Build one max-size buffer
    // of each and stream it.
    let ff = vec![0xFFu8; MAX_IO_BLOCKS as usize * BLOCK];
    let zero = vec![0u8; MAX_IO_BLOCKS as usize * BLOCK];
    let mut done = 0u64;
    for set in 0..2 {
        info!(
            set,
            block = layout.set_start_block(set),
            "writing metadata set"
        );
        let regions = [
            (1, layout.nr_map_blocks, &ff),
            (layout.first_bitmap_block(), layout.nr_bitmap_blocks, &zero),
        ];
        for (first, count, fill) in regions {
            let mut m = 0;
            while m < count {
                let n = (count - m).min(MAX_IO_BLOCKS);
                write_meta_blocks(dev, &layout, set, first + m, &fill[..n as usize * BLOCK])?;
                m += n;
                done += n as u64;
                progress(done, total);
            }
        }
        let sb = layout.superblock(set, 1, label, set_uuid, dev_uuid);
        write_superblock(dev, &layout, set, &sb)?;
        done += 1;
        progress(done, total);
    }
    // Multi-device: each zoned drive gets its tertiary superblock (gen 0, its own device
    // UUID) in block 0, its first zone, which the reset above left empty.
    for i in 0..layout.tertiary_zones.len() {
        let sb = layout.tertiary_superblock(i, label, set_uuid, uuid::Uuid::new_v4().into_bytes());
        dev.write_at(&sb.encode()[..], layout.tertiary_block(i) * BLOCK as u64)?;
    }
    dev.flush()?;
    info!(
        label = %String::from_utf8_lossy(&label).trim_end_matches('\0'),
        uuid = %uuid_string(&set_uuid),
        chunks = layout.nr_chunks,
        "formatted"
    );
    Ok(layout)
}

/// What was found at one set's superblock location.
#[derive(Debug, Clone)]
pub struct SetProbe {
    /// Zone where the superblock was looked for (None: no candidate zone).
    pub zone: Option<u32>,
    /// The block there starts with the dm-zoned magic.
    pub magic: bool,
    /// The decoded superblock and its layout, when fully valid.
    pub valid: Option<(Superblock, Layout)>,
    /// Why it is not valid.
    pub error: Option<String>,
}

impl SetProbe {
    fn missing(zone: Option<u32>, why: impl Into<String>) -> SetProbe {
        SetProbe {
            zone,
            magic: false,
            valid: None,
            error: Some(why.into()),
        }
    }

    pub fn gen(&self) -> Option<u64> {
        self.valid.as_ref().map(|(sb, _)| sb.gen)
    }
}

/// Both superblocks of a device, read and validated, nothing written.
#[derive(Debug, Clone)]
pub struct Probe {
    pub geometry: Geometry,
    pub zones: Vec<Zone>,
    pub sets: [SetProbe; 2],
    /// Multi-device: the devices, and per zoned drive why its tertiary superblock does not
    /// belong to this volume (`None`: it does).
    pub members: Vec<zbd::Member>,
    pub tertiary: Vec<Option<String>>,
}

fn read_block(dev: &dyn ZonedDevice, block: u64) -> Result<Box<[u8; BLOCK]>> {
    let mut b = Box::new([0u8; BLOCK]);
    dev.read_at(&mut b[..], block * BLOCK as u64)?;
    Ok(b)
}

/// Validate the superblock found in `zone` as the one of `set`.
fn check_sb_at(
    dev: &dyn ZonedDevice,
    zones: &[Zone],
    geometry: &Geometry,
    shape: &Shape,
    zone: u32,
    set: usize,
) -> Result<SetProbe> {
    let zone_blocks = geometry.zone_blocks();
    let at = zone as u64 * zone_blocks;
    let block = read_block(dev, at)?;
    let magic = has_magic(&block[..]);
    let fail = |e: String| SetProbe {
        zone: Some(zone),
        magic,
        valid: None,
        error: Some(e),
    };
    let sb = match Superblock::decode(&block[..]) {
        Ok(sb) => sb,
        Err(e) => return Ok(fail(e.to_string())),
    };
    // Like the kernel's dmz_check_sb: a superblock is only valid where it says it is (a copy
    // found elsewhere, e.g. inside an image stored on the volume, is not this device's).
    if sb.sb_block != at {
        return Ok(fail(format!(
            "bad superblock field sb_block: {}, but it was read from block {at} (zone {zone})",
            sb.sb_block
        )));
    }
    if shape.cache_zones.is_some() {
        let zbb = (geometry.zone_blocks() / (8 * BLOCK as u64)).max(1);
        let volume_zones = sb.nr_bitmap_blocks as u64 / zbb;
        if volume_zones != geometry.nr_zones as u64 {
            return Ok(fail(format!(
                "the volume spans {volume_zones} zones but the cache and zoned drives given \
                 have {}: a zoned drive is missing, extra or of another size",
                geometry.nr_zones
            )));
        }
    }
    let layout = match Layout::from_superblock_on(&sb, zones, geometry, shape) {
        Ok(l) => l,
        Err(e @ FormatError::Zbd(_)) => return Err(e),
        Err(e) => return Ok(fail(e.to_string())),
    };
    let expected = layout.set_start_block(set);
    if sb.sb_block != expected {
        return Ok(fail(format!(
            "bad superblock field sb_block: {}, expected {expected} (set {set} in zone {})",
            sb.sb_block, layout.set_zone[set]
        )));
    }
    Ok(SetProbe {
        zone: Some(zone),
        magic,
        valid: Some((sb, layout)),
        error: None,
    })
}

/// The first usable conventional zone: where the primary superblock lives.
fn primary_zone(zones: &[Zone], geometry: &Geometry) -> Option<u32> {
    zones
        .iter()
        .find(|z| {
            z.zone_type == ZoneType::Conventional
                && z.len == geometry.zone_size
                && !matches!(
                    z.cond,
                    zbd::ZoneCondition::Offline | zbd::ZoneCondition::ReadOnly
                )
        })
        .map(|z| z.id)
}

/// Read and validate both superblocks like the kernel's `dmz_load_sb`: superblock 0 in the
/// first conventional zone; superblock 1 right after set 0 when superblock 0 is good,
/// otherwise the first zone after it carrying the magic. Writes nothing.
pub fn probe(dev: &dyn ZonedDevice) -> Result<Probe> {
    let geometry = dev.geometry();
    let zones = dev.report_all()?;
    let members = dev.members();
    let shape = Shape::of(&members);
    Layout::check_device(&zones, &geometry)?;
    let Some(z0) = primary_zone(&zones, &geometry) else {
        let why = "no usable conventional zone: cannot hold dm-zoned metadata";
        return Ok(Probe {
            geometry,
            zones,
            sets: [SetProbe::missing(None, why), SetProbe::missing(None, why)],
            members,
            tertiary: Vec::new(),
        });
    };
    let p0 = check_sb_at(dev, &zones, &geometry, &shape, z0, 0)?;
    if !p0.magic && crate::lsl::is_log_layout(dev) {
        // Not "not formatted": formatting would destroy it, and repairing would too.
        return Err(FormatError::Device(format!(
            "{}: a log-layout volume (superblock \"ZLOG\"), not dm-zoned metadata",
            dev.describe()
        )));
    }
    let p1 = if let Some((sb0, l0)) = &p0.valid {
        let mut p1 = check_sb_at(dev, &zones, &geometry, &shape, l0.set_zone[1], 1)?;
        // The sets must describe the same volume (kernel: same UUID and label).
        if let Some((sb1, _)) = &p1.valid {
            let mismatch = if sb1.set_uuid != sb0.set_uuid {
                Some(format!(
                    "set UUID {} differs from superblock 0's {}",
                    uuid_string(&sb1.set_uuid),
                    uuid_string(&sb0.set_uuid)
                ))
            } else if sb1.label != sb0.label {
                Some(format!(
                    "label {:?} differs from superblock 0's {:?}",
                    sb1.label_str(),
                    sb0.label_str()
                ))
            } else if (sb1.nr_meta_blocks, sb1.nr_reserved_seq, sb1.nr_chunks)
                != (sb0.nr_meta_blocks, sb0.nr_reserved_seq, sb0.nr_chunks)
            {
                Some("sizes differ from superblock 0's".to_string())
            } else {
                None
            };
            if let Some(m) = mismatch {
                p1.valid = None;
                p1.error = Some(m);
            }
        }
        p1
    } else {
        // Scan forward for the secondary superblock, as the kernel does. An offline zone
        // (a cache device's trailing runt) is neither counted nor read.
        let offline = |z: u32| {
            zones
                .get(z as usize)
                .is_some_and(|z| z.cond == ZoneCondition::Offline)
        };
        let nr_rnd = zones
            .iter()
            .filter(|z| z.zone_type == ZoneType::Conventional && z.cond != ZoneCondition::Offline)
            .count() as u32;
        let mut found = SetProbe::missing(None, "no secondary superblock found");
        for i in 1..nr_rnd.max(1) {
            let z = z0 + i;
            if z >= geometry.nr_zones {
                break;
            }
            if offline(z) {
                continue;
            }
            let block = read_block(dev, z as u64 * geometry.zone_blocks())?;
            if has_magic(&block[..]) {
                found = check_sb_at(dev, &zones, &geometry, &shape, z, 1)?;
                break;
            }
        }
        found
    };
    let tertiary = match p0.valid.as_ref().or(p1.valid.as_ref()) {
        Some((sb, layout)) => (0..layout.tertiary_zones.len())
            .map(|i| check_tertiary(dev, layout, sb, i))
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    Ok(Probe {
        geometry,
        zones,
        sets: [p0, p1],
        members,
        tertiary,
    })
}

/// Whether zoned drive `i` carries this volume's tertiary superblock where the layout puts
/// it (kernel `dmz_check_sb` on a tertiary superblock: magic, CRC, location, set UUID,
/// label, a device UUID). `Some(why)` when not.
fn check_tertiary(
    dev: &dyn ZonedDevice,
    layout: &Layout,
    sb: &Superblock,
    i: usize,
) -> Result<Option<String>> {
    let at = layout.tertiary_block(i);
    let block = read_block(dev, at)?;
    let t = match Superblock::decode(&block[..]) {
        Ok(t) => t,
        Err(e) => return Ok(Some(format!("no tertiary superblock of this volume ({e})"))),
    };
    let why = if t.set_uuid != sb.set_uuid {
        format!(
            "its tertiary superblock is of another volume (set UUID {}, this volume's is {})",
            uuid_string(&t.set_uuid),
            uuid_string(&sb.set_uuid)
        )
    } else if t.sb_block != at {
        format!(
            "its tertiary superblock says block {}, but the drive starts at block {at}: give \
             the zoned drives in the order they were formatted in",
            t.sb_block
        )
    } else if t.label != sb.label {
        format!("its tertiary superblock has label {:?}", t.label_str())
    } else if t.dev_uuid == [0; 16] {
        "its tertiary superblock has a null device UUID".to_string()
    } else {
        return Ok(None);
    };
    Ok(Some(why))
}

impl Probe {
    /// The set to use: the valid one with the higher gen, set 0 on a tie.
    pub fn choose(&self, what: &str) -> Result<(usize, Superblock, Layout)> {
        let g = [self.sets[0].gen(), self.sets[1].gen()];
        let primary = match g {
            [Some(a), Some(b)] => usize::from(a < b),
            [Some(_), None] => 0,
            [None, Some(_)] => 1,
            [None, None] => {
                if !self.sets.iter().any(|s| s.magic) {
                    return Err(FormatError::NotFormatted(format!(
                        "no valid dm-zoned superblock on {what}: not formatted? run \
                         `zonedd format --backend {what}`"
                    )));
                }
                // Metadata v1 in every superblock found: say so, it is not damage.
                let v1 = FormatError::Version1.to_string();
                if self
                    .sets
                    .iter()
                    .filter(|s| s.magic)
                    .all(|s| s.error.as_deref() == Some(v1.as_str()))
                {
                    return Err(FormatError::Version1);
                }
                // A device set that is not the volume's (a drive missing or extra) says so
                // once, whichever superblock is read.
                if let [Some(a), Some(b)] = [&self.sets[0].error, &self.sets[1].error] {
                    if a == b && a.contains("a zoned drive is missing") {
                        return Err(FormatError::Device(a.clone()));
                    }
                }
                let why: Vec<String> = self
                    .sets
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        format!(
                            "superblock {i}: {}",
                            s.error.as_deref().unwrap_or("not found")
                        )
                    })
                    .collect();
                return Err(FormatError::Corrupt(why.join("; ")));
            }
        };
        let (sb, layout) = self.sets[primary].valid.clone().expect("chosen set valid");
        self.check_members()?;
        Ok((primary, sb, layout))
    }

    /// Every zoned drive of a multi-device volume must be this volume's, in its place: a
    /// foreign or misplaced drive refuses the whole volume, naming the drive.
    pub fn check_members(&self) -> Result<()> {
        for (i, why) in self.tertiary.iter().enumerate() {
            if let Some(why) = why {
                let name = self
                    .members
                    .get(i + 1)
                    .map_or_else(|| format!("zoned drive {}", i + 1), |m| m.name.clone());
                return Err(FormatError::Device(format!(
                    "{name} is not a member of this volume: {why}"
                )));
            }
        }
        Ok(())
    }
}

/// A loaded device: the primary superblock and layout, both sets consistent on disk.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub sb: Superblock,
    pub layout: Layout,
    /// 0 or 1: the set that was chosen (the other one now equals it).
    pub primary: usize,
    /// What was repaired, for logs.
    pub actions: Vec<String>,
}

/// Copy metadata blocks 1.. of set `from` onto set `to`, flush, then write `to`'s superblock
/// (a copy of `sb` at `to`'s location) and flush: the superblock goes last so a crash leaves
/// `to` invalid rather than half-copied.
pub fn copy_set(
    dev: &dyn ZonedDevice,
    layout: &Layout,
    from: usize,
    to: usize,
    sb: &Superblock,
) -> Result<()> {
    let mut buf = vec![0u8; MAX_IO_BLOCKS as usize * BLOCK];
    let mut m = 1;
    while m < layout.nr_meta_blocks {
        let n = (layout.nr_meta_blocks - m).min(MAX_IO_BLOCKS);
        let b = &mut buf[..n as usize * BLOCK];
        read_meta_blocks(dev, layout, from, m, b)?;
        write_meta_blocks(dev, layout, to, m, b)?;
        m += n;
    }
    dev.flush()?;
    write_superblock(dev, layout, to, sb)?;
    dev.flush()?;
    Ok(())
}

/// Metadata blocks (1..) whose content differs between the two sets.
pub fn diff_sets(dev: &dyn ZonedDevice, layout: &Layout) -> Result<Vec<u32>> {
    let mut x = vec![0u8; MAX_IO_BLOCKS as usize * BLOCK];
    let mut y = vec![0u8; MAX_IO_BLOCKS as usize * BLOCK];
    let mut differ = Vec::new();
    let mut m = 1;
    while m < layout.nr_meta_blocks {
        let n = (layout.nr_meta_blocks - m).min(MAX_IO_BLOCKS);
        let len = n as usize * BLOCK;
        read_meta_blocks(dev, layout, 0, m, &mut x[..len])?;
        read_meta_blocks(dev, layout, 1, m, &mut y[..len])?;
        for i in 0..n as usize {
            if x[i * BLOCK..(i + 1) * BLOCK] != y[i * BLOCK..(i + 1) * BLOCK] {
                differ.push(m + i as u32);
            }
        }
        m += n;
    }
    Ok(differ)
}

/// Load the metadata of `dev`: validate both superblocks, choose the primary (higher gen,
/// set 0 on a tie), and make the other set an exact copy of it when it is bad, older, or
/// differs at the same gen (all metadata blocks of both sets are read when gens are equal).
pub fn load(dev: &dyn ZonedDevice) -> Result<Loaded> {
    let p = probe(dev)?;
    let (primary, sb, layout) = p.choose(&dev.describe())?;
    let other = primary ^ 1;
    let mut actions = Vec::new();
    match &p.sets[other].valid {
        None => {
            let why = p.sets[other].error.clone().unwrap_or_default();
            warn!(set = other, %why, "superblock invalid; rebuilding the set from set {primary}");
            copy_set(dev, &layout, primary, other, &sb)?;
            actions.push(format!(
                "rebuilt metadata set {other} from set {primary} (gen {}): {why}",
                sb.gen
            ));
        }
        Some((osb, _)) if osb.gen != sb.gen => {
            warn!(
                set = other,
                gen = osb.gen,
                primary_gen = sb.gen,
                "stale metadata set; copying the newer set over it"
            );
            copy_set(dev, &layout, primary, other, &sb)?;
            actions.push(format!(
                "resynchronised metadata set {other} (gen {}) from set {primary} (gen {})",
                osb.gen, sb.gen
            ));
        }
        Some((osb, _)) => {
            // Equal gens can still hide different blocks: a crash while a commit was
            // logging into the other set. Bring it back to the primary's content.
            let differ = diff_sets(dev, &layout)?;
            if !differ.is_empty() {
                warn!(
                    set = other,
                    blocks = differ.len(),
                    "metadata sets differ at equal gen"
                );
                let mut b = vec![0u8; BLOCK];
                for &m in &differ {
                    read_meta_blocks(dev, &layout, primary, m, &mut b)?;
                    write_meta_blocks(dev, &layout, other, m, &b)?;
                }
                dev.flush()?;
                actions.push(format!(
                    "resynchronised {} differing block(s) of metadata set {other} from set \
                     {primary} (both gen {})",
                    differ.len(),
                    sb.gen
                ));
            }
            // Then the superblocks, last, every field but sb_block (check compares the same): dmzadm
            // writes one device UUID in both sets of a device, so a differing one is damage.
            let mut same = osb.clone();
            same.sb_block = sb.sb_block;
            if same != sb {
                warn!(set = other, "superblocks differ at equal gen");
                write_superblock(dev, &layout, other, &sb)?;
                dev.flush()?;
                actions.push(format!(
                    "rewrote superblock {other} from superblock {primary} (both gen {}): \
                     fields differed",
                    sb.gen
                ));
            }
        }
    }
    Ok(Loaded {
        sb,
        layout,
        primary,
        actions,
    })
}
