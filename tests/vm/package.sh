#!/usr/bin/env bash
# The Debian package (scripts/package.sh) installs, works and removes cleanly with dpkg. The guest
# runs in the host's tree, so dpkg runs in a chroot on an overlay of it whose writes stay in guest
# RAM (the host's dpkg database and /usr are never touched). `dpkg -i`: /usr/sbin/zonedd runs and
# reports the version, the unit in /lib/systemd/system runs /usr/sbin/zonedd and is the one
# `install-unit` prints for that path, the modules-load.d entry names ublk_drv and
# systemd-modules-load loads it from there, the copyright file is there, and the packaged
# (stripped) binary serves a ublk device that reads back what was written. `dpkg -r`: every file
# of the package is gone and dpkg knows it no more
# (not even as removed with its configuration left). The package is $ZONEDD_VM_DEB (scripts/test.sh
# builds it) or the newest in <target>/debian/; with none it fails under CI and is skipped
# elsewhere.
# vm-timeout: 420
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)

deb=${ZONEDD_VM_DEB:-}
if [ -z "$deb" ]; then
    deb=$(ls -t "$(dirname "$(dirname "$Z")")"/debian/zonedd_*.deb 2>/dev/null | head -n1) || true
fi
if [ -z "$deb" ] || [ ! -f "$deb" ]; then
    [ -z "${CI:-}" ] || vm_fail "no package: scripts/package.sh builds it (ZONEDD_VM_DEB='${ZONEDD_VM_DEB:-}')"
    echo "package: skipped, no package built (run scripts/package.sh first)"
    exit 0
fi
echo "package: $deb"

vm_step "an overlay of the host's tree, writes in guest RAM"
modprobe overlay
ov=$VM_SCRATCH/overlay
root=$ov/root
mkdir -p "$ov/upper" "$ov/work" "$root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$ov/upper,workdir=$ov/work" "$root"
mounted=("$root")
bind() { # bind SRC DEST-in-root
    mount --bind "$1" "$root$2"
    mounted=("$root$2" "${mounted[@]}")
}
cleanup() {
    local m
    for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
}
trap cleanup EXIT
bind /proc /proc
bind /sys /sys
bind /dev /dev
bind /run /run
bind /lib/modules /lib/modules
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
cp "$deb" "$root/root/zonedd.deb"
# No man-db index rebuild from the package's trigger (minutes in the emulated guest).
rm -f "$root/var/lib/man-db/auto-update"
if in_root dpkg-query -W zonedd >/dev/null 2>&1; then
    vm_fail "zonedd is already installed in the host's tree: the test needs it absent"
fi

vm_step "dpkg -i"
in_root dpkg --force-unsafe-io -i /root/zonedd.deb
in_root dpkg-query -W -f='${Status} ${Version}\n' zonedd | tee "$VM_SCRATCH/status"
grep -q "^install ok installed " "$VM_SCRATCH/status" || vm_fail "dpkg does not list zonedd as installed"
in_root dpkg -L zonedd | sort >"$VM_SCRATCH/files"
cat "$VM_SCRATCH/files"
for f in /usr/sbin/zonedd /lib/systemd/system/zonedd@.service /usr/lib/modules-load.d/zonedd.conf \
    /usr/share/doc/zonedd/copyright; do
    grep -qx "$f" "$VM_SCRATCH/files" || vm_fail "the package does not hold $f"
    [ -f "$root$f" ] || vm_fail "$f is not installed"
done
[ "$(stat -c %a "$root/usr/sbin/zonedd")" = 755 ] || vm_fail "/usr/sbin/zonedd mode $(stat -c %a "$root/usr/sbin/zonedd")"
version=$(in_root /usr/sbin/zonedd --version)
[ "$version" = "$("$Z" --version)" ] || vm_fail "/usr/sbin/zonedd --version: '$version'"
echo "ok: $version"

vm_step "the unit, the module entry, the copyright"
unit=$root/lib/systemd/system/zonedd@.service
grep -qx 'ExecStart=/usr/sbin/zonedd create --backend %f --foreground --recover-if-present' "$unit" ||
    vm_fail "ExecStart does not run /usr/sbin/zonedd: $(grep Exec "$unit")"
grep -qx 'ExecStop=/usr/sbin/zonedd delete --backend %f' "$unit" || vm_fail "ExecStop: $(grep Exec "$unit")"
! grep -q /usr/local/bin "$unit" || vm_fail "the unit still names /usr/local/bin"
in_root /usr/sbin/zonedd install-unit --print --bin /usr/sbin/zonedd | cmp - "$unit" ||
    vm_fail "the packaged unit differs from what install-unit prints"
[ "$(grep -v '^#' "$root/usr/lib/modules-load.d/zonedd.conf")" = ublk_drv ] ||
    vm_fail "modules-load.d entry: $(cat "$root/usr/lib/modules-load.d/zonedd.conf")"
grep -q '^License: MIT' "$root/usr/share/doc/zonedd/copyright" || vm_fail "copyright without the license"
if [ -d /sys/module/ublk_drv ]; then modprobe -r ublk_drv; fi
[ ! -d /sys/module/ublk_drv ] || vm_fail "ublk_drv is loaded before systemd-modules-load runs"
in_root /lib/systemd/systemd-modules-load || vm_fail "systemd-modules-load failed"
[ -c /dev/ublk-control ] || vm_fail "systemd-modules-load did not load ublk_drv from zonedd.conf"
echo "ok: unit on /usr/sbin/zonedd, ublk_drv loaded from /usr/lib/modules-load.d/zonedd.conf"

vm_step "the packaged binary serves a device"
out=$(in_root /usr/sbin/zonedd create --backend mem:64M)
id=$(sed -n 's/^id //p' <<<"$out")
bdev=/dev/ublkb$id
head -c $((4 << 20)) /dev/urandom >"$VM_SCRATCH/pattern"
dd if="$VM_SCRATCH/pattern" of="$bdev" bs=1M oflag=direct status=none
dd if="$bdev" of="$VM_SCRATCH/back" bs=1M count=4 iflag=direct status=none
cmp "$VM_SCRATCH/pattern" "$VM_SCRATCH/back" || vm_fail "read back differs"
in_root /usr/sbin/zonedd delete "$id"
[ ! -e "$bdev" ] || vm_fail "$bdev still there after delete"
echo "ok: $bdev round trip, deleted"

vm_step "dpkg -r"
in_root dpkg --force-unsafe-io -r zonedd
# Neither conffiles nor a postrm: dpkg purges it at once and forgets it (no "rc" state).
if in_root dpkg-query -W zonedd >/dev/null 2>&1; then
    vm_fail "dpkg still knows zonedd: $(in_root dpkg-query -W -f='${Status}' zonedd)"
fi
! ls "$root"/var/lib/dpkg/info/zonedd.* >/dev/null 2>&1 || vm_fail "dpkg's records left: $(ls "$root"/var/lib/dpkg/info/zonedd.*)"
left=()
while IFS= read -r f; do
    [ -d "$root$f" ] && continue # shared directories (/usr/sbin, ...) stay
    [ ! -e "$root$f" ] || left+=("$f")
done <"$VM_SCRATCH/files"
[ ${#left[@]} = 0 ] || vm_fail "left after dpkg -r: ${left[*]}"
[ ! -e "$root/usr/share/doc/zonedd" ] || vm_fail "/usr/share/doc/zonedd left after dpkg -r"
echo "ok: $(wc -l <"$VM_SCRATCH/files") paths of the package, none left"

echo "package: all checks passed"
