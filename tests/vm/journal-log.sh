#!/usr/bin/env bash
# Where a daemon's log lines go (src/logging.rs), against a stand-in journald: a datagram socket
# at /run/systemd/journal/socket (the guest's own /run) that records each entry of journald's
# native protocol. A `create --foreground` that systemd would run (INVOCATION_ID set) logs to it:
# SYSLOG_IDENTIFIER=zonedd, levels as syslog priorities (a warning at 4, info at 6), and once the
# device exists every entry carries ZONEDD_DEVICE=<its id>. RUST_LOG=warn drops the info lines and
# keeps the warning. A daemonizing `create` run by a unit logs there too. Without journald the
# same daemon says so in one line and logs to stderr. Outside systemd nothing reaches the journal
# and the daemon's log file in /run/zonedd is there as before.
# vm-timeout: 400
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv

sock=/run/systemd/journal/socket
entries=$VM_SCRATCH/journal.jsonl
# NOTIFY_SOCKET names nothing: `create --foreground` warns that sd_notify failed (a WARN line).
nosock=/run/zonedd-vm-no-notify

journald_pid=""
start_journald() {
    rm -f "$entries" "$entries.ready"
    python3 - "$sock" "$entries" <<'EOF' &
import json, os, socket, struct, sys
path, out = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(path), exist_ok=True)
if os.path.exists(path):
    os.unlink(path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
open(out + ".ready", "w").close()
while True:
    data = s.recv(1 << 20)
    fields, i = {}, 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            i = nl + 1
        else:  # NAME\n, 64-bit little-endian length, value, \n
            k, (n,) = line, struct.unpack("<Q", data[nl + 1:nl + 9])
            v = data[nl + 9:nl + 9 + n]
            i = nl + 9 + n + 1
        fields[k.decode()] = v.decode(errors="replace")
    if fields:
        with open(out, "a") as f:
            f.write(json.dumps(fields) + "\n")
EOF
    journald_pid=$!
    wait_for_path "$entries.ready" 20
    touch "$entries"
}
stop_journald() {
    [ -z "$journald_pid" ] || kill "$journald_pid" 2>/dev/null || true
    wait "$journald_pid" 2>/dev/null || true
    journald_pid=""
    rm -f "$sock"
}
trap stop_journald EXIT

