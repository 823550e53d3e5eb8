//! The kernel's ublk features and the one place zonedd decides which `UBLK_F_*` flags it asks
//! for.
//!
//! At create and recover the daemon asks the driver what it offers (GET_FEATURES, Linux 6.5+),
//! checks that everything zonedd needs is there, and asks for those flags only. The table
//! [`POLICY`] says, for every flag the uapi headers know, whether zonedd needs it and if not
//! why it leaves it alone; newer kernels' zero copy, automatic buffer registration, per-io
//! daemons and batched I/O are all "not used", so a kernel that offers them is served the same
//! way as one that does not. A kernel without GET_FEATURES gets the required flags, and the
//! flags the driver accepted at ADD_DEV (it drops the ones it does not know) are checked
//! instead ([`check_accepted`]).

use libublk::sys;
use serde_json::{json, Value};

/// What zonedd does with one `UBLK_F_*` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Asked for; a kernel that lacks it is refused with [`choose`]'s error.
    Required,
    /// Never asked for, whatever the kernel offers.
    NotUsed,
}

/// The two kinds of device zonedd makes: a random-write block device over the engine (or a
/// test target: `create`), and an emulated image exposed as a zoned device (`expose`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Block,
    Zoned,
}

/// One known flag: its bit, its name without `UBLK_F_`, zonedd's use for each kind of device,
/// and why.
pub struct Flag {
    pub bit: u64,
    pub name: &'static str,
    pub use_: Use,
    pub zoned_use: Use,
    pub why: &'static str,
}

const fn flag(bit: u64, name: &'static str, use_: Use, zoned_use: Use, why: &'static str) -> Flag {
    Flag {
        bit,
        name,
        use_,
        zoned_use,
        why,
    }
}

impl Flag {
    fn use_for(&self, kind: Kind) -> Use {
        match kind {
            Kind::Block => self.use_,
            Kind::Zoned => self.zoned_use,
        }
    }
}

/// Every flag of the uapi header, in bit order, with zonedd's choice.
pub const POLICY: &[Flag] = &[
    flag(sys::UBLK_F_SUPPORT_ZERO_COPY as u64, "SUPPORT_ZERO_COPY", Use::NotUsed, Use::NotUsed,
        "I/O goes through zonedd's own per-tag buffers (the engine remaps, it never passes a request through)"),
    flag(sys::UBLK_F_URING_CMD_COMP_IN_TASK as u64, "URING_CMD_COMP_IN_TASK", Use::NotUsed, Use::NotUsed,
        "the driver always works this way and sets it itself"),
    flag(sys::UBLK_F_NEED_GET_DATA as u64, "NEED_GET_DATA", Use::NotUsed, Use::NotUsed,
        "write buffers are allocated up front, one per tag"),
    flag(sys::UBLK_F_USER_RECOVERY as u64, "USER_RECOVERY", Use::Required, Use::NotUsed,
        "the device stays (quiesced) when its daemon dies, for `zonedd recover` (not for an exposed image: a re-issued write could find its write pointer moved)"),
    flag(sys::UBLK_F_USER_RECOVERY_REISSUE as u64, "USER_RECOVERY_REISSUE", Use::Required, Use::NotUsed,
        "requests the dead daemon held are re-issued to its successor (a write done twice is harmless)"),
    flag(sys::UBLK_F_UNPRIVILEGED_DEV as u64, "UNPRIVILEGED_DEV", Use::NotUsed, Use::NotUsed,
        "the daemon runs as root"),
    flag(sys::UBLK_F_CMD_IOCTL_ENCODE as u64, "CMD_IOCTL_ENCODE", Use::NotUsed, Use::NotUsed,
        "libublk always sends the ioctl-encoded commands; the driver sets the flag itself"),
    flag(sys::UBLK_F_USER_COPY as u64, "USER_COPY", Use::NotUsed, Use::Required,
        "block devices: data moves through the mmapped per-tag buffers; exposed images: ZONED needs it, data moves by pread/pwrite on /dev/ublkcN"),
    flag(sys::UBLK_F_ZONED as u64, "ZONED", Use::NotUsed, Use::Required,
        "`create` exposes a conventional device (the zones are its backend's); `expose` a zoned one"),
    flag(sys::UBLK_F_USER_RECOVERY_FAIL_IO as u64, "USER_RECOVERY_FAIL_IO", Use::NotUsed, Use::NotUsed,
        "I/O waits for `zonedd recover` instead of failing while no daemon runs"),
    flag(sys::UBLK_F_UPDATE_SIZE as u64, "UPDATE_SIZE", Use::NotUsed, Use::NotUsed,
        "the size is fixed by the on-disk format"),
    flag(sys::UBLK_F_AUTO_BUF_REG as u64, "AUTO_BUF_REG", Use::NotUsed, Use::NotUsed,
        "zero copy (see SUPPORT_ZERO_COPY)"),
    flag(sys::UBLK_F_QUIESCE as u64, "QUIESCE", Use::NotUsed, Use::NotUsed,
        "an upgrade is kill + recover; zonedd never quiesces a live device"),
    flag(sys::UBLK_F_PER_IO_DAEMON as u64, "PER_IO_DAEMON", Use::NotUsed, Use::NotUsed,
        "one thread serves each queue"),
    flag(sys::UBLK_F_BUF_REG_OFF_DAEMON as u64, "BUF_REG_OFF_DAEMON", Use::NotUsed, Use::NotUsed,
        "zero copy (see SUPPORT_ZERO_COPY)"),
    flag(sys::UBLK_F_BATCH_IO as u64, "BATCH_IO", Use::NotUsed, Use::NotUsed,
        "libublk's batch queue is another I/O loop than zonedd's"),
    flag(sys::UBLK_F_INTEGRITY as u64, "INTEGRITY", Use::NotUsed, Use::NotUsed,
        "no integrity metadata"),
    flag(sys::UBLK_F_SAFE_STOP_DEV as u64, "SAFE_STOP_DEV", Use::NotUsed, Use::NotUsed,
        "`zonedd delete` stops the device through its daemon"),
    flag(sys::UBLK_F_NO_AUTO_PART_SCAN as u64, "NO_AUTO_PART_SCAN", Use::NotUsed, Use::NotUsed,
        "partitions on a zonedd device appear as on any disk"),
    flag(sys::UBLK_F_SHMEM_ZC as u64, "SHMEM_ZC", Use::NotUsed, Use::NotUsed,
        "zero copy (see SUPPORT_ZERO_COPY)"),
];

