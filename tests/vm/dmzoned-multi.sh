#!/usr/bin/env bash
# dm-zoned's multi-device volume (a regular cache device in front of a zoned drive), both ways
# with the kernel: cache = a regular memory null_blk of 136 MiB (8 x 16 MiB and an 8 MiB runt,
# which both sides keep offline), drive = a zoned null_blk without conventional zones
# (24 x 16 MiB: a drive that needs the cache).
#   1. Refusals on real devices: the zoned drive as --cache, the regular device as --backend.
#   2. `zonedd format --cache C --backend Z`; one `zonedd engine-io` session writes streams
#      (straight to the drive's sequential zones), unaligned first writes and an overwrite
#      (cache zones), reclaims (cache zones move to the drive), writes more into the cache.
#   3. The kernel's dm-zoned (`dmsetup create ... zoned C Z`) accepts it with the same
#      capacity and reads every range back identical; it writes new chunks and overwrites;
#      `dmsetup remove`.
#   4. `zonedd check --cache C Z` is clean on what the kernel committed, and zonedd reads
#      everything back identical.
#   `dmzadm --check` (dm-zoned-tools, from scripts/install-deps.sh) is clean after step 2, or a
#   SKIP line says it did not run. A volume *formatted* by dmzadm: tests/vm/dmzadm-multi.sh.
# Guest time measured: 309 s on a loaded host (boot excluded); 87 s at load 8 on 2026-12-01,
# dmzadm --check included (6 s).
# vm-timeout: 600
# vm-memory: 2G
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
t0=$SECONDS
K=1024
M=$((1024 * K))
C=$((16 * M)) # chunk = zone size
name=dmzm
dm=/dev/mapper/$name

step() { vm_step "[$((SECONDS - t0)) s] $*"; }

cleanup() {
    dmsetup remove "$name" 2>/dev/null || true
    [ -z "${zb:-}" ] || remove_nullb "$zb" 2>/dev/null || true
    [ -z "${cb:-}" ] || remove_nullb "$cb" 2>/dev/null || true
}
trap cleanup EXIT

step "null_blk: zoned 24 x 16 MiB (no conventional zones), regular 136 MiB (a runt zone at its end)"
zb=$(make_nullb dmzmz $((24 * 16)) 16 0)
cb=$(make_nullb dmzmc 136 0 0) # not zoned: the cache device; its last 8 MiB a runt zone
[ "$(zoned_model "$cb")" = none ] || vm_fail "$cb is not a regular device"
zone_sectors=$(cat "/sys/block/${zb#/dev/}/queue/chunk_sectors")
[ "$zone_sectors" = $((C / 512)) ] || vm_fail "zone size is $zone_sectors sectors"

step "refusals on real devices"
expect_error 2 "is a zoned device: --cache takes a regular" "$Z" format --cache "$zb" --backend "$cb"
truncate -s 128M "$VM_SCRATCH/cache.img"
expect_error 2 "is a regular device or file: --backend takes a zoned" \
    "$Z" format --cache "$VM_SCRATCH/cache.img" --backend "$cb"
rm -f "$VM_SCRATCH/cache.img"

step "zonedd format --cache $cb --backend $zb"
"$Z" format --cache "$cb" --backend "$zb" --label multi --reserved-seq 4
step "zonedd check"
# 33 zones (9 cache, the last the runt, + 24), one zone per metadata set, 4 reserved: 27
# chunks. The kernel counts cache zones as usable whatever their condition (dmz_init_zone),
# so the runt counts in the sizing although no chunk ever maps to it.
nr_chunks=$("$Z" check --cache "$cb" "$zb" --json | jq -er .summary.nr_chunks)
[ "$nr_chunks" = 27 ] || vm_fail "expected 33 - 2 metadata - 4 reserved = 27 chunks, check says $nr_chunks"
"$Z" report --cache "$cb" "$zb" | grep '^device'

