//! The bounded metadata cache: the chunk map pinned in memory (8 bytes a chunk), bitmap
//! blocks in an LRU cache with a block limit. Dirty bitmap blocks are pinned until a commit
//! has written them to both sets; clean ones are evicted oldest first.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use zbd::ZonedDevice;

use bitvec::prelude::{BitSlice, BitVec, Lsb0};

use crate::format::{encode_map_block, Layout, MapEntry, MAP_ENTRIES_PER_BLOCK};
use crate::sets;

use super::super::ids::{ChunkId, Mapping, ZoneId, BLOCK};
use super::super::EngineError;

/// Validity bits of a range of blocks, first block first (dm-zoned's bit order: least
/// significant bit of each byte first).
pub(in crate::engine) type Bits = BitVec<u8, Lsb0>;

fn view(data: &[u8; BLOCK]) -> &BitSlice<u8, Lsb0> {
    BitSlice::from_slice(&data[..])
}

fn view_mut(data: &mut [u8; BLOCK]) -> &mut BitSlice<u8, Lsb0> {
    BitSlice::from_slice_mut(&mut data[..])
}

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
    layout: Layout,
    /// The map as the v2 sets store it (0xFFFFFFFF: no zone); [`Mapping`] outside.
    map: Vec<MapEntry>,
    dirty_map: BTreeSet<u32>,
    blocks: HashMap<u32, Entry>,
    lru: BTreeMap<u64, u32>,
    tick: u64,
    gen: u64,
    limit: usize,
    dirty_bitmaps: usize,
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

    pub fn nr_chunks(&self) -> u32 {
        self.map.len() as u32
    }

    pub fn mapping(&self, chunk: ChunkId) -> Mapping {
        Mapping::from_disk(self.map[chunk.idx()])
    }

    /// Every chunk with its mapping, mapped or not.
    pub fn mappings(&self) -> impl Iterator<Item = (ChunkId, Mapping)> + '_ {
        self.map
            .iter()
            .enumerate()
            .map(|(c, e)| (ChunkId(c as u32), Mapping::from_disk(*e)))
    }

    pub fn set_map(&mut self, chunk: ChunkId, m: Mapping) {
        self.map[chunk.idx()] = m.to_disk();
        self.dirty_map.insert(self.layout.map_block(chunk.0).0);
    }

    /// Dirty bitmap blocks (pinned until the next commit).
    pub fn dirty_bitmaps(&self) -> usize {
        self.dirty_bitmaps
    }

    pub fn is_dirty(&self) -> bool {
        !self.dirty_map.is_empty() || self.dirty_bitmaps > 0
    }

    /// Make bitmap block `mblk` resident (reading set 0 on a miss) and return it.
    fn get(&mut self, dev: &dyn ZonedDevice, mblk: u32) -> Result<&mut Entry, EngineError> {
        if !self.blocks.contains_key(&mblk) {
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
            return Ok(self.blocks.get_mut(&mblk).expect("present"));
        }
        Ok(self.get_resident(mblk))
    }

    /// A resident block, its LRU position refreshed (what `get` does on a hit).
    fn get_resident(&mut self, mblk: u32) -> &mut Entry {
        self.tick += 1;
        let t = self.tick;
        let e = self.blocks.get_mut(&mblk).expect("resident");
        if e.dirty_gen == 0 {
            self.lru.remove(&e.tick);
            self.lru.insert(t, mblk);
        }
        e.tick = t;
        e
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
    fn pieces(&self, zone: ZoneId, block: u32, n: u32) -> Vec<(u32, u32, u32)> {
        let per = crate::format::BITS_PER_BITMAP_BLOCK;
        let mut out = Vec::new();
        let mut b = block;
        let end = block + n;
        while b < end {
            let bit = b % per;
            let cnt = (per - bit).min(end - b);
            out.push((self.layout.bitmap_block(zone.0, b), bit, cnt));
            b += cnt;
        }
        out
    }

    /// Set (`valid`) or clear bits; returns how many bits changed.
    pub fn set_range(
        &mut self,
        dev: &dyn ZonedDevice,
        zone: ZoneId,
        block: u32,
        n: u32,
        valid: bool,
    ) -> Result<u32, EngineError> {
        let mut changed = 0;
        for (mblk, bit, cnt) in self.pieces(zone, block, n) {
            let e = self.get(dev, mblk)?;
            let r = &mut view_mut(&mut e.data)[bit as usize..(bit + cnt) as usize];
            let set = r.count_ones() as u32;
            let c = if valid { cnt - set } else { set };
            if c > 0 {
                r.fill(valid);
                self.mark_dirty(mblk);
            }
            changed += c;
        }
        Ok(changed)
    }

    /// Validity of blocks `[block, block + n)` of `zone`.
    pub fn bits(
        &mut self,
        dev: &dyn ZonedDevice,
        zone: ZoneId,
        block: u32,
        n: u32,
    ) -> Result<Bits, EngineError> {
        let mut out = Bits::with_capacity(n as usize);
        for (mblk, bit, cnt) in self.pieces(zone, block, n) {
            let e = self.get(dev, mblk)?;
            out.extend_from_bitslice(&view(&e.data)[bit as usize..(bit + cnt) as usize]);
        }
        Ok(out)
    }

    /// [`MetaCache::bits`] if every bitmap block it needs is resident, without reading the
    /// device (`None` otherwise): for callers that must not block.
    pub fn bits_cached(&mut self, zone: ZoneId, block: u32, n: u32) -> Option<Bits> {
        let pieces = self.pieces(zone, block, n);
        if pieces.iter().any(|p| !self.blocks.contains_key(&p.0)) {
            return None;
        }
        let mut out = Bits::with_capacity(n as usize);
        for (mblk, bit, cnt) in pieces {
            // Resident: `get` only refreshes its LRU position, it does not read.
            let e = self.get_resident(mblk);
            out.extend_from_bitslice(&view(&e.data)[bit as usize..(bit + cnt) as usize]);
        }
        Some(out)
    }

    /// `dst |= src` over a whole zone, then clear `src`. Returns the bits newly set in dst.
    pub fn merge_zone(
        &mut self,
        dev: &dyn ZonedDevice,
        dst: ZoneId,
        src: ZoneId,
    ) -> Result<u32, EngineError> {
        let zb = self.layout.zone_blocks;
        let bits = self.bits(dev, src, 0, zb)?;
        let mut added = 0;
        for (s, len) in runs_of_ones(&bits) {
            added += self.set_range(dev, dst, s, len, true)?;
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

/// The runs of set bits: (first, length).
pub(in crate::engine) fn runs_of_ones(bits: &BitSlice<u8, Lsb0>) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(s) = bits[i..].first_one() {
        let s = i + s;
        let len = bits[s..].first_zero().unwrap_or(bits.len() - s);
        out.push((s as u32, len as u32));
        i = s + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{runs_of_ones, Bits};

    #[test]
    fn runs_of_ones_finds_every_run() {
        let mut b = Bits::repeat(false, 20);
        for i in [0, 1, 2, 7, 10, 11, 19] {
            b.set(i, true);
        }
        assert_eq!(runs_of_ones(&b), vec![(0, 3), (7, 1), (10, 2), (19, 1)]);
        assert!(runs_of_ones(&Bits::repeat(false, 9)).is_empty());
        assert_eq!(runs_of_ones(&Bits::repeat(true, 9)), vec![(0, 9)]);
    }
}
