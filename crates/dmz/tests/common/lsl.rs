//! Fixtures for the log-layout (`dmz::lsl`) tests: formatted in-memory devices, open, and a
//! reference of what each block last received.

use std::sync::Arc;

use dmz::lsl::{format, CompactOn, FormatOptions, LogEngine, LogOptions};
use zbd::{MemDevice, ZonedDevice};

use super::{block_id, mem_device, pattern, BS};

/// Format options with a `log_blocks` ring (small rings make checkpoints frequent).
pub fn lsl_format_opts(log_blocks: u32) -> FormatOptions {
    FormatOptions {
        label: Some("lsl-test".into()),
        op: 0.07,
        log_blocks,
        uuid: None,
        user_frontiers: dmz::lsl::DEFAULT_USER_FRONTIERS,
    }
}

/// A [`mem_device`] formatted with the log layout.
pub fn formatted_lsl(
    zone_kib: u64,
    nr_zones: u32,
    nr_conv: u32,
    log_blocks: u32,
) -> Arc<MemDevice> {
    let dev = mem_device(zone_kib, nr_zones, nr_conv);
    format(&dev, &lsl_format_opts(log_blocks)).expect("log layout format");
    Arc::new(dev)
}

/// Engine options for tests: GC copies 16 blocks at a time, so that a victim of the
/// tests' small zones takes several batches and user writes land between them; the pages
/// writes change are marked for compaction (`CompactOn::Writes`), so that the model and
/// power-cut tests' compactions (`debug_compact`) find pages without reading them first
/// (the compaction itself is the same whichever event marked its page); GC reads through
/// gaps of up to 2 blocks (`gc_read_gap_blocks`, a disk's setting), so that its reads are
/// of both kinds: straight into the batch's buffer, and through a span; a stream's plans
/// may be in flight together at one frontier (`stream_pipelines`, the daemon's setting on
/// Linux 6.10 and later).
pub fn lsl_test_opts() -> LogOptions {
    LogOptions {
        gc_batch_blocks: 16,
        gc_read_gap_blocks: 2,
        compact: CompactOn::Writes,
        stream_pipelines: true,
        ..LogOptions::default()
    }
}

pub fn lopen(dev: Arc<dyn ZonedDevice>) -> LogEngine {
    LogEngine::open(dev, lsl_test_opts()).expect("log engine open")
}

/// Write `pattern(id, start)` to blocks `start..start + n`.
pub fn lwrite(e: &LogEngine, start: u64, n: u64, id: u64, fua: bool) {
    let mut buf = vec![0u8; n as usize * BS];
    pattern(id, start, &mut buf);
    e.write(start * BS as u64, &buf, fua)
        .unwrap_or_else(|err| panic!("write {start}+{n}: {err}"));
}

/// What each block of a log-layout volume last received (0: never written, or discarded).
pub struct LModel {
    pub ids: Vec<u64>,
}

impl LModel {
    pub fn new(e: &LogEngine) -> LModel {
        LModel {
            ids: vec![0; (e.capacity() / BS as u64) as usize],
        }
    }

    pub fn blocks(&self) -> u64 {
        self.ids.len() as u64
    }

    pub fn write(&mut self, e: &LogEngine, start: u64, n: u64, id: u64, fua: bool) {
        lwrite(e, start, n, id, fua);
        self.ids[start as usize..(start + n) as usize].fill(id);
    }

    pub fn discard(&mut self, e: &LogEngine, start: u64, n: u64) {
        e.discard(start * BS as u64, n * BS as u64)
            .unwrap_or_else(|err| panic!("discard {start}+{n}: {err}"));
        self.ids[start as usize..(start + n) as usize].fill(0);
    }

    /// Blocks `start..start + n` read back as last written.
    pub fn verify_range(&self, e: &LogEngine, start: u64, n: u64) {
        let mut buf = vec![0u8; n as usize * BS];
        e.read(start * BS as u64, &mut buf)
            .unwrap_or_else(|err| panic!("read {start}+{n}: {err}"));
        for (i, got) in buf.chunks(BS).enumerate() {
            let b = start + i as u64;
            let id = block_id(got, b).unwrap_or_else(|m| panic!("{m}"));
            assert_eq!(id, self.ids[b as usize], "block {b}");
        }
    }

    /// Every block reads back as last written.
    pub fn verify(&self, e: &LogEngine) {
        let mut b = 0;
        while b < self.blocks() {
            let n = 256.min(self.blocks() - b);
            self.verify_range(e, b, n);
            b += n;
        }
    }
}