# How many entries match each Python condition over `e` (one entry's fields), one count a line:
# one python3 start for all of them (each start costs seconds in the emulated guest). First a
# marker goes through the socket: once the stand-in has recorded it, it has recorded every entry
# sent before it.
counts() {
    python3 -c "
import json, os, socket, sys, time
path, sock = sys.argv[1], sys.argv[2]
marker = 'sync-%d' % time.time_ns()
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(('ZONEDD_VM_SYNC=%s\\n' % marker).encode(), sock)
deadline = time.time() + 60
while marker not in open(path).read():
    if time.time() > deadline:
        sys.exit('the journal stand-in did not catch up')
    time.sleep(0.05)
es = [e for e in map(json.loads, open(path)) if 'ZONEDD_VM_SYNC' not in e]
for c in sys.argv[3:]:
    print(sum(1 for e in es if eval(c, {'e': e})))
" "$entries" "$sock" "$@"
}
# expect_counts COND WANT MESSAGE [COND WANT MESSAGE ...]
expect_counts() {
    local conds=() wants=() msgs=() got i=0 n
    while [ $# -gt 0 ]; do
        conds+=("$1") wants+=("$2") msgs+=("$3")
        shift 3
    done
    # (a file, not <(...): the guest has no /dev/fd)
    counts "${conds[@]}" >"$VM_SCRATCH/counts" || vm_fail "counting journal entries failed"
    while IFS= read -r n; do
        [ "$n" = "${wants[$i]}" ] || vm_fail "${msgs[$i]} ($n entries, want ${wants[$i]}): $(cat "$entries")"
        i=$((i + 1))
    done <"$VM_SCRATCH/counts"
    [ "$i" = "${#conds[@]}" ] || vm_fail "counting journal entries failed"
}

# Starts `create --foreground` with ENV... in the background; sets ID and FG_PID.
start_foreground() {
    rm -f "$VM_SCRATCH/fg.out" "$VM_SCRATCH/fg.err"
    env "$@" "$Z" create --backend mem:64M --foreground >"$VM_SCRATCH/fg.out" 2>"$VM_SCRATCH/fg.err" &
    FG_PID=$!
    local i
    for i in $(seq 1 200); do
        # The shell may not have opened fg.out for the background job yet.
        ID=$(sed -n 's/^id //p' "$VM_SCRATCH/fg.out" 2>/dev/null || true)
        [ -z "$ID" ] || return 0
        kill -0 "$FG_PID" 2>/dev/null || vm_fail "create --foreground exited: $(cat "$VM_SCRATCH/fg.err")"
        sleep 0.1
    done
    vm_fail "create --foreground printed no id in 20 s"
}
stop_foreground() {
    "$Z" delete "$ID"
    wait "$FG_PID" || vm_fail "create --foreground exited $?: $(cat "$VM_SCRATCH/fg.err")"
}

vm_step "under systemd: the journal, with the device id"
start_journald
start_foreground INVOCATION_ID=0123456789abcdef NOTIFY_SOCKET=$nosock
stop_foreground
dev="e.get('ZONEDD_DEVICE') == '$ID'"
expect_counts \
    "e.get('SYSLOG_IDENTIFIER') != 'zonedd'" 0 "entries without SYSLOG_IDENTIFIER=zonedd" \
    "$dev and e['PRIORITY'] == '4' and 'sd_notify' in e['MESSAGE']" 1 \
    "the warning (priority 4) about sd_notify with ZONEDD_DEVICE=$ID" \
    "$dev and e['PRIORITY'] == '6' and e['MESSAGE'] == 'stopping ublk device $ID'" 1 \
    "the info line (priority 6) 'stopping ublk device $ID' with ZONEDD_DEVICE=$ID" \
    "$dev and e['MESSAGE'] == 'ublk device $ID removed'" 1 "'ublk device $ID removed' with ZONEDD_DEVICE=$ID" \
    "'ZONEDD_DEVICE' in e and not ($dev)" 0 "entries with another device id"
grep -v ZONEDD_VM_SYNC "$entries"
! grep -q "stopping ublk device" "$VM_SCRATCH/fg.err" || vm_fail "log lines on stderr too: $(cat "$VM_SCRATCH/fg.err")"
echo "ok: $(grep -vc ZONEDD_VM_SYNC "$entries") entries, ZONEDD_DEVICE=$ID, priorities 4 and 6"

vm_step "RUST_LOG=warn: the warning only"
start_journald
start_foreground INVOCATION_ID=0123456789abcdef NOTIFY_SOCKET=$nosock RUST_LOG=warn
stop_foreground
expect_counts \
    "e['PRIORITY'] == '4' and 'sd_notify' in e['MESSAGE']" 1 "the warning" \
    "e['PRIORITY'] == '6'" 0 "info lines with RUST_LOG=warn"
echo "ok: RUST_LOG respected"

vm_step "a daemonizing create run by a unit"
start_journald
out=$(INVOCATION_ID=0123456789abcdef "$Z" create --backend mem:64M)
ID=$(sed -n 's/^id //p' <<<"$out")
"$Z" delete "$ID" # returns once the daemon has logged its last line
expect_counts "e.get('ZONEDD_DEVICE') == '$ID' and e['MESSAGE'] == 'stopping ublk device $ID'" 1 \
    "the daemonized child's 'stopping ublk device $ID'"
echo "ok: daemonized child in the journal"

vm_step "no journald: one line, then stderr"
stop_journald
start_foreground INVOCATION_ID=0123456789abcdef
stop_foreground
cat "$VM_SCRATCH/fg.err"
[ "$(grep -c "journald is not reachable" "$VM_SCRATCH/fg.err")" = 1 ] || vm_fail "no 'journald is not reachable' line"
grep -q "stopping ublk device $ID" "$VM_SCRATCH/fg.err" || vm_fail "the info lines did not reach stderr"
echo "ok: fallback to stderr"

vm_step "outside systemd: the log file, not the journal"
start_journald
out=$("$Z" create --backend mem:64M)
ID=$(sed -n 's/^id //p' <<<"$out")
[ -f "/run/zonedd/$ID.log" ] || vm_fail "no /run/zonedd/$ID.log"
[ "$(stat -c %a "/run/zonedd/$ID.log")" = 600 ] || vm_fail "log file mode $(stat -c %a "/run/zonedd/$ID.log")"
"$Z" delete "$ID"
expect_counts True 0 "entries in the journal from a daemon outside systemd"
start_foreground
stop_foreground
expect_counts True 0 "entries in the journal from create --foreground outside systemd"
echo "ok: log file kept, journal untouched"

echo "journal-log: all checks passed"
