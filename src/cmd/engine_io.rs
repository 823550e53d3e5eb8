//! `zonedd engine-io` (hidden): read or write a formatted backend through the dmz engine,
//! without ublk. For tests and interop checks with the kernel's dm-zoned.
//!
//! ```text
//! zonedd engine-io --backend DEV write --offset O --len L [--file F | --pattern SEED] [--fua] [--flush]
//! zonedd engine-io --backend DEV read  --offset O --len L [--file F | --pattern SEED]
//! zonedd engine-io --backend DEV --script FILE      one engine session, one step a line
//! zonedd engine-io pattern --pattern SEED --offset O --len L [--file F]   (no backend)
//! zonedd engine-io --raw PATH ...                    the same steps on a plain device or file
//! ```
//!
//! Without `--file` a write reads stdin and a read writes stdout. `--pattern SEED` stands for
//! generated data (a write writes it, a read compares against it and fails at the first
//! difference): every 8-byte word is a hash of the seed and its absolute offset, so a block
//! that lands in the wrong place never matches; seed 0 is all zeros. `pattern` prints that
//! data, and `--raw` runs steps on a plain device with O_DIRECT, so that the same bytes can be
//! written and compared through another device (dm-zoned) in one process.
//! Offsets and lengths take K/M/G suffixes and must be multiples of 4096. Script lines are a
//! step's arguments (`write --offset 64M --len 1M --pattern 3 --fua`, `flush`); blank lines
//! and `#` comments are skipped. The engine is closed at the end (its log folded into the v2
//! metadata sets), so the kernel's dm-zoned can load the volume right after.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Parser;
use dmz::engine::{Engine, EngineError, EngineOptions};
use zbd::AlignedBuf;

use super::CliError;

const BLOCK: u64 = 4096;
/// Bytes per engine call: large requests go in pieces of this size, as a block device would
/// split them.
const PIECE: usize = 1 << 20;

pub use crate::cli::engine_io::{Args, Op, StepArgs};

/// A script line, parsed with the same definitions as the command line.
#[derive(Parser)]
#[command(no_binary_name = true, disable_help_flag = true)]
struct ScriptLine {
    #[command(flatten)]
    step: StepArgs,
}

/// A validated step.
#[derive(Debug)]
struct Step {
    op: Op,
    offset: u64,
    len: u64,
    data: Data,
    fua: bool,
    flush: bool,
}

#[derive(Debug)]
enum Data {
    File(PathBuf),
    Pattern(u64),
    Stdio,
}

pub fn run(args: Args) -> Result<(), CliError> {
    let steps = match &args.script {
        Some(path) => read_script(path)?,
        None => {
            if args.step.op.is_none() {
                return Err(CliError::Usage(
                    "engine-io: give an operation (read, write, flush, reclaim, pattern) or --script FILE"
                        .into(),
                ));
            }
            vec![step(&args.step)?]
        }
    };
    if steps.iter().all(|s| s.op == Op::Pattern) {
        for s in &steps {
            print_pattern(s)?;
        }
        return Ok(());
    }
    let target = match (args.backend.first(), &args.raw) {
        (Some(_), _) => {
            let vol = super::VolumeArgs {
                backends: &args.backend,
                cache: args.cache.as_deref(),
            };
            open(&vol)?
        }
        (None, Some(path)) => Target::Raw(Raw::open(path)?),
        (None, None) => {
            return Err(CliError::Usage(
                "engine-io: --backend PATH (or --raw PATH) is required".into(),
            ))
        }
    };
    let result = steps.iter().try_for_each(|s| run_step(&target, s));
    // Close even after a failed step: what was written stays consistent for the next opener.
    result.and(target.close())
}

/// What the steps run against.
enum Target {
    Engine(Engine, String),
    /// A log-layout volume (`format --layout log`).
    Log(Box<dmz::lsl::LogEngine>, String),
    Raw(Raw),
}

impl Target {
    fn capacity(&self) -> u64 {
        match self {
            Target::Engine(e, _) => e.capacity(),
            Target::Log(e, _) => e.capacity(),
            Target::Raw(r) => r.size,
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), CliError> {
        match self {
            Target::Engine(e, _) => e
                .read(offset, buf)
                .map_err(|e| engine_err("read", buf.len(), offset, e)),
            Target::Log(e, _) => e
                .read(offset, buf)
                .map_err(|e| engine_err("read", buf.len(), offset, e)),
            Target::Raw(r) => r
                .file
                .read_exact_at(buf, offset)
                .map_err(|e| r.err("read", buf.len(), offset, e)),
        }
    }

    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), CliError> {
        match self {
            Target::Engine(e, _) => e
                .write(offset, buf, fua)
                .map_err(|e| engine_err("write", buf.len(), offset, e)),
            Target::Log(e, _) => e
                .write(offset, buf, fua)
                .map_err(|e| engine_err("write", buf.len(), offset, e)),
            Target::Raw(r) => {
                r.file
                    .write_all_at(buf, offset)
                    .map_err(|e| r.err("write", buf.len(), offset, e))?;
                if fua {
                    self.flush()?;
                }
                Ok(())
            }
        }
    }

