# Host side of the VM harness, sourced by scripts/vm-test.sh and scripts/demo.sh.
#
# vm_prepare: fetch (once) a Debian kernel that has ublk, null_blk, scsi_debug and dm-zoned (6.12
#   from bookworm-backports, or 7.3 from trixie-backports: ZONEDD_VM_KERNEL), unpack it under
#   $VM_CACHE and build a busybox initramfs for it.
# vm_run NAME SCRIPT TIMEOUT_S [MEMORY [INIT]]: boot the kernel, share the host's / over 9p, chroot
#   into it and run SCRIPT as root under scripts/vm/guest-run.sh; stream the console; set VM_RC to
#   the script's exit status (or 124 for a timeout, 125 for a guest that never reported) and
#   VM_BOOT_S / VM_WALL_S. A boot that never reached the script is retried once. INIT is `chroot`
#   (default: busybox /init runs the script) or `systemd` (systemd is PID 1 on a copy-on-write
#   overlay of the host's / and runs the script as a unit; see scripts/vm/systemd/).
#
# Requires bash with `set -euo pipefail` in the caller. Tunables (environment):
#   VM_CACHE   cache folder (default: <cargo target dir>/vm)
#   VM_MEMORY  guest memory (default 4G)      VM_SMP  guest CPUs (default 2)
#   VM_CPU     qemu CPU model (default max)   VM_9P_CACHE  9p cache mode of the host's / (default
#              loose; empty: none; docs/vm-testing.md)
#   ZONEDD_VM_KERNEL  6.12 (default: bookworm-backports) or 7.3 (trixie-backports); selects the
#                  kernel for every boot, caches apart, runs in $VM_CACHE/runs (6.12) or
#                  $VM_CACHE/runs-7.3
#   VM_REFRESH=1  resolve and download the newest kernel of that series again
#   VM_KERNEL_PKG  use this linux-image package instead of resolving one
#   ZONEDD_VM_*    passed on to the scenario's environment

VM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)

vm_log() { printf 'vm: %s\n' "$*" >&2; }
vm_die() {
    printf 'vm: error: %s\n' "$*" >&2
    exit 1
}

# Names the command when `set -e` ends the harness, which is otherwise silent (as when apt-cache
# died of SIGPIPE under pipefail). Only the top-level shell speaks: command substitutions inherit
# the trap (errtrace) and may fail on purpose behind `|| true`.
vm_trap_errors() {
    set -E
    trap 'vm_err=$?; [ "$BASH_SUBSHELL" != 0 ] || vm_log "error: ${BASH_SOURCE[0]}:$LINENO: \"$BASH_COMMAND\" failed (exit $vm_err)"' ERR
}

