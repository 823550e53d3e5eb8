#!/usr/bin/env bash
# Guest side of scripts/bench-multidrive.sh: concurrent sequential streams on a multi-device
# volume (a regular memory null_blk as the cache, zoned drives served by `zonedd expose
# --timing hdd` on the scaled model), one drive against two, zonedd against the kernel's
# dm-zoned on the same devices. fio JSON per run into OUT, a line per run in OUT/runs.tsv.
#   multidrive-guest.sh --out DIR --params "K=V ..." --rounds N --cache-mb N --job-mb N
#                       [--rand-secs N] [--rand-rounds N] [--beyond-secs N] [--beyond-mb N]
# Workload: fio, 4 jobs, each writing JOB_MB from the start of its own region (1 MiB writes,
# QD1, O_DIRECT), then fsync: the streams a filesystem's allocation groups give; a run is cut
# at 300 s (fio's bandwidth is then of what it wrote). Each drive: 32 zones of 16 MiB, no
# conventional zones. The cache: CACHE_MB of memory null_blk (two 16 MiB zones hold the
# metadata sets, the rest are cache zones).
# Two figures per run: fio's MB/s, and MB/s until the data is on the drives (the run's start
# until the cache zones are as free as before it: dm-zoned writes every new chunk into a cache
# zone and moves it to a drive later, reclaiming everything only after 10 s without I/O).
# With --rand-secs N (0: skipped), last: 4 KiB random writes (QD32, N seconds) over a 64 MiB
# span, which fits the cache zones, on zonedd (its default, and with every write through the
# pool: ZONEDD_HOP_FREE_WRITES=0) and dm-zoned with two drives and on the raw cache device
# itself (issue 18's ">= 0.8x the cache device's own random-write IOPS"), and zonedd's
# in-memory target (the floor: a ublk round trip and nothing else), RAND_ROUNDS times
# in turn. --rounds 0 skips the streams.
# With --beyond-secs N (0: skipped), last: sustained 4 KiB random writes (QD32, N seconds) over
# BEYOND_MB (default: three times what the cache zones hold), a span the cache zones cannot
# hold, so that reclaim runs under the writes (issue 18's "beyond it, no worse than the
# single-device volume"), after a sequential fill of the span (the steady state of a
# filesystem's overwrites: every random write lands in a full chunk, not in an empty one whose
# reclaim would mostly write zeros), every device a memory null_blk: zonedd and dm-zoned on a
# multi-device volume (the cache and two zoned drives of 32 zones) and on a single zoned
# null_blk with as many conventional zones as the cache has zones and as many sequential zones
# as the two drives, RAND_ROUNDS times in turn; a line per run in OUT/beyond.tsv.
set -euo pipefail
out="" params="" rounds=1 cache_mb=64 job_mb=48 rand_secs=0 rand_rounds=1 beyond_secs=0 beyond_mb=0
while [ $# -gt 0 ]; do
    case $1 in
    --out) out=$2 && shift ;;
    --params) params=$2 && shift ;;
    --rounds) rounds=$2 && shift ;;
    --cache-mb) cache_mb=$2 && shift ;;
    --job-mb) job_mb=$2 && shift ;;
    --rand-secs) rand_secs=$2 && shift ;;
    --rand-rounds) rand_rounds=$2 && shift ;;
    --beyond-secs) beyond_secs=$2 && shift ;;
    --beyond-mb) beyond_mb=$2 && shift ;;
    *) echo "unknown argument $1" >&2 && exit 2 ;;
    esac
    shift
done
[ -n "$out" ] || { echo "--out DIR is required" >&2 && exit 2; }
source "$(dirname "$0")/../../tests/vm/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
modprobe dm-zoned
ZONE_MB=16 DRIVE_ZONES=32 JOBS=4

hdd_args() { for kv in "$@"; do printf -- '--timing-param %s ' "$kv"; done; }
drives=() drive_ids=()
for n in 1 2; do
    img=$VM_SCRATCH/drive$n.img
    "$Z" emulate "$img" --size $((ZONE_MB * DRIVE_ZONES))M --zone-size ${ZONE_MB}M --conventional 0 >/dev/null
    # shellcheck disable=SC2086,SC2046 # PARAMS are K=V words
    res=$("$Z" expose "$img" --timing hdd $(hdd_args $params))
    drives+=("$(sed -n 1p <<<"$res")")
    drive_ids+=("$(sed -n 's/^id //p' <<<"$res")")