    fn flush(&self) -> Result<(), CliError> {
        match self {
            Target::Engine(e, _) => e
                .flush()
                .map_err(|e| CliError::Failed(format!("flush: {e}"))),
            Target::Log(e, _) => e
                .flush()
                .map_err(|e| CliError::Failed(format!("flush: {e}"))),
            Target::Raw(r) => r
                .file
                .sync_data()
                .map_err(|e| CliError::Failed(format!("{}: flush: {e}", r.name))),
        }
    }

    /// A forced reclaim pass, waited for; one line on stderr says what it did.
    fn reclaim(&self) -> Result<(), CliError> {
        let Target::Engine(e, _) = self else {
            return Err(CliError::Usage(
                "reclaim needs a dm-zoned engine (--backend of a dm-zoned volume)".into(),
            ));
        };
        let before = e.stats();
        let t = std::time::Instant::now();
        e.trigger_reclaim();
        e.wait_reclaim_idle();
        let after = e.stats();
        eprintln!(
            "reclaim: {} zone(s) reclaimed, {} block(s) copied in {:.1} s; {} buffer zone(s) left",
            after.reclaim_zones - before.reclaim_zones,
            after.reclaim_blocks_copied - before.reclaim_blocks_copied,
            t.elapsed().as_secs_f64(),
            after.zones_buffer
        );
        Ok(())
    }

    fn close(self) -> Result<(), CliError> {
        match self {
            Target::Engine(e, name) => e
                .close()
                .map_err(|e| CliError::Failed(format!("{name}: closing the engine: {e}"))),
            Target::Log(e, name) => e
                .close()
                .map_err(|e| CliError::Failed(format!("{name}: closing the log engine: {e}"))),
            Target::Raw(r) => r
                .file
                .sync_data()
                .map_err(|e| CliError::Failed(format!("{}: flush: {e}", r.name))),
        }
    }
}

fn engine_err(what: &str, len: usize, offset: u64, e: EngineError) -> CliError {
    let msg = format!("{what} {len} bytes at {offset}: {e}");
    match e {
        EngineError::Invalid(_) => CliError::Usage(msg),
        _ => CliError::Failed(msg),
    }
}

/// A plain block device or file, opened O_DIRECT so that reads come from the device below,
/// not from the page cache.
struct Raw {
    file: File,
    size: u64,
    name: String,
}

impl Raw {
    fn open(path: &Path) -> Result<Raw, CliError> {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::OpenOptionsExt;
        let name = path.display().to_string();
        let open = |flags| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(flags)
                .open(path)
        };
        // Some file systems refuse O_DIRECT (EINVAL); their files are read through the cache.
        let mut file = match open(libc::O_DIRECT) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(0),
            r => r,
        }
        .map_err(|e| CliError::Usage(format!("{name}: {e}")))?;
        // A block device's size is where its end is; a file's is its length.
        let size = file
            .seek(SeekFrom::End(0))
            .map_err(|e| CliError::Failed(format!("{name}: {e}")))?;
        Ok(Raw { file, size, name })
    }

    fn err(&self, what: &str, len: usize, offset: u64, e: std::io::Error) -> CliError {
        CliError::Failed(format!(
            "{}: {what} {len} bytes at {offset}: {e}",
            self.name
        ))
    }
}

/// The engine of the volume's layout: the log layout's when conventional block 0 says so,
/// else dm-zoned's.
fn open(vol: &super::VolumeArgs) -> Result<Target, CliError> {
    let p = vol.name();
    vol.validate()?;
    let dev = match vol.cache {
        None => zbd::open(&vol.backends[0]),
        Some(c) => {
            let drives: Vec<&Path> = vol.backends.iter().map(|b| b.as_path()).collect();
            zbd::open_multi(c, &drives, true).map(|m| Box::new(m) as Box<dyn zbd::ZonedDevice>)
        }
    }
    .map_err(|e| match e {
        zbd::ZbdError::Open(_) | zbd::ZbdError::Invalid(_) => CliError::Usage(e.to_string()),
        e => CliError::Failed(format!("{p}: {e}")),
    })?;
    let dev: Arc<dyn zbd::ZonedDevice> = Arc::from(dev);
    if vol.cache.is_none() && dmz::lsl::is_log_layout(dev.as_ref()) {
        return dmz::lsl::LogEngine::open(dev, Default::default())
            .map(|e| Target::Log(Box::new(e), p.clone()))
            .map_err(|e| CliError::Failed(format!("{p}: opening the log engine: {e}")));
    }
    let e = Engine::open(dev, EngineOptions::default()).map_err(|e| match e {
        EngineError::Format(dmz::format::FormatError::NotFormatted(_)) => CliError::Usage(format!(
            "{p}: no valid dm-zoned superblock: not formatted? run `zonedd format {}`",
            vol.flags()
        )),
        EngineError::Format(f @ dmz::format::FormatError::Device(_)) => {
            CliError::Usage(format!("{p}: {f}"))
        }
        e => CliError::Failed(format!("{p}: opening the engine: {e}")),
    })?;
    Ok(Target::Engine(e, p))
}

