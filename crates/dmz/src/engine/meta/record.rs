//! The metadata log's records, one type each: its bytes (docs/design.md, "Metadata log
//! records"), the range check replay makes before trusting it, and what it does to the
//! in-memory metadata. The live path and replay apply a record through the same
//! [`Record::apply`]; adding a record type is a change to this file alone.
//!
//! Every record is a type byte followed by little-endian fields; zone and block numbers are
//! zone ids and in-zone 4 KiB blocks, "no zone" is `0xFFFFFFFF`.

use zbd::ZonedDevice;

use super::super::ids::{zone_from_disk, zone_to_disk, ChunkId, Mapping, ZoneId, IO_BATCH_BLOCKS};
use super::super::EngineError;
use super::zones::Role;
use super::Meta;

/// Where a record is applied: on the live engine, or replayed at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ctx {
    /// Zones freed go to the pending pool (reusable once the record is durable); zones a
    /// mapping names become that chunk's.
    Live,
    /// Pools and zone ownership are settled once from the final map (`open::settle`), as
    /// for the map read from the v2 sets, which no record describes.
    Replay,
}

/// What replay checks a record against.
pub(super) struct Bounds {
    pub nr_zones: u32,
    pub nr_chunks: u32,
    pub zone_blocks: u32,
}

impl Bounds {
    fn zone(&self, z: ZoneId) -> bool {
        z.0 < self.nr_zones
    }
    fn opt_zone(&self, z: Option<ZoneId>) -> bool {
        z.is_none_or(|z| self.zone(z))
    }
    fn mapping(&self, m: &Mapping) -> bool {
        self.opt_zone(m.dzone) && self.opt_zone(m.bzone)
    }
    fn blocks(&self, b: u32, n: u32) -> bool {
        n > 0 && (b as u64 + n as u64) <= self.zone_blocks as u64
    }
}

/// Appends little-endian fields (shared with the log layout's records, `crate::lsl`).
pub(crate) struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn zone(&mut self, z: Option<ZoneId>) {
        self.u32(zone_to_disk(z));
    }
}

/// Reads little-endian fields; `None` past the end.
pub(crate) struct Reader<'a> {
    b: &'a [u8],
    pub pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b, pos: 0 }
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        let v = *self.b.get(self.pos)?;
        self.pos += 1;
        Some(v)
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        let v = self.b.get(self.pos..self.pos + 2)?;
        self.pos += 2;
        Some(u16::from_le_bytes(v.try_into().ok()?))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        let v = self.b.get(self.pos..self.pos + 4)?;
        self.pos += 4;
        Some(u32::from_le_bytes(v.try_into().ok()?))
    }
    fn zone(&mut self) -> Option<ZoneId> {
        self.u32().map(ZoneId)
    }
    fn opt_zone(&mut self) -> Option<Option<ZoneId>> {
        self.u32().map(zone_from_disk)
    }
    fn chunk(&mut self) -> Option<ChunkId> {
        self.u32().map(ChunkId)
    }
}

/// What one record type knows about itself.
pub(super) trait Record: Sized {
    /// The type byte.
    const TYPE: u8;
    /// The fields after the type byte.
    fn encode(&self, w: &mut Writer<'_>);
    fn decode(r: &mut Reader<'_>) -> Option<Self>;
    /// Every zone and chunk it names exists and every block range fits a zone.
    fn in_range(&self, b: &Bounds) -> bool;
    /// Its effect on the in-memory metadata; `seq` is its sequence number.
    fn apply(
        &self,
        m: &mut Meta,
        dev: &dyn ZonedDevice,
        seq: u64,
        ctx: Ctx,
    ) -> Result<(), EngineError>;
}

/// `map{chunk u32, dzone u32, bzone u32}`: the chunk now maps to these zones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::engine) struct MapRec {
    pub chunk: ChunkId,
    pub map: Mapping,
}

impl Record for MapRec {
    const TYPE: u8 = 1;
    fn encode(&self, w: &mut Writer<'_>) {
        w.u32(self.chunk.0);
        w.zone(self.map.dzone);
        w.zone(self.map.bzone);
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        let chunk = r.chunk()?;
        let dzone = r.opt_zone()?;
        let bzone = r.opt_zone()?;
        Some(MapRec {
            chunk,
            map: Mapping { dzone, bzone },
        })
    }
    fn in_range(&self, b: &Bounds) -> bool {
        self.chunk.0 < b.nr_chunks && b.mapping(&self.map)
    }
    fn apply(
        &self,
        m: &mut Meta,
        _: &dyn ZonedDevice,
        _: u64,
        ctx: Ctx,
    ) -> Result<(), EngineError> {
        m.set_mapping(self.chunk, self.map, ctx);
        Ok(())
    }
}

/// `write{zone u32, block u32, other u32, n u32, crc u32 × n}`: `n` blocks at `block` of
/// `zone` were written (CRC-32 of each, so replay checks every block on its own) and are
/// now valid; the same blocks of `other` (the chunk's other zone) are now invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::engine) struct WriteRec {
    pub zone: ZoneId,
    pub block: u32,
    pub other: Option<ZoneId>,
    pub crcs: Vec<u32>,
}

