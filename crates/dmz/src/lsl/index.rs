//! The block-granular index: logical block -> device block, in pages of 1020 entries, paged
//! (docs/design.md, "Log layout", "The paged index").
//!
//! Resident: the directory (4 bytes a page: nothing mapped, the page's slot holds it, or the
//! first device block of the one extent it is) and a bounded cache of pages. A page not in
//! the cache is read from its slot when a lookup or a change needs it (a "miss"), and checked
//! as open checks every page. The cache evicts clean pages (CLOCK, second chance); a dirty
//! page stays until it is written back ([`Index::take_dirty`], by a checkpoint or a
//! write-back, both in `durable.rs`), and the engine writes back once half the cache is
//! dirty ([`Index::needs_writeback`]). A page written back is pinned until its slot write is
//! done ([`Index::written`]): evicted before, it would be read back stale.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use zbd::ZonedDevice;

use crate::engine::ids::{Lba, PageId, BLOCK};

use super::layout::{conv_read, decode_page, encode_page, Layout, Pba, ENTRIES, IN_SLOT, NONE};
use super::EngineError;

/// Bytes a cached page costs beside its 4 KiB of entries: its state and map entry, and its
/// places in the eviction order (up to two), the dirty and the pinned lists.
const PAGE_OVERHEAD: u64 = 80;

/// Bytes the rest of the metadata state may take: the index memory budget less this and
/// the directory is the cache (log-layout.md 5.6). At 10 TiB with 256 MiB zones: the zone
/// table (40,960 entries of 24 bytes, 0.94 MiB), five frontiers' summaries (65,536 entries
/// of 8 bytes each, 2.5 MiB), a GC victim's live list (up to 0.5 MiB), compaction's page
/// set (0.3 MiB) and the log buffers: about 4.4 MiB.
const OTHER_STATE: u64 = 5 << 20;

/// Fewest pages the cache holds, whatever the budget.
const MIN_CACHE_PAGES: usize = 1;

/// Pages a cache of `budget` bytes holds for a volume of `nr_pages` pages.
pub(crate) fn cache_pages(budget: u64, nr_pages: u32) -> usize {
    let fixed = nr_pages as u64 * 4 + OTHER_STATE;
    ((budget.saturating_sub(fixed) / (BLOCK as u64 + PAGE_OVERHEAD)) as usize).max(MIN_CACHE_PAGES)
}

/// One cached page: its entries as stored (`NONE`: unmapped) and the first record not folded
/// into them.
struct Page {
    entries: Box<[u32; ENTRIES]>,
    seq: u64,
    mapped: u32,
    /// Changed since it was last written back.
    dirty: bool,
    /// Written back, its slot write not yet done: not evictable.
    pinned: bool,
    /// Used since the eviction hand last passed.
    referenced: bool,
}

impl Page {
    fn new(entries: Box<[u32; ENTRIES]>, seq: u64) -> Page {
        let mapped = entries.iter().filter(|&&v| v != NONE).count() as u32;
        Page {
            entries,
            seq,
            mapped,
            dirty: false,
            pinned: false,
            referenced: true,
        }
    }

    /// The first device block, if the whole page is one extent.
    fn as_extent(&self) -> Option<u32> {
        let first = self.entries[0];
        let one = self.mapped as usize == ENTRIES
            && self
                .entries
                .iter()
                .enumerate()
                .all(|(i, &v)| v == first.wrapping_add(i as u32));
        one.then_some(first)
    }
}

/// Where pages come from: their slots on the device, checked as they are read.
pub(crate) struct PageSource {
    dev: Arc<dyn ZonedDevice>,
    layout: Layout,
    /// Per zone: whether the device and the zone table offer it for data.
    data_zone: Vec<bool>,
    /// Pages read (cache misses and the passes over the whole index).
    reads: std::cell::Cell<u64>,
}

impl PageSource {
    pub fn new(dev: Arc<dyn ZonedDevice>, layout: Layout, data_zone: Vec<bool>) -> PageSource {
        PageSource {
            dev,
            layout,
            data_zone,
            reads: std::cell::Cell::new(0),
        }
    }

    /// Page `p` from its slot: its fold point and entries.
    fn read(&self, p: PageId) -> Result<(u64, Box<[u32; ENTRIES]>), EngineError> {
        let mut b = vec![0u8; BLOCK];
        self.reads.set(self.reads.get() + 1);
        conv_read(
            &*self.dev,
            &self.layout,
            self.layout.page_start() + p.0 as u64,
            &mut b,
        )?;
        let (seq, entries) =
            decode_page(p, &b).map_err(|m| EngineError::Meta(format!("log layout: {m}")))?;
        for (i, &v) in entries.iter().enumerate() {
            if v != NONE {
                self.check(p, i, v)?;
            }
        }
        Ok((seq, entries))
    }

