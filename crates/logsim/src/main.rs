//! `logsim`: run the issue 14 design simulations and print markdown tables.

use clap::{Parser, Subcommand};
use logsim::index::{self, Memory, PAGE_ENTRIES};
use logsim::store::{Config, LogPlacement, Separation, Store, Victim};
use logsim::workload::{Skew, Streams};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "logsim",
    about = "Simulate zonedd's log-structured layout (issue 14)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// GC write amplification; every comma-separated list is crossed with the others, one
    /// table row per combination.
    Gc(GcArgs),
    /// Index memory for a volume and the page-miss rate of a paged L2P at full scale.
    Index(IndexArgs),
}

#[derive(clap::Args)]
struct StreamArgs {
    /// Fraction of writes that belong to sequential streams (0: none).
    #[arg(long, default_value_t = 0.0)]
    seq_frac: f64,
    /// Concurrent sequential streams.
    #[arg(long, default_value_t = 4)]
    streams: u32,
    /// Blocks a stream writes before it jumps to a new aligned start.
    #[arg(long, default_value_t = 1024)]
    stream_blocks: u64,
}

impl StreamArgs {
    fn get(&self) -> Option<Streams> {
        (self.seq_frac > 0.0).then_some(Streams {
            frac: self.seq_frac,
            count: self.streams,
            len: self.stream_blocks,
        })
    }
}

#[derive(clap::Args)]
struct GcArgs {
    /// Logical blocks (U).
    #[arg(long, default_value_t = 1 << 20)]
    user_blocks: u64,
    /// Blocks per zone (B).
    #[arg(long, default_value_t = 1024)]
    zone_blocks: u32,
    /// Over-provisioning ρ = (T - U) / U, comma-separated.
    #[arg(long, default_value = "0.07,0.28", value_delimiter = ',')]
    op: Vec<f64>,
    /// uniform, 80-20, 90-10, zipf, zipf:THETA; comma-separated.
    #[arg(long, default_value = "uniform", value_delimiter = ',')]
    workload: Vec<Skew>,
    /// greedy, cb (LFS cost-benefit), cbz (dm-zap's), fifo; comma-separated.
    #[arg(long, default_value = "greedy,cb", value_delimiter = ',')]
    victim: Vec<Victim>,
    /// none, user-gc, gen:N, lifetime; comma-separated.
    #[arg(long, default_value = "none", value_delimiter = ',')]
    sep: Vec<Separation>,
    /// off, inline (headers in the log zone), separate (metadata log); comma-separated.
    #[arg(long, default_value = "off", value_delimiter = ',')]
    log: Vec<LogPlacement>,
    /// User writes per group commit; comma-separated.
    #[arg(long, default_value = "1", value_delimiter = ',')]
    group: Vec<u32>,
    /// Give every stream its own open zone.
    #[arg(long)]
    stream_zones: bool,
    #[command(flatten)]
    streams: StreamArgs,
    /// GC runs while fewer zones are free.
    #[arg(long, default_value_t = 2)]
    free_min: u32,
    /// Simulate a paged L2P cache holding this share of the index pages (pages scaled to 1/64
    /// of a zone); 0.00476 is 64 MiB for 10 TiB. Adds index page reads and writes per user
    /// write (user path + GC liveness lookups).
    #[arg(long, default_value_t = 0.0)]
    page_cache_share: f64,
    /// Random writes before measuring, in multiples of U (after a sequential fill).
    #[arg(long, default_value_t = 4.0)]
    warm: f64,
    /// Random writes measured, in multiples of U.
    #[arg(long, default_value_t = 4.0)]
    measure: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(clap::Args)]
struct IndexArgs {
    /// Volume size in TiB.
    #[arg(long, default_value_t = 10.0)]
    volume_tib: f64,
    /// Zone size in MiB.
    #[arg(long, default_value_t = 256)]
    zone_mib: u64,
    /// Resident budget of the index in MiB.
    #[arg(long, default_value_t = 64.0)]
    budget_mib: f64,
    /// Extents per block for the extent-tree estimate (from `logsim gc`: 1.0 after a full
    /// random overwrite).
    #[arg(long, default_value_t = 1.0)]
    extents_per_block: f64,
    /// Workloads for the page-miss simulation; comma-separated.
    #[arg(long, default_value = "uniform,80-20,zipf", value_delimiter = ',')]
    workload: Vec<Skew>,
    /// Writes go to the first GIB of the volume only (default: all of it).
    #[arg(long)]
    span_gib: Option<f64>,
    /// Cache sizes in pages to simulate besides the budget's; comma-separated.
    #[arg(long, value_delimiter = ',')]
    cache_pages: Vec<u64>,
    #[command(flatten)]
    streams: StreamArgs,
    /// Accesses before counting, in millions.
    #[arg(long, default_value_t = 4.0)]
    warm_m: f64,
    /// Accesses counted, in millions.
    #[arg(long, default_value_t = 8.0)]
    measure_m: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Gc(a) => gc(a),
        Cmd::Index(a) => index_cmd(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("logsim: {e}");
            ExitCode::from(2)
        }
    }
}

