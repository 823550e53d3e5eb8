//! Prometheus metrics: the daemon's status in the Prometheus text exposition format (0.0.4),
//! encoded by `prometheus-client`, for `zonedd status ID --prometheus` (node_exporter's
//! textfile collector) and for the daemon's own `/metrics` endpoint (`create --metrics
//! ADDR`). Every metric is named `zonedd_...` with its unit in the name (`_bytes`,
//! `_seconds`), counters end in `_total`, every series carries the label `id` (the ublk
//! device id), and each is documented in docs/status.md (a test checks that).

use super::summary::{self, BLOCK};
use super::CliError;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use serde_json::Value;
use std::borrow::Cow;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// Where a value comes from in the status JSON.
#[derive(Clone, Copy)]
enum Src {
    /// A number at this path.
    At(&'static [&'static str]),
    /// A count of 4 KiB blocks at this path, exported in bytes.
    Blocks(&'static [&'static str]),
    /// Space held by mapped chunks.
    Used,
    /// 1 if the string at this path is "running", else 0.
    Running(&'static [&'static str]),
    /// 1 if the boolean at this path is true.
    Flag(&'static [&'static str]),
}

/// One metric: its name after `zonedd_` (counters without `_total`: the encoder adds it),
/// help text, kind and source.
struct Def(&'static str, &'static str, Kind, Src);

use Kind::{Counter as C, Gauge as G};
use Src::{At, Blocks, Flag, Running};

