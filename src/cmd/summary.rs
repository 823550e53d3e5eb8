//! What `zonedd status`, `status --watch`, `list` and `reclaim` show a person, computed from
//! the daemon's status JSON (docs/status.md lists its names): pure functions, JSON in and
//! lines out, so that every figure is tested against a fixed status.

use serde_json::Value;

/// A number at `path` (`["engine", "zones_free"]`), if present.
pub fn num(v: &Value, path: &[&str]) -> Option<u64> {
    let mut v = v;
    for k in path {
        v = v.get(k)?;
    }
    v.as_u64()
}

fn float(v: &Value, path: &[&str]) -> Option<f64> {
    let mut v = v;
    for k in path {
        v = v.get(k)?;
    }
    v.as_f64()
}

fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key)?.as_str()
}

/// Bytes in binary units: `512 B`, `4 KiB`, `1.5 GiB`, `12.3 TiB` (whole numbers without
/// decimals).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut i = 0;
    while i + 1 < UNITS.len() && n >= 1u64 << (10 * (i + 1)) {
        i += 1;
    }
    if i == 0 {
        return format!("{n} B");
    }
    let unit = 1u64 << (10 * i);
    if n.is_multiple_of(unit) {
        format!("{} {}", n / unit, UNITS[i])
    } else {
        format!("{:.1} {}", n as f64 / unit as f64, UNITS[i])
    }
}

/// A rate in bytes per second, like [`bytes`] with `/s`.
pub fn rate(bytes_per_sec: f64) -> String {
    format!("{}/s", bytes(bytes_per_sec.max(0.0).round() as u64))
}

/// A duration for a person: `42s`, `5m 07s`, `2h 03m`, `3d 04h`.
pub fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}d {h:02}h")
    } else if secs >= 3600 {
        format!("{}h {m:02}m", secs / 3600)
    } else if secs >= 60 {
        format!("{m}m {s:02}s")
    } else {
        format!("{s}s")
    }
}

/// `part` of `whole` in whole percent (0 when `whole` is 0).
fn pct(part: u64, whole: u64) -> u64 {
    (part * 100).checked_div(whole).unwrap_or(0)
}

/// Space held by mapped chunks: what the volume has written somewhere (a chunk counts whole
/// once any block of it was written and not discarded since).
pub fn used_bytes(s: &Value) -> Option<u64> {
    Some(num(s, &["engine", "chunks_mapped"])? * num(s, &["chunk_bytes"])?)
}

/// Conventional zones in use (data and buffer zones: the cache reclaim drains), and how many
/// conventional zones hold no metadata.
pub fn cache_zones(s: &Value) -> Option<(u64, u64)> {
    let conv = num(s, &["geometry", "conventional_zones"])?;
    let meta = num(s, &["engine", "zones_meta"])?;
    let free = num(s, &["engine", "zones_free_conventional"])?;
    let usable = conv.saturating_sub(meta);
    Some((usable.saturating_sub(free), usable))
}

/// Blocks the engine counts in (reclaim copies, progress).
pub const BLOCK: u64 = 4096;

/// Rates between two status samples taken `secs` apart, in bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub read: f64,
    pub write: f64,
    pub device: f64,
    pub reclaim: f64,
    pub iops: f64,
}

pub fn rates(prev: &Value, now: &Value, secs: f64) -> Option<Rates> {
    if secs <= 0.0 {
        return None;
    }
    let d = |path: &[&str]| -> f64 {
        let (a, b) = (num(prev, path).unwrap_or(0), num(now, path).unwrap_or(0));
        b.saturating_sub(a) as f64 / secs
    };
    Some(Rates {
        read: d(&["frontend", "read_bytes"]),
        write: d(&["frontend", "write_bytes"]),
        device: d(&["engine", "device_bytes_written"]),
        reclaim: d(&["engine", "reclaim_blocks_copied"]) * BLOCK as f64,
        iops: d(&["frontend", "reads"]) + d(&["frontend", "writes"]),
    })
}

