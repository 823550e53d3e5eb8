//! A catalogue of injected metadata corruptions: `check` finds each one, `check --repair`
//! fixes those it claims to, and a second check is clean.

mod common;

use common::*;
use dmz::check::{check, FindingKind};
use dmz::format::*;
use dmz::sets::*;
use zbd::{MemDevice, ZoneCondition, ZonedDevice};

/// 16 zones of 1 MiB (256 blocks): zones 0-1 metadata, 2-5 conventional, 6-15 sequential;
/// 2 reserved, 12 chunks.
fn setup() -> (MemDevice, Layout) {
    setup_with(|_| {})
}

/// `setup`, with `pre` applied to the device before formatting.
fn setup_with(pre: impl Fn(&MemDevice)) -> (MemDevice, Layout) {
    let dev = mem_device(1024, 16, 6);
    pre(&dev);
    let l = format_labeled(&dev, "chk", 2);
    (dev, l)
}

/// Map `chunk` to (`dzone`, `bzone`) in both sets.
fn map(dev: &MemDevice, l: &Layout, chunk: u32, dzone: u32, bzone: u32) {
    set_map_entry(dev, l, &[0, 1], chunk, dzone, bzone);
}

fn valid(dev: &MemDevice, l: &Layout, zone: u32, blocks: std::ops::Range<u32>) {
    edit_meta_block(dev, l, &[0, 1], l.bitmap_block(zone, 0), |b| {
        for k in blocks.clone() {
            set_bit(b, k);
        }
    });
}

fn is_valid(dev: &MemDevice, l: &Layout, set: usize, zone: u32, k: u32) -> bool {
    let mut b = vec![0u8; BS];
    read_meta_blocks(dev, l, set, l.bitmap_block(zone, 0), &mut b).unwrap();
    test_bit(&b, k)
}

/// Write `n` blocks of data at the write pointer of sequential zone `z`.
fn write_seq(dev: &MemDevice, z: u32, n: usize) {
    dev.write_at(&vec![0xABu8; n * BS], zone(dev, z).wp)
        .unwrap();
}

/// Check finds `kind`, repair fixes it, the next check is clean. Returns nothing; callers
/// assert the repaired state.
fn found_and_repaired(dev: &MemDevice, kind: FindingKind) {
    let r = check(dev, false).unwrap();
    assert!(
        r.errors.iter().any(|f| f.kind == kind),
        "{kind:?} not found in {:#?}",
        r.errors
    );
    assert!(!r.summary.clean);
    assert!(r.fixed.is_empty(), "read-only check fixed something");
    let gen = r.gen;
    let r = check(dev, true).unwrap();
    assert!(r.fixed.iter().any(|f| f.kind == kind), "{:#?}", r);
    assert!(r.summary.clean, "{r:#?}");
    let again = check(dev, false).unwrap();
    assert!(again.errors.is_empty(), "{:#?}", again.errors);
    assert_eq!(again.gen, gen + 1);
    assert!(again.summary.set_blocks_compared > 0);
}

#[test]
fn fresh_format_is_clean() {
    let (dev, _) = setup();
    let r = check(&dev, false).unwrap();
    assert_eq!(r.summary.nr_chunks, 12);
    assert!(r.errors.is_empty() && r.summary.clean);
    assert_eq!(r.summary.unmapped_zones, 16);
    assert_eq!(r.label, "chk");
    // Repair of a clean device writes nothing.
    let r = check(&dev, true).unwrap();
    assert!(r.fixed.is_empty());
    assert_eq!(check(&dev, false).unwrap().gen, 1);
}

#[test]
fn consistent_mappings_are_clean() {
    let (dev, l) = setup();
    write_seq(&dev, 8, 10);
    map(&dev, &l, 0, 8, MAP_UNMAPPED);
    valid(&dev, &l, 8, 0..10);
    map(&dev, &l, 1, 3, MAP_UNMAPPED);
    valid(&dev, &l, 3, 100..120);
    write_seq(&dev, 9, 4);
    map(&dev, &l, 2, 9, 4);
    valid(&dev, &l, 9, 0..2);
    valid(&dev, &l, 4, 2..6);
    let r = check(&dev, false).unwrap();
    assert!(r.errors.is_empty(), "{:#?}", r.errors);
    assert_eq!(
        (
            r.summary.mapped_chunks,
            r.summary.buffered_chunks,
            r.summary.mapped_zones
        ),
        (3, 1, 4)
    );
}

#[test]
fn kernel_written_vector_is_clean() {
    let dev = vector_used();
    let r = check(&dev, true).unwrap();
    assert!(r.errors.is_empty(), "{:#?}", r.errors);
    assert_eq!(
        (r.gen, r.summary.mapped_chunks, r.summary.mapped_zones),
        (2, 3, 3)
    );
    assert_eq!(r.summary.unmapped_zones, 21);
    assert_eq!(r.summary.set_blocks_compared, 26);
}

