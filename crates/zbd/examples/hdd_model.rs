//! What the `hdd` timing model predicts for a benchmark (scripts/bench-hdd-model.sh compares
//! fio on `zonedd expose --timing hdd` with it).
//!
//!   hdd_model IMAGE_BYTES [K=V ...] -- WORKLOAD...
//!
//! A workload is `seqwrite:OFF:LEN:BS:QD`, `seqread:OFF:LEN:BS:QD` (MB/s, 1 MB = 10^6 bytes,
//! as fio's `bw_bytes`) or `randread:OFF:LEN:BS:QD:N` (IOPS over N requests, uniform over
//! OFF..OFF+LEN). Each runs on a fresh model. Prints `NAME VALUE` per workload.

use zbd::timing::{closed_loop, HddModel, HddParams, ReqKind};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = args
        .iter()
        .position(|a| a == "--")
        .expect("-- before the workloads");
    let image: u64 = args[0].parse().expect("IMAGE_BYTES");
    let mut p = HddParams::default();
    for kv in &args[1..split] {
        p.set(kv).unwrap_or_else(|e| panic!("{e}"));
    }
    for w in &args[split + 1..] {
        let f: Vec<&str> = w.split(':').collect();
        let n = |i: usize| -> u64 { zbd::parse_size(f[i]).unwrap_or_else(|_| panic!("{w}")) };
        let mut m = HddModel::new(p.clone(), image).unwrap_or_else(|e| panic!("{e}"));
        let (off, len, bs, qd) = (n(1), n(2), n(3), n(4) as usize);
        match f[0] {
            "seqwrite" | "seqread" => {
                let kind = if f[0] == "seqwrite" {
                    ReqKind::Write
                } else {
                    ReqKind::Read
                };
                let mut at = off;
                let end = closed_loop(&mut m, 0, qd, (len / bs) as usize, || {
                    at += bs;
                    (kind, at - bs, bs)
                });
                println!("{} {:.1}", f[0], len as f64 / (end as f64 / 1e9) / 1e6);
            }
            "randread" => {
                let count = n(5) as usize;
                let mut x: u64 = 0x2545_f491_4f6c_dd1d;
                let end = closed_loop(&mut m, 0, qd, count, || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (ReqKind::Read, off + x % (len / bs) * bs, bs)
                });
                println!("randread_qd{qd} {:.1}", count as f64 / (end as f64 / 1e9));
            }
            _ => panic!("unknown workload {w}"),
        }
    }
}
