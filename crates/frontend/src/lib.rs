//! The ublk frontend: exposes any [`BlockTarget`] as a conventional `/dev/ublkbN`.

/// What the frontend needs of the engine: a random-access block device in bytes.
///
/// Offsets and lengths are multiples of 4096 and within [`BlockTarget::capacity`]; the
/// frontend checks that before calling. Errors are errnos (positive) to hand back to the
/// kernel. Calls for one chunk ([`BlockTarget::chunk_size`]) are issued in arrival order by
/// one worker at a time; calls for different chunks run concurrently.
pub trait BlockTarget: Send + Sync {
    fn capacity(&self) -> u64;
    /// Requests never cross a multiple of this (the frontend splits them).
    fn chunk_size(&self) -> u64;
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32>;
    /// `fua`: durable (data and the mapping that finds it) before returning.
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), i32>;
    fn discard(&self, offset: u64, len: u64) -> Result<(), i32>;
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), i32>;
    /// Every write completed before this call is durable when it returns.
    fn flush(&self) -> Result<(), i32>;
}
