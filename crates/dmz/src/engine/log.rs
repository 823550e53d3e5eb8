//! The metadata log: append-only 4 KiB blocks in the unused tails of the two metadata sets'
//! zones, so an acknowledged write is on the device (with the mapping that finds it) before
//! the next commit folds it into the v2 sets. See docs/design.md, "Commit and crash ordering".
//!
//! Epoch `e` (= the superblock generation its records apply on top of) logs into the tail of
//! set `e % 2`: blocks `nr_meta_blocks..nr_meta_zones * zone_blocks` of that set. Every block
//! carries a header; records never span blocks, and one logical operation's records always
//! sit in one block, so a block is applied whole or not at all.

use crate::format::BLOCK;

pub(super) const LOG_MAGIC: u32 = 0x474C_5A44; // "DZLG"
pub(super) const NONE: u32 = u32::MAX;
/// Blocks one Write record (and one device write) covers at most: 1 MiB, 1 KiB of CRCs.
pub(super) const MAX_WRITE_BLOCKS: u32 = 256;

// Header layout (little-endian).
const H_MAGIC: usize = 0;
const H_VERSION: usize = 4;
const H_CRC: usize = 8;
const H_NR: usize = 12;
const H_UUID: usize = 16;
const H_EPOCH: usize = 32;
const H_BLOCK: usize = 40;
const H_FIRST_SEQ: usize = 48;
const H_EPOCH_START: usize = 56;
const H_FLUSHED: usize = 64;
const H_USED: usize = 72;
pub(super) const HEADER: usize = 80;
/// Bytes available for records in one block.
pub(super) const PAYLOAD: usize = BLOCK - HEADER;

/// One logged change. Zone and block numbers are zone ids and in-zone 4 KiB blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Rec {
    /// The chunk now maps to `dzone` (+ `bzone`); `NONE` for unmapped.
    Map { chunk: u32, dzone: u32, bzone: u32 },
    /// `crcs.len()` blocks at `block` of `zone` were written (CRC-32 of each block in
    /// `crcs`, so replay can check every block on its own) and are now valid; the same
    /// blocks of `other` (the chunk's other zone, or `NONE`) are now invalid.
    Write {
        zone: u32,
        block: u32,
        other: u32,
        crcs: Vec<u32>,
    },
    /// Blocks no longer valid (discard, write-zeroes).
    Invalidate { zone: u32, block: u32, count: u32 },
    /// The zone holds nothing and belongs to no chunk.
    Free { zone: u32 },
    /// Reclaim: the data of `srcs` was copied into `dst` and flushed; `dst |= srcs`
    /// (bitmaps), the sources are freed, and the chunk maps to `dzone`/`bzone`.
    Reclaim {
        chunk: u32,
        dst: u32,
        srcs: Vec<u32>,
        dzone: u32,
        bzone: u32,
    },
}

const T_MAP: u8 = 1;
const T_WRITE: u8 = 2;
const T_INVAL: u8 = 3;
const T_FREE: u8 = 4;
const T_RECLAIM: u8 = 5;

impl Rec {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        let put = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_le_bytes());
        match self {
            Rec::Map {
                chunk,
                dzone,
                bzone,
            } => {
                out.push(T_MAP);
                put(out, *chunk);
                put(out, *dzone);
                put(out, *bzone);
            }
            Rec::Write {
                zone,
                block,
                other,
                crcs,
            } => {
                out.push(T_WRITE);
                for v in [*zone, *block, *other, crcs.len() as u32] {
                    put(out, v);
                }
                for c in crcs {
                    put(out, *c);
                }
            }
            Rec::Invalidate { zone, block, count } => {
                out.push(T_INVAL);
                for v in [*zone, *block, *count] {
                    put(out, v);
                }
            }
            Rec::Free { zone } => {
                out.push(T_FREE);
                put(out, *zone);
            }
            Rec::Reclaim {
                chunk,
                dst,
                srcs,
                dzone,
                bzone,
            } => {
                out.push(T_RECLAIM);
                put(out, *chunk);
                put(out, *dst);
                out.push(srcs.len() as u8);
                for s in srcs {
                    put(out, *s);
                }
                put(out, *dzone);
                put(out, *bzone);
            }
        }
    }

    /// Decode one record at `*pos`, advancing it; None on garbage.
    fn decode(b: &[u8], pos: &mut usize) -> Option<Rec> {
        let get = |pos: &mut usize| -> Option<u32> {
            let v = b.get(*pos..*pos + 4)?;
            *pos += 4;
            Some(u32::from_le_bytes(v.try_into().ok()?))
        };
        let t = *b.get(*pos)?;
        *pos += 1;
        Some(match t {
            T_MAP => Rec::Map {
                chunk: get(pos)?,
                dzone: get(pos)?,
                bzone: get(pos)?,
            },
            T_WRITE => {
                let zone = get(pos)?;
                let block = get(pos)?;
                let other = get(pos)?;
                let n = get(pos)? as usize;
                if n > MAX_WRITE_BLOCKS as usize {
                    return None;
                }
                let mut crcs = Vec::with_capacity(n);
                for _ in 0..n {
                    crcs.push(get(pos)?);
                }
                Rec::Write {
                    zone,
                    block,
                    other,
                    crcs,
                }
            }
            T_INVAL => Rec::Invalidate {
                zone: get(pos)?,
                block: get(pos)?,
                count: get(pos)?,
            },
            T_FREE => Rec::Free { zone: get(pos)? },
            T_RECLAIM => {
                let chunk = get(pos)?;
                let dst = get(pos)?;
                let n = *b.get(*pos)? as usize;
                *pos += 1;
                if n > 2 {
                    return None;
                }
                let mut srcs = Vec::with_capacity(n);
                for _ in 0..n {
                    srcs.push(get(pos)?);
                }
                Rec::Reclaim {
                    chunk,
                    dst,
                    srcs,
                    dzone: get(pos)?,
                    bzone: get(pos)?,
                }
            }
            _ => return None,
        })
    }
}

