//! The zone state machine shared by the emulated backends ([`crate::Emulated`],
//! [`crate::MemDevice`]): conditions, write pointers and the open/active accounting of a
//! host-managed drive, with no I/O of its own.
//!
//! Rules (ZBC/ZAC, as the kernel's null_blk applies them):
//! - A write to a sequential zone must start at the write pointer and end at or before the
//!   zone capacity; writes to full, read-only and offline zones fail with EIO.
//! - A write to an empty or closed zone opens it implicitly. At the max-open limit the zone
//!   implicitly opened longest ago is implicitly closed first; if every open zone was opened
//!   explicitly the write fails with ETOOMANYREFS. Going from empty to open needs an active
//!   slot: at the max-active limit that fails with EOVERFLOW.
//! - Explicit open takes the same resources; close returns a zone to closed (or empty when
//!   nothing was written); finish makes it full; reset makes it empty.
//! - After a restart (power-on) open zones are closed, or empty when nothing was written.
//!
//! Every mutating call returns the zones whose state changed, so a persistent backend can
//! write exactly those table entries.

use crate::{Geometry, Result, ZbdError, Zone, ZoneCondition, ZoneOp, ZoneType, BLOCK_SIZE};
use std::collections::BTreeMap;

/// Condition and write pointer of one zone. `wp` is in bytes from the zone start; a full
/// zone has `wp == zone_size` (as the kernel reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZoneState {
    pub cond: ZoneCondition,
    pub wp: u64,
}

/// Zones whose state changed (table entries to persist).
pub(crate) type Changed = Vec<u32>;

pub(crate) fn eio(what: impl Into<String>) -> ZbdError {
    ZbdError::device(what, libc::EIO)
}

/// Checks alignment and bounds of an I/O and returns its zone. Crossing a zone end is EIO
/// (the drive rejects it); unaligned or out-of-range requests are invalid.
pub(crate) fn check_io(geo: &Geometry, offset: u64, len: u64, what: &str) -> Result<u32> {
    if !offset.is_multiple_of(BLOCK_SIZE) || !len.is_multiple_of(BLOCK_SIZE) {
        return Err(ZbdError::Invalid(format!(
            "{what} of {len} bytes at {offset:#x}: not aligned to {BLOCK_SIZE} bytes"
        )));
    }
    let end = offset.saturating_add(len);
    if end > geo.capacity() {
        return Err(ZbdError::Invalid(format!(
            "{what} of {len} bytes at {offset:#x}: beyond the device end {:#x}",
            geo.capacity()
        )));
    }
    let zone = geo.zone_of(offset);
    if len > 0 && geo.zone_of(end - 1) != zone {
        return Err(eio(format!(
            "{what} of {len} bytes at {offset:#x}: crosses the end of zone {zone}"
        )));
    }
    Ok(zone)
}

pub(crate) struct ZoneStates {
    pub geo: Geometry,
    pub nr_conv: u32,
    pub zones: Vec<ZoneState>,
    /// Implicitly open zones by the order they were opened (stamp -> zone).
    imp_open: BTreeMap<u64, u32>,
    stamps: Vec<u64>,
    next_stamp: u64,
    nr_open: u32,
    nr_active: u32,
}

impl ZoneStates {
    /// Builds the state from stored entries, applying power-on semantics (open -> closed).
    pub fn new(geo: Geometry, nr_conv: u32, stored: Vec<ZoneState>) -> Self {
        let mut s = ZoneStates {
            geo,
            nr_conv,
            zones: stored,
            imp_open: BTreeMap::new(),
            stamps: vec![0; geo.nr_zones as usize],
            next_stamp: 1,
            nr_open: 0,
            nr_active: 0,
        };
        for z in s.zones.iter_mut() {
            if z.cond.is_open() {
                z.cond = if z.wp == 0 {
                    ZoneCondition::Empty
                } else {
                    ZoneCondition::Closed
                };
            }
            if z.cond == ZoneCondition::Closed {
                s.nr_active += 1;
            }
        }
        s
    }

    /// A fresh device: conventional zones first, every sequential zone empty.
    pub fn fresh(geo: Geometry, nr_conv: u32) -> Self {
        let zones = (0..geo.nr_zones)
            .map(|z| ZoneState {
                cond: if z < nr_conv {
                    ZoneCondition::NotWp
                } else {
                    ZoneCondition::Empty
                },
                wp: 0,
            })
            .collect();
        Self::new(geo, nr_conv, zones)
    }

    pub fn zone_type(&self, zone: u32) -> ZoneType {
        if zone < self.nr_conv {
            ZoneType::Conventional
        } else {
            ZoneType::SeqWriteRequired
        }
    }

    pub fn report(&self, first: u32, nr: u32) -> Vec<Zone> {
        let end = first.saturating_add(nr).min(self.geo.nr_zones);
        (first.min(end)..end).map(|z| self.zone(z)).collect()
    }

