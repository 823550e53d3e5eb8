//! Counters a pool exports (for `zonedd status` and the bench).

/// A snapshot of a pool's counters. Cumulative counters start at zero when the pool is made.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Pool name given to `Pool::new`.
    pub name: String,
    /// Policy as `percpu:N` or `unbound:N`.
    pub policy: String,
    /// Worker groups: one per CPU for `percpu`, one for `unbound`.
    pub groups: usize,
    /// Worker threads alive now (spawned lazily, up to the limit of each group).
    pub workers: usize,
    /// Worker threads ever spawned.
    pub workers_spawned: u64,
    /// Jobs handed to `queue`.
    pub jobs_queued: u64,
    /// Jobs executed (including ones that panicked).
    pub jobs_run: u64,
    /// Jobs that panicked (caught; the worker carried on).
    pub jobs_panicked: u64,
    /// Jobs deferred to the end of their batch ([`crate::defer`]); counted in `jobs_run`
    /// only when queued.
    pub jobs_deferred: u64,
    /// Times a work went idle -> queued (a queue that joined a pending work does not count).
    pub works_queued: u64,
    /// Times a running work got new jobs and went back on its run queue.
    pub works_requeued: u64,
    /// Batches executed: one per time a worker took a work off a run queue.
    pub works_run: u64,
    /// Works queued or running now.
    pub works_pending: usize,
    /// Parked workers woken to take a work.
    pub wakeups_issued: u64,
    /// Woken workers that found the run queue already emptied by another worker.
    pub wakeups_empty: u64,
    /// Most works executing at once since the pool was made.
    pub peak_active: usize,
    /// Works executing now.
    pub active_now: usize,
}