/// The flags a device of `kind` cannot do without.
pub fn required(kind: Kind) -> u64 {
    POLICY
        .iter()
        .filter(|f| f.use_for(kind) == Use::Required)
        .fold(0, |m, f| m | f.bit)
}

/// The names of the bits set in `mask`, in bit order; bits no header names are `bit N`.
pub fn names(mask: u64) -> Vec<String> {
    (0..64)
        .map(|i| 1u64 << i)
        .filter(|b| mask & b != 0)
        .map(|b| match POLICY.iter().find(|f| f.bit == b) {
            Some(f) => f.name.to_string(),
            None => format!("bit {}", b.trailing_zeros()),
        })
        .collect()
}

fn missing_error(missing: u64, what: &str, have: u64) -> String {
    let why: Vec<String> = POLICY
        .iter()
        .filter(|f| missing & f.bit != 0)
        .map(|f| format!("{} ({})", f.name, f.why))
        .collect();
    format!(
        "the kernel's ublk driver lacks {} ({what} {have:#x}): zonedd needs it",
        why.join(", ")
    )
}

/// The `UBLK_F_*` flags to create a device with, given what GET_FEATURES said (`None`: the
/// kernel predates the command). An error names the required flags the kernel lacks.
pub fn choose(kernel: Option<u64>, kind: Kind) -> Result<u64, String> {
    let want = required(kind);
    match kernel {
        Some(k) if want & !k != 0 => Err(missing_error(want & !k, "it offers", k)),
        _ => Ok(want),
    }
}

/// After ADD_DEV: the driver silently drops flags it does not know, so a required flag
/// missing from the device's flags (`accepted`) means the kernel cannot do it.
pub fn check_accepted(requested: u64, accepted: u64, kind: Kind) -> Result<(), String> {
    let missing = requested & required(kind) & !accepted;
    if missing != 0 {
        return Err(missing_error(missing, "the device got flags", accepted));
    }
    Ok(())
}

/// What a device runs with: the driver's offer, the flags asked for, and the flags the
/// device ended up with (the driver adds some of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UblkFeatures {
    pub kernel: Option<u64>,
    pub requested: u64,
    pub device: u64,
}

impl UblkFeatures {
    /// The `ublk` section of `zonedd status --json`.
    pub fn to_json(&self) -> Value {
        json!({
            "kernel_features": self.kernel.map(|k| format!("{k:#x}")),
            "kernel_features_names": self.kernel.map(names),
            "flags_used": format!("{:#x}", self.requested),
            "flags_used_names": names(self.requested),
            "device_flags": format!("{:#x}", self.device),
            "device_flags_names": names(self.device),
        })
    }