    /// Entry `i` of page `p` maps a block below the exposed capacity to the data part of a
    /// data zone (a page is only CRC-checked: a crafted one must not send reads or valid
    /// counts anywhere else).
    fn check(&self, p: PageId, i: usize, v: u32) -> Result<(), EngineError> {
        let l = &self.layout;
        let lba = p.0 as u64 * ENTRIES as u64 + i as u64;
        if lba >= l.user_blocks {
            return Err(EngineError::Meta(format!(
                "log layout: index page {} maps block {lba}, beyond the exposed {} blocks",
                p.0, l.user_blocks
            )));
        }
        let (z, off) = l.zone_of(Pba(v));
        if !self.data_zone.get(z.idx()).copied().unwrap_or(false) || off >= l.data_blocks() {
            return Err(EngineError::Meta(format!(
                "log layout: index page {} maps block {lba} to device block {v}, not a data block",
                p.0
            )));
        }
        Ok(())
    }

    /// A directory extent for page `p` from device block `first`: its first and last entries
    /// checked (all 1020 lie in one zone's data part, so the rest are too).
    fn check_extent(&self, p: PageId, first: u32) -> Result<(), EngineError> {
        let last = first.wrapping_add(ENTRIES as u32 - 1);
        let same_zone =
            last > first && self.layout.zone_of(Pba(first)).0 == self.layout.zone_of(Pba(last)).0;
        if !same_zone {
            return Err(EngineError::Meta(format!(
                "log layout: directory entry {first:#x} for page {}: not one extent of a data zone",
                p.0
            )));
        }
        self.check(p, 0, first)?;
        self.check(p, ENTRIES - 1, last)
    }
}

pub(crate) struct Index {
    /// Per page: `NONE`, `IN_SLOT`, or the first device block of the extent it is. For a
    /// cached dirty page, what its last write-back left (the cache is newer).
    dir: Vec<u32>,
    /// What records an extent page is folded to (the checkpoint the directory is from).
    extent_seq: u64,
    cache: HashMap<u32, Page>,
    /// The eviction hand's order (a page may appear more than once after a drop and a
    /// reload; [`Index::tidy`] keeps it short).
    clock: VecDeque<u32>,
    /// Pages made dirty since the last write-back (a dropped one may linger).
    dirty: Vec<u32>,
    nr_dirty: usize,
    pinned: Vec<u32>,
    /// Cached pages neither dirty nor pinned: what eviction can take (none: it does not
    /// look).
    clean: usize,
    /// Pages of the record being applied ([`Index::hold`]): never evicted meanwhile, so
    /// that a record [`Index::ready`] said needs no page read needs none.
    held: Option<(u32, u32)>,
    cap: usize,
    extent_pages: u64,
    src: PageSource,
}

impl Index {
    /// The index of a volume whose directory is `dir` (as the checkpoint of sequence number
    /// `extent_seq` wrote it), caching at most `cap` pages. Extents are checked here; pages
    /// as they are read.
    pub fn new(
        dir: Vec<u32>,
        extent_seq: u64,
        cap: usize,
        src: PageSource,
    ) -> Result<Index, EngineError> {
        let mut extent_pages = 0;
        for (p, &v) in dir.iter().enumerate() {
            if v != NONE && v != IN_SLOT {
                src.check_extent(PageId(p as u32), v)?;
                extent_pages += 1;
            }
        }
        Ok(Index {
            dir,
            extent_seq,
            cache: HashMap::new(),
            clock: VecDeque::new(),
            dirty: Vec::new(),
            nr_dirty: 0,
            pinned: Vec::new(),
            clean: 0,
            held: None,
            cap: cap.max(MIN_CACHE_PAGES),
            extent_pages,
            src,
        })
    }

    /// Pages the directory stores as one extent.
    pub fn extent_pages(&self) -> u64 {
        self.extent_pages
    }

    fn set_dir(&mut self, p: usize, v: u32) {
        let extent = |v: u32| (v != NONE && v != IN_SLOT) as u64;
        self.extent_pages = self.extent_pages - extent(self.dir[p]) + extent(v);
        self.dir[p] = v;
    }

