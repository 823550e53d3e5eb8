#!/usr/bin/env bash
# Daemon crash and user recovery: while `fio --verify=crc32c` writes to /dev/ublkbN, the
# daemon is killed with SIGKILL; the device must stay (QUIESCED) with the job's I/O waiting,
# `zonedd recover ID` re-attaches a new daemon to the same /dev/ublkbN, and the job must
# finish and verify every block it wrote. Repeated at several moments into the job; then
# random writes, many of them hop-free (written on the queue threads' own rings), must all
# be there after kill -9 + recover; then a written pattern must survive kill + recover.
# While the device is quiesced, a plain `create` on its backend (also with --format) is
# refused with exit 2 and the hint to run `zonedd recover ID` (docs/bad-input.md), and the
# pattern is still intact after recovery. Then one round of what systemd does (kill -9,
# `create --foreground --recover-if-present`, `delete --backend`): every daemon, recovered
# or fresh, exits with status 0 when deleted.
# Backend: the engine on a null_blk zoned device (or $ZONEDD_VM_RECOVER_BACKEND).
# vm-timeout: 900
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv

field() { # field ID KEY -> value from `zonedd list --json`
    "$Z" list --json | python3 -c "import json,sys; d=[x for x in json.load(sys.stdin) if x['id']==$1]; print(d[0]['$2'] if d else 'absent')"
}
wait_state() { # wait_state ID STATE
    local i
    for ((i = 0; i < 100; i++)); do
        [ "$(field "$1" state)" = "$2" ] && return 0
        sleep 0.1
    done
    vm_fail "device $1 did not become $2 (is $(field "$1" state))"
}

# Default: the engine on a null_blk host-managed device (768 MiB, 16 MiB zones, 8
# conventional). ZONEDD_VM_RECOVER_BACKEND=image: on an emulated SMR image of the same shape
# (no hop-free writes there); =file: on the write-through file target.
diagnose() { # what the daemon says, for a failure
    "$Z" status "$id" || true
    cat "/run/zonedd/$id.log" 2>/dev/null | tail -40 || true
}

kind=${ZONEDD_VM_RECOVER_BACKEND:-engine}
backend=$kind
img=$VM_SCRATCH/recover.img
case $backend in
engine)
    # A zoned block device: the queue threads write on their rings only there (an emulated
    # image is served through the pool), and the hop-free step below needs them.
    backend=$(make_nullb recover 768 16 8)
    "$Z" format --backend "$backend" --force >/dev/null
    ;;
image)
    "$Z" emulate "$img" --size 768M --zone-size 16M --conventional 8 >/dev/null
    "$Z" format --backend "$img" --force >/dev/null
    backend=$img
    ;;
file)
    truncate -s 512M "$img"
    backend=file:$img
    ;;
esac
case $backend in # create names the backend by its canonical path
mem:*) canon=$backend ;;
file:*) canon=file:$(realpath "${backend#file:}") ;;
*) canon=$(realpath "$backend") ;;
esac

out=$(RUST_LOG=${RUST_LOG:-info} "$Z" create --backend "$backend" --queues 2 --depth 32)
bdev=$(sed -n 1p <<<"$out")
id=$(sed -n 's/^id //p' <<<"$out")
echo "created $bdev (id $id) on $backend"

for delay in 1 3; do
    vm_step "kill -9 ${delay}s into fio, then recover"
    fio --name=recover --filename="$bdev" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
        --iodepth=16 --size=32M --rate_iops=1500 --eta=never --verify=crc32c --verify_fatal=1 --randseed=$delay \
        --output="$VM_SCRATCH/fio.$delay" &
    fio_pid=$!
    sleep "$delay"
    pid=$(field "$id" pid)
    kill -9 "$pid"
    wait_state "$id" quiesced
    [ -b "$bdev" ] || vm_fail "$bdev vanished after the daemon died"
    kill -0 "$fio_pid" 2>/dev/null || vm_fail "fio finished while the device had no daemon"
    RUST_LOG=${RUST_LOG:-info} "$Z" recover "$id"
    wait_state "$id" live
    for ((i = 0; i < 1200; i++)); do
        kill -0 "$fio_pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$fio_pid" 2>/dev/null; then
        diagnose
        vm_fail "fio still waiting 120 s after recovery at ${delay}s"
    fi
    if ! wait "$fio_pid"; then
        cat "$VM_SCRATCH/fio.$delay"
        diagnose
        vm_fail "fio failed after recovery at ${delay}s"
    fi
    grep -E "err= *0" "$VM_SCRATCH/fio.$delay" >/dev/null || vm_fail "fio reported errors"
    echo "ok: fio verified after kill at ${delay}s (new daemon pid $(field "$id" pid))"
done

