//! The fuzz targets' bodies (tests/fuzz/src/lib.rs) over their seed corpora
//! (tests/fuzz/seeds/<target>/) and every past finding (tests/fuzz/regressions/<target>/), in
//! plain `cargo test`: no libFuzzer, no nightly. A new finding from `scripts/fuzz.sh` goes into
//! tests/fuzz/regressions/<target>/ under a name that says what it was.

#[path = "fuzz/src/lib.rs"]
#[allow(dead_code)]
mod bodies;

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let mut out = Vec::new();
    for kind in ["seeds", "regressions"] {
        let Ok(rd) = std::fs::read_dir(root.join(kind).join(target)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        files.retain(|p| p.is_file() && p.extension().is_none());
        files.sort();
        out.extend(files);
    }
    out
}

/// Every input, seeds first; fails naming every input that broke an invariant.
fn run_all(target: &str, body: fn(&[u8])) {
    let files = inputs(target);
    assert!(!files.is_empty(), "no seeds for {target}");
    let mut failed = Vec::new();
    for f in files {
        let data = std::fs::read(&f).expect("read input");
        if std::panic::catch_unwind(|| body(&data)).is_err() {
            failed.push(f.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{target}: invariants broken by {failed:#?}"
    );
}

#[test]
fn superblock_inputs() {
    run_all("superblock", bodies::superblock);
}

#[test]
fn layout_inputs() {
    run_all("layout", bodies::layout);
}

#[test]
fn load_inputs() {
    run_all("load", bodies::load);
}

#[test]
fn lsl_load_inputs() {
    run_all("lsl_load", bodies::lsl_load);
}

#[test]
fn request_inputs() {
    run_all("request", bodies::request);
}

/// Finding (load target, tests/fuzz/regressions/load/repair-map-tail-set-mismatch): bytes
/// other than 0xFF in the unused tail of the last map block (entries past nr_chunks) survive in
/// the primary set when `check --repair` commits a bitmap-only fix, while the other set gets an
/// all-0xFF tail: the next check reports "metadata sets differ" (SetMismatch), so a repair is
/// not idempotent. dmz::check::commit wrote the map to the primary only when `map_dirty`.
/// Fixed: commit always writes the rebuilt map to both sets.
#[test]
fn repair_leaves_identical_sets_when_the_map_tail_holds_garbage() {
    use dmz::format::{Layout, BLOCK};
    use zbd::{MemDevice, ZonedDevice};
    let dev = MemDevice::with_zones(1 << 20, 16, 4).unwrap();
    let opts = dmz::sets::FormatOptions {
        label: Some("tail".into()),
        reserved_seq: 2,
    };
    let l: Layout = dmz::sets::format_device(&dev, &opts, &mut |_, _| {}).unwrap();
    assert!(l.nr_chunks < 500);
    for set in 0..2 {
        // Map entry 500 (unused) gets non-0xFF bytes; zone 10 (unmapped) one valid bit.
        let mut map = vec![0u8; BLOCK];
        dmz::sets::read_meta_blocks(&dev, &l, set, 1, &mut map).unwrap();
        map[500 * 8..500 * 8 + 8].copy_from_slice(&[0, 1, 2, 3, 4, 5, 6, 7]);
        dmz::sets::write_meta_blocks(&dev, &l, set, 1, &map).unwrap();
        let mut bm = vec![0u8; BLOCK];
        bm[0] = 1;
        dmz::sets::write_meta_blocks(&dev, &l, set, l.bitmap_block(10, 0), &bm).unwrap();
    }
    dev.flush().unwrap();
    let first = dmz::check::check(&dev, true).unwrap();
    assert!(first.summary.clean, "repair: {:?}", first.errors);
    let again = dmz::check::check(&dev, false).unwrap();
    assert!(again.errors.is_empty(), "after repair: {:?}", again.errors);
}

/// Found while writing the load target: a superblock is accepted as set 1's although it was
/// read from another zone than the one its `sb_block` names. With superblock 0 bad, `probe`
/// scans for the secondary superblock and validates what it finds against the layout
/// (`sb_block == layout.set_start_block(1)`) but not against where it was found; the kernel's
/// `dmz_check_sb` compares `sb_block` with the block it read the superblock from. Here a copy
/// of superblock 1 sits in data zone 2 (a file holding a zonedd image would do) while zone 1's
/// superblock is gone: the copy is taken as set 1 and `load` would rebuild set 0 from zone 1.
/// Fixed: `check_sb_at` rejects a superblock whose `sb_block` is not the block it was read from.
#[test]
fn superblock_found_by_the_scan_must_be_where_it_says() {
    use dmz::format::BLOCK;
    use zbd::{MemDevice, ZonedDevice};
    let dev = MemDevice::with_zones(1 << 20, 16, 4).unwrap();
    let opts = dmz::sets::FormatOptions {
        label: Some("scan".into()),
        reserved_seq: 2,
    };
    let l = dmz::sets::format_device(&dev, &opts, &mut |_, _| {}).unwrap();
    assert_eq!((l.set_zone, l.nr_meta_zones), ([0, 1], 1));
    let zone = 1u64 << 20;
    let mut sb1 = vec![0u8; BLOCK];
    dev.read_at(&mut sb1, zone).unwrap();
    dev.write_at(&sb1, 2 * zone).unwrap(); // the stray copy, in conventional data zone 2
    dev.write_at(&vec![0u8; BLOCK], zone).unwrap(); // superblock 1 gone
    let mut sb0 = vec![0u8; BLOCK];
    dev.read_at(&mut sb0, 0).unwrap();
    sb0[100] ^= 0xff; // superblock 0: bad CRC, magic kept
    dev.write_at(&sb0, 0).unwrap();
    let p = dmz::sets::probe(&dev).unwrap();
    assert_eq!(p.sets[1].zone, Some(2), "the scan finds the copy in zone 2");
    assert!(
        p.sets[1].valid.is_none(),
        "a superblock read from zone 2 that says it is at block {} (zone 1) was accepted",
        l.set_start_block(1)
    );
}

/// Finding (load target, tests/fuzz/regressions/load/engine-freed-zone-not-reset), reduced:
/// the engine frees a sequential zone whose blocks are all invalidated (here by a discard)
/// without resetting it, and leaves it so after a clean close; `zonedd check` then reports
/// "unmapped sequential zone N is not empty" and exits 1. dm-zoned resets a sequential zone when
/// it frees it (reference: discard "fully invalid zones are freed and reset immediately").
#[test]
fn engine_close_leaves_no_stray_sequential_zone() {
    use std::sync::Arc;
    use zbd::MemDevice;
    let dev = Arc::new(MemDevice::with_zones(1 << 20, 16, 4).unwrap());
    let opts = dmz::sets::FormatOptions {
        label: Some("free".into()),
        reserved_seq: 2,
    };
    dmz::sets::format_device(dev.as_ref(), &opts, &mut |_, _| {}).unwrap();
    let mut o = dmz::engine::EngineOptions::default();
    o.reclaim.enabled = false;
    let e = dmz::engine::Engine::open(dev.clone(), o).unwrap();
    e.write(0, &[7u8; 8192], false).unwrap(); // chunk 0, straight to a sequential zone
    e.flush().unwrap();
    e.discard(0, 8192).unwrap(); // every block of that zone invalid: the chunk is unmapped
    e.close().unwrap();
    let r = dmz::check::check(dev.as_ref(), false).unwrap();
    assert!(r.errors.is_empty(), "after a clean close: {:?}", r.errors);
}

/// Finding (load target, tests/fuzz/regressions/load/load-keeps-differing-dev-uuid): the two
/// superblocks differ in the device UUID at the same generation. `sets::load` accepts that and
/// changes nothing (it compares blocks 1.. of the sets, and set UUID, label and sizes of the
/// superblocks), while `check` compares every superblock field and reports "metadata sets
/// differ ... block 0" (exit 1) on a device that load calls consistent. One of the two should
/// give way: load resyncing a differing superblock, or check not comparing the device UUID
/// (the kernel does not compare it between the two sets of one device).
/// Fixed: load rewrites the other superblock from the primary's (dmzadm writes one device UUID
/// in both sets of a device), so load and check agree.
#[test]
fn load_and_check_agree_on_differing_device_uuids() {
    use dmz::format::{Superblock, BLOCK};
    use zbd::{MemDevice, ZonedDevice};
    let dev = MemDevice::with_zones(1 << 20, 16, 4).unwrap();
    let opts = dmz::sets::FormatOptions {
        label: Some("uuid".into()),
        reserved_seq: 2,
    };
    let l = dmz::sets::format_device(&dev, &opts, &mut |_, _| {}).unwrap();
    let mut b = vec![0u8; BLOCK];
    dev.read_at(&mut b, l.mblk_offset(1, 0)).unwrap();
    let mut sb = Superblock::decode(&b).unwrap();
    sb.dev_uuid[15] ^= 0x5a;
    dmz::sets::write_superblock(&dev, &l, 1, &sb).unwrap();
    let loaded = dmz::sets::load(&dev).unwrap();
    let r = dmz::check::check(&dev, false).unwrap();
    assert!(
        r.errors.is_empty(),
        "load acted {:?}, then check found {:?}",
        loaded.actions,
        r.errors
    );
}

/// `seal_superblock` (the fuzz input's CRC re-seal) gives a block that passes the CRC check,
/// so that sealed mutations reach the field checks.
#[test]
fn sealed_superblock_reaches_the_field_checks() {
    use dmz::format::{FormatError, Superblock};
    let sb = Superblock {
        gen: 7,
        sb_block: 0,
        nr_meta_blocks: 18,
        nr_reserved_seq: 2,
        nr_chunks: 10,
        nr_map_blocks: 1,
        nr_bitmap_blocks: 16,
        label: [b'x'; 32],
        set_uuid: [1; 16],
        dev_uuid: [2; 16],
    };
    let mut b = sb.encode();
    b[32] = 11; // nr_chunks
    assert!(matches!(
        Superblock::decode(&b[..]),
        Err(FormatError::BadCrc { .. })
    ));
    bodies::seal_superblock(&mut b[..]);
    let back = Superblock::decode(&b[..]).expect("sealed");
    assert_eq!(back.nr_chunks, 11);
}