impl WriteRec {
    /// Blocks `[block, block + count)` (a sub-range of the record's) become valid.
    fn apply_blocks(
        &self,
        m: &mut Meta,
        dev: &dyn ZonedDevice,
        block: u32,
        count: u32,
        seq: u64,
    ) -> Result<(), EngineError> {
        let c = m.cache.set_range(dev, self.zone, block, count, true)?;
        m.zones.add_weight(self.zone, c, seq);
        if let Some(o) = self.other {
            let c = m.cache.set_range(dev, o, block, count, false)?;
            m.zones.sub_weight(o, c, seq);
        }
        Ok(())
    }

    /// Replay: a record a durable log block proves flushed (`proven`) is trusted; otherwise
    /// each block must be below a sequential zone's write pointer and hold the data the
    /// record describes (each block on its own: a later logged write may have overwritten
    /// some of them in place). The runs of blocks that landed are applied. Returns whether
    /// every block landed.
    pub(super) fn replay(
        &self,
        m: &mut Meta,
        dev: &dyn ZonedDevice,
        seq: u64,
        proven: bool,
    ) -> Result<bool, EngineError> {
        let ok = self.landed(m, dev, proven);
        let mut i = 0;
        while i < ok.len() {
            if !ok[i] {
                i += 1;
                continue;
            }
            let s0 = i;
            while i < ok.len() && ok[i] {
                i += 1;
            }
            self.apply_blocks(m, dev, self.block + s0 as u32, (i - s0) as u32, seq)?;
        }
        Ok(ok.iter().all(|&x| x))
    }

    fn landed(&self, m: &Meta, dev: &dyn ZonedDevice, proven: bool) -> Vec<bool> {
        // A proven record's data was durable when written; the zone may have been freed,
        // reset and reused since (later records say so), so today's write pointer proves
        // nothing.
        if proven {
            return vec![true; self.crcs.len()];
        }
        let zi = m.zones.get(self.zone);
        let mut ok: Vec<bool> = (0..self.crcs.len() as u32)
            .map(|i| !zi.seq || self.block + i < zi.wp)
            .collect();
        let mut buf = vec![0u8; self.crcs.len() * super::super::ids::BLOCK];
        if dev
            .read_at(&mut buf, m.block_offset(self.zone, self.block))
            .is_err()
        {
            return vec![false; self.crcs.len()];
        }
        let blocks = buf.chunks(super::super::ids::BLOCK);
        for ((ok, c), data) in ok.iter_mut().zip(&self.crcs).zip(blocks) {
            *ok &= crc32fast::hash(data) == *c;
        }
        ok
    }
}

impl Record for WriteRec {
    const TYPE: u8 = 2;
    fn encode(&self, w: &mut Writer<'_>) {
        w.u32(self.zone.0);
        w.u32(self.block);
        w.zone(self.other);
        w.u32(self.crcs.len() as u32);
        for c in &self.crcs {
            w.u32(*c);
        }
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        let zone = r.zone()?;
        let block = r.u32()?;
        let other = r.opt_zone()?;
        let n = r.u32()? as usize;
        if n > IO_BATCH_BLOCKS as usize {
            return None;
        }
        let crcs = (0..n).map(|_| r.u32()).collect::<Option<Vec<u32>>>()?;
        Some(WriteRec {
            zone,
            block,
            other,
            crcs,
        })
    }
    fn in_range(&self, b: &Bounds) -> bool {
        b.zone(self.zone)
            && b.opt_zone(self.other)
            && self.other != Some(self.zone)
            && b.blocks(self.block, self.crcs.len() as u32)
    }
    fn apply(
        &self,
        m: &mut Meta,
        dev: &dyn ZonedDevice,
        seq: u64,
        _: Ctx,
    ) -> Result<(), EngineError> {
        self.apply_blocks(m, dev, self.block, self.crcs.len() as u32, seq)
    }
}

