//! The dm-zoned v2 vectors (dmzadm 2.2.2 + Linux 6.12 on a 24-zone null_blk; see
//! tests/vectors/README.md): decode, re-encode byte for byte, and size the same device.

mod common;

use common::*;
use dmz::format::*;
use zbd::{ZoneCondition, ZoneType};

const ZONE: u64 = 64 << 20;

/// The vector device: 24 zones of 64 MiB, 0-7 conventional, 8-23 sequential and empty.
fn vector_zones() -> (Vec<zbd::Zone>, zbd::Geometry) {
    zone_table(ZONE >> 10, 24, 8)
}

fn sb_of(set: &[u8]) -> Superblock {
    Superblock::decode(&set[..BLOCK]).expect("vector superblock decodes")
}

#[test]
fn vector_superblocks_decode_with_expected_fields() {
    let cases = [
        (FRESH0, 1u64, 0u64, 0x02cc_cedbu32),
        (FRESH1, 1, 16384, 0xc2ef_1b91),
        (USED0, 2, 0, 0x54e4_d2e0),
        (USED1, 2, 16384, 0x94c7_07aa),
    ];
    let crcs: Vec<u32> = cases
        .iter()
        .map(|(b, ..)| u32::from_le_bytes(b[44..48].try_into().unwrap()))
        .collect();
    for ((bin, gen, sb_block, crc), stored) in cases.iter().zip(crcs) {
        assert_eq!(stored, *crc);
        let sb = sb_of(bin);
        assert_eq!(sb.gen, *gen);
        assert_eq!(sb.sb_block, *sb_block);
        assert_eq!(sb.nr_meta_blocks, 26);
        assert_eq!(sb.nr_reserved_seq, 4);
        assert_eq!(sb.nr_chunks, 18);
        assert_eq!(sb.nr_map_blocks, 1);
        assert_eq!(sb.nr_bitmap_blocks, 24);
        assert_eq!(sb.label_str(), "zkvec");
        assert_eq!(
            uuid_string(&sb.set_uuid),
            "c3fef04d-475b-47d1-81dc-eda014467aa9"
        );
        assert_eq!(
            uuid_string(&sb.dev_uuid),
            "19205fb0-09ab-416b-8e78-f762028b533c"
        );
    }
}

#[test]
fn vector_superblocks_reencode_byte_for_byte() {
    for bin in [FRESH0, FRESH1, USED0, USED1] {
        let sb = sb_of(bin);
        assert_eq!(&sb.encode()[..], &bin[..BLOCK]);
    }
}

#[test]
fn crc_matches_linux_formula_not_zlib() {
    let mut b = USED0[..BLOCK].to_vec();
    let stored = u32::from_le_bytes(b[44..48].try_into().unwrap());
    b[44..48].fill(0);
    assert_eq!(linux_crc32(2, &b), stored);
    let mut zlib = crc32fast::Hasher::new_with_initial(2);
    zlib.update(&b);
    assert_ne!(zlib.finalize(), stored);
}

#[test]
fn corrupted_superblocks_are_rejected_with_reasons() {
    let mut b = FRESH0[..BLOCK].to_vec();
    b[200] ^= 1; // padding is covered by the CRC too
    let e = Superblock::decode(&b).unwrap_err();
    assert!(matches!(e, FormatError::BadCrc { .. }), "{e}");
    assert!(e.to_string().contains("CRC"));

    let mut b = FRESH0[..BLOCK].to_vec();
    b[0] = b'X';
    assert!(matches!(
        Superblock::decode(&b).unwrap_err(),
        FormatError::BadMagic { .. }
    ));
    assert!(!has_magic(&b));
    assert!(has_magic(FRESH0));

    let mut b = FRESH0[..BLOCK].to_vec();
    b[4] = 1;
    let e = Superblock::decode(&b).unwrap_err();
    assert!(
        e.to_string().contains("metadata v1 is not supported"),
        "{e}"
    );

    let mut b = FRESH0[..BLOCK].to_vec();
    b[4] = 3;
    assert!(matches!(
        Superblock::decode(&b).unwrap_err(),
        FormatError::BadVersion(3)
    ));
    assert!(matches!(
        Superblock::decode(&FRESH0[..100]).unwrap_err(),
        FormatError::Short(100)
    ));
}

