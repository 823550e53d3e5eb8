//! The command line's definition (clap), and nothing else: `main.rs` parses it, and
//! `build.rs` includes this same file to generate the man pages and shell completions, so
//! both always describe the binary that was built. Keep it free of anything but clap and std.

use clap::{Parser, Subcommand};

pub mod emulate {
    #[derive(clap::Args)]
    pub struct Args {
        /// File or regular block device to hold the image.
        pub path: std::path::PathBuf,
        /// Emulated capacity (K/M/G/T suffixes); required for a file, defaults to what fits on a
        /// block device.
        #[arg(long, value_name = "SIZE")]
        pub size: Option<String>,
        /// Zone size: a power of two, at least 1M.
        #[arg(long, value_name = "SIZE", default_value = "256M")]
        pub zone_size: String,
        /// Number of conventional zones [default: about 1 %, at least 8].
        #[arg(long, value_name = "N")]
        pub conventional: Option<String>,
        /// Writable bytes per zone [default: the zone size].
        #[arg(long, value_name = "SIZE")]
        pub zone_capacity: Option<String>,
        /// Most zones open at once (0 = no limit).
        #[arg(long, value_name = "N", default_value = "128")]
        pub max_open: String,
        /// Most zones open or closed at once (0 = no limit).
        #[arg(long, value_name = "N", default_value = "0")]
        pub max_active: String,
        /// Overwrite an existing file or block device.
        #[arg(long)]
        pub force: bool,
    }
}

pub mod report {
    #[derive(clap::Args)]
    pub struct Args {
        /// Zoned block device or emulated image (several: the zoned drives of a multi-device
        /// volume, with --cache).
        #[arg(required = true, num_args = 1..)]
        pub path: Vec<std::path::PathBuf>,
        /// The regular cache device of a multi-device volume: its zones come first.
        #[arg(long, value_name = "PATH")]
        pub cache: Option<std::path::PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        pub json: bool,
    }
}

pub mod conformance {
    #[derive(clap::Args)]
    pub struct Args {
        /// Zoned block device or emulated image; ALL ITS DATA IS DESTROYED.
        pub device: std::path::PathBuf,
        /// Confirm that the device's data may be destroyed.
        #[arg(long)]
        pub yes_destroy_data: bool,
    }
}

pub mod format {
    use std::path::PathBuf;

    #[derive(clap::Args)]
    pub struct Args {
        /// Zoned block device or emulated image to format (its data is lost); repeat it for
        /// the zoned drives of a multi-device volume (with --cache), in order.
        #[arg(long, value_name = "PATH", required = true)]
        pub backend: Vec<PathBuf>,
        /// A regular block device or file in front of the zoned drive(s) (dm-zoned's
        /// multi-device volume): cut into cache zones, it holds the metadata and takes the
        /// random writes (its data is lost).
        #[arg(long, value_name = "PATH")]
        pub cache: Option<PathBuf>,
        /// Volume label, at most 31 bytes (default: "zonedd-" and a hash of the device).
        #[arg(long)]
        pub label: Option<String>,
        /// Sequential zones reserved for reclaim (clamped to the conventional zones - 1).
        #[arg(long, value_name = "N", default_value_t = 16)]
        pub reserved_seq: u32,
        /// Format even if the device holds a filesystem, a partition table or dm-zoned metadata.
        #[arg(long)]
        pub force: bool,
        /// On-disk layout: `dm-zoned` (dm-zoned's v2 format, which the kernel's dm-zoned
        /// reads too) or `log` (zonedd's log-structured layout: random writes appended to
        /// sequential zones, single device only; docs/design.md, "Log layout").
        #[arg(long, value_enum, default_value_t = Layout::DmZoned)]
        pub layout: Layout,
        /// `--layout log` only: user frontiers, the open zones that take new writes side by
        /// side, one write in flight on each (1 to 4; default 4, fewer on a device whose open
        /// or active zone limit is lower). Each keeps a zone out of the exposed capacity.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4))]
        pub user_frontiers: Option<u32>,
    }

    /// `format --layout`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
    pub enum Layout {
        DmZoned,
        Log,
    }
}

pub mod check {
    use std::path::PathBuf;

