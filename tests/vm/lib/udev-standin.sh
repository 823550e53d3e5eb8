# A stand-in for udev in systemd guests (`# vm-init: systemd`, sourced): the guest runs no udevd,
# so systemd never hears of block devices and a mount unit waiting for its device (an /etc/fstab
# line with UUID=...) would wait forever. udev_standin does, on demand, the part of udev's job
# that systemd sees:
#
#   udev_standin [DEV...]   for each block device DEV: a udev database entry tagged `systemd`
#                           (/run/udev/data/bMAJ:MIN, /run/udev/tags/systemd/bMAJ:MIN) and, if it
#                           holds a filesystem, its /dev/disk/by-uuid link; entries and links of
#                           devices that are gone are dropped; then `systemctl daemon-reload`, at
#                           which PID 1 enumerates devices again (plugs the new, unplugs the gone).
#
# Call it where udev would have sent an event: after a device appeared or got a filesystem
# (mkfs), and after one went away.

udev_standin() {
    local f id dev maj min uuid links
    mkdir -p /run/udev/data /run/udev/tags/systemd /dev/disk/by-uuid
    for f in /run/udev/data/b*; do
        [ -e "$f" ] || continue
        id=${f##*/}
        [ -e "/sys/dev/block/${id#b}" ] || rm -f "$f" "/run/udev/tags/systemd/$id"
    done
    for f in /dev/disk/by-uuid/*; do
        [ ! -L "$f" ] || [ -e "$f" ] || rm -f "$f"
    done
    for dev in "$@"; do
        [ -b "$dev" ] || {
            echo "udev_standin: $dev is not a block device" >&2
            return 1
        }
        maj=$((16#$(stat -L -c %t "$dev")))
        min=$((16#$(stat -L -c %T "$dev")))
        id=b$maj:$min
        links=""
        # -p: probe the device itself, not blkid's cache
        uuid=$(blkid -p -o value -s UUID "$dev" 2>/dev/null) || uuid=""
        if [ -n "$uuid" ]; then
            ln -sfn "../../${dev#/dev/}" "/dev/disk/by-uuid/$uuid"
            links="S:disk/by-uuid/$uuid"$'\n'"E:ID_FS_UUID=$uuid"$'\n'
        fi
        # udev's database format (systemd's sd-device reads it): devlinks, the time the device
        # was initialized (a database entry is what makes a device "initialized"), properties,
        # tags and current tags (`systemd`: a device unit is made for it), version.
        printf '%sI:%s\nG:systemd\nQ:systemd\nV:1\n' "$links" \
            "$(awk '{ printf "%d", $1 * 1000000 }' /proc/uptime)" >"/run/udev/data/$id"
        : >"/run/udev/tags/systemd/$id"
    done
    systemctl daemon-reload
}
