//! `zonedd format --backend PATH [--backend PATH ...] [--cache PATH] [--label L]
//! [--reserved-seq N] [--force]`: write dm-zoned v2 metadata (both sets) on a zoned device or
//! emulated image, or on a multi-device volume (the sets on the cache device, a tertiary
//! superblock on each zoned drive).
//!
//! Without `--force` it refuses a device that is mounted, held by another device, carries a
//! filesystem or partition table, or is already formatted (either layout).
//!
//! `--layout log [--user-frontiers N]` writes zonedd's log-structured layout instead
//! (`dmz::lsl`, single device).

use std::io::{IsTerminal, Write};
use std::path::Path;

use dmz::format::{uuid_string, Layout, Superblock};
use dmz::sets::{self, FormatOptions};
use zbd::ZonedDevice;

use super::CliError;

pub use crate::cli::format::{Args, Layout as LayoutArg};

pub fn run(args: Args) -> Result<(), CliError> {
    let vol = super::VolumeArgs {
        backends: &args.backend,
        cache: args.cache.as_deref(),
    };
    vol.validate()?;
    let name = vol.name();
    let path = Path::new(&name);
    if let Some(l) = &args.label {
        dmz::format::label_field(l).map_err(|e| CliError::Usage(e.to_string()))?;
    }
    if args.reserved_seq == 0 {
        return Err(CliError::Usage("--reserved-seq must be at least 1".into()));
    }
    // In-use checks need no open device and must not be bypassed by --force.
    // Refusals (mounted, held, existing content) are exit 2: nothing was done.
    for p in vol.paths() {
        in_use(p).map_err(CliError::Usage)?;
    }
    if args.layout == LayoutArg::Log && args.cache.is_some() {
        return Err(CliError::Usage(
            "--layout log is single-device: it takes no --cache".into(),
        ));
    }
    if args.layout != LayoutArg::Log && args.user_frontiers.is_some() {
        return Err(CliError::Usage(
            "--user-frontiers applies to --layout log only".into(),
        ));
    }
    if args.layout == LayoutArg::Log && args.backend.len() > 1 {
        return Err(CliError::Usage(
            "--layout log is single-device: give one --backend".into(),
        ));
    }
    let dev = vol.open(true)?;
    if !args.force {
        if let Some(what) = existing_content(dev.as_ref()).map_err(CliError::Failed)? {
            return Err(CliError::Usage(format!(
                "{}: {what}; use --force to overwrite",
                path.display()
            )));
        }
    }
    if args.layout == LayoutArg::Log {
        let opts = dmz::lsl::FormatOptions {
            label: args.label.clone(),
            user_frontiers: args
                .user_frontiers
                .unwrap_or(dmz::lsl::DEFAULT_USER_FRONTIERS),
            ..Default::default()
        };
        return format_log(path, dev, &opts);
    }
    let opts = FormatOptions {
        label: args.label.clone(),
        reserved_seq: args.reserved_seq,
    };
    let tty = std::io::stderr().is_terminal();
    let mut last_pct = u64::MAX;
    let mut progress = |done: u64, total: u64| {
        if !tty || total == 0 {
            return;
        }
        let pct = done * 100 / total;
        if pct != last_pct {
            last_pct = pct;
            let mut e = std::io::stderr();
            let _ = write!(e, "\rwriting metadata: {pct:3}% ({done}/{total} blocks)");
            if done == total {
                let _ = writeln!(e);
            }
            let _ = e.flush();
        }
    };
    let layout = sets::format_device(dev.as_ref(), &opts, &mut progress).map_err(|e| match e {
        dmz::format::FormatError::Device(_) | dmz::format::FormatError::Invalid(_) => {
            CliError::Usage(format!("{}: {e}", path.display()))
        }
        e => CliError::Failed(format!("{}: format failed: {e}", path.display())),
    })?;
    let loaded = sets::load(dev.as_ref())
        .map_err(|e| CliError::Failed(format!("{}: reading back: {e}", path.display())))?;
    print!("{}", summary(path, dev.as_ref(), &layout, &loaded.sb));
    Ok(())
}

