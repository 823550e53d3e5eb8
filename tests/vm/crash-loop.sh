#!/usr/bin/env bash
# Crash loop: the daemon is killed with SIGKILL at a random moment while a writer puts
# fsync'd 1 MiB checkpoints (O_DIRECT, conv=fsync, unaligned offsets that overlap chunks,
# overwrites) on /dev/ublkbN; `zonedd recover ID` re-attaches a new daemon, the writer's
# in-flight I/O completes, and every checkpoint whose dd returned must read back exactly
# (the newest one per slot). Repeated ZONEDD_VM_CRASH_LOOPS times (default 2) on a null_blk
# host-managed device, ZONEDD_VM_CRASH_LOOPS_LOG times (default 2) on one formatted with the
# log layout, with four more writers of 4 KiB checkpoints beside (write groups in flight at
# the kill), and ZONEDD_VM_CRASH_LOOPS_IMG times (default 1) on an emulated image in guest
# RAM; then `zonedd delete` and `zonedd check` must be clean.
# Prints: "crash-loop: <backend>: N loops survived, C checkpoints verified, L lost".
# vm-timeout: 420
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv

loops=${ZONEDD_VM_CRASH_LOOPS:-2}
loops_img=${ZONEDD_VM_CRASH_LOOPS_IMG:-1}
loops_log=${ZONEDD_VM_CRASH_LOOPS_LOG:-2}
SLOTS=24  # checkpoint slots, 1 MiB each, at (3 * slot + 1) MiB: unaligned, overwritten
SRC_MB=32 # distinct source slices
src=$VM_SCRATCH/src
head -c $((SRC_MB << 20)) /dev/urandom >"$src"

field() { # field ID KEY -> value from `zonedd list --json`
    "$Z" list --json | python3 -c "import json,sys; d=[x for x in json.load(sys.stdin) if x['id']==$1]; print(d[0]['$2'] if d else 'absent')"
}
wait_state() { # wait_state ID STATE
    local i
    for ((i = 0; i < 300; i++)); do
        [ "$(field "$1" state)" = "$2" ] && return 0
        sleep 0.1
    done
    vm_fail "device $1 did not become $2 (is $(field "$1" state))"
}
diagnose() {
    "$Z" status "$1" || true
    tail -40 "/run/zonedd/$1.log" 2>/dev/null || true
}
done_count() { grep -c '^done ' "$1" 2>/dev/null || true; }

# writer DEV LOG STOP FIRST_K [BS AREA]: checkpoints of BS bytes (default 1 MiB) until STOP
# exists, slot k at AREA + (3 * slot + 1) * BS bytes. "begin" before each dd, "done" once it
# returned (data fsync'd), "fail" if it failed.
writer() {
    local dev=$1 log=$2 stop=$3 k=$4 bs=${5:-$((1 << 20))} area=${6:-0} slot s
    while [ ! -e "$stop" ]; do
        slot=$(((k * 7) % SLOTS))
        s=$((k % SRC_MB))
        echo "begin $k $slot $s" >>"$log"
        if ! dd if="$src" of="$dev" bs="$bs" skip=$((s << 20)) seek=$((area + (3 * slot + 1) * bs)) \
            count=1 iflag=skip_bytes oflag=direct,seek_bytes conv=fsync status=none 2>>"$log.err"; then
            echo "fail $k $slot $s" >>"$log"
            return 1
        fi
        echo "done $k $slot $s" >>"$log"
        k=$((k + 1))
    done
}

# verify DEV LOG [BS AREA] -> prints "checked lost"; every slot's newest completed checkpoint.
verify() {
    local dev=$1 log=$2 bs=${3:-$((1 << 20))} area=${4:-0} slot s checked=0 lost=0
    declare -A last=()
    while read -r what k slot s; do
        [ "$what" = done ] && last[$slot]=$s
    done <"$log"
    # One read of the whole slot area, then a compare per slot.
    dd if="$dev" of="$VM_SCRATCH/got" bs="$bs" skip=$((area / bs)) count=$((3 * SLOTS + 1)) \
        iflag=direct status=none
    for slot in "${!last[@]}"; do
        s=${last[$slot]}
        if cmp -s -n "$bs" -i $(((3 * slot + 1) * bs)):$((s << 20)) "$VM_SCRATCH/got" "$src"; then
            checked=$((checked + 1))
        else
            echo "LOST: slot $slot (checkpoint data slice $s, $bs bytes at $area) differs" >&2
            lost=$((lost + 1))
        fi
    done
    echo "$checked $lost"
}

