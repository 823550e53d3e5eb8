#!/usr/bin/env bash
# dmzadm (dm-zoned-tools) against zonedd on a multi-device volume: cache = a regular memory
# null_blk (136 MiB: 8 x 16 MiB and an offline 8 MiB runt), two drives = zoned null_blks
# without conventional zones (16 x 16 MiB each; the volume's zones 9-24 and 25-40).
#   1. `dmzadm --format CACHE ZONED1 ZONED2`; `zonedd check` opens it; the kernel's dm-zoned writes
#      generated data (a 32 MiB stream, unaligned first writes, an overwrite); `dmsetup remove`;
#      `zonedd check` clean; `zonedd create --cache C --backend Z1 --backend Z2` reads every range back
#      identical through /dev/ublkbN; zonedd writes the start of every chunk left unmapped, which
#      needs more sequential zones than the first drive has: the second drive's zones in use
#      must grow, and everything reads back.
#   2. xfs on /dev/ublkbN: mkfs.xfs, files written, unmounted, `xfs_repair -n` clean,
#      `zonedd delete`; `dmzadm --check` clean on what zonedd committed; the kernel's dm-zoned
#      mounts it, every file compares, it writes one more, `xfs_repair -n` clean; back in zonedd
#      every file compares.
#   3. kill -9: writes acknowledged by O_DIRECT (no flush) to /dev/ublkbN, among them 4 KiB
#      random writes of which some must go hop-free (written by a queue thread on its own
#      ring to the O_DIRECT cache device), the daemon killed, `zonedd recover`, every
#      acknowledged write reads back (fio's verify: some of it hop-free, from the cache);
#      `zonedd check` and `dmzadm --check` clean.
# dmzadm comes from scripts/install-deps.sh (trixie's dm-zoned-tools on Debian 12). Without it
# the scenario prints a SKIP line and runs nothing: no silent pass.
# vm-timeout: 900
# vm-memory: 2G
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
t0=$SECONDS
K=1024
M=$((1024 * K))
C=$((16 * M)) # chunk = zone size
name=dmza
dm=/dev/mapper/$name
mnt=$VM_SCRATCH/mnt

step() { vm_step "[$((SECONDS - t0)) s] $*"; }

if ! command -v dmzadm >/dev/null; then
    echo "SKIP: dmzadm-multi: dmzadm is not installed (scripts/install-deps.sh installs dm-zoned-tools): NOTHING TESTED"
    exit 0
fi

cleanup() {
    umount "$mnt" 2>/dev/null || true
    dmsetup remove "$name" 2>/dev/null || true
    "$Z" delete --all --force >/dev/null 2>&1 || true
    [ -z "${zb:-}" ] || remove_nullb "$zb" 2>/dev/null || true
    [ -z "${zb2:-}" ] || remove_nullb "$zb2" 2>/dev/null || true
    [ -z "${cb:-}" ] || remove_nullb "$cb" 2>/dev/null || true
}
trap cleanup EXIT
modprobe dm-zoned
modprobe ublk_drv
modprobe xfs
mkdir -p "$mnt"

step "null_blk: two zoned 16 x 16 MiB (no conventional zones), regular 136 MiB (a runt zone at its end); dmzadm $(dmzadm --version)"
zb=$(make_nullb dmzaz $((16 * 16)) 16 0)
zb2=$(make_nullb dmzay $((16 * 16)) 16 0)
# 136 MiB: 8 cache zones of 16 MiB and an 8 MiB runt, as the cache partitions users have
# rarely end on a zone boundary (the runt is offline on both sides).
cb=$(make_nullb dmzac 136 0 0)
zone_sectors=$(cat "/sys/block/${zb#/dev/}/queue/chunk_sectors")
[ "$zone_sectors" = $((C / 512)) ] || vm_fail "zone size is $zone_sectors sectors"

