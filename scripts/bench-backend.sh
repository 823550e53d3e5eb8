#!/usr/bin/env bash
# Sequential throughput of the emulated SMR backend against dd on the same kind of file.
#
#   scripts/bench-backend.sh [MiB]        (default 1024; ZBD_BENCH_DIR picks the directory)
#
# 1. dd: 1 MiB writes + fdatasync into a plain file, then 1 MiB reads of it (page cache).
# 2. benches/backend.rs: the same pattern through zbd::Emulated and through plain
#    pwrite/pread, best of ZBD_BENCH_RUNS (default 5), with the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
mib=${1:-1024}
dir=${ZBD_BENCH_DIR:-${TMPDIR:-/tmp}}
tmp=$(mktemp -d "$dir/bench-backend.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

rate() { # bytes seconds -> MiB/s
    awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / 1048576 / s }'
}
now() { date +%s.%N; }
dd_pass() {
    rm -f "$tmp/dd"
    local t0 t1 t2
    t0=$(now)
    dd if=/dev/zero of="$tmp/dd" bs=1M count="$mib" conv=fdatasync status=none
    t1=$(now)
    dd if="$tmp/dd" of=/dev/null bs=1M status=none
    t2=$(now)
    echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}') $(awk -v a="$t1" -v b="$t2" 'BEGIN{print b-a}')"
}

best_w=999999 best_r=999999
for _ in 1 2 3; do
    read -r w r < <(dd_pass)
    best_w=$(awk -v a="$w" -v b="$best_w" 'BEGIN{print (a<b)?a:b}')
    best_r=$(awk -v a="$r" -v b="$best_r" 'BEGIN{print (a<b)?a:b}')
done
bytes=$((mib << 20))
echo "dd bs=1M count=$mib conv=fdatasync: $(rate $bytes "$best_w") MiB/s write+fdatasync," \
    "$(rate $bytes "$best_r") MiB/s read (cached), best of 3"
rm -f "$tmp/dd"

ZBD_BENCH_MIB=$mib ZBD_BENCH_DIR=$tmp cargo bench -q -p zonedd --bench backend