# crash_loop BACKEND LOOPS NAME [SMALL]: SMALL more writers of 4 KiB checkpoints beside the
# 1 MiB one (each in its own area from 128 MiB), so that small writes are in flight together
# (on the log layout: write groups on the queue rings) when the daemon is killed.
crash_loop() {
    local backend=$1 n=$2 name=$3 small=${4:-0} out bdev id log stop wpid r pid before i w
    local survived=0 checked=0 lost=0 spids c l cs ls hop_free=0 writes=0 hf wr
    out=$(RUST_LOG=${RUST_LOG:-warn} "$Z" create --backend "$backend" --queues 2 --depth 32)
    bdev=$(sed -n 1p <<<"$out")
    id=$(sed -n 's/^id //p' <<<"$out")
    echo "created $bdev (id $id) on $backend"
    log=$VM_SCRATCH/$name.log
    : >"$log"
    for ((w = 0; w < small; w++)); do : >"$log.s$w"; done
    for ((r = 1; r <= n; r++)); do
        vm_step "$name: loop $r/$n: checkpoints, kill -9 at a random moment, recover, verify"
        stop=$VM_SCRATCH/$name.stop.$r
        before=$(done_count "$log")
        writer "$bdev" "$log" "$stop" $((r * 1000)) &
        wpid=$!
        spids=()
        for ((w = 0; w < small; w++)); do
            writer "$bdev" "$log.s$w" "$stop" $((r * 1000)) 4096 $(((128 + w) << 20)) &
            spids+=($!)
        done
        # At least two new checkpoints, then a random 0-1.9 s more.
        for ((i = 0; i < 600; i++)); do
            [ "$(done_count "$log")" -ge $((before + 2)) ] && break
            kill -0 "$wpid" 2>/dev/null || break
            sleep 0.1
        done
        [ "$(done_count "$log")" -ge $((before + 2)) ] || {
            diagnose "$id"
            vm_fail "$name: the writer made no progress ($(tail -3 "$log.err" 2>/dev/null))"
        }
        sleep "$((RANDOM % 2)).$((RANDOM % 10))"
        pid=$(field "$id" pid)
        read -r hf wr <<<"$("$Z" status "$id" --json | python3 -c 'import json,sys; f=json.load(sys.stdin)["frontend"]; print(f["hop_free_writes"], f["writes"])')"
        hop_free=$((hop_free + hf))
        writes=$((writes + wr))
        kill -9 "$pid"
        # The checkpoint in flight completes after recovery; no new one starts.
        touch "$stop"
        echo "killed daemon $pid after $(($(done_count "$log") - before)) checkpoints this loop"
        wait_state "$id" quiesced
        RUST_LOG=${RUST_LOG:-warn} "$Z" recover "$id"
        wait_state "$id" live
        for ((i = 0; i < 1200; i++)); do
            kill -0 "$wpid" "${spids[@]}" 2>/dev/null || break
            sleep 0.1
        done
        for pid in "$wpid" "${spids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then
                diagnose "$id"
                vm_fail "$name: a writer still blocked 120 s after recovery"
            fi
        done
        wait "$wpid" || {
            diagnose "$id"
            vm_fail "$name: a checkpoint write failed: $(grep '^fail' "$log") $(tail -3 "$log.err")"
        }
        for ((w = 0; w < small; w++)); do
            wait "${spids[w]}" || {
                diagnose "$id"
                vm_fail "$name: a 4 KiB checkpoint write failed: $(tail -3 "$log.s$w.err")"
            }
        done
        verify "$bdev" "$log" >"$VM_SCRATCH/verified"
        read -r c l <"$VM_SCRATCH/verified"
        for ((w = 0; w < small; w++)); do
            verify "$bdev" "$log.s$w" 4096 $(((128 + w) << 20)) >"$VM_SCRATCH/verified"
            read -r cs ls <"$VM_SCRATCH/verified"
            c=$((c + cs))
            l=$((l + ls))
        done
        echo "$name loop $r: $c slots verified, $l lost ($(done_count "$log") checkpoints so far)"
        checked=$((checked + c))
        lost=$((lost + l))
        [ "$l" = 0 ] && survived=$((survived + 1))
    done
    echo "$name: writes on the queue rings before the kills: $hop_free of $writes"
    # The small checkpoints went hop-free (in write groups on the log layout): the kills hit
    # writes made that way, not only writes through the pool.
    [ "$small" = 0 ] || [ "$hop_free" -gt 0 ] || failures+=("$name: no write went hop-free")
    vm_step "$name: delete, check"
    "$Z" delete "$id"
    [ ! -e "$bdev" ] || vm_fail "$bdev still exists after delete"
    local check=clean
    if ! RUST_LOG=error "$Z" check "$backend" >"$VM_SCRATCH/$name.check" 2>&1; then
        tail -5 "$VM_SCRATCH/$name.check"
        check="NOT clean ($(grep -c 'error:' "$VM_SCRATCH/$name.check") errors)"
        failures+=("$name: zonedd check $check after a clean delete")
    fi
    echo "crash-loop: $name: $survived/$n loops survived, $checked checkpoints verified, $lost lost, check $check"
    [ "$lost" = 0 ] || failures+=("$name: $lost checkpoint(s) lost")
}
failures=()

vm_step "null_blk: 512 MiB, 16 MiB zones, 8 conventional"
nb=$(make_nullb crashnb 512 16 8)
"$Z" format --backend "$nb" --force >/dev/null 2>&1
crash_loop "$nb" "$loops" nullb
remove_nullb "$nb"

if [ "$loops_log" -gt 0 ]; then
    # The log layout: its writes appended at open zones, the small ones in write groups on
    # the queue rings (the default), the 1 MiB ones through the pool.
    vm_step "null_blk, log layout: 512 MiB, 16 MiB zones, 8 conventional"
    nb=$(make_nullb crashnb 512 16 8)
    "$Z" format --backend "$nb" --layout log --force >/dev/null 2>&1
    crash_loop "$nb" "$loops_log" log 4
    remove_nullb "$nb"
fi

if [ "$loops_img" -gt 0 ]; then
    vm_step "emulated image in guest RAM: 512 MiB, 16 MiB zones, 8 conventional"
    img=$VM_SCRATCH/crash.img
    "$Z" emulate "$img" --size 512M --zone-size 16M --conventional 8 >/dev/null
    "$Z" format --backend "$img" --force >/dev/null 2>&1
    crash_loop "$img" "$loops_img" image
    rm -f "$img"
fi
if [ ${#failures[@]} -gt 0 ]; then
    printf 'FAIL: %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "crash-loop: all checks passed"
