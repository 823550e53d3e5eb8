//! The log layout's metadata log records (version 2 of the log block header; docs/design.md,
//! "Log layout"): their bytes and the range check replay makes before applying one. What a
//! record does to the state is `Meta::apply` (meta.rs), shared by the live path and replay.

use crate::engine::ids::{Lba, ZoneId, IO_BATCH_BLOCKS};
use crate::engine::meta::log::{Reader, RecordSet, Writer};

use super::layout::Layout;

/// Which frontier a zone was opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// New user writes.
    User,
    /// Blocks relocated by GC.
    Gc,
}

impl Class {
    pub const ALL: [Class; 2] = [Class::User, Class::Gc];

    pub fn to_disk(self) -> u8 {
        match self {
            Class::User => 0,
            Class::Gc => 1,
        }
    }

    pub fn from_disk(v: u8) -> Option<Class> {
        match v {
            0 => Some(Class::User),
            1 => Some(Class::Gc),
            _ => None,
        }
    }

    pub fn idx(self) -> usize {
        self.to_disk() as usize
    }
}

/// One logged change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LogRec {
    /// `16: lba u32, n u16, zone u32, off u32, crc u32 × n`: logical `lba..lba+n` now at
    /// `zone:off..`, with the CRC-32 of each block (checked at replay unless proven).
    Append {
        lba: Lba,
        zone: ZoneId,
        off: u32,
        crcs: Vec<u32>,
    },
    /// `17: lba u32, n u32, zone u32, off u32`: GC relocated `lba..lba+n` to `zone:off..`;
    /// the copy was flushed before this was logged, so it is trusted without CRCs.
    Move {
        lba: Lba,
        n: u32,
        zone: ZoneId,
        off: u32,
    },
    /// `18: lba u32, n u32`: unmapped (discard).
    Trim { lba: Lba, n: u32 },
    /// `19: zone u32, class u8, gen u8`: a frontier took this (empty) zone.
    ZoneOpen { zone: ZoneId, class: Class },
    /// `20: zone u32`: GC emptied the zone; it is reset before reuse.
    ZoneFree { zone: ZoneId },
}

const APPEND: u8 = 16;
const MOVE: u8 = 17;
const TRIM: u8 = 18;
const ZONE_OPEN: u8 = 19;
const ZONE_FREE: u8 = 20;

impl RecordSet for LogRec {
    const VERSION: u32 = 2;

    fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        match self {
            LogRec::Append {
                lba,
                zone,
                off,
                crcs,
            } => {
                w.u8(APPEND);
                w.u32(lba.0);
                w.u16(crcs.len() as u16);
                w.u32(zone.0);
                w.u32(*off);
                for c in crcs {
                    w.u32(*c);
                }
            }
            LogRec::Move { lba, n, zone, off } => {
                w.u8(MOVE);
                for v in [lba.0, *n, zone.0, *off] {
                    w.u32(v);
                }
            }
            LogRec::Trim { lba, n } => {
                w.u8(TRIM);
                w.u32(lba.0);
                w.u32(*n);
            }
            LogRec::ZoneOpen { zone, class } => {
                w.u8(ZONE_OPEN);
                w.u32(zone.0);
                w.u8(class.to_disk());
                w.u8(0);
            }
            LogRec::ZoneFree { zone } => {
                w.u8(ZONE_FREE);
                w.u32(zone.0);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        Some(match r.u8()? {
            APPEND => {
                let lba = Lba(r.u32()?);
                let n = r.u16()? as u32;
                let zone = ZoneId(r.u32()?);
                let off = r.u32()?;
                if n == 0 || n > IO_BATCH_BLOCKS {
                    return None;
                }
                let crcs = (0..n).map(|_| r.u32()).collect::<Option<Vec<u32>>>()?;
                LogRec::Append {
                    lba,
                    zone,
                    off,
                    crcs,
                }
            }
            MOVE => LogRec::Move {
                lba: Lba(r.u32()?),
                n: r.u32()?,
                zone: ZoneId(r.u32()?),
                off: r.u32()?,
            },
            TRIM => LogRec::Trim {
                lba: Lba(r.u32()?),
                n: r.u32()?,
            },
            ZONE_OPEN => {
                let zone = ZoneId(r.u32()?);
                let class = Class::from_disk(r.u8()?)?;
                r.u8()?;
                LogRec::ZoneOpen { zone, class }
            }
            ZONE_FREE => LogRec::ZoneFree {
                zone: ZoneId(r.u32()?),
            },
            _ => return None,
        })
    }
}

impl LogRec {
    /// Bytes an `Append` of `n` blocks takes in a log block.
    pub fn append_len(n: u32) -> usize {
        LogRec::Append {
            lba: Lba(0),
            zone: ZoneId(0),
            off: 0,
            crcs: vec![0; n as usize],
        }
        .encoded_len()
    }

    /// Bytes it takes in a log block.
    pub fn encoded_len(&self) -> usize {
        let mut v = Vec::new();
        self.encode(&mut v);
        v.len()
    }

    /// Every logical block, zone and block range it names exists (replay skips a record
    /// that fails this rather than trusting it).
    pub fn in_range(&self, l: &Layout, is_data_zone: impl Fn(ZoneId) -> bool) -> bool {
        let lbas = |lba: Lba, n: u32| n > 0 && lba.0 as u64 + n as u64 <= l.user_blocks;
        let blocks = |zone: ZoneId, off: u32, n: u32| {
            zone.0 < l.nr_zones
                && is_data_zone(zone)
                && off as u64 + n as u64 <= l.data_blocks() as u64
        };
        match self {
            LogRec::Append {
                lba,
                zone,
                off,
                crcs,
            } => lbas(*lba, crcs.len() as u32) && blocks(*zone, *off, crcs.len() as u32),
            LogRec::Move { lba, n, zone, off } => lbas(*lba, *n) && blocks(*zone, *off, *n),
            LogRec::Trim { lba, n } => lbas(*lba, *n),
            LogRec::ZoneOpen { zone, .. } | LogRec::ZoneFree { zone } => {
                zone.0 < l.nr_zones && is_data_zone(*zone)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let recs = vec![
            LogRec::Append {
                lba: Lba(7),
                zone: ZoneId(3),
                off: 5,
                crcs: vec![1, 2, 3],
            },
            LogRec::Move {
                lba: Lba(9),
                n: 4,
                zone: ZoneId(4),
                off: 0,
            },
            LogRec::Trim { lba: Lba(1), n: 2 },
            LogRec::ZoneOpen {
                zone: ZoneId(5),
                class: Class::Gc,
            },
            LogRec::ZoneFree { zone: ZoneId(6) },
        ];
        for rec in recs {
            let mut v = Vec::new();
            rec.encode(&mut v);
            assert_eq!(v.len(), rec.encoded_len());
            let mut r = Reader::new(&v);
            assert_eq!(LogRec::decode(&mut r), Some(rec));
            assert_eq!(r.pos, v.len());
            for cut in 0..v.len() {
                assert_eq!(LogRec::decode(&mut Reader::new(&v[..cut])), None);
            }
        }
    }
}
