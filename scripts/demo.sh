#!/usr/bin/env bash
# zonedd's main job on any machine: an emulated SMR disk, formatted, exposed as /dev/ublkbN, xfs
# on top, files copied in, status shown, everything removed again (scripts/vm/demo-steps.sh).
# On a kernel with ublk (/dev/ublk-control, or `modprobe ublk_drv` works) it runs here, as root;
# elsewhere it runs the same steps in the VM of scripts/vm-test.sh (Debian's 6.12 kernel in qemu).
#   scripts/demo.sh [--vm] [--no-build]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
force_vm=0
build=1
for a in "$@"; do
    case $a in
    --vm) force_vm=1 ;;
    --no-build) build=0 ;;
    -h | --help)
        sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "demo: unknown argument $a (try --help)" >&2
        exit 2
        ;;
    esac
done
[ -z "${ZONEDD:-}" ] || build=0

# Set-up first: the Debian packages the build and the VM need (quick when none is missing; only
# an install needs root).
"$ROOT/scripts/install-deps.sh"

if [ "$build" = 1 ]; then
    echo "demo: cargo build --release -p zonedd"
    (cd "$ROOT" && cargo build --release -p zonedd)
fi

if [ "$force_vm" = 0 ] && { [ -c /dev/ublk-control ] || modprobe ublk_drv 2>/dev/null; } &&
    [ -c /dev/ublk-control ]; then
    [ "$(id -u)" = 0 ] || {
        echo "demo: run as root (ublk devices, mkfs, mount)" >&2
        exit 1
    }
    echo "demo: this kernel has ublk: running here"
    export ZONEDD_ROOT=$ROOT
    exec bash "$ROOT/scripts/vm/demo-steps.sh"
fi

echo "demo: this kernel has no ublk: running in the VM (first run downloads a kernel)"
# shellcheck source=scripts/vm/lib.sh
source "$ROOT/scripts/vm/lib.sh"
vm_prepare
vm_run demo "$ROOT/scripts/vm/demo-steps.sh" "${VM_TEST_TIMEOUT:-600}"
case $VM_RC in
0) echo "demo: passed in the VM (${VM_WALL_S} s)" ;;
124) vm_die "the demo timed out in the VM" ;;
125) vm_die "the VM never reported a result; see $VM_RUNS/demo/console.log" ;;
*) vm_die "the demo failed in the VM (exit $VM_RC)" ;;
esac