# Ranges: OFFSET LEN SEED [--fua|--flush]; seed 0 = zeros.
zd_writes=(
    "0 $((4 * M)) 1"                        # chunk 0 from its start: the drive's sequential zone
    "$((C + 12 * K)) $((64 * K)) 2"         # chunk 1, unaligned first write: a cache zone
    "$((2 * C)) $((2 * M)) 3 --fua"         # chunk 2 streamed
    "$((2 * C + M)) $((128 * K)) 4 --flush" # overwrite inside chunk 2: its buffer (cache) zone
    "$((5 * C + 3 * M)) $M 5"               # chunk 5, unaligned: a cache zone
)
zd_late=("$((7 * C + 8 * K)) $((8 * K)) 6 --flush") # after reclaim: stays in a cache zone
after_zd=(
    "0 $((4 * M)) 1" "$((4 * M)) $M 0"
    "$C $((12 * K)) 0" "$((C + 12 * K)) $((64 * K)) 2" "$((C + 76 * K)) $((4 * K)) 0"
    "$((2 * C)) $M 3" "$((2 * C + M)) $((128 * K)) 4" "$((2 * C + M + 128 * K)) $((M - 128 * K)) 3"
    "$((2 * C + 2 * M)) $M 0"
    "$((5 * C + 3 * M)) $M 5" "$((7 * C)) $((8 * K)) 0" "$((7 * C + 8 * K)) $((8 * K)) 6"
    "$((nr_chunks * C - M)) $M 0"
)
dm_writes=(
    "$((3 * C)) $M 21"                    # a new chunk, aligned
    "$((C + 12 * K)) $((4 * K)) 22"       # over zonedd's cached range in chunk 1
    "$((9 * C + 4 * K)) $((4 * K)) 23"    # a new chunk, unaligned
    "$((2 * C + 512 * K)) $((64 * K)) 24" # inside chunk 2
)
final=(
    "0 $((4 * M)) 1" "$((4 * M)) $M 0"
    "$C $((12 * K)) 0" "$((C + 12 * K)) $((4 * K)) 22" "$((C + 16 * K)) $((60 * K)) 2"
    "$((C + 76 * K)) $((4 * K)) 0"
    "$((2 * C)) $((512 * K)) 3" "$((2 * C + 512 * K)) $((64 * K)) 24"
    "$((2 * C + 576 * K)) $((448 * K)) 3" "$((2 * C + M)) $((128 * K)) 4"
    "$((2 * C + M + 128 * K)) $((M - 128 * K)) 3" "$((2 * C + 2 * M)) $M 0"
    "$((3 * C)) $M 21" "$((3 * C + M)) $M 0"
    "$((5 * C + 3 * M)) $M 5" "$((7 * C)) $((8 * K)) 0" "$((7 * C + 8 * K)) $((8 * K)) 6"
    "$((9 * C)) $((4 * K)) 0" "$((9 * C + 4 * K)) $((4 * K)) 23" "$((9 * C + 8 * K)) $((4 * K)) 0"
    "$((nr_chunks * C - M)) $M 0"
)

to_script() {
    local op=$1 r off len seed flag
    shift
    for r in "$@"; do
        read -r off len seed flag <<<"$r"
        echo "$op --offset $off --len $len --pattern $seed ${flag:-}"
    done
}
zd() { "$Z" engine-io --cache "$cb" --backend "$zb" "$@"; }

step "zonedd engine-io: ${#zd_writes[@]} writes, reclaim, ${#zd_late[@]} more, read back"
{
    to_script write "${zd_writes[@]}"
    echo reclaim
    to_script write "${zd_late[@]}"
    to_script read "${after_zd[@]}"
} >"$VM_SCRATCH/zd-writes.txt"
zd --script "$VM_SCRATCH/zd-writes.txt"
"$Z" check --cache "$cb" "$zb" >/dev/null || vm_fail "zonedd check after zonedd's writes"
if command -v dmzadm >/dev/null; then
    step "dmzadm --check on zonedd's format and writes"
    dmzadm --check "$cb" "$zb" >"$VM_SCRATCH/dmzadm.out" 2>&1 || { cat "$VM_SCRATCH/dmzadm.out"; vm_fail "dmzadm --check"; }
    grep -F "No error detected" "$VM_SCRATCH/dmzadm.out" >/dev/null || { cat "$VM_SCRATCH/dmzadm.out"; vm_fail "dmzadm --check found errors"; }
    grep -F "No error" "$VM_SCRATCH/dmzadm.out"
else
    echo "SKIP: dmzoned-multi: dmzadm is not installed (scripts/install-deps.sh): dmzadm --check NOT RUN"
fi
t1=$SECONDS

step "dmsetup create: 0 $((nr_chunks * zone_sectors)) zoned $cb $zb"
modprobe dm-zoned
dmsetup create "$name" --table "0 $((nr_chunks * zone_sectors)) zoned $cb $zb"
dmsetup status "$name"
size=$(blockdev --getsz "$dm")
[ "$size" = $((nr_chunks * zone_sectors)) ] || vm_fail "dm-zoned exposes $size sectors"
step "read back through dm-zoned: ${#after_zd[@]} ranges"
to_script read "${after_zd[@]}" >"$VM_SCRATCH/dm-verify.txt"
"$Z" engine-io --raw "$dm" --script "$VM_SCRATCH/dm-verify.txt" || vm_fail "dm-zoned: a range differs"
step "dm-zoned writes: ${#dm_writes[@]}, read back"
read -r off len seed <<<"${dm_writes[0]}"
"$Z" engine-io pattern --pattern "$seed" --offset "$off" --len "$len" |
    dd of="$dm" bs=1M iflag=fullblock oflag=direct,seek_bytes seek="$off" status=none
{
    to_script write "${dm_writes[@]:1}"
    to_script read "${final[@]}"
} >"$VM_SCRATCH/dm-writes.txt"
"$Z" engine-io --raw "$dm" --script "$VM_SCRATCH/dm-writes.txt" || vm_fail "dm-zoned: write/read back"
sync
dmsetup remove "$name"
dmesg | grep -i 'dm-zoned\|dmz' | tail -n 8 || true
t2=$SECONDS

step "zonedd check and read back what the kernel committed"
"$Z" check --cache "$cb" "$zb" || vm_fail "zonedd check on what dm-zoned committed"
to_script read "${final[@]}" >"$VM_SCRATCH/zd-verify.txt"
zd --script "$VM_SCRATCH/zd-verify.txt" || vm_fail "zonedd: a range differs"
"$Z" check --cache "$cb" "$zb" >/dev/null || vm_fail "zonedd check after zonedd reopened it"
t3=$SECONDS
echo "dmzoned-multi: ok (zonedd $((t1 - t0)) s, dm-zoned $((t2 - t1)) s, zonedd again $((t3 - t2)) s," \
    "total $((t3 - t0)) s guest time)"
