//! Helpers shared by the engine tests.
#![allow(dead_code)]

use std::sync::Arc;

use dmz::engine::{Engine, EngineOptions};
use dmz::sets::{format_device, FormatOptions};
use zbd::{MemDevice, ZonedDevice};

pub const BS: usize = 4096;

/// A formatted in-memory device: `nr_zones` zones of `zone_kib` KiB, `nr_conv`
/// conventional, `reserved` sequential zones kept for reclaim.
pub fn formatted_mem(zone_kib: u64, nr_zones: u32, nr_conv: u32, reserved: u32) -> Arc<MemDevice> {
    let dev = MemDevice::with_zones(zone_kib * 1024, nr_zones, nr_conv).expect("mem device");
    format_dev(&dev, reserved);
    Arc::new(dev)
}

pub fn format_dev(dev: &dyn ZonedDevice, reserved: u32) {
    let opts = FormatOptions {
        label: Some("test".into()),
        reserved_seq: reserved,
    };
    format_device(dev, &opts, &mut |_, _| {}).expect("format");
}

/// Options for tests: no idle timer, prompt reclaim, no throttle.
pub fn test_opts() -> EngineOptions {
    let mut o = EngineOptions::default();
    o.reclaim.throttle = std::time::Duration::ZERO;
    o.reclaim.idle_period = std::time::Duration::from_secs(3600);
    o.reclaim.wait_timeout = std::time::Duration::from_secs(30);
    o
}

pub fn open(dev: Arc<dyn ZonedDevice>, opts: EngineOptions) -> Engine {
    Engine::open(dev, opts).expect("engine open")
}

/// Fill `out` (whole blocks) with a pattern unique to (`id`, first block `block`).
pub fn pattern(id: u64, block: u64, out: &mut [u8]) {
    for (i, b) in out.chunks_mut(BS).enumerate() {
        let tag = (id << 24) ^ (block + i as u64) ^ 0x9e37_79b9_7f4a_7c15;
        for (k, w) in b.chunks_mut(8).enumerate() {
            let v = tag
                .wrapping_mul(0x2545_f491_4f6c_dd1d)
                .wrapping_add(k as u64);
            w.copy_from_slice(&v.to_le_bytes());
        }
        b[..8].copy_from_slice(&id.to_le_bytes());
        b[8..16].copy_from_slice(&(block + i as u64).to_le_bytes());
    }
}

/// (write id, block) a pattern block was made for; (0, 0) for zeros.
pub fn pattern_of(b: &[u8]) -> (u64, u64) {
    (
        u64::from_le_bytes(b[..8].try_into().unwrap()),
        u64::from_le_bytes(b[8..16].try_into().unwrap()),
    )
}