    pub fn zone(&self, z: u32) -> Zone {
        let st = self.zones[z as usize];
        let start = self.geo.zone_start(z);
        let zone_type = self.zone_type(z);
        Zone {
            id: z,
            start,
            len: self.geo.zone_size,
            capacity: self.geo.zone_capacity,
            wp: if zone_type.is_sequential() {
                start + st.wp
            } else {
                start
            },
            zone_type,
            cond: st.cond,
        }
    }

    /// End (bytes from the zone start) of the readable data; everything past reads as zeros.
    pub fn read_limit(&self, z: u32) -> Result<u64> {
        let st = self.zones[z as usize];
        match st.cond {
            ZoneCondition::Offline => Err(eio(format!("read from offline zone {z}"))),
            _ if z < self.nr_conv => Ok(self.geo.zone_size),
            ZoneCondition::Full => Ok(self.geo.zone_capacity),
            _ => Ok(st.wp.min(self.geo.zone_capacity)),
        }
    }

    fn stamp_open(&mut self, z: u32) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.stamps[z as usize] = stamp;
        self.imp_open.insert(stamp, z);
    }

    fn unstamp(&mut self, z: u32) {
        self.imp_open.remove(&self.stamps[z as usize]);
    }

    /// Leaves the current condition (releasing what it holds) for `to`.
    fn transition(&mut self, z: u32, to: ZoneCondition) {
        let from = self.zones[z as usize].cond;
        if from == to {
            return;
        }
        if from == ZoneCondition::ImplicitOpen {
            self.unstamp(z);
        }
        if from.is_open() {
            self.nr_open -= 1;
        }
        if from.is_active() {
            self.nr_active -= 1;
        }
        if to.is_open() {
            self.nr_open += 1;
        }
        if to.is_active() {
            self.nr_active += 1;
        }
        if to == ZoneCondition::ImplicitOpen {
            self.stamp_open(z);
        }
        self.zones[z as usize].cond = to;
    }

    /// Makes room to open `z` (empty or closed): active slot, then open slot (implicitly
    /// closing the oldest implicitly open zone when at the limit).
    fn acquire_open(&mut self, z: u32, changed: &mut Changed) -> Result<()> {
        let cond = self.zones[z as usize].cond;
        let max_active = self.geo.max_active_zones;
        if cond == ZoneCondition::Empty && max_active != 0 && self.nr_active >= max_active {
            return Err(ZbdError::device(
                format!("open zone {z}: {max_active} zones already active"),
                libc::EOVERFLOW,
            ));
        }
        let max_open = self.geo.max_open_zones;
        if max_open != 0 && self.nr_open >= max_open {
            let Some((_, &victim)) = self.imp_open.iter().next() else {
                return Err(ZbdError::device(
                    format!("open zone {z}: {max_open} zones already explicitly open"),
                    libc::ETOOMANYREFS,
                ));
            };
            let to = if self.zones[victim as usize].wp == 0 {
                ZoneCondition::Empty
            } else {
                ZoneCondition::Closed
            };
            // Closing an implicitly open empty zone frees its active slot too.
            self.transition(victim, to);
            changed.push(victim);
        }
        Ok(())
    }

    /// Validates a write of `len` bytes at `rel` (from the zone start) and opens the zone if
    /// needed. The write pointer moves only in [`ZoneStates::complete_write`].
    pub fn prepare_write(&mut self, z: u32, rel: u64, len: u64) -> Result<Changed> {
        let mut changed = Vec::new();
        let st = self.zones[z as usize];
        let what = || {
            format!(
                "write of {len} bytes at {:#x} (zone {z})",
                self.geo.zone_start(z) + rel
            )
        };
        match st.cond {
            ZoneCondition::Offline => return Err(eio(format!("{}: zone is offline", what()))),
            ZoneCondition::ReadOnly => return Err(eio(format!("{}: zone is read-only", what()))),
            ZoneCondition::NotWp => return Ok(changed),
            ZoneCondition::Full => return Err(eio(format!("{}: zone is full", what()))),
            _ => {}
        }
        if rel != st.wp {
            return Err(eio(format!(
                "{}: not at the write pointer {:#x}",
                what(),
                self.geo.zone_start(z) + st.wp
            )));
        }
        if rel + len > self.geo.zone_capacity {
            return Err(eio(format!("{}: past the zone capacity", what())));
        }
        if matches!(st.cond, ZoneCondition::Empty | ZoneCondition::Closed) {
            self.acquire_open(z, &mut changed)?;
            self.transition(z, ZoneCondition::ImplicitOpen);
            changed.push(z);
        }
        Ok(changed)
    }

    /// Advances the write pointer after the data of a prepared write is in place.
    pub fn complete_write(&mut self, z: u32, len: u64) -> Changed {
        if z < self.nr_conv {
            return Vec::new();
        }
        let cap = self.geo.zone_capacity;
        let zs = self.geo.zone_size;
        let st = &mut self.zones[z as usize];
        st.wp += len;
        if st.wp >= cap {
            st.wp = zs;
            self.transition(z, ZoneCondition::Full);
        } else if st.cond == ZoneCondition::Empty {
            // Implicitly closed while this write was in flight (it was still at wp 0).
            self.transition(z, ZoneCondition::Closed);
        }
        vec![z]
    }

    /// Applies a zone management operation.
    pub fn mgmt(&mut self, op: ZoneOp, z: u32) -> Result<Changed> {
        let mut changed = Vec::new();
        if z >= self.geo.nr_zones {
            return Err(ZbdError::Invalid(format!(
                "{op} zone {z}: the device has {} zones",
                self.geo.nr_zones
            )));
        }
        let st = self.zones[z as usize];
        let bad = |why: &str| Err(eio(format!("{op} zone {z}: {why}")));
        match st.cond {
            ZoneCondition::NotWp => return bad("conventional zone"),
            ZoneCondition::Offline => return bad("zone is offline"),
            ZoneCondition::ReadOnly => return bad("zone is read-only"),
            _ => {}
        }
        use ZoneCondition as C;
        match (op, st.cond) {
            (ZoneOp::Reset, C::Empty) => {}
            (ZoneOp::Reset, _) => {
                self.transition(z, C::Empty);
                self.zones[z as usize].wp = 0;
                changed.push(z);
            }
            (ZoneOp::Open, C::ExplicitOpen) => {}
            (ZoneOp::Open, C::ImplicitOpen) => {
                self.transition(z, C::ExplicitOpen);
                changed.push(z);
            }
            (ZoneOp::Open, C::Empty | C::Closed) => {
                self.acquire_open(z, &mut changed)?;
                self.transition(z, C::ExplicitOpen);
                changed.push(z);
            }
            (ZoneOp::Open, _) => return bad("zone is full"),
            (ZoneOp::Close, C::Closed) => {}
            (ZoneOp::Close, C::ImplicitOpen | C::ExplicitOpen) => {
                let to = if st.wp == 0 { C::Empty } else { C::Closed };
                self.transition(z, to);
                changed.push(z);
            }
            (ZoneOp::Close, C::Empty) => return bad("zone is empty"),
            (ZoneOp::Close, _) => return bad("zone is full"),
            (ZoneOp::Finish, C::Full) => {}
            (ZoneOp::Finish, _) => {
                self.transition(z, C::Full);
                self.zones[z as usize].wp = self.geo.zone_size;
                changed.push(z);
            }
        }
        Ok(changed)
    }

    /// Test hook: force a zone read-only or offline, or bring it back (empty for a
    /// sequential zone, not-write-pointer for a conventional one).
    pub fn set_condition(&mut self, z: u32, cond: ZoneCondition) -> Result<Changed> {
        if z >= self.geo.nr_zones {
            return Err(ZbdError::Invalid(format!("zone {z} does not exist")));
        }
        let conv = z < self.nr_conv;
        let ok = match cond {
            ZoneCondition::ReadOnly | ZoneCondition::Offline => true,
            ZoneCondition::Empty => !conv,
            ZoneCondition::NotWp => conv,
            _ => false,
        };
        if !ok {
            return Err(ZbdError::Invalid(format!(
                "zone {z} cannot be set to {cond:?} (only read-only, offline, or back to {})",
                if conv { "not-wp" } else { "empty" }
            )));
        }
        self.transition(z, cond);
        if cond == ZoneCondition::Empty {
            self.zones[z as usize].wp = 0;
        }
        Ok(vec![z])
    }

    /// Sequential zones a reset-all has to reset: written and still writable.
    pub fn zones_to_reset(&self) -> Vec<u32> {
        (self.nr_conv..self.geo.nr_zones)
            .filter(|&z| {
                !matches!(
                    self.zones[z as usize].cond,
                    ZoneCondition::Empty | ZoneCondition::ReadOnly | ZoneCondition::Offline
                )
            })
            .collect()
    }

    #[cfg(test)]
    pub fn counts(&self) -> (u32, u32) {
        (self.nr_open, self.nr_active)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(max_open: u32, max_active: u32) -> Geometry {
        Geometry {
            zone_size: 1 << 20,
            zone_capacity: 1 << 20,
            nr_zones: 16,
            block_size: 4096,
            max_open_zones: max_open,
            max_active_zones: max_active,
        }
    }

    #[test]
    fn implicit_open_at_limit_closes_oldest_implicit() {
        let mut s = ZoneStates::fresh(geo(2, 0), 2);
        for z in [2, 3] {
            s.prepare_write(z, 0, 4096).unwrap();
            s.complete_write(z, 4096);
        }
        let ch = s.prepare_write(4, 0, 4096).unwrap();
        assert_eq!(ch, vec![2, 4]);
        assert_eq!(s.zones[2].cond, ZoneCondition::Closed);
        assert_eq!(s.counts(), (2, 3));
    }

    #[test]
    fn power_on_closes_open_zones() {
        let mut s = ZoneStates::fresh(geo(0, 0), 0);
        s.prepare_write(0, 0, 4096).unwrap();
        s.complete_write(0, 4096);
        s.mgmt(ZoneOp::Open, 1).unwrap();
        let s2 = ZoneStates::new(s.geo, 0, s.zones.clone());
        assert_eq!(s2.zones[0].cond, ZoneCondition::Closed);
        assert_eq!(s2.zones[1].cond, ZoneCondition::Empty);
        assert_eq!(s2.counts(), (0, 1));
    }
}
