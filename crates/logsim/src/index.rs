//! Index shape for a large volume: memory of candidate indexes, and the page-miss rate of a
//! paged logical-to-physical map (L2P) with a resident LRU cache, simulated at full scale
//! (page granularity: 2.6 M pages for 10 TiB, no per-block state).
//!
//! The paged L2P (`docs/log-layout.md`): 4 KiB pages of `PAGE_ENTRIES` little-endian u32
//! physical block numbers after a 16-byte header, each page at a fixed place in the page area
//! (conventional zones); a resident directory of one u32 per page (the page is on the device /
//! unmapped / the whole page is one extent starting at this device block); an LRU cache of
//! pages. A write changes its page in the cache (reading it on a miss); a dirty
//! page evicted is written back.

use crate::workload::{Harmonic, Skew, Streams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Entries per 4 KiB index page (16 bytes of header: crc, page number, sequence).
pub const PAGE_ENTRIES: u64 = 1020;
pub const BLOCK: u64 = 4096;
const MIB: f64 = 1024.0 * 1024.0;
/// Resident bytes besides the index: a GC victim's summary (64 Ki entries x 8 bytes), log
/// group buffers, free-zone lists; budgeted at 4 MiB.
pub const OTHER: f64 = 4.0 * MIB;

/// Memory of the candidate indexes for a volume of `blocks` 4 KiB blocks.
#[derive(Clone, Debug)]
pub struct Memory {
    /// 4 bytes per block, all resident.
    pub flat: f64,
    /// An extent B-tree with `extents` extents, 24 bytes each (le32 lba, le32 pba, le32 len
    /// packed with node overhead: about 16 bytes of payload at 2/3 node fill).
    pub extent_tree: f64,
    /// The paged L2P's resident directory (4 bytes per page).
    pub directory: f64,
    /// Per-zone table (valid count, last append, generation, state: 16 bytes per zone).
    pub zone_table: f64,
    /// The index pages on the device.
    pub pages_on_device: f64,
    /// Pages that fit the rest of the budget after `OTHER` (4 KiB + 32 bytes of LRU and
    /// dirty state each).
    pub cache_pages: u64,
}

/// Bytes of the candidate indexes for `blocks` blocks, `zones` zones, `extents` extents, with
/// `budget` bytes for the resident part of the paged L2P.
pub fn memory(blocks: u64, zones: u64, extents: u64, budget: f64) -> Memory {
    let pages = blocks.div_ceil(PAGE_ENTRIES);
    let directory = pages as f64 * 4.0;
    let zone_table = zones as f64 * 16.0;
    let left = budget - directory - zone_table - OTHER;
    Memory {
        flat: blocks as f64 * 4.0,
        extent_tree: extents as f64 * 24.0,
        directory,
        zone_table,
        pages_on_device: pages as f64 * BLOCK as f64,
        cache_pages: if left > 0.0 {
            (left / (BLOCK as f64 + 32.0)) as u64
        } else {
            0
        },
    }
}

impl Memory {
    pub fn mib(x: f64) -> f64 {
        x / MIB
    }
}

/// An exact LRU over page numbers, O(1) per access (intrusive list in arrays).
pub struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    cached: Vec<bool>,
    dirty: Vec<bool>,
    head: u32,
    tail: u32,
    len: u64,
    cap: u64,
}

const NIL: u32 = u32::MAX;

/// What one access cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub miss: bool,
    pub write_back: bool,
}

impl Lru {
    pub fn new(pages: u64, cap: u64) -> Self {
        let n = pages as usize;
        Lru {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            cached: vec![false; n],
            dirty: vec![false; n],
            head: NIL,
            tail: NIL,
            len: 0,
            cap: cap.max(1),
        }
    }

    fn unlink(&mut self, p: u32) {
        let (a, b) = (self.prev[p as usize], self.next[p as usize]);
        if a != NIL {
            self.next[a as usize] = b;
        } else {
            self.head = b;
        }
        if b != NIL {
            self.prev[b as usize] = a;
        } else {
            self.tail = a;
        }
    }

    fn push_front(&mut self, p: u32) {
        self.prev[p as usize] = NIL;
        self.next[p as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = p;
        }
        self.head = p;
        if self.tail == NIL {
            self.tail = p;
        }
    }

    /// Touches page `p` (dirtying it when `write`): a miss, and whether the page it evicted
    /// was dirty.
    pub fn access(&mut self, p: u32, write: bool) -> Access {
        let mut out = Access {
            miss: false,
            write_back: false,
        };
        if self.cached[p as usize] {
            self.unlink(p);
        } else {
            out.miss = true;
            if self.len == self.cap {
                let victim = self.tail;
                self.unlink(victim);
                self.cached[victim as usize] = false;
                out.write_back = std::mem::take(&mut self.dirty[victim as usize]);
                self.len -= 1;
            }
            self.cached[p as usize] = true;
            self.len += 1;
        }
        self.push_front(p);
        if write {
            self.dirty[p as usize] = true;
        }
        out
    }
}

