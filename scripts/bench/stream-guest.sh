#!/usr/bin/env bash
# Where a sequential write lands, seen from the sequential read after it: each volume of
# ZONEDD_VM_STREAM_LIST (default "log log:1 dm-zoned"; log:N = the log layout with N user
# frontiers, `format --user-frontiers N`; a /nopipe suffix runs the daemon with
# ZONEDD_STREAM_PIPELINES=0, the baseline without stream pipelines) on a fresh image served by `zonedd expose --timing
# hdd` (the hdd model, docs/hdd-model.md; ZONEDD_VM_STREAM_DEVICE=nullb for a memory null_blk
# instead), then fio: 1 MiB sequential writes over ZONEDD_VM_STREAM_MB (default 512) at
# each queue depth of ZONEDD_VM_STREAM_QDS (default "8 1"), the daemon with
# ZONEDD_VM_STREAM_QUEUES queues (default 2), each followed by a 1 MiB QD8
# sequential read of the same span, and the drive's seeks during that read. One line per job.
# ZONEDD_VM_STREAM_SETTLE_CAP=S (default 0: off): then wait until the engine's GC and idle
# compaction counters stay unchanged for 15 s (at most S s) and read the span again: whether
# compaction puts a scattered stream back in order.
#   scripts/vm-test.sh scripts/bench/stream-guest.sh
# vm-timeout: 1800
# vm-memory: 4G
set -euo pipefail
source "$(dirname "$0")/../../tests/vm/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
list=${ZONEDD_VM_STREAM_LIST:-log log:1 dm-zoned}
qds=${ZONEDD_VM_STREAM_QDS:-8 1}
mb=${ZONEDD_VM_STREAM_MB:-512}
device=${ZONEDD_VM_STREAM_DEVICE:-hdd}
settle_cap=${ZONEDD_VM_STREAM_SETTLE_CAP:-0}
queues=${ZONEDD_VM_STREAM_QUEUES:-2}
out=${OUT:-$VM_SCRATCH}
mkdir -p "$out"

backing() { # backing: a fresh zoned device in $nb (and $nb_id for the hdd model)
    nb_id=""
    case $device in
    nullb) nb=$(make_nullb "snb$1" 1536 16 8) ;;
    hdd)
        img=$VM_SCRATCH/stream-$1.img
        rm -f "$img"
        "$Z" emulate "$img" --size 1536M --zone-size 16M --conventional 8 >/dev/null
        res=$("$Z" expose "$img" --timing hdd)
        nb=$(sed -n 1p <<<"$res")
        nb_id=$(sed -n 's/^id //p' <<<"$res")
        ;;
    *) echo "ZONEDD_VM_STREAM_DEVICE: nullb or hdd, not $device" >&2 && exit 2 ;;
    esac
}
drop_backing() { # drop_backing N
    if [ -n "$nb_id" ]; then
        "$Z" delete "$nb_id" >/dev/null
        rm -f "$img" # guest RAM
    else
        remove_nullb "snb$1"
    fi
}
seeks() { # seeks: the hdd model's seek count so far (0 on null_blk)
    [ -n "$nb_id" ] || { echo 0 && return; }
    "$Z" status "$nb_id" --json | jq -r '.timing.stats.seeks'
}
mbps() { jq -r ".jobs[0].$2.bw_bytes / 1e6 | floor" "$1"; }
read_span() { # read_span DEV JSON: a 1 MiB QD8 sequential read of the span; "MB/s seeks"
    local s0 s1
    s0=$(seeks)
    fio --name=r --filename="$1" --direct=1 --ioengine=libaio --rw=read --bs=1M \
        --iodepth=8 --size="${mb}M" --output-format=json --output="$2" >/dev/null
    s1=$(seeks)
    echo "$(mbps "$2" read) $((s1 - s0))"
}
settle() { # settle ID: until GC and compaction are still for 15 s, at most $settle_cap s
    local t0=$SECONDS since=$SECONDS fp last=""
    while ((SECONDS - t0 < settle_cap)); do
        fp=$("$Z" status "$1" --json | jq -c '.engine | [.gc_blocks_copied, .compact_pages,
            .compact_blocks, .reclaim_blocks_copied, .background]')
        [ "$fp" = "$last" ] || { last=$fp && since=$SECONDS; }
        ((SECONDS - since >= 15)) && break
        sleep 1
    done
    echo "$((since - t0)) s, $("$Z" status "$1" --json | jq -c '.engine | {compact_pages, compact_blocks}')"
}

n=0
for v in $list; do
    for qd in $qds; do
        n=$((n + 1))
        backing "$n"
        spec=${v%/nopipe} daemon_env=()
        [ "$spec" = "$v" ] || daemon_env=(ZONEDD_STREAM_PIPELINES=0)
        layout=${spec%%:*} how=()
        [ "$layout" = "$spec" ] || how=(--user-frontiers "${spec#*:}")
        "$Z" format --backend "$nb" --layout "$layout" "${how[@]}" >/dev/null
        res=$(env "${daemon_env[@]}" "$Z" create --backend "$nb" --queues "$queues" --depth 64)
        dev=$(sed -n 1p <<<"$res")
        id=$(sed -n 's/^id //p' <<<"$res")
        fio --name=w --filename="$dev" --direct=1 --ioengine=libaio --rw=write --bs=1M \
            --iodepth="$qd" --size="${mb}M" --output-format=json --output="$out/stream-$n-w.json" >/dev/null
        rk=$(read_span "$dev" "$out/stream-$n-r.json") # no /dev/fd in the guest: no <(...)
        r=${rk% *} k=${rk#* }
        "$Z" status "$id" --json >"$out/stream-$n-status.json"
        piped=$(jq -r '.engine.planned_pipelined // "-"' "$out/stream-$n-status.json")
        jq -c '{engine: (.engine // {} | {writes, planned_writes, planned_groups,
            planned_pipelined, turn_waits}), frontend: (.frontend // {} | with_entries(select(
            .key | test("write|again|handoff"))))}' "$out/stream-$n-status.json" | sed 's/^/stream:   /'
        echo "stream: $v, write QD$qd: write $(mbps "$out/stream-$n-w.json" write) MB/s, then read QD8 $r MB/s with $k seeks (plans pipelined: $piped)"
        if [ "$settle_cap" -gt 0 ]; then
            echo "stream: $v, write QD$qd: settled in $(settle "$id")"
            rk=$(read_span "$dev" "$out/stream-$n-r2.json")
            r=${rk% *} k=${rk#* }
            echo "stream: $v, write QD$qd: read again QD8 $r MB/s with $k seeks"
        fi
        "$Z" delete "$id" >/dev/null
        drop_backing "$n"
    done
done
echo "stream: done"
