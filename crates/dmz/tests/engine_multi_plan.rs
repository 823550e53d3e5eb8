//! Hop-free reads and writes on a multi-device volume: the volume's read source is its
//! cache device's (opened `O_DIRECT`), so the engine plans exactly the I/O whose blocks lie
//! in cache zones; what lies on a zoned drive (its conventional zones too) goes through the
//! engine's own I/O. Data written through the source reads back, after a daemon crash too.

mod common;

use std::sync::Arc;

use common::*;
use dmz::engine::{Engine, ReadSegment};
use zbd::{AlignedBuf, MemDevice, MultiDevice, RegularDevice, ZonedDevice};

const ZS: u64 = 256 << 10;
const B: u64 = BS as u64;
const CACHE_ZONES: u64 = 6;

/// A cache file opened `O_DIRECT` (as a cache block device is) and one drive with four
/// conventional zones; `None` where the file system takes no `O_DIRECT`.
fn volume(dir: &std::path::Path) -> Option<Arc<MultiDevice>> {
    let path = dir.join("cache");
    if !path.exists() {
        std::fs::File::create(&path)
            .unwrap()
            .set_len(CACHE_ZONES * ZS)
            .unwrap();
    }
    let cache = match RegularDevice::open_direct(&path, ZS, false) {
        Ok(c) => c,
        Err(e) if e.to_string().contains("Invalid argument") => {
            eprintln!("SKIP: no O_DIRECT here ({e})");
            return None;
        }
        Err(e) => panic!("{e}"),
    };
    let drive: Arc<dyn ZonedDevice> = DRIVE.with(|d| d.clone());
    Some(Arc::new(
        MultiDevice::new(Arc::new(cache), vec![drive]).unwrap(),
    ))
}

thread_local! {
    /// The drive outlives an engine (a daemon crash keeps what the memory drive holds).
    static DRIVE: Arc<MemDevice> = Arc::new(MemDevice::with_zones(ZS, 16, 4).unwrap());
}

fn opts() -> dmz::engine::EngineOptions {
    let mut o = test_opts();
    o.reclaim.enabled = false;
    o.direct_sequential = false;
    o
}

/// The zone a chunk's data zone is, from the engine's diagnostics line.
fn dzone(e: &Engine, chunk: u64) -> u64 {
    let s = e.debug_chunk(chunk as u32);
    let z = s.split("dzone ").nth(1).unwrap().split(':').next().unwrap();
    z.parse().unwrap_or_else(|_| panic!("{s}"))
}

/// `data` through the read source's descriptor, at `off` (an aligned buffer: O_DIRECT).
fn pwrite(fd: i32, data: &[u8], off: u64) {
    let mut a = AlignedBuf::new_zeroed(data.len());
    a.copy_from_slice(data);
    // SAFETY: `a` is a live 4096-aligned buffer of `a.len()` bytes; the engine keeps `fd`.
    let n = unsafe { libc::pwrite(fd, a.as_ptr().cast(), a.len(), off as libc::off_t) };
    assert_eq!(n, a.len() as isize, "pwrite at {off:#x}");
}

fn pread(fd: i32, len: u64, off: u64) -> Vec<u8> {
    let mut a = AlignedBuf::new_zeroed(len as usize);
    // SAFETY: as in `pwrite`.
    let n = unsafe { libc::pread(fd, a.as_mut_ptr().cast(), a.len(), off as libc::off_t) };
    assert_eq!(n, a.len() as isize, "pread at {off:#x}");
    a.to_vec()
}

