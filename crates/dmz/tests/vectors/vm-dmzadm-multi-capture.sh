#!/usr/bin/env bash
# Made the dmzadm-multi-*.bin vectors (README.md, "Multi-device set"): dmzadm 2.2.2 formats a
# cache (regular null_blk, 8 x 16 MiB) in front of two zoned null_blks (16 x 16 MiB each, no
# conventional zones); the 42 blocks of each metadata set and block 0 of each drive are
# saved, then again after the kernel's dm-zoned wrote. Run with
# `scripts/vm-test.sh --no-build crates/dmz/tests/vectors/vm-dmzadm-multi-capture.sh`;
# output in $OUT.
# vm-timeout: 300
# vm-memory: 1G
set -euo pipefail
source "$(dirname "$0")/../../../../tests/vm/lib/devices.sh"
OUT=${ZONEDD_VM_VEC_OUT:-/tmp/helper-l-vec}
mkdir -p "$OUT"
cb=$(make_nullb vecc 128 0 0)
z1=$(make_nullb vecz1 256 16 0)
z2=$(make_nullb vecz2 256 16 0)
dmzadm --format "$cb" "$z1" "$z2" --force --label=dmzmv --seq=4 >"$OUT/dmzadm-multi-format.log" 2>&1
save() { # save STATE
    dd if="$cb" of="$OUT/dmzadm-multi-$1-set0.bin" bs=4096 count=42 iflag=direct status=none
    dd if="$cb" of="$OUT/dmzadm-multi-$1-set1.bin" bs=4096 skip=4096 count=42 iflag=direct status=none
    dd if="$z1" of="$OUT/dmzadm-multi-$1-drive1-block0.bin" bs=4096 count=1 iflag=direct status=none
    dd if="$z2" of="$OUT/dmzadm-multi-$1-drive2-block0.bin" bs=4096 count=1 iflag=direct status=none
}
save fresh
modprobe dm-zoned
dmsetup create vec --table "0 $((34 * 32768)) zoned $cb $z1 $z2"
head -c 1048576 /dev/zero | tr '\0' '\241' | dd of=/dev/mapper/vec bs=1M oflag=direct status=none
head -c 8192 /dev/zero | tr '\0' '\262' | dd of=/dev/mapper/vec bs=4096 seek=$((4096 + 2)) oflag=direct status=none
head -c 4096 /dev/zero | tr '\0' '\303' | dd of=/dev/mapper/vec bs=4096 seek=$((30 * 4096)) oflag=direct status=none
sync
dmsetup status vec >"$OUT/dmzadm-multi-status.txt"
dmsetup remove vec
save used
dmzadm --check "$cb" "$z1" "$z2" >"$OUT/dmzadm-multi-check-used.log" 2>&1

remove_nullb "$z2"; remove_nullb "$z1"; remove_nullb "$cb"
ls -l "$OUT"