/// The reclaim line's text after `reclaim   `.
fn reclaim_text(s: &Value, r: Option<&Rates>) -> Option<String> {
    let e = s.get("engine").filter(|e| !e.is_null())?;
    let state = e
        .get("reclaim_state")
        .and_then(Value::as_str)
        .unwrap_or("?");
    let zones = num(e, &["reclaim_zones"]).unwrap_or(0);
    let copied = num(e, &["reclaim_blocks_copied"]).unwrap_or(0) * BLOCK;
    let mut t = state.to_string();
    if state == "running" {
        let cur = num(e, &["reclaim_progress_blocks"]).unwrap_or(0) * BLOCK;
        t += &format!(", {} copied into the current zone", bytes(cur));
        if let Some(r) = r {
            t += &format!(" at {}", rate(r.reclaim));
        }
    }
    let asked = num(e, &["reclaim_requests"]).unwrap_or(0);
    let done = num(e, &["reclaim_requests_done"]).unwrap_or(0);
    if asked > done {
        t += &format!(" ({} requested pass pending)", asked - done);
    }
    t += &format!(
        "; {zones} zone{} reclaimed since start, {} copied",
        if zones == 1 { "" } else { "s" },
        bytes(copied)
    );
    Some(t)
}

/// The lines of a log-layout volume's engine (`dmz::lsl::LogStats`): its zones, GC, write
/// amplification and index, in place of the v2 engine's zones, cache, reclaim and write amp.
fn log_lines(e: &Value, line: &mut impl FnMut(&str, String)) {
    let n = |k: &str| num(e, &[k]).unwrap_or(0);
    let blocks = |k: &str| bytes(n(k) * BLOCK);
    line(
        "zones",
        format!(
            "{} free, {} open ({} user frontiers and GC's), {} full; {} valid",
            n("zones_free"),
            n("zones_open"),
            n("user_frontiers"),
            n("zones_full"),
            blocks("valid_blocks")
        ),
    );
    line(
        "GC",
        format!(
            "{} zones freed, {} copied ({} paced batches, {} forced victims)",
            n("gc_zones_freed"),
            blocks("gc_blocks_copied"),
            n("gc_paced_batches"),
            n("gc_forced_victims")
        ),
    );
    line(
        "compact",
        format!(
            "on {}: {} pages rewritten in order ({}), {} to look at, {} skipped; background {}",
            e.get("compact_on").and_then(Value::as_str).unwrap_or("?"),
            n("compact_pages"),
            blocks("compact_blocks"),
            n("compact_marked_pages"),
            n("compact_skipped_pages"),
            e.get("background").and_then(Value::as_str).unwrap_or("?")
        ),
    );
    // With nothing written by users since the daemon started (GC or compaction may have
    // copied all the same), there is no ratio.
    let wa = match n("user_blocks_written") {
        0 => "-".to_string(),
        _ => format!("{:.2}", float(e, &["write_amplification"]).unwrap_or(0.0)),
    };
    line(
        "write amp",
        format!(
            "{wa} ({} written by users, {} copied by GC, {} by compaction)",
            blocks("user_blocks_written"),
            blocks("gc_blocks_copied"),
            blocks("compact_blocks")
        ),
    );
    line(
        "index",
        format!(
            "{} resident ({} of {} pages cached); {} pages read, {} written back; {} \
             checkpoints, {} log blocks written",
            bytes(n("index_resident_bytes")),
            n("index_cached_pages"),
            n("index_cache_pages"),
            n("index_page_reads"),
            n("index_pages_written_back"),
            n("checkpoints"),
            n("log_blocks_written")
        ),
    );
}

