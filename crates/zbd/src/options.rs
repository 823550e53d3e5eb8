//! The shape of an emulated device ([`EmulateOptions`]) and the size syntax of the command
//! line (`64G`, `256M`).

use crate::{Geometry, Result, ZbdError, BLOCK_SIZE};

/// Smallest zone an emulated image accepts (the CLI rule; [`crate::MemDevice`] allows any
/// power of two of at least one block, for fast tests).
pub const MIN_EMULATED_ZONE_SIZE: u64 = 1 << 20;

/// Shape of an emulated host-managed device (image or RAM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmulateOptions {
    /// Emulated capacity in bytes (a multiple of `zone_size`). For an image on a block
    /// device, 0 means "as many zones as fit".
    pub size: u64,
    /// Bytes per zone: a power of two, a multiple of 4096.
    pub zone_size: u64,
    /// Number of conventional zones (at the start of the device). With `size` 0 on a block
    /// device, 0 means the default (about 1 %, at least 8) for the size found.
    pub conventional: u32,
    /// Writable bytes per zone; 0 means `zone_size`.
    pub zone_capacity: u64,
    /// 0 = no limit.
    pub max_open: u32,
    /// 0 = no limit.
    pub max_active: u32,
    /// Overwrite an existing file or block device.
    pub force: bool,
}

/// Default zone size of `zonedd emulate`.
pub const DEFAULT_ZONE_SIZE: u64 = 256 << 20;
/// Default max-open limit of `zonedd emulate`.
pub const DEFAULT_MAX_OPEN: u32 = 128;

/// About 1 % conventional zones, at least 8, never more than half the device.
pub fn default_conventional(nr_zones: u32) -> u32 {
    (nr_zones / 100).max(8).min(nr_zones / 2)
}

impl EmulateOptions {
    /// `size` bytes of `zone_size` zones with the `zonedd emulate` defaults (about 1 %
    /// conventional zones, max-open 128, no max-active).
    pub fn new(size: u64, zone_size: u64) -> Self {
        let nr = size.checked_div(zone_size).unwrap_or(0);
        EmulateOptions {
            size,
            zone_size,
            conventional: default_conventional(nr.min(u32::MAX as u64) as u32),
            zone_capacity: 0,
            max_open: DEFAULT_MAX_OPEN,
            max_active: 0,
            force: false,
        }
    }

    /// Checks the options and gives the geometry and the number of conventional zones.
    /// `min_zone` is [`MIN_EMULATED_ZONE_SIZE`] for images.
    pub fn geometry(&self, min_zone: u64) -> Result<(Geometry, u32)> {
        let bad = |m: String| Err(ZbdError::Invalid(m));
        let zs = self.zone_size;
        if zs == 0 || !zs.is_power_of_two() {
            return bad(format!("zone size {} is not a power of two", fmt_size(zs)));
        }
        if !zs.is_multiple_of(BLOCK_SIZE) {
            return bad(format!(
                "zone size {} is not a multiple of 4096",
                fmt_size(zs)
            ));
        }
        if zs < min_zone {
            return bad(format!(
                "zone size {} is below the minimum {}",
                fmt_size(zs),
                fmt_size(min_zone)
            ));
        }
        if self.size == 0 {
            return bad("size is 0".into());
        }
        if !self.size.is_multiple_of(zs) {
            return bad(format!(
                "size {} is not a multiple of the zone size {}",
                fmt_size(self.size),
                fmt_size(zs)
            ));
        }
        let nr = self.size / zs;
        if nr > u32::MAX as u64 {
            return bad(format!("{nr} zones is too many"));
        }
        let nr = nr as u32;
        if self.conventional > nr {
            return bad(format!(
                "{} conventional zones but the device has only {nr} zones",
                self.conventional
            ));
        }
        let cap = if self.zone_capacity == 0 {
            zs
        } else {
            self.zone_capacity
        };
        if cap % BLOCK_SIZE != 0 || cap > zs {
            return bad(format!(
                "zone capacity {} must be a multiple of 4096 and at most the zone size {}",
                fmt_size(cap),
                fmt_size(zs)
            ));
        }
        if self.max_active != 0 && self.max_open > self.max_active {
            return bad(format!(
                "max-open {} is above max-active {}",
                self.max_open, self.max_active
            ));
        }
        Ok((
            Geometry {
                zone_size: zs,
                zone_capacity: cap,
                nr_zones: nr,
                block_size: BLOCK_SIZE as u32,
                max_open_zones: self.max_open,
                max_active_zones: self.max_active,
            },
            self.conventional,
        ))
    }
}

/// Parses `4096`, `64K`, `256M`, `64G`, `10T` (binary units; an optional trailing `B` or
/// `iB` is accepted: `256MiB`).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                'P' => 50,
                _ => {
                    return Err(format!(
                        "bad size {s:?}: unknown unit {c:?} (use K, M, G, T)"
                    ))
                }
            };
            (&t[..t.len() - 1], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num.parse().map_err(|_| {
        format!("bad size {s:?}: expected a number with an optional K/M/G/T suffix")
    })?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("bad size {s:?}: too large"))
}

/// `268435456` -> `256M` when exact, else bytes.
pub fn fmt_size(n: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("64g"), Ok(64 << 30));
        assert_eq!(parse_size("10T"), Ok(10 << 40));
        // what `mem:SIZE` took before it used this parser
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("x").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(fmt_size(256 << 20), "256M");
        assert_eq!(fmt_size(4097), "4097");
    }

    #[test]
    fn defaults_and_rules() {
        let o = EmulateOptions::new(64 << 30, 256 << 20);
        let (g, conv) = o.geometry(MIN_EMULATED_ZONE_SIZE).unwrap();
        assert_eq!(g.nr_zones, 256);
        assert_eq!(conv, 8);
        assert_eq!(g.max_open_zones, 128);
        let o = EmulateOptions::new(10 << 40, 256 << 20);
        assert_eq!(o.conventional, 409);
        let mut o = EmulateOptions::new(4 << 30, 48 << 20);
        assert!(o.geometry(MIN_EMULATED_ZONE_SIZE).is_err());
        o.zone_size = 512 << 10;
        assert!(o.geometry(MIN_EMULATED_ZONE_SIZE).is_err());
        o.zone_size = 64 << 20;
        o.size = (4 << 30) + 4096;
        assert!(o.geometry(MIN_EMULATED_ZONE_SIZE).is_err());
        o.size = 4 << 30;
        o.conventional = 65;
        assert!(o.geometry(MIN_EMULATED_ZONE_SIZE).is_err());
    }
}