fn gc(a: GcArgs) -> Result<(), String> {
    if a.zone_blocks < 16 || a.user_blocks < 64 * a.zone_blocks as u64 {
        return Err("need zone_blocks >= 16 and user_blocks >= 64 zones".into());
    }
    if a.group.contains(&0) {
        return Err("--group must be at least 1".into());
    }
    println!(
        "| OP | B | U | workload | victim | separation | log, group | WA | device WA | meta blocks / write | victim u | resets / MiB written | extents / block | single-extent pages | index page reads / write | index page writes / write |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &op in &a.op {
        for &skew in &a.workload {
            for &victim in &a.victim {
                for &sep in &a.sep {
                    for &log in &a.log {
                        for &group in &a.group {
                            let mut c =
                                Config::reference(a.user_blocks, a.zone_blocks, op, victim, skew);
                            c.separation = sep;
                            c.log = log;
                            c.group = group;
                            c.stream_zones = a.stream_zones;
                            c.streams = a.streams.get();
                            c.free_min = a.free_min;
                            c.page_cache_share = a.page_cache_share;
                            c.warm = a.warm;
                            c.measure = a.measure;
                            c.seed = a.seed;
                            let min_zones =
                                a.user_blocks / a.zone_blocks as u64 + a.free_min as u64 + 8;
                            if (c.zones() as u64) <= min_zones {
                                return Err(format!("--op {op} leaves too few spare zones"));
                            }
                            let r = Store::run(c);
                            let pages = if a.page_cache_share > 0.0 {
                                format!(
                                    "{:.2} | {:.2}",
                                    r.page_reads_per_write(),
                                    r.page_writes_per_write()
                                )
                            } else {
                                "- | -".to_string()
                            };
                            println!(
                                "| {:.0} % | {} | {} | {} | {} | {} | {}, {} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
                                op * 100.0,
                                a.zone_blocks,
                                a.user_blocks,
                                skew,
                                victim,
                                sep,
                                log,
                                group,
                                r.wa(),
                                r.device_wa(),
                                r.meta_per_write(),
                                r.victim_u,
                                r.resets_per_mib(),
                                r.extents_per_block,
                                r.single_run_pages,
                                pages
                            );
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn index_cmd(a: IndexArgs) -> Result<(), String> {
    if !(a.volume_tib > 0.0 && a.volume_tib <= 16.0) {
        return Err("--volume-tib must be in (0, 16] (u32 block numbers)".into());
    }
    let blocks = (a.volume_tib * (1u64 << 40) as f64 / 4096.0) as u64;
    let zones = blocks / (a.zone_mib * 256);
    let extents = (blocks as f64 * a.extents_per_block) as u64;
    let m = index::memory(blocks, zones, extents, a.budget_mib * 1024.0 * 1024.0);
    println!(
        "Volume {} TiB: {} blocks, {} zones of {} MiB, {} index pages of {} entries",
        a.volume_tib,
        blocks,
        zones,
        a.zone_mib,
        blocks.div_ceil(PAGE_ENTRIES),
        PAGE_ENTRIES
    );
    println!();
    println!("| index | resident MiB | on device MiB |");
    println!("|---|---|---|");
    println!("| flat L2P, 4 B / block | {:.0} | - |", Memory::mib(m.flat));
    println!(
        "| extent tree, {} extents / block, 24 B each | {:.0} | - |",
        a.extents_per_block,
        Memory::mib(m.extent_tree)
    );
    let cache = m.cache_pages as f64 * 4128.0;
    println!(
        "| paged L2P: directory 4 B / page + zone table 16 B / zone + GC and log buffers + {} cached pages | {:.1} + {:.1} + {:.1} + {:.1} = {:.1} | {:.0} |",
        m.cache_pages,
        Memory::mib(m.directory),
        Memory::mib(m.zone_table),
        Memory::mib(index::OTHER),
        Memory::mib(cache),
        Memory::mib(m.directory + m.zone_table + index::OTHER + cache),
        Memory::mib(m.pages_on_device)
    );
    println!();
    let span = a.span_gib.map_or(blocks, |g| {
        ((g * (1u64 << 30) as f64) as u64 / 4096).clamp(1, blocks)
    });
    println!(
        "Writes over {:.1} GiB ({} pages).",
        span as f64 * 4096.0 / (1u64 << 30) as f64,
        span.div_ceil(PAGE_ENTRIES)
    );
    println!();
    println!("| workload | cache pages | share of pages cached | page misses / write | write-backs / write |");
    println!("|---|---|---|---|---|");
    let mut caches = vec![m.cache_pages];
    caches.extend(a.cache_pages.iter().copied());
    let span = a.span_gib.map_or(blocks, |g| {
        ((g * (1u64 << 30) as f64) as u64 / 4096).clamp(1, blocks)
    });
    let warm = (a.warm_m * 1e6) as u64;
    let measure = (a.measure_m * 1e6) as u64;
    for &skew in &a.workload {
        for &c in &caches {
            let r = index::simulate_pages(
                skew,
                a.streams.get(),
                blocks,
                span,
                c,
                warm,
                measure,
                a.seed,
            );
            println!(
                "| {}{} | {} | {:.3} % | {:.4} | {:.4} |",
                skew,
                a.streams.get().map_or(String::new(), |s| format!(
                    " + {:.0} % streams",
                    s.frac * 100.0
                )),
                c,
                c as f64 / r.pages as f64 * 100.0,
                r.miss_rate(),
                r.write_backs_per_access()
            );
        }
    }
    Ok(())
}
