//! Fuzz target bodies, shared by the libFuzzer targets (`fuzz_targets/*.rs`, run by
//! `scripts/fuzz.sh`) and by plain `cargo test` (`tests/fuzz_regressions.rs` includes this file
//! and runs every seed and past finding through it).
//!
//! Each body takes arbitrary bytes and panics only when an invariant is broken:
//! - [`superblock`]: `Superblock::decode` never panics; what it accepts re-encodes to the same
//!   fields and decodes back equal.
//! - [`layout`]: `Layout::compute` / `Layout::from_superblock` on arbitrary geometry, zone
//!   conditions and superblock fields; every layout they return is self-consistent (metadata
//!   zones exist and are conventional, every metadata block is inside its set's zones, the map
//!   covers every chunk), and a computed layout round-trips through its superblock.
//! - [`load`]: a small in-memory zoned device (a zonedd-formatted image, one written by the
//!   engine, or the kernel vectors) mutated by a list of operations (byte patches over both
//!   metadata zones, optionally re-sealed with a valid CRC; sequential writes; zone resets,
//!   read-only and offline zones). Then: `sets::load` is either a clear error or leaves both
//!   sets identical (a second load changes nothing); a loaded device can always be checked and
//!   shows no set-level finding; the engine opens or refuses without panicking and serves
//!   reads, a write and a close; `check --repair` leaves nothing repairable behind; a clean
//!   volume opens in the engine, reads back what was written, and is still clean after close.
//! - [`lsl_load`]: the same game for the log layout (`dmz::lsl`): a small formatted image
//!   (fresh, closed after writes, or left as a crash leaves it: records in the log, GC done)
//!   mutated by byte patches over the conventional space (optionally resealed with the CRC
//!   the block's area wants, `dmz::lsl::debug_reseal`), sequential appends, zone resets,
//!   finishes and read-only/offline zones. Then `LogEngine::open` refuses or gives an engine
//!   whose state is consistent (`debug_check`), and `lsl::check` refuses no volume open
//!   takes; what it serves, with writes on top, is what it serves again after a clean close
//!   and reopen, and check finds no error then.
//! - [`request`]: ublk descriptor decoding and per-chunk split (crate ublk-request, the
//!   frontend's `request`): accepted requests are aligned, inside the device and the buffer,
//!   and split into contiguous pieces that never cross a chunk end.

use std::sync::{Arc, OnceLock};

use dmz::check::{check, FindingKind};
use dmz::engine::{Engine, EngineOptions};
use dmz::format::{
    decode_map_block, iter_set_bits, linux_crc32, Layout, MapEntry, Superblock, BLOCK,
    MAP_ENTRIES_PER_BLOCK,
};
use dmz::lsl::{LogEngine, LogOptions};
use dmz::sets::{self, FormatOptions};
use zbd::{Geometry, MemDevice, Zone, ZoneCondition, ZoneOp, ZoneType, ZonedDevice};

/// Offset of the CRC field in a superblock.
const OFF_CRC: usize = 44;

