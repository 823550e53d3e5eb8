//! The metadata log: append-only 4 KiB blocks in the unused tails of the two metadata sets'
//! zones, so an acknowledged write is on the device (with the mapping that finds it) before
//! the next commit folds it into the v2 sets. See docs/design.md, "Commit and crash ordering".
//!
//! Epoch `e` (= the superblock generation its records apply on top of) logs into the tail of
//! set `e % 2`: blocks `nr_meta_blocks..nr_meta_zones * zone_blocks` of that set. Every block
//! carries a header; records never span blocks, and one logical operation's records always
//! sit in one block, so a block is applied whole or not at all.
//!
//! The header, sealing, group-commit buffer and replay scan are shared with the log layout
//! (`crate::lsl`): a [`RecordSet`] names the records a log carries and the header version
//! that says so (1: the v2 records of `record.rs`; 2: the log layout's).

use zerocopy::byteorder::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use std::marker::PhantomData;

use super::super::ids::BLOCK;
use super::record::Rec;
pub(crate) use super::record::{Reader, Writer};

pub(super) const LOG_MAGIC: u32 = 0x474C_5A44; // "DZLG"

/// The records one version of the log carries: a log block holds records of one set only,
/// and its header's `version` says which.
pub(crate) trait RecordSet: Sized {
    /// The header's `version` for blocks of these records.
    const VERSION: u32;
    /// Type byte and fields, appended to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// One record at the reader's position; `None` on garbage.
    fn decode(r: &mut Reader<'_>) -> Option<Self>;
}

impl RecordSet for Rec {
    const VERSION: u32 = 1;
    fn encode(&self, out: &mut Vec<u8>) {
        Rec::encode(self, out)
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        Rec::decode(r)
    }
}

/// The header at the start of every log block (docs/design.md, "Metadata log block").
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct RawHeader {
    magic: U32,
    version: U32,
    /// CRC-32 (crc32fast / zlib) of the whole block with this field zero.
    crc: U32,
    nr_records: U32,
    uuid: [u8; 16],
    epoch: U64,
    block: U64,
    first_seq: U64,
    epoch_start_seq: U64,
    flushed_seq: U64,
    payload_bytes: U32,
    reserved: U32,
}

pub(super) const HEADER: usize = std::mem::size_of::<RawHeader>();
const _: () = assert!(HEADER == 80);
const CRC_AT: usize = std::mem::offset_of!(RawHeader, crc);
/// Bytes available for records in one block.
pub(crate) const PAYLOAD: usize = BLOCK - HEADER;

/// The header fields of one log block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockHeader {
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

/// Build a block image: header (of `version`) + encoded records (`payload`, `nr` of them).
pub(super) fn encode_block(
    version: u32,
    h: &BlockHeader,
    payload: &[u8],
    nr: u32,
) -> Box<[u8; BLOCK]> {
    assert!(payload.len() <= PAYLOAD);
    let raw = RawHeader {
        magic: LOG_MAGIC.into(),
        version: version.into(),
        crc: 0.into(),
        nr_records: nr.into(),
        uuid: h.uuid,
        epoch: h.epoch.into(),
        block: h.block.into(),
        first_seq: h.first_seq.into(),
        epoch_start_seq: h.epoch_start_seq.into(),
        flushed_seq: h.flushed_seq.into(),
        payload_bytes: (payload.len() as u32).into(),
        reserved: 0.into(),
    };
    let mut b = Box::new([0u8; BLOCK]);
    b[..HEADER].copy_from_slice(raw.as_bytes());
    b[HEADER..HEADER + payload.len()].copy_from_slice(payload);
    let crc = crc32fast::hash(&b[..]);
    b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Recompute the CRC of a log block image in place (fuzzing: patched contents get past the
/// CRC to the record decoders). Does nothing to a slice that is not one block.
pub(crate) fn reseal_block(b: &mut [u8]) {
    if b.len() != BLOCK {
        return;
    }
    b[CRC_AT..CRC_AT + 4].fill(0);
    let crc = crc32fast::hash(b);
    b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Decode a block: header and records, or None when it is not a valid log block of `R`'s
/// version (bad magic, version or CRC, undecodable records).
pub(super) fn decode_block<R: RecordSet>(b: &[u8]) -> Option<(BlockHeader, Vec<R>)> {
    if b.len() != BLOCK {
        return None;
    }
    let (raw, _) = RawHeader::ref_from_prefix(b).ok()?;
    if raw.magic.get() != LOG_MAGIC || raw.version.get() != R::VERSION {
        return None;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&b[..CRC_AT]);
    h.update(&[0; 4]);
    h.update(&b[CRC_AT + 4..]);
    if h.finalize() != raw.crc.get() {
        return None;
    }
    let used = raw.payload_bytes.get() as usize;
    if used > PAYLOAD {
        return None;
    }
    let mut r = Reader::new(&b[HEADER..HEADER + used]);
    let nr = raw.nr_records.get();
    let mut recs = Vec::with_capacity(nr.min(PAYLOAD as u32) as usize);
    for _ in 0..nr {
        recs.push(R::decode(&mut r)?);
    }
    if r.pos != used {
        return None;
    }
    Some((
        BlockHeader {
            uuid: raw.uuid,
            epoch: raw.epoch.get(),
            block: raw.block.get(),
            first_seq: raw.first_seq.get(),
            epoch_start_seq: raw.epoch_start_seq.get(),
            flushed_seq: raw.flushed_seq.get(),
        },
        recs,
    ))
}

/// In-memory tail of the log: the block being filled and the full blocks not yet written;
/// `R` is the record set.
pub(crate) struct LogBuf<R: RecordSet> {
    pub(super) uuid: [u8; 16],
    pub(super) epoch: u64,
    /// Blocks per half.
    pub(super) cap: u64,
    /// Absolute 4 KiB block of block 0 of each half (the tail of set 0 and set 1).
    pub(super) base: [u64; 2],
    pub(super) cur_idx: u64,
    pub(super) cur_first_seq: u64,
    pub(super) cur_payload: Vec<u8>,
    pub(super) cur_nr: u32,
    /// Records of the current block in the last image of it handed out for writing.
    pub(super) cur_written: u32,
    /// Sealed blocks waiting to be written: (absolute block, image).
    pub(super) sealed: Vec<(u64, Box<[u8; BLOCK]>)>,
    pub(crate) next_seq: u64,
    pub(super) epoch_start_seq: u64,
    /// Records below this were covered by a completed device flush.
    pub(crate) flushed_seq: u64,
    /// A durable log block proves records below this were flushed (see design.md).
    pub(super) evidence_seq: u64,
    /// Records below this are folded into the committed sets.
    pub(super) folded_seq: u64,
    /// Records below this are written to the device (not necessarily durable).
    pub(crate) written_seq: u64,
    /// `flushed_seq` carried by the last log block written.
    pub(crate) written_header_flushed: u64,
    pub(super) blocks_written: u64,
    /// Force the next commit to start a new epoch (set at load: the replayed halves must
    /// not be appended to).
    pub(super) needs_switch: bool,
    records: PhantomData<fn(R) -> R>,
}

impl<R: RecordSet> LogBuf<R> {
    /// An empty log writing into the tail of epoch `epoch`'s set (`cap` blocks at `base[e %
    /// 2]`); the next commit is forced to a new epoch (the halves on the device hold replayed
    /// records that must not be appended to).
    pub fn new(uuid: [u8; 16], epoch: u64, cap: u64, base: [u64; 2]) -> LogBuf<R> {
        LogBuf {
            uuid,
            epoch,
            cap,
            base,
            cur_idx: 0,
            cur_first_seq: 0,
            cur_payload: Vec::new(),
            cur_nr: 0,
            cur_written: 0,
            sealed: Vec::new(),
            next_seq: 0,
            epoch_start_seq: 0,
            flushed_seq: 0,
            evidence_seq: 0,
            folded_seq: 0,
            written_seq: 0,
            written_header_flushed: 0,
            blocks_written: 0,
            needs_switch: true,
            records: PhantomData,
        }
    }

    /// The next record gets `next_seq`; everything before it is written, flushed and folded.
    pub fn start_at(&mut self, next_seq: u64) {
        self.next_seq = next_seq;
        self.cur_first_seq = next_seq;
        self.epoch_start_seq = next_seq;
        self.written_seq = next_seq;
        self.flushed_seq = next_seq;
        self.folded_seq = next_seq;
    }

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
            let img = encode_block(R::VERSION, &h, &self.cur_payload, self.cur_nr);
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
    pub fn append(&mut self, recs: &[R]) -> u64 {
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
                encode_block(R::VERSION, &h, &self.cur_payload, self.cur_nr),
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
pub(crate) struct ReplayBlock<R> {
    pub header: BlockHeader,
    pub recs: Vec<R>,
}

/// Scan one half: valid blocks of `epoch` from index 0 with contiguous sequence numbers;
/// stop at the first block that is not. `read(idx)` returns the block image.
pub(crate) fn scan_half<R: RecordSet>(
    uuid: &[u8; 16],
    epoch: u64,
    cap: u64,
    mut read: impl FnMut(u64) -> Option<Box<[u8; BLOCK]>>,
) -> Vec<ReplayBlock<R>> {
    let mut out: Vec<ReplayBlock<R>> = Vec::new();
    let mut next_first: Option<u64> = None;
    for idx in 0..cap {
        let Some(img) = read(idx) else { break };
        let Some((h, recs)) = decode_block::<R>(&img[..]) else {
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
    use super::super::super::ids::ZoneId;
    use super::super::record::FreeRec;
    use super::*;

    #[test]
    fn records_round_trip_and_crc_guards_block() {
        let recs = super::super::record::samples();
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
        let mut img = encode_block(1, &h, &payload, recs.len() as u32);
        let (h2, r2) = decode_block::<Rec>(&img[..]).unwrap();
        assert_eq!(h2, h);
        assert_eq!(r2, recs);
        // Another version's block is not ours, even intact.
        let other = encode_block(2, &h, &payload, recs.len() as u32);
        assert!(decode_block::<Rec>(&other[..]).is_none());
        img[HEADER + 2] ^= 1;
        assert!(decode_block::<Rec>(&img[..]).is_none());
    }

    #[test]
    fn scan_stops_at_gap_and_foreign_epoch() {
        let mut lb: LogBuf<Rec> = LogBuf::new([1; 16], 4, 8, [0, 100]);
        lb.start_at(50);
        for i in 0..3 {
            lb.append(&[FreeRec { zone: ZoneId(i) }.into()]);
            lb.seal(false);
        }
        let blocks = lb.take_pending();
        assert_eq!(blocks.len(), 3);
        let got = scan_half::<Rec>(&[1; 16], 4, 8, |i| {
            blocks.get(i as usize).map(|b| b.1.clone())
        });
        assert_eq!(got.len(), 3);
        let got = scan_half::<Rec>(&[1; 16], 4, 8, |i| {
            (i != 1).then(|| blocks[i as usize].1.clone())
        });
        assert_eq!(got.len(), 1);
        assert!(scan_half::<Rec>(&[1; 16], 6, 8, |i| blocks
            .get(i as usize)
            .map(|b| b.1.clone()))
        .is_empty());
    }
}
