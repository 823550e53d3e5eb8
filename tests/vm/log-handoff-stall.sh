#!/usr/bin/env bash
# The log layout's writes keep going under a deep queue: random 4 KiB writes at QD128 on one
# queue, after a 700 MiB fill of a 1 GiB null_blk (GC under pressure), for each pool policy in
# ZONEDD_VM_REPRO_POOLS (default "unbound:8 percpu"); fails when the daemon's write count stops
# for 60 s with fio's writes in flight, after printing where each daemon thread waits. Before
# the hand-off thread (docs/design.md, "Planned writes"), the writes stopped for good within
# seconds with both policies (build 19a949a, 2026-12-07; percpu: 5,348 writes, then none, the
# pool's workers in futex waits; unbound:8: fio reported no write done and could not be
# killed): the pool group's workers all waited for user-frontier turns held by planned writes
# whose hand-off jobs were queued behind them on the pool. ZONEDD_HOP_FREE_WRITES=0 did not
# stall (53,645 writes in 45 s); with the hand-off thread: 85,284 (percpu) and 91,538
# (unbound:8). ZONEDD_VM_REPRO_ENV="VAR=VALUE ..." is the daemons' environment;
# ZONEDD_VM_REPRO_LAYOUT=dm-zoned formats the v2 layout instead (it did not stall either).
#   scripts/vm-test.sh --no-build log-handoff-stall
# vm-timeout: 600
# vm-memory: 4G
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
for pool in ${ZONEDD_VM_REPRO_POOLS:-unbound:8 percpu}; do
    dev=$(make_nullb nullb0 1024 16 8)
    "$Z" format --backend "$dev" --force --layout "${ZONEDD_VM_REPRO_LAYOUT:-log}" >/dev/null
    # shellcheck disable=SC2086 # VAR=VALUE words for env
    out=$(env ${ZONEDD_VM_REPRO_ENV:-} "$Z" create --backend "$dev" --queues 1 --depth 128 --pool "$pool")
    bdev=$(sed -n 1p <<<"$out"); id=$(sed -n 's/^id //p' <<<"$out")
    echo "== $pool: $bdev"
    fio --name=fill --filename="$bdev" --direct=1 --rw=write --bs=1M --iodepth=8 --ioengine=libaio --size=700M --output=/dev/null
    fio --name=rw --filename="$bdev" --direct=1 --rw=randwrite --bs=4k --iodepth=128 \
        --ioengine=libaio --size=700M --runtime=60 --time_based --output=/dev/null &
    fpid=$!
    # The daemon's write count every 15 s: a stall is a count that stops moving while fio
    # still has writes in flight.
    pid=$("$Z" status "$id" --json | jq .pid)
    prev=-1 stalled=0
    for ((i = 0; i < 12; i++)); do
        sleep 15
        kill -0 "$fpid" 2>/dev/null || break
        s=$("$Z" status "$id" --json)
        n=$(jq .frontend.writes <<<"$s")
        echo "t=$(((i + 1) * 15)) s: writes $n $(jq -c '{h: .frontend.hop_free_handoffs, hf: .frontend.hop_free_writes, free: .engine.zones_free, forced: .engine.gc_forced_victims, copied: .engine.gc_blocks_copied}' <<<"$s")"
        if [ "$n" = "$prev" ]; then stalled=$((stalled + 1)); else stalled=0; fi
        prev=$n
        if ((stalled >= 4)); then
            echo "STALLED with $pool: no write completed in 60 s"
            for t in /proc/"$pid"/task/*; do
                echo "-- $(cat "$t/comm") $(cat "$t/wchan" 2>/dev/null)"
                head -n 6 "$t/stack" 2>/dev/null | sed 's/^/   /'
            done
            break
        fi
    done
    ((stalled < 4)) || vm_fail "the writes stopped with --pool $pool"
    wait "$fpid" || vm_fail "fio failed with --pool $pool"
    "$Z" delete "$id" >/dev/null; remove_nullb "$dev"
done
echo "log-handoff-stall: ok"
