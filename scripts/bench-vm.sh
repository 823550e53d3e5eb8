#!/usr/bin/env bash
# Benchmarks zonedd against the kernel's dm-zoned and the raw zoned device, side by side, in the
# VM harness's guest (Debian 6.12 under qemu; see docs/vm-testing.md), then turns the results into
# the tables and PNG plots of docs/PERFORMANCE.md on the host (gnuplot; plotting never runs in the
# guest).
#
#   scripts/bench-vm.sh [--quick] [--no-build] [--targets "raw dm zd-percpu zd-unbound8"]
#                       [--no-docs] [--report-only DIR] [--device nullb|hdd]
#                       [--hdd-params "K=V ..."] [--phases "block fs"] [--runs N] [--fill-pct P]
#                       [--settle-cap S] [--timeout S] [--no-dbench] [--zones N] [--ow-s S]
#                       [--stable-s S] [--zone-mb M] [--ow-mb N]
#
#   --quick        tiny sizes and a few seconds per job: tests the plumbing (a few minutes)
#   --no-build     use the existing target/release/zonedd
#   --no-docs      write the report into the results folder only, leave docs/ alone
#   --report-only  redo the host side (tables, plots) for an earlier results folder
#   --device       the zoned device under every target: a memory null_blk (nullb, the default:
#                  CPU per request) or `zonedd expose --timing hdd` on an emulated SMR image in
#                  guest RAM (hdd: the HDD model of docs/hdd-model.md; --hdd-params K=V ...
#                  overrides its parameters); targets zd-unboundN take --pool unbound:N,
#                  zd-*-nobatch run with ZONEDD_BATCH_SYNC=0 (a log write per write),
#                  zd-*-base with the build given to --base
#   --base BIN     another zonedd build for the zd-*-base targets (an A/B in one boot)
#   --phases       "block" (fio on the device), "fs" (xfs: dbench, fill, overwrites, umount,
#                  reclaim settle), or both (the default)
#   --runs N       the xfs phase N times per target, interleaved; the report adds median
#                  [min-max] per target and ratios of medians (issue 15's seed experiment:
#                  --device hdd --phases fs --runs 3 --targets "dm zd-percpu zd-unbound8
#                  zd-unbound64")
#   --fill-pct P   fill xfs to P % before the overwrites (default 70)
#   --settle-cap S longest wait for reclaim to settle after umount (default 150 s)
#   --stable-s S   reclaim counts as settled after S s without change (default 25: more than
#                  the 10 s of idleness both reclaims wait for)
#   --zones N      zones of the device (default 24 of 64 MiB, 6 conventional)
#   --zone-mb M    their size (default 64)
#   --ow-s S       seconds of 4 KiB random overwrites inside the files (default 15)
#   --ow-mb N      N MiB of them instead (the same writeback for every run and target; the
#                  seed experiment wants this; its timeout stays --ow-s + 90 s)
#   --timeout S    the guest's limit (default 2400 s, 900 with --quick)
#   --no-dbench    leave dbench out of the xfs phase
#
# Results: target/bench-vm/<UTC timestamp>[-quick]/ (results.tsv, fio JSON, per-second logs,
# status snapshots, console.log, host.txt with the host's load). The full run takes about 30
# minutes of guest time (--quick about 12); VM_MEMORY (default 5G here) sizes the guest (null_blk
# lives in its RAM).
# Without --no-docs a full (non-quick) run rewrites the "VM benchmarks" section of
# docs/PERFORMANCE.md and docs/perf-*.png; a quick run never touches docs/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
# shellcheck source=scripts/vm/lib.sh
source "$ROOT/scripts/vm/lib.sh"

quick=0 build=1 docs=1 report_only="" base_bin="" targets="raw dm zd-percpu zd-unbound8"
guest_args=() timeout_s=""
[ -z "${ZONEDD:-}" ] || build=0
while [ $# -gt 0 ]; do
    case $1 in
    --quick) quick=1 ;;
    --no-build) build=0 ;;
    --no-docs) docs=0 ;;
    --targets) targets=$2 && shift ;;
    --base) base_bin=$(realpath "$2") && shift ;;
    --report-only) report_only=$2 && shift ;;
    --device | --hdd-params | --phases | --runs | --fill-pct | --settle-cap | --zones | --zone-mb | --ow-s | --ow-mb | --stable-s)
        [ $# -ge 2 ] || vm_die "$1 needs a value (see --help)"
        guest_args+=("$1" "$2") && shift
        ;;
    --timeout) timeout_s=$2 && shift ;;
    --no-dbench) guest_args+=("$1") ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *) vm_die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
