#!/usr/bin/env bash
# Runs one scenario as root inside the VM guest, chrooted in the host's tree (called by
# scripts/vm/init). Prints the start and result markers the host harness reads and writes the exit
# status to RESULT (a file in the host's tree, through 9p).
#   guest-run.sh NAME SCRIPT TIMEOUT_S RESULT
# The scenario sees: ZONEDD (the zonedd binary), ZONEDD_ROOT (the checkout), VM_SCRATCH (a
# guest-RAM tmpfs under /run, also TMPDIR and HOME), DM_DISABLE_UDEV=1 (the guest runs no udev),
# and the host's ZONEDD_VM_* variables.
set -uo pipefail
name=$1 script=$2 timeout=$3 result=$4

export VM_SCRATCH=/run/zonedd-vm
export TMPDIR=$VM_SCRATCH/tmp HOME=$VM_SCRATCH/home DM_DISABLE_UDEV=1
mkdir -p "$TMPDIR" "$HOME" /run/lock
# ZONEDD_VM_* variables of the host harness's environment (written next to RESULT).
env_file=$(dirname "$result")/env
# shellcheck disable=SC1090
[ ! -f "$env_file" ] || source "$env_file"

# configfs (null_blk's interface) is a module in this kernel.
if modprobe configfs && ! mountpoint -q /sys/kernel/config; then
    mount -t configfs configfs /sys/kernel/config || echo "guest-run: cannot mount configfs" >&2
fi

uptime_s() { cut -d' ' -f1 /proc/uptime; }

cd "$VM_SCRATCH"
echo
echo "ZONEDD-SCENARIO $name start uptime=$(uptime_s) kernel=$(uname -r)"
timeout -k 10 "$timeout" bash "$script" </dev/null
rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "guest-run: $name timed out after ${timeout} s" >&2
    rc=124
fi
echo "rc=$rc" >"$result" || echo "guest-run: cannot write $result" >&2
sync
echo
echo "ZONEDD-SCENARIO $name rc=$rc uptime=$(uptime_s)"