fn read_script(path: &Path) -> Result<Vec<Step>, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
    let mut steps = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |msg: String| CliError::Usage(format!("{}:{}: {msg}", path.display(), i + 1));
        let parsed = ScriptLine::try_parse_from(line.split_whitespace())
            .map_err(|e| at(first_line(&e.to_string())))?;
        if parsed.step.op.is_none() {
            return Err(at(
                "no operation (read, write, flush, reclaim, pattern)".into()
            ));
        }
        if parsed.step.file.is_none() && parsed.step.pattern.is_none() {
            // stdin/stdout belong to the whole run, not to one of its steps.
            if matches!(parsed.step.op, Some(Op::Read | Op::Write)) {
                return Err(at("a script step needs --file or --pattern".into()));
            }
        }
        steps.push(step(&parsed.step).map_err(|e| at(e.to_string()))?);
    }
    Ok(steps)
}

fn first_line(s: &str) -> String {
    s.lines()
        .next()
        .unwrap_or("")
        .trim_start_matches("error: ")
        .to_string()
}

fn size(name: &str, v: &Option<String>) -> Result<u64, CliError> {
    let v = v
        .as_deref()
        .ok_or_else(|| CliError::Usage(format!("{name} is required")))?;
    let n = zbd::parse_size(v).map_err(|e| CliError::Usage(format!("{name}: {e}")))?;
    if n % BLOCK != 0 {
        return Err(CliError::Usage(format!(
            "{name} {n} is not a multiple of 4096"
        )));
    }
    Ok(n)
}

fn step(a: &StepArgs) -> Result<Step, CliError> {
    let op = a.op.unwrap_or(Op::Read);
    let data = match (&a.file, a.pattern) {
        (Some(f), _) => Data::File(f.clone()),
        (None, Some(seed)) => Data::Pattern(seed),
        (None, None) => Data::Stdio,
    };
    if op == Op::Flush || op == Op::Reclaim {
        return Ok(Step {
            op,
            offset: 0,
            len: 0,
            data,
            fua: false,
            flush: true,
        });
    }
    if op == Op::Pattern && a.pattern.is_none() {
        return Err(CliError::Usage("pattern needs --pattern SEED".into()));
    }
    if op != Op::Write && (a.fua || a.flush) {
        return Err(CliError::Usage("--fua and --flush go with write".into()));
    }
    let offset = size("--offset", &a.offset)?;
    let len = size("--len", &a.len)?;
    if len == 0 {
        return Err(CliError::Usage("--len must not be 0".into()));
    }
    Ok(Step {
        op,
        offset,
        len,
        data,
        fua: a.fua,
        flush: a.flush,
    })
}

fn run_step(t: &Target, s: &Step) -> Result<(), CliError> {
    if matches!(s.op, Op::Read | Op::Write) {
        let cap = t.capacity();
        if s.offset.checked_add(s.len).is_none_or(|end| end > cap) {
            return Err(CliError::Usage(format!(
                "{} bytes at {} go past the end of the device ({cap} bytes)",
                s.len, s.offset
            )));
        }
    }
    match s.op {
        Op::Pattern => print_pattern(s)?,
        Op::Flush => t.flush()?,
        Op::Reclaim => t.reclaim()?,
        Op::Write => {
            let mut src = Source::new(&s.data, s.len)?;
            // 4096-aligned: O_DIRECT needs it, and the engine's device backend then needs no
            // bounce buffer either.
            let mut buf = AlignedBuf::new_zeroed(PIECE.min(s.len as usize));
            let mut done = 0u64;
            while done < s.len {
                let b = &mut buf[..PIECE.min((s.len - done) as usize)];
                src.fill(s.offset + done, b)?;
                t.write(s.offset + done, b, s.fua)?;
                done += b.len() as u64;
            }
            if s.flush {
                t.flush()?;
            }
        }
        Op::Read => {
            let mut sink = Sink::new(&s.data)?;
            let mut buf = AlignedBuf::new_zeroed(PIECE.min(s.len as usize));
            let mut done = 0u64;
            while done < s.len {
                let b = &mut buf[..PIECE.min((s.len - done) as usize)];
                t.read(s.offset + done, b)?;
                sink.take(s.offset + done, b)?;
                done += b.len() as u64;
            }
            sink.finish()?;
        }
    }
    Ok(())
}

