//! A log-layout volume (`dmz::lsl`, `zonedd format --layout log`) as the frontend's
//! [`BlockTarget`]: every request through the pool (no planned reads or writes yet), keyed by
//! 4 MiB ranges of the logical space.

use std::sync::Arc;

use frontend::BlockTarget;
use serde_json::{json, Value};

use super::create::Opened;

/// Requests are split, and ordered on the pool, per this much of the logical space.
const RANGE: u64 = 4 << 20;

struct LogTarget(dmz::lsl::LogEngine);

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
}

/// Open the log-layout volume on `dev` for `create`.
pub(super) fn open(backend: &str, dev: Arc<dyn zbd::ZonedDevice>) -> Result<Opened, String> {
    let geometry = super::create::geometry_json(dev.as_ref());
    let engine = dmz::lsl::LogEngine::open(dev, dmz::lsl::LogOptions::default())
        .map_err(|e| format!("{backend}: {e}"))?;
    let typed = Arc::new(LogTarget(engine));
    let weak = Arc::downgrade(&typed);
    let target: Arc<dyn BlockTarget> = typed.clone();
    Ok(Opened {
        target,
        layout: "log (zonedd)",
        stats: Box::new(move || -> Value {
            json!({
                "geometry": geometry,
                "engine": weak.upgrade().map(|t| t.0.stats()),
            })
        }),
        reclaim: Arc::new(|| {
            Err(
                "a log-layout volume collects garbage as it writes: there is no reclaim pass \
                 to start"
                    .to_string(),
            )
        }),
        close: Box::new(move || match Arc::try_unwrap(typed) {
            Ok(t) => {
                t.0.close()
                    .map_err(|e| format!("closing the log engine: {e}"))
            }
            Err(t) => {
                tracing::error!("log engine still referenced at shutdown: flushing instead");
                t.0.flush()
                    .map_err(|e| format!("flushing the log engine: {e}"))
            }
        }),
    })
}
