//! logsim: a host simulator for the design of zonedd's log-structured layout (issue 14).
//!
//! - [`store`]: a log-structured store over zones with GC (victim rules, hot/cold separation,
//!   log header placement): write amplification after warm-up;
//! - [`index`]: memory of candidate indexes for a large volume and the page-miss rate of a
//!   paged logical-to-physical map with a resident cache, at full scale;
//! - [`workload`]: the write generators (uniform, hot/cold, zipf, sequential streams).
//!
//! No dependency on the engine: these are counts, not timings, and deterministic per seed.

pub mod index;
pub mod store;
pub mod workload;