/// The header fields of one log block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BlockHeader {
    pub uuid: [u8; 16],
    pub epoch: u64,
    /// Index of the block in its half.
    pub block: u64,
    /// Sequence number of the first record (global, monotonic in a run).
    pub first_seq: u64,
    /// Sequence number of the first record of the epoch.
    pub epoch_start_seq: u64,
    /// Every record with a smaller sequence number was covered by a completed device flush
    /// when this block was written.
    pub flushed_seq: u64,
}

/// Build a block image: header + encoded records (`payload`, `nr` of them).
pub(super) fn encode_block(h: &BlockHeader, payload: &[u8], nr: u32) -> Box<[u8; BLOCK]> {
    assert!(payload.len() <= PAYLOAD);
    let mut b = Box::new([0u8; BLOCK]);
    b[H_MAGIC..H_MAGIC + 4].copy_from_slice(&LOG_MAGIC.to_le_bytes());
    b[H_VERSION..H_VERSION + 4].copy_from_slice(&1u32.to_le_bytes());
    b[H_NR..H_NR + 4].copy_from_slice(&nr.to_le_bytes());
    b[H_UUID..H_UUID + 16].copy_from_slice(&h.uuid);
    b[H_EPOCH..H_EPOCH + 8].copy_from_slice(&h.epoch.to_le_bytes());
    b[H_BLOCK..H_BLOCK + 8].copy_from_slice(&h.block.to_le_bytes());
    b[H_FIRST_SEQ..H_FIRST_SEQ + 8].copy_from_slice(&h.first_seq.to_le_bytes());
    b[H_EPOCH_START..H_EPOCH_START + 8].copy_from_slice(&h.epoch_start_seq.to_le_bytes());
    b[H_FLUSHED..H_FLUSHED + 8].copy_from_slice(&h.flushed_seq.to_le_bytes());
    b[H_USED..H_USED + 4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    b[HEADER..HEADER + payload.len()].copy_from_slice(payload);
    let crc = crc32fast::hash(&b[..]);
    b[H_CRC..H_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

/// Decode a block: header and records, or None when it is not a valid log block (bad magic
/// or CRC, undecodable records).
pub(super) fn decode_block(b: &[u8]) -> Option<(BlockHeader, Vec<Rec>)> {
    if b.len() != BLOCK || u32_at(b, H_MAGIC) != LOG_MAGIC || u32_at(b, H_VERSION) != 1 {
        return None;
    }
    let stored = u32_at(b, H_CRC);
    let mut h = crc32fast::Hasher::new();
    h.update(&b[..H_CRC]);
    h.update(&[0; 4]);
    h.update(&b[H_CRC + 4..]);
    if h.finalize() != stored {
        return None;
    }
    let nr = u32_at(b, H_NR);
    let used = u32_at(b, H_USED) as usize;
    if used > PAYLOAD {
        return None;
    }
    let payload = &b[HEADER..HEADER + used];
    let mut pos = 0;
    let mut recs = Vec::with_capacity(nr as usize);
    for _ in 0..nr {
        recs.push(Rec::decode(payload, &mut pos)?);
    }
    if pos != used {
        return None;
    }
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&b[H_UUID..H_UUID + 16]);
    Some((
        BlockHeader {
            uuid,
            epoch: u64_at(b, H_EPOCH),
            block: u64_at(b, H_BLOCK),
            first_seq: u64_at(b, H_FIRST_SEQ),
            epoch_start_seq: u64_at(b, H_EPOCH_START),
            flushed_seq: u64_at(b, H_FLUSHED),
        },
        recs,
    ))
}

/// In-memory tail of the log: the block being filled and the full blocks not yet written.
pub(super) struct LogBuf {
    pub uuid: [u8; 16],
    pub epoch: u64,
    /// Blocks per half.
    pub cap: u64,
    /// Absolute 4 KiB block of block 0 of each half (the tail of set 0 and set 1).
    pub base: [u64; 2],
    pub cur_idx: u64,
    pub cur_first_seq: u64,
    pub cur_payload: Vec<u8>,
    pub cur_nr: u32,
    /// Records of the current block in the last image of it handed out for writing.
    pub cur_written: u32,
    /// Sealed blocks waiting to be written: (absolute block, image).
    pub sealed: Vec<(u64, Box<[u8; BLOCK]>)>,
    pub next_seq: u64,
    pub epoch_start_seq: u64,
    /// Records below this were covered by a completed device flush.
    pub flushed_seq: u64,
    /// A durable log block proves records below this were flushed (see design.md).
    pub evidence_seq: u64,
    /// Records below this are folded into the committed sets.
    pub folded_seq: u64,
    /// Records below this are written to the device (not necessarily durable).
    pub written_seq: u64,
    /// `flushed_seq` carried by the last log block written.
    pub written_header_flushed: u64,
    pub blocks_written: u64,
    /// Force the next commit to start a new epoch (set at load: the replayed halves must
    /// not be appended to).
    pub needs_switch: bool,
}

impl LogBuf {
    pub fn half(&self) -> usize {
        (self.epoch % 2) as usize
    }

    fn header(&self, idx: u64, first_seq: u64) -> BlockHeader {
        BlockHeader {
            uuid: self.uuid,
            epoch: self.epoch,
            block: idx,
            first_seq,
            epoch_start_seq: self.epoch_start_seq,
            flushed_seq: self.flushed_seq,
        }
    }

    /// Whether a group of `len` encoded bytes can be appended without a commit.
    pub fn has_room(&self, len: usize) -> bool {
        if self.cur_payload.len() + len <= PAYLOAD {
            self.cur_idx < self.cap
        } else {
            self.cur_idx + 1 < self.cap
        }
    }

    /// Fraction of the half in use, in percent.
    pub fn used_pct(&self) -> u64 {
        (self.cur_idx * 100).checked_div(self.cap).unwrap_or(100)
    }

    /// Close the current block (if it has records, or `force`): it is final from now on.
    pub fn seal(&mut self, force: bool) {
        if (self.cur_nr == 0 && !force) || self.cur_idx >= self.cap {
            return;
        }
        // An image with every record of the block was already written (or is being written
        // by the holder of `log_write`): it is final as it is. Writing it again only to
        // refresh `flushed_seq` in its header cost every write+fsync a second log write;
        // blocks that must carry a newer `flushed_seq` are forced.
        if force || self.cur_written != self.cur_nr {
            let h = self.header(self.cur_idx, self.cur_first_seq);
            let img = encode_block(&h, &self.cur_payload, self.cur_nr);
            self.sealed
                .push((self.base[self.half()] + self.cur_idx, img));
        }
        self.cur_idx += 1;
        self.cur_payload.clear();
        self.cur_nr = 0;
        self.cur_written = 0;
        self.cur_first_seq = self.next_seq;
    }

    /// Append one operation's records (they stay in one block). Returns the sequence number
    /// of the last record. The caller checked [`LogBuf::has_room`].
    pub fn append(&mut self, recs: &[Rec]) -> u64 {
        let mut bytes = Vec::with_capacity(32 * recs.len());
        for r in recs {
            r.encode(&mut bytes);
        }
        debug_assert!(bytes.len() <= PAYLOAD);
        if self.cur_payload.len() + bytes.len() > PAYLOAD {
            self.seal(false);
        }
        if self.cur_nr == 0 {
            self.cur_first_seq = self.next_seq;
        }
        self.cur_payload.extend_from_slice(&bytes);
        self.cur_nr += recs.len() as u32;
        self.next_seq += recs.len() as u64;
        self.next_seq - 1
    }

    /// Everything to write now: the sealed blocks (taken) and an image of the current block.
    pub fn take_pending(&mut self) -> Vec<(u64, Box<[u8; BLOCK]>)> {
        let mut out = std::mem::take(&mut self.sealed);
        if self.cur_nr > 0 && self.cur_idx < self.cap {
            let h = self.header(self.cur_idx, self.cur_first_seq);
            self.cur_written = self.cur_nr;
            out.push((
                self.base[self.half()] + self.cur_idx,
                encode_block(&h, &self.cur_payload, self.cur_nr),
            ));
        }
        out
    }

    /// Start epoch `epoch` in its half. The caller wrote out everything pending.
    pub fn switch_epoch(&mut self, epoch: u64) {
        debug_assert!(self.sealed.is_empty() && self.cur_nr == 0);
        self.epoch = epoch;
        self.cur_idx = 0;
        self.cur_payload.clear();
        self.cur_nr = 0;
        self.cur_written = 0;
        self.cur_first_seq = self.next_seq;
        self.epoch_start_seq = self.next_seq;
    }
}

/// A decoded block with its records' sequence numbers, for replay.
pub(super) struct ReplayBlock {
    pub header: BlockHeader,
    pub recs: Vec<Rec>,
}

/// Scan one half: valid blocks of `epoch` from index 0 with contiguous sequence numbers;
/// stop at the first block that is not. `read(idx)` returns the block image.
pub(super) fn scan_half(
    uuid: &[u8; 16],
    epoch: u64,
    cap: u64,
    mut read: impl FnMut(u64) -> Option<Box<[u8; BLOCK]>>,
) -> Vec<ReplayBlock> {
    let mut out: Vec<ReplayBlock> = Vec::new();
    let mut next_first: Option<u64> = None;
    for idx in 0..cap {
        let Some(img) = read(idx) else { break };
        let Some((h, recs)) = decode_block(&img[..]) else {
            break;
        };
        if &h.uuid != uuid || h.epoch != epoch || h.block != idx {
            break;
        }
        if let Some(n) = next_first {
            if h.first_seq != n || h.epoch_start_seq != out[0].header.epoch_start_seq {
                break;
            }
        } else if h.first_seq != h.epoch_start_seq {
            break;
        }
        next_first = Some(h.first_seq + recs.len() as u64);
        out.push(ReplayBlock { header: h, recs });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_crc_guards_block() {
        let recs = vec![
            Rec::Map {
                chunk: 3,
                dzone: 9,
                bzone: NONE,
            },
            Rec::Write {
                zone: 9,
                block: 1,
                other: NONE,
                crcs: vec![1, 2, 0xdead_beef],
            },
            Rec::Invalidate {
                zone: 2,
                block: 7,
                count: 1,
            },
            Rec::Free { zone: 5 },
            Rec::Reclaim {
                chunk: 1,
                dst: 4,
                srcs: vec![6, 7],
                dzone: 4,
                bzone: NONE,
            },
        ];
        let mut payload = Vec::new();
        for r in &recs {
            r.encode(&mut payload);
        }
        let h = BlockHeader {
            uuid: [7; 16],
            epoch: 5,
            block: 0,
            first_seq: 10,
            epoch_start_seq: 10,
            flushed_seq: 3,
        };
        let mut img = encode_block(&h, &payload, recs.len() as u32);
        let (h2, r2) = decode_block(&img[..]).unwrap();
        assert_eq!(h2, h);
        assert_eq!(r2, recs);
        img[HEADER + 2] ^= 1;
        assert!(decode_block(&img[..]).is_none());
    }

    #[test]
    fn scan_stops_at_gap_and_foreign_epoch() {
        let mut lb = LogBuf {
            uuid: [1; 16],
            epoch: 4,
            cap: 8,
            base: [0, 100],
            cur_idx: 0,
            cur_first_seq: 0,
            cur_payload: Vec::new(),
            cur_nr: 0,
            cur_written: 0,
            sealed: Vec::new(),
            next_seq: 50,
            epoch_start_seq: 50,
            flushed_seq: 0,
            evidence_seq: 0,
            folded_seq: 0,
            written_seq: 0,
            written_header_flushed: 0,
            blocks_written: 0,
            needs_switch: false,
        };
        for i in 0..3 {
            lb.append(&[Rec::Free { zone: i }]);
            lb.seal(false);
        }
        let blocks = lb.take_pending();
        assert_eq!(blocks.len(), 3);
        let got = scan_half(&[1; 16], 4, 8, |i| {
            blocks.get(i as usize).map(|b| b.1.clone())
        });
        assert_eq!(got.len(), 3);
        let got = scan_half(&[1; 16], 4, 8, |i| {
            (i != 1).then(|| blocks[i as usize].1.clone())
        });
        assert_eq!(got.len(), 1);
        assert!(scan_half(&[1; 16], 6, 8, |i| blocks
            .get(i as usize)
            .map(|b| b.1.clone()))
        .is_empty());
    }
}