#[rustfmt::skip]
const METRICS: &[Def] = &[
    Def("start_time_seconds", "When the daemon started, seconds since the Unix epoch.", G, At(&["started_unix"])),
    Def("uptime_seconds", "Seconds since the daemon started.", G, At(&["uptime_secs"])),
    Def("capacity_bytes", "Size of the exposed block device.", G, At(&["capacity_bytes"])),
    Def("chunk_bytes", "Bytes per chunk (the zone size for the engine).", G, At(&["chunk_bytes"])),
    Def("used_bytes", "Space held by mapped chunks (a chunk counts whole once written).", G, Src::Used),
    Def("backend_zones", "Zones of the backend.", G, At(&["geometry", "zones"])),
    Def("backend_conventional_zones", "Conventional zones of the backend.", G, At(&["geometry", "conventional_zones"])),
    Def("backend_zone_bytes", "Bytes per zone of the backend.", G, At(&["geometry", "zone_bytes"])),
    Def("chunks", "Chunks of the exposed device.", G, At(&["engine", "chunks_total"])),
    Def("chunks_mapped", "Chunks with a data zone.", G, At(&["engine", "chunks_mapped"])),
    Def("reclaim_running", "1 while a reclaim pass runs, else 0.", G, Running(&["engine", "reclaim_state"])),
    Def("reclaim_requests", "Reclaim passes asked for with zonedd reclaim.", C, At(&["engine", "reclaim_requests"])),
    Def("reclaim_requests_done", "Asked-for reclaim passes finished.", C, At(&["engine", "reclaim_requests_done"])),
    Def("reclaim_zones", "Zones reclaimed.", C, At(&["engine", "reclaim_zones"])),
    Def("reclaim_copied_bytes", "Bytes copied by reclaim.", C, Blocks(&["engine", "reclaim_blocks_copied"])),
    Def("reclaim_progress_bytes", "Bytes copied into the zone being reclaimed now.", G, Blocks(&["engine", "reclaim_progress_blocks"])),
    Def("reclaim_buffer_bytes", "Memory kept by reclaim's copy buffers between copies.", G, At(&["engine", "reclaim_buffer_bytes"])),
    Def("catch_up_bytes", "Bytes of out-of-order sequential streams moved from a buffer to the data zone.", C, Blocks(&["engine", "catch_up_blocks"])),
    Def("engine_reads", "Reads handled by the engine.", C, At(&["engine", "reads"])),
    Def("engine_read_bytes", "Bytes read by the engine.", C, At(&["engine", "read_bytes"])),
    Def("engine_writes", "Writes handled by the engine.", C, At(&["engine", "writes"])),
    Def("engine_written_bytes", "Bytes written by users through the engine.", C, At(&["engine", "write_bytes"])),
    Def("engine_discards", "Discards handled by the engine.", C, At(&["engine", "discards"])),
    Def("engine_flushes", "Flushes handled by the engine.", C, At(&["engine", "flushes"])),
    Def("engine_fua_writes", "FUA writes handled by the engine.", C, At(&["engine", "fua_writes"])),
    Def("engine_planned_writes", "Writes the frontend put on the device from an engine write plan.", C, At(&["engine", "planned_writes"])),
    Def("backend_written_bytes", "Bytes written to the backend: data, reclaim copies, metadata.", C, At(&["engine", "device_bytes_written"])),
    Def("write_amplification_ratio", "Bytes written to the backend per byte written by users.", G, At(&["engine", "write_amplification"])),
    Def("metadata_commits", "Metadata commits (log folded into the v2 sets).", C, At(&["engine", "commits"])),
    Def("metadata_log_blocks_written", "Metadata log blocks written.", C, At(&["engine", "log_block_writes"])),
    Def("metadata_unlogged_overwrites", "In-place overwrites that needed no metadata log record.", C, At(&["engine", "unlogged_overwrites"])),
    Def("metadata_proof_flushes", "Device flushes made only to prove flushed metadata records.", C, At(&["engine", "proof_flushes"])),
    Def("metadata_written_ahead", "Overwrites in place whose log record was written before their data.", C, At(&["engine", "written_ahead"])),
    Def("metadata_dirty", "1 while metadata changed since the last commit.", G, Flag(&["engine", "metadata_dirty"])),
    Def("metadata_memory_bytes", "Memory held by the metadata.", G, At(&["engine", "metadata_mem_bytes"])),
    Def("metadata_cached_bitmap_blocks", "Bitmap blocks cached.", G, At(&["engine", "cached_bitmap_blocks"])),
    Def("frontend_reads", "Read requests from the block device.", C, At(&["frontend", "reads"])),
    Def("frontend_read_bytes", "Bytes read from the block device.", C, At(&["frontend", "read_bytes"])),
    Def("frontend_writes", "Write requests to the block device.", C, At(&["frontend", "writes"])),
    Def("frontend_written_bytes", "Bytes written to the block device.", C, At(&["frontend", "write_bytes"])),
    Def("frontend_fua_writes", "Write requests with FUA.", C, At(&["frontend", "fua_writes"])),
    Def("frontend_flushes", "Flush requests.", C, At(&["frontend", "flushes"])),
    Def("frontend_discards", "Discard requests.", C, At(&["frontend", "discards"])),
    Def("frontend_write_zeroes", "Write-zeroes requests.", C, At(&["frontend", "write_zeroes"])),
    Def("frontend_split_requests", "Requests split at a chunk end.", C, At(&["frontend", "split_requests"])),
    Def("frontend_errors", "Requests answered with an I/O error.", C, At(&["frontend", "errors"])),
    Def("frontend_rejected", "Requests refused before reaching the target.", C, At(&["frontend", "rejected"])),
    Def("frontend_hop_free_reads", "Reads served on the queue thread's own ring.", C, At(&["frontend", "hop_free_reads"])),
    Def("frontend_linked_reads", "Hop-free reads committed by a command linked behind their device read.", C, At(&["frontend", "linked_reads"])),
    Def("frontend_linked_cancels", "Linked reads whose commit the kernel cancelled (the read failed or was turned away).", C, At(&["frontend", "linked_cancels"])),
    Def("frontend_pool_reads", "Reads served through the worker pool.", C, At(&["frontend", "pool_reads"])),
    Def("frontend_hop_free_retries", "Hop-free reads that failed and were redone on the pool.", C, At(&["frontend", "hop_free_retries"])),
    Def("frontend_hop_free_writes", "Writes made on the queue thread's own ring.", C, At(&["frontend", "hop_free_writes"])),
    Def("frontend_hop_free_write_retries", "Hop-free writes that failed and were redone on the pool.", C, At(&["frontend", "hop_free_write_retries"])),
    Def("frontend_ring_flushes", "Flushes whose device I/O went on the queue thread's own ring.", C, At(&["frontend", "ring_flushes"])),
    Def("frontend_ring_again", "Ring reads and writes the device turned away at once, redone elsewhere.", C, At(&["frontend", "ring_again"])),
    Def("pool_workers", "Worker threads alive.", G, At(&["pool", "workers"])),
    Def("pool_workers_spawned", "Worker threads spawned.", C, At(&["pool", "workers_spawned"])),
    Def("pool_jobs_queued", "Jobs queued on the worker pool.", C, At(&["pool", "jobs_queued"])),
    Def("pool_jobs_run", "Jobs run by the worker pool.", C, At(&["pool", "jobs_run"])),
    Def("pool_jobs_panicked", "Jobs that panicked.", C, At(&["pool", "jobs_panicked"])),
    Def(
        "pool_jobs_deferred",
        "Jobs deferred to the end of their batch (a write's log write and acknowledgement).",
        C,
        At(&["pool", "jobs_deferred"]),
    ),
    Def("pool_works_queued", "Works that went from idle to queued.", C, At(&["pool", "works_queued"])),
    Def("pool_works_requeued", "Works put back on their run queue with new jobs.", C, At(&["pool", "works_requeued"])),
    Def("pool_works_run", "Work batches run.", C, At(&["pool", "works_run"])),
    Def("pool_works_pending", "Works queued or running.", G, At(&["pool", "works_pending"])),
    Def("pool_wakeups_issued", "Parked workers woken.", C, At(&["pool", "wakeups_issued"])),
    Def("pool_wakeups_empty", "Woken workers that found nothing to do.", C, At(&["pool", "wakeups_empty"])),
    Def("pool_peak_active", "Most works executing at once.", G, At(&["pool", "peak_active"])),
    Def("pool_active", "Works executing now.", G, At(&["pool", "active_now"])),
];

