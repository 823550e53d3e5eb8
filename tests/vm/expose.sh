#!/usr/bin/env bash
# `zonedd expose IMAGE`: an emulated SMR image served as a host-managed zoned block device.
#  - the kernel sees it as zoned (host-managed, chunk_sectors = the zone size, nr_zones, the
#    open/active limits) and its zone report (through the kernel: `zonedd report /dev/ublkbN`,
#    BLKREPORTZONE, and blkzone) is the image's own;
#  - writes follow the image's rules: anywhere in a conventional zone, at the write pointer in
#    a sequential one (elsewhere refused, the write pointer unmoved); data reads back;
#  - zone management (blkzone open/close/finish/reset) changes the conditions the report shows;
#  - the zbd backend conformance suite passes against /dev/ublkbN as against null_blk;
#  - the kernel's dm-zoned runs on it: `zonedd format --backend /dev/ublkbN`, `dmsetup create
#    ... zoned`, xfs on the dm device, files read back after a remount;
#  - `list` and `status --json` show it (layout, zone counters), `delete` removes it; exposed
#    again, the image still has its zones, write pointers and data;
#  - kill -9 of the daemon: the writes it acknowledged (O_DIRECT, never flushed) are in the
#    image, with their write pointer, when it is exposed again;
#  - btrfs zoned on it (its data writes are zone appends, answered at the write pointer): a
#    file reads back after a remount;
#  - refused with exit 2: an image already exposed, a file that is not an image, a zoned disk,
#    a missing path, a timing model's disk smaller than the image;
#  - --timing hdd: the device says rotational (only then); data written (cached, and with
#    O_SYNC) reads back, and `status --json`
#    shows the model active with its parameters and counters (no timing threshold).
# vm-timeout: 900
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
modprobe dm-zoned
modprobe xfs

img=$VM_SCRATCH/smr.img
zone=$((32 << 20))
zs=$((zone / 512))
vm_step "an emulated image: 640 MiB, 32 MiB zones, 4 conventional, max-open 6"
"$Z" emulate "$img" --size 640M --zone-size 32M --conventional 4 --max-open 6
"$Z" report "$img" --json >"$VM_SCRATCH/img-report.json"

expose() { # expose: starts a daemon, sets id and bdev
    "$Z" expose "$img" >"$VM_SCRATCH/expose.out"
    bdev=$(sed -n 1p "$VM_SCRATCH/expose.out")
    id=$(sed -n 's/^id //p' "$VM_SCRATCH/expose.out")
    [ -b "$bdev" ] || vm_fail "expose printed '$bdev', not a block device"
    echo "exposed as $bdev (id $id)"
    rotational 0
}
rotational() { # rotational WANT: queue/rotational of $bdev (1 only under the hdd model)
    local r
    r=$(cat "/sys/block/$(basename "$bdev")/queue/rotational")
    [ "$r" = "$1" ] || vm_fail "$bdev: queue/rotational is $r, expected $1"
}
# same_zones A B [reopened]: two `zonedd report --json` outputs describe the same zones; with
# `reopened`, B is of the image opened again, where open zones are closed (empty when nothing
# was written), as a drive's are after a power cycle.
same_zones() {
    python3 - "$1" "$2" "${3:-}" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
def reopened(z):
    if sys.argv[3] and z["condition"] in ("implicit-open", "explicit-open"):
        return "closed" if z["wp"] > z["start"] else "empty"
    return z["condition"]
key = lambda r, f: [(z["start"], z["len"], z["capacity"], z["wp"], z["type"], f(z)) for z in r["zones"]]
ka, kb = key(a, reopened), key(b, lambda z: z["condition"])
if ka != kb:
    bad = [i for i, (x, y) in enumerate(zip(ka, kb)) if x != y][:5]
    print(f"zone reports differ ({len(ka)} vs {len(kb)} zones), first at {bad}: "
          + "; ".join(f"{ka[i]} vs {kb[i]}" for i in bad))
    sys.exit(1)
print(f"ok: the same {len(ka)} zones")
EOF
}
wp_of() { # wp_of ZONE: its write pointer in bytes from the zone start, through the kernel
    echo "  (report at $(cut -d' ' -f1 /proc/uptime) s)" >&2
    "$Z" report "$bdev" --json | python3 -c '
import json, sys
z = json.load(sys.stdin)["zones"][int(sys.argv[1])]
print(z["wp"] - z["start"], z["condition"])' "$1"
}

