#!/usr/bin/env bash
# Guest side of scripts/bench-vm.sh: the same fio/dbench/xfs workloads against
#   raw          the null_blk zoned device's sequential zones (fio --zonemode=zbd): the limit
#   dm           the kernel's dm-zoned on the zonedd-formatted device
#   zd-percpu    zonedd's /dev/ublkbN, --pool percpu
#   zd-log       the same on the log layout (`zonedd format --layout log`, issue 14); zd-logN
#                with N user frontiers (`--user-frontiers N`; zd-log: the default, 4);
#                zd-log-cw, zd-log-cn: with `create --compact writes` / `never` (zd-log:
#                the default, `reads`); zd-log-ring: writes hop-free (ZONEDD_HOP_FREE_WRITES=1);
#                zd-log-nopipe: without stream pipelines (ZONEDD_STREAM_PIPELINES=0)
#   zd-unbound8  zonedd's /dev/ublkbN, --pool unbound:8 (zd-unboundN: --pool unbound:N;
#                zd-percpu-nobatch, zd-unboundN-nobatch: with ZONEDD_BATCH_SYNC=0)
#   zd-*-base    any zd-* target served by the build given to bench-vm.sh --base BIN
#                (ZONEDD_BENCH_BASE in the guest), side by side with this one
#   btrfs        btrfs in zoned mode straight on the zoned device, no translation layer (issue
#                14's comparison; the xfs phase only, with btrfs in place of xfs)
# on a zoned device that is either a memory null_blk (--device nullb, the default: CPU per
# request) or an emulated SMR image served by `zonedd expose --timing hdd` (--device hdd: the HDD
# timing model of docs/hdd-model.md, parameters overridable with --hdd-params "K=V ..."),
# and writes the figures into OUT (on the host's tree, over 9p): results.tsv (TARGET METRIC
# VALUE UNIT per line), per target fio JSON, per-second bw/iops logs, status snapshots, logs.
#
#   guest.sh --out DIR [--quick] [--targets "raw dm zd-percpu zd-unbound8"]
#            [--device nullb|hdd] [--hdd-params "K=V ..."] [--phases "block fs"] [--runs N]
#            [--fill-pct P] [--settle-cap S] [--no-dbench] [--zones N] [--ow-s S]
#            [--stable-s S] [--zone-mb M] [--ow-mb N]
#
# --phases picks the block workloads (fio on the device) and/or the xfs ones; --runs repeats the
# xfs phase N times per target (the fill + overwrite + umount + settle figures of every run go to
# runs.tsv: TARGET RUN METRIC VALUE; results.tsv keeps run 1's).
#
# Every workload is time-boxed (fio --runtime, plus `timeout` around each command) and every
# target is torn down after its phase; a failing workload is recorded as `error`/`timeout` in
# results.tsv and the run goes on. Each phase starts from a fresh null_blk (zones empty, its
# memory freed). Runs as root in the VM (scripts/vm-test.sh's guest environment).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
# shellcheck source=tests/vm/lib/devices.sh
source "$ROOT/tests/vm/lib/devices.sh"

OUT="" QUICK=0 TARGETS="raw dm zd-percpu zd-unbound8" DEVICE=nullb HDD_PARAMS="" PHASES="block fs"
RUNS=1 FILL_OVERRIDE="" CAP_OVERRIDE="" DBENCH=1
ZONES_OVERRIDE="" OW_OVERRIDE="" STABLE_OVERRIDE="" ZONE_MB_OVERRIDE="" OW_MB=""
while [ $# -gt 0 ]; do
    case $1 in
    --out) OUT=$2 && shift ;;
    --quick) QUICK=1 ;;
    --targets) TARGETS=$2 && shift ;;
    --device) DEVICE=$2 && shift ;;
    --hdd-params) HDD_PARAMS=$2 && shift ;;
    --phases) PHASES=$2 && shift ;;
    --runs) RUNS=$2 && shift ;;
    --fill-pct) FILL_OVERRIDE=$2 && shift ;;
    --settle-cap) CAP_OVERRIDE=$2 && shift ;;
    --no-dbench) DBENCH=0 ;;
    --zones) ZONES_OVERRIDE=$2 && shift ;;
    --zone-mb) ZONE_MB_OVERRIDE=$2 && shift ;;
    --ow-s) OW_OVERRIDE=$2 && shift ;;
    --ow-mb) OW_MB=$2 && shift ;;
    --stable-s) STABLE_OVERRIDE=$2 && shift ;;
    *) echo "guest.sh: unknown argument $1" >&2 && exit 2 ;;
    esac
    shift
