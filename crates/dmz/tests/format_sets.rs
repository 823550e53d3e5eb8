//! Formatting a device and loading it back: set layout, set choice, rebuild and resync.

mod common;

use common::*;
use dmz::format::*;
use dmz::sets::*;
use zbd::{FaultyDevice, ZonedDevice};

#[test]
fn format_writes_two_identical_sets() {
    let dev = FaultyDevice::new(small_device()).unwrap();
    let mut last = (0, 0);
    let l = format_device(&dev, &FormatOptions::default(), &mut |d, t| last = (d, t)).unwrap();
    assert_eq!(
        last,
        (2 * l.nr_meta_blocks as u64, 2 * l.nr_meta_blocks as u64)
    );
    assert_eq!(dev.pending_writes(), 0, "format flushed its writes");
    // 16 zones, 4 conventional: reserved clamped to 3, chunks = 16 - 2 - 3.
    assert_eq!(l.nr_reserved_seq, 3);
    assert_eq!(l.nr_chunks, 11);
    let s0 = read_set(&dev, &l, 0, 0);
    let s1 = read_set(&dev, &l, 1, 0);
    let sb0 = Superblock::decode(&s0).unwrap();
    let sb1 = Superblock::decode(&s1).unwrap();
    assert_eq!((sb0.gen, sb0.sb_block, sb1.sb_block), (1, 0, 256));
    assert_eq!(sb0.label_str(), default_label(&dev));
    assert!(sb0.label_str().starts_with("zonedd-"));
    assert_eq!(sb0.set_uuid, sb1.set_uuid);
    assert_ne!(sb0.set_uuid, [0; 16]);
    assert_eq!(sb0.set_uuid[6] >> 4, 4, "version 4 UUID");
    assert_eq!(s0[BS..], s1[BS..]);
    assert!(s0[BS..2 * BS].iter().all(|&b| b == 0xFF), "map unmapped");
    assert!(s0[2 * BS..].iter().all(|&b| b == 0), "bitmaps empty");
    let loaded = load(&dev).unwrap();
    assert_eq!((loaded.primary, loaded.sb.gen), (0, 1));
    assert!(loaded.actions.is_empty());
    assert_eq!(loaded.layout, l);
}

#[test]
fn format_resets_sequential_zones() {
    let dev = small_device();
    dev.write_at(&[7u8; BS], 10 * 256 * BS as u64).unwrap();
    assert_ne!(zone(&dev, 10).wp, zone(&dev, 10).start);
    format_dev(&dev, 2);
    assert_eq!(zone(&dev, 10).wp, zone(&dev, 10).start);
}

#[test]
fn format_of_vector_geometry_matches_dmzadm() {
    let dev = vector_device();
    let opts = FormatOptions {
        label: Some("zkvec".into()),
        reserved_seq: 4,
    };
    let l = format_device(&dev, &opts, &mut |_, _| {}).unwrap();
    for set in 0..2 {
        let ours = read_set(&dev, &l, set, 0);
        let theirs: &[u8] = if set == 0 { FRESH0 } else { FRESH1 };
        let mut a = Superblock::decode(&ours).unwrap();
        let b = Superblock::decode(theirs).unwrap();
        a.set_uuid = b.set_uuid;
        a.dev_uuid = b.dev_uuid;
        // Everything but the UUIDs (and so the CRC) is identical, map and bitmaps too.
        assert_eq!(a, b);
        assert_eq!(&a.encode()[..], &theirs[..BS]);
        assert_eq!(&ours[BS..], &theirs[BS..]);
    }
}

#[test]
fn multi_zone_sets_never_cross_zone_ends() {
    // 16-block zones: 64 bitmap blocks + map + sb = 66 blocks = 5 zones per set.
    let dev = mem_device(64, 64, 12);
    let l = format_dev(&dev, 1);
    assert_eq!(l.nr_meta_zones, 5);
    assert_eq!(l.set_zone, [0, 5]);
    assert_eq!(l.nr_chunks, 64 - 10 - 1);
    let loaded = load(&dev).unwrap();
    assert!(loaded.actions.is_empty());
    assert_eq!(
        read_set(&dev, &l, 0, 0)[BS..],
        read_set(&dev, &l, 1, 0)[BS..]
    );
}

#[test]
fn bad_label_is_refused() {
    let dev = small_device();
    let opts = FormatOptions {
        label: Some("x".repeat(32)),
        reserved_seq: 2,
    };
    let e = format_device(&dev, &opts, &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("label"), "{e}");
}

