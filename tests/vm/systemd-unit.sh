#!/usr/bin/env bash
# zonedd@.service under a real systemd: the guest boots Debian's systemd as PID 1 (`# vm-init:
# systemd`, docs/vm-testing.md) and the unit is used the way the README tells users to:
#  - installed by `zonedd install-unit`, `systemctl enable --now zonedd@<escaped null_blk
#    path>.service` on a formatted host-managed null_blk disk returns once the unit is `active`
#    (Type=notify: READY=1 once /dev/ublkbN exists; ublk_drv loaded by the unit's
#    modprobe@ublk_drv.service);
#  - the daemon killed with SIGKILL while nothing has the device mounted: systemd restarts it
#    and the same /dev/ublkbN (same diskseq: not deleted and made again) is recovered, with the
#    data written before (O_DIRECT, never flushed);
#  - a missing backend as the instance ends `failed` with zonedd's one-line message in the
#    journal, and no device;
#  - xfs mounted through an /etc/fstab line with x-systemd.requires=zonedd@...service: the mount
#    unit requires and is ordered after the volume and its /dev/disk/by-uuid device; booting
#    with that line and the unit enabled has no ordering cycle (systemd-analyze verify);
#    `systemctl stop` of the volume unmounts first, removes the device, `zonedd check` is clean;
#    starting the mount unit alone brings the volume back with the files;
#  - files written (fsynced, buffered, O_DIRECT without a flush), the daemon killed with
#    SIGKILL: systemd restarts it, the filesystem stays mounted on the same recovered device,
#    every file reads back intact from the device; a last stop is clean.
# Failed checks are collected and listed at the end; the scenario goes on where it can.
# ZONEDD_VM_SYSTEMD_MOUNT_DEP=after uses x-systemd.after= (ordering only) instead of
# x-systemd.requires= in the fstab line (then the scenario starts and stops the volume itself).
# The guest runs no udev: udev_standin (tests/vm/lib/udev-standin.sh) announces the ublk disk to
# systemd where udev would, so the mount unit waits for its device unit as on a real system.
# vm-init: systemd
# vm-timeout: 1800
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
source "$(dirname "$0")/lib/udev-standin.sh"
Z=$(zonedd_bin)
Z=$(realpath "$Z")

[ "$(cat /proc/1/comm)" = systemd ] ||
    vm_fail "PID 1 is $(cat /proc/1/comm), not systemd: this scenario needs '# vm-init: systemd'"
# It edits /etc/fstab and /etc/systemd/system: only in the harness's guest, whose / is an overlay.
[ -f /run/zonedd-vm-init/job.env ] && [ "$(findmnt -n -o FSTYPE /)" = overlay ] ||
    vm_fail "not in a systemd guest of scripts/vm-test.sh: refusing to edit this system's /etc"

dep=${ZONEDD_VM_SYSTEMD_MOUNT_DEP:-after}
case $dep in requires | after) ;; *) vm_fail "ZONEDD_VM_SYSTEMD_MOUNT_DEP must be requires or after, not '$dep'" ;; esac
mnt=/mnt/zonedd
mnt_unit=$(systemd-escape --path --suffix=mount "$mnt")
units=()    # what diagnose shows
problems=() # failed checks that did not stop the scenario

