#!/usr/bin/env bash
# Guest side of scripts/bench-hdd-model.sh: fio on `zonedd expose IMAGE --timing hdd`, fio
# JSON and the device's status into OUT. Three exposures of one image:
#   -none    --timing none, every job: what the VM itself allows
#   (plain)  --timing hdd with PARAMS: sequential jobs, 4 KiB random reads QD1 and QD32
#   -scaled  --timing hdd with PARAMS and SCALED (rates the VM can keep up with): sequential
#   hdd-model-guest.sh --out DIR --image-mb N --zone-mb N --conv N --params "K=V ..."
#                      --scaled "K=V ..." --seq-off-mb N --seq-mb N --rand-secs N
set -euo pipefail
out="" image_mb=1024 zone_mb=64 conv=2 params="" scaled="" seq_off=128 seq_mb=192 rand_secs=20
while [ $# -gt 0 ]; do
    case $1 in
    --out) out=$2 && shift ;;
    --image-mb) image_mb=$2 && shift ;;
    --zone-mb) zone_mb=$2 && shift ;;
    --conv) conv=$2 && shift ;;
    --params) params=$2 && shift ;;
    --scaled) scaled=$2 && shift ;;
    --seq-off-mb) seq_off=$2 && shift ;;
    --seq-mb) seq_mb=$2 && shift ;;
    --rand-secs) rand_secs=$2 && shift ;;
    *) echo "unknown argument $1" >&2 && exit 2 ;;
    esac
    shift
done
[ -n "$out" ] || { echo "--out DIR is required" >&2 && exit 2; }
source "$(dirname "$0")/../../tests/vm/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
img=$VM_SCRATCH/hdd.img
"$Z" emulate "$img" --size "${image_mb}M" --zone-size "${zone_mb}M" --conventional "$conv"

expose() { # expose TIMING-ARGS...: sets id, bdev
    local res
    res=$("$Z" expose "$img" "$@")
    bdev=$(sed -n 1p <<<"$res")
    id=$(sed -n 's/^id //p' <<<"$res")
}
job() { # job NAME FIO-ARGS...
    local name=$1
    shift
    vm_step "$name"
    fio --name="$name" --filename="$bdev" --direct=1 --ioengine=libaio --zonemode=zbd \
        --offset="${seq_off}M" --size="${seq_mb}M" --eta=never --output-format=json \
        --output="$out/$name.fio.json" "$@" >/dev/null
    python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
for d in ("read", "write"):
    r = j[d]
    if r["io_bytes"]:
        print("  %s: %.1f MB/s, %.1f IOPS" % (d, r["bw_bytes"] / 1e6, r["iops"]))' \
        "$out/$name.fio.json"
}
seq_jobs() { # seq_jobs SUFFIX
    blkzone reset -o $((seq_off * 2048)) -l $((seq_mb * 2048)) "$bdev"
    job "seqwrite$1" --rw=write --bs=1M --iodepth=1
    job "seqread$1" --rw=read --bs=1M --iodepth=1
}

rand_jobs() { # rand_jobs SUFFIX
    job "randread-qd1$1" --rw=randread --bs=4k --iodepth=1 --runtime="$rand_secs" --time_based
    job "randread-qd32$1" --rw=randread --bs=4k --iodepth=32 --runtime="$rand_secs" --time_based
}

expose --timing none
seq_jobs -none
rand_jobs -none
"$Z" delete "$id"

hdd_args() { for kv in "$@"; do printf -- '--timing-param %s ' "$kv"; done; }
# shellcheck disable=SC2086,SC2046 # PARAMS are K=V words
expose --timing hdd $(hdd_args $params)
seq_jobs ""
rand_jobs ""
"$Z" status "$id" --json >"$out/status.json"
"$Z" delete "$id"
# shellcheck disable=SC2086,SC2046
expose --timing hdd $(hdd_args $params $scaled)
seq_jobs -scaled
"$Z" status "$id" --json >"$out/status-scaled.json"
"$Z" delete "$id"
echo "hdd-model bench done"
