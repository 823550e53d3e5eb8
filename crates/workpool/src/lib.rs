//! Worker pool for per-chunk works and reclaim jobs.
