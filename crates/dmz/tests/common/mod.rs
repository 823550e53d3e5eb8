//! Fixtures shared by the dmz integration tests, each defined once:
//! - in-memory zoned devices and zone tables of a given geometry, formatted volumes, the
//!   dm-zoned vector sets on a device;
//! - raw access for corruption injection, metadata set blocks read and edited in place;
//! - the data pattern of a block written by a given write, and what a block read back holds;
//! - engine options, open, and close or crash, each after the engine's consistency checker;
//! - read-back verification against what was written;
//! - the power-cut tests' operations and acceptance model ([`powercut`]).
#![allow(dead_code)]

pub mod lsl;
pub mod powercut;

use std::sync::Arc;

use dmz::engine::{Engine, EngineError, EngineOptions};
use dmz::format::{Layout, MapEntry};
use dmz::sets::{format_device, read_meta_blocks, write_meta_blocks, FormatOptions};
use zbd::{Geometry, MemDevice, Zone, ZonedDevice};

/// The engine's block size (and the metadata block size).
pub const BS: usize = 4096;

// ---------------------------------------------------------------------------------------
// Devices and zone tables

/// An in-memory host-managed device: `nr_zones` zones of `zone_kib` KiB, the first `nr_conv`
/// conventional, the others sequential and empty, no open/active limits.
pub fn mem_device(zone_kib: u64, nr_zones: u32, nr_conv: u32) -> MemDevice {
    MemDevice::with_zones(zone_kib * 1024, nr_zones, nr_conv).expect("mem device")
}

/// The zone report and geometry of a fresh [`mem_device`] of that shape.
pub fn zone_table(zone_kib: u64, nr_zones: u32, nr_conv: u32) -> (Vec<Zone>, Geometry) {
    let dev = mem_device(zone_kib, nr_zones, nr_conv);
    (dev.report_all().expect("report zones"), dev.geometry())
}

/// The dm-zoned vector device (tests/vectors/README.md): 24 zones of 64 MiB, 8 conventional.
pub fn vector_device() -> MemDevice {
    mem_device(64 << 10, 24, 8)
}

/// A small device for fast tests: 16 zones of 1 MiB, 4 conventional.
pub fn small_device() -> MemDevice {
    mem_device(1024, 16, 4)
}

/// Metadata sets dmzadm wrote (fresh) and the kernel updated (used), zone 0 and zone 1.
pub const FRESH0: &[u8] = include_bytes!("../vectors/fresh-zone0-set.bin");
pub const FRESH1: &[u8] = include_bytes!("../vectors/fresh-zone1-set.bin");
pub const USED0: &[u8] = include_bytes!("../vectors/used-zone0-set.bin");
pub const USED1: &[u8] = include_bytes!("../vectors/used-zone1-set.bin");

/// A [`vector_device`] holding the kernel-written "used" vector sets.
pub fn vector_used() -> MemDevice {
    let dev = vector_device();
    poke(&dev, 0, USED0);
    poke(&dev, 16384 * BS as u64, USED1);
    dev
}

/// Format with label "test" and `reserved` sequential zones kept for reclaim.
pub fn format_dev(dev: &dyn ZonedDevice, reserved: u32) -> Layout {
    format_labeled(dev, "test", reserved)
}

pub fn format_labeled(dev: &dyn ZonedDevice, label: &str, reserved: u32) -> Layout {
    let opts = FormatOptions {
        label: Some(label.into()),
        reserved_seq: reserved,
    };
    format_device(dev, &opts, &mut |_, _| {}).expect("format")
}

/// A formatted [`mem_device`] with `reserved` sequential zones kept for reclaim.
pub fn formatted_mem(zone_kib: u64, nr_zones: u32, nr_conv: u32, reserved: u32) -> Arc<MemDevice> {
    let dev = mem_device(zone_kib, nr_zones, nr_conv);
    format_dev(&dev, reserved);
    Arc::new(dev)
}

// ---------------------------------------------------------------------------------------
// Raw access and metadata blocks

/// The zone as the device reports it now.
pub fn zone(dev: &dyn ZonedDevice, zone: u32) -> Zone {
    dev.report_zones(zone, 1).expect("report zone")[0]
}

/// Do what the frontend does with a planned read (either layout): read each device segment
/// from the read source `fd` (here with `pread`), zero-fill the rest.
pub fn read_segments(fd: std::os::fd::RawFd, segments: &[dmz::engine::ReadSegment]) -> Vec<u8> {
    use dmz::engine::ReadSegment;
    let mut out = Vec::new();
    for s in segments {
        match *s {
            ReadSegment::Zeros { len } => out.resize(out.len() + len as usize, 0),
            ReadSegment::Device { offset, len } => {
                let at = out.len();
                out.resize(at + len as usize, 0xee);
                let d = &mut out[at..];
                // SAFETY: `d` is a live, exclusively borrowed buffer of `d.len()` bytes, and
                // the caller keeps the read source's descriptor open (its engine lives).
                let n = unsafe {
                    libc::pread(fd, d.as_mut_ptr().cast(), d.len(), offset as libc::off_t)
                };
                assert_eq!(n, len as isize, "short read at {offset}");
            }
        }
    }
    out
}