/// `format --layout log`: write the log layout, open it once to read back its capacity.
fn format_log(
    path: &Path,
    dev: Box<dyn ZonedDevice>,
    opts: &dmz::lsl::FormatOptions,
) -> Result<(), CliError> {
    dmz::lsl::format(dev.as_ref(), opts).map_err(|e| match e {
        dmz::engine::EngineError::Invalid(_) | dmz::engine::EngineError::Format(_) => {
            CliError::Usage(format!("{}: {e}", path.display()))
        }
        e => CliError::Failed(format!("{}: format failed: {e}", path.display())),
    })?;
    let dev: std::sync::Arc<dyn ZonedDevice> = std::sync::Arc::from(dev);
    let e = dmz::lsl::LogEngine::open(dev.clone(), Default::default())
        .map_err(|e| CliError::Failed(format!("{}: reading back: {e}", path.display())))?;
    let (capacity, stats) = (e.capacity(), e.stats());
    e.close()
        .map_err(|e| CliError::Failed(format!("{}: reading back: {e}", path.display())))?;
    let g = dev.geometry();
    print!(
        "Formatted {} ({})\n\
         \x20 layout           log (zonedd)\n\
         \x20 zones            {} x {} ({} free for data)\n\
         \x20 frontiers        {} user, 1 GC\n\
         \x20 index            {} resident\n\
         \x20 exposed capacity {} ({} bytes)\n",
        path.display(),
        dev.describe(),
        g.nr_zones,
        human(g.zone_size),
        stats.zones_free,
        stats.user_frontiers,
        human(stats.index_resident_bytes),
        human(capacity),
        capacity
    );
    Ok(())
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn summary(path: &Path, dev: &dyn ZonedDevice, l: &Layout, sb: &Superblock) -> String {
    let g = dev.geometry();
    let m = l.meta_zones();
    let mut devices = String::new();
    for m in dev
        .members()
        .iter()
        .filter(|_| !l.tertiary_zones.is_empty())
    {
        devices += &format!("  {m}\n");
    }
    let kind = if l.tertiary_zones.is_empty() {
        "conventional"
    } else {
        "cache"
    };
    format!(
        "Formatted {} ({})\n\
         \x20 label            {}\n\
         \x20 uuid             {}\n\
         \x20 zones            {} x {} ({} usable, {} {kind})\n\
         \x20 metadata         2 sets x {} zone(s), zones {}-{} ({} blocks per set)\n\
         \x20 reserved         {} sequential zones\n\
         \x20 chunks           {}\n\
         \x20 exposed capacity {} ({} bytes)\n",
        path.display(),
        dev.describe(),
        sb.label_str(),
        uuid_string(&sb.set_uuid),
        g.nr_zones,
        human(g.zone_size),
        l.nr_usable_zones,
        l.nr_rnd_zones,
        l.nr_meta_zones,
        m.start,
        m.end - 1,
        l.nr_meta_blocks,
        l.nr_reserved_seq,
        l.nr_chunks,
        human(l.exposed_bytes()),
        l.exposed_bytes()
    ) + &devices
}

/// `Some(name)` of a block device (`sda` for `/dev/sda`) with its major:minor.
fn block_dev(path: &Path) -> Option<(String, u32, u32)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let rdev = meta.rdev();
    let (maj, min) = (
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    );
    // /sys/dev/block/MAJ:MIN links to .../block/<name>[/<partition>].
    let link = std::fs::read_link(format!("/sys/dev/block/{maj}:{min}")).ok()?;
    let name = link.file_name()?.to_string_lossy().into_owned();
    Some((name, maj, min))
}

/// Devices (major:minor) whose use makes `name` busy: itself and its partitions.
fn self_and_partitions(name: &str, maj: u32, min: u32) -> Vec<(String, u32, u32)> {
    let mut out = vec![(name.to_string(), maj, min)];
    if let Ok(rd) = std::fs::read_dir(format!("/sys/class/block/{name}")) {
        for e in rd.flatten() {
            let part = e.file_name().to_string_lossy().into_owned();
            if !part.starts_with(name) {
                continue;
            }
            if let Ok(dev) = std::fs::read_to_string(e.path().join("dev")) {
                if let Some((a, b)) = dev.trim().split_once(':') {
                    if let (Ok(a), Ok(b)) = (a.parse(), b.parse()) {
                        out.push((part, a, b));
                    }
                }
            }
        }
    }
    out
}

