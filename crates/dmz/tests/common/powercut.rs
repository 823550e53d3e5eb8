//! The power-cut tests' shared model: a workload's operations, running them until the device
//! dies, and what every block may read back after the cut.

use dmz::engine::{Engine, EngineError};

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
    run_with(e, ops, false)
}

/// [`run`]; with `planned`, each write the engine plans ([`Engine::plan_write`]) is put
/// on the device by the test, as the frontend's queue threads do (see [`write_planned`]).
pub fn run_with(e: &Engine, ops: &[Op], planned: bool) -> usize {
    let mut buf = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let r = match *op {
            Op::Write { start, len, fua } => {
                buf.resize(len as usize * BS, 0);
                pattern(i as u64 + 1, start, &mut buf);
                if planned && !fua {
                    write_planned(e, start * BS as u64, &buf).map(|_| ())
                } else {
                    e.write(start * BS as u64, &buf, fua)
                }
            }
            Op::Discard { start, len } => e.discard(start * BS as u64, len * BS as u64),
            Op::Flush => e.flush(),
            Op::Commit => e.debug_commit(),
        };
        if r.is_err() {
            return i;
        }
    }
    ops.len()
}

/// Check every block after a cut: `done` ops completed, op `done` (if any) was in flight.
pub fn verify(e: &Engine, ops: &[Op], done: usize, blocks: u64, what: &str) {
    let last_sync = ops[..done]
        .iter()
        .rposition(|o| matches!(o, Op::Flush | Op::Write { fua: true, .. }));
    let mut got = vec![0u8; blocks as usize * BS];
    e.read(0, &mut got)
        .unwrap_or_else(|err| panic!("{what}: read: {err}"));
    // Per block: the acceptable write ids (0 = zeros).
    let mut versions: Vec<Vec<(usize, u64)>> = vec![vec![(usize::MAX, 0)]; blocks as usize];
    let upto = (done + 1).min(ops.len());
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
    if let Some(plan) = e.plan_write(offset, buf.len() as u64) {
        if plan.write_for_test(buf).is_ok() {
            let w = plan.complete(buf)?;
            return e.sync(w).map(|()| true);
        }
    }
    e.write(offset, buf, false).map(|()| false)
}
