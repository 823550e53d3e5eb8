//! A sequential stream whose pieces arrive out of order (two ublk queues, a worker pool)
//! still lands in sequential zones: an early piece waits in a buffer zone and is copied to
//! the data zone once the stream reaches it, so no conventional zone ends up holding the
//! chunk and no whole-zone reclaim is needed.

mod common;

use common::*;

#[test]
fn out_of_order_stream_is_written_to_sequential_zones() {
    // 32 zones of 4 MiB, 6 conventional (4 for data), 2 reserved.
    let dev = formatted_mem(4096, 32, 6, 2);
    let mut o = test_opts();
    o.reclaim.enabled = false;
    let e = open(dev, o);
    let cs = e.chunk_size();
    let piece = 256 << 10;
    let pieces = cs / piece;
    let chunks = 6u64;
    let mut buf = vec![0u8; piece as usize];
    for c in 0..chunks {
        // Pieces 1, 0, 3, 2, ...: every other one arrives before its predecessor.
        for i in 0..pieces {
            let p = i ^ 1;
            let off = c * cs + p * piece;
            pattern(c + 1, off / BS as u64, &mut buf);
            e.write(off, &buf, false).unwrap();
        }
    }
    e.flush().unwrap(); // the emptied buffer zones become free once their records are durable
    let s = e.stats();
    let free_conv_at_start = 4;
    assert_eq!(
        s.zones_free_conventional, free_conv_at_start,
        "a conventional zone still holds stream data: {s:?}"
    );
    assert_eq!(s.zones_buffer, 0, "{s:?}");
    assert_eq!(s.reclaim_zones, 0, "{s:?}");
    // Every early piece was copied exactly once.
    let early_blocks = chunks * (pieces / 2) * piece / BS as u64;
    assert_eq!(s.catch_up_blocks, early_blocks, "{s:?}");
    let bs = BS as u64;
    for c in 0..chunks {
        assert_blocks(&e, c * cs / bs, cs / bs, c + 1);
    }
    close(e);
}

#[test]
fn first_write_near_a_chunk_start_waits_in_a_buffer_far_takes_a_conventional_zone() {
    // 16 zones of 16 MiB (4096 blocks; the stream window is 2048 blocks, and 64 pieces of
    // the write's own length), 6 conventional.
    let dev = formatted_mem(16 << 10, 16, 6, 2);
    let mut o = test_opts();
    o.reclaim.enabled = false;
    let e = open(dev, o);
    let cs = e.chunk_size();
    let bs = BS as u64;
    let one = vec![3u8; BS];
    let piece = vec![4u8; 16 * BS];
    let zones = |e: &dmz::engine::Engine| {
        let s = e.stats();
        (s.zones_free_conventional, s.zones_buffer)
    };
    // (chunk, block, data, conventional zones and buffer zones after it)
    type Case<'a> = (u64, u64, &'a [u8], (u64, u64));
    let cases: [Case; 4] = [
        (0, 3000, &one, (3, 0)),   // far: a random write, a conventional zone
        (1, 40, &one, (2, 1)),     // 4 KiB 40 blocks in: an early piece
        (2, 100, &one, (1, 1)),    // 4 KiB 100 blocks in: more than 64 of its length
        (3, 1000, &piece, (0, 2)), // 64 KiB 1000 blocks in: within 64 pieces and the window
    ];
    for (chunk, block, data, want) in &cases {
        e.write(chunk * cs + block * bs, data, false).unwrap();
        assert_eq!(
            zones(&e),
            *want,
            "chunk {chunk} block {block}: {:?}",
            e.stats()
        );
    }
    let mut got = vec![0u8; 16 * BS];
    for (chunk, block, data, _) in &cases {
        let off = chunk * cs + block * bs;
        e.read(off, &mut got[..data.len()]).unwrap();
        assert!(&got[..data.len()] == *data, "block at {off} differs");
    }
    close(e);
}
