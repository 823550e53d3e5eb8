//! The log layout's memory bound (log-layout.md 5.6): a 10 TiB sparse emulated image
//! (40,960 zones of 256 MiB, 409 conventional), random 4 KiB writes over its whole span,
//! each on a page of its own, more pages than the 64 MiB default holds. The index stays
//! within the bound (directory and page cache), pages are written back and read again, and
//! every block reads back, across a daemon crash too.

mod common;

use std::sync::Arc;

use common::*;
use dmz::lsl::{format, LogEngine, LogOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zbd::{EmulateOptions, Emulated, ZonedDevice};

fn vm_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    l.split_whitespace().nth(1)?.parse().ok()
}

/// Blocks per index page.
const PAGE_BLOCKS: u64 = 1020;

#[test]
fn ten_tib_of_random_writes_keep_the_index_within_64_mib() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.img");
    let dev = Emulated::create(&path, &EmulateOptions::new(10 << 40, 256 << 20)).unwrap();
    format(&dev, &lsl::lsl_format_opts(16_384)).unwrap();
    let dev: Arc<dyn ZonedDevice> = Arc::new(dev);
    let rss0 = vm_rss_kib();
    let e = LogEngine::open(dev.clone(), LogOptions::default()).unwrap();
    let s0 = e.stats();
    let pages = s0.capacity_blocks / PAGE_BLOCKS;
    // Twice the pages the cache holds, each written once at a random block (distinct pages:
    // the worst case, every write a page of its own).
    let n = 2 * s0.index_cache_pages;
    let mut rng = StdRng::seed_from_u64(7);
    let mut written: Vec<u64> = rand::seq::index::sample(&mut rng, pages as usize, n as usize)
        .into_iter()
        .map(|p| p as u64 * PAGE_BLOCKS + rng.gen_range(0..PAGE_BLOCKS))
        .collect();
    let mut most = 0;
    let mut b = vec![0u8; BS];
    for (i, &lba) in written.iter().enumerate() {
        pattern(lba, lba, &mut b);
        e.write(lba * BS as u64, &b, false).unwrap();
        if i % 1024 == 0 {
            most = most.max(e.stats().index_resident_bytes);
        }
    }
    e.flush().unwrap();
    let s1 = e.stats();
    most = most.max(s1.index_resident_bytes);
    let rss1 = vm_rss_kib();
    eprintln!(
        "10 TiB log layout: {pages} pages, cache of {} pages, {n} writes on distinct pages: \
         index resident at most {:.1} MiB ({} pages cached at the end), {} pages written \
         back, VmRSS grew {:?} MiB",
        s1.index_cache_pages,
        most as f64 / (1 << 20) as f64,
        s1.index_cached_pages,
        s1.index_pages_written_back,
        rss1.zip(rss0).map(|(a, b)| a.saturating_sub(b) / 1024)
    );
    assert!(pages > 2_000_000, "{pages} pages: not a 10 TiB volume");
    assert!(most <= 59 << 20, "index resident {most} bytes");
    assert!(s1.index_pages_written_back >= n / 2);
    // The whole process: the bound and 8 MiB for the allocator and this test's buffers (an
    // index that kept every page would have grown by 100 MiB).
    if let (Some(a), Some(b)) = (rss1, rss0) {
        assert!(
            a.saturating_sub(b) < 72 << 10,
            "VmRSS grew by {} KiB",
            a - b
        );
    }
    // The first half was evicted long ago: reading it back reads its pages.
    written.truncate(written.len() / 2);
    let mut check = |e: &LogEngine, what: &str| {
        let mut got = vec![0u8; BS];
        for &lba in written.iter().step_by(7) {
            e.read(lba * BS as u64, &mut got).unwrap();
            pattern(lba, lba, &mut b);
            assert!(got == b, "{what}: block {lba}");
        }
    };
    check(&e, "before the crash");
    let s2 = e.stats();
    assert!(s2.index_page_reads > s1.index_page_reads);
    assert!(s2.index_resident_bytes <= 59 << 20);
    // A daemon crash: the engine dropped without a close; open replays the log.
    drop(e);
    let e = LogEngine::open(dev, LogOptions::default()).unwrap();
    check(&e, "after the crash");
    assert!(e.stats().index_resident_bytes <= 59 << 20);
    e.close().unwrap();
}
