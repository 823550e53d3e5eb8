//! The zone table: what each zone is used for, its write pointer and weight, and the free
//! pools the allocator draws from. Every change of a zone's [`Role`] is a method here;
//! [`super::Meta`] calls them from record application and allocation only.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use zbd::{Zone, ZoneCondition};

use super::super::ids::{ChunkId, ZoneId, BLOCK};

/// What a zone is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) enum Role {
    Meta,
    Free,
    /// Sequential zone kept for reclaim destinations.
    Reserved,
    /// Freed, but the record saying so may not be durable yet: not reusable until a flush.
    PendingFree,
    Data,
    Buffer,
    Offline,
    ReadOnly,
    /// Runt or otherwise unusable.
    Unusable,
}

impl Role {
    /// Offline or read-only: out of every pool for good.
    pub fn is_retired(self) -> bool {
        matches!(self, Role::Offline | Role::ReadOnly)
    }
}

/// One zone's entry (what [`super::Meta::zone`] hands out, by value).
#[derive(Debug, Clone, Copy)]
pub(in crate::engine) struct ZoneInfo {
    pub role: Role,
    pub seq: bool,
    /// Write pointer, in blocks from the zone start (sequential zones).
    pub wp: u32,
    /// Valid blocks.
    pub weight: u32,
    /// Owning chunk for Data/Buffer.
    pub chunk: Option<ChunkId>,
    /// Last access (logical clock), for the oldest-first policy.
    pub atime: u32,
    /// Last access in wall time: tenths of a second since the table was built.
    pub used_at: u32,
    /// Sequence number of the last log record that validated blocks here.
    pub last_seq: u64,
    /// ...and of the last one that made a block valid that was not valid before (0: none
    /// since load): below the folded records, every valid block is in the committed sets.
    pub last_new_seq: u64,
    /// ...and of the last one that made valid blocks invalid here (0: none since load).
    pub last_cleared_seq: u64,
}

pub(super) struct Zones {
    z: Vec<ZoneInfo>,
    zone_blocks: u32,
    free_conv: VecDeque<ZoneId>,
    free_seq: VecDeque<ZoneId>,
    reserved: Vec<ZoneId>,
    nr_reserved: u32,
    /// (zone, sequence number of its Free record).
    pending_free: Vec<(ZoneId, u64)>,
    nr_conv_data_zones: u32,
    clock: u32,
    /// Origin of `used_at`.
    born: Instant,
    /// The zoned drives' zone ranges of a multi-device volume whose sequential zones are
    /// spread over its drives (see [`Zones::set_drives`]); empty: taken in pool order.
    drives: Vec<Range<u32>>,
    /// Per drive, the sequential zones recently taken from it: those still owned and not
    /// full are its streams and reclaim destinations being written (its load).
    taken: Vec<VecDeque<ZoneId>>,
}

/// Zones remembered per drive in [`Zones::taken`]: more than a drive has streams.
const TAKEN_KEPT: usize = 64;

impl Zones {
    pub fn from_report(report: &[Zone], zone_size: u64, nr_reserved: u32) -> Zones {
        let zone_blocks = (zone_size / BLOCK as u64) as u32;
        let z = report
            .iter()
            .map(|r| {
                let seq = r.zone_type.is_sequential();
                let role = match r.cond {
                    ZoneCondition::Offline => Role::Offline,
                    ZoneCondition::ReadOnly => Role::ReadOnly,
                    _ if r.len != zone_size || r.capacity != zone_size => Role::Unusable,
                    _ => Role::Free,
                };
                let wp = if seq {
                    if r.cond == ZoneCondition::Full {
                        zone_blocks
                    } else {
                        ((r.wp - r.start) / BLOCK as u64) as u32
                    }
                } else {
                    0
                };
                ZoneInfo {
                    role,
                    seq,
                    wp,
                    weight: 0,
                    chunk: None,
                    atime: 0,
                    used_at: 0,
                    last_seq: 0,
                    last_new_seq: 0,
                    last_cleared_seq: 0,
                }
            })
            .collect();
        Zones {
            z,
            zone_blocks,
            free_conv: VecDeque::new(),
            free_seq: VecDeque::new(),
            reserved: Vec::new(),
            nr_reserved,
            pending_free: Vec::new(),
            nr_conv_data_zones: 0,
            clock: 0,
            born: Instant::now(),
            drives: Vec::new(),
            taken: Vec::new(),
        }
    }

