#!/usr/bin/env bash
# The write path, in one boot on a null_blk zoned device (1.5 GiB, 64 MiB zones, 8
# conventional), each run on a freshly formatted volume: zonedd with hop-free writes (the
# default), zonedd with every write through the pool (ZONEDD_HOP_FREE_WRITES=0), and the
# kernel's dm-zoned on the same format, alternating, ZONEDD_VM_WRITE_PATH_ROUNDS rounds (default 2).
# Jobs per run:
#   randwrite: 4 KiB random writes at QD16 over 192 MiB (three chunks: fits the
#              conventional zones), time-based;
#   fsync:     4 KiB random writes at QD1, each followed by fsync, over 64 MiB elsewhere.
# One line per job and run, then zonedd's counters (how many writes went hop-free); fio
# JSON in $OUT (default $VM_SCRATCH). Run it as a scenario:
#   scripts/vm-test.sh scripts/bench/write-path-guest.sh   (ZONEDD_VM_WRITE_PATH_SECS=N, default 10;
#   only ZONEDD_VM_* variables reach the guest)
# vm-timeout: 1200
# vm-memory: 3G
set -euo pipefail
source "$(dirname "$0")/../../tests/vm/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
modprobe dm-zoned
secs=${ZONEDD_VM_WRITE_PATH_SECS:-10}
rounds=${ZONEDD_VM_WRITE_PATH_ROUNDS:-2}
out=${OUT:-$VM_SCRATCH}
mkdir -p "$out"
nb=$(make_nullb nullb0 1536 64 8)
dm_name=write-path-dmz

job() { # job NAME DEV KIND: fio, one summary line
    local name=$1 dev=$2 kind=$3 f=$out/$1-$3.json
    case $kind in
    randwrite)
        fio --name="$name" --filename="$dev" --direct=1 --rw=randwrite --bs=4k --iodepth=16 \
            --ioengine=libaio --offset=0 --size=192M --runtime="$secs" --time_based \
            --randseed=5 --eta=never --output-format=json --output="$f" >/dev/null
        ;;
    fsync)
        fio --name="$name" --filename="$dev" --rw=randwrite --bs=4k --iodepth=1 --fsync=1 \
            --ioengine=psync --offset=640M --size=64M --runtime="$secs" --time_based \
            --randseed=6 --eta=never --output-format=json --output="$f" >/dev/null
        ;;
    esac
    python3 -c 'import json,sys
j = json.load(open(sys.argv[1]))["jobs"][0]
w, s = j["write"], j["sync"]["lat_ns"]
p = lambda d, q: d.get("percentile", {}).get(q, 0) / 1e3
print("%.0f IOPS, write p50 %.0f us p99 %.0f us, fsync p50 %.0f us p99 %.0f us" % (
    w["iops"], p(w["clat_ns"], "50.000000"), p(w["clat_ns"], "99.000000"),
    p(s, "50.000000"), p(s, "99.000000")))' "$f"
}

run() { # run NAME zd|dm [ENV...]: fresh volume, both jobs, counters, tear down
    local name=$1 kind=$2 res dev id="" nr
    shift 2
    "$Z" format --backend "$nb" --force --reserved-seq 2 >/dev/null
    if [ "$kind" = dm ]; then
        nr=$("$Z" check "$nb" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["summary"]["nr_chunks"])')
        dmsetup create "$dm_name" --table "0 $((nr * 64 * 2048)) zoned $nb"
        dev=/dev/mapper/$dm_name
    else
        res=$(env "$@" "$Z" create --backend "$nb" --queues 2 --depth 64)
        dev=$(sed -n 1p <<<"$res")
        id=$(sed -n 's/^id //p' <<<"$res")
    fi
    for k in randwrite fsync; do
        echo "write-path: $name $k: $(job "$name" "$dev" "$k")"
    done
    if [ "$kind" = dm ]; then
        dmsetup remove "$dm_name"
    else
        "$Z" status "$id" --json | python3 -c 'import json,sys
d = json.load(sys.stdin)
f, e = d["frontend"], d["engine"]
print("write-path: %s: writes %d, hop-free %d (retried %d, handed off %d), log blocks %d, unlogged %d, written ahead %d, proof flushes %d" % (
    sys.argv[1], f["writes"], f["hop_free_writes"], f["hop_free_write_retries"], f["hop_free_handoffs"],
    e["log_block_writes"], e["unlogged_overwrites"], e["written_ahead"], e["proof_flushes"]))' "$name"
        "$Z" delete "$id" >/dev/null
    fi
}

for ((round = 1; round <= rounds; round++)); do
    run "hop-free-$round" zd ZONEDD_HOP_FREE_WRITES=1
    run "pool-$round" zd ZONEDD_HOP_FREE_WRITES=0
    run "dm-zoned-$round" dm
done
remove_nullb "$nb"
echo "write-path: done"
