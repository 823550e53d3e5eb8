#!/usr/bin/env bash
# Interop with the kernel's dm-zoned, both ways, on a null_blk host-managed disk (48 x 64 MiB
# zones, 24 conventional):
#   1. `zonedd format`, then one `zonedd engine-io` session writes generated data into several
#      chunks: streaming writes from a chunk's start (straight to a sequential zone) and
#      appends at its write pointer, unaligned starts (conventional zones), an overwrite inside
#      a sequential chunk (a buffer zone), a write across a chunk boundary, FUA; closed.
#   2. `dmsetup create ... zoned` accepts it with the same capacity; every range reads back
#      identical through /dev/mapper with O_DIRECT, unwritten ones as zeros.
#   3. The kernel writes: overwrites of zonedd-written ranges, new chunks, unaligned writes;
#      `dmsetup remove`; `zonedd check` is clean on what the kernel committed.
#   4. Everything reads back identical through `zonedd engine-io`; `zonedd check` clean again.
#   5. zonedd overwrites some kernel-written data and reclaims everything; the kernel loads
#      that and reads it all back identical.
# Data is `zonedd engine-io pattern` output (a hash of seed and absolute offset, so a block in
# the wrong place never matches; seed 0 = zeros). On the kernel side one write and one read go
# through dd (O_DIRECT), the rest through `zonedd engine-io --raw /dev/mapper/...` (O_DIRECT,
# no engine), which runs many steps in one process.
# vm-timeout: 420
# vm-memory: 2G
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
t0=$SECONDS
K=1024
M=$((1024 * K))
C=$((64 * M)) # chunk = zone size
name=dmzi
dm=/dev/mapper/$name

step() { vm_step "[$((SECONDS - t0)) s] $*"; }

cleanup() {
    dmsetup remove "$name" 2>/dev/null || true
    [ -z "${nb:-}" ] || remove_nullb "$nb" 2>/dev/null || true
}
trap cleanup EXIT

step "null_blk: 48 x 64 MiB zones, 24 conventional"
nb=$(make_nullb "$name" $((48 * 64)) 64 24)
zone_sectors=$(cat "/sys/block/${nb#/dev/}/queue/chunk_sectors")
[ "$zone_sectors" = $((C / 512)) ] || vm_fail "zone size is $zone_sectors sectors, not $((C / 512))"

step "zonedd format"
"$Z" format --backend "$nb" --label interop --reserved-seq 4
nr_chunks=$("$Z" check "$nb" --json | jq -er .summary.nr_chunks)
[ "$nr_chunks" = 42 ] || vm_fail "expected 48 - 2 metadata - 4 reserved = 42 chunks, check says $nr_chunks"