vm_step "hop-free writes (made on the queue threads' own rings) survive kill -9"
# 4 KiB random writes into two fresh chunks: each chunk's first write maps a conventional
# zone on the pool; the writes after it that need nothing first are planned by the engine,
# written by the queue thread and acknowledged once their log record is written.
fio --name=hopfree --filename="$bdev" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
    --iodepth=16 --offset=200M --size=16M --randseed=11 --verify=crc32c --do_verify=0 \
    --eta=never --output="$VM_SCRATCH/fio.hopfree" || {
    cat "$VM_SCRATCH/fio.hopfree"
    vm_fail "hop-free writes: fio failed"
}
counts=$("$Z" status "$id" --json | python3 -c 'import json,sys
f = json.load(sys.stdin)["frontend"]
print(f["hop_free_writes"], f["writes"], f["hop_free_write_retries"])')
read -r hop writes retries <<<"$counts"
echo "writes hop-free: $hop of $writes, retried on the pool: $retries"
[ "$kind" != engine ] || [ "$hop" -gt 0 ] || vm_fail "no write went hop-free"
[ "$retries" = 0 ] || vm_fail "$retries hop-free writes failed and were retried"
kill -9 "$(field "$id" pid)"
wait_state "$id" quiesced
RUST_LOG=${RUST_LOG:-info} "$Z" recover "$id"
wait_state "$id" live
fio --name=hopfree --filename="$bdev" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
    --iodepth=16 --offset=200M --size=16M --randseed=11 --verify=crc32c --verify_only \
    --verify_fatal=1 --eta=never --output="$VM_SCRATCH/fio.hopfree-verify" || {
    cat "$VM_SCRATCH/fio.hopfree-verify"
    diagnose
    vm_fail "hop-free writes: data differs after kill -9 and recover"
}
echo "ok: 16 MiB of random 4 KiB writes, $hop hop-free, verified after kill -9 + recover"

vm_step "a written pattern survives kill + create --recover-if-present (the systemd restart path)"
head -c $((4 << 20)) /dev/urandom >"$VM_SCRATCH/pattern"
dd if="$VM_SCRATCH/pattern" of="$bdev" bs=1M seek=100 oflag=direct conv=fsync status=none
kill -9 "$(field "$id" pid)"
wait_state "$id" quiesced
quiesced="zonedd: $canon is already used by ublk device $id (quiesced): its daemon died, run \`zonedd recover $id\`"
expect_error 2 "$quiesced" "$Z" create --backend "$backend"
expect_error 2 "$quiesced" "$Z" create --backend "$backend" --format
[ "$(field "$id" state)" = quiesced ] || vm_fail "device $id is $(field "$id" state) after the refused creates"
out=$("$Z" create --backend "$backend" --recover-if-present)
[ "$(sed -n 1p <<<"$out")" = "$bdev" ] || vm_fail "--recover-if-present gave '$out', not $bdev"
dd if="$bdev" of="$VM_SCRATCH/back" bs=1M skip=100 count=4 iflag=direct status=none
cmp "$VM_SCRATCH/pattern" "$VM_SCRATCH/back" || vm_fail "data differs after recovery"
echo "ok: pattern intact"

# What systemd sees of a volume's daemon (zonedd@.service: `create --foreground
# --recover-if-present`, stopped by `zonedd delete --backend`): it must exit with status 0 when
# deleted, a recovered daemon as well as a fresh one, or the unit ends `failed`.
foreground_daemon() { # starts `create --foreground` ARGS in the background: sets dpid
    "$Z" create --backend "$backend" --foreground "$@" >"$VM_SCRATCH/fg.out" 2>"$VM_SCRATCH/fg.err" &
    dpid=$!
    wait_state "$id" live
}
delete_and_reap() { # delete_and_reap WHAT: `delete --backend`, then the daemon's exit status is 0
    local rc=0
    "$Z" delete --backend "$backend" >/dev/null
    wait "$dpid" || rc=$?
    [ ! -e "$bdev" ] || vm_fail "$bdev still exists after delete"
    if [ "$rc" != 0 ]; then
        tail -n 20 "$VM_SCRATCH/fg.err"
        vm_fail "$1: the daemon exited with status $rc$([ "$rc" -gt 128 ] && echo " (signal $((rc - 128)))") after delete"
    fi
}
for round in 1; do
    vm_step "round $round: kill -9, create --foreground --recover-if-present, delete: exit status 0"
    kill -9 "$(field "$id" pid)"
    wait_state "$id" quiesced
    foreground_daemon --recover-if-present
    dd if="$bdev" of="$VM_SCRATCH/back" bs=1M skip=100 count=4 iflag=direct status=none
    cmp "$VM_SCRATCH/pattern" "$VM_SCRATCH/back" || vm_fail "round $round: data differs after recovery"
    delete_and_reap "round $round, recovered daemon"
    # a fresh daemon on the same backend (data kept), in the foreground too
    foreground_daemon --id "$id"
    bdev=$(sed -n 1p "$VM_SCRATCH/fg.out")
    dd if="$bdev" of="$VM_SCRATCH/back" bs=1M skip=100 count=4 iflag=direct status=none
    cmp "$VM_SCRATCH/pattern" "$VM_SCRATCH/back" || vm_fail "round $round: data differs after delete and create"
    echo "ok: round $round: recovered daemon exited 0 on delete; pattern intact in a new daemon"
done
vm_step "delete"
delete_and_reap "a fresh daemon"
[ "$kind" != engine ] || remove_nullb "$backend"
echo "ublk-recover: all checks passed"
