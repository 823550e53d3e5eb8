#!/usr/bin/env bash
# (Superseded as a regression test by tests/vm/dmzoned-interop.sh, which formats and writes
# the null_blk with zonedd itself; this script is kept because it made the vectors.)
# Cross-check that made the zonedd-*.bin vectors: the kernel's dm-zoned loads a volume formatted
# by zonedd (metadata copied from an emulated image onto a null_blk with the vector's geometry),
# serves writes and commits. Before: `zonedd emulate $OUT/zk.img --size 1536M --zone-size 64M
# --conventional 8 && zonedd format --backend $OUT/zk.img --label zk --reserved-seq 4`; run with
# `scripts/vm-test.sh --no-build crates/dmz/tests/vectors/vm-kernel-accepts.sh`; after: copy
# $OUT/after.bin into the image's data area and `zonedd check` it (see ZONEDD.md).
# vm-timeout: 240
# vm-memory: 3G
set -euo pipefail
source /work/main/tests/vm/lib/devices.sh
OUT=/tmp/h4a-vm
IMG=$OUT/zk.img
doff=$(od -An -tu8 -j64 -N8 "$IMG" | tr -d ' ')
vm_step "null_blk 24 x 64 MiB, 8 conventional"
nb=$(make_nullb zk 1536 64 8)
dd if="$IMG" of="$nb" bs=1M skip=$((doff >> 20)) count=$((8 * 64)) oflag=direct status=none
vm_step "dmsetup create"
modprobe dm-zoned
dmesg -C || true
dmsetup create zk --table "0 $((18 * 131072)) zoned $nb"
dmsetup table zk | tee "$OUT/table.txt"
dmsetup status zk | tee "$OUT/status.txt"
blockdev --getsz /dev/mapper/zk | tee "$OUT/size.txt"
vm_step "writes"
head -c 1048576 /dev/zero | tr '\0' '\241' | dd of=/dev/mapper/zk bs=1M oflag=direct status=none
head -c 8192 /dev/zero | tr '\0' '\262' | dd of=/dev/mapper/zk bs=4096 seek=$((16384 + 2)) oflag=direct status=none
head -c 4096 /dev/zero | tr '\0' '\303' | dd of=/dev/mapper/zk bs=4096 seek=$((2 * 16384)) oflag=direct status=none
sync
head -c 1048576 /dev/zero | tr '\0' '\241' >"$OUT/a1.bin"
dd if=/dev/mapper/zk of="$OUT/r1.bin" bs=1M count=1 iflag=direct status=none
cmp "$OUT/a1.bin" "$OUT/r1.bin"
vm_step "dmsetup remove"
dmsetup remove zk
dmesg | grep -i zoned >"$OUT/dmesg.txt" || true
dd if="$nb" of="$OUT/after.bin" bs=1M count=$((8 * 64)) iflag=direct status=none
blkzone report "$nb" >"$OUT/zones-after.txt"
remove_nullb "$nb"
echo "h4a dmz-kernel-accepts: ok"
