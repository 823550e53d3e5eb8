#!/usr/bin/env bash
# An idle, clean daemon sleeps: after writes, fsyncs and reads on /dev/ublkbN (null_blk zoned
# backend, so the data path goes through io_uring), once reclaim is idle and the metadata is
# committed, none of zonedd's threads makes a context switch over a 60 s window (voluntary
# or not: a thread that never wakes cannot be preempted either, so a loaded host changes
# nothing), and no io_uring worker thread (`iou-wrk-*`) exists. The ublk queue threads wait
# on their ring without a timeout (frontend::queue), and the reads and writes they make on
# it are RWF_NOWAIT, never handed to an io-wq worker (docs/design.md, "Never on io-wq").
# Both layouts on null_blk (the log layout with its write groups), then the v2 layout on an
# emulated image (the default backend kind, served through the pool). On the log layout,
# once its background thread has compacted what it has marked (by default the pages reads
# found scattered) and sleeps (docs/design.md, "Log layout": it has no timer then).
# vm-timeout: 900
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv

window=${ZONEDD_IDLE_WINDOW:-60}

quiet() { # quiet LAYOUT [image]: create (on null_blk, or an emulated image), work, settle, measure, delete
    local layout=$1 kind=${2:-null_blk} dev out bdev id pid s i fail tid comm n0 n1 d
    echo "== layout $layout on $kind"
    # The log layout keeps five frontiers and three zones out of the capacity: smaller zones,
    # so that the 128 MiB the work below covers fits.
    if [ "$kind" = image ]; then
        # The daemon's default backend kind: a buffered file, served through the pool (its
        # reads and writes would go to io_uring worker threads on the rings).
        dev=$VM_SCRATCH/idle.img
        "$Z" emulate "$dev" --size 512M --zone-size 32M --conventional 4 --force >/dev/null
    elif [ "$layout" = log ]; then dev=$(make_nullb nullb0 512 16 8); else dev=$(make_nullb nullb0 512 32 4); fi
    "$Z" format --backend "$dev" --force --layout "$layout" >/dev/null
    out=$("$Z" create --backend "$dev" --queues 2 --depth 32)
    bdev=$(sed -n 1p <<<"$out")
    id=$(sed -n 's/^id //p' <<<"$out")
    pid=$("$Z" list --json | python3 -c "import json,sys; print([d for d in json.load(sys.stdin) if d['id']==$id][0]['pid'])")
    echo "created $bdev (id $id, pid $pid) on $dev"
    cleanup() { "$Z" delete "$id" >/dev/null 2>&1 || true; }
    trap cleanup EXIT

    vm_step "work: sequential, random with fsync, reads"
    dd if=/dev/urandom of="$bdev" bs=1M count=32 oflag=direct status=none
    fio --name=w --filename="$bdev" --ioengine=psync --direct=1 --rw=randwrite --bs=4k \
        --offset=64M --size=64M --io_size=8M --fsync=8 --eta=never --output=/dev/null
    fio --name=r --filename="$bdev" --ioengine=libaio --direct=1 --rw=randread --bs=4k \
        --iodepth=16 --size=96M --io_size=16M --eta=never --output=/dev/null

    status() { "$Z" status "$id" --json; }
    # Reclaim idles 10 s after the last I/O and then frees the buffer zones; the commit timer
    # fires once after the last change. Wait until both are done (polling the daemon's status
    # over its socket: that wakes its control thread, so the window starts only afterwards).
    # Settled: no buffer zone and both conventional data zones free, so nothing is reclaimable.
    vm_step "wait until reclaim is idle and the metadata committed ($layout)"
    # The log layout: its background thread asleep (no timer) with no page left to look at.
    local settled='.engine | .reclaim_state == "idle" and (.metadata_dirty | not) and .zones_buffer == 0 and .zones_free_conventional == 2'
    [ "$layout" = log ] && settled='.engine | .background == "asleep" and .compact_marked_pages == 0'
    for ((i = 0; ; i++)); do
        s=$(status)
        if jq -e "$settled" <<<"$s" >/dev/null; then
            break
        fi
        ((i < 120)) || vm_fail "daemon never settled: $(jq -c .engine <<<"$s")"
        sleep 1
    done
    echo "settled after ~${i} s: $(jq -c '.engine | {reclaim_zones, commits, zones_free, zones_buffer, compact_pages, background_wakeups}' <<<"$s")"

    ctxsw() { # tid comm switches, one line per thread of the daemon
        local t
        for t in /proc/"$pid"/task/*; do
            printf '%s %s %s\n' "${t##*/}" "$(cat "$t/comm")" \
                "$(awk '/ctxt_switches/ {n += $2} END {print n}' "$t/status")"
        done
}
ctxsw >"$VM_SCRATCH/idle.0"
vm_step "measure context switches over ${window} s ($layout)"
sleep "$window"
ctxsw >"$VM_SCRATCH/idle.1"

fail=0
echo "thread deltas over ${window} s (tid comm switches):"
while read -r tid comm n1; do
    n0=$(awk -v t="$tid" '$1 == t {print $3}' "$VM_SCRATCH/idle.0")
    d=$((n1 - ${n0:-0}))
    echo "  $tid $comm $d"
    case $comm in
    iou-wrk-*)
        echo "FAIL: io_uring worker thread $tid exists"
        fail=1
        ;;
    *)
        if ((d != 0)); then
            echo "FAIL: $comm ($tid) woke $d times while idle and clean"
            fail=1
        fi
        ;;
    esac
done <"$VM_SCRATCH/idle.1"
((fail == 0)) || vm_fail "the idle daemon is not quiet ($layout layout on $kind)"
[ "$layout" = log ] || jq -e '.engine.metadata_dirty | not' <<<"$(status)" >/dev/null ||
    vm_fail "metadata dirty again"
"$Z" delete "$id" >/dev/null
trap - EXIT
if [ "$kind" = image ]; then rm -f "$dev"; else remove_nullb "$dev"; fi
}

quiet dm-zoned
quiet log
quiet dm-zoned image
echo "idle-quiet: ok"
