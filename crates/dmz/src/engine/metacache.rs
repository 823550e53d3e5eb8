//! The bounded metadata cache: the chunk map pinned in memory (8 bytes a chunk), bitmap
//! blocks in an LRU cache with a block limit. Dirty bitmap blocks are pinned until a commit
//! has written them to both sets; clean ones are evicted oldest first.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use zbd::ZonedDevice;

use crate::format::{
    clear_bit, encode_map_block, set_bit, test_bit, Layout, MapEntry, BLOCK, MAP_ENTRIES_PER_BLOCK,
};
use crate::sets;

use super::EngineError;

struct Entry {
    data: Box<[u8; BLOCK]>,
    /// Bumped on every change; 0 = clean (equal to what both sets hold).
    dirty_gen: u64,
    /// LRU key while clean.
    tick: u64,
}

/// A dirty metadata block copied for a commit: (set-relative block, image, generation).
pub(super) struct SnapBlock {
    pub mblk: u32,
    pub data: Box<[u8; BLOCK]>,
    pub gen: u64,
}

pub(super) struct MetaCache {
    pub layout: Layout,
    pub map: Vec<MapEntry>,
    dirty_map: BTreeSet<u32>,
    blocks: HashMap<u32, Entry>,
    lru: BTreeMap<u64, u32>,
    tick: u64,
    gen: u64,
    limit: usize,
    pub dirty_bitmaps: usize,
    pub misses: u64,
}

impl MetaCache {
    pub fn new(layout: Layout, map: Vec<MapEntry>, limit: usize) -> MetaCache {
        MetaCache {
            layout,
            map,
            dirty_map: BTreeSet::new(),
            blocks: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            gen: 0,
            limit: limit.max(4),
            dirty_bitmaps: 0,
            misses: 0,
        }
    }

    /// Bytes of metadata held in memory (map, cached blocks, bookkeeping).
    pub fn mem_bytes(&self) -> usize {
        self.map.capacity() * std::mem::size_of::<MapEntry>()
            + self.blocks.capacity() * (std::mem::size_of::<(u32, Entry)>() + 8)
            + self.blocks.len() * BLOCK
            + self.lru.len() * 48
            + self.dirty_map.len() * 24
    }

    pub fn nr_cached(&self) -> usize {
        self.blocks.len()
    }

    pub fn set_map(&mut self, chunk: u32, e: MapEntry) {
        self.map[chunk as usize] = e;
        self.dirty_map.insert(self.layout.map_block(chunk).0);
    }

    pub fn is_dirty(&self) -> bool {
        !self.dirty_map.is_empty() || self.dirty_bitmaps > 0
    }

    /// Make bitmap block `mblk` resident (reading set 0 on a miss) and return it.
    fn get(&mut self, dev: &dyn ZonedDevice, mblk: u32) -> Result<&mut Entry, EngineError> {
        if !self.blocks.contains_key(&mblk) {
            self.misses += 1;
            let mut data = Box::new([0u8; BLOCK]);
            sets::read_meta_blocks(dev, &self.layout, 0, mblk, &mut data[..])?;
            // Make room first: the block asked for must stay resident.
            self.evict_to(self.limit.saturating_sub(1));
            self.tick += 1;
            self.blocks.insert(
                mblk,
                Entry {
                    data,
                    dirty_gen: 0,
                    tick: self.tick,
                },
            );
            self.lru.insert(self.tick, mblk);
        } else {
            self.tick += 1;
            let t = self.tick;
            let e = self.blocks.get_mut(&mblk).expect("present");
            if e.dirty_gen == 0 {
                self.lru.remove(&e.tick);
                self.lru.insert(t, mblk);
            }
            e.tick = t;
        }
        Ok(self.blocks.get_mut(&mblk).expect("present"))
    }

    fn evict(&mut self) {
        self.evict_to(self.limit);
    }

    fn evict_to(&mut self, limit: usize) {
        while self.blocks.len() > limit {
            let Some((_, mblk)) = self.lru.pop_first() else {
                break; // everything left is dirty: pinned until the next commit
            };
            self.blocks.remove(&mblk);
        }
    }

    fn mark_dirty(&mut self, mblk: u32) {
        self.gen += 1;
        let g = self.gen;
        let e = self.blocks.get_mut(&mblk).expect("resident");
        if e.dirty_gen == 0 {
            self.lru.remove(&e.tick);
            self.dirty_bitmaps += 1;
        }
        e.dirty_gen = g;
    }

