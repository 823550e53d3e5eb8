//! A log-layout volume (`dmz::lsl`, `zonedd format --layout log`) as the frontend's
//! [`BlockTarget`]: requests through the pool, keyed by 512 KiB ranges of the logical space,
//! except the reads and writes the engine plans. Planned reads
//! ([`dmz::lsl::LogEngine::plan_read`]) are read by the queue threads on their own rings
//! from any device with a read source (hop-free reads: every run of a request submitted at
//! once, which a disk's queue may reorder); planned writes
//! ([`dmz::lsl::LogEngine::plan_write`]) are written and logged there too, on devices that
//! take sequential writes through their read source (real zoned block devices).

use std::sync::Arc;

use frontend::BlockTarget;
use serde_json::{json, Value};

use super::create::Opened;

/// Requests are split, and ordered on the pool, per this much of the logical space: what
/// one ublk request carries at most (512 KiB). Each request of a stream is then a range of
/// its own, and a hop-free write of it does not wait for the one
/// before it (one hop-free write per range at a time), so a stream's writes can be planned
/// behind one another (the engine's stream pipelines). With 4 MiB ranges, no plan of a
/// 1 MiB QD8 stream on the hdd model was ever pipelined (docs/PERFORMANCE.md, "Stream
/// pipelines").
const RANGE: u64 = frontend::device::IO_BUF_BYTES as u64;

struct LogTarget(Arc<dmz::lsl::LogEngine>);

fn errno(e: dmz::engine::EngineError) -> i32 {
    let n = e.errno();
    tracing::warn!("log engine: {e}");
    if n > 0 {
        n
    } else {
        libc::EIO
    }
}

impl BlockTarget for LogTarget {
    fn capacity(&self) -> u64 {
        self.0.capacity()
    }
    fn chunk_size(&self) -> u64 {
        RANGE
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        self.0.read(offset, buf).map_err(errno)
    }
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), i32> {
        self.0.write(offset, buf, fua).map_err(errno)
    }
    fn discard(&self, offset: u64, len: u64) -> Result<(), i32> {
        self.0.discard(offset, len).map_err(errno)
    }
    /// Blocks read back as zeros afterwards: the log layout unmaps them (reads of unmapped
    /// blocks give zeros without I/O).
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), i32> {
        self.0.discard(offset, len).map_err(errno)
    }
    fn flush(&self) -> Result<(), i32> {
        self.0.flush().map_err(errno)
    }
    /// The writes of one pool batch share a log write (the frontend syncs them at the
    /// batch's end).
    fn write_unsynced(
        &self,
        offset: u64,
        buf: &[u8],
        fua: bool,
    ) -> Result<frontend::SyncToken, i32> {
        let seq = self.0.write_unsynced(offset, buf, fua).map_err(errno)?;
        Ok(frontend::SyncToken(seq))
    }
    fn sync(&self, token: frontend::SyncToken) -> Result<(), i32> {
        self.0.sync(token.0).map_err(errno)
    }
    fn read_fd(&self) -> Option<std::os::fd::RawFd> {
        // Registered as the queue rings' fixed file 1 when O_DIRECT (`ring_fd`): planned
        // reads, and planned writes and log writes where `source` allows them too.
        super::create::ring_fd(self.0.read_source())
    }
    fn plan_read(&self, offset: u64, len: u64) -> Option<frontend::ReadPlan> {
        let plan = self.0.plan_read(offset, len)?;
        Some(frontend::ReadPlan {
            segments: super::create::segments(plan.segments()),
            guard: Box::new(LogRead(plan)),
        })
    }
    fn plan_write(&self, offset: u64, data: &[u8]) -> Option<frontend::WritePlan> {
        let src = self.source()?;
        let plan = self.0.plan_write(offset, data)?;
        Some(frontend::WritePlan {
            device_offset: src.base + plan.device_offset(),
            sync_first: None,
            guard: Box::new(LogPlan(plan)),
        })
    }
    /// Hop-free writes are planned in write groups (one per queue thread's ring wait):
    /// each user frontier takes one write at a time, and a group lets it carry several.
    fn groups_writes(&self) -> bool {
        self.source().is_some()
    }
    fn plan_write_group(&self, writes: &[(u64, u64)]) -> Option<frontend::GroupPlan> {
        let src = self.source()?;
        let plan = self.0.plan_writes(writes)?;
        Some(frontend::GroupPlan {
            device_offset: src.base + plan.device_offset(),
            placed: plan.placed().collect(),
            guard: Box::new(LogPlan(plan)),
        })
    }
    /// A declined plan is completed on the pool, and a write through the engine over its
    /// blocks waits for it (`LogEngine::wait_planned`). Only where writes are planned at
    /// all: elsewhere (an emulated image) holding would be work for nothing.
    fn plans_hold_chunks(&self) -> bool {
        self.source().is_some()
    }
    fn plan_sync(&self, token: frontend::SyncToken) -> Result<frontend::SyncPlan, i32> {
        let Some(src) = self.source() else {
            return Ok(frontend::SyncPlan::Busy);
        };
        Ok(match self.0.plan_sync(token.0).map_err(errno)? {
            dmz::lsl::LogSyncPlan::Done => frontend::SyncPlan::Done,
            dmz::lsl::LogSyncPlan::Busy => frontend::SyncPlan::Busy,
            dmz::lsl::LogSyncPlan::Write(log) => frontend::SyncPlan::Write(Box::new(LogBlocks {
                log,
                base: src.base,
            })),
        })
    }
}