# Writes through zonedd: OFFSET LEN SEED [--fua|--flush], in order.
zd_writes=(
    "0 $((12 * M)) 1"                        # chunk 0 from its start: a sequential zone
    "$((12 * M)) $((4 * M)) 2 --fua"         # appended at its write pointer
    "$((C + M + 12 * K)) $((2 * M)) 3"       # chunk 1, unaligned start: a conventional zone
    "$((2 * C)) $((4 * M)) 4"                # chunk 2 streamed...
    "$((2 * C + M)) $((256 * K)) 5 --flush"  # ...then overwritten inside: its buffer zone
    "$((3 * C + 4 * K)) $((4 * K)) 9"        # one block in chunk 3
    "$((5 * C + 4 * M)) $((4 * M)) 6 --fua"  # chunk 5, FUA
    "$((16 * C + 63 * M)) $((2 * M)) 7"      # across chunks 16 and 17
    "$((17 * C + M)) $((2 * M)) 8"           # appended in chunk 17
)
# What the volume holds afterwards: OFFSET LEN SEED ranges (seed 0: zeros).
after_zd=(
    "$((12 * M)) $((4 * M)) 2" "0 $((12 * M)) 1" "$((16 * M)) $M 0"
    "$((C + M)) $((12 * K)) 0" "$((C + M + 12 * K)) $((2 * M)) 3" "$((C + 3 * M + 12 * K)) $((M - 12 * K)) 0"
    "$((2 * C)) $M 4" "$((2 * C + M)) $((256 * K)) 5" "$((2 * C + M + 256 * K)) $((3 * M - 256 * K)) 4"
    "$((2 * C + 4 * M)) $M 0"
    "$((3 * C)) $((4 * K)) 0" "$((3 * C + 4 * K)) $((4 * K)) 9" "$((3 * C + 8 * K)) $((4 * K)) 0"
    "$((5 * C + 3 * M)) $M 0" "$((5 * C + 4 * M)) $((4 * M)) 6" "$((5 * C + 8 * M)) $M 0"
    "$((8 * C)) $M 0" "$((10 * C)) $M 0"
    "$((16 * C + 62 * M)) $M 0" "$((16 * C + 63 * M)) $((2 * M)) 7" "$((17 * C + M)) $((2 * M)) 8"
    "$((17 * C + 3 * M)) $M 0" "$((nr_chunks * C - M)) $M 0"
)
# Writes through dm-zoned.
dm_writes=(
    "$((2 * C)) $((512 * K)) 22"                  # over chunk 2's start
    "$((4 * M)) $M 21"                            # inside zonedd's sequential chunk 0
    "$((C + M + 12 * K)) $((4 * K)) 23"           # first block of zonedd's range in chunk 1
    "$((8 * C)) $((8 * M)) 24"                    # a new chunk, streamed
    "$((9 * C + 3 * M + 4 * K)) $((64 * K)) 25"   # a new chunk, unaligned
    "$((17 * C + 2 * M)) $((128 * K)) 26"         # inside chunk 17's sequential data
    "$((2 * C + M + 128 * K)) $((256 * K)) 27"    # across zonedd's overwrite in chunk 2
    "$((5 * C + 4 * M)) $M 28"                    # over chunk 5's FUA write
)
final=(
    "0 $((4 * M)) 1" "$((4 * M)) $M 21" "$((5 * M)) $((7 * M)) 1" "$((12 * M)) $((4 * M)) 2" "$((16 * M)) $M 0"
    "$((C + M)) $((12 * K)) 0" "$((C + M + 12 * K)) $((4 * K)) 23"
    "$((C + M + 16 * K)) $((2 * M - 4 * K)) 3" "$((C + 3 * M + 12 * K)) $((M - 12 * K)) 0"
    "$((2 * C)) $((512 * K)) 22" "$((2 * C + 512 * K)) $((512 * K)) 4" "$((2 * C + M)) $((128 * K)) 5"
    "$((2 * C + M + 128 * K)) $((256 * K)) 27" "$((2 * C + M + 384 * K)) $((3 * M - 384 * K)) 4"
    "$((2 * C + 4 * M)) $M 0"
    "$((3 * C)) $((4 * K)) 0" "$((3 * C + 4 * K)) $((4 * K)) 9" "$((3 * C + 8 * K)) $((4 * K)) 0"
    "$((5 * C + 3 * M)) $M 0" "$((5 * C + 4 * M)) $M 28" "$((5 * C + 5 * M)) $((3 * M)) 6"
    "$((5 * C + 8 * M)) $M 0"
    "$((8 * C)) $((8 * M)) 24" "$((8 * C + 8 * M)) $M 0"
    "$((9 * C + 3 * M)) $((4 * K)) 0" "$((9 * C + 3 * M + 4 * K)) $((64 * K)) 25"
    "$((9 * C + 3 * M + 68 * K)) $((M - 68 * K)) 0" "$((10 * C)) $M 0"
    "$((16 * C + 62 * M)) $M 0" "$((16 * C + 63 * M)) $((2 * M)) 7" "$((17 * C + M)) $M 8"
    "$((17 * C + 2 * M)) $((128 * K)) 26" "$((17 * C + 2 * M + 128 * K)) $((M - 128 * K)) 8"
    "$((17 * C + 3 * M)) $M 0" "$((nr_chunks * C - M)) $M 0"
)

pattern() { "$Z" engine-io pattern --pattern "$3" --offset "$1" --len "$2"; }

# to_script OP RANGE...: engine-io script lines, one a range (OFFSET LEN SEED [FLAG]).
to_script() {
    local op=$1 r off len seed flag
    shift
    for r in "$@"; do
        read -r off len seed flag <<<"$r"
        echo "$op --offset $off --len $len --pattern $seed ${flag:-}"
    done
}

# dm_expect RANGE...: every range reads back identical through dm-zoned with O_DIRECT: the
# first with dd and cmp, all of them in one `engine-io --raw` process (a process costs a second
# or more of guest time under software emulation).
dm_expect() {
    local off len seed want=$VM_SCRATCH/want.bin
    read -r off len seed <<<"$1"
    pattern "$off" "$len" "$seed" >"$want"
    dd if="$dm" bs=1M iflag=direct,skip_bytes,count_bytes skip="$off" count="$len" status=none |
        cmp - "$want" || vm_fail "dm-zoned: dd: $len bytes at $off are not pattern $seed"
    to_script read "$@" >"$VM_SCRATCH/dm-verify.txt"
    "$Z" engine-io --raw "$dm" --script "$VM_SCRATCH/dm-verify.txt" ||
        vm_fail "dm-zoned: a range read back differs"
}

# zd_expect RANGE...: one engine-io session reads every range and compares.
zd_expect() {
    to_script read "$@" >"$VM_SCRATCH/zd-verify.txt"
    "$Z" engine-io --backend "$nb" --script "$VM_SCRATCH/zd-verify.txt" ||
        vm_fail "zonedd: a range read back differs"
}

