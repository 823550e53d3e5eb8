//! The block-granular index: logical block -> device block, in pages of 1020 entries. In this
//! slice every page is resident (no cache, no eviction); pages are still written to their
//! slots by the checkpoint with the sequence number they are folded to, so the format does
//! not change when paging comes.

use crate::engine::ids::{Lba, PageId, BLOCK};

use super::layout::{encode_page, Layout, Pba, ENTRIES, IN_SLOT, NONE};

/// One resident page: its entries as stored (`NONE`: unmapped) and the first record not
/// folded into its on-disk copy (0 for a page never written). A page whose 1020 blocks sit
/// at consecutive device blocks is stored as that extent, in the directory alone.
struct Page {
    entries: Box<[u32; ENTRIES]>,
    seq: u64,
    mapped: u32,
    extent: bool,
}

impl Page {
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

pub(crate) struct Index {
    pages: Vec<Option<Page>>,
    /// Pages changed since the last checkpoint wrote them.
    dirty: Vec<bool>,
}

impl Index {
    pub fn new(nr_pages: u32) -> Index {
        Index {
            pages: (0..nr_pages).map(|_| None).collect(),
            dirty: vec![false; nr_pages as usize],
        }
    }

    /// A page read from its slot at open.
    pub fn load_page(&mut self, p: PageId, seq: u64, entries: Box<[u32; ENTRIES]>) {
        let mapped = entries.iter().filter(|&&v| v != NONE).count() as u32;
        self.pages[p.idx()] = Some(Page {
            entries,
            seq,
            mapped,
            extent: false,
        });
    }

    /// A page the directory stores as one extent from device block `first`, folded to `seq`.
    pub fn load_extent(&mut self, p: PageId, seq: u64, first: Pba) {
        let entries: Vec<u32> = (0..ENTRIES as u32)
            .map(|i| first.0.wrapping_add(i))
            .collect();
        self.pages[p.idx()] = Some(Page {
            entries: entries.into_boxed_slice().try_into().expect("1020 entries"),
            seq,
            mapped: ENTRIES as u32,
            extent: true,
        });
    }

    /// Resident pages stored as one extent.
    pub fn extent_pages(&self) -> u64 {
        self.pages.iter().flatten().filter(|p| p.extent).count() as u64
    }

    pub fn get(&self, lba: Lba) -> Option<Pba> {
        let (p, i) = Layout::page_of(lba);
        let v = self.pages[p.idx()].as_ref()?.entries[i];
        (v != NONE).then_some(Pba(v))
    }

    /// Map `lba` to `to`; returns the old location.
    pub fn set(&mut self, lba: Lba, to: Option<Pba>) -> Option<Pba> {
        let (p, i) = Layout::page_of(lba);
        let slot = &mut self.pages[p.idx()];
        if slot.is_none() && to.is_none() {
            return None;
        }
        let page = slot.get_or_insert_with(|| Page {
            entries: Box::new([NONE; ENTRIES]),
            seq: 0,
            mapped: 0,
            extent: false,
        });
        let old = std::mem::replace(&mut page.entries[i], to.map_or(NONE, |p| p.0));
        page.mapped = page.mapped + to.is_some() as u32 - (old != NONE) as u32;
        self.dirty[p.idx()] = true;
        (old != NONE).then_some(Pba(old))
    }

    /// Whether page `p` maps anything (a page that does not can be skipped whole).
    pub fn has_page(&self, p: PageId) -> bool {
        self.pages[p.idx()].is_some()
    }

    /// Every record below this sequence number is folded into `p`'s entries already (replay
    /// skips them for this page).
    pub fn page_seq(&self, p: PageId) -> u64 {
        self.pages[p.idx()].as_ref().map_or(0, |pg| pg.seq)
    }

    /// Checkpoint: images of the dirty pages folded up to `seq` (pages left with nothing
    /// mapped are dropped, and pages that are one extent are not written: the directory
    /// says so), and the dirty marks cleared.
    pub fn take_dirty(&mut self, seq: u64) -> Vec<(PageId, Box<[u8; BLOCK]>)> {
        let mut out = Vec::new();
        for (p, d) in self.dirty.iter_mut().enumerate() {
            if !std::mem::take(d) {
                continue;
            }
            let slot = &mut self.pages[p];
            match slot {
                Some(pg) if pg.mapped == 0 => *slot = None,
                Some(pg) => {
                    pg.seq = seq;
                    pg.extent = pg.as_extent().is_some();
                    if !pg.extent {
                        let id = PageId(p as u32);
                        out.push((id, encode_page(id, seq, &pg.entries)));
                    }
                }
                None => {}
            }
        }
        out
    }

    /// The directory entries of pages `j * 1020 ..` (after [`Index::take_dirty`]: every
    /// resident page is in its slot or one extent).
    pub fn dir_entries(&self, j: u32) -> [u32; ENTRIES] {
        let mut e = [NONE; ENTRIES];
        let first = j as usize * ENTRIES;
        for (k, v) in e.iter_mut().enumerate() {
            if let Some(Some(pg)) = self.pages.get(first + k) {
                *v = if pg.extent { pg.entries[0] } else { IN_SLOT };
            }
        }
        e
    }

    /// Every mapped (logical, device) pair, in logical order.
    pub fn mapped(&self) -> impl Iterator<Item = (Lba, Pba)> + '_ {
        self.pages.iter().enumerate().flat_map(|(p, pg)| {
            pg.iter().flat_map(move |pg| {
                pg.entries.iter().enumerate().filter_map(move |(i, &v)| {
                    (v != NONE).then_some((Lba((p * ENTRIES + i) as u32), Pba(v)))
                })
            })
        })
    }

    /// Page `p`'s mapped blocks, in logical order.
    fn page_mapped(&self, p: PageId) -> impl Iterator<Item = (Lba, Pba)> + '_ {
        let first = p.0 as usize * ENTRIES;
        self.pages
            .get(p.idx())
            .and_then(|pg| pg.as_ref())
            .into_iter()
            .flat_map(move |pg| {
                pg.entries.iter().enumerate().filter_map(move |(i, &v)| {
                    (v != NONE).then_some((Lba((first + i) as u32), Pba(v)))
                })
            })
    }

    /// Page `p`'s mapped blocks in logical order.
    pub fn page_blocks(&self, p: PageId) -> Vec<(Lba, Pba)> {
        self.page_mapped(p).collect()
    }

    /// Page `p`'s mapped blocks and extents: runs of mapped blocks at consecutive device
    /// blocks (a hole in the logical range does not break one: a compaction packs the mapped
    /// blocks, and must then count one extent).
    pub fn page_extents(&self, p: PageId) -> (u32, u32) {
        let (mut mapped, mut extents, mut next) = (0, 0, None);
        for (_, b) in self.page_mapped(p) {
            mapped += 1;
            if next != Some(b.0) {
                extents += 1;
            }
            next = Some(b.0.wrapping_add(1));
        }
        (mapped, extents)
    }

    /// Pages in the index (mapped or not).
    pub fn nr_pages(&self) -> u32 {
        self.pages.len() as u32
    }

    /// Resident pages and their bytes.
    pub fn resident_bytes(&self) -> u64 {
        self.pages.iter().flatten().count() as u64 * BLOCK as u64
    }
}