done
[ -n "$OUT" ] || {
    echo "guest.sh: --out DIR is required" >&2
    exit 2
}
case $DEVICE in nullb | hdd) ;; *) echo "guest.sh: --device nullb or hdd, not $DEVICE" >&2 && exit 2 ;; esac
case $RUNS in '' | *[!0-9]* | 0) echo "guest.sh: --runs takes a positive integer" >&2 && exit 2 ;; esac
mkdir -p "$OUT"
Z=$(zonedd_bin) || exit 1

# --- sizes -------------------------------------------------------------------------------------
ZONE_MB=64
CONV=6          # conventional zones: 2 hold metadata, the rest buffer random writes
if [ "$QUICK" = 1 ]; then
    ZONES=16 RESERVED=2 SPAN_MB=256 FSYNC_MB=64
    T_SEQ=5 T_RW=4 T_SHORT=2 T_FSYNC=2 DBENCH_S=3 DBENCH_CLIENTS=2 FILL_PCT=20 OW_S=2
    SETTLE_CAP=8 STABLE_S=3 IDLE_S=3
else
    ZONES=24 RESERVED=2 SPAN_MB=1024 FSYNC_MB=256
    T_SEQ=40 T_RW=45 T_SHORT=10 T_FSYNC=10 DBENCH_S=15 DBENCH_CLIENTS=4 FILL_PCT=70 OW_S=15
    SETTLE_CAP=150 STABLE_S=25 IDLE_S=30 # dm-zoned's reclaim waits for 10 s of idleness
fi
[ -z "$FILL_OVERRIDE" ] || FILL_PCT=$FILL_OVERRIDE
[ -z "$CAP_OVERRIDE" ] || SETTLE_CAP=$CAP_OVERRIDE
[ -z "$ZONES_OVERRIDE" ] || ZONES=$ZONES_OVERRIDE
[ -z "$ZONE_MB_OVERRIDE" ] || ZONE_MB=$ZONE_MB_OVERRIDE
[ -z "$OW_OVERRIDE" ] || OW_S=$OW_OVERRIDE
[ -z "$STABLE_OVERRIDE" ] || STABLE_S=$STABLE_OVERRIDE
ZONE_SECTORS=$((ZONE_MB * 2048))
SEQ_OFF=$((CONV * ZONE_MB << 20)) # raw: first sequential zone
MARGIN=90                          # extra seconds before `timeout` kills a workload

modprobe ublk_drv
modprobe dm-zoned
modprobe xfs
MNT=$VM_SCRATCH/bench-mnt
mkdir -p "$MNT"

{
    echo "kernel $(uname -r)"
    echo "quick $QUICK"
    echo "cpus $(nproc)"
    echo "mem_kb $(awk '/MemTotal/ { print $2 }' /proc/meminfo)"
    echo "zones $ZONES x ${ZONE_MB} MiB, $CONV conventional, $RESERVED reserved sequential"
    echo "device $DEVICE${HDD_PARAMS:+ ($HDD_PARAMS)}"
    echo "phases $PHASES, runs $RUNS, fill $FILL_PCT %"
    echo "span_mb $SPAN_MB"
    echo "runtimes seq=$T_SEQ randwrite=$T_RW short=$T_SHORT fsync=$T_FSYNC dbench=$DBENCH_S overwrite=$OW_S idle=$IDLE_S settle_cap=$SETTLE_CAP stable=$STABLE_S"
    echo "fio $(fio --version)"
    echo "zonedd $("$Z" --version 2>/dev/null || echo '?')"
} >"$OUT/meta.txt"
: >"$OUT/results.tsv"
: >"$OUT/runs.tsv"