/// Overwrite bytes at any offset of conventional zones (corruption injection): whole blocks
/// are read, changed and written back.
pub fn poke(dev: &dyn ZonedDevice, offset: u64, data: &[u8]) {
    let first = offset / BS as u64;
    let end = (offset + data.len() as u64).div_ceil(BS as u64);
    let mut buf = vec![0u8; (end - first) as usize * BS];
    let base = first * BS as u64;
    dev.read_at(&mut buf, base).expect("poke: read");
    let at = (offset - base) as usize;
    buf[at..at + data.len()].copy_from_slice(data);
    dev.write_at(&buf, base)
        .expect("poke: write (conventional zones only)");
}

/// `len` bytes at `offset` (block aligned or not).
pub fn peek(dev: &dyn ZonedDevice, offset: u64, len: usize) -> Vec<u8> {
    let first = offset / BS as u64;
    let end = (offset + len as u64).div_ceil(BS as u64);
    let mut buf = vec![0u8; (end - first) as usize * BS];
    dev.read_at(&mut buf, first * BS as u64).expect("peek");
    let at = (offset - first * BS as u64) as usize;
    buf[at..at + len].to_vec()
}

/// Metadata blocks `first_mblk..` of `set`, to the end of the set.
pub fn read_set(dev: &dyn ZonedDevice, l: &Layout, set: usize, first_mblk: u32) -> Vec<u8> {
    let mut b = vec![0u8; (l.nr_meta_blocks - first_mblk) as usize * BS];
    read_meta_blocks(dev, l, set, first_mblk, &mut b).expect("read metadata set");
    b
}

/// Change metadata block `mblk` in each of `sets`.
pub fn edit_meta_block(
    dev: &dyn ZonedDevice,
    l: &Layout,
    sets: &[usize],
    mblk: u32,
    f: impl Fn(&mut [u8]),
) {
    for &s in sets {
        let mut b = vec![0u8; BS];
        read_meta_blocks(dev, l, s, mblk, &mut b).expect("read metadata block");
        f(&mut b);
        write_meta_blocks(dev, l, s, mblk, &b).expect("write metadata block");
    }
}

/// Set `chunk`'s map entry to (`dzone`, `bzone`) in each of `sets`.
pub fn set_map_entry(
    dev: &dyn ZonedDevice,
    l: &Layout,
    sets: &[usize],
    chunk: u32,
    dzone: u32,
    bzone: u32,
) {
    let (m, i) = l.map_block(chunk);
    edit_meta_block(dev, l, sets, m, |b| MapEntry { dzone, bzone }.write(b, i));
}

/// `chunk`'s map entry in `set`.
pub fn map_entry(dev: &dyn ZonedDevice, l: &Layout, set: usize, chunk: u32) -> MapEntry {
    let (m, i) = l.map_block(chunk);
    let mut b = vec![0u8; BS];
    read_meta_blocks(dev, l, set, m, &mut b).expect("read map block");
    MapEntry::read(&b, i)
}

// ---------------------------------------------------------------------------------------
// Data patterns

/// Word `k` (8 bytes, little-endian) of the block `block` of write `id`: the write id, the
/// block number, then words that depend on both.
fn pattern_word(id: u64, block: u64, k: usize) -> u64 {
    match k {
        0 => id,
        1 => block,
        _ => ((id << 24) ^ block ^ 0x9e37_79b9_7f4a_7c15)
            .wrapping_mul(0x2545_f491_4f6c_dd1d)
            .wrapping_add(k as u64),
    }
}

/// Fill `out` (whole blocks) with the data write `id` puts in blocks `block..`: each block's
/// content depends only on (`id`, its own block number).
pub fn pattern(id: u64, block: u64, out: &mut [u8]) {
    assert!(out.len().is_multiple_of(BS), "pattern fills whole blocks");
    for (i, b) in out.chunks_mut(BS).enumerate() {
        // chunks_exact_mut: 8-byte stores (chunks_mut(8) made a memcpy call per word, most of
        // the power-cut tests' time).
        for (k, w) in b.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&pattern_word(id, block + i as u64, k).to_le_bytes());
        }
    }
}

/// (write id, block) a pattern block claims to be; (0, 0) for zeros.
pub fn pattern_of(b: &[u8]) -> (u64, u64) {
    (
        u64::from_le_bytes(b[..8].try_into().unwrap()),
        u64::from_le_bytes(b[8..16].try_into().unwrap()),
    )
}

/// The write whose pattern block `b` reads back as `got` (one block): 0 for zeros; an error
/// for data of another block or anything that is not an intact pattern block. Compared word
/// by word in place: the power-cut tests check every block of the volume at each cut.
pub fn block_id(got: &[u8], b: u64) -> Result<u64, String> {
    assert_eq!(got.len(), BS, "block_id checks one block");
    if got == &[0u8; BS][..] {
        return Ok(0);
    }
    let (id, pb) = pattern_of(got);
    if pb != b {
        return Err(format!("block {b} holds block {pb}'s data (write {id})"));
    }
    let intact = got
        .chunks_exact(8)
        .enumerate()
        .all(|(k, w)| u64::from_le_bytes(w.try_into().unwrap()) == pattern_word(id, b, k));
    if !intact {
        return Err(format!("block {b} holds garbage (claims write {id})"));
    }
    Ok(id)
}