    /// Page `p` in the cache (read from its slot or made from its extent), or `None` when
    /// it maps nothing.
    fn page(&mut self, p: PageId) -> Result<Option<&mut Page>, EngineError> {
        if !self.cache.contains_key(&p.0) {
            let page = match self.dir[p.idx()] {
                NONE => return Ok(None),
                IN_SLOT => {
                    let (seq, entries) = self.src.read(p)?;
                    Page::new(entries, seq)
                }
                first => {
                    let e: Vec<u32> = (0..ENTRIES as u32).map(|i| first + i).collect();
                    Page::new(
                        e.into_boxed_slice().try_into().expect("1020"),
                        self.extent_seq,
                    )
                }
            };
            self.insert(p, page);
        }
        let page = self.cache.get_mut(&p.0).expect("cached");
        page.referenced = true;
        Ok(Some(page))
    }

    fn insert(&mut self, p: PageId, page: Page) {
        if self.cache.len() >= self.cap {
            self.evict_one();
        }
        debug_assert!(!page.dirty && !page.pinned);
        self.clean += 1;
        self.cache.insert(p.0, page);
        self.clock.push_back(p.0);
        if self.clock.len() > 2 * self.cache.len() + 16 {
            self.tidy();
        }
    }

    /// Evict one clean, unpinned page not used since the hand last passed it and not held
    /// (none: the cache grows until the next write-back, which the engine makes once half of
    /// it is dirty). With no clean page it returns at once: a cache full of dirty pages
    /// (`zonedd check`, which never writes back) costs no walk per insert.
    fn evict_one(&mut self) {
        if self.clean == 0 {
            return;
        }
        for _ in 0..2 * self.clock.len() {
            let Some(p) = self.clock.pop_front() else {
                return;
            };
            let held = self.held.is_some_and(|(a, b)| (a..=b).contains(&p));
            let Some(page) = self.cache.get_mut(&p) else {
                continue;
            };
            if page.dirty || page.pinned || held || std::mem::take(&mut page.referenced) {
                self.clock.push_back(p);
                continue;
            }
            self.cache.remove(&p);
            self.clean -= 1;
            return;
        }
    }

    /// Keep the pages of blocks `lba..lba + n` cached until [`Index::release`] (around the
    /// application of one record: `Meta::apply`).
    pub fn hold(&mut self, lba: Lba, n: u32) {
        let first = Layout::page_of(lba).0 .0;
        let last = Layout::page_of(Lba(lba.0.saturating_add(n.max(1) - 1)))
            .0
             .0;
        self.held = Some((first, last));
    }

    pub fn release(&mut self) {
        self.held = None;
    }

    /// The eviction order with each cached page once.
    fn tidy(&mut self) {
        let mut seen = HashSet::new();
        let cache = &self.cache;
        self.clock
            .retain(|p| cache.contains_key(p) && seen.insert(*p));
    }

    pub fn get(&mut self, lba: Lba) -> Result<Option<Pba>, EngineError> {
        let (p, i) = Layout::page_of(lba);
        let v = match self.cache.get_mut(&p.0) {
            Some(pg) => {
                pg.referenced = true;
                pg.entries[i]
            }
            None => match self.dir[p.idx()] {
                NONE => NONE,
                IN_SLOT => self.page(p)?.map_or(NONE, |pg| pg.entries[i]),
                first => first + i as u32,
            },
        };
        Ok((v != NONE).then_some(Pba(v)))
    }

    /// `lba`'s location without reading a page: `None` when its page must be read first.
    pub fn peek(&self, lba: Lba) -> Option<Option<Pba>> {
        let (p, i) = Layout::page_of(lba);
        let v = match (self.cache.get(&p.0), self.dir[p.idx()]) {
            (Some(pg), _) => pg.entries[i],
            (None, NONE) => NONE,
            (None, IN_SLOT) => return None,
            (None, first) => first + i as u32,
        };
        Some((v != NONE).then_some(Pba(v)))
    }

    /// Whether blocks `lba..lba + n` can be looked up and changed without reading a page.
    pub fn ready(&self, lba: Lba, n: u32) -> bool {
        let first = Layout::page_of(lba).0 .0;
        let last = Layout::page_of(Lba(lba.0 + n.max(1) - 1)).0 .0;
        (first..=last).all(|p| self.cache.contains_key(&p) || self.dir[p as usize] != IN_SLOT)
    }