    /// One log line.
    pub fn describe(&self) -> String {
        let offered = match self.kernel {
            Some(k) => format!("{k:#x} [{}]", names(k).join(" ")),
            None => "unknown (no GET_FEATURES: kernel before 6.5)".into(),
        };
        format!(
            "kernel offers {offered}; zonedd uses {:#x} [{}]; device flags {:#x} [{}]",
            self.requested,
            names(self.requested).join(" "),
            self.device,
            names(self.device).join(" ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECOVERY: u64 = (sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE) as u64;
    /// What Debian's 6.12 and 7.3 kernels offer (GET_FEATURES, measured in the VM): 7.3 has
    /// every bit the header names and one more (bit 20).
    const K612: u64 = 0x1fe;
    const K73: u64 = 0x1f_ffff;

    #[test]
    fn the_table_names_every_bit_once_in_order() {
        for (i, f) in POLICY.iter().enumerate() {
            assert_eq!(f.bit, 1u64 << i, "{} is not bit {i}", f.name);
        }
        assert_eq!(names(1 << 3), ["USER_RECOVERY"]);
        assert_eq!(names(1 << 40 | 1), ["SUPPORT_ZERO_COPY", "bit 40"]);
    }

    #[test]
    fn only_the_recovery_flags_are_used_whatever_the_kernel_offers() {
        assert_eq!(required(Kind::Block), RECOVERY);
        assert_eq!(choose(Some(K612), Kind::Block), Ok(RECOVERY));
        assert_eq!(choose(Some(K73), Kind::Block), Ok(RECOVERY));
        assert_eq!(names(K73).last().map(String::as_str), Some("bit 20"));
        // A kernel offering everything (zero copy, auto buffer registration, batch I/O, ...)
        // still gets the copy path: nothing optional is switched on.
        assert_eq!(choose(Some(u64::MAX), Kind::Block), Ok(RECOVERY));
        // No GET_FEATURES: ask, and check what ADD_DEV accepted.
        assert_eq!(choose(None, Kind::Block), Ok(RECOVERY));
    }

    #[test]
    fn an_exposed_image_asks_for_zoned_and_user_copy_only() {
        let zoned = (sys::UBLK_F_ZONED | sys::UBLK_F_USER_COPY) as u64;
        assert_eq!(required(Kind::Zoned), zoned);
        assert_eq!(choose(Some(K612), Kind::Zoned), Ok(zoned));
        assert_eq!(choose(Some(u64::MAX), Kind::Zoned), Ok(zoned));
        let e = choose(Some(K612 & !(sys::UBLK_F_ZONED as u64)), Kind::Zoned).unwrap_err();
        assert!(
            e.starts_with("the kernel's ublk driver lacks ZONED ("),
            "{e}"
        );
        assert_eq!(check_accepted(zoned, zoned | 0x42, Kind::Zoned), Ok(()));
        assert!(check_accepted(zoned, 0x42, Kind::Zoned).is_err());
    }

    #[test]
    fn a_kernel_without_reissue_is_refused_in_one_line() {
        let k = K612 & !(sys::UBLK_F_USER_RECOVERY_REISSUE as u64);
        let e = choose(Some(k), Kind::Block).unwrap_err();
        assert!(!e.contains('\n'), "{e}");
        assert!(
            e.starts_with("the kernel's ublk driver lacks USER_RECOVERY_REISSUE (requests"),
            "{e}"
        );
        assert!(e.ends_with("(it offers 0x1ee): zonedd needs it"), "{e}");
    }

    #[test]
    fn accepted_flags_are_checked_when_the_offer_is_unknown() {
        // The driver adds flags of its own (IOCTL_ENCODE, COMP_IN_TASK): fine.
        let with_driver_bits = RECOVERY | (1 << 6) | (1 << 1);
        assert_eq!(
            check_accepted(RECOVERY, with_driver_bits, Kind::Block),
            Ok(())
        );
        let e = check_accepted(RECOVERY, 1 << 3 | 1 << 6, Kind::Block).unwrap_err();
        assert!(
            e.starts_with("the kernel's ublk driver lacks USER_RECOVERY_REISSUE"),
            "{e}"
        );
        assert!(e.contains("(the device got flags 0x48)"), "{e}");
    }

    #[test]
    fn status_json_shows_masks_and_names() {
        let f = UblkFeatures {
            kernel: Some(K612),
            requested: RECOVERY,
            device: RECOVERY | 0x42,
        };
        let v = f.to_json();
        assert_eq!(v["kernel_features"], "0x1fe");
        assert_eq!(v["flags_used"], "0x18");
        assert_eq!(
            v["flags_used_names"],
            json!(["USER_RECOVERY", "USER_RECOVERY_REISSUE"])
        );
        assert_eq!(v["device_flags"], "0x5a");
        let none = UblkFeatures { kernel: None, ..f }.to_json();
        assert!(none["kernel_features"].is_null());
        assert!(f
            .describe()
            .starts_with("kernel offers 0x1fe [URING_CMD_COMP_IN_TASK "));
    }
}
