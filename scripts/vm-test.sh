#!/usr/bin/env bash
# Runs zonedd's VM scenarios on a real kernel that has ublk, null_blk, scsi_debug and dm-zoned (this
# machine's own kernel has none of them): Debian's 6.12 backports kernel under qemu (software
# emulation), the host's / shared into the guest over 9p, one boot per scenario.
#
#   scripts/vm-test.sh [--no-build] [SCENARIO...]
#   ZONEDD_VM_KERNEL=7.3 scripts/vm-test.sh ...    # on trixie-backports' 7.3 kernel instead
#
# SCENARIO is a name from tests/vm/ (`kernel-smoke`) or the path of a script; with none, every
# tests/vm/*.sh runs. The first run downloads and unpacks the kernel into target/vm/ (cached);
# zonedd is built with `cargo build --release -p zonedd` unless --no-build (or VM_TEST_NO_BUILD=1,
# or ZONEDD=/path/to/zonedd). Exit status: 0 when every scenario passed. Each scenario's console is
# streamed and kept in target/vm/runs/NAME/console.log (target/vm/runs-7.3/ for 7.3).
# VM_TEST_SELFTEST_FAIL=1 adds a scenario that fails, to show that a failure fails the run.
#
# Adding a scenario: write tests/vm/NAME.sh, a bash script that checks one thing and exits non-zero
# when it is wrong. It runs as root in the guest, chrooted in the host's /, with the guest kernel's
# modules on /lib/modules (modprobe works), configfs mounted, no udev. Start it with a comment that
# says what it checks, then `set -euo pipefail` and
#     source "$(dirname "$0")/lib/devices.sh"    # make_nullb, make_scsi_debug_smr, zonedd_bin, ...
# Use $ZONEDD (the freshly built binary) and $VM_SCRATCH (guest-RAM tmpfs, also TMPDIR) for files;
# tear down what it creates. Optional header lines: `# vm-timeout: SECONDS` (default 300),
# `# vm-memory: 4G` (guest RAM; memory-backed null_blk and scsi_debug live in it) and
# `# vm-init: systemd` (boot systemd as PID 1 and run the scenario as a unit; default `chroot`:
# busybox's /init runs it). Keep it well under a minute of guest time: CI runs every scenario on a
# 2-core machine. See docs/vm-testing.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
# shellcheck source=scripts/vm/lib.sh
source "$ROOT/scripts/vm/lib.sh"
vm_trap_errors

build=1
[ -z "${VM_TEST_NO_BUILD:-}" ] || build=0
[ -z "${ZONEDD:-}" ] || build=0
args=()
while [ $# -gt 0 ]; do
    case $1 in
    --no-build) build=0 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    -*) vm_die "unknown option $1 (see --help)" ;;
    *) args+=("$1") ;;
    esac
    shift
done

# Resolve scenario names and paths to absolute script paths.
scripts=()
if [ ${#args[@]} -eq 0 ]; then
    for f in "$ROOT"/tests/vm/*.sh; do
        [ -f "$f" ] && scripts+=("$f")
    done
else
    for a in "${args[@]}"; do
        if [ -f "$a" ]; then
            scripts+=("$(cd "$(dirname "$a")" && pwd -P)/$(basename "$a")")
        elif [ -f "$ROOT/tests/vm/$a.sh" ]; then
            scripts+=("$ROOT/tests/vm/$a.sh")
        elif [ -f "$ROOT/tests/vm/$a" ]; then
            scripts+=("$ROOT/tests/vm/$a")
        else
            vm_die "no scenario '$a' (not a file, not tests/vm/$a.sh)"
        fi
    done
fi

vm_prepare
if [ -n "${VM_TEST_SELFTEST_FAIL:-}" ]; then
    selftest=$VM_CACHE/selftest-fail.sh
    printf '%s\n' '#!/usr/bin/env bash' '# Harness self-test: must be reported as a failure.' \
        'echo "selftest: failing on purpose"; exit 3' >"$selftest"
    scripts+=("$selftest")
fi
[ ${#scripts[@]} -gt 0 ] || vm_die "no scenarios in $ROOT/tests/vm"

if [ "$build" = 1 ]; then
    vm_log "cargo build --release -p zonedd"
    (cd "$ROOT" && cargo build --release -p zonedd) || vm_die "building zonedd failed"
fi
[ -x "$ZONEDD" ] || vm_log "warning: $ZONEDD does not exist; scenarios that need zonedd will fail"

# A header line `# vm-KEY: VALUE` among the first 30 lines of a scenario, or the default.
header() {
    local v
    v=$(head -n 30 "$1" | sed -n "s/^# vm-$2:[[:space:]]*\([^[:space:]]*\).*/\1/p" | head -n1)
    echo "${v:-$3}"
}

# Results on a kernel other than the default say which.
label=""
[ "$VM_SERIES" = 6.12 ] || label=" [$VM_SERIES]"
passed=0
failed=0
report=()
started=$(date +%s)
for s in "${scripts[@]}"; do
    name=$(basename "$s" .sh)
    timeout=$(header "$s" timeout "${VM_TEST_TIMEOUT:-300}")
    mem=$(header "$s" memory "${VM_MEMORY:-4G}")
    init=$(header "$s" init chroot)
    case $timeout in '' | *[!0-9]*) vm_die "$s: bad '# vm-timeout:' value '$timeout'" ;; esac
    case $init in chroot | systemd) ;; *) vm_die "$s: bad '# vm-init:' value '$init' (chroot or systemd)" ;; esac
    if [ "$init" = chroot ]; then
        vm_log "== $name$label (kernel $VM_KVER, timeout ${timeout} s, memory $mem)"
    else
        vm_log "== $name$label (kernel $VM_KVER, timeout ${timeout} s, memory $mem, init $init)"
    fi
    vm_run "$name" "$s" "$timeout" "$mem" "$init"
    case $VM_RC in
    0) verdict=PASS ;;
    124) verdict="FAIL (timed out)" ;;
    125) verdict="FAIL (the guest never reported a result; see $VM_RUNS/$name/console.log)" ;;
    *) verdict="FAIL (exit $VM_RC)" ;;
    esac
    if [ "$VM_RC" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    line=$(printf '%-28s %s  wall %ss, boot %ss' "$name$label" "$verdict" "$VM_WALL_S" "${VM_BOOT_S:-?}")
    vm_log "$line"
    report+=("$line")
done

echo
echo "vm: scenario results (kernel $VM_KVER, $(($(date +%s) - started)) s in all)"
printf '  %s\n' "${report[@]}"
echo "vm: $passed passed, $failed failed"
[ "$failed" = 0 ]
