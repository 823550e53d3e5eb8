//! Write groups (docs/design.md, "Hop-free writes", write groups): the hop-free writes of
//! one queue thread's tags that become ready together are planned together
//! ([`BlockTarget::plan_write_group`]), written with one `IORING_OP_WRITEV` per plan
//! straight from the tags' buffers, recorded together and synced once. A target that
//! appends every write at an open zone (the log layout) has one write in flight per zone
//! at a time; grouping lets each of those carry every write that was waiting, instead of
//! sending the writes that found no free zone to the pool.
//!
//! The first tag to join a forming group leads it: it yields once to the executor, so that
//! the other tags whose requests came in the same ring wait join too, then takes the group
//! and runs it for everyone ([`run`]); the others wait for their result on a channel. A
//! write the target leaves out (no room, overlapping another) gets `NoPlan` and goes its
//! own way, as a write without a plan does. Each member keeps its own chunk held
//! ([`Held`]) until it has its result; a record that must wait for a lock is handed to the
//! pool with the leader's chunk, as a single write's is.

use std::cell::RefCell;
use std::sync::Arc;

use libublk::helpers::IoBuf;

use crate::completion::TagCompletion;
use crate::io_limit::IoLimit;
use crate::queue::{shortfall, sync_tokens, Held, HopFree, QueueShared, RingIo};
use crate::{GroupGuard, GroupPlan};

/// The group forming on one queue thread (each ring has one: [`RingIo::write_groups`]).
#[derive(Default)]
pub struct WriteGroups {
    forming: RefCell<Vec<Member>>,
}

/// A tag's write in a group: its range, its buffer (the data is `buf[..len]`), and where
/// its result goes.
struct Member {
    offset: u64,
    len: u64,
    buf: Arc<IoBuf<u8>>,
    done: smol::channel::Sender<HopFree>,
}

impl Member {
    fn data(&self) -> &[u8] {
        &self.buf.as_slice()[..self.len as usize]
    }

    fn finish(&self, h: HopFree) {
        // The member's task awaits it: a closed channel means it is gone (the queue is
        // going down), and nothing is owed to it.
        let _ = self.done.try_send(h);
    }
}

/// A write of `len` bytes at `offset` (its chunks held by the caller in `held`) from
/// `buf[..len]`, made in the thread's write group.
pub(crate) async fn write_grouped<R: RingIo>(
    ring: &R,
    offset: u64,
    len: u64,
    buf: &Arc<IoBuf<u8>>,
    completion: &Arc<TagCompletion>,
    shared: &QueueShared,
    held: &mut Held<'_>,
) -> HopFree {
    let (done, result) = smol::channel::bounded(1);
    let groups = ring.write_groups();
    let leads = {
        let mut forming = groups.forming.borrow_mut();
        forming.push(Member {
            offset,
            len,
            buf: buf.clone(),
            done,
        });
        forming.len() == 1
    };
    if leads {
        // The other tags whose requests came in the same ring wait join meanwhile.
        smol::future::yield_now().await;
        let members = std::mem::take(&mut *groups.forming.borrow_mut());
        run(ring, members, completion, shared, held).await;
    }
    result.recv().await.unwrap_or(HopFree::NoPlan)
}

/// One plan of a group and the members it placed, in device order.
struct Planned {
    plan: GroupPlan,
    members: Vec<usize>,
}

/// Plan the members (as many plans as the target gives: each a zone of its own), write
/// each plan's data with one vectored write, complete and sync them, and give every member
/// its result.
async fn run<R: RingIo>(
    ring: &R,
    members: Vec<Member>,
    completion: &Arc<TagCompletion>,
    shared: &QueueShared,
    held: &mut Held<'_>,
) {
    let plans = plan_all(&members, shared, ring.limit());
    let written = write_all(ring, &members, plans, shared).await;
    let mut tokens = Vec::new();
    let mut later: Vec<(Box<dyn GroupGuard + Send>, Vec<usize>)> = Vec::new();
    let mut synced_members = Vec::new();
    for p in written {
        let parts: Vec<&[u8]> = p.members.iter().map(|&i| members[i].data()).collect();
        match p.plan.guard.try_complete(&parts) {
            Ok(Ok(t)) => {
                tokens.push(t);
                synced_members.extend(p.members);
            }
            Ok(Err(e)) => p.members.iter().for_each(|&i| {
                members[i].finish(HopFree::Done(Err(e)));
            }),
            Err(guard) => later.push((guard, p.members)),
        }
    }
    let result = if later.is_empty() {
        // As for a single write: the other tags' records first, so that one log write
        // covers them all.
        smol::future::yield_now().await;
        sync_tokens(ring, tokens, held, shared, completion).await
    } else {
        // Recorded and synced on the pool, where waiting for the lock costs no other tag.
        let bufs: Vec<(Arc<IoBuf<u8>>, usize)> = members
            .iter()
            .map(|m| (m.buf.clone(), m.len as usize))
            .collect();
        for (_, placed) in &later {
            synced_members.extend(placed);
        }
        held.hand_off(shared, completion, move |t| {
            for (guard, placed) in later {
                let parts: Vec<&[u8]> = placed
                    .iter()
                    .map(|&i| &bufs[i].0.as_slice()[..bufs[i].1])
                    .collect();
                tokens.push(guard.complete(&parts)?);
            }
            tokens.into_iter().try_for_each(|tok| t.sync(tok))
        })
        .await
    };
    for i in synced_members {
        members[i].finish(HopFree::Done(result));
    }
}