    /// Spread sequential zones over the zoned drives `drives` (zone ranges): each zone is
    /// taken from the drive with the fewest zones being written, so concurrent streams and
    /// reclaim destinations land on different drives and the drives work in parallel (in
    /// pool order, every zone would come from the first drive until it is full). Fewer
    /// than two drives: nothing to spread.
    pub fn set_drives(&mut self, drives: Vec<Range<u32>>) {
        if drives.len() < 2 {
            return;
        }
        self.taken = vec![VecDeque::new(); drives.len()];
        self.drives = drives;
    }

    /// The zoned drive (an index into the drives of [`Zones::set_drives`]) holding `zone`.
    fn drive_of(&self, zone: ZoneId) -> Option<usize> {
        self.drives.iter().position(|r| r.contains(&zone.0))
    }

    /// Take the next free sequential zone: the pool's first, or with drives to spread
    /// over, the first of the least loaded drive (ties: the one with the most free zones).
    fn pop_free_seq(&mut self) -> Option<ZoneId> {
        if self.drives.is_empty() {
            return self.free_seq.pop_front();
        }
        let mut free = vec![0usize; self.drives.len()];
        let mut first = vec![None; self.drives.len()];
        for (i, &zone) in self.free_seq.iter().enumerate() {
            if let Some(d) = self.drive_of(zone) {
                free[d] += 1;
                first[d].get_or_insert(i);
            }
        }
        let (zb, z) = (self.zone_blocks, &self.z);
        for t in &mut self.taken {
            t.retain(|q| z[q.idx()].chunk.is_some() && z[q.idx()].wp < zb);
        }
        let best = (0..self.drives.len())
            .filter(|&d| free[d] > 0)
            .min_by_key(|&d| (self.taken[d].len(), std::cmp::Reverse(free[d])));
        let zone = match best {
            Some(d) => self.free_seq.remove(first[d].expect("free > 0"))?,
            None => self.free_seq.pop_front()?,
        };
        self.note_taken(zone);
        Some(zone)
    }

    /// Count `zone` (just taken) in its drive's load.
    fn note_taken(&mut self, zone: ZoneId) {
        if let Some(d) = self.drive_of(zone) {
            let t = &mut self.taken[d];
            if t.len() == TAKEN_KEPT {
                t.pop_front();
            }
            t.push_back(zone);
        }
    }

    pub fn len(&self) -> u32 {
        self.z.len() as u32
    }

    pub fn get(&self, zone: ZoneId) -> ZoneInfo {
        self.z[zone.idx()]
    }

    pub fn iter(&self) -> impl Iterator<Item = (ZoneId, &ZoneInfo)> {
        self.z
            .iter()
            .enumerate()
            .map(|(i, zi)| (ZoneId(i as u32), zi))
    }

    pub fn zone_blocks(&self) -> u32 {
        self.zone_blocks
    }

    pub fn nr_free_conv(&self) -> usize {
        self.free_conv.len()
    }

    pub fn nr_free_seq(&self) -> usize {
        self.free_seq.len()
    }

    pub fn nr_reserved_free(&self) -> usize {
        self.reserved.len()
    }

    pub fn nr_pending_free(&self) -> usize {
        self.pending_free.len()
    }

    pub fn nr_conv_data_zones(&self) -> u32 {
        self.nr_conv_data_zones
    }