log() { printf '[bench %6.1fs] %s\n' "$(cut -d' ' -f1 /proc/uptime)" "$*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# rec TARGET METRIC VALUE UNIT
rec() {
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$OUT/results.tsv"
    log "$1 $2 = $3 $4"
}

# --- devices -----------------------------------------------------------------------------------
# The zoned device every target sits on (NB): a fresh one per phase (zones empty, memory freed).
NB_SEQ=0
NB=""
NB_NAME=""  # nullb: the configfs name
NB_ID=""    # hdd: the id of the `zonedd expose` device
NB_PID=""   # hdd: its daemon's pid
NB_IMG=""   # hdd: its image (guest tmpfs)
fresh_backing() {
    drop_backing
    NB_SEQ=$((NB_SEQ + 1))
    case $DEVICE in
    nullb)
        NB_NAME=bnb$NB_SEQ
        NB=$(make_nullb "$NB_NAME" $((ZONES * ZONE_MB)) "$ZONE_MB" "$CONV") || {
            log "make_nullb failed"
            return 1
        }
        ;;
    hdd)
        local out kv args=()
        NB_IMG=$VM_SCRATCH/bench-hdd-$NB_SEQ.img
        "$Z" emulate "$NB_IMG" --size $((ZONES * ZONE_MB))M --zone-size "${ZONE_MB}M" \
            --conventional "$CONV" >/dev/null || {
            log "zonedd emulate failed"
            return 1
        }
        for kv in $HDD_PARAMS; do args+=(--timing-param "$kv"); done
        out=$(timeout 60 "$Z" expose "$NB_IMG" --timing hdd "${args[@]}" 2>&1) || {
            log "zonedd expose failed: $out"
            return 1
        }
        NB=$(sed -n 1p <<<"$out")
        NB_ID=$(sed -n 's/^id //p' <<<"$out")
        NB_PID=$("$Z" status "$NB_ID" --json | jq -er .pid) || NB_PID=""
        ;;
    esac
}
drop_backing() {
    if [ -n "$NB_NAME" ]; then
        remove_nullb "$NB_NAME" || log "warning: cannot remove $NB_NAME"
    fi
    if [ -n "$NB_ID" ]; then
        timeout 60 "$Z" delete "$NB_ID" >/dev/null || log "warning: cannot delete exposed device $NB_ID"
        rm -f "$NB_IMG"
    fi
    NB_NAME="" NB_ID="" NB_IMG="" NB_PID=""
}

zd_format() { # zd_format [TARGET]: zd-log[N] formats the log layout (issue 14), others dm-zoned v2
    local how=(--reserved-seq "$RESERVED")
    case ${1:-} in
    zd-log | zd-log-c[wn] | zd-log-ring | zd-log-nopipe) how=(--layout log) ;;
    zd-log[1-4]) how=(--layout log --user-frontiers "${1#zd-log}") ;;
    esac
    "$Z" format --backend "$NB" "${how[@]}" --force >"$OUT/format.log" 2>&1 || {
        cat "$OUT/format.log" >&2
        return 1
    }
}

