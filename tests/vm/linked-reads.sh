#!/usr/bin/env bash
# Hop-free reads whose commit is linked behind their device read (docs/design.md, "Hop-free
# reads"; issue 13). On a null_blk zoned device whose hardware queue takes 2 requests, 4 KiB
# reads at QD32 are mostly turned away at once (`-EAGAIN`: they are RWF_NOWAIT), and the
# kernel cancels the COMMIT_AND_FETCH linked behind each of them; every such read must be
# redone and return what was written. fio writes 32 MiB of random 4 KiB blocks, then reads
# every block back and checks it (crc32c), at QD1 and at QD32. Fails unless each read phase
# ran linked reads, the QD32 phase had reads turned away, and nothing failed.
#   scripts/vm-test.sh --no-build linked-reads
# vm-timeout: 300
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
dev=$(NULLB_HW_QUEUE_DEPTH=2 make_nullb nullb0 512 16 8)
out=$("$Z" create --backend "$dev" --format --queues 1 --depth 64)
bdev=$(sed -n 1p <<<"$out")
id=$(sed -n 's/^id //p' <<<"$out")
[ -b "$bdev" ] && [ -n "$id" ] || vm_fail "create printed: $out"

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

for qd in 1 32; do
    vm_step "read every block back at QD$qd and check it"
    fio_blocks "read$qd" --iodepth="$qd" --verify_only
    read -r l1 a1 e1 t1 r1 <<<"$(counters)"
    echo "QD$qd: reads $((r1 - r0)), linked $((l1 - l0)), turned away $((a1 - a0)), hop-free retries $t1"
    [ "$e1" = 0 ] || vm_fail "QD$qd: $e1 requests failed"
    [ $((l1 - l0)) -gt 0 ] || vm_fail "QD$qd: no read was linked to its commit"
    if [ "$qd" = 32 ]; then
        [ $((a1 - a0)) -gt 0 ] || vm_fail "QD32 on a 2-deep queue: no read was turned away"
    fi
    l0=$l1 a0=$a1 r0=$r1
done
"$Z" delete "$id"
remove_nullb "$dev"
echo "ok: linked reads verified, with reads turned away and redone"
