#!/usr/bin/env bash
# Issue 13's targets in one boot, each target on a fresh volume, the targets alternating
# (even rounds in reverse order), ZONEDD_VM_REQUEST_PATH_ROUNDS rounds (default 2):
#   floor:    zonedd's in-memory target (`--backend mem:1536M`), served on the queue threads
#             (no pool, no eventfd, no device): the ublk round trip alone on this kernel;
#   zonedd:   zonedd on a null_blk zoned device (1.5 GiB, 64 MiB zones, 8 conventional);
#   log:      zonedd's log layout (`format --layout log`) on a null_blk zoned device of 1.5 GiB
#             with 16 MiB zones, 8 conventional (with 64 MiB zones the frontiers and spare
#             zones it keeps out would leave less than the jobs' 832 MiB); not in the default
#             order: ZONEDD_VM_REQUEST_PATH_LOG=1 adds it after zonedd;
#   dm-zoned: the kernel's dm-zoned on the same format of the same device;
#   raw:      the null_blk device itself (sequential writes with fio's zonemode=zbd, reads).
# Jobs, in this order on each:
#   seqwrite: 1 MiB writes at QD8 over 512 MiB from offset 0 (the fill of the reads);
#   randread QD1 / QD16: 4 KiB random reads over those 512 MiB, time-based;
#   randwrite: 4 KiB random writes at QD16 over 192 MiB of never-written chunks (three:
#              they fit the conventional zones), time-based;
#   fsync: 4 KiB random writes at QD1, each followed by fsync, over 64 MiB of another chunk.
# With ZONEDD_VM_REQUEST_PATH_BASE=/path/to/another/zonedd (a path the guest sees: the host's
# / is shared), a fifth target "base" runs zonedd's jobs with that binary, for two builds
# side by side in one boot (ratios zonedd/base).
# One line per job and run ("request-path: TARGET-ROUND JOB: ..."), zonedd's counters, then
# a table of medians and the ratios the issue names. fio JSON in $OUT (default $VM_SCRATCH).
# Run it as a scenario:
#   scripts/vm-test.sh scripts/bench/request-path-guest.sh
#   (ZONEDD_VM_REQUEST_PATH_SECS=N per time-based job, default 10;
#   ZONEDD_VM_REQUEST_PATH_JOBS="fsync randwrite" runs only those jobs (seqwrite, the fill of
#   the reads, runs with any read job); ZONEDD_VM_REQUEST_PATH_TARGETS="zonedd base" only
#   those targets; only ZONEDD_VM_* variables reach the guest)
# vm-timeout: 2400
# vm-memory: 4G
set -euo pipefail
source "$(dirname "$0")/../../tests/vm/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
modprobe dm-zoned
secs=${ZONEDD_VM_REQUEST_PATH_SECS:-10}
base=${ZONEDD_VM_REQUEST_PATH_BASE:-}
only_jobs=${ZONEDD_VM_REQUEST_PATH_JOBS:-}
only_targets=${ZONEDD_VM_REQUEST_PATH_TARGETS:-}
[ -z "$base" ] || [ -x "$base" ] || vm_fail "ZONEDD_VM_REQUEST_PATH_BASE: $base is not an executable"
rounds=${ZONEDD_VM_REQUEST_PATH_ROUNDS:-2}
with_log=${ZONEDD_VM_REQUEST_PATH_LOG:-}
out=${OUT:-$VM_SCRATCH}
mkdir -p "$out"
nb=$(make_nullb nullb0 1536 64 8)
dm_name=request-path-dmz
results=$out/request-path.tsv
daemon_pid="" # the zonedd daemon of the target being run (none for dm-zoned and raw)
: >"$results"

summary() { # summary FIO-JSON RW: "IOPS MB/s p50-us p99-us [fsync-p50 fsync-p99]"
    python3 -c 'import json,sys
j = json.load(open(sys.argv[1]))["jobs"][0]
d = j[sys.argv[2]]
p = lambda l, q: l.get("percentile", {}).get(q, 0) / 1e3
f = [d["iops"], d["bw_bytes"] / 1e6, p(d["clat_ns"], "50.000000"), p(d["clat_ns"], "99.000000")]
s = j.get("sync", {}).get("lat_ns", {})
if s.get("N", 0):
    f += [p(s, "50.000000"), p(s, "99.000000")]
print(" ".join("%.1f" % x for x in f))' "$1" "$2"
}

