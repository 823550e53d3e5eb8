# Started by zonedd-vm-scenario.service in a systemd guest: runs scripts/vm/guest-run.sh with the
# job /init copied to /run/zonedd-vm-init/job.env, in the same clean environment as the chroot
# boot of scripts/vm/init (plus SYSTEMD_PAGER=cat: the scenario's output is the console, a tty).
# shellcheck shell=sh disable=SC1091
. /run/zonedd-vm-init/job.env
exec /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    TERM=dumb LANG=C.UTF-8 RUST_BACKTRACE=1 CI="$VM_CI" SYSTEMD_PAGER=cat \
    ZONEDD="$VM_ZONEDD" ZONEDD_ROOT="$VM_ROOT" \
    /bin/bash "$VM_ROOT/scripts/vm/guest-run.sh" "$VM_NAME" "$VM_SCRIPT" "$VM_TIMEOUT" "$VM_RESULT"