/// The summary of one device, a few lines of `label    text`. `rates`: from the previous
/// sample (`--watch`, or a second look while reclaim runs).
pub fn summary(s: &Value, r: Option<&Rates>) -> Vec<String> {
    let mut out = Vec::new();
    let mut line = |k: &str, v: String| out.push(format!("{k:<9} {v}"));
    let id = num(s, &["id"]).map(|i| i.to_string()).unwrap_or("?".into());
    let mut dev = format!(
        "{} (id {id}{})",
        text(s, "bdev").unwrap_or("?"),
        text(s, "label")
            .map(|l| format!(", label \"{l}\""))
            .unwrap_or_default()
    );
    if let Some(pid) = num(s, &["pid"]) {
        dev += &format!(", daemon pid {pid}");
    }
    if let Some(up) = num(s, &["uptime_secs"]) {
        dev += &format!(", up {}", duration(up));
    }
    if let Some(v) = text(s, "version") {
        dev += &format!(", zonedd {v}");
    }
    line("device", dev);

    let mut be = text(s, "backend").unwrap_or("?").to_string();
    if let Some(l) = text(s, "layout") {
        be += &format!(": {l}");
    }
    if let (Some(z), Some(zb)) = (
        num(s, &["geometry", "zones"]),
        num(s, &["geometry", "zone_bytes"]),
    ) {
        be += &format!(", {z} zones of {}", bytes(zb));
        if let Some(c) = num(s, &["geometry", "conventional_zones"]) {
            be += &format!(" ({c} conventional)");
        }
    }
    line("backend", be);
    // A multi-device volume: each device and its zones.
    let members = s
        .get("geometry")
        .and_then(|g| g.get("members"))
        .and_then(|m| m.as_array())
        .filter(|m| m.len() > 1);
    for m in members.into_iter().flatten() {
        let first = num(m, &["first_zone"]).unwrap_or(0);
        let n = num(m, &["nr_zones"]).unwrap_or(0);
        let kind = if m.get("cache").and_then(|c| c.as_bool()) == Some(true) {
            "cache"
        } else {
            "zoned"
        };
        line(
            "device",
            format!(
                "{} ({kind}): zones {first}-{}: {}",
                num(m, &["index"]).unwrap_or(0),
                (first + n).saturating_sub(1),
                text(m, "name").unwrap_or("?")
            ),
        );
    }

    let e = s.get("engine").filter(|e| !e.is_null());
    // A log-layout volume's engine has its own counters (dmz::lsl::LogStats).
    let (log_engine, e) = match e {
        Some(e) if e.get("user_blocks_written").is_some() => (Some(e), None),
        e => (None, e),
    };
    if let Some(cap) = num(s, &["capacity_bytes"]) {
        let mut c = bytes(cap);
        if let (Some(used), Some(e)) = (used_bytes(s), e) {
            let mapped = num(e, &["chunks_mapped"]).unwrap_or(0);
            let total = num(e, &["chunks_total"]).unwrap_or(0);
            c += &format!(
                ": {} used ({} %, {mapped} of {total} chunks mapped), {} free",
                bytes(used),
                pct(used, cap),
                bytes(cap.saturating_sub(used))
            );
        }
        line("capacity", c);
    }

    if let Some(e) = e {
        let z = |k: &str| num(e, &[k]).unwrap_or(0);
        line(
            "zones",
            format!(
                "{} total: free {} (conventional {}, sequential {}), data {}, buffer {}, \
                 reserved {}, metadata {}, pending free {}, offline {}, read-only {}",
                z("zones_total"),
                z("zones_free"),
                z("zones_free_conventional"),
                z("zones_free_sequential"),
                z("zones_mapped"),
                z("zones_buffer"),
                z("zones_reserved"),
                z("zones_meta"),
                z("zones_pending_free"),
                z("zones_offline"),
                z("zones_read_only"),
            ),
        );
        if let Some((used, usable)) = cache_zones(s) {
            line(
                "cache",
                format!(
                    "{used} of {usable} conventional zones in use ({} %): {} data, {} buffer",
                    pct(used, usable),
                    used.saturating_sub(z("zones_buffer")),
                    z("zones_buffer")
                ),
            );
        }
    }
    if let Some(le) = log_engine {
        log_lines(le, &mut line);
    }
    if let Some(t) = reclaim_text(s, r).filter(|_| log_engine.is_none()) {
        line("reclaim", t);
    }
    if let Some(e) = e {
        let wa = float(e, &["write_amplification"]).unwrap_or(0.0);
        line(
            "write amp",
            format!(
                "{wa:.2} ({} written by users, {} to the backend)",
                bytes(num(e, &["write_bytes"]).unwrap_or(0)),
                bytes(num(e, &["device_bytes_written"]).unwrap_or(0))
            ),
        );
    }
    let f = |k: &str| num(s, &["frontend", k]).unwrap_or(0);
    if s.get("frontend").is_some_and(Value::is_object) {
        line(
            "I/O",
            format!(
                "{} reads ({}), {} writes ({}), {} flushes, {} discards",
                f("reads"),
                bytes(f("read_bytes")),
                f("writes"),
                bytes(f("write_bytes")),
                f("flushes"),
                f("discards"),
            ),
        );
        line(
            "errors",
            format!(
                "I/O errors {}, rejected requests {}",
                f("errors"),
                f("rejected")
            ),
        );
    }
    if let Some(u) = s.get("ublk").filter(|u| !u.is_null()) {
        let names = |k: &str| {
            u.get(k)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default()
        };
        let offer = u
            .get("kernel_features")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        line(
            "ublk",
            format!(
                "flags {} (device {}), kernel offers {offer}",
                names("flags_used_names"),
                names("device_flags_names")
            ),
        );
    }
    if let Some(r) = r {
        line(
            "rates",
            format!(
                "read {}, write {}, backend {}, reclaim {}, {:.0} IOPS",
                rate(r.read),
                rate(r.write),
                rate(r.device),
                rate(r.reclaim),
                r.iops
            ),
        );
    }
    out
}

