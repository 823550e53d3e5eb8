#!/usr/bin/env bash
# Hop-free reads whose commit is linked behind their device read (docs/design.md, "Hop-free
# reads"; issue 13). fio writes 32 MiB of random 4 KiB blocks to a volume on a null_blk zoned
# device whose hardware queue takes 2 requests, then reads every block back and checks it
# (crc32c): at QD1, where every read is alone on its queue thread and linked (all must be),
# then at QD32 with ZONEDD_LINKED_READS=always, where every read is linked first and most are
# turned away at once by the 2-deep queue (`-EAGAIN`: they are RWF_NOWAIT). The kernel then
# cancels the commit linked behind each of them, and each such read must be redone and
# return what was written. Fails unless each phase ran linked reads, the QD32 one had reads
# turned away (every read's first attempt is linked there, so those include linked ones),
# and nothing failed.
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
counters() { # "linked ring_again errors hop_free_retries reads"
    "$Z" status "$id" --json |
        jq -er '.frontend | "\(.linked_reads) \(.ring_again) \(.errors) \(.hop_free_retries) \(.reads)"'
}

vm_step "write 32 MiB of random 4 KiB blocks"
fio_blocks write --iodepth=16 --do_verify=0
read -r l0 a0 e0 _ r0 <<<"$(counters)"
[ "$e0" = 0 ] || vm_fail "$e0 requests failed while writing"

check_phase() { # check_phase NAME: the counters since the last phase
    local l1 a1 e1 t1 r1
    read -r l1 a1 e1 t1 r1 <<<"$(counters)"
    echo "$1: reads $((r1 - r0)), linked $((l1 - l0)), turned away $((a1 - a0)), hop-free retries $t1"
    [ "$e1" = 0 ] || vm_fail "$1: $e1 requests failed"
    [ $((l1 - l0)) -gt 0 ] || vm_fail "$1: no read was linked to its commit"
    # QD1: every read is alone on its thread, one written block: each one is linked.
    [ "$1" != QD1 ] || [ $((l1 - l0)) = $((r1 - r0)) ] || vm_fail "QD1: not every read was linked"
    [ "$1" != QD32 ] || [ $((a1 - a0)) -gt 0 ] || vm_fail "QD32 on a 2-deep queue: no read was turned away"
}

vm_step "read every block back at QD1 and check it"
fio_blocks read1 --iodepth=1 --verify_only
check_phase QD1

vm_step "again at QD32, every read linked first"
"$Z" delete "$id"
start ZONEDD_LINKED_READS=always
read -r l0 a0 _ _ r0 <<<"$(counters)"
fio_blocks read32 --iodepth=32 --verify_only
check_phase QD32
"$Z" delete "$id"
remove_nullb "$dev"
echo "ok: linked reads verified, with reads turned away and redone"
