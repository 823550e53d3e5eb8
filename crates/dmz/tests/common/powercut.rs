//! The power-cut tests' shared model: a workload's operations, running them until the device
//! dies, and what every block may read back after the cut.

use dmz::engine::{Engine, EngineError, SyncPlan, Unsynced};

use super::{block_id, pattern, BS};

#[derive(Debug, Clone, Copy)]
pub enum Op {
    Write {
        start: u64,
        len: u64,
        fua: bool,
    },
    Discard {
        start: u64,
        len: u64,
    },
    Flush,
    /// Fold the log into the sets (`Engine::debug_commit`): what the commit thread does.
    Commit,
}

/// Run ops until one fails; returns how many completed.
pub fn run(e: &Engine, ops: &[Op]) -> usize {
    run_with(e, ops, false).0
}

/// How many plain writes a planned group holds at most.
const GROUP_WRITES: usize = 4;

thread_local! {
    /// Planned writes that were in flight with another plan of their group, on this
    /// thread (a test's: tests run side by side).
    static GROUPED_PLANS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// [`GROUPED_PLANS`] of the calling thread so far.
pub fn grouped_plans() -> u64 {
    GROUPED_PLANS.with(|g| g.get())
}

/// [`run`]; with `planned`, writes go the hop-free way where the engine plans them, as the
/// frontend's queue threads make them: consecutive non-FUA writes are planned together
/// (up to [`GROUP_WRITES`], the flushes among them included), all their data goes to the
/// device, then in op order each write is completed and synced and each flush run, so
/// that plans of one chunk are in flight together and flushes run while plans are (driven
/// step by step as a ring drives them, [`flush_planned`]). Returns
/// (ops completed, end of the ops in flight when one failed): a group's later writes may
/// have their data on the device without their record.
pub fn run_with(e: &Engine, ops: &[Op], planned: bool) -> (usize, usize) {
    let mut i = 0;
    while i < ops.len() {
        if planned {
            match run_group(e, ops, i) {
                Ok(0) => {}
                Ok(n) => {
                    i += n;
                    continue;
                }
                Err(failed) => return failed,
            }
        }
        if run_op(e, ops, i).is_err() {
            return (i, i + 1);
        }
        i += 1;
    }
    (ops.len(), ops.len())
}

fn write_data(i: usize, start: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize * BS];
    pattern(i as u64 + 1, start, &mut buf);
    buf
}

fn run_op(e: &Engine, ops: &[Op], i: usize) -> Result<(), EngineError> {
    match ops[i] {
        Op::Write { start, len, fua } => {
            e.write(start * BS as u64, &write_data(i, start, len), fua)
        }
        Op::Discard { start, len } => e.discard(start * BS as u64, len * BS as u64),
        Op::Flush => e.flush(),
        Op::Commit => e.debug_commit(),
    }
}

/// A planned group from op `i` (see [`run_with`]): how many ops it ran (0: the write at
/// `i` is not planned, or not a plain write), or (completed, in-flight end) when one failed.
fn run_group(e: &Engine, ops: &[Op], i: usize) -> Result<usize, (usize, usize)> {
    let mut group = Vec::new();
    let mut writes = 0;
    for (j, op) in ops.iter().enumerate().skip(i) {
        match *op {
            Op::Write {
                start,
                len,
                fua: false,
            } if writes < GROUP_WRITES => {
                let data = write_data(j, start, len);
                let Some(plan) = e.plan_write(start * BS as u64, &data) else {
                    break;
                };
                group.push((j, Some((plan, data))));
                writes += 1;
            }
            Op::Flush if writes > 0 => group.push((j, None)),
            _ => break,
        }
    }
    let end = i + group.len();
    if writes > 1 {
        GROUPED_PLANS.with(|g| g.set(g.get() + writes as u64));
    }
    for (_, w) in &group {
        if let Some((plan, data)) = w {
            if let Some(first) = plan.sync_first() {
                sync_planned(e, first).map_err(|_| (i, end))?;
            }
            plan.write_for_test(data).map_err(|_| (i, end))?;
        }
    }
    for (j, w) in group {
        let r = match w {
            Some((plan, data)) => plan.complete(&data).and_then(|u| sync_planned(e, u)),
            None => flush_planned(e),
        };
        r.map_err(|_| (j, end))?;
    }
    Ok(end - i)
}

