//! Scheduling policy of a pool and its command-line spelling.

use std::fmt;
use std::str::FromStr;

/// Workers per CPU group for `percpu` without an explicit limit.
pub const DEFAULT_MAX_PER_CPU: usize = 16;
/// Concurrently executing works for `unbound` without an explicit limit: the kernel's per-node
/// cap on unbound workqueues that made dm-zoned slower.
pub const DEFAULT_MAX_ACTIVE: usize = 8;
/// Upper bound on any limit: each unit of concurrency may become one OS thread.
pub const MAX_LIMIT: usize = 1024;

/// How works are spread over workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// One worker group per CPU, threads pinned to it; a work runs on the CPU that queued it.
    /// Up to `max_per_cpu` works of one CPU execute at once, so a work that blocks does not
    /// stall the other works queued on that CPU.
    PerCpu { max_per_cpu: usize },
    /// One group of workers on any CPU; at most `max_active` works execute at once.
    Unbound { max_active: usize },
}

impl Policy {
    /// Works of one group that may execute at once (clamped to `1..=MAX_LIMIT`).
    pub fn group_limit(&self) -> usize {
        let n = match *self {
            Policy::PerCpu { max_per_cpu } => max_per_cpu,
            Policy::Unbound { max_active } => max_active,
        };
        n.clamp(1, MAX_LIMIT)
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::PerCpu {
            max_per_cpu: DEFAULT_MAX_PER_CPU,
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Policy::PerCpu { max_per_cpu } => write!(f, "percpu:{max_per_cpu}"),
            Policy::Unbound { max_active } => write!(f, "unbound:{max_active}"),
        }
    }
}

/// A pool policy string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyParseError {
    #[error("unknown pool policy {0:?} (expected percpu[:N] or unbound[:N])")]
    Unknown(String),
    #[error("bad limit {0:?} in pool policy (expected an integer from 1 to {MAX_LIMIT})")]
    BadLimit(String),
}

impl FromStr for Policy {
    type Err = PolicyParseError;

    /// Accepts `percpu`, `percpu:N`, `unbound`, `unbound:N` (case-insensitive, N in 1..=1024).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (kind, limit) = match s.split_once(':') {
            Some((k, n)) => (k, Some(n)),
            None => (s, None),
        };
        let limit = limit
            .map(|n| match n.trim().parse::<usize>() {
                Ok(v) if (1..=MAX_LIMIT).contains(&v) => Ok(v),
                _ => Err(PolicyParseError::BadLimit(n.to_string())),
            })
            .transpose()?;
        match kind.trim().to_ascii_lowercase().as_str() {
            "percpu" => Ok(Policy::PerCpu {
                max_per_cpu: limit.unwrap_or(DEFAULT_MAX_PER_CPU),
            }),
            "unbound" => Ok(Policy::Unbound {
                max_active: limit.unwrap_or(DEFAULT_MAX_ACTIVE),
            }),
            _ => Err(PolicyParseError::Unknown(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_spellings() {
        assert_eq!(
            "percpu".parse::<Policy>().unwrap(),
            Policy::PerCpu {
                max_per_cpu: DEFAULT_MAX_PER_CPU
            }
        );
        assert_eq!(
            "percpu:3".parse::<Policy>().unwrap(),
            Policy::PerCpu { max_per_cpu: 3 }
        );
        assert_eq!(
            "unbound".parse::<Policy>().unwrap(),
            Policy::Unbound {
                max_active: DEFAULT_MAX_ACTIVE
            }
        );
        assert_eq!(
            "Unbound:64".parse::<Policy>().unwrap(),
            Policy::Unbound { max_active: 64 }
        );
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            "",
            "bound",
            "unbound:0",
            "unbound:x",
            "percpu:-1",
            "unbound:1025",
        ] {
            assert!(bad.parse::<Policy>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn display_round_trips() {
        for p in [
            Policy::PerCpu { max_per_cpu: 5 },
            Policy::Unbound { max_active: 8 },
        ] {
            assert_eq!(p.to_string().parse::<Policy>().unwrap(), p);
        }
    }
}