#[test]
fn vector_map_and_bitmaps() {
    let fresh = decode_map_block(&FRESH0[BLOCK..2 * BLOCK]);
    assert!(fresh.iter().all(|e| *e == MapEntry::UNMAPPED));
    let used = decode_map_block(&USED0[BLOCK..2 * BLOCK]);
    assert_eq!(
        used[0],
        MapEntry {
            dzone: 2,
            bzone: MAP_UNMAPPED
        }
    );
    assert_eq!(
        used[1],
        MapEntry {
            dzone: 3,
            bzone: MAP_UNMAPPED
        }
    );
    assert_eq!(
        used[2],
        MapEntry {
            dzone: 4,
            bzone: MAP_UNMAPPED
        }
    );
    assert!(used[3..].iter().all(|e| !e.is_mapped()));
    assert_eq!(&encode_map_block(&used)[..], &USED0[BLOCK..2 * BLOCK]);

    let (zones, geo) = vector_zones();
    let layout = Layout::from_superblock(&sb_of(USED0), &zones, &geo).unwrap();
    let bitmap = |zone: u32, blk: u32| {
        let m = layout.bitmap_block(zone, blk) as usize;
        &USED0[m * BLOCK..(m + 1) * BLOCK]
    };
    assert_eq!(count_bits(bitmap(2, 0)), 256);
    assert_eq!(
        iter_set_bits(bitmap(3, 0), layout.zone_blocks).collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert!(test_bit(bitmap(4, 0), 0));
    assert_eq!(count_bits(bitmap(4, 0)), 1);
    for z in (0..24).filter(|z| ![2, 3, 4].contains(z)) {
        assert_eq!(count_bits(bitmap(z, 0)), 0, "zone {z}");
    }
}

#[test]
fn sizing_matches_the_vector() {
    let (zones, geo) = vector_zones();
    let l = Layout::compute(&zones, &geo, 4).unwrap();
    assert_eq!(l.zone_blocks, 16384);
    assert_eq!(l.zone_bitmap_blocks, 1);
    assert_eq!(l.nr_chunks, 18);
    assert_eq!(l.nr_meta_blocks, 26);
    assert_eq!(l.nr_bitmap_blocks, 24);
    assert_eq!(l.nr_map_blocks, 1);
    assert_eq!(l.nr_meta_zones, 1);
    assert_eq!(l.nr_reserved_seq, 4);
    assert_eq!(l.set_zone, [0, 1]);
    assert_eq!(l.set_start_block(1), 16384);
    assert_eq!(l.exposed_bytes(), 2_359_296 * 512);
    // The layout read back from dmzadm's superblock is the one we compute.
    let from_sb = Layout::from_superblock(&sb_of(FRESH0), &zones, &geo).unwrap();
    assert_eq!(from_sb, l);
    // Our superblock for the vector equals dmzadm's, given the same ids and gen.
    let v = sb_of(FRESH1);
    let ours = l.superblock(1, 1, v.label, v.set_uuid, v.dev_uuid);
    assert_eq!(&ours.encode()[..], &FRESH1[..BLOCK]);
}

#[test]
fn sizing_14tb_worked_example() {
    // 52,154 zones of 256 MiB, the first 524 conventional (about 1%, like SMR drives).
    let (zones, geo) = zone_table(256 << 10, 52_154, 524);
    let l = Layout::compute(&zones, &geo, 16).unwrap();
    assert_eq!(l.zone_bitmap_blocks, 2);
    assert_eq!(l.nr_bitmap_blocks, 104_308);
    assert_eq!(l.nr_map_blocks, 102);
    assert_eq!(l.nr_meta_blocks, 104_411);
    assert_eq!(l.nr_meta_zones, 2);
    assert_eq!(l.nr_chunks, 52_134);
    assert_eq!(l.set_zone, [0, 2]);
    assert_eq!(l.bitmap_block(1, 32768), 1 + 102 + 2 + 1);
    assert_eq!(l.map_block(52_133), (1 + 101, 52_133 % 512));
}

#[test]
fn sizing_rejects_unsuitable_devices() {
    let (zones, geo) = vector_zones();
    // ZNS: capacity below size.
    let mut g = geo;
    g.zone_capacity = ZONE / 2;
    let e = Layout::compute(&zones, &g, 4).unwrap_err();
    assert!(
        e.to_string().contains("zone capacity < zone size (ZNS)"),
        "{e}"
    );
    // Only 2 conventional zones.
    let mut z2 = zones.clone();
    for z in &mut z2[2..8] {
        z.zone_type = ZoneType::SeqWriteRequired;
        z.cond = ZoneCondition::Empty;
    }
    let e = Layout::compute(&z2, &geo, 4).unwrap_err();
    assert!(e.to_string().contains("at least 3"), "{e}");
    // Non power of two zone size.
    let mut g = geo;
    g.zone_size = 3 * 4096 * 1024;
    g.zone_capacity = g.zone_size;
    assert!(Layout::compute(&zones, &g, 4).is_err());
    // Reserved 0 is refused; a large count is clamped to conventional zones - 1.
    assert!(Layout::compute(&zones, &geo, 0).is_err());
    let l = Layout::compute(&zones, &geo, 100).unwrap();
    assert_eq!(l.nr_reserved_seq, 7);
    assert_eq!(l.nr_chunks, 24 - 2 - 7);
    // Metadata zones must be contiguous conventional zones: zone 1 sequential breaks set 1.
    let mut z3 = zones.clone();
    z3[1].zone_type = ZoneType::SeqWriteRequired;
    z3[1].cond = ZoneCondition::Empty;
    let e = Layout::compute(&z3, &geo, 4).unwrap_err();
    assert!(e.to_string().contains("metadata zone 1"), "{e}");
    // Offline sequential zones are not usable: one fewer chunk.
    let mut z4 = zones.clone();
    z4[20].cond = ZoneCondition::Offline;
    assert_eq!(Layout::compute(&z4, &geo, 4).unwrap().nr_chunks, 17);
}

#[test]
fn from_superblock_checks_fields() {
    let (zones, geo) = vector_zones();
    let good = sb_of(FRESH0);
    let check = |f: &dyn Fn(&mut Superblock)| {
        let mut sb = good.clone();
        f(&mut sb);
        Layout::from_superblock(&sb, &zones, &geo)
            .unwrap_err()
            .to_string()
    };
    assert!(check(&|s| s.nr_chunks = 19).contains("nr_chunks"));
    assert!(check(&|s| s.nr_chunks = 17).contains("nr_chunks: 17, expected 18"));
    assert!(check(&|s| s.nr_map_blocks = 2).contains("nr_map_blocks"));
    assert!(check(&|s| s.nr_bitmap_blocks = 23).contains("nr_bitmap_blocks"));
    assert!(check(&|s| s.nr_reserved_seq = 0).contains("nr_reserved_seq"));
    assert!(check(&|s| s.nr_meta_blocks = 0).contains("nr_meta_blocks"));
    assert!(check(&|s| s.set_uuid = [0; 16]).contains("UUID"));
    assert!(check(&|s| s.dev_uuid = [0; 16]).contains("UUID"));
}

const Z_FRESH0: &[u8] = include_bytes!("vectors/zonedd-fresh-zone0-set.bin");
const Z_FRESH1: &[u8] = include_bytes!("vectors/zonedd-fresh-zone1-set.bin");
const Z_KERNEL0: &[u8] = include_bytes!("vectors/zonedd-kernel-zone0-set.bin");
const Z_KERNEL1: &[u8] = include_bytes!("vectors/zonedd-kernel-zone1-set.bin");

#[test]
fn kernel_accepted_and_updated_a_zonedd_format() {
    let (zones, geo) = vector_zones();
    let ours = sb_of(Z_FRESH0);
    assert_eq!((ours.gen, ours.label_str().as_str()), (1, "zk"));
    // Our fresh sets differ from dmzadm's only in superblock ids (and so the CRC).
    assert_eq!(&Z_FRESH0[BLOCK..], &FRESH0[BLOCK..]);
    assert_eq!(&Z_FRESH1[BLOCK..], &FRESH1[BLOCK..]);
    for (bin, set) in [(Z_KERNEL0, 0), (Z_KERNEL1, 1)] {
        let sb = sb_of(bin);
        assert_eq!(sb.gen, 3, "the kernel committed twice");
        assert_eq!(sb.set_uuid, ours.set_uuid);
        assert_eq!(sb.dev_uuid, ours.dev_uuid);
        assert_eq!(sb.label, ours.label);
        let l = Layout::from_superblock(&sb, &zones, &geo).unwrap();
        assert_eq!(sb.sb_block, l.set_start_block(set));
        // The kernel rewrote the superblock with exactly our encoding.
        assert_eq!(&sb.encode()[..], &bin[..BLOCK]);
        let map = decode_map_block(&bin[BLOCK..2 * BLOCK]);
        let dz: Vec<u32> = map[..4].iter().map(|e| e.dzone).collect();
        assert_eq!(dz, vec![2, 3, 4, MAP_UNMAPPED]);
    }
    assert_eq!(&Z_KERNEL0[BLOCK..], &Z_KERNEL1[BLOCK..]);
}
