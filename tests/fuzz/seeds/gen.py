#!/usr/bin/env python3
"""Writes the seed corpora next to this script (run from anywhere; deterministic).

superblock/: the kernel's, dmzadm's and zonedd's superblocks (tests/vectors), unsealed.
layout/:     the vector geometry and the small fuzz geometry, plus refused shapes.
load/:       every base image, and the bad-input catalogue as mutation ops (corrupt one or both
             superblocks, metadata v1, stale set, bad map entry, stray writes, read-only zone).
request/:    one descriptor per ublk op.
See tests/fuzz/src/lib.rs for each input format.
"""
import os, struct

here = os.path.dirname(os.path.abspath(__file__))
vec = os.path.join(here, "..", "..", "..", "crates", "dmz", "tests", "vectors")


def put(target, name, data):
    d = os.path.join(here, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


for f in sorted(os.listdir(vec)):
    if f.endswith(".bin"):
        with open(os.path.join(vec, f), "rb") as fh:
            sb = fh.read(4096)
        put("superblock", f.replace(".bin", ""), b"\x00" + sb)
        # Same block with the version set to 1 and the CRC re-sealed: the v1 refusal.
        v1 = bytearray(sb)
        v1[4:8] = struct.pack("<I", 1)
        put("superblock", f.replace(".bin", "-v1"), b"\x01" + bytes(v1))


def layout(g, zones, conv, special, tweak, reserved, mode):
    b = bytes([g]) + struct.pack("<HH", zones - 1, conv) + bytes([len(special)])
    for z, w in special:
        b += struct.pack("<HB", z, w)
    return b + bytes([tweak]) + struct.pack("<IB", reserved, mode) + b"\0" * 4


put("layout", "small", layout(8, 16, 4, [], 0, 2, 0))
put("layout", "vectors", layout(14, 24, 8, [], 0, 4, 0))
put("layout", "offline-zones", layout(8, 64, 8, [(3, 1), (20, 0), (63, 2)], 0, 16, 0))
put("layout", "two-conventional", layout(8, 64, 2, [], 0, 16, 0))
put("layout", "not-power-of-two", layout(0x80 | 3, 16, 4, [], 0, 2, 0))
put("layout", "zns-capacity", layout(8, 16, 4, [], 1, 2, 0))
put("layout", "raw-fields", layout(8, 16, 4, [], 0, 2, 1) + b"\x07" * 40)


def patch(set_, blk, off, data):
    return bytes([0, set_]) + struct.pack("<HHB", blk, off, len(data)) + data


def seal(set_):
    return bytes([1, set_])


def seqwrite(zone, n):
    return bytes([2, zone, n - 1])


def cond(zone, offline):
    return bytes([3, zone, offline])


names = ["small-fresh", "small-used", "kernel-fresh", "kernel-used", "zonedd-fresh", "zonedd-kernel"]
for i, n in enumerate(names):
    put("load", n, bytes([i, 7]))
put("load", "sb0-bad-magic", bytes([0, 1]) + patch(0, 0, 0, b"XXXX"))
put("load", "both-bad-magic", bytes([1, 1]) + patch(0, 0, 0, b"XXXX") + patch(1, 0, 0, b"XXXX"))
put("load", "sb1-bad-crc", bytes([1, 2]) + patch(1, 0, 100, b"\x01"))
put("load", "v1-both", bytes([0, 3]) + patch(0, 0, 4, b"\x01") + seal(0) + patch(1, 0, 4, b"\x01") + seal(1))
put("load", "stale-set1", bytes([1, 4]) + patch(0, 0, 8, b"\x05") + seal(0))
put("load", "stale-set0", bytes([3, 4]) + patch(1, 0, 8, b"\x09") + seal(1))
put("load", "map-to-empty-seq", bytes([3, 5]) + patch(0, 1, 0, struct.pack("<II", 20, 0xFFFFFFFF)) + patch(1, 1, 0, struct.pack("<II", 20, 0xFFFFFFFF)))
put("load", "map-past-end", bytes([0, 5]) + patch(0, 1, 8, struct.pack("<II", 999, 3)))
put("load", "stray-seq-writes", bytes([1, 6]) + seqwrite(9, 4) + seqwrite(12, 1))
put("load", "readonly-set1-zone", bytes([0, 6]) + patch(0, 0, 0, b"XXXX") + cond(1, 0))
put("load", "nr-chunks-sealed", bytes([0, 8]) + patch(0, 0, 32, struct.pack("<I", 11)) + seal(0))
put("load", "set-differ-equal-gen", bytes([1, 9]) + patch(1, 2, 0, b"\xff" * 16))


def req(op, start, nr, cap, buf, chunk_shift):
    return struct.pack("<IB", op, 2) + struct.pack("<HIQIB", start // 8, nr, cap << 4, buf, chunk_shift)


put("request", "read", req(0, 8, 16, 1 << 30, 512 << 10, 8))
put("request", "write-fua", req(1 | (1 << 13), 0, 8, 1 << 30, 512 << 10, 8))
put("request", "flush", req(2, 0, 0, 1 << 30, 512 << 10, 8))
put("request", "discard", req(3, 8, 8 << 10, 1 << 30, 512 << 10, 8))
put("request", "write-zeroes", req(5, 0, 8, 1 << 30, 512 << 10, 8))

# A copy of superblock 1 (small base image: gen 1, sb_block 256, 18 meta blocks, 2 reserved,
# 12 chunks, 1 map block, 16 bitmap blocks, fixed UUIDs) in data zone 2, sealed; superblock 1
# wiped and superblock 0 with a bad CRC: the scan must not take the copy as set 1.
hdr = struct.pack("<IIQQIIIIII", 0x445A4244, 2, 1, 256, 18, 2, 12, 1, 16, 0)
hdr += b"fuzz".ljust(32, b"\0") + b"zonedd-fuzz-set!" + b"zonedd-fuzz-dev!"
put("../regressions/load", "stray-superblock-copy-accepted-as-set1",
    bytes([0, 10]) + patch(2, 0, 0, hdr) + seal(2) + patch(1, 0, 0, b"\0\0\0\0") + patch(0, 0, 100, b"\x55"))