# The cargo target directory (honours CARGO_TARGET_DIR and .cargo/config), absolute.
vm_target_dir() {
    local dir
    dir=$(cd "$VM_ROOT" && cargo metadata --format-version 1 --no-deps 2>/dev/null |
        grep -o '"target_directory":"[^"]*"' | head -n1 | cut -d'"' -f4) || true
    [ -n "$dir" ] || dir=${CARGO_TARGET_DIR:-$VM_ROOT/target}
    case $dir in /*) ;; *) dir=$VM_ROOT/$dir ;; esac
    printf '%s\n' "$dir"
}

# The kernel series the harness boots: ZONEDD_VM_KERNEL, 6.12 unless set.
vm_series() {
    case ${ZONEDD_VM_KERNEL:-6.12} in
    6.12) echo 6.12 ;;
    7.3) echo 7.3 ;;
    *) vm_die "ZONEDD_VM_KERNEL=${ZONEDD_VM_KERNEL}: expected 6.12 (the default) or 7.3" ;;
    esac
}

vm_init_paths() {
    VM_SERIES=$(vm_series)
    VM_TARGET_DIR=$(vm_target_dir)
    VM_CACHE=${VM_CACHE:-$VM_TARGET_DIR/vm}
    mkdir -p "$VM_CACHE"
    VM_CACHE=$(cd "$VM_CACHE" && pwd -P)
    # Each scenario's console and result; 6.12 keeps the historical place.
    if [ "$VM_SERIES" = 6.12 ]; then VM_RUNS=$VM_CACHE/runs; else VM_RUNS=$VM_CACHE/runs-$VM_SERIES; fi
    ZONEDD=${ZONEDD:-$VM_TARGET_DIR/release/zonedd}
    case $ZONEDD in /*) ;; *) ZONEDD=$PWD/$ZONEDD ;; esac
}

# --- kernel -------------------------------------------------------------------------------------

# The Debian mirror URI the system's apt uses for <codename> (deb822 stanza or one-line entry),
# deb.debian.org if none says.
vm_debian_mirror() {
    local codename=$1 uri="" f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        uri=$(awk -v s="$codename" '
            BEGIN { RS = ""; FS = "\n" }
            {
                u = ""; ok = 0
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); u = a[2] }
                    if ($i ~ /^Suites:/) { n = split($i, b, /[ \t]+/); for (j = 2; j <= n; j++) if (b[j] == s) ok = 1 }
                }
                if (ok && u != "") { print u; exit }
            }' "$f")
        [ -z "$uri" ] || break
    done
    if [ -z "$uri" ]; then
        uri=$(awk -v s="$codename" '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $(i+1) == s) { print $i; exit } }' \
            /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

# Adds the <codename>-backports suite on the mirror the system already uses, if no source has it.
vm_add_backports_source() {
    local codename=$1 uri
    if grep -Eqs "^[^#]*[[:space:]]${codename}-backports([[:space:]]|$)" \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; then
        return 0
    fi
    [ "$(id -u)" = 0 ] || vm_die "apt has no ${codename}-backports source; run once as root" \
        "(or add it yourself) so that the VM kernel can be downloaded"
    uri=$(vm_debian_mirror "$codename")
    vm_log "adding apt source ${codename}-backports on $uri"
    {
        echo "# Added by zonedd's scripts/vm/lib.sh: the VM harness downloads (never installs) its kernel from here."
        echo "Types: deb"
        echo "URIs: $uri"
        echo "Suites: ${codename}-backports"
        echo "Components: main"
        [ ! -f /usr/share/keyrings/debian-archive-keyring.gpg ] ||
            echo "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
    } >/etc/apt/sources.list.d/zonedd-backports.sources
    apt-get update -qq || vm_die "apt-get update failed after adding ${codename}-backports"
}

# apt options that confine apt to a private state under $VM_CACHE/apt-<suite> listing only <suite>
# (on the mirror the system uses): the system's sources, lists and packages are left alone. Its
# index is fetched once (again with VM_REFRESH=1). Sets VM_APT (options for apt-get/apt-cache).
vm_private_apt() {
    local suite=$1 dir host_codename uri keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    dir=$VM_CACHE/apt-$suite
    VM_APT=(-o "Dir::Etc::SourceList=$dir/sources.list" -o "Dir::Etc::SourceParts=$dir/sources.list.d"
        -o "Dir::Etc::Preferences=$dir/preferences" -o "Dir::Etc::PreferencesParts=$dir/preferences.d"
        -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o "Dir::State::status=/dev/null"
        -o APT::Architecture=amd64 -o Acquire::Languages=none)
    if [ -f "$dir/.ready" ] && [ -z "${VM_REFRESH:-}" ]; then
        return 0
    fi
    [ -f "$keyring" ] || vm_die "$keyring is missing: install debian-archive-keyring"
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/sources.list.d" "$dir/preferences.d"
    host_codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    uri=$(vm_debian_mirror "${host_codename:-none}")
    echo "deb [signed-by=$keyring] $uri $suite main" >"$dir/sources.list"
    vm_log "fetching the $suite package index on $uri (private apt state in $dir)"
    apt-get "${VM_APT[@]}" update -qq >"$dir/update.log" 2>&1 || {
        cat "$dir/update.log" >&2
        vm_die "apt-get update of $suite failed (is the mirror reachable, does $keyring know $suite's key?)"
    }
    touch "$dir/.ready"
}

# Prints the linux-image package to use. 6.12: backports' linux-image-amd64 dependency if it is
# 6.12, else the newest linux-image-6.12.*-amd64 apt knows. 7.3: the same in trixie-backports,
# through a private apt state (vm_private_apt). Sets VM_APT for vm_fetch_kernel.
vm_resolve_kernel_pkg() {
    local codename ver pkg series=$VM_SERIES
    VM_APT=()
    if [ "$series" = 7.3 ]; then
        vm_private_apt trixie-backports
    fi
    if [ -n "${VM_KERNEL_PKG:-}" ]; then
        echo "$VM_KERNEL_PKG"
        return
    fi
    if [ "$series" = 6.12 ]; then
        codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
        [ -n "$codename" ] || vm_die "cannot tell the Debian release from /etc/os-release"
        if [ "$codename" = bookworm ]; then
            vm_add_backports_source "$codename"
            if ! apt-cache madison linux-image-amd64 | grep backports >/dev/null; then
                [ "$(id -u)" = 0 ] || vm_die "apt knows no ${codename}-backports packages; run apt-get update as root"
                apt-get update -qq || vm_die "apt-get update failed"
            fi
        fi
    fi
    ver=$(apt-cache "${VM_APT[@]}" madison linux-image-amd64 |
        awk -F'|' '$3 ~ /backports/ && !done { gsub(/ /, "", $2); print $2; done = 1 }')
    pkg=""
    if [ -n "$ver" ]; then
        pkg=$(apt-cache "${VM_APT[@]}" depends "linux-image-amd64=$ver" 2>/dev/null |
            awk '/Depends: linux-image-[0-9]/ && !done { print $2; done = 1 }')
    fi
    case $pkg in
    "linux-image-$series".*-amd64) ;;
    *)
        pkg=$(apt-cache "${VM_APT[@]}" search --names-only "^linux-image-${series//./\\.}\\.[0-9]+\\+deb[0-9]+-amd64\$" |
            awk '{ print $1 }' | sort -V | tail -n1)
        ;;
    esac
    [ -n "$pkg" ] || vm_die "no linux-image $series package found in apt (is its backports suite reachable?)"
    echo "$pkg"
}

# Downloads and unpacks the kernel into $VM_CACHE/kernel-<kver> (once). Sets VM_KVER, VM_KDIR.
# The cache holds boot/vmlinuz-<kver> and lib/modules/<kver>/ whatever the packaging: 6.12 ships
# one linux-image package with /boot and /lib/modules; 7.3's linux-image is a stub that depends
# on linux-binary-, linux-modules- and linux-base-<kver> (downloaded with it), with everything,
# vmlinuz and modules.builtin* included, under /usr/lib/modules/<kver>/.
vm_fetch_kernel() {
    local pkg tmp current pkgs src
    current=$VM_CACHE/current
    [ "$VM_SERIES" = 6.12 ] || current=$VM_CACHE/current-$VM_SERIES
    if [ -z "${VM_REFRESH:-}" ] && [ -z "${VM_KERNEL_PKG:-}" ] && [ -f "$current" ]; then
        VM_KVER=$(cat "$current")
        VM_KDIR=$VM_CACHE/kernel-$VM_KVER
        [ -f "$VM_KDIR/.ready" ] && return 0
    fi
    command -v depmod >/dev/null || vm_die "depmod not found: install kmod (scripts/install-deps.sh)"
    # Not in a command substitution: it sets VM_APT.
    vm_resolve_kernel_pkg >"$VM_CACHE/resolve.out"
    pkg=$(cat "$VM_CACHE/resolve.out")
    VM_KVER=${pkg#linux-image-}
    VM_KDIR=$VM_CACHE/kernel-$VM_KVER
    if [ ! -f "$VM_KDIR/.ready" ]; then
        # The image and the packages of the same kernel version it depends on.
        pkgs=("$pkg")
        while IFS= read -r p; do pkgs+=("$p"); done < <(apt-cache "${VM_APT[@]}" depends "$pkg" 2>/dev/null |
            awk -v s="-$VM_KVER" '$1 ~ /Depends:$/ { n = length(s); if (length($2) > n && substr($2, length($2) - n + 1) == s) print $2 }' |
            sort -u)
        vm_log "downloading ${pkgs[*]} (once; cached in $VM_KDIR)"
        tmp=$VM_CACHE/download.tmp
        rm -rf "$tmp" "$VM_KDIR"
        mkdir -p "$tmp/root"
        # apt-get download runs as the calling user; as root it warns about _apt's sandbox.
        if ! (cd "$tmp" && apt-get "${VM_APT[@]}" download -q "${pkgs[@]}") >"$VM_CACHE/download.log" 2>&1; then
            cat "$VM_CACHE/download.log" >&2
            vm_die "apt-get download ${pkgs[*]} failed"
        fi
        grep -v 'unsandboxed as root' "$VM_CACHE/download.log" >&2 || true
        for f in "$tmp"/*.deb; do dpkg-deb -x "$f" "$tmp/root"; done
        rm -rf "$VM_KDIR.tmp"
        mkdir -p "$VM_KDIR.tmp/boot" "$VM_KDIR.tmp/lib/modules"
        for src in "$tmp/root/lib/modules/$VM_KVER" "$tmp/root/usr/lib/modules/$VM_KVER" ""; do
            [ -z "$src" ] || [ -d "$src" ] && break
        done
        [ -n "$src" ] || vm_die "${pkgs[*]}: no lib/modules/$VM_KVER nor usr/lib/modules/$VM_KVER"
        mv "$src" "$VM_KDIR.tmp/lib/modules/$VM_KVER"
        if [ -f "$tmp/root/boot/vmlinuz-$VM_KVER" ]; then
            mv "$tmp/root/boot/vmlinuz-$VM_KVER" "$VM_KDIR.tmp/boot/"
        elif [ -f "$VM_KDIR.tmp/lib/modules/$VM_KVER/vmlinuz" ]; then
            mv "$VM_KDIR.tmp/lib/modules/$VM_KVER/vmlinuz" "$VM_KDIR.tmp/boot/vmlinuz-$VM_KVER"
        else
            vm_die "${pkgs[*]}: no boot/vmlinuz-$VM_KVER nor usr/lib/modules/$VM_KVER/vmlinuz"
        fi
        [ -f "$VM_KDIR.tmp/lib/modules/$VM_KVER/modules.builtin" ] ||
            vm_die "${pkgs[*]}: no modules.builtin for $VM_KVER (modprobe needs it)"
        depmod -b "$VM_KDIR.tmp" "$VM_KVER"
        rm -rf "$tmp"
        mv "$VM_KDIR.tmp" "$VM_KDIR"
        touch "$VM_KDIR/.ready"
    fi
    echo "$VM_KVER" >"$current"
}

# --- initramfs ----------------------------------------------------------------------------------

# What /init needs to mount the host's / over virtio-9p; their dependencies come along (7.3 has
# more modules than 6.12: 9pnet_fd, which 9p over virtio does not need, is split out of 9pnet).
VM_INITRD_MODULES=(9pnet_virtio 9p)

# Prints the modules and, first, everything they depend on (modules.dep order), once each.
vm_module_closure() {
    local m seen=" " out=()
    vm_module_visit() {
        local dep
        case $seen in *" $1 "*) return 0 ;; esac
        seen="$seen$1 "
        for dep in $(modinfo -b "$VM_KDIR" -k "$VM_KVER" -F depends "$1" 2>/dev/null | tr ',' ' '); do
            vm_module_visit "$dep"
        done
        out+=("$1")
    }
    for m in "$@"; do vm_module_visit "$m"; done
    printf '%s\n' "${out[@]}"
}
# Decompressed into the initramfs but loaded only by the boots that use them (/init).
VM_INITRD_EXTRA_MODULES=(overlay)

# Builds $VM_CACHE/initramfs-<kver>.cpio.gz: static busybox, /init, the 9p modules and overlay
# decompressed (busybox insmod cannot read .ko.xz). Rebuilt when /init, busybox or the module list
# change.
vm_build_initramfs() {
    local busybox stamp want dir m ko mods=()
    busybox=$(command -v busybox) || vm_die "busybox not found: install busybox-static"
    file_is_static "$busybox" || vm_die "$busybox is not static: install busybox-static"
    VM_INITRD_BASE=$VM_CACHE/initramfs-$VM_KVER.cpio.gz
    stamp=$VM_INITRD_BASE.stamp
    want=$({
        cat "$VM_ROOT/scripts/vm/init" "$busybox"
        echo "${VM_INITRD_MODULES[*]} / ${VM_INITRD_EXTRA_MODULES[*]}"
    } | sha256sum | cut -d' ' -f1)
    if [ -f "$VM_INITRD_BASE" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    vm_log "building the initramfs"
    dir=$VM_CACHE/initramfs.tmp
    rm -rf "$dir"
    mkdir -p "$dir"/{bin,dev,proc,sys,host,hostorig,mods,lib/modules}
    cp "$busybox" "$dir/bin/busybox"
    cp "$VM_ROOT/scripts/vm/init" "$dir/init"
    chmod 755 "$dir/init" "$dir/bin/busybox"
    while IFS= read -r m; do mods+=("$m"); done < <(vm_module_closure "${VM_INITRD_MODULES[@]}")
    for m in "${mods[@]}" "${VM_INITRD_EXTRA_MODULES[@]}"; do
        ko=$(modinfo -b "$VM_KDIR" -k "$VM_KVER" -n "$m" 2>/dev/null) ||
            vm_die "module $m not found in $VM_KDIR"
        case $ko in
        *.ko.xz) xz -dc "$ko" >"$dir/mods/$m.ko" ;;
        *.ko.zst) zstd -qdc "$ko" >"$dir/mods/$m.ko" ;;
        *.ko.gz) gzip -dc "$ko" >"$dir/mods/$m.ko" ;;
        *) cp "$ko" "$dir/mods/$m.ko" ;;
        esac
    done
    echo "${mods[*]}" >"$dir/mods/order"
    (cd "$dir" && find . -mindepth 1 | busybox cpio -o -H newc -R 0:0 2>/dev/null | gzip -1) \
        >"$VM_INITRD_BASE.tmp"
    mv "$VM_INITRD_BASE.tmp" "$VM_INITRD_BASE"
    echo "$want" >"$stamp"
    rm -rf "$dir"
}

# True when the executable is statically linked (ldd refuses it).
file_is_static() {
    ! ldd "$1" >/dev/null 2>&1
}

vm_prepare() {
    local lock
    command -v qemu-system-x86_64 >/dev/null || vm_die "qemu-system-x86_64 not found: run scripts/install-deps.sh"
    vm_init_paths
    # Serialise preparation between harnesses started at the same time.
    exec {lock}>"$VM_CACHE/.prepare.lock"
    flock "$lock"
    # The guest lays its kernel's modules over the host's /lib/modules, which must exist.
    if [ ! -d /lib/modules ]; then
        [ "$(id -u)" = 0 ] || vm_die "the host has no /lib/modules; create it once as root (mkdir /lib/modules)"
        mkdir -p /lib/modules
    fi
    vm_fetch_kernel
    # Physical path: the guest binds it from /hostorig, where an absolute symlink would escape.
    VM_KDIR=$(cd "$VM_KDIR" && pwd -P)
    vm_build_initramfs
    VM_KERNEL=$VM_KDIR/boot/vmlinuz-$VM_KVER
    exec {lock}>&-
}

# --- running a script in the guest --------------------------------------------------------------

# Single-quotes a value for the guest's busybox sh.
vm_shq() {
    local s=${1//\'/\'\\\'\'}
    printf "'%s'" "$s"
}

# Appends a tiny cpio holding /job.env (what to run) to the cached initramfs; the kernel unpacks
# concatenated archives in order. No path goes through the kernel command line (spaces, length).
vm_make_initrd() {
    local rundir=$1 name=$2 script=$3 timeout=$4 init=$5 j
    j=$rundir/job
    rm -rf "$j"
    mkdir -p "$j"
    {
        echo "VM_NAME=$(vm_shq "$name")"
        echo "VM_SCRIPT=$(vm_shq "$script")"
        echo "VM_TIMEOUT=$(vm_shq "$timeout")"
        echo "VM_INIT=$(vm_shq "$init")"
        echo "VM_ROOT=$(vm_shq "$VM_ROOT")"
        echo "VM_MODULES=$(vm_shq "$VM_KDIR/lib/modules")"
        echo "VM_RESULT=$(vm_shq "$rundir/result")"
        echo "VM_ZONEDD=$(vm_shq "$ZONEDD")"
        echo "VM_CI=$(vm_shq "${CI:-}")"
        echo "VM_9P_CACHE=$(vm_shq "${VM_9P_CACHE-loose}")"
        # Host paths the guest must see even if they live under /run (the guest mounts its own).
        echo "VM_PASSTHRU=$(vm_shq "$VM_ROOT
$(dirname "$script")
$VM_CACHE
$(dirname "$ZONEDD")")"
    } >"$j/job.env"
    # Variables named ZONEDD_VM_* reach the scenario (guest-run.sh sources this file).
    local var
    : >"$rundir/env"
    for var in $(compgen -e); do
        case $var in ZONEDD_VM_*) printf 'export %s=%q\n' "$var" "${!var}" >>"$rundir/env" ;; esac
    done
    cp "$VM_INITRD_BASE" "$rundir/initrd"
    # An uncompressed archive after a compressed one must start 4-byte aligned, else the kernel
    # says "invalid magic at start of compressed archive": pad with zeros (which it skips).
    head -c $(((4 - $(stat -c %s "$rundir/initrd") % 4) % 4)) /dev/zero >>"$rundir/initrd"
    (cd "$j" && echo job.env | busybox cpio -o -H newc -R 0:0 2>/dev/null) >>"$rundir/initrd"
}

# The run folder of the boot in progress: its qemu.pid is what an interrupted harness kills.
VM_CUR_RUNDIR=""
vm_kill_qemu() {
    local pid
    [ -n "$VM_CUR_RUNDIR" ] || return 0
    pid=$(cat "$VM_CUR_RUNDIR/qemu.pid" 2>/dev/null) || true
    [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
    VM_CUR_RUNDIR=""
}

# One boot. Sets VM_RC (script status, 124 timeout, 125 no result) and VM_STARTED (0/1).
vm_boot_once() {
    local rundir=$1 name=$2 script=$3 timeout=$4 mem=$5 init=$6 log qrc t0 t1 line
    log=$rundir/console.log
    rm -f "$rundir/result" "$rundir/qemu.pid" "$log"
    vm_make_initrd "$rundir" "$name" "$script" "$timeout" "$init"
    t0=$(date +%s.%N)
    VM_CUR_RUNDIR=$rundir
    # The host-side limit covers the boot and shutdown around the guest's own limit. The pipeline
    # runs in the background so that a signal to the harness is handled at once (see vm_run).
    (
        timeout --foreground -k 10 $((timeout + ${VM_BOOT_ALLOWANCE_S:-180})) \
            qemu-system-x86_64 \
            -accel tcg,thread=multi -cpu "${VM_CPU:-max}" -smp "${VM_SMP:-2}" -m "$mem" \
            -nographic -no-reboot -nic none \
            -kernel "$VM_KERNEL" -initrd "$rundir/initrd" \
            -append "console=ttyS0 quiet panic=-1 oops=panic" \
            -virtfs local,path=/,mount_tag=host,security_model=none,multidevs=remap \
            -pidfile "$rundir/qemu.pid" </dev/null 2>&1 |
            sed -u -e 's/\r//g; s/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g' | tee "$log" |
            while IFS= read -r line; do printf '  | %s\n' "$line"; done
        exit "${PIPESTATUS[0]}"
    ) &
    qrc=0
    wait $! || qrc=$?
    VM_CUR_RUNDIR=""
    t1=$(date +%s.%N)
    VM_WALL_S=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    VM_STARTED=0
    # Markers are matched anywhere in a line: kernel messages may share it.
    grep -q "ZONEDD-SCENARIO $name start" "$log" && VM_STARTED=1
    VM_BOOT_S=$(grep -o "ZONEDD-SCENARIO $name start uptime=[0-9.]*" "$log" | head -n1 | sed 's/.*uptime=//') || true
    if [ -f "$rundir/result" ] && grep -q '^rc=[0-9]*$' "$rundir/result"; then
        VM_RC=$(sed -n 's/^rc=//p' "$rundir/result")
    elif line=$(grep -o "ZONEDD-SCENARIO $name rc=[0-9]*" "$log" | tail -n1) && [ -n "$line" ]; then
        VM_RC=${line##*rc=}
    elif [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
        vm_log "$name: qemu killed after $((timeout + ${VM_BOOT_ALLOWANCE_S:-180})) s"
        VM_RC=124
    else
        VM_RC=125
    fi
}

vm_run() {
    local name=$1 script=$2 timeout=$3 mem=${4:-${VM_MEMORY:-4G}} init=${5:-chroot} rundir
    case $init in chroot | systemd) ;; *) vm_die "$name: unknown guest init '$init' (chroot or systemd)" ;; esac
    rundir=$VM_RUNS/$name
    mkdir -p "$rundir"
    # Two harnesses running the same scenario would share its run folder: take turns.
    exec {VM_RUN_LOCK}>"$rundir.lock"
    flock "$VM_RUN_LOCK"
    trap 'vm_kill_qemu' EXIT
    trap 'vm_kill_qemu; exit 130' INT
    trap 'vm_kill_qemu; exit 143' TERM
    vm_boot_once "$rundir" "$name" "$script" "$timeout" "$mem" "$init"
    if [ "$VM_STARTED" = 0 ]; then
        vm_log "$name: the guest never started the script (early crash?); retrying once"
        cp "$rundir/console.log" "$rundir/console.first-boot.log" 2>/dev/null || true
        local first_wall=$VM_WALL_S
        vm_boot_once "$rundir" "$name" "$script" "$timeout" "$mem" "$init"
        VM_WALL_S=$(awk -v a="$first_wall" -v b="$VM_WALL_S" 'BEGIN { printf "%.1f", a + b }')
    fi
    exec {VM_RUN_LOCK}>&-
}
