# Helpers for VM scenarios (sourced): zoned test devices and the zonedd binary. Run as root in the
# guest (scripts/vm-test.sh); every function fails loudly (non-zero, message on stderr).
#
#   zonedd_bin                                   path of the built zonedd (honours $ZONEDD)
#   make_nullb NAME SIZE_MB ZONE_MB NR_CONV [MAX_OPEN] [MAX_ACTIVE] [ZONE_CAP_MB]
#                                                memory-backed host-managed null_blk, 4 KiB blocks;
#                                                prints /dev/nullbN (NAME: configfs name, e.g. nullb0);
#                                                null_blk ignores (0 = none) a MAX_OPEN or MAX_ACTIVE
#                                                that is not below the number of sequential zones;
#                                                ZONE_MB 0: a conventional (not zoned) disk with
#                                                discard, e.g. a baseline to compare zonedd with;
#                                                NULLB_HW_QUEUE_DEPTH=N in its environment: a
#                                                hardware queue of N requests (null_blk's 64 else)
#   remove_nullb NAME|/dev/NAME                  power it off and remove it
#   make_scsi_debug_smr SIZE_MB ZONE_MB NR_CONV [MAX_OPEN]
#                                                scsi_debug zbc=host-managed, 4 KiB sectors, like a
#                                                SATA/SAS SMR disk; prints /dev/sdX (one at a time)
#   remove_scsi_debug                            unload scsi_debug
#   zoned_model DEV                              none | host-aware | host-managed
#   wait_for_path PATH [SECONDS]                 wait until PATH exists (default 10 s)
#   vm_step MESSAGE / vm_fail MESSAGE            progress line / failure (exit 1)
#   expect_error CODE WORDS CMD...               CMD exits with status CODE and its stderr
#                                                contains WORDS (fixed string); fails otherwise

vm_step() { printf '== [%s s] %s\n' "$(cut -d' ' -f1 /proc/uptime)" "$*" >&2; }
vm_fail() {
    printf 'FAIL: %s\n' "$*" >&2
    exit 1
}

expect_error() {
    local code=$1 words=$2 rc=0
    shift 2
    "$@" >"$VM_SCRATCH/out" 2>"$VM_SCRATCH/err" || rc=$?
    [ "$rc" = "$code" ] || vm_fail "$*: exit $rc, expected $code: $(cat "$VM_SCRATCH/err")"
    grep -qF -- "$words" "$VM_SCRATCH/err" ||
        vm_fail "$*: stderr lacks '$words': $(cat "$VM_SCRATCH/err")"
    echo "ok: exit $rc: $(head -n 1 "$VM_SCRATCH/err")"
}

# Path of the zonedd binary: $ZONEDD when set, else target/release/zonedd of this checkout.
zonedd_bin() {
    local bin=${ZONEDD:-}
    if [ -z "$bin" ]; then
        local root=${ZONEDD_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd -P)}
        bin=$root/target/release/zonedd
    fi
    [ -x "$bin" ] || {
        echo "zonedd_bin: $bin is missing (cargo build --release -p zonedd)" >&2
        return 1
    }
    printf '%s\n' "$bin"
}

wait_for_path() {
    local path=$1 secs=${2:-10} i
    for ((i = 0; i < secs * 10; i++)); do
        [ -e "$path" ] && return 0
        sleep 0.1
    done
    echo "wait_for_path: $path did not appear within ${secs} s" >&2
    return 1
}