    /// Whether every range of `ranges` can be looked up and changed without reading a
    /// page, one after the other: each [`Index::ready`], and the cache can take every page
    /// not cached yet without evicting one (which an earlier range could do to a later
    /// one's page).
    pub fn ready_all(&self, ranges: &[(Lba, u32)]) -> bool {
        let mut new: Vec<u32> = Vec::new();
        for &(lba, n) in ranges {
            if !self.ready(lba, n) {
                return false;
            }
            let first = Layout::page_of(lba).0 .0;
            let last = Layout::page_of(Lba(lba.0 + n.max(1) - 1)).0 .0;
            new.extend((first..=last).filter(|p| !self.cache.contains_key(p)));
        }
        new.sort_unstable();
        new.dedup();
        new.is_empty() || self.cache.len() + new.len() <= self.cap
    }

    /// Map `lba` to `to`; returns the old location. A page left mapping nothing is dropped
    /// at once (its directory entry becomes `NONE`; the next checkpoint writes that).
    pub fn set(&mut self, lba: Lba, to: Option<Pba>) -> Result<Option<Pba>, EngineError> {
        let (p, i) = Layout::page_of(lba);
        if self.page(p)?.is_none() {
            if to.is_none() {
                return Ok(None);
            }
            self.insert(p, Page::new(Box::new([NONE; ENTRIES]), 0));
        }
        let page = self.cache.get_mut(&p.0).expect("cached");
        let old = std::mem::replace(&mut page.entries[i], to.map_or(NONE, |p| p.0));
        page.mapped = page.mapped + to.is_some() as u32 - (old != NONE) as u32;
        if !std::mem::replace(&mut page.dirty, true) {
            self.nr_dirty += 1;
            self.dirty.push(p.0);
            if !page.pinned {
                self.clean -= 1;
            }
        }
        if page.mapped == 0 && !page.pinned {
            self.cache.remove(&p.0);
            self.nr_dirty -= 1;
            self.set_dir(p.idx(), NONE);
        }
        Ok((old != NONE).then_some(Pba(old)))
    }

    /// Whether page `p` maps anything (a page that does not can be skipped whole).
    pub fn has_page(&self, p: PageId) -> bool {
        self.cache.contains_key(&p.0) || self.dir[p.idx()] != NONE
    }

    /// Every record below this sequence number is folded into `p`'s entries already (replay
    /// skips them for this page).
    pub fn page_seq(&mut self, p: PageId) -> Result<u64, EngineError> {
        Ok(self.page(p)?.map_or(0, |pg| pg.seq))
    }

    /// Half the cache is dirty: time to write back.
    pub fn needs_writeback(&self) -> bool {
        self.nr_dirty >= (self.cap / 2).max(1)
    }