// ---------------------------------------------------------------------------------------
// The engine

/// Options for tests: no idle timer, prompt reclaim, no throttle.
pub fn test_opts() -> EngineOptions {
    let mut o = EngineOptions::default();
    o.reclaim.throttle = std::time::Duration::ZERO;
    o.reclaim.idle_period = std::time::Duration::from_secs(3600);
    o.reclaim.wait_timeout = std::time::Duration::from_secs(30);
    o
}

/// [`test_opts`] with a deterministic device-write sequence, for the power-cut tests: no timer
/// commits, no log-triggered commits, reclaim only when a writer waits for a zone.
pub fn power_cut_opts() -> EngineOptions {
    let mut o = test_opts();
    o.commit_interval = std::time::Duration::from_secs(3600);
    o.log_commit_pct = 101;
    o.cache_bitmap_blocks = 4096;
    o.reclaim.low_free_pct = 0;
    o.reclaim.high_free_pct = 0;
    o.reclaim.wait_timeout = std::time::Duration::from_secs(10);
    o
}

pub fn open(dev: Arc<dyn ZonedDevice>, opts: EngineOptions) -> Engine {
    Engine::open(dev, opts).expect("engine open")
}

/// The engine's in-memory invariants hold (`Engine::debug_check`); it takes every chunk
/// lock, so call it with no I/O in flight.
pub fn consistent(e: &Engine) {
    if let Err(m) = e.debug_check() {
        panic!("engine consistency check: {m}");
    }
}

/// Checks the engine's consistency, then closes it.
pub fn close(e: Engine) {
    try_close(e).expect("engine close");
}

/// [`close`] where the close itself may fail: the consistency check must pass regardless.
pub fn try_close(e: Engine) -> Result<(), EngineError> {
    consistent(&e);
    e.close()
}

/// Checks the engine's consistency, then ends it as a daemon crash would
/// (`Engine::crash_for_test`).
pub fn crash(e: Engine) {
    consistent(&e);
    e.crash_for_test();
}

// ---------------------------------------------------------------------------------------
// Read-back verification

/// Reads blocks `start..start + n` (a chunk at a time) and checks each with
/// `ok(block, write id it holds)`; panics on a read error, a damaged block or a refusal.
pub fn verify_blocks(e: &Engine, start: u64, n: u64, ok: impl Fn(u64, u64) -> Result<(), String>) {
    let piece = (e.chunk_size() / BS as u64).max(1);
    let mut buf = vec![0u8; piece as usize * BS];
    let mut b = start;
    while b < start + n {
        let len = piece.min(start + n - b);
        let buf = &mut buf[..len as usize * BS];
        e.read(b * BS as u64, buf)
            .unwrap_or_else(|err| panic!("read {b}+{len}: {err}"));
        for (i, got) in buf.chunks(BS).enumerate() {
            let blk = b + i as u64;
            if let Err(m) = block_id(got, blk).and_then(|id| ok(blk, id)) {
                panic!("{m}");
            }
        }
        b += len;
    }
}

/// `Ok` when block `b` holds write `want` (zeros for 0).
pub fn expect_id(b: u64, got: u64, want: u64) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("block {b} holds write {got}, expected {want}"))
    }
}

/// Checks that blocks `start..start + n` hold write `id` (zeros for 0).
pub fn assert_blocks(e: &Engine, start: u64, n: u64, id: u64) {
    verify_blocks(e, start, n, |b, got| expect_id(b, got, id));
}

/// The write each block of a volume last received (0: never written, or zeroed).
pub struct Written {
    ids: Vec<u64>,
}

impl Written {
    /// Nothing written yet to any block of `e`.
    pub fn new(e: &Engine) -> Written {
        Written {
            ids: vec![0; (e.capacity() / BS as u64) as usize],
        }
    }

    /// Writes `pattern(id, start)` to blocks `start..start + n` and records it.
    pub fn write(&mut self, e: &Engine, start: u64, n: u64, id: u64) {
        let mut buf = vec![0u8; n as usize * BS];
        pattern(id, start, &mut buf);
        e.write(start * BS as u64, &buf, false)
            .unwrap_or_else(|err| panic!("write {start}+{n}: {err}"));
        self.record(start, n, id);
    }

    /// Records that blocks `start..start + n` now hold write `id` (0: zeroed or discarded).
    pub fn record(&mut self, start: u64, n: u64, id: u64) {
        self.ids[start as usize..(start + n) as usize].fill(id);
    }

    pub fn id(&self, block: u64) -> u64 {
        self.ids[block as usize]
    }

    /// Every block of the volume reads back as last written, zeros where never written.
    pub fn verify(&self, e: &Engine) {
        verify_blocks(e, 0, self.ids.len() as u64, |b, got| {
            expect_id(b, got, self.ids[b as usize])
        });
    }
}