/// The figures `zonedd list` adds to each device with a live daemon.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ListFigures {
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub zones_free: Option<u64>,
    pub reclaim_state: Option<String>,
    pub write_amplification: Option<f64>,
    pub io_errors: Option<u64>,
    pub uptime_secs: Option<u64>,
}

pub fn list_figures(s: &Value) -> ListFigures {
    ListFigures {
        capacity_bytes: num(s, &["capacity_bytes"]),
        used_bytes: used_bytes(s),
        zones_free: num(s, &["engine", "zones_free"]),
        reclaim_state: s
            .get("engine")
            .and_then(|e| e.get("reclaim_state"))
            .and_then(Value::as_str)
            .map(str::to_string),
        write_amplification: float(s, &["engine", "write_amplification"]),
        io_errors: num(s, &["frontend", "errors"]),
        uptime_secs: num(s, &["uptime_secs"]),
    }
}

/// The list columns after PID: SIZE USED FREEZ RECLAIM WA ERR UP (`-` where unknown).
pub fn list_columns(f: &ListFigures) -> String {
    let o = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    format!(
        "{:<10} {:<10} {:<5} {:<7} {:<5} {:<4} {:<8}",
        o(f.capacity_bytes.map(bytes)),
        o(f.used_bytes.map(bytes)),
        o(f.zones_free.map(|z| z.to_string())),
        o(f.reclaim_state.clone()),
        o(f.write_amplification.map(|w| format!("{w:.2}"))),
        o(f.io_errors.map(|e| e.to_string())),
        o(f.uptime_secs.map(duration)),
    )
}

pub const LIST_HEADER: &str = "SIZE       USED       FREEZ RECLAIM WA    ERR  UP      ";