    /// Split blocks `[block, block + n)` of `zone` into (bitmap block, first bit, count).
    fn pieces(&self, zone: u32, block: u32, n: u32) -> Vec<(u32, u32, u32)> {
        let per = crate::format::BITS_PER_BITMAP_BLOCK;
        let mut out = Vec::new();
        let mut b = block;
        let end = block + n;
        while b < end {
            let bit = b % per;
            let cnt = (per - bit).min(end - b);
            out.push((self.layout.bitmap_block(zone, b), bit, cnt));
            b += cnt;
        }
        out
    }

    /// Set (`valid`) or clear bits; returns how many bits changed.
    pub fn set_range(
        &mut self,
        dev: &dyn ZonedDevice,
        zone: u32,
        block: u32,
        n: u32,
        valid: bool,
    ) -> Result<u32, EngineError> {
        let mut changed = 0;
        for (mblk, bit, cnt) in self.pieces(zone, block, n) {
            let e = self.get(dev, mblk)?;
            let mut c = 0;
            for i in bit..bit + cnt {
                if test_bit(&e.data[..], i) != valid {
                    if valid {
                        set_bit(&mut e.data[..], i);
                    } else {
                        clear_bit(&mut e.data[..], i);
                    }
                    c += 1;
                }
            }
            if c > 0 {
                self.mark_dirty(mblk);
            }
            changed += c;
        }
        Ok(changed)
    }

    /// Validity of blocks `[block, block + n)` of `zone`, appended to `out`.
    pub fn bits(
        &mut self,
        dev: &dyn ZonedDevice,
        zone: u32,
        block: u32,
        n: u32,
        out: &mut Vec<bool>,
    ) -> Result<(), EngineError> {
        for (mblk, bit, cnt) in self.pieces(zone, block, n) {
            let e = self.get(dev, mblk)?;
            out.extend((bit..bit + cnt).map(|i| test_bit(&e.data[..], i)));
        }
        Ok(())
    }

    /// `dst |= src` over a whole zone, then clear `src`. Returns the bits newly set in dst.
    pub fn merge_zone(
        &mut self,
        dev: &dyn ZonedDevice,
        dst: u32,
        src: u32,
    ) -> Result<u32, EngineError> {
        let zb = self.layout.zone_blocks;
        let mut bits = Vec::with_capacity(zb as usize);
        self.bits(dev, src, 0, zb, &mut bits)?;
        let mut added = 0;
        let mut i = 0u32;
        while i < zb {
            if !bits[i as usize] {
                i += 1;
                continue;
            }
            let s = i;
            while i < zb && bits[i as usize] {
                i += 1;
            }
            added += self.set_range(dev, dst, s, i - s, true)?;
        }
        self.set_range(dev, src, 0, zb, false)?;
        Ok(added)
    }

    /// Copy every dirty block (map and bitmap) for a commit; they stay pinned until
    /// [`MetaCache::commit_done`].
    pub fn snapshot(&mut self) -> Vec<SnapBlock> {
        let mut out = Vec::new();
        for mblk in std::mem::take(&mut self.dirty_map) {
            let first = (mblk - 1) as usize * MAP_ENTRIES_PER_BLOCK;
            let last = (first + MAP_ENTRIES_PER_BLOCK).min(self.map.len());
            out.push(SnapBlock {
                mblk,
                data: encode_map_block(&self.map[first..last]),
                gen: 0,
            });
        }
        for (&mblk, e) in &self.blocks {
            if e.dirty_gen != 0 {
                out.push(SnapBlock {
                    mblk,
                    data: e.data.clone(),
                    gen: e.dirty_gen,
                });
            }
        }
        out.sort_by_key(|b| b.mblk);
        out
    }

    /// The snapshot is in both sets: blocks unchanged since are clean again.
    pub fn commit_done(&mut self, snap: &[SnapBlock]) {
        for b in snap {
            if b.gen == 0 {
                continue;
            }
            if let Some(e) = self.blocks.get_mut(&b.mblk) {
                if e.dirty_gen == b.gen {
                    e.dirty_gen = 0;
                    self.dirty_bitmaps -= 1;
                    self.tick += 1;
                    e.tick = self.tick;
                    self.lru.insert(self.tick, b.mblk);
                }
            }
        }
        self.evict();
    }
}