done
# snap NAME: each drive's model counters (seeks, flushes, busy time) into OUT/NAME.driveN.json
snap() {
    local i
    for i in 0 1; do "$Z" status "${drive_ids[$i]}" --json | jq .timing >"$out/$1.drive$((i + 1)).json"; done
}
cache=$(make_nullb mdcache "$cache_mb" 0 0)
vm_step "drives ${drives[*]} (hdd model: $params), cache $cache"
printf 'target\tdrives\tround\tMBps\tdrained_MBps\n' >"$out/runs.tsv"
TOTAL_MB=$((JOBS * job_mb))

fio_streams() { # fio_streams DEV NAME
    fio --name="$2" --filename="$1" --direct=1 --ioengine=libaio --rw=write --bs=1M \
        --iodepth=1 --numjobs=$JOBS --size="${job_mb}M" --offset_increment="${job_mb}M" \
        --runtime=300 --end_fsync=1 --group_reporting --eta=never --output-format=json \
        --output="$out/$2.fio.json" >/dev/null
    python3 -c 'import json, sys; print("%.2f" % (json.load(open(sys.argv[1]))["jobs"][0]["write"]["bw_bytes"] / 1e6))' \
        "$out/$2.fio.json"
}
fio_rand() { # fio_rand DEV NAME [SPAN_MB SECS] -> IOPS (default: 64 MiB, RAND_SECS)
    fio --name="$2" --filename="$1" --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
        --iodepth=32 --size="${3:-64}M" --runtime="${4:-$rand_secs}" --time_based --eta=never \
        --output-format=json --output="$out/$2.fio.json" >/dev/null
    python3 -c 'import json, sys; print("%.0f" % json.load(open(sys.argv[1]))["jobs"][0]["write"]["iops"])' \
        "$out/$2.fio.json"
}
reset_drives() { for d in "${drives[@]}"; do blkzone reset "$d"; done; }
quiet() { # quiet CMD...: its output only if it fails
    "$@" >"$VM_SCRATCH/quiet.out" 2>&1 || {
        cat "$VM_SCRATCH/quiet.out" >&2
        vm_fail "$*"
    }
}

# wait_drained FREE-CMD BEFORE T0: seconds from T0 (EPOCHREALTIME) until FREE-CMD prints
# BEFORE again (cut at 400 s)
wait_drained() {
    local i
    for ((i = 0; i < 4000; i++)); do
        [ "$($1)" = "$2" ] && break
        sleep 0.1
    done
    python3 -c 'import sys, time; print("%.2f" % (time.time() - float(sys.argv[1])))' "$3"
}
mbps_of() { python3 -c 'import sys; print("%.2f" % (float(sys.argv[1]) * 1.048576 / float(sys.argv[2])))' "$TOTAL_MB" "$1"; }

zd_free() { "$Z" status "$id" --json | jq -r .engine.zones_free_conventional; }
run_zonedd() { # run_zonedd NR_DRIVES ROUND
    local n=$1 backs=() d res bdev mbps before t0 secs
    for d in "${drives[@]:0:$n}"; do backs+=(--backend "$d"); done
    reset_drives
    quiet "$Z" format --cache "$cache" "${backs[@]}" --force
    res=$("$Z" create --cache "$cache" "${backs[@]}")
    bdev=$(sed -n 1p <<<"$res")
    id=$(sed -n 's/^id //p' <<<"$res")
    before=$(zd_free)
    snap "zonedd-$n-r$2.before"
    t0=$EPOCHREALTIME
    mbps=$(fio_streams "$bdev" "zonedd-$n-r$2")
    secs=$(wait_drained zd_free "$before" "$t0")
    snap "zonedd-$n-r$2.after"
    "$Z" status "$id" --json >"$out/zonedd-$n-r$2.status.json"
    "$Z" delete "$id" >/dev/null
    printf 'zonedd\t%s\t%s\t%s\t%s\n' "$n" "$2" "$mbps" "$(mbps_of "$secs")" >>"$out/runs.tsv"
    vm_step "zonedd, $n drive(s), round $2: $mbps MB/s; on the drives after $secs s"
}