    /// Bytes of the table and its pools.
    pub fn mem_bytes(&self) -> usize {
        self.z.capacity() * std::mem::size_of::<ZoneInfo>()
            + (self.free_conv.capacity() + self.free_seq.capacity() + self.reserved.capacity())
                * std::mem::size_of::<ZoneId>()
    }

    /// A metadata zone of the v2 sets (at load).
    pub fn set_meta(&mut self, zone: ZoneId) {
        self.z[zone.idx()].role = Role::Meta;
    }

    /// The zone's weight as counted from the bitmaps at load.
    pub fn set_loaded_weight(&mut self, zone: ZoneId, weight: u32) {
        self.z[zone.idx()].weight = weight;
    }

    pub fn add_weight(&mut self, zone: ZoneId, valid: u32, seq: u64) {
        let zi = &mut self.z[zone.idx()];
        zi.weight += valid;
        zi.last_seq = seq;
        if valid > 0 {
            zi.last_new_seq = seq;
        }
    }

    /// Bits a reclaim merge set in `zone` (no write record validated them).
    pub fn add_weight_merged(&mut self, zone: ZoneId, valid: u32) {
        self.z[zone.idx()].weight += valid;
    }

    /// `invalid` blocks of `zone` became invalid by record `seq` (0: by no record).
    pub fn sub_weight(&mut self, zone: ZoneId, invalid: u32, seq: u64) {
        let zi = &mut self.z[zone.idx()];
        zi.weight -= invalid;
        if invalid > 0 && seq > 0 {
            zi.last_cleared_seq = seq;
        }
    }

    pub fn clear_weight(&mut self, zone: ZoneId) {
        self.z[zone.idx()].weight = 0;
    }

    /// The device's write pointer for `zone` (after a write, a reset, a report).
    pub fn set_wp(&mut self, zone: ZoneId, wp: u32) {
        self.z[zone.idx()].wp = wp;
    }

    /// `zone` is `chunk`'s data or buffer zone (a mapping record names it). A retired zone
    /// keeps its role.
    pub fn own(&mut self, zone: ZoneId, role: Role, chunk: ChunkId) {
        debug_assert!(matches!(role, Role::Data | Role::Buffer));
        let zi = &mut self.z[zone.idx()];
        if !zi.role.is_retired() {
            zi.role = role;
        }
        zi.chunk = Some(chunk);
    }

    /// `zone` left its chunk's mapping (retired, or freed by a record of the same
    /// operation).
    pub fn disown(&mut self, zone: ZoneId) {
        self.z[zone.idx()].chunk = None;
    }

    /// Build the free pools from the roles (after load): the first `nr_reserved` free
    /// sequential zones are reserved for reclaim.
    pub fn build_pools(&mut self) {
        self.free_conv.clear();
        self.free_seq.clear();
        self.reserved.clear();
        self.nr_conv_data_zones = 0;
        for id in 0..self.z.len() as u32 {
            let zi = &mut self.z[id as usize];
            if !zi.seq && !matches!(zi.role, Role::Meta | Role::Offline | Role::Unusable) {
                self.nr_conv_data_zones += 1;
            }
            if zi.role != Role::Free {
                continue;
            }
            if zi.seq {
                if (self.reserved.len() as u32) < self.nr_reserved {
                    zi.role = Role::Reserved;
                    self.reserved.push(ZoneId(id));
                } else {
                    self.free_seq.push_back(ZoneId(id));
                }
            } else {
                self.free_conv.push_back(ZoneId(id));
            }
        }
    }

    pub fn touch(&mut self, zone: ZoneId) {
        self.clock = self.clock.wrapping_add(1);
        let now = self.now_ds();
        let zi = &mut self.z[zone.idx()];
        zi.atime = self.clock;
        zi.used_at = now;
    }

    /// Now, in tenths of a second since the table was built.
    fn now_ds(&self) -> u32 {
        (self.born.elapsed().as_millis() / 100).min(u32::MAX as u128) as u32
    }

