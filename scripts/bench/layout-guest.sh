#!/usr/bin/env bash
# The two layouts side by side on one null_blk zoned device (1.5 GiB, ZONEDD_VM_LAYOUT_ZONE_MB
# zones, default 16, conventional zones making ZONEDD_VM_LAYOUT_CONV_MB, default 128 MiB),
# each on a freshly formatted volume,
# in one boot: sustained 4 KiB random
# writes at QD16 over a 1 GiB span that was first written sequentially (so that the log
# layout's GC and the v2 layout's reclaim both run), then 4 KiB random reads of that span
# and a sequential 1 MiB read of it, again once the engine has settled; the raw device's sequential-zone write rate for the
# issue's ratio. One line per job, the engine counters, fio JSON in $OUT (default
# $VM_SCRATCH). Run it as a scenario:
#   scripts/vm-test.sh scripts/bench/layout-guest.sh
#   (ZONEDD_VM_LAYOUT_SECS=N for the random-write job, default 60, or ZONEDD_VM_LAYOUT_WRITES=N
#   for N writes whatever they take, so that builds of different speed leave the same
#   amount of scattered data for the reads; ZONEDD_VM_LAYOUT_ROUNDS,
#   default 1; ZONEDD_VM_LAYOUT_LIST, default "log dm-zoned": the volumes of each round, where
#   log:N is the log layout with N user frontiers, `format --user-frontiers N`; a trailing
#   /pool serves the volume with ZONEDD_HOP_FREE_WRITES=0, every write through the pool, and
#   /ring with ZONEDD_HOP_FREE_WRITES=1 (hop-free writes on: the default on both layouts now),
#   /poolreads with ZONEDD_HOP_FREE_READS=0, every read through the pool, and /base with
#   the zonedd binary ZONEDD_VM_LAYOUT_BASE (a path the guest sees, e.g. another checkout's
#   target/release/zonedd) instead of this one: a build against another in one boot, and
#   /unbound served with `create --pool unbound --max-active 32` instead of the default pool;
#   `floor` is the ublk floor, `create --backend mem:1536M` (each request copied to memory on
#   its queue thread, no device, no engine): what any ublk server gets in this boot;
#   ZONEDD_VM_LAYOUT_DEVICE=hdd puts them on the hdd timing model instead of null_blk;
#   ZONEDD_VM_LAYOUT_SETTLE_CAP, default 600 s: after the reads, wait until the engine's
#   GC / reclaim / compaction counters stop changing for 15 s, at most that long, and read
#   the span sequentially again; 0 skips it)
# vm-timeout: 2400
# vm-memory: 4G
set -euo pipefail
source "$(dirname "$0")/../../tests/vm/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
secs=${ZONEDD_VM_LAYOUT_SECS:-60}
writes=${ZONEDD_VM_LAYOUT_WRITES:-}
rounds=${ZONEDD_VM_LAYOUT_ROUNDS:-1}
list=${ZONEDD_VM_LAYOUT_LIST:-log dm-zoned}
out=${OUT:-$VM_SCRATCH}
mkdir -p "$out"
zmb=${ZONEDD_VM_LAYOUT_ZONE_MB:-16}
settle_cap=${ZONEDD_VM_LAYOUT_SETTLE_CAP:-600}
conv_mb=${ZONEDD_VM_LAYOUT_CONV_MB:-128}
# ZONEDD_VM_LAYOUT_DEVICE=hdd: an emulated SMR image served by `zonedd expose --timing hdd`
# (docs/hdd-model.md) instead of the memory null_blk.
device=${ZONEDD_VM_LAYOUT_DEVICE:-nullb}
case $device in
nullb) nb=$(make_nullb nullb0 1536 "$zmb" $((conv_mb / zmb))) ;;
hdd)
    img=$VM_SCRATCH/layout-hdd.img
    "$Z" emulate "$img" --size 1536M --zone-size "${zmb}M" --conventional $((conv_mb / zmb)) >/dev/null
    res=$("$Z" expose "$img" --timing hdd)
    nb=$(sed -n 1p <<<"$res")
    nb_id=$(sed -n 's/^id //p' <<<"$res")
    ;;