    #[derive(clap::Args)]
    pub struct Args {
        /// Zoned block device or emulated image (several: the zoned drives of a multi-device
        /// volume, in order, with --cache).
        #[arg(required = true, num_args = 1..)]
        pub path: Vec<PathBuf>,
        /// The regular cache device of a multi-device volume.
        #[arg(long, value_name = "PATH")]
        pub cache: Option<PathBuf>,
        /// Fix what can be fixed and write both metadata sets with a new generation (a
        /// log-layout volume: open and close it, which replays its log and rewrites the
        /// older superblock slot).
        #[arg(long)]
        pub repair: bool,
        /// Print the report as JSON on stdout.
        #[arg(long)]
        pub json: bool,
    }
}

pub mod engine_io {
    use std::path::PathBuf;

    #[derive(clap::Args)]
    pub struct Args {
        /// Formatted zoned block device or emulated image (repeated: the zoned drives of a
        /// multi-device volume, in order, with --cache).
        #[arg(long, value_name = "PATH")]
        pub backend: Vec<PathBuf>,
        /// The regular cache device of a multi-device volume.
        #[arg(long, value_name = "PATH", requires = "backend")]
        pub cache: Option<PathBuf>,
        /// A plain block device or file instead of an engine (O_DIRECT reads and writes, flush =
        /// fdatasync): the same steps on e.g. a /dev/mapper device, in one process.
        #[arg(long, value_name = "PATH", conflicts_with = "backend")]
        pub raw: Option<PathBuf>,
        /// Run the steps of FILE (one a line, same arguments as a single step) in one session.
        #[arg(long, value_name = "FILE", conflicts_with = "op")]
        pub script: Option<PathBuf>,
        #[command(flatten)]
        pub step: StepArgs,
    }

    /// One operation: the command line's, or one line of a script.
    #[derive(clap::Args, Debug, Clone)]
    pub struct StepArgs {
        /// read, write, flush, reclaim, or pattern (print generated data; needs no backend).
        #[arg(value_enum)]
        pub op: Option<Op>,
        /// Byte offset on the exposed device (K/M/G suffixes; a multiple of 4096).
        #[arg(long, value_name = "BYTES")]
        pub offset: Option<String>,
        /// Bytes to transfer (K/M/G suffixes; a multiple of 4096).
        #[arg(long, value_name = "BYTES")]
        pub len: Option<String>,
        /// Data file: written from (its first LEN bytes) or read into (created or truncated).
        #[arg(long, value_name = "FILE", conflicts_with = "pattern")]
        pub file: Option<PathBuf>,
        /// Generated data of this seed instead of a file (a read compares against it).
        #[arg(long, value_name = "SEED")]
        pub pattern: Option<u64>,
        /// Write with FUA (durable when the call returns).
        #[arg(long)]
        pub fua: bool,
        /// Flush the engine after the write.
        #[arg(long)]
        pub flush: bool,
    }

    #[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Op {
        Read,
        Write,
        Flush,
        Pattern,
        /// Run a reclaim pass now and wait for it (engine only); prints what it moved.
        Reclaim,
    }
}

pub mod create {
    #[derive(clap::Args)]
    pub struct Args {
        /// The formatted zoned backend: a host-managed block device or an emulated image;
        /// repeat it for the zoned drives of a multi-device volume (with --cache), in order.
        #[arg(long, required = true)]
        pub backend: Vec<String>,
        /// The regular cache device of a multi-device volume.
        #[arg(long, value_name = "PATH")]
        pub cache: Option<String>,
        /// A name shown by `zonedd list`.
        #[arg(long)]
        pub label: Option<String>,
        /// Number of ublk queues (one I/O thread each).
        #[arg(long, default_value_t = 2)]
        pub queues: u16,
        /// Queue depth (requests in flight per queue).
        #[arg(long, default_value_t = 64)]
        pub depth: u16,
        /// Worker pool for per-chunk works: `percpu` or `unbound`.
        #[arg(long, default_value = "percpu")]
        pub pool: String,
        /// Concurrent works: per CPU for `percpu`, in all for `unbound`.
        #[arg(long)]
        pub max_active: Option<u32>,
        /// Zones reclaimed at once (default: 1 on a spinning disk, where parallel copies would
        /// seek against each other, one per zoned drive of a multi-device volume; 2, or the
        /// number of drives if more, otherwise).
        #[arg(long)]
        pub reclaim_max_active: Option<u32>,
        /// Log-layout volumes: MiB of metadata kept in memory (the index directory, 5 MiB of
        /// other state, and a cache of index pages in the rest; default 64, which holds a
        /// 10 TiB volume's index). From 6 to 1048576 (1 TiB).
        #[arg(long, value_name = "MIB")]
        pub index_memory_mib: Option<u64>,
        /// Log-layout volumes: which data idle compaction rewrites in logical order: what
        /// reads find scattered (`reads`, the default: disk time only for data read in
        /// runs), what writes change (`writes`: randomly written data is made sequential
        /// whether read or not), or nothing (`never`).
        #[arg(long, value_parser = ["reads", "writes", "never"])]
        pub compact: Option<String>,
        /// Format the backend first (destroys its data).
        #[arg(long)]
        pub format: bool,
        /// Stay in the foreground (systemd: Type=notify, READY=1 once /dev/ublkbN exists).
        #[arg(long)]
        pub foreground: bool,
        /// Ask for this ublk device id (default: the kernel picks).
        #[arg(long)]
        pub id: Option<u32>,
        /// If a zonedd device for this backend already exists with its daemon dead, recover it
        /// instead of creating a new one (what the systemd unit uses on restart).
        #[arg(long)]
        pub recover_if_present: bool,
        /// Serve Prometheus metrics at http://ADDR/metrics from the daemon: IP:PORT, or a port
        /// on 127.0.0.1. Only loopback addresses unless --metrics-any-address.
        #[arg(long, value_name = "ADDR")]
        pub metrics: Option<String>,
        /// Allow --metrics on an address other machines can reach (the metrics need no
        /// credentials: firewall it).
        #[arg(long, requires = "metrics")]
        pub metrics_any_address: bool,
    }
}