    /// How long ago `zone` was last read or written (to a tenth of a second).
    pub fn idle_for(&self, zone: ZoneId) -> Duration {
        let ds = self.now_ds().saturating_sub(self.z[zone.idx()].used_at);
        Duration::from_millis(ds as u64 * 100)
    }

    fn take(&mut self, zone: ZoneId, role: Role, chunk: ChunkId) -> ZoneId {
        let zi = &mut self.z[zone.idx()];
        zi.role = role;
        zi.chunk = Some(chunk);
        self.touch(zone);
        zone
    }

    pub fn alloc_conv(&mut self, role: Role, chunk: ChunkId) -> Option<ZoneId> {
        let z = self.free_conv.pop_front()?;
        Some(self.take(z, role, chunk))
    }

    pub fn alloc_seq(&mut self, role: Role, chunk: ChunkId) -> Option<ZoneId> {
        let z = self.pop_free_seq()?;
        Some(self.take(z, role, chunk))
    }

    /// A sequential destination for reclaim: a free one, else a reserved one.
    pub fn alloc_seq_reclaim(&mut self, chunk: ChunkId) -> Option<ZoneId> {
        let z = match self.pop_free_seq() {
            Some(z) => z,
            None => {
                let z = self.reserved.pop()?;
                self.note_taken(z);
                z
            }
        };
        Some(self.take(z, Role::Data, chunk))
    }

    /// The zone's Free record has sequence number `seq`: reusable once that is durable.
    pub fn release(&mut self, zone: ZoneId, seq: u64) {
        let zi = &mut self.z[zone.idx()];
        zi.role = Role::PendingFree;
        zi.chunk = None;
        zi.weight = 0;
        self.pending_free.push((zone, seq));
    }

    /// A zone allocated but not yet named by any record goes back to its pool (a failed
    /// reset or copy): first in line, as if never taken.
    pub fn give_back(&mut self, zone: ZoneId) {
        let zi = &mut self.z[zone.idx()];
        zi.chunk = None;
        zi.weight = 0;
        self.pool_zone(zone, true);
    }

    /// Put a free zone in its pool: the reserve while it is short, else the free
    /// sequential or conventional pool, at the front (`first`) or the back.
    fn pool_zone(&mut self, zone: ZoneId, first: bool) {
        let zi = &mut self.z[zone.idx()];
        if zi.seq && (self.reserved.len() as u32) < self.nr_reserved {
            zi.role = Role::Reserved;
            self.reserved.push(zone);
            return;
        }
        zi.role = Role::Free;
        let pool = if zi.seq {
            &mut self.free_seq
        } else {
            &mut self.free_conv
        };
        if first {
            pool.push_front(zone);
        } else {
            pool.push_back(zone);
        }
    }

    /// The device reports `zone` offline or read-only: out of every pool for good (never
    /// allocated, never a reclaim victim or destination). A chunk mapped to it keeps it.
    pub fn retire(&mut self, zone: ZoneId, role: Role) {
        debug_assert!(role.is_retired());
        self.free_conv.retain(|&z| z != zone);
        self.free_seq.retain(|&z| z != zone);
        self.reserved.retain(|&z| z != zone);
        self.pending_free.retain(|&(z, _)| z != zone);
        let zi = &mut self.z[zone.idx()];
        if !zi.seq && role == Role::Offline && zi.role != Role::Offline {
            self.nr_conv_data_zones = self.nr_conv_data_zones.saturating_sub(1);
        }
        if matches!(zi.role, Role::Free | Role::Reserved | Role::PendingFree) {
            zi.chunk = None;
        }
        let newly = !zi.role.is_retired();
        zi.role = role;
        if newly {
            // One zone fewer: like a degraded volume at load, it comes out of the reserve.
            self.nr_reserved = self.nr_reserved.saturating_sub(1);
            while self.reserved.len() as u32 > self.nr_reserved {
                let z = self.reserved.pop().expect("len > nr_reserved >= 0");
                self.z[z.idx()].role = Role::Free;
                self.free_seq.push_back(z);
            }
        }
    }

