//! The owner of the engine's metadata state: the zone table and free pools ([`zones`]), the
//! chunk map and validity bitmaps ([`cache`]), and the metadata log ([`log`], records in
//! [`record`]). Its fields are private: the I/O path and reclaim read through accessors and
//! change metadata only through the functions below that build a log record, apply it in
//! memory ([`record::Record::apply`], the same function replay uses) and append it.
//! Durability (log writes, device flushes, commits) is [`durability`]; open, replay and
//! clean-up are [`open`].
//!
//! Lock order (outermost first; a thread never takes an earlier lock while holding a later
//! one), the same as docs/design.md "Locking":
//! 1. a chunk lock (`Inner::chunk_locks`, striped `RwLock`);
//! 2. `Inner::commit_lock` (one commit at a time);
//! 3. `Inner::log_write` (one log writer at a time; a `durability::LogWrite` owns it while a
//!    queue thread writes the log on its ring);
//! 4. `Inner::state` (this [`Meta`], the zone-wait bookkeeping and the overwrites in place a
//!    flush must prove; `free_cv` waits on it);
//! 5. `Inner::bg` (background thread control; `bg_cv`, `reclaim_cv`, `idle_cv` wait on it);
//! 6. `Inner::failed`, `Inner::sb` and `Inner::copy_bufs` (leaves: nothing is taken while
//!    they are held).

mod cache;
pub(super) mod durability;
pub(crate) mod log;
pub(super) mod open;
pub(crate) mod record;
mod zones;

use parking_lot::MutexGuard;
use zbd::ZonedDevice;

use super::ids::{ChunkId, Mapping, ZoneId, BLOCK};
use super::{EngineError, EngineStats, Inner, State};

pub(super) use cache::{runs_of_ones, Bits};
pub(super) use zones::{ConvQueue, Role, ZoneInfo};

use cache::MetaCache;
use log::LogBuf;
use record::{Ctx, FreeRec, InvalidateRec, MapRec, Rec, ReclaimRec, WriteRec};
use zones::Zones;

/// Where the records that validated a conventional zone stand ([`Meta::proof`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Proof {
    /// None, or folded into the sets, or below a durable log header's flushed seq: replay
    /// applies them without checking the data, so an overwrite in place cannot undo them.
    Proven,
    /// Flushed but proven by no durable header: replay would check their CRCs against the
    /// data, which an overwrite in place changes; prove them first.
    FlushedUnproven,
    /// Not flushed yet: an overwrite may go ahead, but a flush that covers them while it is
    /// in flight must prove them before it returns (`durability::InPlaceWrites`).
    Unflushed,
}

/// The metadata state. Only this module and its children change it.
pub(super) struct Meta {
    zones: Zones,
    cache: MetaCache,
    log: LogBuf<Rec>,
}

impl Meta {
    pub fn mapping(&self, chunk: ChunkId) -> Mapping {
        self.cache.mapping(chunk)
    }

