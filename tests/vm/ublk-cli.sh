#!/usr/bin/env bash
# zonedd's device commands end to end on a real ublk_drv: `create` prints /dev/ublkbN and
# `id N` and returns only once the device is usable; data written with O_DIRECT reads back
# identical; `list` / `list --json` show the device live with its daemon; `status --json`
# answers from the daemon with counters that moved with the I/O; `recover` of a live device
# and `delete` of an unknown id fail with a message; `delete` removes the device, ends the
# daemon and cleans its socket and record. Uses the in-memory test target (mem:SIZE) unless
# ZONEDD_VM_BACKEND names another. `recover` of a device that does not exist fails with exit 2.
# Last, `create`'s refusals that need ublk (docs/bad-input.md), each with its exit code and
# message: an unformatted backend, a missing backend path, a plain file (left untouched), a
# second daemon on a backend already served (with or without --format; the first device stays
# live), and a caller that is not root. Only root talks to a daemon: the run directory is 0700
# and its files 0600, `list`/`status` as another user are refused, a non-root client on the
# socket is refused by the modes and, past them, by the daemon's SO_PEERCRED check, and a run
# directory that is a symlink is refused.
# The operator's view (docs/status.md): `status` prints a summary whose figures match
# `status --json`, `status --prometheus` the same counters, `list` the key figures; on an
# engine device (an emulated image) after writes into conventional zones, `reclaim --wait`
# drains them and reports the zones and bytes it reclaimed, the summary and the metrics (from
# `status --prometheus` and from the daemon's `--metrics` endpoint) show them; `reclaim` on a
# test target or without a daemon, and `--metrics` on a taken port, are refused (exit 2).
# vm-timeout: 900
set -euo pipefail
source "$(dirname "$0")/lib/devices.sh"
Z=$(zonedd_bin)
modprobe ublk_drv
ip link set lo up # for the --metrics endpoint

json() { # json EXPR  (reads JSON on stdin; EXPR is Python over `d`)
    python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"
}

vm_step "create"
out=$("$Z" create --backend "${ZONEDD_VM_BACKEND:-mem:256M}" --queues 2 --depth 32 --label clitest)
echo "$out"
bdev=$(sed -n 1p <<<"$out")
id=$(sed -n 's/^id //p' <<<"$out")
[ -b "$bdev" ] || vm_fail "create printed '$bdev', not a block device"
[ "$bdev" = "/dev/ublkb$id" ] || vm_fail "device $bdev does not match id '$id'"
[ "$(cat /sys/block/ublkb$id/queue/logical_block_size)" = 4096 ] || vm_fail "logical block size"
[ "$(cat /sys/block/ublkb$id/queue/write_cache)" = "write back" ] || vm_fail "no volatile write cache"
[ "$(cat /sys/block/ublkb$id/queue/fua)" = 1 ] || vm_fail "FUA not advertised"
[ "$(cat /sys/block/ublkb$id/queue/discard_granularity)" = 4096 ] || vm_fail "discard granularity"

vm_step "data round trip"
head -c $((8 << 20)) /dev/urandom >"$VM_SCRATCH/pattern"
dd if="$VM_SCRATCH/pattern" of="$bdev" bs=1M seek=3 oflag=direct status=none
dd if="$bdev" of="$VM_SCRATCH/back" bs=1M skip=3 count=8 iflag=direct status=none
cmp "$VM_SCRATCH/pattern" "$VM_SCRATCH/back" || vm_fail "read back differs"
blkdiscard -o $((3 << 20)) -l $((1 << 20)) "$bdev"
blkdiscard -z -o $((4 << 20)) -l $((1 << 20)) "$bdev"
sync "$bdev" 2>/dev/null || blockdev --flushbufs "$bdev"
echo "ok: 8 MiB round trip, discard, write zeroes"

vm_step "list"
"$Z" list
"$Z" list | grep -E "^$id +$bdev +live +[0-9]+ " >/dev/null || vm_fail "list does not show $bdev live with a pid"
# SIZE USED FREEZ RECLAIM WA ERR UP: a test target has a size and an error count, no zones.
"$Z" list | grep -E "^$id +$bdev +live +[0-9]+ +256 MiB +- +- +- +- +0 +[0-9][0-9dhms ]* +mem:256M +clitest" >/dev/null ||
    vm_fail "list lacks the figures: $("$Z" list)"