    /// Offline or read-only: retired.
    pub fn is_retired(&self, zone: ZoneId) -> bool {
        self.z[zone.idx()].role.is_retired()
    }

    /// Pending frees whose Free records are below `written_seq` (they will be durable after
    /// the next device flush), as (zone, record sequence number).
    pub fn flushable_frees(&self, written_seq: u64) -> Vec<(ZoneId, u64)> {
        self.pending_free
            .iter()
            .filter(|(_, s)| *s < written_seq)
            .copied()
            .collect()
    }

    /// Make `frees` allocatable (their Free records are durable). Returns how many.
    ///
    /// By zone *and* record: while one flush was in progress another may have promoted a
    /// zone, which was then reused and freed again by a record this flush does not cover.
    pub fn promote(&mut self, frees: &[(ZoneId, u64)]) -> usize {
        let mut n = 0;
        for &(zone, seq) in frees {
            let Some(i) = self.pending_free.iter().position(|&f| f == (zone, seq)) else {
                continue;
            };
            self.pending_free.swap_remove(i);
            if self.z[zone.idx()].role != Role::PendingFree {
                continue;
            }
            n += 1;
            self.pool_zone(zone, false);
        }
        n
    }

    /// Sequential zones partly written (open or closed: they count against max-active).
    pub fn nr_active(&self) -> u32 {
        self.z
            .iter()
            .filter(|z| z.seq && z.wp > 0 && z.wp < self.zone_blocks)
            .count() as u32
    }

    /// Whether opening one more sequential zone stays under `max_active` (0: no limit),
    /// keeping `spare` slots for others (reclaim).
    pub fn can_open(&self, max_active: u32, spare: u32) -> bool {
        max_active == 0 || self.nr_active() + 1 + spare <= max_active
    }

    /// Zones per role, for stats.
    pub fn count(&self, role: Role) -> u64 {
        self.z.iter().filter(|z| z.role == role).count() as u64
    }
}

/// Writers waiting for a free conventional zone, first come first served.
///
/// When reclaim cannot keep up, every freed zone is raced for by all waiting writers (and
/// by newcomers). Served in random order, a writer's wait has a geometric tail: p99 several
/// times the mean. Served in arrival order, no writer waits for more zones than there were
/// writers ahead of it. A writer joins on its first wait and leaves once it no longer needs
/// a zone; while anyone waits, a free zone is promised to the oldest waiters, and a writer
/// without a ticket only takes zones beyond those.
#[derive(Debug, Default)]
pub(in crate::engine) struct ConvQueue {
    next: u64,
    waiting: VecDeque<u64>,
}

impl ConvQueue {
    /// A ticket at the back of the queue.
    pub fn join(&mut self) -> u64 {
        let t = self.next;
        self.next += 1;
        self.waiting.push_back(t);
        t
    }

    pub fn leave(&mut self, ticket: u64) {
        self.waiting.retain(|&t| t != ticket);
    }