to_script() {
    local op=$1 r off len seed flag
    shift
    for r in "$@"; do
        read -r off len seed flag <<<"$r"
        echo "$op --offset $off --len $len --pattern $seed ${flag:-}"
    done
}
raw_script() { # raw_script DEV WHAT OP RANGE...: one engine-io --raw process
    local dev=$1 what=$2
    shift 2
    to_script "$@" >"$VM_SCRATCH/raw.txt"
    "$Z" engine-io --raw "$dev" --script "$VM_SCRATCH/raw.txt" || vm_fail "$what"
}
field() { # field ID KEY -> value from `zonedd list --json`
    "$Z" list --json | jq -r --argjson id "$1" --arg k "$2" '[.[] | select(.id == $id)][0][$k] // "absent"'
}
wait_state() { # wait_state ID STATE
    local i
    for ((i = 0; i < 200; i++)); do
        [ "$(field "$1" state)" = "$2" ] && return 0
        sleep 0.1
    done
    vm_fail "device $1 did not become $2 (is $(field "$1" state))"
}
zd_create() { # sets bdev, id
    local out
    out=$("$Z" create --cache "$cb" --backend "$zb" --backend "$zb2" --queues 1 --depth 32)
    bdev=$(sed -n 1p <<<"$out")
    id=$(sed -n 's/^id //p' <<<"$out")
    [ -b "$bdev" ] || vm_fail "zonedd create printed '$out'"
}
zd_check() { "$Z" check --cache "$cb" "$zb" "$zb2" >"$VM_SCRATCH/check.out" || { cat "$VM_SCRATCH/check.out"; vm_fail "zonedd check: $1"; }; }
dmz_check() {
    dmzadm --check "$cb" "$zb" "$zb2" >"$VM_SCRATCH/dmzadm.out" 2>&1 || {
        cat "$VM_SCRATCH/dmzadm.out"
        vm_fail "dmzadm --check: $1"
    }
    grep -F "No error detected" "$VM_SCRATCH/dmzadm.out" >/dev/null || {
        cat "$VM_SCRATCH/dmzadm.out"
        vm_fail "dmzadm --check: $1: no 'No error detected'"
    }
    grep -F "No error" "$VM_SCRATCH/dmzadm.out"
}
dm_start() {
    dmsetup create "$name" --table "0 $((nr_chunks * zone_sectors)) zoned $cb $zb $zb2"
    [ "$(blockdev --getsz "$dm")" = $((nr_chunks * zone_sectors)) ] || vm_fail "dm-zoned's size differs"
}

# ---- 1. dmzadm formats, dm-zoned writes, zonedd reads --------------------------------------
step "dmzadm --format $cb $zb $zb2 --seq=4"
dmzadm --format "$cb" "$zb" "$zb2" --force --label=dmzadm --seq=4 | tail -n 4
nr_chunks=$("$Z" check --cache "$cb" "$zb" "$zb2" --json | jq -er .summary.nr_chunks) ||
    vm_fail "zonedd check refuses dmzadm's format"