fn print_pattern(s: &Step) -> Result<(), CliError> {
    let Data::Pattern(seed) = s.data else {
        return Err(CliError::Usage("pattern needs --pattern SEED".into()));
    };
    let mut out: Box<dyn Write> = match &s.data {
        Data::File(f) => Box::new(create(f)?),
        _ => Box::new(std::io::stdout().lock()),
    };
    let mut buf = vec![0u8; PIECE.min(s.len as usize)];
    let mut done = 0u64;
    while done < s.len {
        let n = PIECE.min((s.len - done) as usize);
        fill_pattern(seed, s.offset + done, &mut buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| CliError::Failed(format!("writing the pattern: {e}")))?;
        done += n as u64;
    }
    out.flush()
        .map_err(|e| CliError::Failed(format!("writing the pattern: {e}")))
}

fn create(f: &Path) -> Result<File, CliError> {
    File::create(f).map_err(|e| CliError::Failed(format!("{}: {e}", f.display())))
}

/// Generated data: each 8-byte word is splitmix64 of the seed and the word's absolute index,
/// so data is tied to its place. Seed 0 is zeros (what unwritten blocks read as).
pub fn fill_pattern(seed: u64, offset: u64, buf: &mut [u8]) {
    if seed == 0 {
        buf.fill(0);
        return;
    }
    let key = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let first = offset / 8;
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        let mut z = key ^ (first + i as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        w.copy_from_slice(&z.to_le_bytes());
    }
}

/// Where a write's data comes from.
enum Source {
    Reader(Box<dyn Read>, String),
    Pattern(u64),
}

impl Source {
    fn new(d: &Data, len: u64) -> Result<Source, CliError> {
        Ok(match d {
            Data::Pattern(seed) => Source::Pattern(*seed),
            Data::Stdio => Source::Reader(Box::new(std::io::stdin().lock()), "stdin".into()),
            Data::File(f) => {
                let file =
                    File::open(f).map_err(|e| CliError::Usage(format!("{}: {e}", f.display())))?;
                let have = file
                    .metadata()
                    .map_err(|e| CliError::Usage(format!("{}: {e}", f.display())))?
                    .len();
                if have < len {
                    return Err(CliError::Usage(format!(
                        "{}: {have} bytes, shorter than --len {len}",
                        f.display()
                    )));
                }
                Source::Reader(Box::new(file), f.display().to_string())
            }
        })
    }

    fn fill(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), CliError> {
        match self {
            Source::Pattern(seed) => fill_pattern(*seed, offset, buf),
            Source::Reader(r, name) => r
                .read_exact(buf)
                .map_err(|e| CliError::Failed(format!("{name}: {e} (fewer bytes than --len?)")))?,
        }
        Ok(())
    }
}

/// Where a read's data goes: a file, stdout, or a comparison with a pattern.
enum Sink {
    Writer(Box<dyn Write>, String),
    Verify(u64, Vec<u8>),
}

impl Sink {
    fn new(d: &Data) -> Result<Sink, CliError> {
        Ok(match d {
            Data::Pattern(seed) => Sink::Verify(*seed, Vec::new()),
            Data::Stdio => Sink::Writer(Box::new(std::io::stdout().lock()), "stdout".into()),
            Data::File(f) => Sink::Writer(Box::new(create(f)?), f.display().to_string()),
        })
    }

    fn take(&mut self, offset: u64, data: &[u8]) -> Result<(), CliError> {
        match self {
            Sink::Writer(w, name) => w
                .write_all(data)
                .map_err(|e| CliError::Failed(format!("{name}: {e}"))),
            Sink::Verify(seed, want) => {
                want.resize(data.len(), 0);
                fill_pattern(*seed, offset, want);
                if let Some(i) = data.iter().zip(want.iter()).position(|(a, b)| a != b) {
                    let at = offset + i as u64;
                    let block = at / BLOCK * BLOCK;
                    return Err(CliError::Failed(format!(
                        "data differs from pattern {seed} at byte {at} (block at {block}{})",
                        if data[(block - offset) as usize..]
                            .iter()
                            .take(4096)
                            .all(|&b| b == 0)
                        {
                            ", which reads as zeros"
                        } else {
                            ""
                        }
                    )));
                }
                Ok(())
            }
        }
    }

    fn finish(self) -> Result<(), CliError> {
        match self {
            Sink::Writer(mut w, name) => w
                .flush()
                .map_err(|e| CliError::Failed(format!("{name}: {e}"))),
            Sink::Verify(..) => Ok(()),
        }
    }
}
