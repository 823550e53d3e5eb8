//! Workloads: which logical 4 KiB block the next user write overwrites.
//!
//! All generators are deterministic for a given seed. Hot blocks sit at low logical block
//! numbers (as in peers-reference section 2.3: "Zipf by LBA rank, hot blocks clustered at low
//! LBAs"), so a skewed workload is also skewed per index page.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::str::FromStr;

/// The shape of the random part of a workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Skew {
    /// Every block equally likely.
    Uniform,
    /// `share` of the writes go to the first `frac` of the blocks (80/20: `frac` 0.2,
    /// `share` 0.8), uniformly within each part.
    HotCold { frac: f64, share: f64 },
    /// Zipf by rank, `p(r) ~ 1 / (r + 1)^theta`, rank = logical block.
    Zipf { theta: f64 },
}

impl FromStr for Skew {
    type Err = String;
    /// `uniform`, `80-20`, `90-10` (any `S-F` with S + F = 100), `zipf` (theta 0.99) or
    /// `zipf:THETA`.
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "uniform" {
            return Ok(Skew::Uniform);
        }
        if s == "zipf" {
            return Ok(Skew::Zipf { theta: 0.99 });
        }
        if let Some(t) = s.strip_prefix("zipf:") {
            let theta: f64 = t.parse().map_err(|_| format!("bad zipf theta {t:?}"))?;
            if !(theta > 0.0 && theta < 10.0) {
                return Err(format!("zipf theta {theta} out of (0, 10)"));
            }
            return Ok(Skew::Zipf { theta });
        }
        if let Some((a, b)) = s.split_once('-') {
            let share: f64 = a.parse().map_err(|_| format!("bad skew {s:?}"))?;
            let frac: f64 = b.parse().map_err(|_| format!("bad skew {s:?}"))?;
            if share + frac == 100.0 && frac > 0.0 && share > 0.0 {
                return Ok(Skew::HotCold {
                    frac: frac / 100.0,
                    share: share / 100.0,
                });
            }
        }
        Err(format!(
            "unknown workload {s:?} (uniform, 80-20, 90-10, zipf, zipf:THETA)"
        ))
    }
}

impl Skew {
    /// A block of `0..blocks` drawn by a uniform or hot/cold skew; `None` for Zipf, whose
    /// callers draw from their own cumulative distribution (of blocks or of index pages).
    pub(crate) fn draw_flat(&self, rng: &mut StdRng, blocks: u64) -> Option<u64> {
        match *self {
            Skew::Uniform => Some(rng.gen_range(0..blocks)),
            Skew::HotCold { frac, share } => {
                let hot = ((blocks as f64 * frac) as u64).clamp(1, blocks - 1);
                Some(if rng.gen::<f64>() < share {
                    rng.gen_range(0..hot)
                } else {
                    rng.gen_range(hot..blocks)
                })
            }
            Skew::Zipf { .. } => None,
        }
    }
}

impl fmt::Display for Skew {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skew::Uniform => write!(f, "uniform"),
            Skew::HotCold { frac, share } => {
                write!(f, "{:.0}-{:.0}", share * 100.0, frac * 100.0)
            }
            Skew::Zipf { theta } => write!(f, "zipf:{theta}"),
        }
    }
}

/// Sequential streams mixed into the random writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Streams {
    /// Fraction of the writes that belong to a stream.
    pub frac: f64,
    /// Concurrent streams (each its own sequential run).
    pub count: u32,
    /// Blocks a stream writes before it jumps to a new aligned start.
    pub len: u64,
}

/// Where a write comes from, for hot/cold separation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A random write.
    Random,
    /// A write of stream number `n`.
    Stream(u32),
}

/// A block-number generator over `blocks` logical blocks.
pub struct Workload {
    skew: Skew,
    streams: Option<Streams>,
    blocks: u64,
    rng: StdRng,
    zipf_cdf: Vec<f64>,
    stream_pos: Vec<(u64, u64)>,
}

impl Workload {
    pub fn new(skew: Skew, streams: Option<Streams>, blocks: u64, seed: u64) -> Self {
        let zipf_cdf = match skew {
            Skew::Zipf { theta } => zipf_cdf(blocks, theta),
            _ => Vec::new(),
        };
        let mut w = Workload {
            skew,
            streams,
            blocks,
            rng: StdRng::seed_from_u64(seed),
            zipf_cdf,
            stream_pos: Vec::new(),
        };
        if let Some(s) = streams {
            for _ in 0..s.count {
                let p = w.stream_start(s.len);
                w.stream_pos.push(p);
            }
        }
        w
    }

    fn stream_start(&mut self, len: u64) -> (u64, u64) {
        let starts = (self.blocks / len).max(1);
        let start = self.rng.gen_range(0..starts) * len;
        (start, start + len.min(self.blocks))
    }