/// A flush as a queue thread's ring makes it (`Engine::plan_flush`): its log writes and
/// device flushes done by the caller, step by step.
fn flush_planned(e: &Engine) -> Result<(), EngineError> {
    use dmz::engine::FlushStep;
    let mut plan = e.plan_flush()?;
    loop {
        match plan.step()? {
            FlushStep::Log(log) => {
                log.write_for_test()?;
                log.complete();
            }
            FlushStep::Device => plan.flush_device_for_test()?,
            FlushStep::Done => return Ok(()),
        }
    }
}

/// Check every block after a cut: `done` ops completed, op `done` (if any) was in flight.
pub fn verify(e: &Engine, ops: &[Op], done: usize, blocks: u64, what: &str) {
    verify_upto(e, ops, done, done + 1, blocks, what)
}

/// [`verify`] with the ops `done..upto` in flight (a planned group's, see [`run_with`]).
pub fn verify_upto(e: &Engine, ops: &[Op], done: usize, upto: usize, blocks: u64, what: &str) {
    let mut got = vec![0u8; blocks as usize * BS];
    e.read(0, &mut got)
        .unwrap_or_else(|err| panic!("{what}: read: {err}"));
    check_read(&got, ops, done, upto, what);
}

/// The acceptance model of [`verify_upto`] over `got`, the whole volume read back (shared
/// with the log layout's power-cut test): each block holds its last write before the last
/// flush or FUA write among the `done` completed ops, or a later write or discard up to op
/// `upto`.
pub fn check_read(got: &[u8], ops: &[Op], done: usize, upto: usize, what: &str) {
    let blocks = (got.len() / BS) as u64;
    let last_sync = ops[..done]
        .iter()
        .rposition(|o| matches!(o, Op::Flush | Op::Write { fua: true, .. }));
    // Per block: the acceptable write ids (0 = zeros).
    let mut versions: Vec<Vec<(usize, u64)>> = vec![vec![(usize::MAX, 0)]; blocks as usize];
    let upto = upto.min(ops.len());
    for (i, op) in ops[..upto].iter().enumerate() {
        let (s, l, id) = match *op {
            Op::Write { start, len, .. } => (start, len, i as u64 + 1),
            Op::Discard { start, len } => (start, len, 0),
            Op::Flush | Op::Commit => continue,
        };
        for b in s..s + l {
            versions[b as usize].push((i, id));
        }
    }
    for b in 0..blocks as usize {
        let v = &versions[b];
        // The durable version: the last one written by an op before the last sync.
        let durable = v
            .iter()
            .rposition(|&(i, _)| i != usize::MAX && last_sync.is_some_and(|s| i <= s))
            .unwrap_or(0);
        let ok: Vec<u64> = v[durable..].iter().map(|&(_, id)| id).collect();
        let blk = &got[b * BS..(b + 1) * BS];
        let id = block_id(blk, b as u64).unwrap_or_else(|m| panic!("{what}: {m}"));
        assert!(
            ok.contains(&id),
            "{what}: block {b} reads write {id}, acceptable {ok:?} (done {done}, last sync {last_sync:?})"
        );
    }
}

/// A write as the frontend's hop-free path makes it: planned if the engine plans it, the
/// data put on the device by the caller, then completed and synced; a write not planned, or
/// whose device write failed (the plan dropped), goes through [`Engine::write`].
/// True if the write was planned.
pub fn write_planned(e: &Engine, offset: u64, buf: &[u8]) -> Result<bool, EngineError> {
    if let Some(plan) = e.plan_write(offset, buf) {
        if let Some(first) = plan.sync_first() {
            sync_planned(e, first)?;
        }
        if plan.write_for_test(buf).is_ok() {
            let w = plan.complete(buf)?;
            return sync_planned(e, w).map(|()| true);
        }
    }
    e.write(offset, buf, false).map(|()| false)
}

/// Sync as the frontend's queue threads do: write the log blocks itself where it can
/// ([`Engine::plan_sync`], through the engine's device here), else [`Engine::sync`].
pub fn sync_planned(e: &Engine, w: Unsynced) -> Result<(), EngineError> {
    match e.plan_sync(w)? {
        SyncPlan::Done => Ok(()),
        SyncPlan::Busy => e.sync(w),
        SyncPlan::Write(log) => match log.write_for_test() {
            Ok(()) => {
                log.complete();
                Ok(())
            }
            Err(_) => Err(log.fail(std::io::Error::from_raw_os_error(libc::EIO))),
        },
    }
}
