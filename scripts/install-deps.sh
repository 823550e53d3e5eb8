#!/usr/bin/env bash
# Installs the Debian packages zonedd's build and tests need (idempotent; root required).
#   libclang-dev: libublk-sys runs bindgen
#   qemu-system-x86, busybox-static: the VM harness (this machine's kernel has no ublk/zoned)
#   xfsprogs, fio, dmsetup, sg3-utils: used inside the VM guest
#   kmod: depmod for the VM kernel's modules, modprobe inside the guest
#   python3: JSON checks in VM scenarios (with jq)
#   dbench, jq: guest-side benchmarks (scripts/bench-vm.sh); gnuplot-nox: its plots, on the host
set -euo pipefail
pkgs=(libclang-dev qemu-system-x86 busybox-static xfsprogs fio dmsetup sg3-utils kmod dbench jq gnuplot-nox python3)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