    /// Write-back: images of up to `max` dirty pages, folded up to `seq`, for their slots
    /// (pages that are one extent are not written: the directory says so); the directory
    /// updated, and the pages clean and pinned until [`Index::written`]. Empty when no page
    /// is dirty. (In batches: images of every dirty page at once would double the memory
    /// they take.)
    pub fn take_dirty(&mut self, seq: u64, max: usize) -> Vec<(PageId, Box<[u8; BLOCK]>)> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(p) = self.dirty.pop() else {
                break;
            };
            let Some(pg) = self.cache.get_mut(&p) else {
                continue;
            };
            if !std::mem::take(&mut pg.dirty) {
                continue;
            }
            self.nr_dirty -= 1;
            pg.seq = seq;
            let v = match pg.as_extent() {
                Some(first) => {
                    if !pg.pinned {
                        self.clean += 1;
                    }
                    first
                }
                None => {
                    pg.pinned = true;
                    self.pinned.push(p);
                    out.push((PageId(p), encode_page(PageId(p), seq, &pg.entries)));
                    IN_SLOT
                }
            };
            self.set_dir(p as usize, v);
        }
        out
    }

    /// The slot writes of the last [`Index::take_dirty`] are done.
    pub fn written(&mut self) {
        for p in std::mem::take(&mut self.pinned) {
            if let Some(pg) = self.cache.get_mut(&p) {
                if std::mem::take(&mut pg.pinned) && !pg.dirty {
                    self.clean += 1;
                }
            }
        }
    }

    /// The directory entries of pages `j * 1020 ..` (after [`Index::take_dirty`]: every
    /// page is in its slot, one extent, or maps nothing).
    pub fn dir_entries(&self, j: u32) -> [u32; ENTRIES] {
        let mut e = [NONE; ENTRIES];
        let first = j as usize * ENTRIES;
        for (k, v) in e.iter_mut().enumerate() {
            if let Some(&d) = self.dir.get(first + k) {
                *v = d;
            }
        }
        e
    }

    /// Call `f` with every mapped (logical, device) pair, in logical order, reading the pages
    /// not cached from their slots without caching them (one pass over the index: open, check
    /// and the test hooks).
    pub fn for_each_mapped(&self, mut f: impl FnMut(Lba, Pba)) -> Result<(), EngineError> {
        let mut read;
        for p in 0..self.dir.len() {
            let id = PageId(p as u32);
            let entries: &[u32; ENTRIES] = match (self.cache.get(&id.0), self.dir[p]) {
                (Some(pg), _) => &pg.entries,
                (None, NONE) => continue,
                (None, IN_SLOT) => {
                    read = self.src.read(id)?.1;
                    &read
                }
                (None, first) => {
                    for i in 0..ENTRIES as u32 {
                        f(Lba(p as u32 * ENTRIES as u32 + i), Pba(first + i));
                    }
                    continue;
                }
            };
            for (i, &v) in entries.iter().enumerate() {
                if v != NONE {
                    f(Lba((p * ENTRIES + i) as u32), Pba(v));
                }
            }
        }
        Ok(())
    }

    /// Read pages stored in their slots into the cache, in order, while it has room (at
    /// open: a volume whose index fits is then served without a miss, and its pages are read
    /// once for [`Index::for_each_mapped`] too).
    pub fn warm(&mut self) -> Result<(), EngineError> {
        for p in 0..self.dir.len() {
            if self.cache.len() >= self.cap {
                break;
            }
            if self.dir[p] == IN_SLOT && !self.cache.contains_key(&(p as u32)) {
                let id = PageId(p as u32);
                let (seq, entries) = self.src.read(id)?;
                let mut page = Page::new(entries, seq);
                page.referenced = false;
                self.insert(id, page);
            }
        }
        Ok(())
    }

    /// Page `p`'s mapped blocks, in logical order.
    pub fn page_blocks(&mut self, p: PageId) -> Result<Vec<(Lba, Pba)>, EngineError> {
        let first = p.0 as usize * ENTRIES;
        Ok(self.page(p)?.map_or_else(Vec::new, |pg| {
            pg.entries
                .iter()
                .enumerate()
                .filter(|(_, &v)| v != NONE)
                .map(|(i, &v)| (Lba((first + i) as u32), Pba(v)))
                .collect()
        }))
    }

    /// Page `p`'s mapped blocks and extents: runs of mapped blocks at consecutive device
    /// blocks (a hole in the logical range does not break one: a compaction packs the mapped
    /// blocks, and must then count one extent).
    pub fn page_extents(&mut self, p: PageId) -> Result<(u32, u32), EngineError> {
        let (mut mapped, mut extents, mut next) = (0, 0, None);
        if let Some(pg) = self.page(p)? {
            for &b in pg.entries.iter().filter(|&&v| v != NONE) {
                mapped += 1;
                if next != Some(b) {
                    extents += 1;
                }
                next = Some(b.wrapping_add(1));
            }
        }
        Ok((mapped, extents))
    }

    /// The cache's counts agree with its pages (`LogEngine::debug_check`).
    pub fn check_counts(&self) -> Result<(), String> {
        let dirty = self.cache.values().filter(|p| p.dirty).count();
        let clean = self
            .cache
            .values()
            .filter(|p| !p.dirty && !p.pinned)
            .count();
        if (dirty, clean) != (self.nr_dirty, self.clean) {
            return Err(format!(
                "index cache: {dirty} dirty and {clean} evictable pages, counted {} and {}",
                self.nr_dirty, self.clean
            ));
        }
        Ok(())
    }

    /// Pages read from their slots: cache misses, and the pages a pass over the whole index
    /// read without caching.
    pub fn page_reads(&self) -> u64 {
        self.src.reads.get()
    }

    /// Pages in the index (mapped or not).
    pub fn nr_pages(&self) -> u32 {
        self.dir.len() as u32
    }

    /// Pages the cache holds at most (no more than the volume has).
    pub fn cache_cap(&self) -> usize {
        self.cap.min(self.dir.len())
    }

    pub fn cached_pages(&self) -> usize {
        self.cache.len()
    }

    /// The index's resident bytes: the directory, the cached pages and their bookkeeping.
    pub fn resident_bytes(&self) -> u64 {
        self.dir.len() as u64 * 4 + self.cache.len() as u64 * (BLOCK as u64 + PAGE_OVERHEAD)
    }
}
