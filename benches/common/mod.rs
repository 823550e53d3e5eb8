//! Helpers shared by the benches (each bench is its own crate: `mod common;`).

/// `name` from the environment as a number, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// MiB/s of `bytes` in `secs`.
pub fn rate(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64 / secs
}
