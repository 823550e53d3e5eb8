#!/usr/bin/env bash
# Kernel smoke test: the guest kernel gives zonedd what it needs. ublk_drv loads and creates
# /dev/ublk-control; a null_blk host-managed zoned disk (4 KiB blocks, 2 GiB, 64 MiB zones, 4
# conventional, max 8 open / 12 active) reports the expected zone table and limits; scsi_debug
# zbc=host-managed with 4 KiB sectors appears as a host-managed /dev/sdX; dm-zoned loads and
# registers the "zoned" target. Everything is torn down at the end.
# vm-timeout: 300
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"

expect() { # expect WHAT GOT WANT
    [ "$2" = "$3" ] || vm_fail "$1: got '$2', want '$3'"
    echo "ok: $1 = $3"
}

vm_step "ublk"
modprobe ublk_drv
[ -c /dev/ublk-control ] || vm_fail "modprobe ublk_drv did not create /dev/ublk-control"
echo "ok: /dev/ublk-control"

vm_step "null_blk zoned"
# 2 GiB: null_blk drops a max_active that is not below the number of sequential zones.
nullb=$(make_nullb nullb0 2048 64 4 8 12)
q=/sys/block/${nullb#/dev/}/queue
expect "$nullb zoned model" "$(zoned_model "$nullb")" host-managed
expect "$nullb logical block size" "$(cat "$q/logical_block_size")" 4096
expect "$nullb zone size (sectors)" "$(cat "$q/chunk_sectors")" $((64 * 2048))
expect "$nullb nr_zones" "$(cat "$q/nr_zones")" 32
expect "$nullb max_open_zones" "$(cat "$q/max_open_zones")" 8
expect "$nullb max_active_zones" "$(cat "$q/max_active_zones")" 12
report=$(blkzone report "$nullb")
expect "$nullb conventional zones in blkzone report" "$(grep -c 'CONVENTIONAL' <<<"$report")" 4
expect "$nullb sequential zones in blkzone report" "$(grep -c 'SEQ_WRITE_REQUIRED' <<<"$report")" 28
expect "$nullb first zone type" "$(head -n1 <<<"$report" | grep -o 'CONVENTIONAL' || true)" CONVENTIONAL
remove_nullb "$nullb"
[ ! -e "$nullb" ] || vm_fail "$nullb still exists after remove_nullb"

vm_step "scsi_debug host-managed SMR"
sd=$(make_scsi_debug_smr 512 64 2)
q=/sys/block/${sd#/dev/}/queue
expect "$sd zoned model" "$(zoned_model "$sd")" host-managed
expect "$sd logical block size" "$(cat "$q/logical_block_size")" 4096
expect "$sd nr_zones" "$(cat "$q/nr_zones")" 8
report=$(blkzone report "$sd")
expect "$sd conventional zones in blkzone report" "$(grep -c 'CONVENTIONAL' <<<"$report")" 2
expect "$sd sequential zones in blkzone report" "$(grep -c 'SEQ_WRITE_REQUIRED' <<<"$report")" 6
remove_scsi_debug
[ ! -e "$sd" ] || vm_fail "$sd still exists after remove_scsi_debug"

vm_step "dm-zoned"
modprobe dm-zoned
[ -d /sys/module/dm_zoned ] || vm_fail "dm_zoned is not loaded"
dmsetup targets | grep -qw zoned || vm_fail "dmsetup targets does not list 'zoned'"
echo "ok: dm-zoned target registered"
modprobe -r dm-zoned

echo "kernel-smoke: all checks passed"