step "zonedd engine-io: ${#zd_writes[@]} writes in one session"
to_script write "${zd_writes[@]}" >"$VM_SCRATCH/zd-writes.txt"
"$Z" engine-io --backend "$nb" --script "$VM_SCRATCH/zd-writes.txt"
"$Z" check "$nb" >/dev/null || vm_fail "zonedd check after zonedd's writes"
t1=$SECONDS

step "dmsetup create: 0 $((nr_chunks * zone_sectors)) zoned $nb"
modprobe dm-zoned
dmsetup create "$name" --table "0 $((nr_chunks * zone_sectors)) zoned $nb"
dmsetup status "$name"
size=$(blockdev --getsz "$dm")
[ "$size" = $((nr_chunks * zone_sectors)) ] || vm_fail "dm-zoned exposes $size sectors, zonedd $((nr_chunks * zone_sectors))"

step "read back through dm-zoned: ${#after_zd[@]} ranges"
dm_expect "${after_zd[@]}"

step "dm-zoned writes: ${#dm_writes[@]}"
# The first with dd, the others in one `engine-io --raw` process.
read -r off len seed <<<"${dm_writes[0]}"
pattern "$off" "$len" "$seed" |
    dd of="$dm" bs=1M iflag=fullblock oflag=direct,seek_bytes seek="$off" status=none
to_script write "${dm_writes[@]:1}" >"$VM_SCRATCH/dm-writes.txt"
"$Z" engine-io --raw "$dm" --script "$VM_SCRATCH/dm-writes.txt"
sync
step "read back through dm-zoned: ${#final[@]} ranges"
dm_expect "${final[@]}"
step "dmsetup remove"
dmsetup remove "$name"
dmesg | grep -i 'dm-zoned\|dmz' | tail -n 5 || true
t2=$SECONDS
step "zonedd check"
"$Z" check "$nb" || vm_fail "zonedd check on what dm-zoned committed"

step "read back through zonedd: ${#final[@]} ranges"
zd_expect "${final[@]}"
"$Z" check "$nb" >/dev/null || vm_fail "zonedd check after zonedd reopened it"
t3=$SECONDS

# 5. zonedd overwrites kernel-written data and reclaims everything (buffered chunks merged,
# conventional data zones moved to sequential ones); the kernel loads the result and reads
# it back identical.
final2=()
for r in "${final[@]}"; do
    case $r in
    "$((8 * C)) $((8 * M)) 24")
        final2+=("$((8 * C)) $((2 * M)) 24" "$((8 * C + 2 * M)) $M 31" "$((8 * C + 3 * M)) $((5 * M)) 24")
        ;;
    "$((9 * C + 3 * M + 4 * K)) $((64 * K)) 25") final2+=("$((9 * C + 3 * M + 4 * K)) $((64 * K)) 32") ;;
    *) final2+=("$r") ;;
    esac
done
[ ${#final2[@]} = $((${#final[@]} + 2)) ] || vm_fail "final2 is not final with two changes"
step "zonedd: overwrite kernel-written data, reclaim, read back"
{
    to_script write "$((8 * C + 2 * M)) $M 31" "$((9 * C + 3 * M + 4 * K)) $((64 * K)) 32"
    echo reclaim
    to_script read "${final2[@]}"
} >"$VM_SCRATCH/zd-reclaim.txt"
"$Z" engine-io --backend "$nb" --script "$VM_SCRATCH/zd-reclaim.txt" ||
    vm_fail "zonedd: overwrite + reclaim + read back"
step "dm-zoned loads the reclaimed volume: ${#final2[@]} ranges"
dmsetup create "$name" --table "0 $((nr_chunks * zone_sectors)) zoned $nb"
dmsetup status "$name"
dm_expect "${final2[@]}"
step "dmsetup remove"
dmsetup remove "$name"
# Known engine bug (tests/cli_engine_io.rs reclaimed_volume_checks_clean): reclaim leaves the
# sequential zones it frees un-reset. Any other finding fails the scenario.
if ! out=$("$Z" check "$nb" --json 2>/dev/null); then
    other=$(jq -r '.errors[] | select(.kind != "unmapped-seq-not-empty") | .message' <<<"$out")
    [ -z "$other" ] || vm_fail "zonedd check after reclaim: $other"
    echo "KNOWN ENGINE BUG: $(jq -r '.errors | length' <<<"$out") freed sequential zone(s) not reset after reclaim:"
    jq -r '.errors[].message' <<<"$out"
fi
t4=$SECONDS
echo "dmzoned-interop: ok (zonedd writes $((t1 - t0)) s, dm-zoned $((t2 - t1)) s," \
    "zonedd reads $((t3 - t2)) s, zonedd reclaim + dm-zoned reads $((t4 - t3)) s, total $((t4 - t0)) s guest time)"