echo "zonedd reads dmzadm's volume: $nr_chunks chunks"
[ $((nr_chunks * C)) -ge $((300 * M)) ] || vm_fail "$nr_chunks chunks: too small for xfs"
dm_writes=(
    "0 $((32 * M)) 1"                     # chunks 0-1 streamed
    "$((4 * C + 12 * K)) $((64 * K)) 2"   # unaligned first write
    "$((5 * C)) $((2 * M)) 3"             # aligned
    "$((5 * C + M)) $((128 * K)) 4"       # overwrite inside it
    "$((9 * C + 3 * M)) $((3 * M)) 5"     # unaligned, larger
    "$((30 * C)) $((4 * M)) 6"            # late chunks: room on both drives
    "$((31 * C + 8 * K)) $((8 * K)) 7"
)
dm_final=(
    "0 $((32 * M)) 1" "$((32 * M)) $M 0"
    "$((4 * C)) $((12 * K)) 0" "$((4 * C + 12 * K)) $((64 * K)) 2" "$((4 * C + 76 * K)) $((4 * K)) 0"
    "$((5 * C)) $M 3" "$((5 * C + M)) $((128 * K)) 4" "$((5 * C + M + 128 * K)) $((M - 128 * K)) 3"
    "$((9 * C)) $((3 * M)) 0" "$((9 * C + 3 * M)) $((3 * M)) 5"
    "$((30 * C)) $((4 * M)) 6" "$((31 * C)) $((8 * K)) 0" "$((31 * C + 8 * K)) $((8 * K)) 7"
    "$((nr_chunks * C - M)) $M 0"
)
step "dm-zoned on dmzadm's volume: ${#dm_writes[@]} writes, read back, remove"
dm_start
raw_script "$dm" "dm-zoned: write and read back" write "${dm_writes[@]}"
raw_script "$dm" "dm-zoned: read back" read "${dm_final[@]}"
sync
dmsetup remove "$name"
zd_check "on what dm-zoned wrote on dmzadm's volume"
step "zonedd create --cache $cb --backend $zb --backend $zb2: read back through /dev/ublkbN"
zd_create
raw_script "$bdev" "zonedd: dm-zoned's data read back through $bdev differs" read "${dm_final[@]}"
# zonedd writes the start of every chunk dm-zoned left empty there: each aligned first write
# takes a sequential zone, more than the first drive has, so the second drive must take some.
used() { blkzone report "$1" | grep -vcF '(em)' || true; } # zones not empty
used2=$(used "$zb2")
fresh=()
for ((c = 0; c < nr_chunks; c++)); do
    case " 0 1 2 4 5 9 30 31 " in *" $c "*) continue ;; esac
    fresh+=("$((c * C)) $((64 * K)) $((40 + c))")
done
step "zonedd writes ${#fresh[@]} fresh chunks (the second drive had $used2 zones in use)"
raw_script "$bdev" "zonedd: writing fresh chunks" write "${fresh[@]}"
raw_script "$bdev" "zonedd: fresh chunks read back" read "${fresh[@]}" "${dm_final[@]}"
now2=$(used "$zb2")
echo "second drive: $used2 -> $now2 zones in use; first drive: $(used "$zb")"
[ "$now2" -gt "$used2" ] || vm_fail "zonedd wrote ${#fresh[@]} chunks and none on the second drive"
t1=$SECONDS

# ---- 2. xfs on both sides --------------------------------------------------------------------
files() { # files DIR SEED MIB: a file of MIB MiB, a 1 MiB one and 64 small ones
    mkdir -p "$1/small"
    "$Z" engine-io pattern --pattern "$2" --offset 0 --len $(($3 * M)) >"$1/big"
    "$Z" engine-io pattern --pattern $(($2 + 1)) --offset 0 --len "$M" >"$1/one"
    "$Z" engine-io pattern --pattern $(($2 + 2)) --offset 0 --len $((64 * 12 * K)) |
        split -b $((12 * K)) - "$1/small/f"
}
sums() { (cd "$mnt" && find . -type f | sort | xargs sha256sum); }
step "xfs on $bdev: mkfs, files, umount, xfs_repair -n"
mkfs.xfs -q -f "$bdev"
mount "$bdev" "$mnt"
files "$mnt/zd" 11 12
sums >"$VM_SCRATCH/sums.zd"
umount "$mnt"
xfs_repair -n "$bdev" >"$VM_SCRATCH/repair.out" 2>&1 || { cat "$VM_SCRATCH/repair.out"; vm_fail "xfs_repair -n on zonedd"; }
"$Z" delete "$id" >/dev/null
zd_check "after xfs through zonedd"
step "dmzadm --check on what zonedd committed"
dmz_check "on zonedd's xfs volume"
step "dm-zoned mounts it: files compare, one more written, xfs_repair -n"
dm_start
mount "$dm" "$mnt"
step "dm-zoned: mounted"
sums | cmp - "$VM_SCRATCH/sums.zd" || vm_fail "dm-zoned: files differ from what zonedd wrote"
files "$mnt/dm" 21 4
sums >"$VM_SCRATCH/sums.all"
umount "$mnt"
step "dm-zoned: xfs_repair -n"
xfs_repair -n "$dm" >"$VM_SCRATCH/repair.out" 2>&1 || { cat "$VM_SCRATCH/repair.out"; vm_fail "xfs_repair -n on dm-zoned"; }
dmsetup remove "$name"
zd_check "after xfs through dm-zoned"
step "back in zonedd: every file compares"
zd_create
step "zonedd: mount"
mount "$bdev" "$mnt"
sums | cmp - "$VM_SCRATCH/sums.all" || vm_fail "zonedd: files differ from what dm-zoned left"
umount "$mnt"
t2=$SECONDS