/// Refuse a block device that is mounted or held (dm, md, ...), itself or a partition.
fn in_use(path: &Path) -> Result<(), String> {
    let Some((name, maj, min)) = block_dev(path) else {
        return Ok(());
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for (part, a, b) in self_and_partitions(&name, maj, min) {
        let key = format!("{a}:{b}");
        if let Some(line) = mountinfo
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(key.as_str()))
        {
            let mnt = line.split_whitespace().nth(4).unwrap_or("?");
            return Err(format!(
                "{} is mounted on {mnt}; unmount it first",
                which(path, &name, &part)
            ));
        }
        let holders = std::fs::read_dir(format!("/sys/class/block/{part}/holders"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        if !holders.is_empty() {
            return Err(format!(
                "{} is in use by {} (holders)",
                which(path, &name, &part),
                holders.join(", ")
            ));
        }
    }
    Ok(())
}

/// The busy device as the user named it, or which of its partitions (the path once).
fn which(path: &Path, name: &str, part: &str) -> String {
    if name == part {
        path.display().to_string()
    } else {
        format!("{}: its partition /dev/{part}", path.display())
    }
}

/// What the device already holds, if anything worth refusing to overwrite.
fn existing_content(dev: &dyn ZonedDevice) -> Result<Option<String>, String> {
    if dmz::lsl::is_log_layout(dev) {
        return Ok(Some("already formatted (zonedd's log layout)".into()));
    }
    let probe = sets::probe(dev).map_err(|e| e.to_string())?;
    if let Some(s) = probe.sets.iter().find(|s| s.magic) {
        let what = match &s.valid {
            Some((sb, _)) => format!(
                "already formatted (dm-zoned label {:?}, uuid {})",
                sb.label_str(),
                uuid_string(&sb.set_uuid)
            ),
            None => "already formatted (dm-zoned superblock found)".to_string(),
        };
        return Ok(Some(what));
    }
    // The first 68 KiB of the device (within zone 0: zones are at least 1 MiB).
    let len = (68 * 1024).min(dev.geometry().zone_size) as usize;
    let mut head = vec![0u8; len];
    dev.read_at(&mut head, 0).map_err(|e| e.to_string())?;
    Ok(signature(&head).map(|s| format!("it contains {s}")))
}

/// Well-known filesystem and partition-table signatures in the first bytes of a device.
pub fn signature(head: &[u8]) -> Option<&'static str> {
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);
    if at(0, b"XFSB") {
        return Some("an XFS filesystem");
    }
    if at(1080, &[0x53, 0xEF]) {
        return Some("an ext2/3/4 filesystem");
    }
    if at(65600, b"_BHRfS_M") {
        return Some("a btrfs filesystem");
    }
    if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        return Some("a swap area");
    }
    if at(512, b"EFI PART") || at(4096, b"EFI PART") {
        return Some("a GPT partition table");
    }
    if at(3, b"NTFS    ") {
        return Some("an NTFS filesystem");
    }
    if at(0, &[0x44, 0x42, 0x5A, 0x44]) {
        return Some("a dm-zoned superblock");
    }
    if at(510, &[0x55, 0xAA]) {
        return Some("an MBR partition table or boot sector");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures() {
        let mut h = vec![0u8; 70 * 1024];
        assert_eq!(signature(&h), None);
        h[1080] = 0x53;
        h[1081] = 0xEF;
        assert_eq!(signature(&h), Some("an ext2/3/4 filesystem"));
        h[..4].copy_from_slice(b"XFSB");
        assert_eq!(signature(&h), Some("an XFS filesystem"));
        let mut g = vec![0u8; 8192];
        g[512..520].copy_from_slice(b"EFI PART");
        g[510] = 0x55;
        g[511] = 0xAA;
        assert_eq!(signature(&g), Some("a GPT partition table"));
        let mut b = vec![0u8; 70 * 1024];
        b[65600..65608].copy_from_slice(b"_BHRfS_M");
        assert_eq!(signature(&b), Some("a btrfs filesystem"));
        assert_eq!(signature(&b[..100]), None, "short heads are fine");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(256 << 20), "256 MiB");
        assert_eq!(human(1536 << 20), "1.50 GiB");
    }
}
