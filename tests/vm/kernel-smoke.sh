#!/usr/bin/env bash
# Kernel smoke test: the guest kernel gives zonedd what it needs. ublk_drv loads and creates
# /dev/ublk-control; a null_blk host-managed zoned disk (4 KiB blocks, 2 GiB, 64 MiB zones, 4
# conventional, max 8 open / 12 active) reports the expected zone table and limits; scsi_debug
# zbc=host-managed with 4 KiB sectors appears as a host-managed /dev/sdX; dm-zoned loads and
# registers the "zoned" target. zonedd's probe of the driver's ublk features (GET_FEATURES, in
# `zonedd status --json` as `ublk`) is printed and checked: the driver offers what zonedd uses
# (USER_RECOVERY, USER_RECOVERY_REISSUE), zonedd uses nothing else, and the offer matches the
# kernel series (6.12 lacks the 6.16+ features; 7.x has zero copy, auto buffer registration,
# quiesce, size updates, per-io daemons, batch I/O). Everything is torn down at the end.
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

vm_step "ublk features: what the driver offers, what zonedd uses"
Z=$(zonedd_bin)
out=$("$Z" create --backend mem:64M --queues 1 --depth 8 --label smoke)
id=$(sed -n 's/^id //p' <<<"$out")
st=$("$Z" status "$id" --json)
"$Z" status "$id" | grep '^ublk ' || vm_fail "zonedd status shows no ublk line"
"$Z" delete "$id"
jq -er --arg k "$(uname -r)" '.ublk | "ublk on \($k): the driver offers \(.kernel_features) [\(.kernel_features_names | join(" "))]",
    "  zonedd uses \(.flags_used) [\(.flags_used_names | join(" "))]; the device has \(.device_flags) [\(.device_flags_names | join(" "))]"' \
    <<<"$st" || vm_fail "no ublk section in: $st"
offer=$(($(jq -r .ublk.kernel_features <<<"$st")))
used=$(($(jq -r .ublk.flags_used <<<"$st")))
expect "flags zonedd uses" "$(printf '%#x' "$used")" 0x18
expect "the driver offers them" "$((offer & used))" "$used"
# Bits of the features 6.16 added (UPDATE_SIZE, AUTO_BUF_REG, QUIESCE, PER_IO_DAEMON) and 7.0's
# BATCH_IO: what a probe has to see differently on the two kernels the harness boots.
new_bits=$(((1 << 10) | (1 << 11) | (1 << 12) | (1 << 13) | (1 << 15)))
# The driver also sets flags of its own on every device: 6.12 URING_CMD_COMP_IN_TASK and
# CMD_IOCTL_ENCODE (0x42); 7.x PER_IO_DAEMON, BUF_REG_OFF_DAEMON and SAFE_STOP_DEV as well
# (0x26042), which zonedd neither asks for nor relies on (one thread per queue, no zero copy,
# stops through its daemon).
extra=$(printf '%#x' $(($(jq -r .ublk.device_flags <<<"$st") & ~used)))
case $(uname -r) in
6.12.*)
    expect "6.12 offers none of 6.16's and 7.0's features" "$((offer & new_bits))" 0
    expect "flags 6.12's driver adds by itself" "$extra" 0x42
    ;;
7.*)
    expect "7.x offers 6.16's and 7.0's features" "$(printf '%#x' $((offer & new_bits)))" "$(printf '%#x' "$new_bits")"
    expect "flags 7.x's driver adds by itself" "$extra" 0x26042
    ;;
*) echo "note: kernel $(uname -r): no expectation for its newer ublk features; the driver added $extra" ;;
esac

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
dmsetup targets | grep -w zoned >/dev/null || vm_fail "dmsetup targets does not list 'zoned'"
echo "ok: dm-zoned target registered"
modprobe -r dm-zoned

echo "kernel-smoke: all checks passed"
