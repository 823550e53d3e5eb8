#!/usr/bin/env bash
# 4 KiB random reads of written data, QD1 and QD16, on a null_blk zoned device: zonedd
# with hop-free reads (the default) and with every read through the pool
# (ZONEDD_HOP_FREE_READS=0), twice each, alternating, then the raw device (the floor), in
# one boot. One line per run; fio JSON in $OUT (default $VM_SCRATCH). Run it as a scenario:
#   scripts/vm-test.sh scripts/bench/read-path-guest.sh   (ZONEDD_VM_READ_PATH_SECS=N, default 10)
# vm-timeout: 900
# vm-memory: 3G
set -euo pipefail
source "$(dirname "$0")/../../tests/vm/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
secs=${ZONEDD_VM_READ_PATH_SECS:-10}
out=${OUT:-$VM_SCRATCH}
mkdir -p "$out"
nb=$(make_nullb nullb0 1536 64 6)
"$Z" format --backend "$nb" --force --reserved-seq 2 >/dev/null

iops() { # iops NAME DEV QD
    local f=$out/$1-qd$3.json
    fio --name="$1" --filename="$2" --direct=1 --rw=randread --bs=4k --iodepth="$3" \
        --ioengine=libaio --size=512M --runtime="$secs" --time_based --eta=never \
        --output-format=json --output="$f" >/dev/null
    python3 -c 'import json,sys
j = json.load(open(sys.argv[1]))["jobs"][0]["read"]
print("%.0f IOPS, p50 %.0f us, p99 %.0f us" % (j["iops"], j["clat_ns"]["percentile"]["50.000000"] / 1e3,
      j["clat_ns"]["percentile"]["99.000000"] / 1e3))' "$f"
}

zonedd_run() { # zonedd_run NAME ENV...: create, fill once, read at QD1 and QD16, delete
    local name=$1 res bdev id
    shift
    res=$(env "$@" "$Z" create --backend "$nb" --queues 2 --depth 64)
    bdev=$(sed -n 1p <<<"$res")
    id=$(sed -n 's/^id //p' <<<"$res")
    if [ ! -e "$out/filled" ]; then
        fio --name=fill --filename="$bdev" --direct=1 --rw=write --bs=1M --iodepth=8 \
            --ioengine=libaio --size=512M --eta=never --output=/dev/null
        touch "$out/filled"
    fi
    for qd in 1 16; do
        echo "read-path: $name QD$qd: $(iops "$name" "$bdev" "$qd")"
    done
    "$Z" status "$id" --json | python3 -c 'import json,sys
f = json.load(sys.stdin)["frontend"]
print("read-path: %s: reads %d, hop-free %d, pool %d, retried %d" % (sys.argv[1], f["reads"],
      f["hop_free_reads"], f["pool_reads"], f["hop_free_retries"]))' "$name"
    "$Z" delete "$id" >/dev/null
}

rm -f "$out/filled"
for round in 1 2; do
    zonedd_run "hop-free-$round" ZONEDD_HOP_FREE_READS=1
    zonedd_run "pool-$round" ZONEDD_HOP_FREE_READS=0
done
# The floor: the raw device (after zonedd's fill: its zones hold data).
for qd in 1 16; do
    echo "read-path: raw null_blk QD$qd: $(iops raw "$nb" "$qd")"
done
remove_nullb "$nb"
echo "read-path: done"