    /// Whether the holder of `ticket` (None: a writer that never waited) may take one of
    /// `free` free conventional zones now.
    pub fn may_take(&self, ticket: Option<u64>, free: usize) -> bool {
        match ticket {
            Some(t) => self
                .waiting
                .iter()
                .position(|&w| w == t)
                .is_none_or(|p| p < free),
            None => self.waiting.len() < free,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ChunkId, ConvQueue, Role, Zones};
    use zbd::{Zone, ZoneCondition, ZoneType};

    /// `n` empty sequential zones of 1 MiB, no reserve.
    fn seq_zones(n: u32) -> Zones {
        let report: Vec<Zone> = (0..n)
            .map(|id| Zone {
                id,
                start: id as u64 * (1 << 20),
                len: 1 << 20,
                capacity: 1 << 20,
                wp: id as u64 * (1 << 20),
                zone_type: ZoneType::SeqWriteRequired,
                cond: ZoneCondition::Empty,
            })
            .collect();
        let mut z = Zones::from_report(&report, 1 << 20, 0);
        z.build_pools();
        z
    }

    /// Two drives of 4 zones: zones go to the drive with fewer zones being written, ties
    /// to the one with more free zones; a full zone no longer counts.
    #[test]
    fn sequential_zones_are_spread_over_the_drives() {
        let mut z = seq_zones(8);
        z.set_drives(vec![0..4, 4..8]);
        let drive = |zone: super::ZoneId| zone.0 / 4;
        let a = z.alloc_seq(Role::Data, ChunkId(0)).unwrap();
        let b = z.alloc_seq(Role::Data, ChunkId(1)).unwrap();
        assert_ne!(drive(a), drive(b), "two streams, two drives: {a} {b}");
        // The drive with more free zones wins a tie: after a third stream, the fourth goes
        // to the other drive, then streams alternate.
        let c = z.alloc_seq(Role::Data, ChunkId(2)).unwrap();
        let d = z.alloc_seq(Role::Data, ChunkId(3)).unwrap();
        assert_ne!(drive(c), drive(d));
        // a's zone is written full: its drive is the less loaded one now.
        z.set_wp(a, z.zone_blocks());
        let e = z.alloc_seq_reclaim(ChunkId(4)).unwrap();
        assert_eq!(drive(e), drive(a), "reclaim destinations spread too");
        // Without drives to spread over, the pool's order.
        let mut one = seq_zones(8);
        one.set_drives(std::iter::once(0..8).collect());
        let ids: Vec<u32> = (0..3)
            .map(|c| one.alloc_seq(Role::Data, ChunkId(c)).unwrap().0)
            .collect();
        assert_eq!(ids, [0, 1, 2]);
    }

    #[test]
    fn a_flush_promotes_only_the_frees_it_covered() {
        let mut z = seq_zones(2);
        let a = z.alloc_seq(Role::Data, ChunkId(0)).unwrap();
        z.release(a, 5);
        // A flush that covered record 5 starts...
        let cands = z.flushable_frees(6);
        assert_eq!(cands, vec![(a, 5)]);
        // ...while another flush promotes the zone, which is reused and freed again by
        // record 9, not durable yet.
        assert_eq!(z.promote(&z.flushable_frees(6)), 1);
        let reused = (0..2).find_map(|_| z.alloc_seq(Role::Data, ChunkId(1)).filter(|&x| x == a));
        assert_eq!(reused, Some(a));
        z.release(a, 9);
        // The first flush finishing must leave the zone pending.
        assert_eq!(z.promote(&cands), 0);
        assert_eq!(z.get(a).role, Role::PendingFree);
        assert_eq!(z.promote(&z.flushable_frees(10)), 1);
    }

    #[test]
    fn free_zones_go_to_the_oldest_waiters_first() {
        let mut q = ConvQueue::default();
        assert!(q.may_take(None, 1), "nobody waits: take it");
        assert!(!q.may_take(None, 0));
        let (a, b, c) = (q.join(), q.join(), q.join());
        // One zone: only the oldest waiter; newcomers queue behind everyone.
        assert!(q.may_take(Some(a), 1));
        assert!(!q.may_take(Some(b), 1));
        assert!(!q.may_take(None, 3));
        assert!(q.may_take(None, 4));
        // Two zones: the two oldest.
        assert!(q.may_take(Some(b), 2) && !q.may_take(Some(c), 2));
        // The oldest leaves (it got its zone, or no longer needs one): the next moves up.
        q.leave(a);
        assert!(q.may_take(Some(b), 1) && !q.may_take(Some(c), 1));
        q.leave(b);
        q.leave(c);
        assert!(q.may_take(None, 1), "nobody waits any more");
    }
}