[ "$("$Z" list --json | json "[x for x in d if x['id']==$id][0]['capacity_bytes']")" = 268435456 ] ||
    vm_fail "list --json capacity_bytes: $("$Z" list --json)"
state=$("$Z" list --json | json "[x for x in d if x['id']==$id][0]['state']")
[ "$state" = live ] || vm_fail "list --json state '$state'"
label=$("$Z" list --json | json "[x for x in d if x['id']==$id][0]['label']")
[ "$label" = clitest ] || vm_fail "list --json label '$label'"

vm_step "status"
st=$("$Z" status "$id" --json)
"$Z" status "$id" | tee "$VM_SCRATCH/summary"
writes=$(json "d['frontend']['writes']" <<<"$st")
reads=$(json "d['frontend']['reads']" <<<"$st")
discards=$(json "d['frontend']['discards']" <<<"$st")
[ "$writes" -gt 0 ] && [ "$reads" -gt 0 ] && [ "$discards" -gt 0 ] ||
    vm_fail "status counters did not move: writes=$writes reads=$reads discards=$discards"
if [[ "${ZONEDD_VM_BACKEND:-mem:256M}" == mem:* ]]; then
    # A memory target never blocks: its queue threads serve every request (the ublk
    # floor), and nothing goes to the pool.
    [ "$(json "d['pool']['jobs_run']" <<<"$st")" = 0 ] ||
        vm_fail "the memory target's requests went to the pool"
    [ "$(json "d['frontend']['hop_free_writes'] > 0 and d['frontend']['hop_free_reads'] > 0" <<<"$st")" = True ] ||
        vm_fail "the memory target's requests were not served on the queue threads"
else
    [ "$(json "d['pool']['jobs_run'] > 0" <<<"$st")" = True ] || vm_fail "pool ran no jobs"
fi
echo "ok: writes=$writes reads=$reads discards=$discards"
# The summary's figures are the JSON's (a test target: no engine, so no zone lines).
pid=$(json "d['pid']" <<<"$st")
summary_has() { # summary_has REGEX: a line of the summary matches
    grep -qE -- "$1" "$VM_SCRATCH/summary" || vm_fail "summary lacks /$1/: $(cat "$VM_SCRATCH/summary")"
}
summary_has "^device    /dev/ublkb$id \\(id $id, label \"clitest\"\\), daemon pid $pid, up [0-9][0-9dhms ]*, zonedd "
summary_has "^backend   mem:256M: memory$"
summary_has "^capacity  256 MiB$"
summary_has "^I/O       $reads reads \\([0-9.]+ [KMG]iB\\), $writes writes \\(8 MiB\\), [0-9]+ flushes, $discards discards$"
summary_has "^errors    I/O errors 0, rejected requests 0$"
! grep -qE "^(zones|cache|reclaim) " "$VM_SCRATCH/summary" || vm_fail "zone lines for a test target"
"$Z" status "$id" --prometheus >"$VM_SCRATCH/prom"
for l in "zonedd_frontend_writes_total{id=\"$id\"} $writes" "zonedd_frontend_reads_total{id=\"$id\"} $reads" \
    "zonedd_capacity_bytes{id=\"$id\"} 268435456" "# TYPE zonedd_frontend_discards_total counter"; do
    grep -qxF "$l" "$VM_SCRATCH/prom" || vm_fail "status --prometheus lacks '$l': $(head -20 "$VM_SCRATCH/prom")"
done
echo "ok: summary and --prometheus show the counters of --json"

