#!/usr/bin/env bash
# What a 4 KiB device read costs a process that does nothing else: random reads at QD1 on a
# null_blk zoned device (1 GiB, 64 MiB zones, 8 conventional; its first 256 MiB written),
# 5 s per fio engine (libaio, io_uring, io_uring with registered buffers and files, psync),
# two rounds. The reference for the device-read share of zonedd's read path under TCG
# (docs/PERFORMANCE.md, "QD1 reads: the commit linked behind the read"). Run it as a scenario:
#   scripts/vm-test.sh --no-build scripts/bench/raw-read-guest.sh
# vm-timeout: 600
# vm-memory: 2G
set -euo pipefail
source "$(dirname "$0")/../../tests/vm/lib/devices.sh"
nb=$(make_nullb nullb0 1024 64 8)
dd if=/dev/urandom of="$nb" bs=1M count=256 oflag=direct 2>/dev/null
for round in 1 2; do
    for eng in libaio io_uring "io_uring --fixedbufs --registerfiles" psync; do
        # shellcheck disable=SC2086 # the engine's words are fio arguments
        r=$(fio --name=r --filename="$nb" --direct=1 --rw=randread --bs=4k --iodepth=1 \
            --ioengine=$eng --size=256M --runtime=5 --time_based --output-format=json |
            jq -r '.jobs[0].read | "\(.iops | floor) IOPS, p50 \(.clat_ns.percentile["50.000000"] / 1000) us"')
        echo "raw-read: round $round, $eng: $r"
    done
done
remove_nullb "$nb"
