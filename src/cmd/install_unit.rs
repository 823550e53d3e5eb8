//! `zonedd install-unit`: Install the systemd unit zonedd@.service.
//!
//! Writes `scripts/systemd/zonedd@.service` (built into the binary) to
//! /etc/systemd/system (or `--dir`), pointing ExecStart/ExecStop at this zonedd binary, and
//! prints the commands that enable it for a backend.

use super::CliError;

const UNIT: &str = include_str!("../../scripts/systemd/zonedd@.service");
const UNIT_NAME: &str = "zonedd@.service";
const TEMPLATE_BIN: &str = "/usr/local/bin/zonedd";

pub use crate::cli::install_unit::Args;

/// The unit text with the binary path filled in.
pub fn unit_text(bin: &str) -> String {
    UNIT.replace(TEMPLATE_BIN, bin)
}

pub fn run(args: Args) -> Result<(), CliError> {
    let bin = match args.bin {
        Some(b) => b,
        None => std::env::current_exe()
            .and_then(std::fs::canonicalize)
            .map_err(|e| CliError::Failed(format!("cannot find this binary's path: {e}")))?,
    };
    let bin = bin.display().to_string();
    if bin.contains(char::is_whitespace) {
        return Err(CliError::Usage(format!(
            "binary path {bin:?} contains whitespace"
        )));
    }
    let text = unit_text(&bin);
    if args.print {
        print!("{text}");
        return Ok(());
    }
    let dest = args.dir.join(UNIT_NAME);
    std::fs::create_dir_all(&args.dir)
        .and_then(|_| std::fs::write(&dest, &text))
        .map_err(|e| CliError::Failed(format!("writing {}: {e}", dest.display())))?;
    println!("installed {}", dest.display());
    println!("enable a volume (BACKEND formatted with `zonedd format`):");
    println!("  systemctl daemon-reload");
    println!("  systemctl enable --now \"zonedd@$(systemd-escape --path BACKEND).service\"");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_runs_the_given_binary_in_the_foreground() {
        let t = unit_text("/opt/z/bin/zonedd");
        assert!(!t.contains(TEMPLATE_BIN));
        assert!(t.contains(
            "ExecStart=/opt/z/bin/zonedd create --backend %f --foreground --recover-if-present"
        ));
        assert!(t.contains("ExecStop=/opt/z/bin/zonedd delete --backend %f"));
        assert!(t.contains("Type=notify"));
        assert!(t.contains("Restart=on-failure"));
    }

    /// The directives of the unit (comments and blank lines left out).
    fn directives() -> Vec<&'static str> {
        UNIT.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
            .collect()
    }

    #[test]
    fn the_sandbox_leaves_devices_io_uring_and_mount_namespaces_alone() {
        let d = directives();
        // Nothing that would shut the daemon out of /dev/ublk-control, /dev/ublkcN or the
        // backend (ProtectClock= implies DeviceAllow=char-rtc on older systemd).
        for bad in [
            "PrivateDevices=",
            "DeviceAllow=",
            "DevicePolicy=",
            "ProtectClock=",
            "PrivateUsers=",
        ] {
            assert!(!d.iter().any(|l| l.starts_with(bad)), "{bad} in the unit");
        }
        // The daemon unshares its own mount namespace.
        assert!(d.contains(&"RestrictNamespaces=mnt"));
        // A deny list that leaves @aio (io_uring_*) and @mount allowed.
        let filter: Vec<&str> = d
            .iter()
            .filter_map(|l| l.strip_prefix("SystemCallFilter="))
            .collect();
        assert_eq!(filter.len(), 1, "{filter:?}");
        assert!(filter[0].starts_with('~'), "{}", filter[0]);
        for needed in ["@aio", "@mount", "io_uring", "@privileged", "@resources"] {
            assert!(
                !filter[0].contains(needed),
                "{needed} denied: {}",
                filter[0]
            );
        }
        // CAP_SYS_ADMIN (ublk) is never dropped from the bounding set.
        for l in d.iter().filter(|l| l.starts_with("CapabilityBoundingSet=")) {
            assert!(l.starts_with("CapabilityBoundingSet=~"), "{l}");
            assert!(!l.contains("CAP_SYS_ADMIN"), "{l}");
        }
        // Where it writes under ProtectSystem=strict: its run directory, libublk's, the backend.
        assert!(d.contains(&"ProtectSystem=strict"));
        assert!(d.contains(&"RuntimeDirectory=zonedd ublksrvd"));
        assert!(d.contains(&"RuntimeDirectoryMode=0700"));
        assert!(d.contains(&"RuntimeDirectoryPreserve=yes"));
        assert!(d.contains(&"ReadWritePaths=-%f"));
        // sd_notify, the journal and the control socket are AF_UNIX.
        assert!(d.contains(&"RestrictAddressFamilies=AF_UNIX"));
        assert!(d.contains(&"UMask=0077"));
    }
}