vm_step "errors"
if "$Z" recover "$id" 2>"$VM_SCRATCH/err"; then vm_fail "recover of a live device succeeded"; fi
grep -q "not quiesced" "$VM_SCRATCH/err" || vm_fail "recover message: $(cat "$VM_SCRATCH/err")"
expect_error 2 "zonedd: no ublk device 999" "$Z" delete 999
expect_error 2 "zonedd: no ublk device 4242" "$Z" recover 4242
expect_error 2 "zonedd: ublk device 4242 has no running zonedd daemon (device absent)" "$Z" reclaim 4242 --wait
[ "$(wc -l <"$VM_SCRATCH/err")" = 1 ] || vm_fail "reclaim 4242 printed more than our line: $(cat "$VM_SCRATCH/err")"
expect_error 2 "zonedd: ublk device 4242 has no running zonedd daemon (device absent)" "$Z" status 4242
[ "$(wc -l <"$VM_SCRATCH/err")" = 1 ] || vm_fail "status 4242 printed more than our line: $(cat "$VM_SCRATCH/err")"
expect_error 2 "zonedd: the daemon of device $id refused: mem:256M is a memory test target: it has no zones to reclaim" \
    "$Z" reclaim "$id" --wait
[ "$(wc -l <"$VM_SCRATCH/err")" = 1 ] || vm_fail "recover 4242 printed more than our line: $(cat "$VM_SCRATCH/err")"
echo "ok: error messages"