/// Plans for the members, as many as the target gives, each offered no more members than
/// one vectored write may carry (`limit`), in logical order (a stream's pieces then come
/// to the target one after the other, as its pipelines want them: docs/design.md,
/// "Planned writes"); the members of an offer the target turns down, and those too big
/// for one write alone, get `NoPlan` at once, and the next ones are offered.
fn plan_all(members: &[Member], shared: &QueueShared, limit: IoLimit) -> Vec<Planned> {
    let addr = |i: usize| members[i].buf.as_slice().as_ptr() as usize;
    let (mut rest, too_big): (Vec<usize>, Vec<usize>) = (0..members.len())
        .partition(|&i| limit.fits(std::iter::once((addr(i), members[i].len))) == 1);
    for i in too_big {
        members[i].finish(HopFree::NoPlan);
    }
    rest.sort_by_key(|&i| members[i].offset);
    let mut plans = Vec::new();
    while !rest.is_empty() {
        let n = limit.fits(rest.iter().map(|&i| (addr(i), members[i].len)));
        let asked: Vec<(u64, u64)> = rest[..n]
            .iter()
            .map(|&i| (members[i].offset, members[i].len))
            .collect();
        let plan = shared.target.plan_write_group(&asked);
        let Some(plan) = plan.filter(|p| !p.placed.is_empty()) else {
            for i in rest.drain(..n) {
                members[i].finish(HopFree::NoPlan);
            }
            continue;
        };
        let placed: Vec<usize> = plan.placed.iter().map(|&k| rest[k]).collect();
        rest.retain(|i| !placed.contains(i));
        plans.push(Planned {
            plan,
            members: placed,
        });
    }
    plans
}

/// Write each plan's data with one vectored write, all in flight together. The plans
/// whose write failed, came up short or was turned away are dropped (they record nothing)
/// before their members hear `Failed` or `Again` (the pool redoes those writes); the
/// others come back.
async fn write_all<R: RingIo>(
    ring: &R,
    members: &[Member],
    plans: Vec<Planned>,
    shared: &QueueShared,
) -> Vec<Planned> {
    let iovs: Vec<Vec<libc::iovec>> = plans
        .iter()
        .map(|p| {
            p.members
                .iter()
                .map(|&i| libc::iovec {
                    iov_base: members[i].buf.as_slice().as_ptr() as *mut libc::c_void,
                    iov_len: members[i].len as usize,
                })
                .collect()
        })
        .collect();
    // SAFETY: each iovec names `buf[..len]` of a member's tag buffer, inside it (decode
    // checked len <= the buffer's size); the members' `Arc`s (in `members`, which outlives
    // this function) keep the buffers allocated, nothing writes them while their requests
    // run, and `iovs` lives until every write below has completed (each is awaited before
    // this function returns).
    let writes: Vec<_> = plans
        .iter()
        .zip(&iovs)
        .map(|(p, iov)| unsafe {
            ring.writev(iov.as_ptr(), iov.len() as u32, p.plan.device_offset)
        })
        .collect();
    let mut ok = Vec::new();
    for (w, p) in writes.into_iter().zip(plans) {
        let want: u64 = p.members.iter().map(|&i| members[i].len).sum();
        let Some(outcome) = shortfall(&[(w.await, want)], &shared.stats, "write group") else {
            ok.push(p);
            continue;
        };
        let Planned {
            plan,
            members: placed,
        } = p;
        drop(plan);
        for i in placed {
            members[i].finish(outcome);
        }
    }
    ok
}