/// `zonedd_zones{role=...}`: the engine's zones by role.
const ROLES: &[(&str, &str)] = &[
    ("free_conventional", "zones_free_conventional"),
    ("free_sequential", "zones_free_sequential"),
    ("data", "zones_mapped"),
    ("buffer", "zones_buffer"),
    ("reserved", "zones_reserved"),
    ("pending_free", "zones_pending_free"),
    ("metadata", "zones_meta"),
    ("offline", "zones_offline"),
    ("read_only", "zones_read_only"),
];

fn value(s: &Value, src: Src) -> Option<f64> {
    let at = |path: &[&str]| -> Option<&Value> {
        let mut v = s;
        for k in path {
            v = v.get(k)?;
        }
        Some(v)
    };
    match src {
        Src::At(p) => at(p)?.as_f64(),
        Src::Blocks(p) => Some((at(p)?.as_u64()? * BLOCK) as f64),
        Src::Used => summary::used_bytes(s).map(|b| b as f64),
        Src::Running(p) => Some(if at(p)?.as_str()? == "running" {
            1.0
        } else {
            0.0
        }),
        Src::Flag(p) => Some(if at(p)?.as_bool()? { 1.0 } else { 0.0 }),
    }
}

/// One status, as a prometheus-client collector.
#[derive(Debug)]
struct Snapshot(Value);

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let info = ConstGauge::new(1i64);
        let mut m = enc.encode_descriptor(
            "device_info",
            "The device: block device, backend, label, layout, zonedd version (value 1).",
            None,
            MetricType::Gauge,
        )?;
        let labels = [
            ("bdev", text("bdev")),
            ("backend", text("backend")),
            ("label", text("label")),
            ("layout", text("layout")),
            ("version", text("version")),
        ];
        info.encode(m.encode_family(&labels)?)?;
        for Def(name, help, kind, src) in METRICS {
            let Some(v) = value(s, *src) else { continue };
            match kind {
                Kind::Counter => {
                    let c = ConstCounter::new(v as u64);
                    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)?;
                }
                // Whole numbers without a decimal point ("12", not "12.0").
                Kind::Gauge if v.fract() == 0.0 && v.abs() < (1u64 << 53) as f64 => {
                    let g = ConstGauge::new(v as i64);
                    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
                }
                Kind::Gauge => {
                    let g = ConstGauge::new(v);
                    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
                }
            }
        }
        if let Some(e) = s.get("engine").filter(|e| e.is_object()) {
            let mut m = enc.encode_descriptor(
                "zones",
                "The backend's zones by role (data: mapped to a chunk; reserved: free \
                 sequential zones kept for reclaim; offline includes unusable).",
                None,
                MetricType::Gauge,
            )?;
            for (role, key) in ROLES {
                if let Some(n) = e.get(*key).and_then(Value::as_u64) {
                    let g = ConstGauge::new(n as i64);
                    g.encode(m.encode_family(&[("role", *role)])?)?;
                }
            }
        }
        Ok(())
    }
}