impl LogTarget {
    /// The device's read source when the queue rings may write both the log (conventional
    /// zones) and the frontiers (sequential zones) through it.
    fn source(&self) -> Option<zbd::ReadSource> {
        self.0
            .read_source()
            .filter(|s| s.conv_writes && s.seq_writes)
    }
}

/// The engine's read plan as the frontend's guard: it holds off zone resets.
struct LogRead(dmz::lsl::LogReadPlan);

impl frontend::PlanGuard for LogRead {
    fn complete(self: Box<Self>) {
        self.0.complete()
    }
}

/// The engine's write plan as the frontend's guard: it holds a frontier's turn.
struct LogPlan(dmz::lsl::LogWritePlan);

impl frontend::WriteGuard for LogPlan {
    fn complete(self: Box<Self>, data: &[u8]) -> Result<frontend::SyncToken, i32> {
        self.0
            .complete(data)
            .map(frontend::SyncToken)
            .map_err(errno)
    }
    /// Declined while a GC step or a checkpoint holds the engine's `wlock`: the frontend
    /// completes it on the pool.
    fn try_complete(
        self: Box<Self>,
        data: &[u8],
    ) -> Result<Result<frontend::SyncToken, i32>, Box<dyn frontend::WriteGuard + Send>> {
        match self.0.try_complete(data) {
            Ok(r) => Ok(r.map(frontend::SyncToken).map_err(errno)),
            Err(plan) => Err(Box::new(LogPlan(plan))),
        }
    }
    /// `try_complete` declines when its record would make a checkpoint.
    fn needs_log_writer(&self) -> bool {
        false
    }
}

/// A write group's plan: the same guard.
impl frontend::GroupGuard for LogPlan {
    fn complete(self: Box<Self>, parts: &[&[u8]]) -> Result<frontend::SyncToken, i32> {
        self.0
            .complete_parts(parts)
            .map(frontend::SyncToken)
            .map_err(errno)
    }
    /// Declined as a single write's is; never needs the log writer.
    fn try_complete(
        self: Box<Self>,
        parts: &[&[u8]],
    ) -> Result<Result<frontend::SyncToken, i32>, Box<dyn frontend::GroupGuard + Send>> {
        match self.0.try_complete_parts(parts) {
            Ok(r) => Ok(r.map(frontend::SyncToken).map_err(errno)),
            Err(plan) => Err(Box::new(LogPlan(plan))),
        }
    }
}

/// The engine's log write as the frontend's: it holds the engine's log writer.
struct LogBlocks {
    log: dmz::lsl::LogWrite,
    /// The read source's offset of device byte 0.
    base: u64,
}

impl frontend::LogWriteGuard for LogBlocks {
    fn blocks(&self) -> Vec<(u64, &[u8])> {
        self.log
            .blocks()
            .map(|(off, b)| (self.base + off, b))
            .collect()
    }
    fn complete(self: Box<Self>, result: Result<(), i32>) -> Result<(), i32> {
        let result = result.map_err(std::io::Error::from_raw_os_error);
        self.log.complete(result).map_err(errno)
    }
}

/// What `status` calls this layout.
pub(super) const LAYOUT: &str = "log (zonedd)";

/// Open the log-layout volume on `dev` for `create`.
pub(super) fn open(
    backend: &str,
    dev: Arc<dyn zbd::ZonedDevice>,
    opts: dmz::lsl::LogOptions,
) -> Result<Opened, String> {
    let geometry = super::create::geometry_json(dev.as_ref());
    let engine = dmz::lsl::LogEngine::open(dev, opts).map_err(|e| format!("{backend}: {e}"))?;
    let engine = Arc::new(engine);
    // GC to its watermark and idle compaction, off the request path.
    engine
        .start_background()
        .map_err(|e| format!("{backend}: {e}"))?;
    let typed = Arc::new(LogTarget(engine));
    let weak = Arc::downgrade(&typed);
    let target: Arc<dyn BlockTarget> = typed.clone();
    Ok(Opened {
        target,
        layout: LAYOUT,
        stats: Box::new(move || -> Value {
            json!({
                "geometry": geometry,
                "engine": weak.upgrade().map(|t| t.0.stats()),
            })
        }),
        reclaim: Arc::new(|| {
            Err(
                "a log-layout volume collects garbage by itself (as it writes, and in the \
                 background down to its watermark): there is no reclaim pass to start"
                    .to_string(),
            )
        }),
        close: Box::new(move || {
            // The thread holds the engine while it works: stopped first, the engine is
            // ours alone again.
            typed.0.stop_background();
            match Arc::try_unwrap(typed).map(|t| Arc::try_unwrap(t.0)) {
                Ok(Ok(e)) => e
                    .close()
                    .map_err(|e| format!("closing the log engine: {e}")),
                Ok(Err(e)) => {
                    tracing::error!("log engine still referenced at shutdown: flushing instead");
                    e.flush()
                        .map_err(|e| format!("flushing the log engine: {e}"))
                }
                Err(t) => {
                    tracing::error!("log engine still referenced at shutdown: flushing instead");
                    t.0.flush()
                        .map_err(|e| format!("flushing the log engine: {e}"))
                }
            }
        }),
    })
}