DEV="" ZD_ID="" ZD_PID="" DM_NAME=bench-dmz
# target_up TARGET: fresh null_blk, formatted, target on top; sets DEV (and ZD_ID/ZD_PID).
target_up() {
    local t=$1 out nr
    DEV="" ZD_ID="" ZD_PID=""
    fresh_backing || return 1
    case $t in
    raw) DEV=$NB ;;
    btrfs) modprobe btrfs && DEV=$NB ;;
    dm)
        zd_format || return 1
        nr=$("$Z" check "$NB" --json | jq -er .summary.nr_chunks) || return 1
        dmsetup create "$DM_NAME" --table "0 $((nr * ZONE_SECTORS)) zoned $NB" || return 1
        DEV=/dev/mapper/$DM_NAME
        ;;
    zd-*)
        # zd-*-base: the same target served by another build (bench-vm.sh --base BIN).
        local zbin=$Z name=${t%-base}
        if [ "$name" != "$t" ]; then
            zbin=${ZONEDD_BENCH_BASE:-}
            [ -x "$zbin" ] || {
                log "$t: no base build (bench-vm.sh --base BIN)"
                return 1
            }
        fi
        local pool=percpu base=${name%-nobatch} batch=1
        case $base in zd-unbound*) pool=unbound:${base#zd-unbound} ;; esac
        # zd-*-nobatch: each write logs alone (ZONEDD_BATCH_SYNC=0), the A/B baseline.
        [ "$base" = "$name" ] || batch=0
        zd_format "$name" || return 1
        local extra=() envs=(ZONEDD_BATCH_SYNC=$batch)
        case $name in
        zd-log-ring) envs+=(ZONEDD_HOP_FREE_WRITES=1) ;;
        zd-log-nopipe) envs+=(ZONEDD_STREAM_PIPELINES=0) ;;
        zd-log-cw) extra=(--compact writes) ;;
        zd-log-cn) extra=(--compact never) ;;
        esac
        out=$(env "${envs[@]}" timeout 60 "$zbin" create --backend "$NB" --queues 2 --depth 64 --pool "$pool" --label "bench-$t" "${extra[@]}" 2>&1) || {
            echo "$out" >&2
            return 1
        }
        DEV=$(sed -n 1p <<<"$out")
        ZD_ID=$(sed -n 's/^id //p' <<<"$out")
        ZD_PID=$("$Z" status "$ZD_ID" --json | jq -er .pid) || ZD_PID=""
        ;;
    esac
    [ -b "$DEV" ] || {
        log "$t: $DEV is not a block device"
        return 1
    }
    log "$t: $DEV ($(($(blockdev --getsize64 "$DEV") >> 20)) MiB) on $NB"
}

target_down() {
    local t=$1
    mountpoint -q "$MNT" && { timeout 120 umount "$MNT" || log "$t: umount failed"; }
    case $t in
    dm) timeout 60 dmsetup remove "$DM_NAME" || log "$t: dmsetup remove failed" ;;
    zd-*)
        if [ -n "$ZD_ID" ]; then
            timeout 60 "$Z" delete "$ZD_ID" >/dev/null || {
                log "$t: zonedd delete $ZD_ID failed"
                return 1
            }
        fi
        ;;
    esac
    drop_backing
}

# Status snapshot of the target (for the record and for settle detection).
snapshot() { # snapshot TARGET FILE
    case $1 in
    dm) dmsetup status "$DM_NAME" >"$2" 2>&1 ;;
    zd-*) "$Z" status "$ZD_ID" --json >"$2" 2>&1 ;;
    *) : >"$2" ;;
    esac
    # On the hdd model, the drive's own counters too (seeks, media ops, cached writes,
    # flushes, busy time): where the disk time went.
    [ -z "$NB_ID" ] || "$Z" status "$NB_ID" --json >"${2%.status}.hdd.json" 2>&1 || true
}

# What changes while reclaim works: dm-zoned's free/total zone counts; zonedd's reclaim state,
# zone counts and reclaim counters.
fingerprint() {
    case $1 in
    dm) dmsetup status "$DM_NAME" 2>/dev/null | cut -d' ' -f4- ;;
    zd-log*) "$Z" status "$ZD_ID" --json 2>/dev/null |
        jq -c '.engine | [.zones_free, .gc_zones_freed, .gc_blocks_copied, .checkpoints, .compact_pages, .compact_blocks]' ;;
    zd-*) "$Z" status "$ZD_ID" --json 2>/dev/null |
        jq -c '.engine | [.reclaim_state, .zones_free, .zones_buffer, .zones_pending_free, .reclaim_zones, .reclaim_blocks_copied]' ;;
    esac
}

# rec_run TARGET RUN METRIC VALUE UNIT: every run into runs.tsv, run 1 also into results.tsv.
rec_run() {
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$OUT/runs.tsv"
    if [ "$2" = 1 ]; then rec "$1" "$3" "$4" "$5"; else log "$1 run $2: $3 = $4 $5"; fi
}