show() { systemctl show --value -p "$2" "$1"; } # show UNIT PROPERTY
state() { echo "$(show "$1" ActiveState)/$(show "$1" SubState)"; }
has_dep() { # has_dep UNIT PROPERTY OTHER: OTHER is in UNIT's list PROPERTY (Requires, After, ...)
    # systemctl quotes names that hold a backslash ("dev-disk-by\\x2duuid-...")
    show "$1" "$2" | tr ' ' '\n' | sed -e 's/^"//; s/"$//; s/\\\\/\\/g' | grep -xF -- "$3" >/dev/null
}
diagnose() {
    local u
    for u in "${units[@]}"; do
        systemctl status --no-pager --full "$u" || true
        journalctl -b --no-pager -o short-monotonic -u "$u" | tail -n 30 || true
    done
    "$Z" list || true
}
fail() { # a failure the scenario cannot go on after
    diagnose
    [ ${#problems[@]} = 0 ] || printf 'FAIL (earlier): %s\n' "${problems[@]}" >&2
    vm_fail "$*"
}
problem() { # a failure to report at the end
    printf 'FAIL: %s\n' "$*" >&2
    problems+=("$*")
}
reaches_state() { # reaches_state UNIT ACTIVE_STATE SECONDS: true once UNIT is in ACTIVE_STATE
    local end=$((SECONDS + $3))
    while [ "$SECONDS" -le "$end" ]; do
        [ "$(show "$1" ActiveState)" = "$2" ] && return 0
        sleep 0.2
    done
    return 1
}
stopped_cleanly() { # stopped_cleanly UNIT: inactive with result success, or a problem (and its journal)
    [ "$(show "$1" ActiveState)" = inactive ] && [ "$(show "$1" Result)" = success ] && return 0
    problem "$1 is $(state "$1") (result $(show "$1" Result), main process status $(show "$1" ExecMainStatus)) after stop"
    journalctl -b --no-pager -o short-monotonic -u "$1" | tail -n 25
}
wait_state() { # wait_state UNIT ACTIVE_STATE SECONDS: the same, or fail
    reaches_state "$@" || fail "$1 is $(state "$1") after $3 s, not $2"
}
device_of() { # device_of BACKEND -> "ID BDEV PID STATE" of the device serving it, or nothing
    "$Z" list --json | python3 -c '
import json, sys
for d in json.load(sys.stdin):
    if d["backend"] == sys.argv[1]:
        print(d["id"], d["bdev"], d["pid"] or 0, d["state"])' "$1"
}
diskseq() { cat "/sys/block/${1#/dev/}/diskseq"; } # changes when a disk is deleted and made again
journal_of() { journalctl -b --no-pager -o cat -u "$1"; }
write_files() { # write_files TAG: TAG-a fsynced, TAG-b buffered (dirty), TAG-c O_DIRECT, no flush
    head -c $((8 << 20)) /dev/urandom >"$VM_SCRATCH/$1-a"
    head -c $((4 << 20)) /dev/urandom >"$VM_SCRATCH/$1-b"
    head -c $((4 << 20)) /dev/urandom >"$VM_SCRATCH/$1-c"
    dd if="$VM_SCRATCH/$1-a" of="$mnt/$1-a" bs=1M conv=fsync status=none
    cp "$VM_SCRATCH/$1-b" "$mnt/$1-b"
    dd if="$VM_SCRATCH/$1-c" of="$mnt/$1-c" bs=1M oflag=direct status=none
}
same_files() { # same_files TAG WHEN: TAG's files read back (page cache dropped) as written
    local f bad=0
    sync
    echo 3 >/proc/sys/vm/drop_caches
    for f in a b c; do
        cmp "$VM_SCRATCH/$1-$f" "$mnt/$1-$f" || {
            problem "$mnt/$1-$f differs $2"
            bad=1
        }
    done
    [ "$bad" = 1 ] || echo "ok: $1-a (fsynced), $1-b (buffered), $1-c (O_DIRECT, no flush) intact $2"
}
# wait_restart UNIT OLD_PID OLD_RESTARTS SECONDS: until systemd has restarted UNIT (NRestarts up,
# active, a new MainPID). Returns 1 at once if the mount unit leaves `active` (the restart is then
# stuck behind the mount's stop, see below), 2 after SECONDS.
wait_restart() {
    local end=$(($4 + SECONDS)) pid
    while [ "$SECONDS" -le "$end" ]; do
        if [ "${check_mount:-0}" = 1 ] && [ "$(show "$mnt_unit" ActiveState)" != active ]; then
            return 1
        fi
        if [ "$(show "$1" NRestarts)" -gt "$3" ] && [ "$(show "$1" ActiveState)" = active ]; then
            pid=$(show "$1" MainPID)
            [ "$pid" = 0 ] || [ "$pid" = "$2" ] || return 0
        fi
        sleep 0.2
    done
    return 2
}

vm_step "install the unit (zonedd install-unit)"
"$Z" install-unit
grep -qxF "ExecStart=$Z create --backend %f --foreground --recover-if-present" \
    /etc/systemd/system/zonedd@.service || fail "the installed unit does not run $Z"
systemctl daemon-reload

vm_step "a formatted null_blk disk, systemctl enable --now"
nullb=$(make_nullb nullb0 512 16 8)
"$Z" format --backend "$nullb" >/dev/null
unit="zonedd@$(systemd-escape --path "$nullb").service"
units=("$unit")
echo "unit $unit"
if [ -d /sys/module/ublk_drv ]; then
    echo "note: ublk_drv was already loaded"
else
    echo "ublk_drv not loaded: the unit's modprobe@ublk_drv.service must load it"
fi
t0=$SECONDS
systemctl enable --now "$unit" || fail "systemctl enable --now $unit failed"
echo "enable --now returned after $((SECONDS - t0)) s"
[ "$(state "$unit")" = active/running ] || fail "$unit is $(state "$unit") after enable --now"
[ -L "/etc/systemd/system/multi-user.target.wants/$unit" ] || problem "enable made no multi-user.target.wants link"
[ -d /sys/module/ublk_drv ] || problem "ublk_drv is not loaded"
read -r id bdev pid state < <(device_of "$nullb") || fail "no zonedd device serves $nullb"
[ -b "$bdev" ] && [ "$state" = live ] || fail "$bdev (id $id) is $state"
[ "$(show "$unit" MainPID)" = "$pid" ] || problem "MainPID $(show "$unit" MainPID) is not the daemon ($pid)"
echo "ok: $unit active, $bdev (id $id), daemon pid $pid, status: $(show "$unit" StatusText)"

vm_step "kill -9 with nothing mounted: systemd restarts the daemon on the same device"
head -c $((4 << 20)) /dev/urandom >"$VM_SCRATCH/raw"
dd if="$VM_SCRATCH/raw" of="$bdev" bs=1M seek=100 oflag=direct status=none
seq0=$(diskseq "$bdev")
restarts=$(show "$unit" NRestarts)
kill -9 "$pid"
rc=0
check_mount=0 wait_restart "$unit" "$pid" "$restarts" 120 || rc=$?
[ "$rc" = 0 ] || fail "$unit was not restarted within 120 s ($(state "$unit"), NRestarts $(show "$unit" NRestarts))"
read -r id2 bdev2 pid2 state2 < <(device_of "$nullb") || fail "no device serves $nullb after the restart"
[ "$bdev2 $state2" = "$bdev live" ] || fail "after the restart: $bdev2 is $state2"
pid=$pid2
echo "restarted: daemon pid $pid on $bdev (id $id2)"
journalctl -b --no-pager -o short-monotonic -u "$unit" | tail -n 8
if [ "$(diskseq "$bdev")" != "$seq0" ]; then
    why="the device was deleted and made again, not recovered (diskseq $seq0 -> $(diskseq "$bdev"))"
    if journal_of "$unit" | grep -F "has no daemon: deleting it"; then
        why="$why: after the daemon died, systemd ran ExecStop= (\`zonedd delete --backend\`), which deletes a device without a daemon when nothing holds it; anything that had it open lost it"
    fi
    problem "kill -9, nothing mounted: $why"
else
    echo "ok: the same device (diskseq $seq0) was recovered"
fi
dd if="$bdev" bs=1M skip=100 count=4 iflag=direct status=none | cmp - "$VM_SCRATCH/raw" ||
    problem "kill -9, nothing mounted: the O_DIRECT write before the kill did not survive"

vm_step "a missing backend: the instance ends failed, zonedd's message in the journal"
missing=/dev/zonedd-vm-missing
bad="zonedd@$(systemd-escape --path "$missing").service"
units=("$unit" "$bad")
if systemctl start "$bad"; then fail "systemctl start $bad succeeded"; fi
if reaches_state "$bad" failed 30; then
    echo "ok: $bad is failed (result $(show "$bad" Result), after $(show "$bad" NRestarts) restarts)"
else
    # Restart=on-failure retries zonedd's refusal (exit 2) every RestartSec=1s; systemd gives up
    # only at its start limit (5 starts within 10 s), which a start slower than 2 s never reaches.
    problem "$bad is not failed but $(state "$bad") after 30 s and $(show "$bad" NRestarts) restarts:" \
        "Restart=on-failure retries zonedd's refusal (exit status 2) each RestartSec=1s, and systemd's start limit (5 starts within 10 s) is never reached when a start takes more than 2 s, as here"
    systemctl stop "$bad"
fi
msg="zonedd: $missing: No such file or directory (os error 2)"
journal_of "$bad" | grep -xF "$msg" >/dev/null || problem "the journal of $bad lacks the line '$msg'"
echo "journal:"
journalctl -b --no-pager -o short-monotonic -u "$bad" | tail -n 6
[ "$(ls /sys/class/ublk-char)" = "ublkc$id" ] || problem "ublk devices besides ublkc$id after the failed starts: $(ls /sys/class/ublk-char)"
systemctl reset-failed "$bad" 2>/dev/null || true

vm_step "xfs through /etc/fstab with x-systemd.$dep=$unit"
mkfs.xfs -q -f "$bdev"
uuid=$(blkid -p -o value -s UUID "$bdev")
echo "UUID=$uuid $mnt xfs defaults,x-systemd.$dep=$unit 0 0" >>/etc/fstab
udev_standin "$bdev" # udev would react to mkfs closing the device; reloads (fstab too)
disk_unit=$(systemd-escape --path --suffix=device "/dev/disk/by-uuid/$uuid")
units=("$unit" "$mnt_unit" "$disk_unit")
[ "$(show "$disk_unit" ActiveState)" = active ] || fail "$disk_unit is $(state "$disk_unit")"
deps=("Requires $disk_unit" "After $disk_unit" "After $unit")
[ "$dep" = after ] || deps+=("Requires $unit")
for d in "${deps[@]}"; do
    has_dep "$mnt_unit" "${d% *}" "${d#* }" || fail "$mnt_unit has no ${d% *}=${d#* }: $(show "$mnt_unit" "${d% *}")"
done
echo "ok: $mnt_unit: ${deps[*]}"
# At boot, multi-user.target pulls in the enabled unit and local-fs.target the mount.
if out=$(systemd-analyze verify --generators=yes multi-user.target 2>&1) && [ -z "$out" ]; then
    echo "ok: no ordering cycle when booting with the unit enabled and the fstab line"
else
    echo "$out"
    if grep -q "ordering cycle" <<<"$out"; then
        problem "booting with the unit enabled and the fstab line has an ordering cycle, which systemd breaks by dropping a job:" \
            "$(grep -m1 'deleted to break ordering cycle' <<<"$out")" \
            "(the unit's default dependencies order it after sysinit.target, which comes after local-fs.target, which comes after the mount, which comes after the unit)"
    fi
fi
systemctl start "$mnt_unit" || fail "systemctl start $mnt_unit failed"
[ "$(realpath "$(findmnt -n -o SOURCE --mountpoint "$mnt")")" = "$bdev" ] || fail "$mnt is not $bdev"
echo "ok: $mnt_unit mounted $bdev on $mnt"

vm_step "write files, systemctl stop $unit: unmounted, device removed, zonedd check clean"
write_files one
[ "$dep" = requires ] || systemctl stop "$mnt_unit"
systemctl stop "$unit" || fail "systemctl stop $unit failed"
stopped_cleanly "$unit"
[ "$(show "$mnt_unit" ActiveState)" = inactive ] || fail "$mnt_unit is $(state "$mnt_unit") after stopping $unit"
! mountpoint -q "$mnt" || fail "$mnt still mounted"
[ ! -e "$bdev" ] || fail "$bdev still exists after stop"
[ -z "$(device_of "$nullb")" ] || fail "a device still serves $nullb: $(device_of "$nullb")"
"$Z" check "$nullb" || problem "zonedd check $nullb is not clean after stop"
udev_standin # the device's removal
[ "$(show "$disk_unit" ActiveState)" = inactive ] || problem "$disk_unit is $(state "$disk_unit") after the removal"
echo "ok: stopped, device removed"

vm_step "the mount unit brings the volume back"
if [ "$dep" = requires ]; then
    systemctl start --no-block "$mnt_unit" # pulls the volume in (Requires=)
else
    systemctl start --no-block "$unit" "$mnt_unit"
fi
wait_state "$unit" active 120
read -r id bdev pid state < <(device_of "$nullb") || fail "no device serves $nullb"
[ "$(show "$mnt_unit" ActiveState)" != active ] || fail "$mnt_unit active before its device was announced"
udev_standin "$bdev" # the new device
wait_state "$mnt_unit" active 60
[ "$(realpath "$(findmnt -n -o SOURCE --mountpoint "$mnt")")" = "$bdev" ] || fail "$mnt is not $bdev"
same_files one "after stop, check and start"

vm_step "write files, kill -9 the daemon: systemd restarts it, the filesystem stays on the recovered device"
write_files two
seq0=$(diskseq "$bdev")
restarts=$(show "$unit" NRestarts)
kill -9 "$pid"
rc=0
check_mount=1 wait_restart "$unit" "$pid" "$restarts" 120 || rc=$?
if [ "$rc" = 1 ]; then
    # systemd 252 restarts a unit after a crash with a restart job, which it propagates to every
    # unit that has Requires= (or BindsTo=, PartOf=) on it: the mount is stopped before the
    # daemon may start again, and its umount waits for I/O on the device that has no daemon.
    sleep 5
    problem "kill -9 under a mounted filesystem: systemd restarts $unit with a restart job, propagated to $mnt_unit (Requires= from x-systemd.requires=):" \
        "the mount is stopped first ($(state "$mnt_unit")), its umount waits for I/O on the quiesced device, and the restart waits for the mount's stop (until the mount's stop times out)"
    journalctl -b --no-pager -o short-monotonic -u "$unit" -u "$mnt_unit" | tail -n 12
    vm_step "unwedge: recover the device outside systemd, let the umount finish, stop the unit"
    "$Z" recover "$id" || true
    end=$((SECONDS + 120))
    while [ "$SECONDS" -le "$end" ] && [ "$(show "$mnt_unit" ActiveState)" = deactivating ]; do
        sleep 0.2
    done
    systemctl stop "$unit" "$mnt_unit" || true
    "$Z" delete --all || true
    systemctl reset-failed "$unit" "$mnt_unit" 2>/dev/null || true
    udev_standin
    systemctl start --no-block "$mnt_unit"
    wait_state "$unit" active 120
    read -r id bdev pid state < <(device_of "$nullb") || fail "no device serves $nullb"
    udev_standin "$bdev"
    wait_state "$mnt_unit" active 60
    same_files two "after the kill -9, the stuck restart and a new start"
elif [ "$rc" = 2 ]; then
    fail "$unit was not restarted within 120 s ($(state "$unit"), NRestarts $(show "$unit" NRestarts))"
else
    read -r id2 bdev2 pid2 state2 < <(device_of "$nullb") || fail "no device serves $nullb after the restart"
    [ "$bdev2 $state2" = "$bdev live" ] || fail "after the restart: $bdev2 is $state2"
    pid=$pid2
    [ "$(diskseq "$bdev")" = "$seq0" ] || problem "kill -9, mounted: $bdev was made again (diskseq $seq0 -> $(diskseq "$bdev"))"
    mountpoint -q "$mnt" || fail "$mnt was unmounted by the restart"
    echo "ok: restarted (NRestarts $(show "$unit" NRestarts)), daemon pid $pid re-attached to $bdev, still mounted"
    journalctl -b --no-pager -o short-monotonic -u "$unit" | tail -n 8
    dd if="$mnt/two-c" bs=1M iflag=direct status=none | cmp - "$VM_SCRATCH/two-c" ||
        problem "two-c (acknowledged, never flushed) differs after the restart"
    same_files two "after kill -9 and restart"
fi
same_files one "at the end"

vm_step "a last stop, zonedd check, disable"
[ "$dep" = requires ] || systemctl stop "$mnt_unit"
systemctl stop "$unit" || fail "the last systemctl stop $unit failed"
! mountpoint -q "$mnt" && [ ! -e "$bdev" ] || fail "the last stop left $mnt mounted or $bdev"
"$Z" check "$nullb" >/dev/null || problem "zonedd check $nullb is not clean after the last stop"
systemctl disable "$unit"
[ ! -e "/etc/systemd/system/multi-user.target.wants/$unit" ] || problem "disable left the wants link"

vm_step "tear down"
sed -i "\\|^UUID=$uuid |d" /etc/fstab
rm -f /etc/systemd/system/zonedd@.service
remove_nullb "$nullb"
if [ ${#problems[@]} != 0 ]; then
    printf 'FAIL: %s\n' "${problems[@]}" >&2
    vm_fail "systemd-unit: ${#problems[@]} check(s) failed (listed above)"
fi
echo "systemd-unit: all checks passed"