switches() { # switches PID: context switches (voluntary and not) of all its threads so far
    cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ { n += $2 } END { print n }'
}

job() { # job NAME DEV JOB [raw]: run fio, log one result line
    local name=$1 dev=$2 kind=$3 raw=${4:-} f=$out/$1-$3.json rw=write args=() c0=""
    local common=(--filename="$dev" --eta=never --output-format=json --output="$f")
    case $kind in
    seqwrite)
        args=(--direct=1 --rw=write --bs=1M --iodepth=8 --ioengine=libaio --offset=0 --size=512M)
        [ -z "$raw" ] || args+=(--zonemode=zbd)
        ;;
    randread-qd1 | randread-qd16)
        rw=read
        args=(--direct=1 --rw=randread --bs=4k --iodepth="${kind#randread-qd}" --ioengine=libaio
            --offset=0 --size=512M --runtime="$secs" --time_based --randseed=4)
        ;;
    randwrite)
        args=(--direct=1 --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio --offset=512M
            --size=192M --runtime="$secs" --time_based --randseed=5)
        ;;
    fsync)
        args=(--rw=randwrite --bs=4k --iodepth=1 --fsync=1 --ioengine=psync --offset=768M
            --size=64M --runtime="$secs" --time_based --randseed=6)
        ;;
    esac
    [ -z "$daemon_pid" ] || c0=$(switches "$daemon_pid")
    fio --name="$name" "${common[@]}" "${args[@]}" >/dev/null
    local s sw=""
    s=$(summary "$f" "$rw")
    printf '%s\t%s\t%s\n' "${name%-*}" "$kind" "$s" >>"$results"
    if [ -n "$c0" ]; then
        # The daemon's context switches per fio I/O: more than one per I/O at QD1 would
        # mean a wakeup beyond the one each request needs.
        sw=$(python3 -c 'import json,sys
n = json.load(open(sys.argv[1]))["jobs"][0][sys.argv[2]]["total_ios"]
print(", daemon switches %.2f per I/O" % ((int(sys.argv[4]) - int(sys.argv[3])) / max(n, 1)))' \
            "$f" "$rw" "$c0" "$(switches "$daemon_pid")")
    fi
    echo "request-path: $name $kind: $s (IOPS MB/s p50-us p99-us [fsync p50 p99])$sw"
}

counters() { # counters NAME ID
    "$Z" status "$2" --json | python3 -c 'import json,sys
d = json.load(sys.stdin)
f, e = d["frontend"], d.get("engine") or {}
print("request-path: %s: reads %d (hop-free %d, linked %s, pool %d), writes %d (hop-free %d, retried %d), flushes %d (on the ring %s), log blocks %s, proof flushes %s, device flushes %s, turned away %s" % (
    sys.argv[1], f["reads"], f["hop_free_reads"], f.get("linked_reads", "-"), f["pool_reads"], f["writes"],
    f["hop_free_writes"], f["hop_free_write_retries"], f["flushes"], f.get("ring_flushes", "-"),
    e.get("log_block_writes", e.get("log_blocks_written", "-")), e.get("proof_flushes", "-"),
    e.get("device_flushes", "-"), f.get("ring_again", "-")))' "$1"
}

wanted() { # wanted JOB: in ZONEDD_VM_REQUEST_PATH_JOBS (seqwrite: when a read job is)
    local j
    for j in $only_jobs; do
        [ "$j" != "$1" ] || return 0
        [ "$1" != seqwrite ] || [ "${j#randread}" = "$j" ] || return 0
    done
    return 1
}

