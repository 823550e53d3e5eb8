//! The chunk-mapping engine: makes a zoned backend behave like an ordinary disk, keeping
//! dm-zoned's metadata v2 on-disk format.
//!
//! - [`format`]: the on-disk structures (superblock, CRC, sizing, map and bitmap blocks);
//! - [`sets`]: formatting a device, loading and choosing between the two metadata sets;
//! - [`check`]: `zonedd check` / `--repair`;
//! - [`engine`]: the running engine (metadata cache, crash log, I/O path, flush, reclaim);
//! - [`lsl`]: the log-structured layout (issue 14), a second on-disk format and its engine.

pub mod check;
pub mod engine;
pub mod format;
pub mod lsl;
pub mod sets;