#[test]
fn planned_io_stays_on_the_cache_and_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let Some(m) = volume(dir.path()) else { return };
    format_dev(&*m, 1);
    let e = open(m.clone(), opts());
    let src = e.read_source().expect("an O_DIRECT cache gives a source");
    assert_eq!(src.end, Some(CACHE_ZONES * ZS));
    let chunk = e.chunk_size() / B;
    // Unaligned first writes of every chunk: random zones, the cache's first, then the
    // drive's conventional zones.
    let nr = e.capacity() / e.chunk_size();
    let mut on_cache = Vec::new();
    let mut on_drive = Vec::new();
    for c in 0..nr {
        let at = c * chunk + 3;
        if e.write(at * B, &data(1, at, 2), false).is_err() {
            break; // no random zone left
        }
        match dzone(&e, c) {
            z if z < CACHE_ZONES => on_cache.push(c),
            z if z < CACHE_ZONES + 4 => on_drive.push(c),
            z => panic!("chunk {c} on zone {z}: not a random zone"),
        }
    }
    assert!(
        !on_cache.is_empty() && !on_drive.is_empty(),
        "cache {on_cache:?}, drive {on_drive:?}"
    );
    e.debug_commit().unwrap();
    for &c in &on_drive {
        let at = c * chunk + 3;
        assert!(
            e.plan_read(at * B, 2 * B).is_none(),
            "chunk {c}: a read of a drive's zone is the engine's"
        );
        assert!(
            e.plan_write(at * B, &data(2, at, 2)).is_none(),
            "chunk {c}: a write to a drive's zone is the engine's"
        );
    }
    for &c in &on_cache {
        let at = c * chunk + 3;
        let new = data(2, at, 2);
        let plan = e
            .plan_write(at * B, &new)
            .expect("an overwrite on the cache");
        assert!(src.covers(plan.device_offset(), 2 * B));
        pwrite(src.fd, &new, src.base + plan.device_offset());
        let w = plan.complete(&new).unwrap();
        e.sync(w).unwrap();
        let plan = e.plan_read(at * B, 2 * B).expect("a read on the cache");
        let mut got = Vec::new();
        for s in plan.segments() {
            match *s {
                ReadSegment::Device { offset, len } => {
                    assert!(src.covers(offset, len as u64));
                    got.extend(pread(src.fd, len as u64, offset));
                }
                ReadSegment::Zeros { len } => got.resize(got.len() + len as usize, 0),
            }
        }
        plan.complete();
        assert_eq!(got, new, "chunk {c}");
    }
    assert_eq!(e.stats().planned_writes, on_cache.len() as u64);
    // A daemon crash: every synced write is there, through the engine's own reads.
    crash(e);
    drop(m);
    let m = volume(dir.path()).unwrap();
    let e = open(m, opts());
    for c in 0..nr {
        let at = c * chunk + 3;
        let want = if on_cache.contains(&c) {
            data(2, at, 2)
        } else {
            data(1, at, 2)
        };
        if on_cache.contains(&c) || on_drive.contains(&c) {
            let mut got = vec![0u8; 2 * B as usize];
            e.read(at * B, &mut got).unwrap();
            assert_eq!(got, want, "chunk {c} after the crash");
        }
    }
    close(e);
}

fn data(id: u64, block: u64, n: u64) -> Vec<u8> {
    let mut buf = vec![0u8; (n * B) as usize];
    pattern(id, block, &mut buf);
    buf
}

/// The write the cache rule is for: an overwrite that needs no log record (its zone's
/// records are all on the device), written through the source, then a flush. Nothing of the
/// flush goes through the volume to the cache, yet the flush must make the write durable: a
/// power cut right after it, losing every unflushed write of every device, keeps it. (With
/// the cache flushed only when the volume saw it written, the old data comes back.)
#[test]
fn a_flush_covers_an_unlogged_write_made_through_the_source() {
    // A cache that hands out a source, as an `O_DIRECT` cache block device does, behind a
    // fault injector: writes "through the source" are made on the injector directly,
    // passing the volume (and its per-member dirty flags) by, as a queue thread's ring
    // writes do.
    let cache = Arc::new(
        zbd::FaultyDevice::new(RegularDevice::new_mem(CACHE_ZONES * ZS, ZS).unwrap())
            .unwrap()
            .with_read_source(zbd::ReadSource {
                fd: -1,
                base: 0,
                end: None,
                direct: true,
                conv_writes: true,
                seq_writes: false,
            }),
    );
    let drive =
        Arc::new(zbd::FaultyDevice::new(MemDevice::with_zones(ZS, 16, 4).unwrap()).unwrap());
    let compose = || {
        let d: Arc<dyn ZonedDevice> = drive.clone();
        Arc::new(MultiDevice::new(cache.clone(), vec![d]).unwrap())
    };
    format_dev(&*compose(), 1);
    let e = open(compose(), opts());
    let at = e.chunk_size() / B + 3;
    e.write(at * B, &data(1, at, 2), false).unwrap();
    e.debug_commit().unwrap();
    e.flush().unwrap();
    assert!(dzone(&e, 1) < CACHE_ZONES, "{}", e.debug_chunk(1));
    let new = data(2, at, 2);
    let plan = e
        .plan_write(at * B, &new)
        .expect("an overwrite on the cache");
    assert!(plan.sync_first().is_none());
    cache.write_at(&new, plan.device_offset()).unwrap();
    let w = plan.complete(&new).unwrap();
    e.sync(w).unwrap();
    assert_eq!(
        e.stats().unlogged_overwrites,
        1,
        "an overwrite without a record"
    );
    e.flush().unwrap();
    crash(e);
    cache.power_cut(|_| false).unwrap();
    drive.power_cut(|_| false).unwrap();
    let e = open(compose(), opts());
    let mut got = vec![0u8; 2 * B as usize];
    e.read(at * B, &mut got).unwrap();
    assert_eq!(got, new, "the flushed overwrite is lost");
    close(e);
}