run() { # run NAME floor|zonedd|log|base|dm-zoned|raw
    local name=$1 kind=$2 res dev id="" nr k jobs=(seqwrite randread-qd1 randread-qd16 randwrite fsync)
    local Z=$Z
    daemon_pid=""
    [ "$kind" != base ] || Z=$base
    if [ "$kind" = log ]; then
        remove_nullb "$nb"
        nb=$(make_nullb nullb0 1536 16 8)
    fi
    case $kind in
    floor | zonedd | base | log)
        local backend=mem:1536M
        if [ "$kind" = log ]; then
            "$Z" format --backend "$nb" --force --layout log >/dev/null
            backend=$nb
        elif [ "$kind" != floor ]; then
            "$Z" format --backend "$nb" --force --reserved-seq 2 >/dev/null
            backend=$nb
        fi
        res=$("$Z" create --backend "$backend" --queues 2 --depth 64)
        dev=$(sed -n 1p <<<"$res")
        id=$(sed -n 's/^id //p' <<<"$res")
        daemon_pid=$("$Z" status "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
        ;;
    dm-zoned)
        "$Z" format --backend "$nb" --force --reserved-seq 2 >/dev/null
        nr=$("$Z" check "$nb" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["summary"]["nr_chunks"])')
        dmsetup create "$dm_name" --table "0 $((nr * 64 * 2048)) zoned $nb"
        dev=/dev/mapper/$dm_name
        ;;
    raw)
        blkzone reset "$nb"
        dev=$nb
        jobs=(seqwrite randread-qd1 randread-qd16)
        ;;
    esac
    for k in "${jobs[@]}"; do
        if [ -n "$only_jobs" ] && ! wanted "$k"; then
            continue
        fi
        job "$name" "$dev" "$k" "$([ "$kind" = raw ] && echo raw)"
    done
    case $kind in
    floor | zonedd | base | log)
        counters "$name" "$id"
        "$Z" delete "$id" >/dev/null
        ;;
    dm-zoned) dmsetup remove "$dm_name" ;;
    esac
    if [ "$kind" = log ]; then
        remove_nullb "$nb"
        nb=$(make_nullb nullb0 1536 64 8)
    fi
}

order=(floor zonedd ${with_log:+log} ${base:+base} dm-zoned raw)
for ((round = 1; round <= rounds; round++)); do
    # Even rounds in reverse order: no target always runs first on a fresh null_blk.
    if ((round % 2 == 0)); then
        targets=()
        for ((i = ${#order[@]} - 1; i >= 0; i--)); do targets+=("${order[i]}"); done
    else
        targets=("${order[@]}")
    fi
    for t in "${targets[@]}"; do
        if [ -n "$only_targets" ] && [[ " $only_targets " != *" $t "* ]]; then
            continue
        fi
        run "$t-$round" "$t"
    done
done
remove_nullb "$nb"

# Medians per target and job, and the ratios issue 13 names.
python3 - "$results" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by = {}
for t, j, s in rows:
    by.setdefault((t, j), []).append([float(x) for x in s.split()])
def med(t, j, i):
    v = [r[i] for r in by.get((t, j), []) if len(r) > i]
    return statistics.median(v) if v else None
def spread(t, j, i):
    v = [r[i] for r in by.get((t, j), []) if len(r) > i]
    return "%.0f-%.0f" % (min(v), max(v)) if v else "-"
print("request-path: medians (range) per target")
for j, i, unit in [("seqwrite", 1, "MB/s"), ("randread-qd1", 0, "IOPS"), ("randread-qd16", 0, "IOPS"),
                   ("randwrite", 0, "IOPS"), ("fsync", 4, "fsync p50 us"), ("fsync", 5, "fsync p99 us")]:
    cells = []
    for t in ["floor", "zonedd", "log", "base", "dm-zoned", "raw"]:
        m = med(t, j, i)
        if m is not None:
            cells.append("%s %.0f (%s)" % (t, m, spread(t, j, i)))
    print("request-path: %s %s: %s" % (j, unit, ", ".join(cells)))
def ratio(a, b, j, i):
    x, y = med(a, j, i), med(b, j, i)
    return "%.2f" % (x / y) if x and y else "-"
print("request-path: ratios of medians")
for j, i, what in [("randread-qd1", 0, "IOPS"), ("randread-qd16", 0, "IOPS"), ("randwrite", 0, "IOPS"),
                   ("fsync", 4, "fsync p50"), ("fsync", 5, "fsync p99"), ("seqwrite", 1, "MB/s")]:
    print("request-path: %s %s: zonedd/floor %s, zonedd/dm-zoned %s, floor/dm-zoned %s, zonedd/raw %s, floor/raw %s, zonedd/base %s" % (
        j, what, ratio("zonedd", "floor", j, i), ratio("zonedd", "dm-zoned", j, i),
        ratio("floor", "dm-zoned", j, i), ratio("zonedd", "raw", j, i), ratio("floor", "raw", j, i),
        ratio("zonedd", "base", j, i)))
    if med("log", j, i) is not None:
        print("request-path: %s %s: log/floor %s, log/dm-zoned %s, log/raw %s, log/zonedd %s" % (
            j, what, ratio("log", "floor", j, i), ratio("log", "dm-zoned", j, i),
            ratio("log", "raw", j, i), ratio("log", "zonedd", j, i)))
EOF
echo "request-path: done"