zoned_model() {
    local dev=${1#/dev/}
    cat "/sys/block/$dev/queue/zoned"
}

_nullb_cfs=/sys/kernel/config/nullb

make_nullb() {
    if [ $# -lt 4 ]; then
        echo "usage: make_nullb NAME SIZE_MB ZONE_MB NR_CONV [MAX_OPEN] [MAX_ACTIVE] [ZONE_CAP_MB]" >&2
        return 2
    fi
    local name=$1 size=$2 zone=$3 conv=$4 max_open=${5:-0} max_active=${6:-0} cap=${7:-0} d dev
    if [ ! -d /sys/module/null_blk ]; then
        # nr_devices=0: no default nullb0, every device comes from configfs.
        modprobe null_blk nr_devices=0 || return 1
    fi
    mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config || return 1
    d=$_nullb_cfs/$name
    [ ! -e "$d" ] || {
        echo "make_nullb: $d already exists" >&2
        return 1
    }
    mkdir "$d" || return 1
    if [ "$zone" = 0 ]; then
        {
            echo 4096 >"$d/blocksize" &&
                echo "$size" >"$d/size" &&
                echo 1 >"$d/memory_backed" &&
                echo 1 >"$d/discard" &&
                echo 1 >"$d/power"
        } || {
            echo "make_nullb: configuring $name failed" >&2
            rmdir "$d" 2>/dev/null
            return 1
        }
    elif ! {
        echo 4096 >"$d/blocksize" &&
            echo "$size" >"$d/size" &&
            echo 1 >"$d/memory_backed" &&
            echo 1 >"$d/zoned" &&
            echo "$zone" >"$d/zone_size" &&
            echo "$cap" >"$d/zone_capacity" &&
            echo "$conv" >"$d/zone_nr_conv" &&
            echo "$max_open" >"$d/zone_max_open" &&
            echo "$max_active" >"$d/zone_max_active" &&
            { [ -z "${NULLB_HW_QUEUE_DEPTH:-}" ] || echo "$NULLB_HW_QUEUE_DEPTH" >"$d/hw_queue_depth"; } &&
            echo 1 >"$d/power"
    }; then
        echo "make_nullb: configuring $name failed" >&2
        rmdir "$d" 2>/dev/null
        return 1
    fi
    # This kernel names the disk after the configfs item; older ones used nullb<index>.
    dev=/dev/$name
    [ -e "/sys/block/$name" ] || dev=/dev/nullb$(cat "$d/index")
    wait_for_path "$dev" || return 1
    printf '%s\n' "$dev"
}

remove_nullb() {
    local name=${1#/dev/} d
    d=$_nullb_cfs/$name
    [ -d "$d" ] || {
        echo "remove_nullb: no $d" >&2
        return 1
    }
    echo 0 >"$d/power" && rmdir "$d"
}

make_scsi_debug_smr() {
    if [ $# -lt 3 ]; then
        echo "usage: make_scsi_debug_smr SIZE_MB ZONE_MB NR_CONV [MAX_OPEN]" >&2
        return 2
    fi
    local size=$1 zone=$2 conv=$3 max_open=${4:-} extra=() blk i
    [ ! -d /sys/module/scsi_debug ] || {
        echo "make_scsi_debug_smr: scsi_debug is already loaded (one disk at a time)" >&2
        return 1
    }
    [ -z "$max_open" ] || extra=("max_open=$max_open")
    # sd_mod is a module in this kernel: without it no /dev/sdX appears.
    modprobe sd_mod || return 1
    modprobe scsi_debug zbc=host-managed sector_size=4096 dev_size_mb="$size" \
        zone_size_mb="$zone" zone_nr_conv="$conv" "${extra[@]}" || return 1
    # The scan is asynchronous: wait for the disk under scsi_debug's adapter.
    for ((i = 0; i < 100; i++)); do
        blk=$(ls -d /sys/bus/pseudo/drivers/scsi_debug/adapter*/host*/target*/*/block/* 2>/dev/null | head -n1) || true
        [ -z "$blk" ] || break
        sleep 0.1
    done
    [ -n "$blk" ] || {
        echo "make_scsi_debug_smr: no block device appeared for scsi_debug" >&2
        return 1
    }
    wait_for_path "/dev/${blk##*/}" || return 1
    printf '/dev/%s\n' "${blk##*/}"
}

remove_scsi_debug() {
    [ -d /sys/module/scsi_debug ] || return 0
    modprobe -r scsi_debug
}