#[test]
fn loads_kernel_written_metadata() {
    let dev = vector_used();
    let l = load(&dev).unwrap();
    assert_eq!(
        (l.primary, l.sb.gen, l.sb.label_str().as_str()),
        (0, 2, "zkvec")
    );
    assert!(l.actions.is_empty());
    assert_eq!(l.layout.nr_chunks, 18);
}

#[test]
fn bad_primary_crc_loads_secondary_and_rebuilds() {
    let dev = vector_used();
    poke(&dev, 300, &[0x55]); // inside sb0's CRC-covered padding
    let l = load(&dev).unwrap();
    assert_eq!(l.primary, 1);
    assert_eq!(l.actions.len(), 1);
    assert!(
        l.actions[0].contains("rebuilt metadata set 0"),
        "{:?}",
        l.actions
    );
    assert!(l.actions[0].contains("CRC"), "{:?}", l.actions);
    // Set 0 is back, byte for byte what the kernel wrote.
    assert_eq!(peek(&dev, 0, USED0.len()), USED0);
    let again = load(&dev).unwrap();
    assert_eq!(again.primary, 0);
    assert!(again.actions.is_empty());
}

#[test]
fn bad_secondary_is_rebuilt_from_primary() {
    let dev = vector_used();
    poke(&dev, 16384 * BS as u64 + 16, &[9]); // sb_block field of sb1
    poke(&dev, 16384 * BS as u64 + BS as u64, &[0; 16]); // and its map
    let l = load(&dev).unwrap();
    assert_eq!(l.primary, 0);
    assert!(l.actions[0].contains("rebuilt metadata set 1"));
    assert_eq!(peek(&dev, 16384 * BS as u64, USED1.len()), USED1);
}

#[test]
fn secondary_found_by_scanning_when_primary_has_no_magic() {
    // 12-block zones would not be a power of two; use 16-block zones and 5-zone sets so the
    // secondary is not in zone 1.
    let dev = mem_device(64, 64, 12);
    let l = format_dev(&dev, 1);
    poke(&dev, 0, &[0u8; BS]);
    let loaded = load(&dev).unwrap();
    assert_eq!(loaded.primary, 1);
    assert_eq!(loaded.layout, l);
    assert!(loaded.actions[0].contains("rebuilt metadata set 0"));
    assert!(load(&dev).unwrap().actions.is_empty());
}

#[test]
fn both_bad_is_a_clear_error() {
    let dev = vector_used();
    poke(&dev, 300, &[1]);
    poke(&dev, 16384 * BS as u64 + 300, &[1]);
    let e = load(&dev).unwrap_err();
    let m = e.to_string();
    assert!(m.starts_with("corrupt superblock: "), "{m}");
    assert!(m.contains("superblock 0: bad superblock CRC"), "{m}");
    assert!(m.contains("superblock 1: bad superblock CRC"), "{m}");
}

#[test]
fn unformatted_device_says_so() {
    let dev = small_device();
    let e = load(&dev).unwrap_err();
    assert!(matches!(e, FormatError::NotFormatted(_)));
    assert!(
        e.to_string().contains("not formatted? run `zonedd format"),
        "{e}"
    );
}

#[test]
fn v1_metadata_is_rejected_clearly() {
    let dev = vector_used();
    poke(&dev, 4, &[1]);
    poke(&dev, 16384 * BS as u64 + 4, &[1]);
    let e = load(&dev).unwrap_err();
    // Not "corrupt": an intact volume in a format zonedd does not read.
    assert!(matches!(e, FormatError::Version1), "{e}");
    assert!(
        e.to_string().contains("metadata v1 is not supported"),
        "{e}"
    );
}

#[test]
fn load_rewrites_a_superblock_differing_at_equal_gen() {
    let dev = small_device();
    let l = format_dev(&dev, 2);
    let mut b = vec![0u8; BS];
    read_meta_blocks(&dev, &l, 1, 0, &mut b).unwrap();
    let mut sb = Superblock::decode(&b).unwrap();
    sb.dev_uuid[0] ^= 1;
    write_superblock(&dev, &l, 1, &sb).unwrap();
    let loaded = load(&dev).unwrap();
    assert_eq!(loaded.primary, 0);
    assert!(
        loaded
            .actions
            .iter()
            .any(|a| a.contains("rewrote superblock 1")),
        "{:?}",
        loaded.actions
    );
    read_meta_blocks(&dev, &l, 1, 0, &mut b).unwrap();
    let back = Superblock::decode(&b).unwrap();
    assert_eq!(back.dev_uuid, loaded.sb.dev_uuid);
    assert_eq!(back.sb_block, l.set_start_block(1));
    assert!(
        load(&dev).unwrap().actions.is_empty(),
        "a second load is a no-op"
    );
}