# --- fio ---------------------------------------------------------------------------------------
# fio_run TARGET JOB LIMIT_S FIO_ARGS...: JSON into OUT/TARGET/JOB.json; 0 on success. The host
# (report.py) reads the figures from the JSON: jq in the emulated guest costs seconds a run.
fio_run() {
    local t=$1 j=$2 limit=$3 rc
    shift 3
    local d=$OUT/$t t0
    mkdir -p "$d"
    log "$t: fio $j"
    t0=$(now)
    timeout -k 10 $((limit + MARGIN)) fio --name="$j" --output-format=json --output="$d/$j.json" \
        --filename="$DEV" --direct=1 --ioengine=libaio --group_reporting "$@" >"$d/$j.log" 2>&1
    rc=$?
    if [ $rc != 0 ]; then
        [ $rc = 124 ] || [ $rc = 137 ] && rec "$t" "$j" timeout "-" || rec "$t" "$j" "error(rc=$rc)" "-"
        tail -n 20 "$d/$j.log" >&2
        dmesg | tail -n 20 >"$d/$j.dmesg"
        return 1
    fi
    log "$t: fio $j done in $(elapsed "$t0") s"
}

# Where the span lives: raw writes go to sequential zones (zbd mode), the others from 0.
span_args() {
    if [ "$1" = raw ]; then
        echo "--zonemode=zbd --offset=$SEQ_OFF --size=${SPAN_MB}M"
    else
        echo "--offset=0 --size=${SPAN_MB}M"
    fi
}
fsync_args() { # a fresh region after the span
    if [ "$1" = raw ]; then
        echo "--zonemode=zbd --offset=$((SEQ_OFF + (SPAN_MB << 20))) --size=${FSYNC_MB}M"
    else
        echo "--offset=$((SPAN_MB << 20)) --size=${FSYNC_MB}M"
    fi
}
raw_reset() { [ "$1" != raw ] || blkzone reset "$NB" || log "blkzone reset failed"; }

block_phase() {
    local t=$1 sa fa
    # shellcheck disable=SC2207
    sa=($(span_args "$t"))
    # shellcheck disable=SC2207
    fa=($(fsync_args "$t"))
    log "== $t: block workloads"
    target_up "$t" || {
        rec "$t" block_phase "error(setup)" "-"
        target_down "$t"
        return 1
    }
    local size_mb=$(($(blockdev --getsize64 "$DEV") >> 20))
    [ "$t" = raw ] || [ "$size_mb" -ge $((SPAN_MB + FSYNC_MB)) ] ||
        log "$t: warning: $size_mb MiB is less than the span and the fsync region ($((SPAN_MB + FSYNC_MB)) MiB): more --zones"
    # 1. sequential write, 1 MiB blocks, the whole span (also the precondition for the rest),
    #    with the CPU time the translating daemon (zd-*) and the hdd model's `expose` daemon
    #    spent meanwhile (issue 15: the model must not cost the daemon more CPU per byte).
    local c0 e0
    c0=$(cpu_ticks "$ZD_PID") e0=$(cpu_ticks "$NB_PID")
    fio_run "$t" seqwrite "$T_SEQ" "${sa[@]}" --rw=write --bs=1M --iodepth=8 --runtime="$T_SEQ"
    [ -z "$c0" ] || rec "$t" seqwrite_cpu_s "$(cpu_seconds "$c0" "$(cpu_ticks "$ZD_PID")")" s
    [ -z "$e0" ] || rec "$t" seqwrite_expose_cpu_s "$(cpu_seconds "$e0" "$(cpu_ticks "$NB_PID")")" s
    # 1b. sequential read of what it wrote, 1 MiB blocks.
    fio_run "$t" seqread "$T_SEQ" "${sa[@]}" --rw=read --bs=1M --iodepth=8 --runtime="$T_SEQ"
    # 2. 4 KiB random reads over the written span.
    fio_run "$t" randread "$T_SHORT" "${sa[@]}" --rw=randread --bs=4k --iodepth=16 \
        --runtime="$T_SHORT" --time_based --randrepeat=0
    # 3. 4 KiB random writes sustained over the span (raw: zbd mode turns them into writes at
    #    random zones' write pointers), per-second throughput log.
    raw_reset "$t"
    fio_run "$t" randwrite "$T_RW" "${sa[@]}" --rw=randwrite --bs=4k --iodepth=16 \
        --runtime="$T_RW" --time_based --randrepeat=0 \
        --write_bw_log="$OUT/$t/randwrite" --write_iops_log="$OUT/$t/randwrite" \
        --log_avg_msec=1000
    snapshot "$t" "$OUT/$t/after-randwrite.status"
    # 4. 70/30 random read/write mix (not on raw: sequential zones take no overwrites).
    if [ "$t" != raw ]; then
        fio_run "$t" mix7030 "$T_SHORT" "${sa[@]}" --rw=randrw --rwmixread=70 --bs=4k \
            --iodepth=16 --runtime="$T_SHORT" --time_based --randrepeat=0
    fi
    # 5. 4 KiB sequential writes, fsync after each, into fresh chunks.
    fio_run "$t" fsync "$T_FSYNC" "${fa[@]}" --rw=write --bs=4k --iodepth=1 --fsync=1 \
        --runtime="$T_FSYNC" --time_based
    snapshot "$t" "$OUT/$t/after-block.status"
    target_down "$t"
}

