#!/usr/bin/env bash
# XFS on a zonedd device, for each kind of backend: a null_blk host-managed zoned disk, a
# scsi_debug zbc=host-managed disk (like a SATA/SAS SMR drive) and an emulated SMR image
# (plus the in-memory test target with ZONEDD_VM_XFS_MEM=1). For each: (format,) create, mkfs.xfs, mount, write a tree
# of files and overwrite random ranges in them, sync, umount, remount, every checksum
# matches (read back hop-free, on the queue threads' rings, where the backend allows it),
# `xfs_repair -n` is clean, delete. A backend the build cannot serve yet (no engine)
# is reported as SKIP, not as passed.
# vm-timeout: 900
# vm-memory: 4G
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
modprobe xfs
mnt=$VM_SCRATCH/mnt
mkdir -p "$mnt"
skipped=()

workload() { # workload DIR: a tree of files, then random overwrites inside them
    local dir=$1 i f size off len
    RANDOM=7
    for ((i = 0; i < 60; i++)); do
        mkdir -p "$dir/d$((i % 7))/e$((i % 3))"
        f=$dir/d$((i % 7))/e$((i % 3))/f$i
        size=$(((RANDOM % 64 + 1) * 4096 + RANDOM % 4096))
        head -c "$size" /dev/urandom >"$f"
    done
    for ((i = 0; i < 60; i++)); do
        f=$dir/d$((RANDOM % 7))/e$((RANDOM % 3))/f$(((RANDOM % 20) * 3))
        [ -f "$f" ] || continue
        size=$(stat -c %s "$f")
        off=$((RANDOM % size))
        len=$((RANDOM % 20000 + 1))
        head -c "$len" /dev/urandom |
            dd of="$f" bs=64k iflag=fullblock oflag=seek_bytes seek="$off" conv=notrunc status=none
    done
    # a larger file, overwritten in its middle with O_DIRECT
    head -c $((8 << 20)) /dev/urandom >"$dir/big"
    dd if=/dev/urandom of="$dir/big" bs=64k seek=37 count=20 oflag=direct conv=notrunc status=none
}

sums() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }

run_xfs() { # run_xfs NAME BACKEND [--format]
    local name=$1 backend=$2 fmt=${3:-} out bdev id t0=$SECONDS
    vm_step "$name: $backend"
    if [ -n "$fmt" ]; then
        if ! out=$("$Z" format --backend "$backend" --force 2>&1); then
            if grep -q "not implemented" <<<"$out"; then
                echo "SKIP: $name: $out"
                skipped+=("$name")
                return 0
            fi
            echo "$out"
            vm_fail "$name: zonedd format failed"
        fi
    fi
    if ! out=$("$Z" create --backend "$backend" --queues 2 --depth 64 --label "xfs-$name" 2>&1); then
        if grep -q "not available in this build" <<<"$out"; then
            echo "SKIP: $name: $out"
            skipped+=("$name")
            return 0
        fi
        echo "$out"
        vm_fail "$name: create failed"
    fi
    bdev=$(sed -n 1p <<<"$out")
    id=$(sed -n 's/^id //p' <<<"$out")
    echo "$name: $bdev (id $id), $(($(blockdev --getsize64 "$bdev") >> 20)) MiB"
    mkfs.xfs -q -f "$bdev"
    mount "$bdev" "$mnt"
    expect_error 2 "$bdev is mounted on $mnt: unmount it first (use --force to delete anyway)" \
        "$Z" delete "$id"
    workload "$mnt"
    sync
    sums "$mnt" >"$VM_SCRATCH/sums.$name"
    umount "$mnt"
    mount "$bdev" "$mnt"
    sums "$mnt" | cmp - "$VM_SCRATCH/sums.$name" || vm_fail "$name: checksums differ after remount"
    umount "$mnt"
    # Reads after the remount came from the device; where the backend has an O_DIRECT read
    # fd (the zoned block devices) the engine plans them and the queue threads read them on their own
    # rings (hop-free), and the checksums above were read that way.
    local hop pool retries whop writes wretries counts
    counts=$("$Z" status "$id" --json | python3 -c 'import json,sys
f = json.load(sys.stdin)["frontend"]
print(f["hop_free_reads"], f["pool_reads"], f["hop_free_retries"], f["hop_free_writes"],
      f["writes"], f["hop_free_write_retries"], f["linked_reads"])')
    read -r hop pool retries whop writes wretries linked <<<"$counts"
    echo "$name: reads hop-free $hop ($linked linked to their commit), through the pool $pool, hop-free retried $retries"
    # Writes made on the queue threads' rings are counted, not required: which of xfs's
    # writes the engine can plan depends on their timing against flushes and commits.
    echo "$name: writes hop-free $whop of $writes, hop-free retried $wretries"
    [ "$wretries" = 0 ] || vm_fail "$name: $wretries hop-free writes failed and were retried"
    case $name in
    mem) ;;
    emulated)
        # A buffered image file is served through the pool (its reads and writes would
        # run on io_uring worker threads: docs/design.md, "Never on io-wq").
        [ "$hop" = 0 ] && [ "$whop" = 0 ] || vm_fail "$name: the image's I/O went on the rings"
        ;;
    *)
        [ "$hop" -gt 0 ] || vm_fail "$name: no read went hop-free"
        [ "$linked" -gt 0 ] || vm_fail "$name: no hop-free read was linked to its commit"
        ;;
    esac
    [ "$retries" = 0 ] || vm_fail "$name: $retries hop-free reads failed and were retried"
    xfs_repair -n "$bdev" >"$VM_SCRATCH/repair.$name" 2>&1 || {
        cat "$VM_SCRATCH/repair.$name"
        vm_fail "$name: xfs_repair -n found problems"
    }
    "$Z" delete "$id"
    [ ! -e "$bdev" ] || vm_fail "$name: $bdev still exists after delete"
    echo "ok: $name ($(wc -l <"$VM_SCRATCH/sums.$name") files verified, $((SECONDS - t0)) s)"
}

[ -z "${ZONEDD_VM_XFS_MEM:-}" ] || run_xfs mem mem:512M

nullb=$(make_nullb nullb0 1024 16 8)
run_xfs null_blk "$nullb" --format
remove_nullb "$nullb"

sd=$(make_scsi_debug_smr 1024 16 8)
run_xfs scsi_debug "$sd" --format
remove_scsi_debug

img=$VM_SCRATCH/smr.img
if "$Z" emulate "$img" --size 1G --zone-size 16M --conventional 8 >/dev/null 2>"$VM_SCRATCH/emulate.err"; then
    run_xfs emulated "$img" --format
    rm -f "$img"
else
    echo "SKIP: emulated: zonedd emulate failed: $(cat "$VM_SCRATCH/emulate.err")"
    skipped+=(emulated)
fi

if [ ${#skipped[@]} -gt 0 ]; then
    echo "ublk-xfs: passed, SKIPPED: ${skipped[*]}"
else
    echo "ublk-xfs: all backends passed"
fi