/// The one-line result of `zonedd reclaim`: what was reclaimed between two samples.
pub fn reclaimed(before: &Value, after: &Value) -> (u64, u64) {
    let d = |k: &str| {
        num(after, &[k])
            .unwrap_or(0)
            .saturating_sub(num(before, &[k]).unwrap_or(0))
    };
    (d("reclaim_zones"), d("reclaim_blocks_copied") * BLOCK)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A status as the daemon answers it (the names of docs/status.md), for a 64 GiB
    /// emulated disk of 256 zones of 256 MiB, 8 conventional.
    pub fn fixed_status() -> Value {
        let engine = json!({
            "zones_total": 256, "zones_free": 190, "zones_free_conventional": 2,
            "zones_free_sequential": 188, "zones_mapped": 48, "zones_buffer": 1,
            "zones_reserved": 4, "zones_pending_free": 0, "zones_meta": 2,
            "zones_offline": 1, "zones_read_only": 0, "chunks_total": 240,
            "chunks_mapped": 48, "reclaim_state": "running", "reclaim_requests": 1,
            "reclaim_requests_done": 0, "metadata_dirty": true,
            "reclaim_progress_blocks": 12800, "reclaim_zones": 12,
            "reclaim_blocks_copied": 340000, "catch_up_blocks": 0, "reads": 1000,
            "read_bytes": 1u64 << 30, "writes": 3000, "write_bytes": 3u64 << 30,
            "discards": 3, "flushes": 12, "fua_writes": 2, "commits": 40,
            "log_block_writes": 900, "device_bytes_written": 3_865_470_566u64,
            "write_amplification": 1.2, "metadata_mem_bytes": 1_048_576,
            "cached_bitmap_blocks": 64
        });
        json!({
            "id": 0,
            "bdev": "/dev/ublkb0",
            "backend": "/var/tmp/smr.img",
            "label": "vol",
            "pid": 4242,
            "version": "0.1.0",
            "layout": "dm-zoned v2",
            "capacity_bytes": 240u64 << 28,
            "chunk_bytes": 1u64 << 28,
            "started_unix": 1_700_000_000u64,
            "uptime_secs": 7380,
            "geometry": {"zones": 256, "conventional_zones": 8, "zone_bytes": 1u64 << 28,
                         "zone_capacity_bytes": 1u64 << 28},
            "frontend": {"reads": 1000, "read_bytes": 1u64 << 30, "writes": 3000,
                         "write_bytes": 3u64 << 30, "fua_writes": 2, "flushes": 12,
                         "discards": 3, "write_zeroes": 1, "split_requests": 0,
                         "errors": 1, "rejected": 0},
            "pool": {"jobs_run": 5000, "workers": 4},
            "engine": engine,
        })
    }

    #[test]
    fn sizes_and_durations_read_like_a_person_wrote_them() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(4096), "4 KiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(bytes(60 << 30), "60 GiB");
        assert_eq!(bytes((12 << 40) + (3 << 39)), "13.5 TiB");
        assert_eq!(rate(52_428_800.0), "50 MiB/s");
        assert_eq!(duration(42), "42s");
        assert_eq!(duration(307), "5m 07s");
        assert_eq!(duration(7380), "2h 03m");
        assert_eq!(duration(3 * 86400 + 4 * 3600 + 5), "3d 04h");
    }

    #[test]
    fn the_summary_shows_each_figure() {
        let s = fixed_status();
        let lines = summary(&s, None);
        let want = [
            "device    /dev/ublkb0 (id 0, label \"vol\"), daemon pid 4242, up 2h 03m, zonedd 0.1.0",
            "backend   /var/tmp/smr.img: dm-zoned v2, 256 zones of 256 MiB (8 conventional)",
            "capacity  60 GiB: 12 GiB used (20 %, 48 of 240 chunks mapped), 48 GiB free",
            "zones     256 total: free 190 (conventional 2, sequential 188), data 48, buffer 1, \
             reserved 4, metadata 2, pending free 0, offline 1, read-only 0",
            "cache     4 of 6 conventional zones in use (66 %): 3 data, 1 buffer",
            "reclaim   running, 50 MiB copied into the current zone (1 requested pass pending); \
             12 zones reclaimed since start, 1.3 GiB copied",
            "write amp 1.20 (3 GiB written by users, 3.6 GiB to the backend)",
            "I/O       1000 reads (1 GiB), 3000 writes (3 GiB), 12 flushes, 3 discards",
            "errors    I/O errors 1, rejected requests 0",
        ];
        assert_eq!(lines, want);
    }

    #[test]
    fn rates_come_from_two_samples() {
        let a = fixed_status();
        let mut b = a.clone();
        b["frontend"]["read_bytes"] = json!((1u64 << 30) + (20 << 20));
        b["frontend"]["write_bytes"] = json!((3u64 << 30) + (40 << 20));
        b["frontend"]["reads"] = json!(1100);
        b["frontend"]["writes"] = json!(3300);
        b["engine"]["reclaim_blocks_copied"] = json!(340000 + 5120); // 20 MiB
        b["engine"]["device_bytes_written"] = json!(3_865_470_566u64 + (60 << 20));
        let r = rates(&a, &b, 2.0).unwrap();
        assert_eq!(r.read, (10 << 20) as f64);
        assert_eq!(r.reclaim, (10 << 20) as f64);
        assert_eq!(r.iops, 200.0);
        let lines = summary(&b, Some(&r));
        assert!(
            lines.contains(
                &"rates     read 10 MiB/s, write 20 MiB/s, backend 30 MiB/s, reclaim 10 MiB/s, \
                  200 IOPS"
                    .to_string()
            ),
            "{lines:#?}"
        );
        assert!(
            lines[5].starts_with(
                "reclaim   running, 50 MiB copied into the current zone at 10 MiB/s (1 requested"
            ),
            "{}",
            lines[5]
        );
        assert_eq!(rates(&a, &b, 0.0), None);
    }

    #[test]
    fn a_multi_device_volume_lists_its_devices() {
        let mut s = fixed_status();
        s["geometry"]["members"] = json!([
            {"index": 0, "name": "regular device /dev/nullb0", "first_zone": 0, "nr_zones": 8, "cache": true},
            {"index": 1, "name": "/dev/nullb1 (host-managed)", "first_zone": 8, "nr_zones": 32, "cache": false},
        ]);
        let lines = summary(&s, None);
        let i = lines.iter().position(|l| l.starts_with("backend")).unwrap();
        assert_eq!(
            lines[i + 1],
            "device    0 (cache): zones 0-7: regular device /dev/nullb0"
        );
        assert_eq!(
            lines[i + 2],
            "device    1 (zoned): zones 8-39: /dev/nullb1 (host-managed)"
        );
    }

    #[test]
    fn an_idle_device_and_a_test_target() {
        let mut s = fixed_status();
        s["engine"]["reclaim_state"] = json!("idle");
        s["engine"]["reclaim_requests_done"] = json!(1);
        let lines = summary(&s, None);
        assert_eq!(
            lines[5],
            "reclaim   idle; 12 zones reclaimed since start, 1.3 GiB copied"
        );
        // mem:SIZE: no engine, no geometry; no zone lines, no made-up figures.
        let m = json!({"id": 3, "bdev": "/dev/ublkb3", "backend": "mem:256M", "label": null,
                       "pid": 7, "layout": "memory", "capacity_bytes": 256u64 << 20,
                       "chunk_bytes": 4u64 << 20, "uptime_secs": 5,
                       "frontend": {"reads": 1, "read_bytes": 4096, "writes": 2,
                                    "write_bytes": 8192, "flushes": 0, "discards": 0,
                                    "errors": 0, "rejected": 0},
                       "engine": null});
        let lines = summary(&m, None);
        assert_eq!(
            lines,
            [
                "device    /dev/ublkb3 (id 3), daemon pid 7, up 5s",
                "backend   mem:256M: memory",
                "capacity  256 MiB",
                "I/O       1 reads (4 KiB), 2 writes (8 KiB), 0 flushes, 0 discards",
                "errors    I/O errors 0, rejected requests 0",
            ]
        );
        // what the kernel's ublk driver offers and which flags the device runs with
        let mut u = m.clone();
        u["ublk"] = json!({"kernel_features": "0x1fe", "flags_used": "0x18",
                           "flags_used_names": ["USER_RECOVERY", "USER_RECOVERY_REISSUE"],
                           "device_flags": "0x1a",
                           "device_flags_names": ["URING_CMD_COMP_IN_TASK", "USER_RECOVERY", "USER_RECOVERY_REISSUE"]});
        assert_eq!(
            summary(&u, None).last().map(String::as_str),
            Some(
                "ublk      flags USER_RECOVERY USER_RECOVERY_REISSUE (device \
                 URING_CMD_COMP_IN_TASK USER_RECOVERY USER_RECOVERY_REISSUE), kernel offers 0x1fe"
            )
        );
    }

    #[test]
    fn list_figures_and_columns() {
        let f = list_figures(&fixed_status());
        assert_eq!(f.capacity_bytes, Some(240 << 28));
        assert_eq!(f.used_bytes, Some(12 << 30));
        assert_eq!(f.zones_free, Some(190));
        assert_eq!(f.reclaim_state.as_deref(), Some("running"));
        assert_eq!(f.io_errors, Some(1));
        assert_eq!(
            list_columns(&f),
            "60 GiB     12 GiB     190   running 1.20  1    2h 03m  "
        );
        assert_eq!(list_columns(&f).len(), LIST_HEADER.len());
        assert_eq!(
            list_columns(&ListFigures::default()),
            "-          -          -     -       -     -    -       "
        );
    }

    #[test]
    fn reclaimed_is_the_difference_of_two_engine_samples() {
        let before = json!({"reclaim_zones": 12, "reclaim_blocks_copied": 1000});
        let after = json!({"reclaim_zones": 15, "reclaim_blocks_copied": 1256});
        assert_eq!(reclaimed(&before, &after), (3, 256 * 4096));
    }

    /// A log-layout daemon that has only compacted since it started: no ratio to show.
    #[test]
    fn a_log_layout_volume_without_user_writes_has_no_write_amplification() {
        let s = json!({"id": 0, "layout": "log (zonedd)",
                       "engine": {"user_blocks_written": 0, "compact_blocks": 256,
                                  "write_amplification": 0.0}});
        let lines = summary(&s, None);
        let wa = lines.iter().find(|l| l.starts_with("write amp")).unwrap();
        assert_eq!(
            wa,
            "write amp - (0 B written by users, 0 B copied by GC, 1 MiB by compaction)"
        );
    }

    /// A log-layout volume: its own zone, GC, write amplification and index lines, and none
    /// of the v2 engine's (which would read as zeros and "?").
    #[test]
    fn a_log_layout_volume() {
        let s = json!({"id": 0, "bdev": "/dev/ublkb0", "backend": "/dev/nullb0",
                       "label": null, "pid": 9, "layout": "log (zonedd)",
                       "capacity_bytes": 776u64 << 20, "uptime_secs": 4,
                       "engine": {"zones_free": 3, "zones_open": 2, "zones_full": 11,
                                  "user_frontiers": 4, "valid_blocks": 256, "gc_zones_freed": 12,
                                  "gc_blocks_copied": 512, "gc_paced_batches": 7,
                                  "gc_forced_victims": 1, "user_blocks_written": 1024,
                                  "write_amplification": 1.5,
                                  "index_resident_bytes": 1u64 << 20, "checkpoints": 2,
                                  "index_cached_pages": 12, "index_cache_pages": 12785,
                                  "index_page_reads": 5, "index_pages_written_back": 7,
                                  "log_blocks_written": 40, "compact_pages": 3,
                                  "compact_blocks": 768, "compact_marked_pages": 1,
                                  "compact_skipped_pages": 0, "compact_on": "reads",
                                  "background": "asleep"}});
        let lines = summary(&s, None);
        assert_eq!(
            lines,
            [
                "device    /dev/ublkb0 (id 0), daemon pid 9, up 4s",
                "backend   /dev/nullb0: log (zonedd)",
                "capacity  776 MiB",
                "zones     3 free, 2 open (4 user frontiers and GC's), 11 full; 1 MiB valid",
                "GC        12 zones freed, 2 MiB copied (7 paced batches, 1 forced victims)",
                "compact   on reads: 3 pages rewritten in order (3 MiB), 1 to look at, 0 skipped; background asleep",
                "write amp 1.50 (4 MiB written by users, 2 MiB copied by GC, 3 MiB by compaction)",
                "index     1 MiB resident (12 of 12785 pages cached); 5 pages read, 7 written back; 2 checkpoints, 40 log blocks written",
            ]
        );
    }
}