#[test]
fn bad_primary_crc() {
    let (dev, l) = setup();
    poke(&dev, 200, &[1]);
    found_and_repaired(&dev, FindingKind::Superblock);
    assert!(Superblock::decode(&peek(&dev, 0, BS)).is_ok());
    assert_eq!(load(&dev).unwrap().primary, 0);
    assert_eq!(l.set_zone, [0, 1]);
}

#[test]
fn both_superblocks_bad_is_an_error() {
    let (dev, _) = setup();
    poke(&dev, 200, &[1]);
    poke(&dev, 256 * BS as u64 + 200, &[1]);
    let e = check(&dev, false).unwrap_err().to_string();
    assert!(e.starts_with("corrupt superblock"), "{e}");
}

#[test]
fn stale_older_set() {
    let (dev, l) = setup();
    map(&dev, &l, 0, 3, MAP_UNMAPPED);
    let sb = load(&dev).unwrap().sb;
    // Set 1 committed gen 2 with chunk 5 mapped; set 0 still gen 1.
    set_map_entry(&dev, &l, &[1], 5, 2, MAP_UNMAPPED);
    let mut sb2 = sb.clone();
    sb2.gen = 2;
    write_superblock(&dev, &l, 1, &sb2).unwrap();
    let r = check(&dev, false).unwrap();
    assert_eq!(r.primary, 1);
    found_and_repaired(&dev, FindingKind::StaleSet);
    assert_eq!(map_entry(&dev, &l, 0, 5).dzone, 2);
    assert_eq!(map_entry(&dev, &l, 1, 5).dzone, 2);
}

#[test]
fn sets_differ_with_equal_gens() {
    let (dev, l) = setup();
    edit_meta_block(&dev, &l, &[1], l.bitmap_block(7, 0), |b| b[9] = 0x10);
    found_and_repaired(&dev, FindingKind::SetMismatch);
    assert!(!is_valid(&dev, &l, 1, 7, 76));
}

#[test]
fn map_entry_out_of_range() {
    let (dev, l) = setup();
    map(&dev, &l, 0, 99, MAP_UNMAPPED);
    found_and_repaired(&dev, FindingKind::MapOutOfRange);
    assert_eq!(map_entry(&dev, &l, 0, 0), MapEntry::UNMAPPED);
    assert_eq!(map_entry(&dev, &l, 1, 0), MapEntry::UNMAPPED);
}

#[test]
fn map_entry_to_metadata_zone() {
    let (dev, l) = setup();
    map(&dev, &l, 4, 1, MAP_UNMAPPED);
    found_and_repaired(&dev, FindingKind::MapOutOfRange);
    assert!(!map_entry(&dev, &l, 0, 4).is_mapped());
}

#[test]
fn map_entry_to_offline_zone() {
    let (dev, l) = setup_with(|d| d.set_condition(10, ZoneCondition::Offline).unwrap());
    assert_eq!(l.nr_chunks, 11);
    map(&dev, &l, 4, 10, MAP_UNMAPPED);
    found_and_repaired(&dev, FindingKind::MapOutOfRange);
}

#[test]
fn two_chunks_share_a_zone() {
    let (dev, l) = setup();
    map(&dev, &l, 0, 3, MAP_UNMAPPED);
    map(&dev, &l, 7, 3, MAP_UNMAPPED);
    valid(&dev, &l, 3, 0..1);
    let r = check(&dev, false).unwrap();
    let f = r
        .errors
        .iter()
        .find(|f| f.kind == FindingKind::SharedZone)
        .unwrap();
    assert_eq!((f.zone, f.chunk), (Some(3), Some(7)));
    found_and_repaired(&dev, FindingKind::SharedZone);
    assert_eq!(map_entry(&dev, &l, 0, 0).dzone, 3);
    assert!(!map_entry(&dev, &l, 0, 7).is_mapped());
    assert!(is_valid(&dev, &l, 0, 3, 0), "chunk 0 keeps its data");
}

#[test]
fn data_zone_reused_as_buffer() {
    let (dev, l) = setup();
    write_seq(&dev, 8, 1);
    map(&dev, &l, 0, 3, MAP_UNMAPPED);
    map(&dev, &l, 1, 8, 3);
    found_and_repaired(&dev, FindingKind::SharedZone);
    assert_eq!(
        map_entry(&dev, &l, 0, 1),
        MapEntry {
            dzone: 8,
            bzone: MAP_UNMAPPED
        }
    );
}

#[test]
fn buffer_zone_is_sequential() {
    let (dev, l) = setup();
    write_seq(&dev, 8, 2);
    map(&dev, &l, 0, 8, 9);
    valid(&dev, &l, 8, 0..2);
    found_and_repaired(&dev, FindingKind::BufferNotConventional);
    assert_eq!(
        map_entry(&dev, &l, 0, 0),
        MapEntry {
            dzone: 8,
            bzone: MAP_UNMAPPED
        }
    );
}

#[test]
fn buffer_on_conventional_data_zone() {
    let (dev, l) = setup();
    map(&dev, &l, 0, 2, 3);
    found_and_repaired(&dev, FindingKind::BadBuffer);
    assert_eq!(
        map_entry(&dev, &l, 1, 0),
        MapEntry {
            dzone: 2,
            bzone: MAP_UNMAPPED
        }
    );
}