    /// The next block to write and where it comes from.
    pub fn next_write(&mut self) -> (u64, Origin) {
        if let Some(s) = self.streams {
            if self.rng.gen::<f64>() < s.frac {
                let n = self.rng.gen_range(0..s.count);
                let (pos, end) = self.stream_pos[n as usize];
                let next = if pos + 1 >= end {
                    self.stream_start(s.len)
                } else {
                    (pos + 1, end)
                };
                self.stream_pos[n as usize] = next;
                return (pos, Origin::Stream(n));
            }
        }
        (self.random_block(), Origin::Random)
    }

    fn random_block(&mut self) -> u64 {
        if let Some(b) = self.skew.draw_flat(&mut self.rng, self.blocks) {
            return b;
        }
        let u: f64 = self.rng.gen();
        (self.zipf_cdf.partition_point(|&c| c < u) as u64).min(self.blocks - 1)
    }
}

/// Normalised cumulative distribution of Zipf(theta) over `n` ranks.
fn zipf_cdf(n: u64, theta: f64) -> Vec<f64> {
    let mut cdf = Vec::with_capacity(n as usize);
    let mut sum = 0.0;
    for r in 0..n {
        sum += 1.0 / ((r + 1) as f64).powf(theta);
        cdf.push(sum);
    }
    for c in &mut cdf {
        *c /= sum;
    }
    cdf
}

/// Generalised harmonic numbers `H(k) = sum_{r=1..k} r^-theta` without a table of all ranks:
/// exact for the first 4096 ranks, an Euler-Maclaurin integral beyond (relative error < 1e-6
/// there). Used by the full-scale index simulation, whose 2.7 G ranks do not fit a table.
pub struct Harmonic {
    theta: f64,
    exact: Vec<f64>,
}

impl Harmonic {
    const EXACT: u64 = 4096;

    pub fn new(theta: f64) -> Self {
        let mut exact = vec![0.0];
        let mut h = 0.0;
        for r in 1..=Self::EXACT {
            h += (r as f64).powf(-theta);
            exact.push(h);
        }
        Harmonic { theta, exact }
    }

    /// `H(k)`.
    pub fn h(&self, k: u64) -> f64 {
        if k <= Self::EXACT {
            return self.exact[k as usize];
        }
        let (lo, hi) = (Self::EXACT as f64 + 0.5, k as f64 + 0.5);
        let t = self.theta;
        let tail = if (t - 1.0).abs() < 1e-12 {
            (hi / lo).ln()
        } else {
            (hi.powf(1.0 - t) - lo.powf(1.0 - t)) / (1.0 - t)
        };
        self.exact[Self::EXACT as usize] + tail
    }

    /// Probability of ranks `[a, b)` (0-based) among `n` ranks.
    pub fn mass(&self, a: u64, b: u64, n: u64) -> f64 {
        (self.h(b) - self.h(a)) / self.h(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_workloads() {
        assert_eq!("uniform".parse::<Skew>(), Ok(Skew::Uniform));
        assert_eq!(
            "80-20".parse::<Skew>(),
            Ok(Skew::HotCold {
                frac: 0.2,
                share: 0.8
            })
        );
        assert_eq!("zipf".parse::<Skew>(), Ok(Skew::Zipf { theta: 0.99 }));
        assert!("80-30".parse::<Skew>().is_err());
        assert!("zipf:x".parse::<Skew>().is_err());
    }

    #[test]
    fn hot_cold_hits_the_hot_part_at_its_share() {
        let mut w = Workload::new("80-20".parse().unwrap(), None, 10_000, 1);
        let hot = (0..100_000).filter(|_| w.next_write().0 < 2_000).count();
        assert!((78_000..82_000).contains(&hot), "{hot}");
    }

    #[test]
    fn zipf_mass_matches_the_table() {
        let n = 100_000;
        let cdf = zipf_cdf(n, 0.99);
        let h = Harmonic::new(0.99);
        for (a, b) in [(0, 10), (10, 5000), (5000, 77_777), (0, n)] {
            let table = cdf[b as usize - 1] - if a == 0 { 0.0 } else { cdf[a as usize - 1] };
            let formula = h.mass(a, b, n);
            assert!(
                (table - formula).abs() < 1e-6,
                "{a}..{b}: {table} {formula}"
            );
        }
    }

    #[test]
    fn streams_write_sequentially() {
        let s = Streams {
            frac: 1.0,
            count: 1,
            len: 64,
        };
        let mut w = Workload::new(Skew::Uniform, Some(s), 1 << 16, 3);
        let first = w.next_write().0;
        for i in 1..64 {
            assert_eq!(w.next_write(), (first + i, Origin::Stream(0)));
        }
    }
}