/// `invalidate{zone u32, block u32, count u32}`: blocks no longer valid (discard,
/// write-zeroes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::engine) struct InvalidateRec {
    pub zone: ZoneId,
    pub block: u32,
    pub count: u32,
}

impl Record for InvalidateRec {
    const TYPE: u8 = 3;
    fn encode(&self, w: &mut Writer<'_>) {
        w.u32(self.zone.0);
        w.u32(self.block);
        w.u32(self.count);
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        Some(InvalidateRec {
            zone: r.zone()?,
            block: r.u32()?,
            count: r.u32()?,
        })
    }
    fn in_range(&self, b: &Bounds) -> bool {
        b.zone(self.zone) && b.blocks(self.block, self.count)
    }
    fn apply(
        &self,
        m: &mut Meta,
        dev: &dyn ZonedDevice,
        seq: u64,
        _: Ctx,
    ) -> Result<(), EngineError> {
        let c = m
            .cache
            .set_range(dev, self.zone, self.block, self.count, false)?;
        m.zones.sub_weight(self.zone, c, seq);
        Ok(())
    }
}

/// `free{zone u32}`: the zone holds nothing and belongs to no chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::engine) struct FreeRec {
    pub zone: ZoneId,
}

impl Record for FreeRec {
    const TYPE: u8 = 4;
    fn encode(&self, w: &mut Writer<'_>) {
        w.u32(self.zone.0);
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        Some(FreeRec { zone: r.zone()? })
    }
    fn in_range(&self, b: &Bounds) -> bool {
        b.zone(self.zone)
    }
    fn apply(
        &self,
        m: &mut Meta,
        dev: &dyn ZonedDevice,
        seq: u64,
        ctx: Ctx,
    ) -> Result<(), EngineError> {
        m.free_zone(dev, self.zone, seq, ctx)
    }
}

/// `reclaim{chunk u32, dst u32, n u8, src u32 × n, dzone u32, bzone u32}`: the data of the
/// sources was copied into `dst` and flushed; `dst |= srcs` (bitmaps), the sources are
/// freed, and the chunk maps to `dzone`/`bzone`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::engine) struct ReclaimRec {
    pub chunk: ChunkId,
    pub dst: ZoneId,
    pub srcs: Vec<ZoneId>,
    pub map: Mapping,
}

impl Record for ReclaimRec {
    const TYPE: u8 = 5;
    fn encode(&self, w: &mut Writer<'_>) {
        w.u32(self.chunk.0);
        w.u32(self.dst.0);
        w.u8(self.srcs.len() as u8);
        for s in &self.srcs {
            w.u32(s.0);
        }
        w.zone(self.map.dzone);
        w.zone(self.map.bzone);
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        let chunk = r.chunk()?;
        let dst = r.zone()?;
        let n = r.u8()? as usize;
        if n > 2 {
            return None;
        }
        let srcs = (0..n).map(|_| r.zone()).collect::<Option<Vec<ZoneId>>>()?;
        let dzone = r.opt_zone()?;
        let bzone = r.opt_zone()?;
        Some(ReclaimRec {
            chunk,
            dst,
            srcs,
            map: Mapping { dzone, bzone },
        })
    }
    fn in_range(&self, b: &Bounds) -> bool {
        self.chunk.0 < b.nr_chunks
            && b.zone(self.dst)
            && self.srcs.iter().all(|&s| b.zone(s) && s != self.dst)
            && b.mapping(&self.map)
    }
    fn apply(
        &self,
        m: &mut Meta,
        dev: &dyn ZonedDevice,
        seq: u64,
        ctx: Ctx,
    ) -> Result<(), EngineError> {
        for &s in &self.srcs {
            let added = m.cache.merge_zone(dev, self.dst, s)?;
            m.zones.add_weight_merged(self.dst, added);
            m.zones.clear_weight(s);
            if ctx == Ctx::Live {
                m.zones.release(s, seq);
            }
        }
        m.set_mapping(self.chunk, self.map, ctx);
        Ok(())
    }
}

