#!/usr/bin/env bash
# zonedd's main job, step by step, as root on a kernel with ublk (run by scripts/demo.sh, on the
# host or inside the VM): an emulated host-managed SMR image, formatted with dm-zoned v2 metadata,
# exposed as /dev/ublkbN by a zonedd daemon, xfs on top, files copied in and checked, status and
# df shown, then umount, delete, and a metadata check of the image. Any failed step stops it with
# a message and a non-zero exit; everything it created is removed.
# vm-timeout: 600
set -euo pipefail
root=${ZONEDD_ROOT:-$(cd "$(dirname "$0")/../.." && pwd -P)}
Z=${ZONEDD:-$root/target/release/zonedd}
[ -x "$Z" ] || {
    echo "demo: $Z is missing (cargo build --release -p zonedd)" >&2
    exit 1
}

step() { printf '\n### %s\n' "$*"; }
fail() {
    printf 'demo: FAILED: %s\n' "$*" >&2
    exit 1
}
# run DESCRIPTION CMD...: show the command, run it, stop the demo if it fails.
run() {
    local what=$1
    shift
    printf '$ %s\n' "$*"
    "$@" || fail "$what (exit $?): $*"
}

work=$(mktemp -d "${VM_SCRATCH:-${TMPDIR:-/tmp}}/zonedd-demo.XXXXXX")
img=$work/smr.img
mnt=$work/mnt
id=""
cleanup() {
    local rc=$?
    mountpoint -q "$mnt" 2>/dev/null && umount "$mnt"
    [ -z "$id" ] || "$Z" delete "$id" >/dev/null 2>&1 || true
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT

modprobe ublk_drv 2>/dev/null || true
[ -c /dev/ublk-control ] || fail "no /dev/ublk-control: this kernel has no ublk"
modprobe xfs 2>/dev/null || true

step "1. an emulated host-managed SMR disk: 2 GiB, 64 MiB zones, 8 conventional"
run "emulate" "$Z" emulate "$img" --size 2G --zone-size 64M --conventional 8
run "report" "$Z" report "$img" | head -n 12

step "2. dm-zoned v2 metadata on it"
run "format" "$Z" format --backend "$img"

step "3. a zonedd daemon exposing it as a conventional block device"
printf '$ %s\n' "$Z create --backend $img --label demo"
out=$("$Z" create --backend "$img" --label demo) || fail "create (exit $?)"
echo "$out"
bdev=$(sed -n 1p <<<"$out")
id=$(sed -n 's/^id //p' <<<"$out")
[ -n "$id" ] || id=${bdev#/dev/ublkb}
[ -b "$bdev" ] || fail "create printed '$bdev', which is not a block device"

step "4. xfs on $bdev, mounted on $mnt"
run "mkfs.xfs" mkfs.xfs -f -q "$bdev"
mkdir -p "$mnt"
run "mount" mount "$bdev" "$mnt"

step "5. copy files in, read them back"
src=$work/src
mkdir -p "$src"
cp -a "$root/crates" "$root/src" "$root/docs" "$src/" 2>/dev/null || cp -a "$root/src" "$src/"
head -c $((32 << 20)) /dev/urandom >"$src/random.bin"
run "copy" cp -a "$src" "$mnt/"
run "sync" sync
(cd "$src" && find . -type f -print0 | sort -z | xargs -0 md5sum) >"$work/want.md5"
(cd "$mnt/src" && md5sum --quiet -c "$work/want.md5") || fail "files read back differ"
echo "$(wc -l <"$work/want.md5") files, $(du -sh "$mnt/src" | cut -f1), read back identical"

step "6. the device and the filesystem"
run "status" "$Z" status "$id"
run "df" df -h "$mnt"

step "7. umount, delete the device, check the image's metadata"
run "umount" umount "$mnt"
run "delete" "$Z" delete "$id"
id=""
[ ! -b "$bdev" ] || fail "$bdev still exists after delete"
run "check" "$Z" check "$img"

echo
echo "demo: done"