vm_step "delete"
pid=$("$Z" list --json | json "[x for x in d if x['id']==$id][0]['pid']")
"$Z" delete "$id"
[ ! -e "$bdev" ] || vm_fail "$bdev still exists"
if [ -e "/proc/$pid" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status"; then
    vm_fail "daemon $pid still running"
fi
[ ! -e "/run/zonedd/$id.sock" ] && [ ! -e "/run/zonedd/$id.json" ] || vm_fail "run files left"
[ "$("$Z" list --json | json "len(d)")" = 0 ] || vm_fail "list not empty after delete"

vm_step "SIGTERM shuts the daemon down cleanly"
out=$("$Z" create --backend mem:64M)
bdev=$(sed -n 1p <<<"$out")
id=$(sed -n 's/^id //p' <<<"$out")
pid=$("$Z" list --json | json "[x for x in d if x['id']==$id][0]['pid']")
kill -TERM "$pid"
for ((i = 0; i < 100; i++)); do
    [ -e "$bdev" ] || [ -e "/run/zonedd/$id.json" ] || break
    sleep 0.1
done
[ ! -e "$bdev" ] || vm_fail "$bdev still exists 10 s after SIGTERM"
[ ! -e "/run/zonedd/$id.json" ] || vm_fail "record left after SIGTERM"
echo "ok: SIGTERM removed the device"

vm_step "create refuses bad backends (docs/bad-input.md)"
img=$VM_SCRATCH/bad.img
"$Z" emulate "$img" --size 64M --zone-size 1M --conventional 8 >/dev/null
img=$(realpath "$img") # create names the backend by its canonical path
expect_error 2 "$img: no valid dm-zoned superblock: not formatted? run \`zonedd format --backend $img\` first" \
    "$Z" create --backend "$img"
expect_error 2 "/nonexistent/x.img: No such file or directory" \
    "$Z" create --backend /nonexistent/x.img
plain=$VM_SCRATCH/plain.txt
printf hello >"$plain"
plain=$(realpath "$plain")
expect_error 2 "$plain is a regular file without the zonedd image header; create an emulated SMR disk with \`zonedd emulate $plain --size SIZE\`" \
    "$Z" create --backend "$plain"
[ "$(cat "$plain")" = hello ] || vm_fail "create changed the plain file $plain"
"$Z" format --backend "$img" >/dev/null
expect_error 2 "zonedd: --index-memory-mib applies to log-layout volumes; $img is a dm-zoned volume" \
    "$Z" create --backend "$img" --index-memory-mib 64
expect_error 2 "zonedd: --compact applies to log-layout volumes; $img is a dm-zoned volume" \
    "$Z" create --backend "$img" --compact writes
out=$("$Z" create --backend "$img" --metrics 127.0.0.1:9577)
id=$(sed -n 's/^id //p' <<<"$out")
[ -b "/dev/ublkb$id" ] || vm_fail "create on $img printed '$out'"
expect_error 2 "$img is already used by ublk device $id (live)" "$Z" create --backend "$img"
expect_error 2 "$img is already used by ublk device $id (live)" "$Z" create --backend "$img" --format
"$Z" list | grep -E "^$id +/dev/ublkb$id +live " >/dev/null ||
    vm_fail "device $id not live after the refused creates: $("$Z" list)"
expect_error 2 "zonedd: --metrics 127.0.0.1:9577: address already in use" \
    "$Z" create --backend mem:64M --metrics 127.0.0.1:9577
[ "$("$Z" list --json | json "len(d)")" = 1 ] || vm_fail "a refused --metrics left a device: $("$Z" list)"

vm_step "reclaim --wait on an engine device"
got=$("$Z" status "$id" --json |
    json "d['chunk_bytes'], d['geometry']['conventional_zones'] - d['engine']['zones_meta'], d['capacity_bytes']")
read -r cs usable cap <<<"$got"
# Reads of the last (unwritten) chunk keep the device from looking idle, so that reclaim's
# idle timer (10 s without I/O) cannot move the chunks before `reclaim` is asked to.
(while :; do
    dd if="/dev/ublkb$id" of=/dev/null bs=4096 skip=$((cap / 4096 - 1)) count=1 iflag=direct status=none 2>/dev/null || exit 0
    sleep 1
done) &
reader=$!
# Block 1 of chunks 0 and 1: not a chunk's first block, so each takes a conventional zone.
for c in 0 1; do
    dd if=/dev/urandom of="/dev/ublkb$id" bs=4096 seek=$((c * cs / 4096 + 1)) count=1 oflag=direct status=none
done
"$Z" reclaim "$id" --wait --json >"$VM_SCRATCH/reclaim.json"
cat "$VM_SCRATCH/reclaim.json"
# Done, 2 conventional zones in use before and none after, 2 zones reclaimed, and 16 KiB
# copied: each chunk moved to a sequential zone, block 1 and block 0 as zeros before it.
got=$(json "d['done'], d['conventional_in_use_before'], d['conventional_in_use_after'], d['zones_reclaimed'], d['bytes_copied']" \
    <"$VM_SCRATCH/reclaim.json")
[ "$got" = "True 2 0 2 16384" ] || vm_fail "reclaim --wait --json: $(cat "$VM_SCRATCH/reclaim.json")"
# Without --json: plain progress lines on stderr (not a terminal), the result on stdout.
dd if=/dev/urandom of="/dev/ublkb$id" bs=4096 seek=$((2 * cs / 4096 + 1)) count=1 oflag=direct status=none
line=$("$Z" reclaim "$id" --wait 2>"$VM_SCRATCH/progress")
echo "$line"
grep -E "^device $id: reclaimed 1 zone, 8 KiB copied; conventional zones in use 1 -> 0 of $usable, [0-9]+ zones free$" \
    <<<"$line" >/dev/null || vm_fail "reclaim --wait printed '$line'"
grep -qE "^reclaim (idle|running): [0-9]+ zones?, " "$VM_SCRATCH/progress" ||
    vm_fail "no progress lines: $(cat "$VM_SCRATCH/progress")"
[ "$(dd if="/dev/ublkb$id" bs=4096 count=1 iflag=direct status=none | tr -d '\0' | wc -c)" = 0 ] ||
    vm_fail "block 0 of chunk 0 is not zeros after reclaim"
kill "$reader" && wait "$reader" 2>/dev/null || true
echo "ok: reclaim --wait drained the conventional zones and said what it moved"

vm_step "status and metrics of an engine device"
st=$("$Z" status "$id" --json)
"$Z" status "$id" | tee "$VM_SCRATCH/summary"
rz=$(json "d['engine']['reclaim_zones']" <<<"$st")
[ "$rz" -ge 3 ] || vm_fail "reclaim_zones $rz after three moves"
summary_has "^backend   $img: dm-zoned v2, 64 zones of 1 MiB \\(8 conventional\\)$"
summary_has "^capacity  [0-9.]+ MiB: 3 MiB used \\([0-9]+ %, 3 of [0-9]+ chunks mapped\\), [0-9.]+ MiB free$"
summary_has "^cache     0 of $usable conventional zones in use \\(0 %\\): 0 data, 0 buffer$"
summary_has "^reclaim   idle; $rz zones reclaimed since start, [0-9.]+ KiB copied$"
summary_has "^write amp [0-9]+\\.[0-9]{2} \\("
summary_has "^zones     64 total: free [0-9]+ \\(conventional $usable, sequential [0-9]+\\), data 3, buffer 0, "
"$Z" status "$id" --prometheus >"$VM_SCRATCH/prom"
curl -sf http://127.0.0.1:9577/metrics >"$VM_SCRATCH/scrape" || vm_fail "GET /metrics failed"
for f in prom scrape; do
    for l in "zonedd_reclaim_zones_total{id=\"$id\"} $rz" "zonedd_zones{id=\"$id\",role=\"data\"} 3" \
        "zonedd_zones{id=\"$id\",role=\"free_conventional\"} $usable" "zonedd_reclaim_running{id=\"$id\"} 0"; do
        grep -qxF "$l" "$VM_SCRATCH/$f" || vm_fail "$f lacks '$l': $(grep -E 'reclaim|zones' "$VM_SCRATCH/$f")"
    done
done
echo "ok: summary, status --prometheus and GET /metrics agree"
"$Z" reclaim "$id" | grep -E "^device $id: reclaim pass [0-9]+ started$" >/dev/null || vm_fail "reclaim without --wait"
# Only root talks to the daemon: a private run directory, private files, and a daemon that
# checks its peer's credentials (SO_PEERCRED) even when the file modes would let a user in.
for f in /run/zonedd:700 "/run/zonedd/$id.sock:600" "/run/zonedd/$id.json:600" "/run/zonedd/$id.log:600"; do
    [ "$(stat -c %a "${f%:*}")" = "${f##*:}" ] ||
        vm_fail "${f%:*} has mode $(stat -c %a "${f%:*}"), expected ${f##*:}"
done
nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
expect_error 2 "zonedd list needs root: zonedd's run directory (/run/zonedd) and control sockets are root's only" \
    "${nobody[@]}" "$Z" list
expect_error 2 "zonedd status needs root" "${nobody[@]}" "$Z" status "$id"
expect_error 2 "zonedd reclaim needs root" "${nobody[@]}" "$Z" reclaim "$id" --wait
client='import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("EACCES"); sys.exit(0)
try:
    s.sendall(b"{\"cmd\":\"shutdown\"}\n")
except BrokenPipeError:
    pass
print(s.makefile().readline().strip())'
got=$("${nobody[@]}" python3 -c "$client" "/run/zonedd/$id.sock")
[ "$got" = EACCES ] || vm_fail "a non-root client reached the socket: $got"
chmod 0711 /run/zonedd && chmod 0666 "/run/zonedd/$id.sock"
got=$("${nobody[@]}" python3 -c "$client" "/run/zonedd/$id.sock")
chmod 0700 /run/zonedd && chmod 0600 "/run/zonedd/$id.sock"
grep -qF '"ok":false' <<<"$got" && grep -qF "permission denied" <<<"$got" ||
    vm_fail "a non-root client past the file modes was not refused: $got"
"$Z" list | grep -E "^$id +/dev/ublkb$id +live " >/dev/null ||
    vm_fail "a non-root shutdown request stopped device $id: $("$Z" list)"
echo "ok: non-root clients refused ($got)"
"$Z" delete "$id" >/dev/null
# A run directory that is not ours is refused before anything is created in it.
mkdir -p "$VM_SCRATCH/rundir" && ln -s "$VM_SCRATCH/rundir" "$VM_SCRATCH/rundir-link"
expect_error 2 "refusing to use $VM_SCRATCH/rundir-link as the run directory: it is a symbolic link" \
    env ZONEDD_RUN_DIR="$VM_SCRATCH/rundir-link" "$Z" create --backend "$img"
expect_error 2 "zonedd create needs root (CAP_SYS_ADMIN)" \
    setpriv --reuid=65534 --regid=65534 --clear-groups "$Z" create --backend "$img"
[ "$("$Z" list --json | json "len(d)")" = 0 ] || vm_fail "a device was left: $("$Z" list)"
echo "ublk-cli: all checks passed"