/// Page accesses of a workload at full scale.
struct PageSampler {
    skew: Skew,
    streams: Option<Streams>,
    blocks: u64,
    page_cdf: Vec<f64>,
    stream_pos: Vec<(u64, u64)>,
    rng: StdRng,
}

impl PageSampler {
    fn new(skew: Skew, streams: Option<Streams>, blocks: u64, seed: u64) -> Self {
        let pages = blocks.div_ceil(PAGE_ENTRIES);
        let page_cdf = match skew {
            Skew::Zipf { theta } => {
                let h = Harmonic::new(theta);
                let total = h.h(blocks);
                (1..=pages)
                    .map(|p| h.h((p * PAGE_ENTRIES).min(blocks)) / total)
                    .collect()
            }
            _ => Vec::new(),
        };
        let mut s = PageSampler {
            skew,
            streams,
            blocks,
            page_cdf,
            stream_pos: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
        };
        for _ in 0..streams.map_or(0, |s| s.count) {
            let p = s.stream_start();
            s.stream_pos.push(p);
        }
        s
    }

    fn stream_start(&mut self) -> (u64, u64) {
        let len = self.streams.map_or(1, |s| s.len);
        let start = self.rng.gen_range(0..(self.blocks / len).max(1)) * len;
        (start, start + len)
    }

    fn next_page(&mut self) -> u32 {
        if let Some(s) = self.streams {
            if self.rng.gen::<f64>() < s.frac {
                let n = self.rng.gen_range(0..s.count) as usize;
                let (pos, end) = self.stream_pos[n];
                self.stream_pos[n] = if pos + 1 >= end {
                    self.stream_start()
                } else {
                    (pos + 1, end)
                };
                return (pos / PAGE_ENTRIES) as u32;
            }
        }
        match self.skew.draw_flat(&mut self.rng, self.blocks) {
            Some(block) => (block / PAGE_ENTRIES) as u32,
            None => {
                let u: f64 = self.rng.gen();
                self.page_cdf.partition_point(|&c| c < u) as u32
            }
        }
    }
}

/// Figures of a page-cache simulation (the measured accesses only).
#[derive(Clone, Debug, Default)]
pub struct PageReport {
    pub pages: u64,
    pub cache_pages: u64,
    pub accesses: u64,
    pub misses: u64,
    pub write_backs: u64,
}

impl PageReport {
    pub fn miss_rate(&self) -> f64 {
        self.misses as f64 / self.accesses as f64
    }
    pub fn write_backs_per_access(&self) -> f64 {
        self.write_backs as f64 / self.accesses as f64
    }
}

/// User writes of a workload over the first `span` of `blocks` blocks through a cache of
/// `cache_pages` pages: `warm` accesses to fill the cache, then `measure` counted.
#[allow(clippy::too_many_arguments)]
pub fn simulate_pages(
    skew: Skew,
    streams: Option<Streams>,
    blocks: u64,
    span: u64,
    cache_pages: u64,
    warm: u64,
    measure: u64,
    seed: u64,
) -> PageReport {
    let pages = blocks.div_ceil(PAGE_ENTRIES);
    let mut lru = Lru::new(pages, cache_pages);
    let mut s = PageSampler::new(skew, streams, span.min(blocks), seed);
    let mut rep = PageReport {
        pages,
        cache_pages,
        ..Default::default()
    };
    for i in 0..warm + measure {
        let a = lru.access(s.next_page(), true);
        if i >= warm {
            rep.accesses += 1;
            rep.misses += a.miss as u64;
            rep.write_backs += a.write_back as u64;
        }
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_map_of_10_tib_is_10_gib() {
        let blocks = 10u64 << 40 >> 12;
        let m = memory(blocks, 40960, blocks, 64.0 * MIB);
        assert_eq!(Memory::mib(m.flat), 10240.0);
        // The directory and zone table leave most of 64 MiB to cached pages.
        assert!(Memory::mib(m.directory) < 11.0, "{m:?}");
        assert!((12_000..13_000).contains(&m.cache_pages), "{m:?}");
    }

    #[test]
    fn uniform_misses_at_one_minus_the_cached_share() {
        let r = simulate_pages(
            Skew::Uniform,
            None,
            1_020_000,
            1_020_000,
            100,
            10_000,
            100_000,
            1,
        );
        assert_eq!(r.pages, 1000);
        assert!((r.miss_rate() - 0.9).abs() < 0.01, "{r:?}");
        // Every page a write touched is dirty: each eviction writes one back.
        assert_eq!(r.write_backs, r.misses);
    }

    #[test]
    fn lru_keeps_the_hot_page() {
        let mut l = Lru::new(4, 2);
        assert!(l.access(0, false).miss);
        assert!(l.access(1, true).miss);
        assert!(!l.access(0, false).miss);
        // 1 is least recently used and dirty.
        assert!(l.access(2, false).write_back);
        assert!(!l.access(0, false).miss);
        assert!(l.access(1, false).miss);
    }
}