#[test]
fn newer_set_is_copied_onto_stale_set() {
    // A crash between the two superblock writes of a commit: set 1 holds gen 3 with a new
    // mapping, set 0 still gen 2 with a half-written map block.
    let dev = vector_used();
    let l = load(&dev).unwrap().layout;
    set_map_entry(&dev, &l, &[1], 3, 5, MAP_UNMAPPED);
    let mut sb = Superblock::decode(USED1).unwrap();
    sb.gen = 3;
    write_superblock(&dev, &l, 1, &sb).unwrap();
    // Garbage in set 0's bitmap of zone 9 (a partially logged block).
    poke(&dev, l.bitmap_block(9, 0) as u64 * BS as u64, &[0xAA; 64]);

    let loaded = load(&dev).unwrap();
    assert_eq!((loaded.primary, loaded.sb.gen), (1, 3));
    assert!(loaded.actions[0].contains("resynchronised metadata set 0 (gen 2)"));
    let s0 = read_set(&dev, &l, 0, 0);
    let s1 = read_set(&dev, &l, 1, 0);
    assert_eq!(s0[BS..], s1[BS..]);
    let sb0 = Superblock::decode(&s0).unwrap();
    assert_eq!((sb0.gen, sb0.sb_block), (3, 0));
    assert_eq!(MapEntry::read(&s0[BS..], 3).dzone, 5);
    // Equal gens now: set 0 is primary again and nothing more to do.
    let again = load(&dev).unwrap();
    assert_eq!((again.primary, again.sb.gen), (0, 3));
    assert!(again.actions.is_empty());
}

#[test]
fn foreign_secondary_is_treated_as_bad() {
    let dev = vector_used();
    let mut sb = Superblock::decode(USED1).unwrap();
    sb.set_uuid[0] ^= 1;
    poke(&dev, 16384 * BS as u64, &sb.encode()[..]);
    let l = load(&dev).unwrap();
    assert_eq!(l.primary, 0);
    assert!(l.actions[0].contains("set UUID"), "{:?}", l.actions);
}

#[test]
fn meta_block_helpers_refuse_out_of_range() {
    let dev = small_device();
    let l = format_dev(&dev, 2);
    let mut b = vec![0u8; 2 * BS];
    assert!(read_meta_blocks(&dev, &l, 0, l.nr_meta_blocks - 1, &mut b).is_err());
    assert!(read_meta_blocks(&dev, &l, 0, 0, &mut b[..100]).is_err());
}

#[test]
fn zns_device_is_refused_by_format_and_load() {
    let mut opts = zbd::EmulateOptions::new(16 << 20, 1 << 20);
    opts.conventional = 4;
    opts.zone_capacity = 512 << 10;
    let dev = zbd::MemDevice::new(&opts).unwrap();
    let e = format_device(&dev, &FormatOptions::default(), &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, FormatError::Device(_)), "{e}");
    assert!(e.to_string().contains("(ZNS) is not supported"), "{e}");
    let e = load(&dev).unwrap_err();
    assert!(e.to_string().contains("(ZNS) is not supported"), "{e}");
}

#[test]
fn format_works_on_zbd_mem_device() {
    // Default options on a device shaped by `EmulateOptions`.
    let mut opts = zbd::EmulateOptions::new(32 << 20, 1 << 20);
    opts.conventional = 6;
    let dev = zbd::MemDevice::new(&opts).unwrap();
    let l = format_device(&dev, &FormatOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!((l.nr_reserved_seq, l.nr_chunks), (5, 32 - 2 - 5));
    let loaded = load(&dev).unwrap();
    assert!(loaded.actions.is_empty());
    assert!(dmz::check::check(&dev, false).unwrap().errors.is_empty());
}

#[test]
fn equal_gen_sets_that_differ_are_resynchronised() {
    // A crash while a commit was logging into set 1: same gen, some blocks already new.
    let dev = small_device();
    let l = format_dev(&dev, 2);
    let m = l.bitmap_block(9, 0);
    write_meta_blocks(&dev, &l, 1, m, &[0x5Au8; BS]).unwrap();
    let loaded = load(&dev).unwrap();
    assert_eq!(loaded.primary, 0);
    assert_eq!(loaded.actions.len(), 1);
    assert!(
        loaded.actions[0].contains("resynchronised 1 differing block(s) of metadata set 1"),
        "{:?}",
        loaded.actions
    );
    assert!(diff_sets(&dev, &l).unwrap().is_empty());
    assert!(
        read_set(&dev, &l, 1, 0)[m as usize * BS..(m as usize + 1) * BS]
            .iter()
            .all(|&b| b == 0)
    );
}
