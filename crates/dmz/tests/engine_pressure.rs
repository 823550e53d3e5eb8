//! Writers racing for the few conventional zones while reclaim frees them: no in-range write
//! may fail with ENOSPC while zones are reclaimable (a filesystem shuts down on ENOSPC from
//! its block device). Reproduces what xfs-stress saw in the VM: reclaim skipped the chunks
//! whose writers held their locks, counted the pass as "nothing freed", and waiting writers
//! got ENOSPC although most of the device was free. Afterwards every block reads back as
//! last written.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use zbd::{Geometry, MemDevice, Zone, ZoneOp, ZonedDevice};

#[test]
fn concurrent_overwrites_with_two_buffer_zones_never_get_enospc() {
    overwrites_never_get_enospc(1);
}

/// The same with reclaims running side by side (`--reclaim-max-active 2`).
#[test]
fn parallel_reclaim_never_gives_enospc() {
    overwrites_never_get_enospc(2);
}

fn overwrites_never_get_enospc(parallel: usize) {
    // 64 zones of 1 MiB, 4 conventional (2 hold the metadata sets), 3 reserved: after the
    // fill below the 2 conventional data zones hold chunks, and every overwrite of another
    // chunk needs reclaim to free one for its buffer.
    let dev = formatted_mem(1024, 64, 4, 3);
    let mut opts = test_opts();
    opts.reclaim.parallel = parallel;
    let e = Arc::new(open(dev, opts));
    let cs = e.chunk_size();
    let nr_chunks = e.capacity() / cs;
    let blocks_per_chunk = cs / BS as u64;
    // Fill every chunk sequentially (straight into sequential zones), so each later
    // overwrite needs one of the two buffer zones.
    let mut written = Written::new(&e);
    for c in 0..nr_chunks {
        written.write(&e, c * blocks_per_chunk, blocks_per_chunk, c + 1);
    }
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                let mut rng = t * 7919 + 1;
                let mut b = vec![0u8; BS];
                // (block, write id) in the order written.
                let mut writes = Vec::new();
                for i in 0..300u64 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let block = rng % (nr_chunks * blocks_per_chunk);
                    let id = 1000 + t * 1000 + i;
                    pattern(id, block, &mut b);
                    if let Err(err) = e.write(block * BS as u64, &b, false) {
                        return Err(format!(
                            "thread {t} write {i} at block {block}: {err}; {:?}",
                            e.stats()
                        ));
                    }
                    writes.push((block, id));
                }
                Ok(writes)
            })
        })
        .collect();
    // A block overwritten by several threads holds the last write of one of them.
    let mut last: HashMap<u64, Vec<u64>> = HashMap::new();
    for t in threads {
        let mut mine: HashMap<u64, u64> = HashMap::new();
        for (block, id) in t.join().unwrap().unwrap() {
            mine.insert(block, id);
        }
        for (block, id) in mine {
            last.entry(block).or_default().push(id);
        }
    }
    let s = e.stats();
    assert!(s.reclaim_zones > 0, "reclaim must have run: {s:?}");
    verify_blocks(&e, 0, nr_chunks * blocks_per_chunk, |b, got| {
        match last.get(&b) {
            Some(ids) if ids.contains(&got) => Ok(()),
            Some(ids) => Err(format!(
                "block {b} holds write {got}, expected one of {ids:?}"
            )),
            None => expect_id(b, got, written.id(b)),
        }
    });
    close(Arc::try_unwrap(e).ok().unwrap());
}

/// A backend whose large writes (reclaim's 1 MiB copies; user writes here are 4 KiB) take
/// `delay` each once `slow` is set: reclaim of one zone then lasts several times the
/// writers' `wait_timeout`, as on a disk (the hdd model in the VM showed it: xfs shut down
/// on ENOSPC while reclaim was still copying).
struct SlowCopies {
    dev: Arc<MemDevice>,
    slow: std::sync::atomic::AtomicBool,
    delay: std::time::Duration,
}

impl ZonedDevice for SlowCopies {
    fn geometry(&self) -> Geometry {
        self.dev.geometry()
    }
    fn report_zones(&self, first: u32, nr: u32) -> zbd::Result<Vec<Zone>> {
        self.dev.report_zones(first, nr)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> zbd::Result<()> {
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> zbd::Result<()> {
        if buf.len() >= 512 << 10 && self.slow.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(self.delay);
        }
        self.dev.write_at(buf, offset)
    }
    fn zone_mgmt(&self, op: ZoneOp, zone: u32) -> zbd::Result<()> {
        self.dev.zone_mgmt(op, zone)
    }
    fn reset_all(&self) -> zbd::Result<()> {
        self.dev.reset_all()
    }
    fn flush(&self) -> zbd::Result<()> {
        self.dev.flush()
    }
    fn describe(&self) -> String {
        format!("slow copies over {}", self.dev.describe())
    }
}

/// Writers wait for a zone as long as reclaim keeps copying, however long one zone takes:
/// `wait_timeout` bounds time without progress, not the length of a reclaim pass.
#[test]
fn slow_reclaim_that_progresses_gives_no_enospc() {
    // 8 MiB zones (a reclaim copy is 8 writes of 1 MiB, 150 ms each: 1.2 s a zone, more
    // than the 0.5 s timeout), 4 conventional (2 for metadata), 3 reserved.
    let dev = Arc::new(SlowCopies {
        dev: formatted_mem(8192, 16, 4, 3),
        slow: false.into(),
        delay: std::time::Duration::from_millis(150),
    });
    let mut opts = test_opts();
    opts.reclaim.wait_timeout = std::time::Duration::from_millis(500);
    let e = open(dev.clone(), opts);
    let blocks_per_chunk = e.chunk_size() / BS as u64;
    let nr_chunks = e.capacity() / e.chunk_size();
    let mut written = Written::new(&e);
    for c in 0..nr_chunks {
        written.write(&e, c * blocks_per_chunk, blocks_per_chunk, c + 1);
    }
    dev.slow.store(true, std::sync::atomic::Ordering::Relaxed);
    // One block in the middle of each of 6 chunks: each needs a buffer zone, so most wait
    // for reclaim to merge a chunk into a reserved zone first.
    let mut total_waits = 0;
    for c in 0..nr_chunks.min(6) {
        let b = c * blocks_per_chunk + blocks_per_chunk / 2;
        let mut buf = vec![0u8; BS];
        pattern(100 + c, b, &mut buf);
        // Written in two steps, as the frontend does: a write about to wait for a zone
        // first calls back, with no engine lock held (the callback takes the state lock).
        let waits = std::cell::Cell::new(0u32);
        let before_wait = || {
            let _ = e.stats();
            waits.set(waits.get() + 1);
        };
        match e.write_unsynced(b * BS as u64, &buf, false, &before_wait) {
            Ok(w) => e.sync(w).unwrap(),
            Err(err) => panic!("overwrite in chunk {c}: {err}; {:?}", e.stats()),
        }
        total_waits += waits.get();
        written.record(b, 1, 100 + c);
    }
    let s = e.stats();
    assert!(s.reclaim_zones > 0, "reclaim must have run: {s:?}");
    assert!(
        total_waits > 0,
        "some overwrite must have waited for a zone"
    );
    written.verify(&e);
    close(e);
}