*) echo "ZONEDD_VM_LAYOUT_DEVICE: nullb or hdd, not $device" >&2; exit 2 ;;
esac
echo "layout: device $device ($nb)"

line() { # line FIO-JSON RW: IOPS, MB/s, p50, p99, max (us)
    python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))["jobs"][0][sys.argv[2]]
c = d["clat_ns"]
print("%.0f IOPS, %.1f MB/s, p50 %.0f us, p99 %.0f us, max %.0f us" % (d["iops"], d["bw_bytes"] / 1e6,
      c["percentile"]["50.000000"] / 1e3, c["percentile"]["99.000000"] / 1e3, c["max"] / 1e3))' "$1" "$2"
}

gc_copied() { # gc_copied ID: blocks the engine has copied so far (GC, reclaim, compaction)
    "$Z" status "$1" --json | python3 -c 'import json,sys
e = json.load(sys.stdin).get("engine") or {}
print(sum(e.get(k, 0) for k in ["gc_blocks_copied", "reclaim_blocks_copied", "compact_blocks"]))'
}

run() { # run NAME LAYOUT[:USER_FRONTIERS][/pool|/ring|/poolreads|/base|/unbound]
    local name=$1 v=${2%/*} layout res bdev id f how=() env=() Z=$Z pool=()
    layout=${v%%:*}
    [ "$layout" = "$v" ] || how=(--user-frontiers "${v#*:}")
    case $2 in
    */pool) env=(ZONEDD_HOP_FREE_WRITES=0) ;;
    */ring) env=(ZONEDD_HOP_FREE_WRITES=1) ;;
    */poolreads) env=(ZONEDD_HOP_FREE_READS=0) ;;
    */unbound) pool=(--pool unbound --max-active 32) ;;
    */base)
        Z=${ZONEDD_VM_LAYOUT_BASE:?ZONEDD_VM_LAYOUT_BASE: the other build, for /base}
        [ -x "$Z" ] || vm_fail "ZONEDD_VM_LAYOUT_BASE: $Z is not an executable"
        ;;
    esac
    local backend=$nb
    if [ "$layout" = floor ]; then
        backend=mem:1536M
    else
        "$Z" format --backend "$nb" --force --layout "$layout" "${how[@]}" >/dev/null
    fi
    res=$(env "${env[@]}" "$Z" create --backend "$backend" --queues 2 --depth 64 "${pool[@]}")
    bdev=$(sed -n 1p <<<"$res")
    id=$(sed -n 's/^id //p' <<<"$res")
    fio --name=fill --filename="$bdev" --direct=1 --rw=write --bs=1M --iodepth=8 \
        --ioengine=libaio --size=1024M --eta=never --output=/dev/null
    f=$out/$name-randwrite.json
    local how_long=(--runtime="$secs" --time_based) what="${secs} s"
    if [ -n "$writes" ]; then
        how_long=(--number_ios="$writes") what="$writes writes"
    fi
    fio --name="$name" --filename="$bdev" --direct=1 --rw=randwrite --bs=4k --iodepth=16 \
        --ioengine=libaio --size=1024M "${how_long[@]}" --randseed=3 \
        --eta=never --output-format=json --output="$f" >/dev/null
    echo "layout: $name randwrite QD16 ($what): $(line "$f" write)"
    local gc0
    gc0=$(gc_copied "$id")
    f=$out/$name-randread.json
    fio --name="$name" --filename="$bdev" --direct=1 --rw=randread --bs=4k --iodepth=16 \
        --ioengine=libaio --size=1024M --runtime=10 --time_based --randseed=4 \
        --eta=never --output-format=json --output="$f" >/dev/null
    echo "layout: $name randread QD16: $(line "$f" read)"
    f=$out/$name-seqread.json
    # At most 30 s (the whole span on null_blk takes 4-5 s; on the hdd model randomly
    # written data reads a seek at a time).
    fio --name="$name" --filename="$bdev" --direct=1 --rw=read --bs=1M --iodepth=8 \
        --ioengine=libaio --size=1024M --runtime=30 --eta=never --output-format=json \
        --output="$f" >/dev/null
    echo "layout: $name seqread 1M: $(line "$f" read)"
    echo "layout: $name blocks copied by GC / reclaim / compaction during the reads: $(($(gc_copied "$id") - gc0))"
    if [ "$settle_cap" -gt 0 ] && [ "$layout" != floor ]; then
        # Until GC / reclaim and the log layout's idle compaction are done: the engine's
        # counters unchanged for 15 s (more than either layout's idle period), at most
        # settle_cap seconds; then the same sequential read again.
        local t0=$SECONDS fp last="" since=$SECONDS
        while ((SECONDS - t0 < settle_cap)); do
            fp=$("$Z" status "$id" --json | python3 -c 'import json,sys
e = json.load(sys.stdin)["engine"]
print([e.get(k) for k in ["zones_free", "gc_zones_freed", "gc_blocks_copied", "compact_pages",
       "compact_blocks", "background", "reclaim_zones", "reclaim_blocks_copied", "reclaim_state"]])')
            [ "$fp" = "$last" ] || { last=$fp; since=$SECONDS; }
            ((SECONDS - since >= 15)) && break
            sleep 1
        done
        echo "layout: $name settled in $((since - t0)) s (cap ${settle_cap} s): $fp"
        f=$out/$name-seqread-settled.json
        fio --name="$name" --filename="$bdev" --direct=1 --rw=read --bs=1M --iodepth=8 \
            --ioengine=libaio --size=1024M --runtime=30 --eta=never --output-format=json \
            --output="$f" >/dev/null
        echo "layout: $name seqread 1M after settling: $(line "$f" read)"
    fi
    "$Z" status "$id" --json >"$out/$name-status.json"
    [ "$layout" = floor ] || python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
e = d["engine"]
e["hop_free_writes"] = d["frontend"]["hop_free_writes"]
e["writes"] = d["frontend"]["writes"]
for k in ["hop_free_handoffs", "hop_free_reads", "pool_reads", "ring_again"]:
    e[k] = d["frontend"].get(k, 0)
keys = ["write_amplification", "gc_blocks_copied", "gc_zones_freed", "gc_paced_batches",
        "compact_pages", "compact_blocks", "compact_skipped_pages", "background_wakeups",
        "gc_forced_victims", "reclaim_blocks_copied", "reclaim_zones", "log_blocks_written",
        "index_resident_bytes", "hop_free_writes", "hop_free_handoffs", "writes",
        "hop_free_reads", "pool_reads", "planned_writes", "planned_groups", "ring_again"]
print("layout: %s: " % sys.argv[2] + ", ".join("%s %s" % (k, e[k]) for k in keys if k in e))' \
        "$out/$name-status.json" "$name"
    "$Z" delete "$id" >/dev/null
}

for ((round = 1; round <= rounds; round++)); do
    for v in $list; do
        n=${v/:/}
        run "${n/\//-}-$round" "$v"
    done
done
# The raw device: 4 KiB writes at QD16 into its sequential zones (the issue's baseline).
blkzone reset "$nb"
fio --name=raw --filename="$nb" --direct=1 --rw=write --bs=4k --iodepth=16 --ioengine=libaio \
    --zonemode=zbd --offset=512M --size=1024M --runtime=20 --time_based --eta=never \
    --output-format=json --output="$out/raw-seqwrite4k.json" >/dev/null
echo "layout: raw sequential-zone 4 KiB writes QD16: $(line "$out/raw-seqwrite4k.json" write)"
case $device in
nullb) remove_nullb "$nb" ;;
hdd) "$Z" delete "$nb_id" >/dev/null && rm -f "$img" ;;
esac
echo "layout: done"