pub mod expose {
    #[derive(clap::Args)]
    pub struct Args {
        /// The emulated SMR image (made by `zonedd emulate`).
        pub image: String,
        /// A name shown by `zonedd list`.
        #[arg(long)]
        pub label: Option<String>,
        /// Number of ublk queues (one I/O thread each).
        #[arg(long, default_value_t = 1)]
        pub queues: u16,
        /// Queue depth (requests in flight per queue).
        #[arg(long, default_value_t = 64)]
        pub depth: u16,
        /// Stay in the foreground (systemd: Type=notify, READY=1 once /dev/ublkbN exists).
        #[arg(long)]
        pub foreground: bool,
        /// Ask for this ublk device id (default: the kernel picks).
        #[arg(long)]
        pub id: Option<u32>,
        /// Completion timing: `none` (as fast as the image allows) or `hdd` (each request
        /// completes when a 7200 rpm host-managed SMR drive would complete it: seek, rotation,
        /// transfer rate by position, a reordering command queue, a volatile write cache;
        /// docs/hdd-model.md).
        #[arg(long, value_enum, default_value_t = Timing::None)]
        pub timing: Timing,
        /// Override one parameter of the `hdd` model, KEY=VALUE (repeatable): rpm,
        /// outer_mbps, inner_mbps, track_to_track_ms, avg_seek_ms, full_stroke_ms, cylinders,
        /// disk_size, queue_depth, cache_mib, iface_mbps, flush_ms, destage_kib, overhead_us.
        #[arg(long = "timing-param", value_name = "KEY=VALUE")]
        pub timing_param: Vec<String>,
    }

    #[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Timing {
        None,
        Hdd,
    }
}

pub mod list {
    #[derive(clap::Args)]
    pub struct Args {
        /// Print JSON.
        #[arg(long)]
        pub json: bool,
    }
}

pub mod status {
    #[derive(clap::Args)]
    pub struct Args {
        /// The ublk device id (from `zonedd list`).
        pub id: u32,
        /// Print every counter as JSON instead of the summary (names: docs/status.md).
        #[arg(long, conflicts_with_all = ["watch", "prometheus"])]
        pub json: bool,
        /// Print the counters in the Prometheus text format, e.g. for node_exporter's
        /// textfile collector (names: docs/status.md).
        #[arg(long, conflicts_with = "watch")]
        pub prometheus: bool,
        /// Redraw the summary every SECS seconds (default 2), with live rates, until
        /// interrupted (Ctrl-C). Put it after the id: `zonedd status 0 --watch`.
        #[arg(
            long,
            value_name = "SECS",
            num_args = 0..=1,
            default_missing_value = "2"
        )]
        pub watch: Option<f64>,
    }
}