    /// Every chunk with its mapping, mapped or not.
    pub fn mappings(&self) -> impl Iterator<Item = (ChunkId, Mapping)> + '_ {
        self.cache.mappings()
    }

    pub fn zone(&self, zone: ZoneId) -> ZoneInfo {
        self.zones.get(zone)
    }

    pub fn is_retired(&self, zone: ZoneId) -> bool {
        self.zones.is_retired(zone)
    }

    /// Validity bits of blocks `[block, block + n)` of `zone` (may read a bitmap block).
    pub fn bits(
        &mut self,
        dev: &dyn ZonedDevice,
        zone: ZoneId,
        block: u32,
        n: u32,
    ) -> Result<Bits, EngineError> {
        self.cache.bits(dev, zone, block, n)
    }

    /// [`Meta::bits`] from resident bitmap blocks only (`None` if one is not cached).
    pub fn bits_cached(&mut self, zone: ZoneId, block: u32, n: u32) -> Option<Bits> {
        self.cache.bits_cached(zone, block, n)
    }

    pub fn nr_free_conv(&self) -> usize {
        self.zones.nr_free_conv()
    }

    pub fn nr_free_seq(&self) -> usize {
        self.zones.nr_free_seq()
    }

    pub fn nr_reserved_free(&self) -> usize {
        self.zones.nr_reserved_free()
    }

    pub fn nr_pending_free(&self) -> usize {
        self.zones.nr_pending_free()
    }

    pub fn nr_conv_data_zones(&self) -> u32 {
        self.zones.nr_conv_data_zones()
    }

    /// Whether one more sequential zone may be opened under `max_active`, `spare` slots kept.
    pub fn can_open(&self, max_active: u32, spare: u32) -> bool {
        self.zones.can_open(max_active, spare)
    }

    /// How long ago `zone` was last read or written.
    pub fn idle_for(&self, zone: ZoneId) -> std::time::Duration {
        self.zones.idle_for(zone)
    }

    /// Where the records that validated conventional zone `z` stand, for an overwrite in
    /// place (design.md, "Why proven must be durable before overwrites").
    ///
    /// The zone's last validating record (`ZoneInfo::last_seq`) speaks for the earlier ones:
    /// every record that validates blocks of a conventional zone in place was appended
    /// after this check (a write step, reclaim's copy into the buffer, a write plan) found
    /// the zone `Proven` or `Unflushed`, and a flush that ran meanwhile proved what it
    /// flushed (`durability::InPlaceWrites`; write plans count there even for a `Proven`
    /// zone, since another plan of the zone may append a record while one is in flight).
    /// So an earlier record of the zone is never flushed and unproven while the last one is
    /// unflushed.
    pub fn proof(&self, z: ZoneId) -> Proof {
        let ls = self.zones.get(z).last_seq;
        let log = &self.log;
        let floor = log.evidence_seq.max(log.folded_seq);
        if ls == 0 || ls < floor {
            Proof::Proven
        } else if ls < log.flushed_seq {
            Proof::FlushedUnproven
        } else {
            Proof::Unflushed
        }
    }

    /// Whether a write of blocks `[b, b + n)` in place into conventional zone `z` (a
    /// chunk's data zone, or its buffer) changes no metadata, so that it needs no `Write`
    /// record (design.md, "Overwrites without a record"): every block is valid in `z`
    /// already and invalid in the chunk's other zone `other` (a block is valid in one zone
    /// of its chunk at most, which `Engine::debug_check` asserts, but the bitmaps of a
    /// damaged or foreign volume may say both: then the record must invalidate it there,
    /// found by fuzzing), and every record that made a
    /// block of `z` valid is folded into the committed sets, so the sets say every block
    /// valid. A replayed record that only rewrote valid blocks may then fail its CRC check
    /// against the new data without harm: its blocks stay valid from the sets.
    pub fn overwrite_needs_no_record(
        &mut self,
        dev: &dyn ZonedDevice,
        z: ZoneId,
        other: Option<ZoneId>,
        b: u32,
        n: u32,
    ) -> Result<bool, EngineError> {
        let zi = self.zones.get(z);
        if zi.seq
            || !matches!(zi.role, Role::Data | Role::Buffer)
            || zi.last_new_seq >= self.log.folded_seq
            || !self.bits(dev, z, b, n)?.all()
        {
            return Ok(false);
        }
        match other {
            Some(o) => Ok(self.bits(dev, o, b, n)?.not_any()),
            None => Ok(true),
        }
    }

    /// Whether record `seq` is written to the log already (a sync up to it has nothing to do).
    pub fn log_holds(&self, seq: u64) -> bool {
        self.log.written_seq > seq
    }

    /// The sequence number of the last record appended (0: none yet). A write without a
    /// record syncs the log up to it: whatever was logged before the write (a reclaim's
    /// remapping of the zone, say) is then in the log before the write is acknowledged, as
    /// it would be before a record of the write's own.
    pub fn last_record_seq(&self) -> u64 {
        self.log.next_seq.saturating_sub(1)
    }

    /// Whether blocks `[b, b + n)` hold every valid block of `zone`.
    pub fn empties(
        &mut self,
        dev: &dyn ZonedDevice,
        zone: ZoneId,
        b: u32,
        n: u32,
    ) -> Result<bool, EngineError> {
        let w = self.zones.get(zone).weight;
        if w == 0 || w > n {
            return Ok(false);
        }
        Ok(self.cache.bits(dev, zone, b, n)?.count_ones() as u32 == w)
    }

    /// Sequential zones outside every chunk that still hold old data (reset lazily).
    pub fn stale_free_zones(&self) -> Vec<ZoneId> {
        self.zones
            .iter()
            .filter(|(_, zi)| {
                zi.seq
                    && zi.wp != 0
                    && matches!(zi.role, Role::Free | Role::Reserved | Role::PendingFree)
            })
            .map(|(z, _)| z)
            .collect()
    }

    // In-memory zone state that no record describes: device facts and allocation.

    /// `zone` was read or written now (victim choice, busy-reclaim cool-down).
    pub fn touch(&mut self, zone: ZoneId) {
        self.zones.touch(zone);
    }

    /// The device's write pointer of `zone`, after a write, reset or report.
    pub fn set_wp(&mut self, zone: ZoneId, wp: u32) {
        self.zones.set_wp(zone, wp);
    }

    /// The device reports `zone` offline (`Role::Offline`) or read-only: retired for good.
    pub fn retire(&mut self, zone: ZoneId, role: Role) {
        self.zones.retire(zone, role);
    }

    /// A zone taken for a chunk but named by no record left it (retired, or given back).
    pub fn disown(&mut self, zone: ZoneId) {
        self.zones.disown(zone);
    }

    /// A free conventional zone for `chunk` as `role`.
    pub fn alloc_conv(&mut self, role: Role, chunk: ChunkId) -> Option<ZoneId> {
        self.zones.alloc_conv(role, chunk)
    }

    /// A free sequential zone for `chunk` as `role`.
    pub fn alloc_seq(&mut self, role: Role, chunk: ChunkId) -> Option<ZoneId> {
        self.zones.alloc_seq(role, chunk)
    }

    /// A sequential reclaim destination for `chunk`: a free one, else a reserved one.
    pub fn alloc_seq_reclaim(&mut self, chunk: ChunkId) -> Option<ZoneId> {
        self.zones.alloc_seq_reclaim(chunk)
    }

    /// A zone allocated but named by no record yet goes back to its pool.
    pub fn give_back(&mut self, zone: ZoneId) {
        self.zones.give_back(zone);
    }

    /// A mapping change: the map entry and, live, the owner and role of the zones involved.
    fn set_mapping(&mut self, chunk: ChunkId, new: Mapping, ctx: Ctx) {
        let old = self.cache.mapping(chunk);
        self.cache.set_map(chunk, new);
        if ctx == Ctx::Live {
            let (leaving, taking) = record::owner_changes(old, new);
            for z in leaving {
                self.zones.disown(z);
            }
            for (z, role) in taking {
                self.zones.own(z, role, chunk);
            }
        }
    }

    /// A zone's blocks are all invalid and it belongs to no chunk; live, it is reusable once
    /// the record saying so (`seq`) is durable.
    fn free_zone(
        &mut self,
        dev: &dyn ZonedDevice,
        zone: ZoneId,
        seq: u64,
        ctx: Ctx,
    ) -> Result<(), EngineError> {
        if self.zones.get(zone).weight > 0 {
            let zb = self.zones.zone_blocks();
            self.cache.set_range(dev, zone, 0, zb, false)?;
        }
        self.zones.clear_weight(zone);
        if ctx == Ctx::Live {
            self.zones.release(zone, seq);
        }
        Ok(())
    }

    /// Byte offset of `block` of `zone` on the device.
    fn block_offset(&self, zone: ZoneId, block: u32) -> u64 {
        let zb = self.zones.zone_blocks() as u64;
        (zone.0 as u64 * zb + block as u64) * BLOCK as u64
    }

    /// Zone and log figures for `zonedd status`.
    pub fn fill_stats(&self, s: &mut EngineStats) {
        let z = &self.zones;
        s.zones_total = z.len() as u64;
        s.zones_free = (z.nr_free_conv() + z.nr_free_seq()) as u64;
        s.zones_free_conventional = z.nr_free_conv() as u64;
        s.zones_free_sequential = z.nr_free_seq() as u64;
        s.zones_mapped = z.count(Role::Data);
        s.zones_buffer = z.count(Role::Buffer);
        s.zones_reserved = z.nr_reserved_free() as u64;
        s.zones_pending_free = z.nr_pending_free() as u64;
        s.zones_meta = z.count(Role::Meta);
        s.zones_offline = z.count(Role::Offline) + z.count(Role::Unusable);
        s.zones_read_only = z.count(Role::ReadOnly);
        s.chunks_total = self.cache.nr_chunks() as u64;
        s.chunks_mapped = self
            .cache
            .mappings()
            .filter(|(_, m)| m.dzone.is_some())
            .count() as u64;
        s.log_block_writes = self.log.blocks_written;
        s.metadata_mem_bytes = (self.cache.mem_bytes() + z.mem_bytes()) as u64;
        s.cached_bitmap_blocks = self.cache.nr_cached() as u64;
    }

    /// Diagnostics: a chunk's mapping and its zones, one line.
    pub fn describe_chunk(&self, chunk: ChunkId) -> String {
        let m = self.cache.mapping(chunk);
        let z = |z: Option<ZoneId>| match z {
            None => "-".to_string(),
            Some(z) => format!("{z}:{:?}", self.zones.get(z)),
        };
        format!(
            "chunk {chunk}: dzone {} bzone {} (log epoch {}, next seq {})",
            z(m.dzone),
            z(m.bzone),
            self.log.epoch,
            self.log.next_seq
        )
    }

    /// The in-memory invariants: weights match bitmaps, no block valid in both zones of a
    /// chunk, nothing valid past a sequential write pointer, a mapped zone owned by its
    /// chunk. The caller holds every chunk lock.
    pub fn check_invariants(&mut self, dev: &dyn ZonedDevice) -> Result<(), String> {
        let zb = self.zones.zone_blocks();
        for z in (0..self.zones.len()).map(ZoneId) {
            let zi = self.zones.get(z);
            if zi.role == Role::Meta {
                continue;
            }
            let v = self.cache.bits(dev, z, 0, zb).map_err(|e| e.to_string())?;
            let w = v.count_ones() as u32;
            if w != zi.weight {
                return Err(format!(
                    "zone {z}: weight {} but {w} bits ({zi:?})",
                    zi.weight
                ));
            }
            if zi.seq && v[zi.wp as usize..].any() {
                return Err(format!("zone {z}: bits past wp ({zi:?})"));
            }
        }
        let maps: Vec<(ChunkId, Mapping)> = self.cache.mappings().collect();
        for (c, m) in maps {
            if let (Some(d), Some(b)) = (m.dzone, m.bzone) {
                let a = self.cache.bits(dev, d, 0, zb).map_err(|e| e.to_string())?;
                let b = self.cache.bits(dev, b, 0, zb).map_err(|e| e.to_string())?;
                if let Some(k) = (a & b).first_one() {
                    return Err(format!("chunk {c}: block {k} valid in both zones"));
                }
            }
            for z in m.zones() {
                if self.zones.get(z).chunk != Some(c) {
                    return Err(format!("chunk {c}: zone {z} owned by another chunk"));
                }
            }
        }
        Ok(())
    }
}