# ---- 3. kill -9 ------------------------------------------------------------------------------
acked=(
    "$((2 * C)) $((8 * M)) 31"          # a stream at a chunk start
    "$((3 * C + 20 * K)) $((16 * K)) 32" # unaligned: a cache zone
    "$((2 * C + M)) $((64 * K)) 33"     # overwrite inside the stream
)
after_kill=(
    "$((2 * C)) $M 31" "$((2 * C + M)) $((64 * K)) 33" "$((2 * C + M + 64 * K)) $((7 * M - 64 * K)) 31"
    "$((3 * C + 20 * K)) $((16 * K)) 32"
)
step "kill -9: ${#acked[@]} O_DIRECT writes acknowledged, no flush, daemon killed, recover"
for r in "${acked[@]}"; do
    read -r off len seed <<<"$r"
    "$Z" engine-io pattern --pattern "$seed" --offset "$off" --len "$len" |
        dd of="$bdev" bs=1M iflag=fullblock oflag=direct,seek_bytes seek="$off" status=none
done
# 4 KiB random writes over chunks 6-7 (xfs's data, in sequential zones on the drives, or fresh):
# the overwrites below a write pointer go to cache buffer zones, and those that need nothing
# first are written by the queue thread on its own ring to the cache device (O_DIRECT), then
# acknowledged once their log record is written.
fio_hop() { # fio_hop NAME EXTRA...
    local n=$1 && shift
    fio --name=hopfree --filename="$bdev" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
        --iodepth=16 --offset=$((6 * C + 20 * K)) --size=$((2 * C - 40 * K)) --randseed=7 \
        --verify=crc32c --eta=never --output="$VM_SCRATCH/fio.$n" "$@" || {
        cat "$VM_SCRATCH/fio.$n"
        vm_fail "hop-free writes: fio $n failed"
    }
}
counters() { "$Z" status "$id" --json | jq -er '.frontend | "\(.hop_free_writes) \(.writes) \(.hop_free_write_retries) \(.hop_free_reads) \(.hop_free_retries)"'; }
fio_hop write --do_verify=0
read -r whop writes wretries _ _ <<<"$(counters)"
echo "writes hop-free (on the cache device, through the queue ring): $whop of $writes, retried $wretries"
[ "$whop" -gt 0 ] || vm_fail "no write went hop-free on the multi-device volume"
[ "$wretries" = 0 ] || vm_fail "$wretries hop-free writes failed and were retried"
kill -9 "$(field "$id" pid)"
wait_state "$id" quiesced
"$Z" recover "$id" >/dev/null
wait_state "$id" live
raw_script "$bdev" "an acknowledged write is lost after kill -9 and recover" read "${after_kill[@]}"
fio_hop verify --verify_only --verify_fatal=1
read -r _ _ _ rhop rretries <<<"$(counters)"
echo "reads hop-free after recover (cache zones): $rhop, retried $rretries"
[ "$rhop" -gt 0 ] || vm_fail "no read went hop-free on the multi-device volume"
[ "$rretries" = 0 ] || vm_fail "$rretries hop-free reads failed and were retried"
"$Z" delete "$id" >/dev/null
zd_check "after kill -9 and recover"
dmz_check "after kill -9 and recover"
t3=$SECONDS
echo "dmzadm-multi: ok (dmzadm format + dm-zoned -> zonedd $((t1 - t0)) s, xfs both ways $((t2 - t1)) s," \
    "kill -9 $((t3 - t2)) s, total $((t3 - t0)) s guest time)"