/// Every record type, for the log's encoder and decoder.
macro_rules! records {
    ($($variant:ident($ty:ident),)*) => {
        /// One logged change.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub(in crate::engine) enum Rec {
            $($variant($ty),)*
        }

        impl Rec {
            pub(super) fn encode(&self, out: &mut Vec<u8>) {
                let mut w = Writer(out);
                match self {
                    $(Rec::$variant(r) => {
                        w.u8(<$ty as Record>::TYPE);
                        r.encode(&mut w);
                    })*
                }
            }

            /// One record at the reader's position; `None` on garbage.
            pub(super) fn decode(r: &mut Reader<'_>) -> Option<Rec> {
                let t = r.u8()?;
                $(if t == <$ty as Record>::TYPE {
                    return <$ty as Record>::decode(r).map(Rec::$variant);
                })*
                None
            }

            pub(super) fn in_range(&self, b: &Bounds) -> bool {
                match self {
                    $(Rec::$variant(r) => r.in_range(b),)*
                }
            }

            pub(super) fn apply(
                &self,
                m: &mut Meta,
                dev: &dyn ZonedDevice,
                seq: u64,
                ctx: Ctx,
            ) -> Result<(), EngineError> {
                match self {
                    $(Rec::$variant(r) => r.apply(m, dev, seq, ctx),)*
                }
            }
        }

        $(impl From<$ty> for Rec {
            fn from(r: $ty) -> Rec {
                Rec::$variant(r)
            }
        })*
    };
}

records! {
    Map(MapRec),
    Write(WriteRec),
    Invalidate(InvalidateRec),
    Free(FreeRec),
    Reclaim(ReclaimRec),
}

/// Which zones a mapping change hands over: the zones of `old` that `new` no longer names
/// leave the chunk; those of `new` become its data and buffer zones.
pub(super) fn owner_changes(old: Mapping, new: Mapping) -> (Vec<ZoneId>, Vec<(ZoneId, Role)>) {
    let leaving = old
        .zones()
        .filter(|z| Some(*z) != new.dzone && Some(*z) != new.bzone)
        .collect();
    let taking = new
        .dzone
        .map(|z| (z, Role::Data))
        .into_iter()
        .chain(new.bzone.map(|z| (z, Role::Buffer)))
        .collect();
    (leaving, taking)
}

/// One record of each type, for tests.
#[cfg(test)]
pub(super) fn samples() -> Vec<Rec> {
    vec![
        MapRec {
            chunk: ChunkId(3),
            map: Mapping::data(ZoneId(9)),
        }
        .into(),
        WriteRec {
            zone: ZoneId(9),
            block: 1,
            other: None,
            crcs: vec![1, 2, 0xdead_beef],
        }
        .into(),
        InvalidateRec {
            zone: ZoneId(2),
            block: 7,
            count: 1,
        }
        .into(),
        FreeRec { zone: ZoneId(5) }.into(),
        ReclaimRec {
            chunk: ChunkId(1),
            dst: ZoneId(4),
            srcs: vec![ZoneId(5), ZoneId(6)],
            map: Mapping::data(ZoneId(4)),
        }
        .into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(rec: Rec) {
        let mut v = Vec::new();
        rec.encode(&mut v);
        let mut r = Reader::new(&v);
        assert_eq!(Rec::decode(&mut r), Some(rec));
        assert_eq!(r.pos, v.len());
    }

    #[test]
    fn every_record_round_trips() {
        for rec in samples() {
            round_trip(rec);
        }
    }

    #[test]
    fn the_bytes_are_the_documented_ones() {
        let mut v = Vec::new();
        Rec::from(MapRec {
            chunk: ChunkId(3),
            map: Mapping::data(ZoneId(9)),
        })
        .encode(&mut v);
        assert_eq!(v, [1, 3, 0, 0, 0, 9, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        let mut v = Vec::new();
        Rec::from(ReclaimRec {
            chunk: ChunkId(1),
            dst: ZoneId(4),
            srcs: vec![ZoneId(5)],
            map: Mapping::data(ZoneId(4)),
        })
        .encode(&mut v);
        assert_eq!(
            v,
            [5, 1, 0, 0, 0, 4, 0, 0, 0, 1, 5, 0, 0, 0, 4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]
        );
    }

    #[test]
    fn garbage_does_not_decode() {
        for bad in [
            &[9u8][..],
            &[2, 1, 0, 0, 0],
            &[5, 0, 0, 0, 0, 0, 0, 0, 0, 3],
        ] {
            assert_eq!(Rec::decode(&mut Reader::new(bad)), None);
        }
        // A write record claiming more blocks than one I/O covers.
        let mut v = vec![2];
        for x in [0u32, 0, u32::MAX, IO_BATCH_BLOCKS + 1] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        assert_eq!(Rec::decode(&mut Reader::new(&v)), None);
    }
}
