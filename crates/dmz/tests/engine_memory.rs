//! A formatted 10 TiB sparse emulated image (40,960 zones of 256 MiB) opens with under
//! 8 MiB of metadata in memory: the map is pinned, bitmap blocks are cached up to a limit.

mod common;

use std::sync::Arc;

use common::*;
use dmz::engine::EngineOptions;
use zbd::{EmulateOptions, Emulated, ZonedDevice};

fn vm_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    l.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn ten_tib_volume_opens_in_under_8_mib() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.img");
    let opts = EmulateOptions::new(10 << 40, 256 << 20);
    let dev = Emulated::create(&path, &opts).unwrap();
    format_dev(&dev, 16);
    let dev: Arc<dyn ZonedDevice> = Arc::new(dev);
    let rss0 = vm_rss_kib();
    let e = open(dev, EngineOptions::default());
    let rss1 = vm_rss_kib();
    // Touch the engine a little: a write and a read in a few chunks. (The volume is too
    // large for a per-block model: each chunk's first 72 blocks are checked.)
    let chunk_blocks = e.chunk_size() / BS as u64;
    let mut b = vec![0u8; 64 * BS];
    for c in [0u64, 7, 40_000] {
        let first = c * chunk_blocks;
        pattern(c + 1, first + 8, &mut b);
        e.write((first + 8) * BS as u64, &b, false).unwrap();
        assert_blocks(&e, first, 8, 0);
        assert_blocks(&e, first + 8, 64, c + 1);
    }
    let s = e.stats();
    eprintln!(
        "10 TiB: {} zones, {} chunks, metadata in memory {} KiB, VmRSS delta at open {:?} KiB",
        s.zones_total,
        s.chunks_total,
        s.metadata_mem_bytes / 1024,
        rss1.zip(rss0).map(|(a, b)| a.saturating_sub(b))
    );
    assert_eq!(s.zones_total, 40_960);
    assert!(
        s.metadata_mem_bytes < 8 << 20,
        "{} bytes",
        s.metadata_mem_bytes
    );
    if let (Some(a), Some(b)) = (rss1, rss0) {
        assert!(a.saturating_sub(b) < 8 << 10, "RSS grew by {} KiB", a - b);
    }
    close(e);
}