# cpu_ticks PID: user + system clock ticks of the whole process (all its threads); nothing
# without a PID. cpu_seconds T0 T1: their difference in seconds.
cpu_ticks() {
    [ -n "$1" ] && [ -r "/proc/$1/stat" ] || return 0
    sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}
cpu_seconds() { awk -v a="$1" -v b="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", (b - a) / hz }'; }

# ctxsw PID: sum of voluntary + involuntary context switches over the process's threads.
ctxsw() {
    cat /proc/"$1"/task/*/status 2>/dev/null |
        awk '/^(voluntary|nonvoluntary)_ctxt_switches/ { s += $2 } END { print s + 0 }'
}
ctxsw_threads() {
    local s
    for s in /proc/"$1"/task/*/status; do
        awk '/^Name:/ { n = $2 } /^voluntary_ctxt/ { v = $2 } /^nonvoluntary_ctxt/ { w = $2 }
             END { print n, v, w }' "$s"
    done
}

# umount_sampler TARGET T0: every 10 s, seconds since T0 and what the target has done (zonedd:
# writes, reclaimed zones, blocks copied, free and buffer zones; dm-zoned: its status line).
umount_sampler() {
    while sleep 10; do
        case $1 in
        zd-log*) echo "$(elapsed "$2") $(fingerprint "$1")" ;;
        zd-*) echo "$(elapsed "$2") $("$Z" status "$ZD_ID" --json 2>/dev/null |
            jq -c '.engine | [.writes, .reclaim_zones, .reclaim_blocks_copied, .zones_free, .zones_buffer]')" ;;
        *) echo "$(elapsed "$2") $(fingerprint "$1")" ;;
        esac
    done
}

# settle TARGET: seconds until the target's reclaim fingerprint stopped changing (stable for
# STABLE_S), capped at SETTLE_CAP; the fingerprints go to OUT/TARGET/settle.log.
settle() {
    local t=$1 t0 fp prev="" first="" changed_at=0 e
    t0=$(now)
    while :; do
        e=$(elapsed "$t0")
        fp=$(fingerprint "$t")
        printf '%s %s\n' "$e" "$fp" >>"$OUT/$t/settle.log"
        # The first sample is the reference: only later changes count.
        if [ -z "$first" ]; then
            first=1
            prev=$fp
        elif [ "$fp" != "$prev" ]; then
            changed_at=$e
            prev=$fp
        fi
        if awk -v e="$e" -v c="$changed_at" -v s="$STABLE_S" 'BEGIN { exit !(e - c >= s) }'; then
            echo "$changed_at"
            return 0
        fi
        if awk -v e="$e" -v cap="$SETTLE_CAP" 'BEGIN { exit !(e >= cap) }'; then
            echo "$e"
            return 1
        fi
        sleep 1
    done
}