/// The status in the Prometheus text format.
pub fn render(status: &Value) -> String {
    let id = status
        .get("id")
        .and_then(Value::as_u64)
        .map(|i| i.to_string())
        .unwrap_or_default();
    let mut reg = Registry::with_prefix_and_labels(
        "zonedd",
        [(Cow::Borrowed("id"), Cow::Owned(id))].into_iter(),
    );
    reg.register_collector(Box::new(Snapshot(status.clone())));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &reg);
    out
}

/// `--metrics ADDR` checked as an argument: an IP address and port (a bare port means
/// 127.0.0.1), on loopback unless `any_address`.
pub fn parse_addr(addr: &str, any_address: bool) -> Result<SocketAddr, CliError> {
    let parsed = if let Ok(port) = addr.parse::<u16>() {
        Ok(SocketAddr::from(([127, 0, 0, 1], port)))
    } else {
        addr.parse::<SocketAddr>()
    };
    let a = parsed.map_err(|_| {
        CliError::Usage(format!(
            "--metrics takes IP:PORT (e.g. 127.0.0.1:9577, [::1]:9577) or a port, not {addr}"
        ))
    })?;
    if !a.ip().is_loopback() && !any_address {
        return Err(CliError::Usage(format!(
            "--metrics {a} is not a loopback address: pass --metrics-any-address as well to \
             serve metrics beyond this machine"
        )));
    }
    Ok(a)
}

/// Bind the metrics address (before daemonizing, so that a taken port is a refusal).
pub fn bind(addr: SocketAddr) -> Result<TcpListener, CliError> {
    TcpListener::bind(addr).map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::AddrInUse => "address already in use".to_string(),
            _ => e.to_string(),
        };
        CliError::Usage(format!("--metrics {addr}: {why}"))
    })
}

pub type StatusFn = Arc<dyn Fn() -> Value + Send + Sync>;

/// Serve `GET /metrics` on `listener` from a background thread, one connection at a time.
pub fn serve(listener: TcpListener, status: StatusFn) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("zonedd-metrics".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                if let Err(e) = answer(conn, &status) {
                    tracing::debug!("metrics connection: {e}");
                }
            }
        })?;
    Ok(())
}