/// Recompute the CRC of a superblock block in place, so that mutated fields get past the CRC
/// check and reach the field validation.
pub fn seal_superblock(block: &mut [u8]) {
    if block.len() < BLOCK {
        return;
    }
    let gen = u64::from_le_bytes(block[8..16].try_into().expect("8 bytes"));
    block[OFF_CRC..OFF_CRC + 4].fill(0);
    let crc = linux_crc32(gen as u32, &block[..BLOCK]);
    block[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A cursor over fuzz input that yields zeros once exhausted.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        (self.u32() as u64) | ((self.u32() as u64) << 32)
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

// ---------------------------------------------------------------------------------------------
// (a) superblock decode

/// Byte 0 bit 0: re-seal the CRC before decoding. The rest, zero-padded to 4096 bytes, is the
/// superblock block. The unpadded input is decoded too (short blocks must be refused).
pub fn superblock(data: &[u8]) {
    let _ = Superblock::decode(data);
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut block = vec![0u8; BLOCK];
    let n = rest.len().min(BLOCK);
    block[..n].copy_from_slice(&rest[..n]);
    if mode & 1 != 0 {
        seal_superblock(&mut block);
    }
    let Ok(sb) = Superblock::decode(&block) else {
        return;
    };
    let enc = sb.encode();
    // Every field (magic .. device UUID) is re-encoded as read; the CRC matches too when the
    // bytes past the fields were zero (encode zeroes them).
    assert_eq!(enc[..OFF_CRC], block[..OFF_CRC], "fields before the CRC");
    assert_eq!(
        enc[OFF_CRC + 4..112],
        block[OFF_CRC + 4..112],
        "fields after the CRC"
    );
    if block[112..].iter().all(|&b| b == 0) {
        assert_eq!(
            enc[..],
            block[..],
            "a canonical block re-encodes byte for byte"
        );
    }
    let again = Superblock::decode(&enc[..]).expect("an encoded superblock decodes");
    assert_eq!(again, sb);
    let _ = sb.label_str();
    let _ = format!("{sb:?}");
    // Validate it against a small device too: the field checks must not panic.
    let (zones, geo) = zone_report(1 << 20, 64, 8, &[]);
    if let Ok(l) = Layout::from_superblock(&sb, &zones, &geo) {
        layout_invariants(&l, &zones, &geo);
    }
}

// ---------------------------------------------------------------------------------------------
// (b) layout sizing, map and bitmap blocks

/// A contiguous zone report: `nr_conv` conventional zones then sequential ones; `special`
/// gives (zone, what) to make read-only (0), offline (1), a runt (2, the last zone only) or
/// full (3).
fn zone_report(
    zone_size: u64,
    nr_zones: u32,
    nr_conv: u32,
    special: &[(u32, u8)],
) -> (Vec<Zone>, Geometry) {
    let mut zones: Vec<Zone> = (0..nr_zones)
        .map(|i| {
            let conv = i < nr_conv;
            let start = i as u64 * zone_size;
            Zone {
                id: i,
                start,
                len: zone_size,
                capacity: zone_size,
                wp: start,
                zone_type: if conv {
                    ZoneType::Conventional
                } else {
                    ZoneType::SeqWriteRequired
                },
                cond: if conv {
                    ZoneCondition::NotWp
                } else {
                    ZoneCondition::Empty
                },
            }
        })
        .collect();
    for &(z, what) in special {
        let Some(zone) = zones.get_mut((z % nr_zones.max(1)) as usize) else {
            continue;
        };
        match what % 4 {
            0 => zone.cond = ZoneCondition::ReadOnly,
            1 => zone.cond = ZoneCondition::Offline,
            2 if zone.id + 1 == nr_zones => {
                zone.len = zone_size / 2;
                zone.capacity = zone.len;
            }
            3 if zone.zone_type.is_sequential() => {
                zone.cond = ZoneCondition::Full;
                zone.wp = zone.start + zone.len;
            }
            _ => {}
        }
    }
    let geo = Geometry {
        zone_size,
        zone_capacity: zone_size,
        nr_zones,
        block_size: 4096,
        max_open_zones: 0,
        max_active_zones: 0,
    };
    (zones, geo)
}

/// What every accepted layout must satisfy.
fn layout_invariants(l: &Layout, zones: &[Zone], geo: &Geometry) {
    let zb = l.zone_blocks as u64;
    assert!(l.zone_blocks.is_power_of_two());
    assert_eq!(zb * BLOCK as u64, geo.zone_size);
    assert_eq!(1u64 << l.zone_blocks_shift, zb);
    assert_eq!(l.nr_zones, geo.nr_zones);
    assert!(l.nr_chunks >= 1 || l.nr_chunks == 0);
    // Sizes agree with each other.
    assert_eq!(
        l.nr_meta_blocks as u64,
        1 + l.nr_map_blocks as u64 + l.nr_bitmap_blocks as u64
    );
    assert!(l.nr_map_blocks as u64 * MAP_ENTRIES_PER_BLOCK as u64 >= l.nr_chunks as u64);
    assert_eq!(
        l.nr_meta_zones as u64,
        (l.nr_meta_blocks as u64).div_ceil(zb)
    );
    assert_eq!(
        l.nr_bitmap_blocks as u64,
        l.nr_zones as u64 * l.zone_bitmap_blocks as u64
    );
    assert!(l.zone_bitmap_blocks as u64 * 8 * BLOCK as u64 >= zb);
    // Both sets sit on existing, usable, conventional zones, one after the other.
    assert_eq!(l.set_zone[1], l.set_zone[0] + l.nr_meta_zones);
    let m = l.meta_zones();
    assert!(
        m.end <= l.nr_zones,
        "metadata zones {m:?} past {} zones",
        l.nr_zones
    );
    for z in m.clone() {
        let zone = &zones[z as usize];
        assert_eq!(zone.zone_type, ZoneType::Conventional, "metadata zone {z}");
        assert!(!matches!(
            zone.cond,
            ZoneCondition::Offline | ZoneCondition::ReadOnly
        ));
    }
    // Chunks and metadata fit in the usable zones; so do the reserved zones, except those
    // lost (offline or read-only) since the format, which a degraded volume takes out of
    // its reserve.
    assert!(l.nr_chunks as u64 + 2 * l.nr_meta_zones as u64 <= l.nr_usable_zones as u64);
    assert!(
        l.nr_chunks as u64 + 2 * l.nr_meta_zones as u64 + l.nr_reserved_seq as u64
            <= l.nr_usable_zones as u64 + l.nr_lost_zones as u64
    );
    assert!(l.nr_rnd_zones <= l.nr_usable_zones && l.nr_usable_zones <= l.nr_zones);
    // Every metadata block of both sets is inside the device and its set's zones.
    for set in 0..2 {
        let last = l.mblk_offset(set, l.nr_meta_blocks - 1);
        assert!(last + BLOCK as u64 <= geo.capacity());
        let set_end = (l.set_zone[set] as u64 + l.nr_meta_zones as u64) * geo.zone_size;
        assert!(last + BLOCK as u64 <= set_end);
    }
    // Addressing helpers stay inside the set.
    if l.nr_chunks > 0 {
        let (mblk, idx) = l.map_block(l.nr_chunks - 1);
        assert!(mblk >= 1 && mblk <= l.nr_map_blocks && idx < MAP_ENTRIES_PER_BLOCK);
    }
    let last_bitmap = l.bitmap_block(l.nr_zones - 1, l.zone_blocks - 1);
    assert!(last_bitmap < l.nr_meta_blocks && last_bitmap >= l.first_bitmap_block());
    assert!(l.bits_per_bitmap_block() <= l.zone_blocks);
    assert_eq!(
        l.exposed_bytes(),
        l.nr_chunks as u64 * geo.zone_size,
        "exposed capacity"
    );
}

/// Geometry, zone conditions and a reserved count or raw superblock fields from the input.
pub fn layout(data: &[u8]) {
    let mut b = Bytes(data);
    let g = b.u8();
    let zone_size = if g & 0x80 != 0 {
        // Not a power of two, or too small: must be refused.
        (b.u16() as u64 + 1) * 512
    } else {
        1u64 << (12 + (g % 20))
    };
    let nr_zones = (b.u16() % 2048) as u32 + 1;
    let nr_conv = (b.u16() as u32) % (nr_zones + 1);
    let nspecial = (b.u8() % 8) as usize;
    let special: Vec<(u32, u8)> = (0..nspecial).map(|_| (b.u16() as u32, b.u8())).collect();
    let (mut zones, mut geo) = zone_report(zone_size, nr_zones, nr_conv, &special);
    let tweak = b.u8();
    match tweak % 8 {
        1 => geo.zone_capacity = zone_size / 2,
        2 => geo.block_size = 512 << (b.u8() % 6),
        3 => geo.nr_zones = geo.nr_zones.wrapping_add(1),
        4 => {
            if let Some(z) = zones.last_mut() {
                z.start += BLOCK as u64;
            }
        }
        5 => {
            if let Some(z) = zones.first_mut() {
                z.capacity = z.len / 2;
            }
        }
        _ => {}
    }
    let reserved = b.u32() % 64;
    let mode = b.u8();
    let computed = Layout::compute(&zones, &geo, reserved);
    if let Ok(l) = &computed {
        layout_invariants(l, &zones, &geo);
        // A layout written as a superblock is read back as the same layout.
        let sb = l.superblock(
            0,
            1,
            *b"fuzz\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
            [1; 16],
            [2; 16],
        );
        let sb = Superblock::decode(&sb.encode()[..]).expect("encoded superblock");
        let back = Layout::from_superblock(&sb, &zones, &geo).expect("own superblock accepted");
        assert_eq!(&back, l);
    }
    // A superblock with fields from the input, or the computed one with one field changed.
    let mut sb = match &computed {
        Ok(l) if mode & 1 == 0 => l.superblock(1, 3, [b'x'; 32], [3; 16], [4; 16]),
        _ => Superblock {
            gen: b.u64(),
            sb_block: b.u64(),
            nr_meta_blocks: b.u32(),
            nr_reserved_seq: b.u32(),
            nr_chunks: b.u32(),
            nr_map_blocks: b.u32(),
            nr_bitmap_blocks: b.u32(),
            label: [b'y'; 32],
            set_uuid: [b.u8(); 16],
            dev_uuid: [b.u8(); 16],
        },
    };
    let delta = b.u32();
    match (mode >> 1) % 6 {
        0 => sb.nr_meta_blocks = sb.nr_meta_blocks.wrapping_add(delta),
        1 => sb.nr_reserved_seq = sb.nr_reserved_seq.wrapping_add(delta),
        2 => sb.nr_chunks = sb.nr_chunks.wrapping_add(delta),
        3 => sb.nr_map_blocks = sb.nr_map_blocks.wrapping_add(delta),
        4 => sb.nr_bitmap_blocks = sb.nr_bitmap_blocks.wrapping_add(delta),
        _ => {}
    }
    if let Ok(l) = Layout::from_superblock(&sb, &zones, &geo) {
        layout_invariants(&l, &zones, &geo);
    }

    // Map and bitmap blocks from the rest of the input.
    let mut block = vec![0u8; BLOCK];
    let rest = b.take(BLOCK);
    block[..rest.len()].copy_from_slice(rest);
    let entries = decode_map_block(&block);
    assert_eq!(entries.len(), MAP_ENTRIES_PER_BLOCK);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(*e, MapEntry::read(&block, i));
        let mut copy = vec![0u8; BLOCK];
        e.write(&mut copy, i);
        assert_eq!(copy[i * 8..i * 8 + 8], block[i * 8..i * 8 + 8]);
    }
    assert_eq!(dmz::format::encode_map_block(&entries)[..], block[..]);
    let nbits = b.u32();
    let bits: Vec<u32> = iter_set_bits(&block, nbits).collect();
    assert!(bits.windows(2).all(|w| w[0] < w[1]));
    assert!(bits
        .iter()
        .all(|&x| x < nbits && dmz::format::test_bit(&block, x)));
    let all = dmz::format::count_bits(&block);
    if nbits as u64 >= 8 * BLOCK as u64 {
        assert_eq!(bits.len() as u64, all);
    }
}

// ---------------------------------------------------------------------------------------------
// (c) the whole load path on mutated images

const SET_UUID: [u8; 16] = *b"zonedd-fuzz-set!";
const DEV_UUID: [u8; 16] = *b"zonedd-fuzz-dev!";

static VECTORS: [(&[u8], &[u8]); 4] = [
    (
        include_bytes!("../../../crates/dmz/tests/vectors/fresh-zone0-set.bin"),
        include_bytes!("../../../crates/dmz/tests/vectors/fresh-zone1-set.bin"),
    ),
    (
        include_bytes!("../../../crates/dmz/tests/vectors/used-zone0-set.bin"),
        include_bytes!("../../../crates/dmz/tests/vectors/used-zone1-set.bin"),
    ),
    (
        include_bytes!("../../../crates/dmz/tests/vectors/zonedd-fresh-zone0-set.bin"),
        include_bytes!("../../../crates/dmz/tests/vectors/zonedd-fresh-zone1-set.bin"),
    ),
    (
        include_bytes!("../../../crates/dmz/tests/vectors/zonedd-kernel-zone0-set.bin"),
        include_bytes!("../../../crates/dmz/tests/vectors/zonedd-kernel-zone1-set.bin"),
    ),
];

/// Engine options for short runs: no background reclaim, no timed commits.
fn engine_opts() -> EngineOptions {
    let mut o = EngineOptions::default();
    o.reclaim.enabled = false;
    o.commit_interval = std::time::Duration::from_secs(3600);
    o
}

/// 16 zones of 1 MiB, 4 conventional, formatted by zonedd with fixed UUIDs (deterministic).
fn small_formatted() -> MemDevice {
    let dev = MemDevice::with_zones(1 << 20, 16, 4).expect("mem device");
    let opts = FormatOptions {
        label: Some("fuzz".into()),
        reserved_seq: 2,
    };
    let l = sets::format_device(&dev, &opts, &mut |_, _| {}).expect("format");
    let label = dmz::format::label_field("fuzz").expect("label");
    for set in 0..2 {
        let sb = l.superblock(set, 1, label, SET_UUID, DEV_UUID);
        sets::write_superblock(&dev, &l, set, &sb).expect("superblock");
    }
    dev.flush().expect("flush");
    dev
}

/// The small image after the engine wrote a few chunks (sequential zones, buffers, bitmaps).
fn small_used() -> MemDevice {
    let dev = Arc::new(small_formatted());
    let e = Engine::open(dev.clone(), engine_opts()).expect("engine open");
    let cs = e.chunk_size();
    let blk = |v: u8| vec![v; BLOCK];
    e.write(0, &vec![0xA1; 64 * BLOCK], false).expect("w0");
    e.write(cs + 5 * BLOCK as u64, &blk(0xB2), false)
        .expect("w1");
    e.write(2 * cs, &blk(0xC3), true).expect("w2");
    e.write(2 * cs + BLOCK as u64, &blk(0xC4), false)
        .expect("w3");
    e.write(0, &blk(0xD5), false).expect("w4");
    e.discard(3 * BLOCK as u64, BLOCK as u64).expect("discard");
    e.close().expect("close");
    dev.snapshot()
}

/// 24 zones of 64 MiB, 8 conventional, with one of the kernel/dmzadm vector pairs.
fn vector_image(i: usize) -> MemDevice {
    let dev = MemDevice::with_zones(64 << 20, 24, 8).expect("mem device");
    let (s0, s1) = VECTORS[i];
    dev.write_at(s0, 0).expect("set 0");
    dev.write_at(s1, 64 << 20).expect("set 1");
    dev
}

fn base_image(which: u8) -> MemDevice {
    static BASES: OnceLock<Vec<MemDevice>> = OnceLock::new();
    let bases = BASES.get_or_init(|| {
        let mut v = vec![small_formatted(), small_used()];
        v.extend((0..VECTORS.len()).map(vector_image));
        v
    });
    bases[which as usize % bases.len()].snapshot()
}

/// Apply the mutation ops of the input to `dev`. Errors from the device (an offline zone,
/// a write off the write pointer) are part of the game and ignored.
fn mutate(dev: &MemDevice, b: &mut Bytes<'_>) {
    let geo = dev.geometry();
    let zb = geo.zone_blocks();
    let mut ops = 0;
    while !b.is_empty() && ops < 64 {
        ops += 1;
        match b.u8() % 5 {
            // Patch bytes in zones 0-3: both metadata sets (zones 0 and 1 on every base) and
            // two conventional data zones (where stray superblock copies could sit).
            0 => {
                let set = (b.u8() & 3) as u64;
                let blk = b.u16() as u64 % zb;
                let off = (b.u16() as usize) % BLOCK;
                let len = b.u8() as usize;
                let bytes = b.take(len).to_vec();
                let at = set * geo.zone_size + blk * BLOCK as u64;
                let mut block = vec![0u8; BLOCK];
                if dev.read_at(&mut block, at).is_err() {
                    continue;
                }
                let n = bytes.len().min(BLOCK - off);
                block[off..off + n].copy_from_slice(&bytes[..n]);
                let _ = dev.write_at(&block, at);
            }
            // Re-seal the CRC of the first block of zone 0-3 (a superblock, or a copy).
            1 => {
                let at = (b.u8() & 3) as u64 * geo.zone_size;
                let mut block = vec![0u8; BLOCK];
                if dev.read_at(&mut block, at).is_ok() {
                    seal_superblock(&mut block);
                    let _ = dev.write_at(&block, at);
                }
            }
            // Sequential appends, zone conditions, resets and finishes.
            k => zone_mutation(dev, k - 2, 32, b),
        }
    }
}

/// Zone-level damage shared by the mutators: `kind` 0 appends 1..=`max_append` blocks at a
/// sequential zone's write pointer (data no metadata names), 1 makes a zone read-only or
/// offline, 2 resets or finishes one. Device errors are part of the game and ignored.
fn zone_mutation(dev: &MemDevice, kind: u8, max_append: u8, b: &mut Bytes<'_>) {
    let nr_zones = dev.geometry().nr_zones;
    let z = b.u8() as u32 % nr_zones;
    match kind {
        0 => {
            let n = (b.u8() % max_append) as usize + 1;
            if let Ok(r) = dev.report_zones(z, 1) {
                if let Some(zone) = r.first().filter(|z| z.zone_type.is_sequential()) {
                    let _ = dev.write_at(&vec![0x5A; n * BLOCK], zone.wp);
                }
            }
        }
        1 => {
            let cond = if b.u8() & 1 == 0 {
                ZoneCondition::ReadOnly
            } else {
                ZoneCondition::Offline
            };
            let _ = dev.set_condition(z, cond);
        }
        _ => {
            let op = if b.u8() & 1 == 0 {
                ZoneOp::Reset
            } else {
                ZoneOp::Finish
            };
            let _ = dev.zone_mgmt(op, z);
        }
    }
}

/// Kinds about the two sets themselves, which a successful load must have fixed.
fn set_level(kind: FindingKind) -> bool {
    matches!(
        kind,
        FindingKind::Superblock | FindingKind::StaleSet | FindingKind::SetMismatch
    )
}

/// Reads at the start and end of the first chunks, one write read back, flush, close.
fn exercise_engine(e: Engine, pick: u8, strict: bool) {
    let cap = e.capacity();
    let cs = e.chunk_size();
    assert!(
        cs > 0 && cap.is_multiple_of(cs),
        "capacity {cap} is whole chunks of {cs}"
    );
    let chunks = cap / cs;
    let mut buf = vec![0u8; BLOCK];
    for c in 0..chunks.min(24) {
        for off in [c * cs, (c + 1) * cs - BLOCK as u64] {
            let r = e.read(off, &mut buf);
            assert!(r.is_ok() || !strict, "read at {off}: {r:?}");
        }
    }
    // Out of range requests are refused, not served.
    assert!(e.read(cap, &mut buf).is_err(), "read past the end");
    if cap >= BLOCK as u64 {
        let w = e.write(cap - BLOCK as u64, &vec![0; 2 * BLOCK], false);
        assert!(w.is_err(), "write across the end accepted");
    }
    if chunks > 0 {
        let off = (pick as u64 % chunks) * cs + (pick as u64 % 7) * BLOCK as u64;
        let data = vec![pick ^ 0x3C; BLOCK];
        match e.write(off, &data, pick & 1 != 0) {
            Ok(()) => {
                let r = e.read(off, &mut buf);
                if strict || r.is_ok() {
                    r.expect("read back");
                    assert_eq!(buf, data, "read back at {off}");
                }
            }
            // Reclaim is off: running out of free zones is a clean refusal.
            Err(err) => assert!(
                !strict || matches!(err, dmz::engine::EngineError::NoSpace(_)),
                "write at {off}: {err}"
            ),
        }
    }
    let f = e.flush();
    assert!(f.is_ok() || !strict, "flush: {f:?}");
    let c = e.close();
    assert!(c.is_ok() || !strict, "close: {c:?}");
}

fn geo_blocks(dev: &MemDevice) -> u64 {
    dev.geometry().zone_blocks()
}

/// Byte 0: base image; byte 1: which chunk/pattern the engine writes; then mutation ops.
pub fn load(data: &[u8]) {
    let mut b = Bytes(data);
    let dev = base_image(b.u8());
    let pick = b.u8();
    mutate(&dev, &mut b);

    // The engine on the image as it is (corrupt maps included): open or refuse, never panic.
    let raw: Arc<dyn ZonedDevice> = Arc::new(dev.snapshot());
    if let Ok(e) = Engine::open(raw, engine_opts()) {
        exercise_engine(e, pick, false);
    }

    let Ok(loaded) = sets::load(&dev) else {
        return;
    };
    // Both sets are now the same: loading again changes nothing.
    let again = sets::load(&dev).expect("second load after a successful one");
    assert!(
        again.actions.is_empty(),
        "second load acted: {:?}",
        again.actions
    );
    assert_eq!(again.layout, loaded.layout);
    let (mut x, mut y) = (again.sb.clone(), loaded.sb.clone());
    x.sb_block = 0;
    y.sb_block = 0;
    assert_eq!(x, y, "second load chose a different superblock");

    // Every superblock taken as valid was read where it says it is.
    let p = sets::probe(&dev).expect("probe after load");
    for (i, sp) in p.sets.iter().enumerate() {
        if let Some((sb, l)) = &sp.valid {
            let at = sp.zone.map(|z| z as u64 * geo_blocks(&dev));
            assert_eq!(at, Some(sb.sb_block), "set {i}: superblock read elsewhere");
            assert_eq!(
                sp.zone,
                Some(l.set_zone[i]),
                "set {i} found outside its zone"
            );
        }
    }

    // A loaded device can be checked, and its sets agree.
    let report = check(&dev, false).expect("check of a loaded device");
    for f in &report.errors {
        assert!(!set_level(f.kind), "after load: {f:?}");
    }

    // Repair fixes everything it says it can; a second check finds nothing more.
    let repaired = check(&dev, true).expect("repair of a loaded device");
    let after = check(&dev, false).expect("check after repair");
    assert!(
        after.errors.len() <= repaired.remaining(),
        "repair left {} errors, said {} remain: {:?}",
        after.errors.len(),
        repaired.remaining(),
        after.errors
    );
    if !after.summary.clean {
        return;
    }
    // A clean volume opens and serves I/O, and is still clean once closed.
    let dev = Arc::new(dev);
    let e = Engine::open(dev.clone(), engine_opts()).expect("engine open of a clean volume");
    exercise_engine(e, pick, true);
    let last = check(dev.as_ref(), false).expect("check after the engine closed");
    assert!(
        last.summary.clean,
        "not clean after close: {:?}",
        last.errors
    );
}

// ---------------------------------------------------------------------------------------------
// (c') log layout: open, serve, close, reopen

/// 20 zones of 64 KiB (16 blocks), 4 conventional (64 blocks: the log layout's areas with a
/// 32-block log ring), formatted with a fixed UUID (deterministic).
fn lsl_formatted() -> MemDevice {
    let dev = MemDevice::with_zones(64 << 10, 20, 4).expect("mem device");
    let opts = dmz::lsl::FormatOptions {
        label: Some("fuzz".into()),
        log_blocks: 32,
        uuid: Some(DEV_UUID),
        ..Default::default()
    };
    dmz::lsl::format(&dev, &opts).expect("log layout format");
    dev
}

/// The fresh image after writes over the whole volume, several times over (GC has run and
/// checkpoints have folded the log), then closed (`close`) or left as a crash leaves it.
fn lsl_used(close: bool) -> MemDevice {
    let dev = Arc::new(lsl_formatted());
    let e = LogEngine::open(dev.clone(), LogOptions::default()).expect("open");
    let blocks = e.capacity() / BLOCK as u64;
    for i in 0..3 * blocks {
        // A fixed permutation-like walk, two blocks a write now and then.
        let b = (i * 37) % blocks;
        let n = if i % 5 == 0 && b + 2 <= blocks { 2 } else { 1 };
        e.write(b * BLOCK as u64, &vec![i as u8 | 1; n * BLOCK], i % 11 == 0)
            .expect("write");
    }
    e.discard(3 * BLOCK as u64, 2 * BLOCK as u64)
        .expect("discard");
    e.write(BLOCK as u64, &[0xEE; BLOCK], false).expect("write");
    if close {
        e.close().expect("close");
    }
    dev.snapshot()
}

fn lsl_base(which: u8) -> MemDevice {
    static BASES: OnceLock<Vec<MemDevice>> = OnceLock::new();
    let bases = BASES.get_or_init(|| vec![lsl_formatted(), lsl_used(true), lsl_used(false)]);
    bases[which as usize % bases.len()].snapshot()
}

/// The mutation ops of [`lsl_load`]; device errors are part of the game and ignored.
fn lsl_mutate(dev: &MemDevice, b: &mut Bytes<'_>) {
    let geo = dev.geometry();
    let conv_blocks = 4 * geo.zone_blocks();
    let mut ops = 0;
    while !b.is_empty() && ops < 64 {
        ops += 1;
        let op = b.u8();
        match op % 4 {
            // Patch bytes of conventional block k; bit 7: reseal its CRC afterwards.
            0 => {
                let k = b.u16() as u64 % conv_blocks;
                let off = (b.u16() as usize) % BLOCK;
                let len = b.u8() as usize;
                let bytes = b.take(len).to_vec();
                let mut block = vec![0u8; BLOCK];
                let at = k * BLOCK as u64;
                if dev.read_at(&mut block, at).is_err() {
                    continue;
                }
                let n = bytes.len().min(BLOCK - off);
                block[off..off + n].copy_from_slice(&bytes[..n]);
                let _ = dev.write_at(&block, at);
                if op & 0x80 != 0 {
                    let _ = dmz::lsl::debug_reseal(dev, k);
                }
            }
            // Sequential appends, zone conditions, resets and finishes.
            k => zone_mutation(dev, k - 1, 8, b),
        }
    }
}

/// Byte 0: the base image; byte 1: how many writes; then the writes' bytes, then the
/// mutation ops. Open refuses, or its state is consistent; whatever it serves then, with
/// the acknowledged writes on top, it serves again after a clean close and reopen.
pub fn lsl_load(data: &[u8]) {
    let mut b = Bytes(data);
    let dev = lsl_base(b.u8());
    let nr_writes = b.u8() % 16;
    let writes: Vec<(u16, u8, u8)> = (0..nr_writes).map(|_| (b.u16(), b.u8(), b.u8())).collect();
    lsl_mutate(&dev, &mut b);
    let dev = Arc::new(dev);
    // `zonedd check` reads what open reads: what it refuses, open refuses.
    let checked = dmz::lsl::check::check(dev.clone());
    let Ok(e) = LogEngine::open(dev.clone(), LogOptions::default()) else {
        return;
    };
    if let Err(err) = checked {
        panic!("check refused a volume that opens: {err}");
    }
    if let Err(why) = e.debug_check() {
        panic!("open gave an inconsistent state: {why}");
    }
    let cap = e.capacity() as usize;
    let blocks = cap / BLOCK;
    assert!(blocks > 0, "an open volume exposes no block");
    let mut model = vec![0u8; cap];
    // A read may fail on a zone made offline or unreadable: then there is nothing to compare.
    if e.read(0, &mut model).is_err() {
        return;
    }
    // None: a failed write left these blocks either old or new.
    let mut known = vec![true; blocks];
    for (i, &(at, n, flags)) in writes.iter().enumerate() {
        let first = at as usize % blocks;
        let n = (n as usize % 4 + 1).min(blocks - first);
        let data = vec![i as u8 ^ flags ^ 0xA5; n * BLOCK];
        let r = e.write((first * BLOCK) as u64, &data, flags & 1 != 0);
        match r {
            Ok(()) => model[first * BLOCK..(first + n) * BLOCK].copy_from_slice(&data),
            Err(_) => known[first..first + n].fill(false),
        }
        if flags & 6 == 6 {
            let _ = e.flush();
        }
    }
    if e.close().is_err() {
        return;
    }
    // Both superblock slots were written by the open and the close: nothing for check.
    match dmz::lsl::check::check(dev.clone()) {
        Ok(c) => assert!(c.clean(), "check after a clean close: {:?}", c.errors),
        Err(err) => panic!("check after a clean close refused: {err}"),
    }
    let e = LogEngine::open(dev, LogOptions::default())
        .unwrap_or_else(|err| panic!("reopen after a clean close refused: {err}"));
    if let Err(why) = e.debug_check() {
        panic!("reopen after a clean close: inconsistent state: {why}");
    }
    let mut got = vec![0u8; cap];
    e.read(0, &mut got).expect("read after reopen");
    for (i, ok) in known.iter().enumerate() {
        let r = i * BLOCK..(i + 1) * BLOCK;
        assert!(
            !ok || got[r.clone()] == model[r],
            "block {i}: not what the engine served before the close"
        );
    }
    let _ = e.close();
}

// ---------------------------------------------------------------------------------------------
// (d) ublk request decoding (the frontend's, crate ublk-request)

/// op flags, start sector, sector count, capacity, buffer length and chunk size from the input.
pub fn request(data: &[u8]) {
    use ublk_request::{decode, split, Request, BLOCK as FB};
    let mut b = Bytes(data);
    let op_flags = b.u32();
    let start = match b.u8() % 3 {
        0 => b.u64(),
        1 => b.u32() as u64 * 8,
        _ => b.u16() as u64 * 8,
    };
    let nr = b.u32();
    // Realistic devices: at most 2^60 bytes, a whole number of 4 KiB blocks or not.
    let capacity = b.u64() >> 4;
    let buf_len = (b.u32() % (4 << 20)) as usize;
    let chunk_size = 1u64 << (12 + b.u8() % 24);
    let Ok(req) = decode(op_flags, start, nr, capacity, buf_len) else {
        return;
    };
    let Some((offset, len)) = req.range() else {
        assert_eq!(req, Request::Flush);
        assert_eq!(req.success_result(), 0);
        return;
    };
    assert_eq!(offset, start * 512);
    assert_eq!(len, nr as u64 * 512);
    assert_eq!((offset | len) % FB, 0, "unaligned request accepted");
    assert!(offset + len <= capacity, "past the end accepted");
    match req {
        Request::Read { .. } | Request::Write { .. } => {
            assert!(len <= buf_len as u64, "larger than the buffer");
            assert!(
                req.success_result() >= 0,
                "result {} for {len} bytes",
                req.success_result()
            );
            assert_eq!(req.success_result() as u64, len);
        }
        _ => assert_eq!(req.success_result(), 0),
    }
    let mut pos = offset;
    for p in split(offset, len, chunk_size).take(1 << 16) {
        assert_eq!(p.offset, pos);
        assert_eq!(p.buf_offset, pos - offset);
        assert!(p.len > 0);
        assert_eq!(p.chunk, p.offset / chunk_size);
        assert_eq!(
            (p.offset + p.len - 1) / chunk_size,
            p.chunk,
            "piece crosses a chunk"
        );
        pos += p.len;
    }
    if len / chunk_size < (1 << 16) - 2 {
        assert_eq!(pos, offset + len, "pieces cover the request");
    }
}
