#!/usr/bin/env bash
# Installs the Debian packages zonedd's build and tests need. Idempotent, and quick when nothing is
# missing (one dpkg-query), so scripts/demo.sh and scripts/test.sh run it themselves; only an
# install needs root: as another user it says what is missing in one line and exits 1.
#   scripts/install-deps.sh [--check]     --check: exit 1 (and name them) if any are missing
#   libclang-dev: libublk-sys runs bindgen
#   qemu-system-x86, busybox-static: the VM harness (this machine's kernel has no ublk/zoned)
#   xfsprogs, fio, dmsetup, sg3-utils: used inside the VM guest
#   kmod: depmod for the VM kernel's modules, modprobe inside the guest
#   python3: JSON checks in VM scenarios (with jq)
#   dbench, jq: guest-side benchmarks (scripts/bench-vm.sh); gnuplot-nox: its plots, on the host
#   systemd: systemd-analyze, which checks the unit (tests/cli_daemon.rs); nothing is started
#   dpkg-dev: dpkg-shlibdeps, the package's library dependencies (scripts/package.sh)
#   btrfs-progs: btrfs zoned on an exposed image, the kernel's zone append user (tests/vm/expose.sh)
#   autoconf automake libtool libtool-bin xfslibs-dev uuid-dev libaio-dev libacl1-dev libattr1-dev
#   liburing-dev: building xfstests (scripts/xfstests-build.sh: fsx, fsstress and their AIO and
#   io_uring paths); gawk attr acl uuid-runtime: tools its tests run (tests/vm/xfstests.sh)
#   dm-zoned-tools (dmzadm: tests/vm/dmzadm-multi.sh, dmzoned-multi.sh): not in Debian 12; on
#   bookworm it comes from trixie, through an apt source pinned at priority 100 (so that nothing
#   else is ever taken from trixie) and `apt-get install dm-zoned-tools/trixie` (only that package
#   from there; its dependencies are bookworm's). Elsewhere it is an ordinary package.
set -euo pipefail
pkgs=(libclang-dev qemu-system-x86 busybox-static xfsprogs fio dmsetup sg3-utils kmod dbench jq
    gnuplot-nox python3 systemd dpkg-dev btrfs-progs
    autoconf automake libtool libtool-bin xfslibs-dev uuid-dev libaio-dev libacl1-dev
    libattr1-dev liburing-dev gawk attr acl uuid-runtime dm-zoned-tools)
check=0
case ${1:-} in
--check) check=1 ;;
"") ;;
*)
    echo "install-deps: unknown argument $1 (usage: install-deps.sh [--check])" >&2
    exit 2
    ;;
esac

# One query for all: installed packages print "NAME install ok installed".
installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${pkgs[@]}" 2>/dev/null || true)
missing=()
for p in "${pkgs[@]}"; do
    grep -qx "$p install ok installed" <<<"$installed" || missing+=("$p")
done
[ ${#missing[@]} -gt 0 ] || exit 0
if [ "$check" = 1 ]; then
    echo "install-deps: missing ${missing[*]}"
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing Debian packages ${missing[*]}: run scripts/install-deps.sh as root (sudo) once" >&2
    exit 1
fi
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
trixie_pin=/etc/apt/preferences.d/zonedd-trixie
if [ "$codename" = bookworm ] && [[ " ${missing[*]} " == *" dm-zoned-tools "* ]]; then
    # One source for trixie, pinned low: apt takes from it only what is asked by name.
    if [ ! -f "$trixie_pin" ]; then
        uri=$(awk '/^URIs:/ && $2 ~ /debian\/?$/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null)
        [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' \
            /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
        echo "install-deps: adding apt source trixie (pinned at 100) on ${uri:=http://deb.debian.org/debian}"
        {
            echo "# Added by zonedd's scripts/install-deps.sh for dm-zoned-tools only (pinned low)."
            echo "Types: deb"
            echo "URIs: $uri"
            echo "Suites: trixie"
            echo "Components: main"
            [ ! -f /usr/share/keyrings/debian-archive-keyring.gpg ] ||
                echo "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
        } >/etc/apt/sources.list.d/zonedd-trixie.sources
        printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' >"$trixie_pin"
    fi
    for i in "${!missing[@]}"; do
        [ "${missing[$i]}" != dm-zoned-tools ] || missing[$i]=dm-zoned-tools/trixie
    done
fi
echo "install-deps: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
