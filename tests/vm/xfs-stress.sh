#!/usr/bin/env bash
# XFS stress with reclaim forced to run: a small null_blk zoned disk with few conventional zones
# (default 1 GiB of 16 MiB zones, 4 conventional: 2 metadata + 2 random zones for buffers), so
# buffer and conventional zones run out and reclaim must run while XFS is in use. Steps: format,
# create, mkfs.xfs, mount; write a known tree and record its checksums; run a seeded random file
# workload (tests/vm/stress/fsworkload.py: create/overwrite/append/truncate/rename/unlink/mkdir/
# rmdir/hardlink/symlink/fsync/read-back, self-checking against an in-memory model) for a fixed
# number of operations; assert `zonedd status --json` shows reclaimed zones; umount,
# `xfs_repair -n` clean; mount again and verify the known tree's checksums and the workload's
# manifest (read back from the device); umount, delete, `zonedd check` clean.
# Knobs (host environment): ZONEDD_VM_STRESS_OPS (default 1500), ZONEDD_VM_STRESS_SEED (default 1),
# ZONEDD_VM_STRESS_GEOMETRY="SIZE_MB ZONE_MB NR_CONV" (default "1024 16 4").
# vm-timeout: 600
# vm-memory: 4G
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
stress=$(cd "$(dirname "$0")/stress" && pwd -P)/fsworkload.py
py=/usr/bin/python3
ops=${ZONEDD_VM_STRESS_OPS:-1500}
seed=${ZONEDD_VM_STRESS_SEED:-1}
read -r size_mb zone_mb nr_conv <<<"${ZONEDD_VM_STRESS_GEOMETRY:-1024 16 4}"
modprobe ublk_drv
modprobe xfs
mnt=$VM_SCRATCH/mnt
mkdir -p "$mnt"
t0=$SECONDS
id=

# On failure: what the daemon said (its log is the first place to look).
dump_log() {
    local rc=$?
    [ "$rc" != 0 ] || return 0
    if [ -n "$id" ]; then
        echo "---- zonedd status $id ----" >&2
        "$Z" status "$id" >&2 || true
    fi
    if [ -n "$id" ] && [ -f "/run/zonedd/$id.log" ]; then
        echo "---- /run/zonedd/$id.log (last 80 lines) ----" >&2
        tail -n 80 "/run/zonedd/$id.log" >&2
    fi
    dmesg | tail -n 30 >&2
}
trap dump_log EXIT

stat_json() { "$Z" status "$id" --json; }
# engine_field JSON FIELD: one number from the status's "engine" section
engine_field() { "$py" -c 'import json,sys; print(json.loads(sys.argv[1])["engine"][sys.argv[2]])' "$1" "$2"; }

vm_step "null_blk ${size_mb} MiB, ${zone_mb} MiB zones, ${nr_conv} conventional"
nullb=$(make_nullb nullb0 "$size_mb" "$zone_mb" "$nr_conv")
"$Z" format --backend "$nullb" --force
out=$("$Z" create --backend "$nullb" --queues 2 --depth 64 --label xfs-stress) || {
    echo "$out"
    vm_fail "create failed"
}
bdev=$(sed -n 1p <<<"$out")
id=$(sed -n 's/^id //p' <<<"$out")
echo "$bdev (id $id), $(($(blockdev --getsize64 "$bdev") >> 20)) MiB"
mkfs.xfs -q -f "$bdev"
mount "$bdev" "$mnt"

vm_step "known tree"
mkdir -p "$mnt/known" "$mnt/stress"
RANDOM=$seed
for ((i = 0; i < 24; i++)); do
    mkdir -p "$mnt/known/k$((i % 4))"
    head -c $(((RANDOM % 512 + 1) * 4096 + RANDOM % 4096)) /dev/urandom >"$mnt/known/k$((i % 4))/f$i"
done
# sync with file names fsyncs each one and, unlike a plain sync, fails on a writeback error.
sync "$mnt"/known/k*/f* "$mnt"/known/k* "$mnt/known" || vm_fail "writing the known tree failed (writeback error)"
(cd "$mnt/known" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$VM_SCRATCH/known.sums"
echo "known tree: $(wc -l <"$VM_SCRATCH/known.sums") files, $(du -sm "$mnt/known" | cut -f1) MiB"

vm_step "workload: $ops operations, seed $seed"
t1=$SECONDS
"$py" "$stress" run "$mnt/stress" --seed "$seed" --ops "$ops" --manifest "$VM_SCRATCH/stress.json" ||
    vm_fail "workload failed (xfs or zonedd returned an error or wrong data)"
echo "workload: $((SECONDS - t1)) s of guest time"
sync

# Reclaim must have run: busy reclaim during the workload, or else the idle pass (10 s idle).
s=$(stat_json)
rz=$(engine_field "$s" reclaim_zones)
for ((i = 0; i < 60 && rz == 0; i++)); do
    sleep 1
    s=$(stat_json)
    rz=$(engine_field "$s" reclaim_zones)
done
echo "reclaim: zones=$rz blocks_copied=$(engine_field "$s" reclaim_blocks_copied)" \
    "free=$(engine_field "$s" zones_free) buffer=$(engine_field "$s" zones_buffer)" \
    "writes=$(engine_field "$s" writes) flushes=$(engine_field "$s" flushes)" \
    "write_amplification=$(engine_field "$s" write_amplification)"
[ "$rz" -gt 0 ] || vm_fail "reclaim never ran (engine.reclaim_zones = 0)"

vm_step "umount, xfs_repair -n, remount, verify"
umount "$mnt"
xfs_repair -n "$bdev" >"$VM_SCRATCH/repair.log" 2>&1 || {
    cat "$VM_SCRATCH/repair.log"
    vm_fail "xfs_repair -n found problems"
}
mount "$bdev" "$mnt"
(cd "$mnt/known" && sha256sum --quiet -c "$VM_SCRATCH/known.sums") || vm_fail "known tree checksums differ after remount"
"$py" "$stress" verify "$mnt/stress" --manifest "$VM_SCRATCH/stress.json" || vm_fail "workload manifest differs after remount"
umount "$mnt"

s=$(stat_json)
echo "final: reclaim_zones=$(engine_field "$s" reclaim_zones) reclaim_blocks_copied=$(engine_field "$s" reclaim_blocks_copied)"
"$Z" delete "$id"
[ ! -e "$bdev" ] || vm_fail "$bdev still exists after delete"
"$Z" check "$nullb" || vm_fail "zonedd check found errors after delete"
id=
remove_nullb "$nullb"
echo "xfs-stress: passed ($ops ops, seed $seed, reclaimed $rz zones, $((SECONDS - t0)) s)"