vm_step "expose: the kernel sees a host-managed zoned disk"
expose
b=${bdev#/dev/}
q=/sys/block/$b/queue
[ "$(cat $q/zoned)" = host-managed ] || vm_fail "$q/zoned is $(cat $q/zoned)"
[ "$(cat $q/chunk_sectors)" = "$zs" ] || vm_fail "chunk_sectors $(cat $q/chunk_sectors), not $zs"
[ "$(cat $q/nr_zones)" = 20 ] || vm_fail "nr_zones $(cat $q/nr_zones), not 20"
[ "$(cat $q/max_open_zones)" = 6 ] || vm_fail "max_open_zones $(cat $q/max_open_zones), not 6"
[ "$(blockdev --getsize64 "$bdev")" = $((640 << 20)) ] || vm_fail "size $(blockdev --getsize64 "$bdev")"
echo "ok: host-managed, 20 zones of $zs sectors, max-open 6"
"$Z" report "$bdev" --json >"$VM_SCRATCH/dev-report.json"
same_zones "$VM_SCRATCH/img-report.json" "$VM_SCRATCH/dev-report.json" || vm_fail "the kernel's report is not the image's"
[ "$(blkzone report "$bdev" | grep -c 'CONVENTIONAL')" = 4 ] || vm_fail "blkzone does not show 4 conventional zones"
expect_error 2 "already served by ublk device $id" "$Z" expose "$img"

vm_step "writes by the image's rules, read back"
head -c $((1 << 20)) /dev/urandom >"$VM_SCRATCH/a"
head -c $((2 << 20)) /dev/urandom >"$VM_SCRATCH/b"
dd if="$VM_SCRATCH/a" of="$bdev" bs=1M seek=40 oflag=direct status=none # conventional zone 1
dd if="$VM_SCRATCH/b" of="$bdev" bs=1M seek=$((5 * 32)) oflag=direct status=none # zone 5 at its wp
read -r wp cond <<<"$(wp_of 5)"
[ "$wp $cond" = "$((2 << 20)) implicit-open" ] || vm_fail "zone 5: wp +$wp $cond after a 2 MiB write"
if dd if="$VM_SCRATCH/a" of="$bdev" bs=1M seek=$((6 * 32 + 1)) oflag=direct status=none 2>/dev/null; then
    vm_fail "a write off the write pointer of zone 6 succeeded"
fi
read -r wp cond <<<"$(wp_of 6)"
[ "$wp $cond" = "0 empty" ] || vm_fail "zone 6: wp +$wp $cond after a refused write"
echo "ok: a write off the write pointer is refused, the zone stays empty"
dd if="$bdev" bs=1M skip=40 count=1 iflag=direct status=none | cmp - "$VM_SCRATCH/a" || vm_fail "conventional data differs"
dd if="$bdev" bs=1M skip=$((5 * 32)) count=2 iflag=direct status=none | cmp - "$VM_SCRATCH/b" || vm_fail "sequential data differs"
echo "ok: data reads back"

vm_step "zone management through the kernel"
echo "  (blkzone at $(cut -d' ' -f1 /proc/uptime) s)"
blkzone open -o $((7 * zs)) -c 1 "$bdev"
[ "$(wp_of 7)" = "0 explicit-open" ] || vm_fail "zone 7 after open: $(wp_of 7)"
echo "  (blkzone at $(cut -d' ' -f1 /proc/uptime) s)"
blkzone close -o $((5 * zs)) -c 1 "$bdev"
[ "$(wp_of 5)" = "$((2 << 20)) closed" ] || vm_fail "zone 5 after close: $(wp_of 5)"
blkzone finish -o $((8 * zs)) -c 1 "$bdev"
[ "$(wp_of 8)" = "$zone full" ] || vm_fail "zone 8 after finish: $(wp_of 8)"
blkzone reset -o $((8 * zs)) -c 1 "$bdev"
[ "$(wp_of 8)" = "0 empty" ] || vm_fail "zone 8 after reset: $(wp_of 8)"
echo "ok: open, close, finish, reset"

vm_step "delete, expose again: the image kept its zones and data"
"$Z" list | grep -F "$img" || vm_fail "zonedd list does not show $img"
"$Z" status "$id" --json >"$VM_SCRATCH/status.json"
python3 - "$VM_SCRATCH/status.json" <<'EOF' || vm_fail "status --json: $(cat "$VM_SCRATCH/status.json")"
import json, sys
s = json.load(open(sys.argv[1]))
z = s["zoned"]
assert s["layout"] == "zoned (exposed image)", s["layout"]
assert s["zones"] == 20 and s["zone_bytes"] == 32 << 20, s
assert z["writes"] >= 2 and z["write_bytes"] >= 3 << 20, z
assert z["reads"] >= 2 and z["zone_reports"] > 0 and z["zone_ops"] >= 4 and z["errors"] >= 1, z
print("ok: status", z)
EOF
"$Z" report "$bdev" --json >"$VM_SCRATCH/before.json"
"$Z" delete "$id"
[ ! -e "$bdev" ] || vm_fail "$bdev still exists after delete"
"$Z" report "$img" --json >"$VM_SCRATCH/img-after.json"
same_zones "$VM_SCRATCH/before.json" "$VM_SCRATCH/img-after.json" reopened || vm_fail "the image's zones are not those the device showed"
expose
"$Z" report "$bdev" --json >"$VM_SCRATCH/again.json"
same_zones "$VM_SCRATCH/before.json" "$VM_SCRATCH/again.json" reopened || vm_fail "exposed again, the zones differ"
dd if="$bdev" bs=1M skip=$((5 * 32)) count=2 iflag=direct status=none | cmp - "$VM_SCRATCH/b" || vm_fail "data differs after delete and expose"
echo "ok: zones and data kept"

vm_step "kill -9 the daemon: every write it acknowledged is in the image"
head -c $((3 << 20)) /dev/urandom >"$VM_SCRATCH/c"
dd if="$VM_SCRATCH/c" of="$bdev" bs=1M seek=$((9 * 32)) oflag=direct status=none # zone 9, no flush
pid=$("$Z" list --json | jq -er ".[] | select(.id == $id) | .pid")
kill -9 "$pid"
while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
"$Z" delete "$id" || true # a device whose daemon is gone
[ ! -e "$bdev" ] || vm_fail "$bdev is still there after the daemon died and delete"
"$Z" report "$img" --json | jq -e ".zones[9].wp - .zones[9].start == $((3 << 20))" >/dev/null ||
    vm_fail "zone 9 of the image after kill -9: $("$Z" report "$img" --json | jq -c '.zones[9]')"
expose
dd if="$bdev" bs=1M skip=$((9 * 32)) count=3 iflag=direct status=none | cmp - "$VM_SCRATCH/c" ||
    vm_fail "data written before kill -9 differs"
echo "ok: 3 MiB acknowledged before kill -9 read back, write pointer where it was"

vm_step "the backend conformance suite against $bdev"
"$Z" conformance "$bdev" --yes-destroy-data | tail -n 3

vm_step "the kernel's dm-zoned on $bdev, xfs on it"
"$Z" format --backend "$bdev" --force >/dev/null 2>&1 || vm_fail "zonedd format --backend $bdev failed"
nr_chunks=$("$Z" check "$bdev" --json | jq -er .summary.nr_chunks)
dmsetup create zexp --table "0 $((nr_chunks * zs)) zoned $bdev"
mkfs.xfs -q -f /dev/mapper/zexp
mnt=$VM_SCRATCH/mnt
mkdir -p "$mnt"
mount /dev/mapper/zexp "$mnt"
head -c $((24 << 20)) /dev/urandom >"$VM_SCRATCH/f"
cp "$VM_SCRATCH/f" "$mnt/f"
umount "$mnt"
mount /dev/mapper/zexp "$mnt"
cmp "$VM_SCRATCH/f" "$mnt/f" || vm_fail "a file on xfs on dm-zoned on $bdev differs after a remount"
umount "$mnt"
dmsetup remove zexp
"$Z" check "$bdev" >/dev/null || vm_fail "zonedd check of what dm-zoned wrote on $bdev"
echo "ok: dm-zoned ($nr_chunks chunks) and xfs on the exposed image; zonedd check clean"

vm_step "btrfs zoned on $bdev: its data goes in as zone appends"
modprobe btrfs
appends0=$("$Z" status "$id" --json | jq -er .zoned.appends)
mkfs.btrfs -q -f "$bdev" >/dev/null
mount -t btrfs "$bdev" "$mnt"
cp "$VM_SCRATCH/f" "$mnt/f"
sync
umount "$mnt"
mount -t btrfs "$bdev" "$mnt"
cmp "$VM_SCRATCH/f" "$mnt/f" || vm_fail "a file on btrfs zoned on $bdev differs after a remount"
umount "$mnt"
appends=$("$Z" status "$id" --json | jq -er .zoned.appends)
[ "$appends" -gt "$appends0" ] || vm_fail "btrfs zoned wrote no zone appends ($appends0 -> $appends)"
echo "ok: btrfs zoned: 24 MiB read back after a remount, $((appends - appends0)) zone appends"

vm_step "refusals"
head -c $((8 << 20)) /dev/zero >"$VM_SCRATCH/plain"
expect_error 2 "is not a zonedd emulated image" "$Z" expose "$VM_SCRATCH/plain"
expect_error 2 "No such file or directory" "$Z" expose /nonexistent
nullb=$(make_nullb nullb0 256 16 4)
expect_error 2 "is a zoned block device already" "$Z" expose "$nullb"
remove_nullb "$nullb"
"$Z" delete "$id"
expect_error 2 "disk_size=1M is smaller than the image (640M)" "$Z" expose "$img" --timing hdd --timing-param disk_size=1M

vm_step "--timing hdd: the same data, completions on the drive model's clock"
expose_args=(--timing hdd --timing-param queue_depth=16)
"$Z" expose "$img" "${expose_args[@]}" >"$VM_SCRATCH/expose.out"
bdev=$(sed -n 1p "$VM_SCRATCH/expose.out")
id=$(sed -n 's/^id //p' "$VM_SCRATCH/expose.out")
rotational 1 # a spinning disk, as a real SMR drive says
blkzone reset -o $((10 * zs)) -c 1 "$bdev"
head -c $((4 << 20)) /dev/urandom >"$VM_SCRATCH/t"
dd if="$VM_SCRATCH/t" of="$bdev" bs=1M seek=$((10 * 32)) oflag=direct status=none
dd if="$VM_SCRATCH/t" of="$bdev" bs=1M seek=42 count=1 oflag=direct,sync status=none # conventional, FUA/flush
dd if="$bdev" bs=1M skip=$((10 * 32)) count=4 iflag=direct status=none | cmp - "$VM_SCRATCH/t" || vm_fail "data differs with --timing hdd"
dd if="$bdev" bs=1M skip=42 count=1 iflag=direct status=none | cmp -n $((1 << 20)) - "$VM_SCRATCH/t" ||
    vm_fail "conventional data differs with --timing hdd"
"$Z" status "$id" --json >"$VM_SCRATCH/status-hdd.json"
python3 - "$VM_SCRATCH/status-hdd.json" <<'EOF2' || vm_fail "status --json with --timing hdd: $(jq -c .timing "$VM_SCRATCH/status-hdd.json")"
import json, sys
t = json.load(open(sys.argv[1]))["timing"]
assert t["model"] == "hdd" and t["params"]["queue_depth"] == 16 and t["params"]["rpm"] == 7200, t
s = t["stats"]
assert s["requests"] >= 10 and s["media_ops"] >= 1 and s["busy_ns"] > 0 and s["flushes"] >= 1, s
print("ok: timing", {k: s[k] for k in ("requests", "media_ops", "seeks", "cached_writes", "flushes")})
EOF2
"$Z" delete "$id"
echo "expose: ok"