# "0 SIZE zoned N zones FREE/TOTAL cache ...": the free cache zones
dm_free() { dmsetup status mdbench | awk '{ for (i = 2; i <= NF; i++) if ($i == "cache") { split($(i - 1), a, "/"); print a[1] } }'; }
# dm_setup DEVICE...: dmzadm formats DEVICE... (a cache and zoned drives, or one zoned
# device) and /dev/mapper/mdbench maps every chunk of it (the size from zonedd's check)
dm_setup() {
    local chunks
    quiet dmzadm --format "$@" --force
    if [ $# = 1 ]; then
        chunks=$("$Z" check "$1" --json | jq -er .summary.nr_chunks)
    else
        chunks=$("$Z" check --cache "$1" "${@:2}" --json | jq -er .summary.nr_chunks)
    fi
    dmsetup create mdbench --table "0 $((chunks * ZONE_MB * 2048)) zoned $*"
}
run_dmzoned() { # run_dmzoned NR_DRIVES ROUND
    local n=$1 mbps before t0 secs
    reset_drives
    dm_setup "$cache" "${drives[@]:0:$n}"
    before=$(dm_free)
    snap "dmzoned-$n-r$2.before"
    t0=$EPOCHREALTIME
    mbps=$(fio_streams /dev/mapper/mdbench "dmzoned-$n-r$2")
    dmsetup status mdbench >"$out/dmzoned-$n-r$2.status.txt"
    secs=$(wait_drained dm_free "$before" "$t0")
    snap "dmzoned-$n-r$2.after"
    dmsetup status mdbench >>"$out/dmzoned-$n-r$2.status.txt"
    dmsetup remove mdbench
    printf 'dm-zoned\t%s\t%s\t%s\t%s\n' "$n" "$2" "$mbps" "$(mbps_of "$secs")" >>"$out/runs.tsv"
    vm_step "dm-zoned, $n drive(s), round $2: $mbps MB/s; on the drives after $secs s"
}

for ((r = 1; r <= rounds; r++)); do
    run_zonedd 1 "$r"
    run_zonedd 2 "$r"
    if command -v dmzadm >/dev/null; then
        run_dmzoned 1 "$r"
        run_dmzoned 2 "$r"
    else
        vm_step "dmzadm is not installed: no dm-zoned runs"
    fi
done
# rand_zonedd NAME BINARY [ENV=V]: zonedd with two drives (ENV=V in the daemon's environment)
rand_zonedd() {
    local name=$1 bin=$2 res id iops && shift 2
    reset_drives
    quiet "$bin" format --cache "$cache" --backend "${drives[0]}" --backend "${drives[1]}" --force
    res=$(env "$@" "$bin" create --cache "$cache" --backend "${drives[0]}" --backend "${drives[1]}")
    id=$(sed -n 's/^id //p' <<<"$res")
    iops=$(fio_rand "$(sed -n 1p <<<"$res")" "rand-$name-r$r")
    "$bin" status "$id" --json >"$out/rand-$name-r$r.status.json"
    cp "/run/zonedd/$id.log" "$out/rand-$name-r$r.log" 2>/dev/null || true
    "$bin" delete "$id" >/dev/null
    printf '%s\t%s\t%s\n' "$name" "$r" "$iops" >>"$out/rand.tsv"
    vm_step "random writes, $name, 2 drives, round $r: $iops IOPS"
}
if [ "$rand_secs" != 0 ]; then
    printf 'target\tround\tIOPS\n' >"$out/rand.tsv"
    for ((r = 1; r <= rand_rounds; r++)); do
        # zonedd's writes on the queue threads' rings (the default) and through the pool
        rand_zonedd zonedd "$Z"
        rand_zonedd "zonedd (pool)" "$Z" ZONEDD_HOP_FREE_WRITES=0
        # Another build beside this one (ZONEDD_BASE: bench-multidrive.sh --base BIN)
        [ -z "${ZONEDD_BASE:-}" ] || rand_zonedd "zonedd (base)" "$ZONEDD_BASE"
        if command -v dmzadm >/dev/null; then
            reset_drives
            dm_setup "$cache" "${drives[@]}"
            iops=$(fio_rand /dev/mapper/mdbench "rand-dmzoned-r$r")
            dmsetup remove mdbench
            printf 'dm-zoned\t%s\t%s\n' "$r" "$iops" >>"$out/rand.tsv"
            vm_step "random writes, dm-zoned, 2 drives, round $r: $iops IOPS"
        fi
        # The floor: zonedd's in-memory target, no engine, no device: what a ublk round
        # trip alone allows in this guest.
        res=$("$Z" create --backend mem:256M)
        id=$(sed -n 's/^id //p' <<<"$res")
        iops=$(fio_rand "$(sed -n 1p <<<"$res")" "rand-floor-r$r")
        "$Z" delete "$id" >/dev/null
        printf 'floor (ublk, memory target)\t%s\t%s\n' "$r" "$iops" >>"$out/rand.tsv"
        vm_step "random writes, zonedd's memory target, round $r: $iops IOPS"
        iops=$(fio_rand "$cache" "rand-cache-r$r")
        printf 'cache device\t%s\t%s\n' "$r" "$iops" >>"$out/rand.tsv"
        vm_step "random writes, the cache device itself, round $r: $iops IOPS"
    done
fi

if [ "$beyond_secs" != 0 ]; then
    conv=$((cache_mb / ZONE_MB))
    [ "$beyond_mb" != 0 ] || beyond_mb=$((3 * (conv - 2) * ZONE_MB))
    z1=$(make_nullb mdz1 $((ZONE_MB * DRIVE_ZONES)) $ZONE_MB 0)
    z2=$(make_nullb mdz2 $((ZONE_MB * DRIVE_ZONES)) $ZONE_MB 0)
    one=$(make_nullb mdone $((ZONE_MB * (2 * DRIVE_ZONES + conv))) $ZONE_MB "$conv")
    multi=(--cache "$cache" --backend "$z1" --backend "$z2")
    single=(--backend "$one")
    vm_step "beyond the cache: $beyond_mb MiB span; multi-device $cache $z1 $z2, single $one ($conv conventional zones)"
    printf 'target\tvolume\tround\tIOPS\n' >"$out/beyond.tsv"
    reset_all() {
        local d
        for d in "$z1" "$z2" "$one"; do quiet blkzone reset "$d"; done
    }
    fill() { # fill DEV: the span written sequentially, 1 MiB at a time
        quiet fio --name=fill --filename="$1" --direct=1 --ioengine=libaio --rw=write --bs=1M \
            --iodepth=4 --size="${beyond_mb}M" --eta=never
    }
    beyond_run() { # beyond_run TARGET VOLUME ROUND IOPS
        printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$out/beyond.tsv"
        vm_step "beyond the cache, $1, $2, round $3: $4 IOPS"
    }
    beyond_zonedd() { # beyond_zonedd TARGET BINARY VOLUME ROUND DEVICE-ARGS...
        local target=$1 bin=$2 vol=$3 r=$4 res id bdev iops name && shift 4
        name=beyond-${target//[^a-z-]/}-$vol-r$r
        reset_all
        quiet "$bin" format "$@" --force
        res=$("$bin" create "$@")
        id=$(sed -n 's/^id //p' <<<"$res")
        bdev=$(sed -n 1p <<<"$res")
        fill "$bdev"
        iops=$(fio_rand "$bdev" "$name" "$beyond_mb" "$beyond_secs")
        "$bin" status "$id" --json >"$out/$name.status.json"
        cp "/run/zonedd/$id.log" "$out/$name.log" 2>/dev/null || true
        "$bin" delete "$id" >/dev/null
        beyond_run "$target" "$vol" "$r" "$iops"
    }
    beyond_dmzoned() { # beyond_dmzoned VOLUME ROUND DEVICE...
        local vol=$1 r=$2 iops && shift 2
        reset_all
        dm_setup "$@"
        fill /dev/mapper/mdbench
        iops=$(fio_rand /dev/mapper/mdbench "beyond-dmzoned-$vol-r$r" "$beyond_mb" "$beyond_secs")
        dmsetup status mdbench >"$out/beyond-dmzoned-$vol-r$r.status.txt"
        dmsetup remove mdbench
        beyond_run dm-zoned "$vol" "$r" "$iops"
    }
    for ((r = 1; r <= rand_rounds; r++)); do
        beyond_zonedd zonedd "$Z" multi "$r" "${multi[@]}"
        # Another build beside this one (ZONEDD_BASE: bench-multidrive.sh --base BIN)
        [ -z "${ZONEDD_BASE:-}" ] ||
            beyond_zonedd "zonedd (base)" "$ZONEDD_BASE" multi "$r" "${multi[@]}"
        beyond_zonedd zonedd "$Z" single "$r" "${single[@]}"
        [ -z "${ZONEDD_BASE:-}" ] ||
            beyond_zonedd "zonedd (base)" "$ZONEDD_BASE" single "$r" "${single[@]}"
        if [ "${BEYOND_DMZONED:-1}" = 1 ] && command -v dmzadm >/dev/null; then
            beyond_dmzoned multi "$r" "$cache" "$z1" "$z2"
            beyond_dmzoned single "$r" "$one"
        fi
    done
fi
echo "multidrive bench done"