pub mod reclaim {
    #[derive(clap::Args)]
    pub struct Args {
        /// The ublk device id (from `zonedd list`).
        pub id: u32,
        /// Wait until the pass is done (reclaim drained the conventional zones it could and
        /// went back to sleep), showing its progress on standard error, then report the zones
        /// and bytes it reclaimed.
        #[arg(long)]
        pub wait: bool,
        /// Print the result as JSON (no progress is shown).
        #[arg(long)]
        pub json: bool,
    }
}

pub mod delete {
    #[derive(clap::Args)]
    pub struct Args {
        /// The ublk device id (from `zonedd list`).
        #[arg(required_unless_present_any = ["all", "backend"], conflicts_with_all = ["all", "backend"])]
        pub id: Option<u32>,
        /// Delete every zonedd device.
        #[arg(long, conflicts_with = "backend")]
        pub all: bool,
        /// Delete the device serving this backend (what the systemd unit uses).
        #[arg(long)]
        pub backend: Option<String>,
        /// Delete even if the block device is mounted or open (its users get I/O errors).
        #[arg(long)]
        pub force: bool,
        /// Seconds to wait for the daemon to flush and exit.
        #[arg(long, default_value_t = 600)]
        pub timeout: u64,
    }
}

pub mod recover {
    #[derive(clap::Args)]
    pub struct Args {
        /// The ublk device id (from `zonedd list`).
        pub id: u32,
        /// Stay in the foreground instead of daemonizing.
        #[arg(long)]
        pub foreground: bool,
    }
}

pub mod install_unit {
    use std::path::PathBuf;

    #[derive(clap::Args)]
    pub struct Args {
        /// Where to install the unit.
        #[arg(long, default_value = "/etc/systemd/system")]
        pub dir: PathBuf,
        /// Print the unit on stdout instead of installing it.
        #[arg(long)]
        pub print: bool,
        /// The zonedd binary the unit runs (default: this one).
        #[arg(long)]
        pub bin: Option<PathBuf>,
    }
}

#[derive(Parser)]
#[command(
    name = "zonedd",
    version,
    about = "A userspace dm-zoned: a conventional /dev/ublkbN on a zoned disk",
    long_about = "A userspace dm-zoned: a conventional /dev/ublkbN on a zoned disk.\n\n\
        zonedd runs an ordinary filesystem on zoned storage (host-managed SMR drives, NVMe ZNS, \
        null_blk, or an emulated SMR image on a file): a daemon exposes a conventional block \
        device through ublk and maps it onto the zoned backend in dm-zoned's v2 on-disk \
        format, so a volume moves between zonedd and the kernel's dm-zoned target.\n\n\
        Typical use: `zonedd format --backend /dev/sdX`, then `zonedd create --backend \
        /dev/sdX` (prints /dev/ublkbN and its id), `zonedd status ID` to watch it, \
        `zonedd delete ID` to stop it. It needs root and the ublk_drv module."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Create an emulated host-managed SMR disk image on a file or regular block device.
    Emulate(emulate::Args),
    /// Show the zone table of a zoned device or emulated image.
    Report(report::Args),
    /// Run the backend conformance suite against a device (destroys its data).
    #[command(hide = true)]
    Conformance(conformance::Args),
    /// Format a zoned backend with dm-zoned v2 metadata (or zonedd's log layout).
    Format(format::Args),
    /// Check (and optionally repair) the metadata of a backend (dm-zoned v2 or the log layout).
    Check(check::Args),
    /// Read or write through the engine without ublk (tests and interop checks).
    #[command(hide = true)]
    EngineIo(engine_io::Args),
    /// Start a daemon exposing a formatted backend as /dev/ublkbN.
    Create(create::Args),
    /// Serve an emulated SMR image as a host-managed zoned block device /dev/ublkbN (for
    /// zoned filesystems, the kernel's dm-zoned, fio --zonemode=zbd, ...).
    Expose(expose::Args),
    /// List zonedd devices.
    List(list::Args),
    /// Show the state and counters of a zonedd device.
    Status(status::Args),
    /// Start a reclaim pass now, whatever the idle timer and watermarks say (like dm-zoned's
    /// `dmsetup message DEV 0 reclaim`): data moves from the conventional zones into
    /// sequential ones until nothing is left to reclaim, then reclaim sleeps again.
    Reclaim(reclaim::Args),
    /// Flush, commit and remove a zonedd device.
    Delete(delete::Args),
    /// Re-attach a new daemon to a device whose daemon died.
    Recover(recover::Args),
    /// Install the systemd unit zonedd@.service.
    InstallUnit(install_unit::Args),
}