#[test]
fn buffer_equals_data_zone() {
    let (dev, l) = setup();
    write_seq(&dev, 8, 1);
    map(&dev, &l, 0, 8, 8);
    found_and_repaired(&dev, FindingKind::BadBuffer);
}

#[test]
fn unmapped_chunk_with_buffer() {
    let (dev, l) = setup();
    map(&dev, &l, 3, MAP_UNMAPPED, 4);
    found_and_repaired(&dev, FindingKind::UnmappedWithBuffer);
    assert_eq!(map_entry(&dev, &l, 0, 3), MapEntry::UNMAPPED);
}

#[test]
fn chunk_mapped_to_empty_sequential_zone() {
    let (dev, l) = setup();
    map(&dev, &l, 2, 11, MAP_UNMAPPED);
    found_and_repaired(&dev, FindingKind::EmptySeqWithoutBuffer);
    assert!(!map_entry(&dev, &l, 0, 2).is_mapped());
}

#[test]
fn stray_valid_bit_past_write_pointer() {
    let (dev, l) = setup();
    write_seq(&dev, 8, 4);
    map(&dev, &l, 0, 8, MAP_UNMAPPED);
    valid(&dev, &l, 8, 0..4);
    valid(&dev, &l, 8, 10..11);
    let r = check(&dev, false).unwrap();
    let f = r
        .errors
        .iter()
        .find(|f| f.kind == FindingKind::ValidPastWp)
        .unwrap();
    assert!(f.message.contains("first 10"), "{}", f.message);
    found_and_repaired(&dev, FindingKind::ValidPastWp);
    for set in 0..2 {
        assert!(!is_valid(&dev, &l, set, 8, 10));
        assert!((0..4).all(|k| is_valid(&dev, &l, set, 8, k)));
    }
}

#[test]
fn bits_past_the_zone_end() {
    let (dev, l) = setup();
    map(&dev, &l, 0, 2, MAP_UNMAPPED);
    valid(&dev, &l, 2, 300..301); // zones are 256 blocks
    found_and_repaired(&dev, FindingKind::ValidPastWp);
}

#[test]
fn block_valid_in_data_and_buffer_zone() {
    let (dev, l) = setup();
    write_seq(&dev, 8, 8);
    map(&dev, &l, 0, 8, 4);
    valid(&dev, &l, 8, 0..8);
    valid(&dev, &l, 4, 2..3);
    found_and_repaired(&dev, FindingKind::ValidInBoth);
    // The buffer's copy is kept.
    assert!(is_valid(&dev, &l, 0, 4, 2));
    assert!(!is_valid(&dev, &l, 0, 8, 2));
    assert!(is_valid(&dev, &l, 0, 8, 3));
}

#[test]
fn unmapped_zone_with_valid_bits() {
    let (dev, l) = setup();
    valid(&dev, &l, 5, 7..9);
    found_and_repaired(&dev, FindingKind::UnmappedZoneValidBits);
    assert!(!is_valid(&dev, &l, 0, 5, 7));
}

#[test]
fn unmapped_sequential_zone_not_empty() {
    let (dev, _) = setup();
    write_seq(&dev, 12, 3);
    found_and_repaired(&dev, FindingKind::UnmappedSeqNotEmpty);
    assert_eq!(zone(&dev, 12).wp, zone(&dev, 12).start);
}

#[test]
fn offline_unmapped_zone_is_reported_not_fixed() {
    // A zone written, then gone read-only before the format: it cannot be reset.
    let (dev, _) = setup_with(|d| {
        write_seq(d, 12, 3);
        d.set_condition(12, ZoneCondition::ReadOnly).unwrap();
    });
    let r = check(&dev, true).unwrap();
    assert_eq!(r.errors.len(), 1);
    assert_eq!(r.remaining(), 1);
    assert!(!r.summary.clean);
}

#[test]
fn several_errors_at_once() {
    let (dev, l) = setup();
    map(&dev, &l, 0, 99, MAP_UNMAPPED);
    map(&dev, &l, 1, 3, MAP_UNMAPPED);
    map(&dev, &l, 2, 3, MAP_UNMAPPED);
    valid(&dev, &l, 5, 0..1);
    write_seq(&dev, 13, 1);
    poke(&dev, 256 * BS as u64 + 300, &[1]); // and a bad secondary superblock
    let r = check(&dev, true).unwrap();
    assert_eq!(r.errors.len(), 5, "{:#?}", r.errors);
    assert_eq!(r.fixed.len(), 5);
    assert!(check(&dev, false).unwrap().errors.is_empty());
}

#[test]
fn report_serialises_to_json() {
    let (dev, l) = setup();
    map(&dev, &l, 0, 99, MAP_UNMAPPED);
    let r = check(&dev, false).unwrap();
    let v: serde_json::Value = serde_json::to_value(&r).unwrap();
    assert_eq!(v["errors"][0]["kind"], "map-out-of-range");
    assert_eq!(v["errors"][0]["chunk"], 0);
    assert_eq!(v["summary"]["clean"], false);
    assert_eq!(v["label"], "chk");
}
