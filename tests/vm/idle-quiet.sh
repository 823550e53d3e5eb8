#!/usr/bin/env bash
# An idle, clean daemon sleeps: after writes, fsyncs and reads on /dev/ublkbN (null_blk zoned
# backend, so the data path goes through io_uring), once reclaim is idle and the metadata is
# committed, none of zonedd's threads makes a context switch over a 60 s window (voluntary
# or not: a thread that never wakes cannot be preempted either, so a loaded host changes
# nothing), and no io_uring worker thread (`iou-wrk-*`) exists. The ublk queue threads wait
# on their ring without a timeout (frontend::queue), and the reads and writes they make on
# it are RWF_NOWAIT, never handed to an io-wq worker (docs/design.md, "Never on io-wq").
# Three daemons, each busy in turn, then measured together in one window: both layouts on
# null_blk (the log layout with its write groups) and the v2 layout on an emulated image (the
# default backend kind, served through the pool). On the log layout,
# once its background thread has compacted what it has marked (by default the pages reads
# found scattered) and sleeps (docs/design.md, "Log layout": it has no timer then).
# vm-timeout: 900
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv

window=${ZONEDD_IDLE_WINDOW:-60}

# Three daemons side by side, one per case: each is made busy in turn, then all settle, then one
# window measures all three at once (the cases used to take a window each, one after the
# other; a daemon's context switches are its own threads', whatever the others do).
names=() ids=() pids=() devs=() kinds=() layouts=()

start() { # start LAYOUT [image]: format, create, work; the daemon is then left to settle
    local layout=$1 kind=${2:-null_blk} n=${#ids[@]} dev out bdev id pid
    # The log layout keeps five frontiers and three zones out of the capacity: smaller zones,
    # so that the 128 MiB the work below covers fits.
    if [ "$kind" = image ]; then
        # The daemon's default backend kind: a buffered file, served through the pool (its
        # reads and writes would go to io_uring worker threads on the rings).
        dev=$VM_SCRATCH/idle$n.img
        "$Z" emulate "$dev" --size 512M --zone-size 32M --conventional 4 --force >/dev/null
    elif [ "$layout" = log ]; then
        dev=$(make_nullb "nullb$n" 512 16 8)
    else
        dev=$(make_nullb "nullb$n" 512 32 4)
    fi
    "$Z" format --backend "$dev" --force --layout "$layout" >/dev/null
    out=$("$Z" create --backend "$dev" --queues 2 --depth 32)
    bdev=$(sed -n 1p <<<"$out")
    id=$(sed -n 's/^id //p' <<<"$out")
    pid=$("$Z" list --json | python3 -c "import json,sys; print([d for d in json.load(sys.stdin) if d['id']==$id][0]['pid'])")
    names+=("$layout layout on $kind") ids+=("$id") pids+=("$pid") devs+=("$dev")
    kinds+=("$kind") layouts+=("$layout")
    echo "created $bdev (id $id, pid $pid) on $dev: ${names[-1]}"
    vm_step "work: sequential, random with fsync, reads (${names[-1]})"
    dd if=/dev/urandom of="$bdev" bs=1M count=32 oflag=direct status=none
    fio --name=w --filename="$bdev" --ioengine=psync --direct=1 --rw=randwrite --bs=4k \
        --offset=64M --size=64M --io_size=8M --fsync=8 --eta=never --output=/dev/null
    fio --name=r --filename="$bdev" --ioengine=libaio --direct=1 --rw=randread --bs=4k \
        --iodepth=16 --size=96M --io_size=16M --eta=never --output=/dev/null
}
cleanup() {
    local id
    for id in "${ids[@]}"; do "$Z" delete "$id" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

# Reclaim idles 10 s after the last I/O and then frees the buffer zones; the commit timer
# fires once after the last change. Wait until both are done (polling the daemon's status
# over its socket: that wakes its control thread, so the window starts only afterwards).
# Settled: no buffer zone and both conventional data zones free, so nothing is reclaimable.
# The log layout: its background thread asleep (no timer) with no page left to look at.
settle() { # settle N
    local n=$1 s i settled='.engine | .reclaim_state == "idle" and (.metadata_dirty | not) and .zones_buffer == 0 and .zones_free_conventional == 2'
    [ "${layouts[$n]}" = log ] && settled='.engine | .background == "asleep" and .compact_marked_pages == 0'
    vm_step "wait until reclaim is idle and the metadata committed (${names[$n]})"
    for ((i = 0; ; i++)); do
        s=$("$Z" status "${ids[$n]}" --json)
        if jq -e "$settled" <<<"$s" >/dev/null; then
            break
        fi
        ((i < 120)) || vm_fail "daemon never settled (${names[$n]}): $(jq -c .engine <<<"$s")"
        sleep 1
    done
    echo "settled after ~${i} more s: $(jq -c '.engine | {reclaim_zones, commits, zones_free, zones_buffer, compact_pages, background_wakeups}' <<<"$s")"
}

ctxsw() { # pid tid comm switches, one line per thread of every daemon
    local p t
    for p in "${pids[@]}"; do
        for t in /proc/"$p"/task/*; do
            printf '%s %s %s %s\n' "$p" "${t##*/}" "$(cat "$t/comm")" \
                "$(awk '/ctxt_switches/ {n += $2} END {print n}' "$t/status")"
        done
    done
}

start dm-zoned
start log
start dm-zoned image
for n in "${!ids[@]}"; do settle "$n"; done

ctxsw >"$VM_SCRATCH/idle.0"
vm_step "measure context switches over ${window} s (all ${#ids[@]} daemons)"
sleep "$window"
ctxsw >"$VM_SCRATCH/idle.1"

failed=()
for n in "${!ids[@]}"; do
    fail=0
    echo "== ${names[$n]} (pid ${pids[$n]}): thread deltas over ${window} s (tid comm switches):"
    while read -r p tid comm n1; do
        [ "$p" = "${pids[$n]}" ] || continue
        n0=$(awk -v t="$tid" '$2 == t {print $4}' "$VM_SCRATCH/idle.0")
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
    if ! kill -0 "${pids[$n]}" 2>/dev/null; then
        echo "FAIL: the daemon exited during the window"
        fail=1
    elif [ "${layouts[$n]}" != log ] &&
        ! jq -e '.engine.metadata_dirty | not' <<<"$("$Z" status "${ids[$n]}" --json)" >/dev/null; then
        echo "FAIL: metadata dirty again"
        fail=1
    fi
    ((fail == 0)) || failed+=("${names[$n]}")
done
((${#failed[@]} == 0)) || vm_fail "the idle daemon is not quiet: $(printf '%s; ' "${failed[@]}")"
trap - EXIT
for n in "${!ids[@]}"; do
    "$Z" delete "${ids[$n]}" >/dev/null || vm_fail "delete ${ids[$n]} (${names[$n]}) failed"
done
for n in "${!ids[@]}"; do
    if [ "${kinds[$n]}" = image ]; then rm -f "${devs[$n]}"; else remove_nullb "${devs[$n]}"; fi
done
echo "idle-quiet: ok"