// Logged changes. Each builds its records, applies them and appends them under the state
// lock (`durability::log_op`), and returns the last record's sequence number.

/// `chunk` now maps to `map`.
pub(super) fn map_chunk(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    chunk: ChunkId,
    map: Mapping,
) -> Result<u64, EngineError> {
    durability::log_op(inner, st, &[MapRec { chunk, map }.into()])
}

/// `crcs.len()` blocks at `block` of `zone` were written and are valid now, the same blocks
/// of `other` invalid.
pub(super) fn written(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    zone: ZoneId,
    block: u32,
    other: Option<ZoneId>,
    crcs: Vec<u32>,
) -> Result<u64, EngineError> {
    durability::log_op(inner, st, &[write_rec(zone, block, other, crcs)])
}

fn write_rec(zone: ZoneId, block: u32, other: Option<ZoneId>, crcs: Vec<u32>) -> Rec {
    WriteRec {
        zone,
        block,
        other,
        crcs,
    }
    .into()
}

/// [`written`] for a record that goes to the log ahead of its data (a write plan's
/// overwrite of blocks whose records are not flushed), from a caller that must not wait
/// for a commit: `None` when the log half has no room for it (nothing appended).
pub(super) fn written_ahead_if_room(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    zone: ZoneId,
    block: u32,
    other: Option<ZoneId>,
    crcs: Vec<u32>,
) -> Result<Option<u64>, EngineError> {
    durability::log_op_if_room(inner, st, &[write_rec(zone, block, other, crcs)])
}