[ "$quick" = 0 ] || docs=0

report() { # report DIR
    local args=("$1")
    [ "$docs" = 1 ] && args+=(--docs "$ROOT/docs")
    python3 "$ROOT/scripts/bench/report.py" "${args[@]}"
}

if [ -n "$report_only" ]; then
    [ -f "$report_only/results.tsv" ] || vm_die "$report_only has no results.tsv"
    report "$(cd "$report_only" && pwd -P)"
    exit 0
fi

command -v gnuplot >/dev/null || vm_die "gnuplot not found: run scripts/install-deps.sh (gnuplot-nox)"
vm_prepare
if [ "$build" = 1 ]; then
    vm_log "cargo build --release -p zonedd"
    (cd "$ROOT" && cargo build --release -p zonedd) || vm_die "building zonedd failed"
fi
[ -x "$ZONEDD" ] || vm_die "$ZONEDD does not exist (cargo build --release -p zonedd)"

stamp=$(date -u +%Y%m%dT%H%M%SZ)
[ "$quick" = 0 ] || stamp=$stamp-quick
out=$VM_TARGET_DIR/bench-vm/$stamp
mkdir -p "$out"
# A private copy: others may rebuild target/release/zonedd while the guest runs.
cp "$ZONEDD" "$out/zonedd"
ZONEDD=$out/zonedd
base_export=""
if [ -n "$base_bin" ]; then
    cp "$base_bin" "$out/zonedd-base"
    base_export="export ZONEDD_BENCH_BASE=$(vm_shq "$out/zonedd-base")"
fi
{
    echo "started $(date -u +%FT%TZ)"
    echo "host_uptime_before $(uptime)"
    echo "host_cpus $(nproc)"
    echo "zonedd_commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?') (HEAD when the run started)"
    echo "zonedd_binary built $(date -u -r "$ZONEDD" +%FT%TZ), sha256 $(sha256sum "$ZONEDD" | cut -c1-16)"
    [ -z "$base_bin" ] || echo "zonedd_base $base_bin, sha256 $(sha256sum "$base_bin" | cut -c1-16)"
} >"$out/host.txt"

# The guest runs a one-line scenario that calls the guest-side script with our arguments.
scenario=$out/bench-vm.sh
qargs=""
[ "$quick" = 0 ] || qargs="--quick"
cat >"$scenario" <<EOF
#!/usr/bin/env bash
$base_export
exec bash $(vm_shq "$ROOT/scripts/bench/guest.sh") --out $(vm_shq "$out") --targets $(vm_shq "$targets") $qargs $(for a in "${guest_args[@]}"; do printf '%s ' "$(vm_shq "$a")"; done)
EOF
if [ -z "$timeout_s" ]; then
    timeout_s=2400
    [ "$quick" = 0 ] || timeout_s=900
fi
vm_log "bench: results in $out (load: $(cut -d' ' -f1-3 /proc/loadavg))"
name=bench-vm
[ "$quick" = 0 ] || name=bench-vm-quick
vm_run "$name" "$scenario" "$timeout_s" "${VM_MEMORY:-5G}"
cp "$VM_RUNS/$name/console.log" "$out/console.log" 2>/dev/null || true
{
    echo "host_uptime_after $(uptime)"
    echo "vm_rc $VM_RC"
    echo "vm_wall_s $VM_WALL_S"
} >>"$out/host.txt"
vm_log "bench: guest exited $VM_RC after ${VM_WALL_S} s"
[ -s "$out/results.tsv" ] || vm_die "the guest wrote no results (see $out/console.log)"
report "$out"
[ "$VM_RC" = 0 ] || vm_die "the guest run failed (exit $VM_RC); partial results reported"
