#!/usr/bin/env bash
# Guest side of scripts/profile-vm.sh: `perf record` (cpu-clock: TCG has no PMU, all CPUs,
# call graphs) while fio runs one workload against zonedd's /dev/ublkbN on a null_blk zoned
# device, then `perf report` summaries by thread and by symbol into OUT.
#   profile-guest.sh --out DIR [--seconds N] [--only NAME] [--create-args "ARGS"]
# From the host (ZONEDD_VM_* reach the guest): ZONEDD_VM_PROFILE_CREATE_ARGS, the default of
# --create-args; ZONEDD_VM_PROFILE_LOG_FILL, how much the log-layout jobs write sequentially
# first (default 512M; 1024M fills the volume, so that GC runs throughout).
set -euo pipefail
out="" secs=15 only="" create_args=${ZONEDD_VM_PROFILE_CREATE_ARGS:-}

while [ $# -gt 0 ]; do
    case $1 in
    --out) out=$2 && shift ;;
    --seconds) secs=$2 && shift ;;
    --only) only=$2 && shift ;;
    --create-args) create_args=$2 && shift ;;
    *) echo "unknown argument $1" >&2 && exit 2 ;;
    esac
    shift
done
[ -n "$out" ] || { echo "--out DIR is required" >&2 && exit 2; }
source "$(dirname "$0")/../../tests/vm/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
command -v perf >/dev/null || vm_fail "perf is not installed (apt install linux-perf)"

profile() { # profile NAME [--prefill] FIO-ARGS...
    local name=$1 dev id bdev res prefill=0
    shift
    [ "$1" != --prefill ] || { prefill=1 && shift; }
    [ -z "$only" ] || [[ " $only " == *" $name "* ]] || return 0
    local fill=1024M
    if [ "${name%-floor}" != "$name" ]; then
        dev=mem:1536M # no engine, no device: what ublk alone costs (served on the queue threads)
    elif [ "${name%-log}" != "$name" ]; then
        # The log layout (issue 14): 16 MiB zones, 24 conventional (its log and index).
        dev=$(make_nullb nullb0 1536 16 24)
        "$Z" format --backend "$dev" --force --layout log >/dev/null 2>&1
        fill=${ZONEDD_VM_PROFILE_LOG_FILL:-512M}
    else
        dev=$(make_nullb nullb0 1536 64 6)
        "$Z" format --backend "$dev" --force --reserved-seq 2 >/dev/null 2>&1
    fi
    # shellcheck disable=SC2086 # ARGS are words for zonedd create
    res=$("$Z" create --backend "$dev" --queues 2 --depth 64 $create_args)
    bdev=$(sed -n 1p <<<"$res")
    id=$(sed -n 's/^id //p' <<<"$res")
    if [ "$prefill" = 1 ]; then
        # Every chunk of the span in a sequential zone first, as in bench-vm's randwrite.
        fio --name=fill --filename="$bdev" --direct=1 --rw=write --bs=1M --iodepth=8 \
            --ioengine=libaio --size="$fill" --eta=never --output=/dev/null
    fi
    vm_step "$name: perf record while fio runs ${secs} s on $bdev"
    perf record -q -e cpu-clock -F 999 -a -g -o "$VM_SCRATCH/$name.data" -- \
        fio --name="$name" --filename="$bdev" --direct=1 --runtime="$secs" --time_based \
        --eta=never --output-format=json --output="$out/$name.fio.json" "$@" >/dev/null 2>&1
    "$Z" status "$id" --json >"$out/$name.status.json"
    "$Z" delete "$id" >/dev/null
    [ "${name%-floor}" != "$name" ] || remove_nullb "$dev"
    perf report -q -i "$VM_SCRATCH/$name.data" --stdio --no-children --sort comm \
        >"$out/$name.by-thread.txt" 2>/dev/null || true
    perf report -q -i "$VM_SCRATCH/$name.data" --stdio --no-children -g none \
        --sort comm,dso,sym --percent-limit 0.5 >"$out/$name.by-symbol.txt" 2>/dev/null || true
    # zonedd's threads alone, finer: what the daemon's side of a request costs.
    perf report -q -i "$VM_SCRATCH/$name.data" --stdio --no-children -g none --comm zonedd \
        --sort dso,sym --percent-limit 0.1 >"$out/$name.zonedd.txt" 2>/dev/null || true
    # The same with callees counted in (kernel call chains are whole; zonedd's own stop at
    # its first frame without a frame pointer).
    perf report -q -i "$VM_SCRATCH/$name.data" --stdio --children -g none --comm zonedd \
        --sort sym --percent-limit 0.3 >"$out/$name.zonedd-children.txt" 2>/dev/null || true
    echo "$name: $(head -c 300 "$out/$name.by-thread.txt" | tr -s ' \n' ' ')"
}

profile seqwrite --rw=write --bs=1M --iodepth=8 --ioengine=libaio --size=1024M
profile fsync --rw=write --bs=4k --iodepth=1 --ioengine=psync --fsync=1 --offset=1024M --size=64M
# The same through zonedd's in-memory test target: the floor that ublk and the pool set.
profile fsync-floor --rw=write --bs=4k --iodepth=1 --ioengine=psync --fsync=1 --size=64M
# Reads of never-written chunks: no device I/O, so this is the ublk + pool path alone.
profile randread --rw=randread --bs=4k --iodepth=16 --ioengine=libaio --size=1024M
# 4 KiB random reads at QD1 of written data (issue 13's QD1 target), and the same on the
# floor: the difference is what zonedd's read path adds to ublk's round trip.
profile randread-qd1 --prefill --rw=randread --bs=4k --iodepth=1 --ioengine=libaio --size=512M
profile randread-qd1-floor --prefill --rw=randread --bs=4k --iodepth=1 --ioengine=libaio --size=512M
# 4 KiB random writes over three chunks that fit the conventional zones (the hop-free write
# path: scripts/bench/write-path-guest.sh's randwrite job).
profile randwrite-conv --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio --size=192M
# Sustained random overwrites of 16 full chunks with 4 buffer zones: reclaim-bound.
profile randwrite --prefill --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio --size=1024M
# The same on the log layout (every write appended, GC in the writers), over 512 MiB.
profile randwrite-log --prefill --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio --size=512M
echo "profile: done"