/// `count` blocks at `block` of every zone of `map` hold nothing any more.
pub(super) fn invalidated(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    map: Mapping,
    block: u32,
    count: u32,
) -> Result<u64, EngineError> {
    let recs: Vec<Rec> = map
        .zones()
        .map(|zone| InvalidateRec { zone, block, count }.into())
        .collect();
    durability::log_op(inner, st, &recs)
}

/// Reclaim copied `srcs` into `dst` (durably): `chunk` maps to `map` and the sources are
/// freed.
pub(super) fn reclaimed(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    chunk: ChunkId,
    dst: ZoneId,
    srcs: Vec<ZoneId>,
    map: Mapping,
) -> Result<u64, EngineError> {
    let rec = ReclaimRec {
        chunk,
        dst,
        srcs,
        map,
    };
    durability::log_op(inner, st, &[rec.into()])
}

/// Free the chunk's zones that hold no valid block any more (a buffer zone first, then a
/// data zone without buffer). Returns the sequence number of the record if one was logged.
pub(super) fn put_chunk(
    inner: &Inner,
    st: &mut MutexGuard<'_, State>,
    chunk: ChunkId,
) -> Result<Option<u64>, EngineError> {
    let m = &st.meta;
    let old = m.mapping(chunk);
    let Some(dz) = old.dzone else {
        return Ok(None);
    };
    let empty = |z: ZoneId| m.zone(z).weight == 0;
    // A retired zone leaves the chunk without a Free record: it is never reused.
    let free = |z: ZoneId| (!m.is_retired(z)).then(|| Rec::from(FreeRec { zone: z }));
    let mut recs: Vec<Rec> = Vec::new();
    let mut new = old;
    if let Some(b) = old.bzone.filter(|&b| empty(b)) {
        recs.extend(free(b));
        new.bzone = None;
    }
    if new.bzone.is_none() && empty(dz) {
        recs.extend(free(dz));
        new = Mapping::UNMAPPED;
    }
    if new == old {
        return Ok(None);
    }
    recs.insert(0, MapRec { chunk, map: new }.into());
    Ok(Some(durability::log_op(inner, st, &recs)?))
}
