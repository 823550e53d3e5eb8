#!/usr/bin/env bash
# Hop-free reads whose commit is linked behind their device read (docs/design.md, "Hop-free
# reads"; issue 13). fio writes 32 MiB of random 4 KiB blocks to a volume on a null_blk zoned
# device whose hardware queue takes 2 requests, then reads every block back and checks it
# (crc32c): at QD1, where every read is alone on its queue thread and linked (all must be),
# then at QD32 with ZONEDD_LINKED_READS=always, where every read is linked first and most are
# turned away at once by the 2-deep queue (`-EAGAIN`: they are RWF_NOWAIT). The kernel then
# cancels the commit linked behind each of them, and each such read must be redone and
# return what was written. Fails unless each phase ran linked reads, every QD1 read was
# linked and got through (or had no plan), the QD32 phase had linked commits cancelled
# (`linked_cancels`), and nothing failed.
#   scripts/vm-test.sh --no-build linked-reads
# vm-timeout: 300
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
dev=$(NULLB_HW_QUEUE_DEPTH=2 make_nullb nullb0 512 16 8)
start() { # start [VAR=VALUE...]: serve the volume on $dev, with this environment
    local out
    out=$(env "$@" "$Z" create --backend "$dev" --queues 1 --depth 64)
    bdev=$(sed -n 1p <<<"$out")
    id=$(sed -n 's/^id //p' <<<"$out")
    [ -b "$bdev" ] && [ -n "$id" ] || vm_fail "create printed: $out"
}
"$Z" format --backend "$dev" --force >/dev/null
start

fio_blocks() { # fio_blocks NAME FIO-ARGS...: the same 8,192 random 4 KiB blocks each time
    fio --name="$1" --filename="$bdev" --direct=1 --rw=randwrite --bs=4k --ioengine=libaio \
        --size=32M --randseed=7 --verify=crc32c --verify_fatal=1 --eta=never \
        --output="$VM_SCRATCH/fio.$1" "${@:2}" || {
        cat "$VM_SCRATCH/fio.$1"
        vm_fail "fio $1 failed"
    }
}
counters() { # "linked cancelled errors pool_reads reads"
    "$Z" status "$id" --json |
        jq -er '.frontend | "\(.linked_reads) \(.linked_cancels) \(.errors) \(.pool_reads) \(.reads)"'
}

vm_step "write 32 MiB of random 4 KiB blocks"
fio_blocks write --iodepth=16 --do_verify=0
read -r l0 c0 e0 p0 r0 <<<"$(counters)"
[ "$e0" = 0 ] || vm_fail "$e0 requests failed while writing"

check_phase() { # check_phase NAME: the counters since the last phase
    local l1 c1 e1 p1 r1 l c p r
    read -r l1 c1 e1 p1 r1 <<<"$(counters)"
    l=$((l1 - l0)) c=$((c1 - c0)) p=$((p1 - p0)) r=$((r1 - r0))
    echo "$1: reads $r: linked $l, linked but cancelled $c, through the pool $p"
    [ "$e1" = 0 ] || vm_fail "$1: $e1 requests failed"
    [ "$l" -gt 0 ] || vm_fail "$1: no read was linked to its commit"
    # QD1: every read is alone on its thread and one written block, and nothing else uses
    # the device: each one is linked and gets through, unless the engine had no plan for it
    # at once (the pool's).
    [ "$1" != QD1 ] || { [ "$c" = 0 ] && [ $((l + p)) -ge "$r" ]; } || vm_fail "QD1: a read was not linked, or was turned away"
    [ "$1" != QD32 ] || [ "$c" -gt 0 ] || vm_fail "QD32 on a 2-deep queue: no linked commit was cancelled"
}

vm_step "read every block back at QD1 and check it"
fio_blocks read1 --iodepth=1 --verify_only
check_phase QD1

vm_step "again at QD32, every read linked first"
"$Z" delete "$id"
start ZONEDD_LINKED_READS=always
read -r l0 c0 _ p0 r0 <<<"$(counters)"
fio_blocks read32 --iodepth=32 --verify_only
check_phase QD32
"$Z" delete "$id"
remove_nullb "$dev"
echo "ok: linked reads verified, with reads turned away and redone"
