#!/usr/bin/env bash
# Backend conformance on real zoned block devices: `zonedd conformance DEV --yes-destroy-data`
# (the zbd crate's suite: write pointer rules, zone crossing, fill/finish/reset, open/close,
# open and active limits, conventional zones, unaligned and out-of-range I/O) must pass through
# the real-device backend (zone ioctls, O_DIRECT io_uring) on
#   1. null_blk host-managed with conventional zones and no limits,
#   2. null_blk with zone_max_open 6 / zone_max_active 8 (the limit checks must run, not skip),
#   3. null_blk with a zone capacity below the zone size (like ZNS),
#   4. scsi_debug zbc=host-managed, 4 KiB sectors (an SMR disk through the SCSI stack; its
#      default open limit is 8).
# 16 MiB zones keep the zone fills short under software emulation.
# vm-timeout: 300
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)

# conformance DEV LABEL [CHECK...]: run the suite; each CHECK (a substring of a check's name)
# must have PASSed, not been skipped. Failures are collected so that every device gets its run.
failures=()
conformance() {
    local dev=$1 label=$2 out rc=0 c
    shift 2
    vm_step "conformance: $label ($dev)"
    out=$("$Z" conformance "$dev" --yes-destroy-data 2>&1) || rc=$?
    echo "$out"
    if [ "$rc" != 0 ]; then
        failures+=("$label: zonedd conformance exited $rc")
    elif ! grep -Eq '^[0-9]+ passed, 0 failed' <<<"$out"; then
        failures+=("$label: no '0 failed' summary")
    fi
    for c in "$@"; do
        grep -F "PASS " <<<"$out" | grep -F -- "$c" >/dev/null || failures+=("$label: check '$c' did not pass")
    done
}

nullb=$(make_nullb nullb0 512 16 4)
conformance "$nullb" "null_blk, 4 conventional zones" "conventional zones take random writes"
remove_nullb "$nullb"

nullb=$(make_nullb nullb1 512 16 4 6 8)
[ "$(cat "/sys/block/${nullb#/dev/}/queue/max_active_zones")" = 8 ] || vm_fail "max_active not set"
conformance "$nullb" "null_blk, max open 6 / max active 8" \
    "max-open: implicit open" "max-open: explicit opens" "max-active: opening beyond"
remove_nullb "$nullb"

nullb=$(make_nullb nullb2 512 16 2 0 0 12)
conformance "$nullb" "null_blk, 12 MiB capacity in 16 MiB zones" "a zone written to capacity is full"
remove_nullb "$nullb"

sd=$(make_scsi_debug_smr 256 16 2)
conformance "$sd" "scsi_debug host-managed SMR" "max-open: explicit opens" "conventional zones take random writes"
remove_scsi_debug

if [ ${#failures[@]} -gt 0 ]; then
    printf 'FAIL: %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "backend-conformance: all devices passed"