fs_phase() { # fs_phase TARGET RUN
    local t=$1 run=$2 t0 s out bytes fill_mb nfiles
    log "== $t: xfs workloads (run $run of $RUNS)"
    target_up "$t" || {
        rec "$t" fs_phase "error(setup)" "-"
        target_down "$t"
        return 1
    }
    mkdir -p "$OUT/$t"
    local fs=xfs
    [ "$t" = btrfs ] && fs=btrfs
    "mkfs.$fs" -q -f "$DEV" >/dev/null && mount -t "$fs" "$DEV" "$MNT" || {
        rec "$t" fs_phase "error(mkfs/mount)" "-"
        target_down "$t"
        return 1
    }
    if [ "$DBENCH" = 1 ]; then
        # dbench: fsync on every write (-F), fixed time.
        log "$t: dbench -F $DBENCH_CLIENTS clients, $DBENCH_S s"
        if out=$(timeout -k 10 $((DBENCH_S + MARGIN)) dbench -F -c /usr/share/dbench/client.txt \
            -D "$MNT" -t "$DBENCH_S" "$DBENCH_CLIENTS" 2>&1); then
            printf '%s\n' "$out" >"$OUT/$t/dbench.log"
            rec_run "$t" "$run" dbench_MBps "$(sed -n 's/^Throughput \([0-9.]*\) MB\/sec.*/\1/p' <<<"$out" | tail -n1)" MB/s
            rec_run "$t" "$run" dbench_maxlat_ms "$(awk '/^ *(Flush|WriteX) / { if ($4 > m) m = $4 } END { print m + 0 }' <<<"$out")" ms
        else
            printf '%s\n' "$out" >"$OUT/$t/dbench.log"
            rec_run "$t" "$run" dbench_MBps "error" "-"
        fi
    fi
    rm -rf "$MNT/clients"
    # write+fsync on a file: 4 KiB appends, fsync after each (the filesystem's journal or
    # log and the device's flush on every write).
    log "$t: 4 KiB writes + fsync to a file, $T_FSYNC s"
    if timeout -k 10 $((T_FSYNC + MARGIN)) fio --name=fsync --directory="$MNT" --filename=fsync.f \
        --size=256M --rw=write --bs=4k --iodepth=1 --fsync=1 --ioengine=psync \
        --runtime="$T_FSYNC" --time_based --output-format=json --output="$OUT/$t/fsync-file.json" \
        >"$OUT/$t/fsync-file.log" 2>&1; then
        rec_run "$t" "$run" file_fsync_iops "$(jq -r '.jobs[0].write.iops | round' "$OUT/$t/fsync-file.json")" IOPS
        rec_run "$t" "$run" file_fsync_p99_us "$(jq -r '.jobs[0].sync.lat_ns.percentile["99.000000"] // .jobs[0].write.clat_ns.percentile["99.000000"] | . / 1000 | round' "$OUT/$t/fsync-file.json")" us
    else
        rec_run "$t" "$run" file_fsync_iops error -
    fi
    rm -f "$MNT/fsync.f"
    sync
    # Fill to FILL_PCT % with 32 MiB files, then random 4 KiB overwrites inside them.
    bytes=$(blockdev --getsize64 "$DEV")
    fill_mb=$((bytes * FILL_PCT / 100 >> 20))
    nfiles=$((fill_mb / 32))
    [ "$nfiles" -ge 1 ] || nfiles=1
    local files=(--directory="$MNT" --nrfiles="$nfiles" --filesize=32M --filename_format='f.$filenum'
        --ioengine=psync --group_reporting --output-format=json)
    log "$t: fill $((nfiles * 32)) MiB ($FILL_PCT %)"
    t0=$(now)
    if timeout -k 10 $((T_SEQ * 6 + MARGIN)) fio --name=fill "${files[@]}" --output="$OUT/$t/fill.json" \
        --rw=write --bs=1M --end_fsync=1 >"$OUT/$t/fill.log" 2>&1; then
        rec_run "$t" "$run" fill_s "$(elapsed "$t0")" s
    else
        rec_run "$t" "$run" fill_s error -
    fi
    # Time-based by default; --ow-mb makes it a fixed amount, so that the writeback each
    # umount faces is the same whatever the page cache took in (comparisons between runs).
    local ow=(--runtime="$OW_S" --time_based)
    [ -z "$OW_MB" ] || ow=(--io_size="${OW_MB}M")
    log "$t: random 4 KiB overwrites, ${OW_MB:+$OW_MB MiB, at most }$OW_S s"
    t0=$(now)
    if timeout -k 10 $((OW_S + MARGIN)) fio --name=fill "${files[@]}" --output="$OUT/$t/overwrite.json" \
        --rw=randwrite --bs=4k "${ow[@]}" --randrepeat=0 >"$OUT/$t/overwrite.log" 2>&1; then
        rec_run "$t" "$run" overwrite_MBps "$(jq -r '.jobs[0].write.bw_bytes / 1e6 | . * 100 | round / 100' "$OUT/$t/overwrite.json")" MB/s
    else
        rec_run "$t" "$run" overwrite_MBps error -
    fi
    local sfx=""
    [ "$run" = 1 ] || sfx=.run$run
    snapshot "$t" "$OUT/$t/before-umount$sfx.status"
    log "$t: umount"
    t0=$(now)
    # Progress during the writeback, every 10 s (umount in D state shows nothing else).
    umount_sampler "$t" "$t0" >"$OUT/$t/umount$sfx.log" 2>&1 &
    local sampler=$!
    # umount in D state cannot be killed: `timeout` returns when it ends anyway, so a
    # timeout still gives the time, as a lower bound of what the writeback needed.
    if timeout 300 umount "$MNT"; then
        rec_run "$t" "$run" umount_s "$(elapsed "$t0")" s
    elif ! mountpoint -q "$MNT"; then
        rec_run "$t" "$run" umount_s ">$(elapsed "$t0")" s
    else
        rec_run "$t" "$run" umount_s timeout -
    fi
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    log "$t: waiting for reclaim to settle (stable ${STABLE_S} s, cap ${SETTLE_CAP} s)"
    : >"$OUT/$t/settle.log"
    if s=$(settle "$t"); then
        rec_run "$t" "$run" settle_s "$s" s
    else
        rec_run "$t" "$run" settle_s ">$s" s
    fi
    snapshot "$t" "$OUT/$t/settled$sfx.status"
    # Idle: context switches of the daemon's threads with nothing to do.
    if [ "$run" = 1 ] && [ -n "$ZD_PID" ] && [ -d "/proc/$ZD_PID" ]; then
        local a b
        ctxsw_threads "$ZD_PID" >"$OUT/$t/idle-before.txt"
        a=$(ctxsw "$ZD_PID")
        sleep "$IDLE_S"
        b=$(ctxsw "$ZD_PID")
        ctxsw_threads "$ZD_PID" >"$OUT/$t/idle-after.txt"
        rec_run "$t" "$run" idle_ctxsw "$((b - a))" "switches/${IDLE_S}s"
        rec_run "$t" "$run" idle_threads "$(ls /proc/"$ZD_PID"/task | wc -l)" threads
    fi
    target_down "$t"
}

t_all=$(now)
case " $PHASES " in *" block "*)
    for t in $TARGETS; do
        [ "$t" = btrfs ] || block_phase "$t"
    done
    ;;
esac
case " $PHASES " in *" fs "*)
    # Runs interleaved (each target once per round): a host whose load drifts spreads over all.
    for run in $(seq 1 "$RUNS"); do
        for t in $TARGETS; do
            [ "$t" = raw ] || fs_phase "$t" "$run"
        done
    done
    ;;
esac
rec all guest_wall_s "$(elapsed "$t_all")" s
log "done: $OUT/results.tsv"
