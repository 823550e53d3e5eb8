//! Names for the things the engine passes around: zones, chunks, a chunk's mapping, and the
//! two sizes every I/O is counted in.

use std::fmt;

use crate::format::{MapEntry, MAP_UNMAPPED};

/// Bytes per block: every engine I/O is a multiple of it.
pub(crate) const BLOCK: usize = crate::format::BLOCK;

/// Most blocks one device I/O (and one `Write` record) covers: 1 MiB, 1 KiB of CRCs.
pub(crate) const IO_BATCH_BLOCKS: u32 = 256;

/// A zone of the backend, by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ZoneId(pub u32);

/// A chunk of the exposed device (one zone's worth of it), by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ChunkId(pub u32);

impl ZoneId {
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

impl ChunkId {
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ZoneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// On disk "no zone" is `0xFFFFFFFF` (dm-zoned's map, zonedd's log records); in memory it
/// is `None`. These two are the only places that translate.
pub(crate) fn zone_from_disk(v: u32) -> Option<ZoneId> {
    (v != MAP_UNMAPPED).then_some(ZoneId(v))
}

pub(crate) fn zone_to_disk(z: Option<ZoneId>) -> u32 {
    z.map_or(MAP_UNMAPPED, |z| z.0)
}

/// Where a chunk's blocks live: its data zone and, for a sequential data zone taking
/// overwrites, its conventional buffer zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Mapping {
    pub dzone: Option<ZoneId>,
    pub bzone: Option<ZoneId>,
}

impl Mapping {
    pub const UNMAPPED: Mapping = Mapping {
        dzone: None,
        bzone: None,
    };

    pub fn data(dzone: ZoneId) -> Mapping {
        Mapping {
            dzone: Some(dzone),
            bzone: None,
        }
    }

    pub fn buffered(dzone: ZoneId, bzone: ZoneId) -> Mapping {
        Mapping {
            dzone: Some(dzone),
            bzone: Some(bzone),
        }
    }

    /// The zones named, data zone first.
    pub fn zones(self) -> impl Iterator<Item = ZoneId> {
        self.dzone.into_iter().chain(self.bzone)
    }

    pub fn from_disk(e: MapEntry) -> Mapping {
        Mapping {
            dzone: zone_from_disk(e.dzone),
            bzone: zone_from_disk(e.bzone),
        }
    }

    pub fn to_disk(self) -> MapEntry {
        MapEntry {
            dzone: zone_to_disk(self.dzone),
            bzone: zone_to_disk(self.bzone),
        }
    }
}

/// A logical 4 KiB block of a log-layout volume (`crate::lsl`): its number from the start of
/// the exposed device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Lba(pub u32);

/// An index page of a log-layout volume: the mapping of logical blocks `p * 1020 ..`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PageId(pub u32);

impl PageId {
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}
