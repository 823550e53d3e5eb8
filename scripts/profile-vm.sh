#!/usr/bin/env bash
# Where the time goes in the VM: runs scripts/bench/profile-guest.sh in one guest boot
# (perf record -a -g while fio writes to zonedd's /dev/ublkbN on a null_blk zoned device:
# 1 MiB sequential writes QD8, and 4 KiB writes with fsync QD1) and leaves the perf
# summaries (by thread, by symbol), fio JSON and zonedd status in
# target/bench-vm/profile-<UTC stamp>/. Needs the host's `perf` (Debian: linux-perf).
#   scripts/profile-vm.sh [--seconds N] [--only "NAME..." of seqwrite|fsync|fsync-floor|randread|randread-qd1|randread-qd1-floor|randwrite-conv|randwrite|randwrite-log]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
# shellcheck source=scripts/vm/lib.sh
source "$ROOT/scripts/vm/lib.sh"
secs=15 only=""
while [ $# -gt 0 ]; do
    case $1 in
    --seconds) secs=$2 && shift ;;
    --only) only=$2 && shift ;;
    *) vm_die "unknown argument $1" ;;
    esac
    shift
done
command -v perf >/dev/null || vm_die "perf not found: apt install linux-perf"
vm_prepare
(cd "$ROOT" && cargo build --release -p zonedd) || vm_die "building zonedd failed"
out=$VM_TARGET_DIR/bench-vm/profile-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
cp "$ZONEDD" "$out/zonedd"
scenario=$out/profile.sh
cat >"$scenario" <<EOS
#!/usr/bin/env bash
export ZONEDD=$(vm_shq "$out/zonedd")
exec bash $(vm_shq "$ROOT/scripts/bench/profile-guest.sh") --out $(vm_shq "$out") --seconds $secs ${only:+--only $(vm_shq "$only")}
EOS
vm_run profile-vm "$scenario" 600 "${VM_MEMORY:-5G}"
cp "$VM_RUNS/profile-vm/console.log" "$out/console.log" 2>/dev/null || true
vm_log "profile: guest exited $VM_RC; results in $out"
[ "$VM_RC" = 0 ]
