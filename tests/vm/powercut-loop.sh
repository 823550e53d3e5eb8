#!/usr/bin/env bash
# Power-cut loop, guest side: one phase per boot, driven by the host
# (scripts/vm/powercut-host.sh), on an emulated SMR image that lives on the HOST (in the
# 9p-shared checkout, ZONEDD_VM_POWERCUT_DIR), so it outlives the guest.
#   ZONEDD_VM_POWERCUT_PHASE=write  create /dev/ublkbN on the image, write fsync'd 1 MiB
#       checkpoints (O_DIRECT + conv=fsync, unaligned, overwriting each other) and log each
#       one that returned (at least 20, so slots get overwritten); then, mid-write, power
#       the guest off hard (sysrq 'o': no sync,
#       no daemon shutdown). Leaves cut.ROUND once the cut is requested.
#   ZONEDD_VM_POWERCUT_PHASE=verify  (next boot) create on the same image (the engine
#       replays its log), check every slot's newest completed checkpoint, delete, `zonedd
#       check` clean. Leaves verified.ROUND with "checked lost in_flight".
# Without a phase (a plain scripts/vm-test.sh run) it cannot cut power and boot again, so it
# says so and passes: run scripts/vm/powercut-host.sh.
# vm-timeout: 240
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"

phase=${ZONEDD_VM_POWERCUT_PHASE:-}
if [ -z "$phase" ]; then
    echo "powercut-loop: SKIP: needs two boots per loop; run scripts/vm/powercut-host.sh"
    exit 0
fi
Z=$(zonedd_bin)
modprobe ublk_drv
dir=${ZONEDD_VM_POWERCUT_DIR:?ZONEDD_VM_POWERCUT_DIR: the host folder with pc.img}
round=${ZONEDD_VM_POWERCUT_ROUND:?ZONEDD_VM_POWERCUT_ROUND}
img=$dir/pc.img
src=$dir/src     # host-generated random data, SRC_MB slices of 1 MiB
log=$dir/log     # every round's checkpoints: begin/done K SLOT SLICE
SLOTS=24
SRC_MB=$(($(stat -c %s "$src") >> 20))

out=$(RUST_LOG=${RUST_LOG:-info} "$Z" create --backend "$img" --queues 2 --depth 32)
bdev=$(sed -n 1p <<<"$out")
id=$(sed -n 's/^id //p' <<<"$out")
echo "created $bdev (id $id) on $img"

case $phase in
write)
    vm_step "round $round: checkpoints, then a hard power-off mid-write"
    echo 1 >/proc/sys/kernel/sysrq
    before=$(grep -c '^done ' "$log" 2>/dev/null || true)
    (
        k=$((round * 1000))
        while :; do
            slot=$(((k * 7) % SLOTS))
            s=$((k % SRC_MB))
            echo "begin $k $slot $s" >>"$log"
            dd if="$src" of="$bdev" bs=1M skip="$s" seek=$((3 * slot + 1)) count=1 \
                oflag=direct conv=fsync status=none || {
                echo "fail $k $slot $s" >>"$log"
                exit 1
            }
            echo "done $k $slot $s" >>"$log"
            k=$((k + 1))
        done
    ) &
    wpid=$!
    for ((i = 0; i < 1200; i++)); do
        [ "$(grep -c '^done ' "$log" || true)" -ge $((before + 20)) ] && break
        kill -0 "$wpid" 2>/dev/null || vm_fail "writer stopped: $(tail -2 "$log")"
        sleep 0.1
    done
    sleep "$((RANDOM % 2)).$((RANDOM % 10))"
    kill -0 "$wpid" 2>/dev/null || vm_fail "writer stopped: $(tail -2 "$log")"
    echo "cutting power after $(($(grep -c '^done ' "$log") - before)) checkpoints this round"
    echo "$(grep -c '^done ' "$log")" >"$dir/cut.$round"
    echo o >/proc/sysrq-trigger
    sleep 60
    vm_fail "still running 60 s after sysrq poweroff"
    ;;
verify)
    vm_step "round $round: after the power cut: every completed checkpoint"
    checked=0 lost=0 inflight=0
    declare -A last=() pending=()
    while read -r what k slot s; do
        case $what in
        begin) pending[$slot]=1 ;;
        done)
            last[$slot]=$s
            pending[$slot]=0
            ;;
        esac
    done <"$log"
    for slot in "${!last[@]}"; do
        if [ "${pending[$slot]}" = 1 ]; then
            # A write to this slot was in flight at the cut: old, new or mixed are all fine.
            inflight=$((inflight + 1))
            continue
        fi
        s=${last[$slot]}
        dd if="$bdev" of="$VM_SCRATCH/got" bs=1M skip=$((3 * slot + 1)) count=1 iflag=direct status=none
        dd if="$src" of="$VM_SCRATCH/want" bs=1M skip="$s" count=1 status=none
        if cmp -s "$VM_SCRATCH/got" "$VM_SCRATCH/want"; then
            checked=$((checked + 1))
        else
            echo "LOST: slot $slot (checkpoint slice $s) differs" >&2
            lost=$((lost + 1))
        fi
    done
    "$Z" delete "$id"
    check=clean
    if ! RUST_LOG=error "$Z" check "$img" >"$VM_SCRATCH/check" 2>&1; then
        tail -5 "$VM_SCRATCH/check"
        check=unclean
    fi
    echo "$checked $lost $inflight $check" >"$dir/verified.$round"
    echo "powercut-loop: round $round: $checked slots verified, $lost lost, $inflight in flight at the cut, check $check"
    [ "$lost" = 0 ] || vm_fail "$lost checkpoint(s) lost"
    [ "$check" = clean ] || vm_fail "zonedd check not clean after the power cut and a clean delete"
    ;;
*) vm_fail "ZONEDD_VM_POWERCUT_PHASE=$phase: write or verify" ;;
esac