fn answer(conn: TcpStream, status: &StatusFn) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(&conn);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // Skip the headers (bounded), up to the blank line.
    let mut header = String::new();
    for _ in 0..100 {
        header.clear();
        if reader.read_line(&mut header)? == 0 || header.trim_end().is_empty() {
            break;
        }
    }
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (code, ctype, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => (
            "200 OK",
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            render(&status()),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "only /metrics here\n".into()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET /metrics\n".into(),
        ),
    };
    let mut out = &conn;
    write!(
        out,
        "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::summary::tests::fixed_status;
    use std::io::Read;

    #[test]
    fn the_fixed_status_renders_in_the_prometheus_text_format() {
        let text = render(&fixed_status());
        for want in [
            "# HELP zonedd_reclaim_zones_total Zones reclaimed.",
            "# TYPE zonedd_reclaim_zones_total counter",
            "zonedd_reclaim_zones_total{id=\"0\"} 12",
            "zonedd_reclaim_copied_bytes_total{id=\"0\"} 1392640000",
            "zonedd_reclaim_running{id=\"0\"} 1",
            "zonedd_reclaim_progress_bytes{id=\"0\"} 52428800",
            "# TYPE zonedd_capacity_bytes gauge",
            "zonedd_capacity_bytes{id=\"0\"} 64424509440",
            "zonedd_used_bytes{id=\"0\"} 12884901888",
            "zonedd_write_amplification_ratio{id=\"0\"} 1.2",
            "zonedd_frontend_errors_total{id=\"0\"} 1",
            "zonedd_frontend_written_bytes_total{id=\"0\"} 3221225472",
            "zonedd_start_time_seconds{id=\"0\"} 1700000000",
            "zonedd_zones{id=\"0\",role=\"free_conventional\"} 2",
            "zonedd_zones{id=\"0\",role=\"data\"} 48",
            "zonedd_zones{id=\"0\",role=\"offline\"} 1",
            "zonedd_pool_jobs_run_total{id=\"0\"} 5000",
            "zonedd_device_info{id=\"0\",bdev=\"/dev/ublkb0\",backend=\"/var/tmp/smr.img\",\
             label=\"vol\",layout=\"dm-zoned v2\",version=\"0.1.0\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == want),
                "missing line {want:?} in\n{text}"
            );
        }
        // Prometheus text, not OpenMetrics: no "# EOF", no "# UNIT".
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        // Every series is a counter ending in _total or a gauge not ending in it.
        let mut types = 0;
        for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let f: Vec<&str> = l.split(' ').collect();
            assert!(f[2].starts_with("zonedd_"), "{l}");
            assert_eq!(f[2].ends_with("_total"), f[3] == "counter", "{l}");
            types += 1;
        }
        assert!(types >= 40, "{types} metrics");
    }

    #[test]
    fn a_test_target_has_no_engine_metrics() {
        let s = serde_json::json!({"id": 3, "bdev": "/dev/ublkb3", "capacity_bytes": 1024,
                                   "engine": null, "frontend": {"reads": 4}});
        let text = render(&s);
        assert!(
            text.contains("zonedd_frontend_reads_total{id=\"3\"} 4"),
            "{text}"
        );
        assert!(
            text.contains("zonedd_capacity_bytes{id=\"3\"} 1024"),
            "{text}"
        );
        assert!(!text.contains("zonedd_zones"), "{text}");
        assert!(!text.contains("zonedd_reclaim"), "{text}");
    }

    /// docs/status.md documents every metric by its full name.
    #[test]
    fn every_metric_is_documented() {
        let doc = include_str!("../../docs/status.md");
        let mut names: Vec<String> = METRICS
            .iter()
            .map(|Def(name, _, kind, _)| match kind {
                Kind::Counter => format!("zonedd_{name}_total"),
                Kind::Gauge => format!("zonedd_{name}"),
            })
            .collect();
        names.extend(["zonedd_zones".into(), "zonedd_device_info".into()]);
        for name in &names {
            assert!(
                doc.contains(&format!("| `{name}` |")),
                "{name} is not in docs/status.md"
            );
        }
        // ...and what the encoder wrote is one of them.
        for l in render(&fixed_status())
            .lines()
            .filter(|l| l.starts_with("# TYPE "))
        {
            let name = l.split(' ').nth(2).unwrap();
            assert!(names.iter().any(|n| n == name), "{name}");
        }
    }

    #[test]
    fn metrics_addresses_are_loopback_unless_told() {
        assert_eq!(
            parse_addr("127.0.0.1:9577", false).unwrap(),
            "127.0.0.1:9577".parse().unwrap()
        );
        assert_eq!(
            parse_addr("9577", false).unwrap(),
            "127.0.0.1:9577".parse().unwrap()
        );
        assert!(parse_addr("[::1]:9577", false).is_ok());
        let e = parse_addr("0.0.0.0:9577", false).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert_eq!(
            e.to_string(),
            "--metrics 0.0.0.0:9577 is not a loopback address: pass --metrics-any-address as \
             well to serve metrics beyond this machine"
        );
        assert!(parse_addr("0.0.0.0:9577", true).is_ok());
        let e = parse_addr("localhost", false).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().starts_with("--metrics takes IP:PORT"), "{e}");
    }

    #[test]
    fn a_taken_port_is_a_one_line_refusal() {
        let first = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = first.local_addr().unwrap();
        let e = bind(addr).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert_eq!(
            e.to_string(),
            format!("--metrics {addr}: address already in use")
        );
    }

    fn get(addr: SocketAddr, req: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn the_endpoint_serves_metrics_over_http() {
        let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let c2 = calls.clone();
        serve(
            l,
            Arc::new(move || {
                let n = c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut s = fixed_status();
                s["frontend"]["reads"] = serde_json::json!(1000 + n);
                s
            }),
        )
        .unwrap();
        for n in 0..2 {
            let r = get(
                addr,
                "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n",
            );
            let (head, body) = r.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
            assert!(
                head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"),
                "{head}"
            );
            assert!(
                head.contains(&format!("Content-Length: {}", body.len())),
                "{head}"
            );
            // Each scrape asks the daemon again: the figures are live.
            let want = format!("zonedd_frontend_reads_total{{id=\"0\"}} {}", 1000 + n);
            assert!(body.lines().any(|l| l == want), "{want} not in {body}");
        }
        let r = get(addr, "GET / HTTP/1.0\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"), "{r}");
        let r = get(addr, "POST /metrics HTTP/1.0\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{r}");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
