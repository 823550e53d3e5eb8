#!/usr/bin/env bash
# Multi-device volumes in the VM: four concurrent sequential streams (fio) on a cache device
# (memory null_blk) and one or two zoned drives served by `zonedd expose --timing hdd`,
# zonedd against the kernel's dm-zoned on the same devices, in one boot. Prints MB/s per
# target and drive count (median over the rounds) and the ratios: two drives / one, zonedd /
# dm-zoned. The drives run the hdd model scaled down to rates qemu TCG keeps up with
# (PARAMS; see scripts/bench-hdd-model.sh): the ratios are the model's, not a real drive's
# MB/s. The host-side counterpart at full rates is `cargo bench --bench multidrive`.
#
#   scripts/bench-multidrive.sh [--no-build] [--rounds N] [--params "K=V ..."] [--cache-mb N]
#                               [--job-mb N] [--rand-secs N] [--rand-rounds N] [--base BIN]
#                               [--beyond-secs N] [--beyond-mb N] [--beyond-no-dmzoned]
# (defaults: 2 rounds, a 128 MiB cache: 6 cache zones; 4 jobs of 96 MiB: 384 MiB, three times
# what the cache zones hold, so dm-zoned, which writes every new chunk into a cache zone
# first, is bound by its reclaim onto the drives, not by the memory cache; then 1 round of
# 20 s of 4 KiB random writes over a span that fits the cache: zonedd, zonedd with every
# write through the pool, dm-zoned, zonedd's in-memory target, and the cache device itself, in
# turn; with --base BIN also that build of zonedd. --rounds 0 runs only the random writes;
# --rand-secs 0 skips them. --beyond-secs N: also N s of random writes over a span beyond the
# cache zones (--beyond-mb, default three times what they hold), on memory null_blk drives, a
# multi-device volume against a single-device one with as much conventional space, zonedd
# and dm-zoned (--beyond-no-dmzoned: zonedd only), with --base BIN also that build on both
# volumes; see scripts/bench/multidrive-guest.sh)
#
# Results: target/bench-vm/multidrive-<UTC stamp>/ (fio JSON, status, runs.tsv, results.txt).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
# shellcheck source=scripts/vm/lib.sh
source "$ROOT/scripts/vm/lib.sh"
build=1 rounds=2 cache_mb=128 job_mb=96 rand_secs=20 rand_rounds=1 base="" beyond_secs=0 beyond_mb=0 beyond_dmzoned=1
params="outer_mbps=5 inner_mbps=5 iface_mbps=6 cache_mib=8 disk_size=20T"
while [ $# -gt 0 ]; do
    case $1 in
    --no-build) build=0 ;;
    --rounds) rounds=$2 && shift ;;
    --params) params=$2 && shift ;;
    --cache-mb) cache_mb=$2 && shift ;;
    --job-mb) job_mb=$2 && shift ;;
    --rand-secs) rand_secs=$2 && shift ;;
    --rand-rounds) rand_rounds=$2 && shift ;;
    --base) base=$2 && shift ;;
    --beyond-secs) beyond_secs=$2 && shift ;;
    --beyond-mb) beyond_mb=$2 && shift ;;
    --beyond-no-dmzoned) beyond_dmzoned=0 ;;
    *) vm_die "unknown argument $1" ;;
    esac
    shift
done
vm_prepare
if [ "$build" = 1 ]; then
    (cd "$ROOT" && cargo build --release -p zonedd) || vm_die "building zonedd failed"
fi
out=$VM_TARGET_DIR/bench-vm/multidrive-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
cp "$ZONEDD" "$out/zonedd"
[ -z "$base" ] || cp "$base" "$out/zonedd-base"
scenario=$out/multidrive.sh
cat >"$scenario" <<EOS
#!/usr/bin/env bash
export ZONEDD=$(vm_shq "$out/zonedd")
${base:+export ZONEDD_BASE=$(vm_shq "$out/zonedd-base")}
export BEYOND_DMZONED=$beyond_dmzoned
exec bash $(vm_shq "$ROOT/scripts/bench/multidrive-guest.sh") --out $(vm_shq "$out") --params $(vm_shq "$params") --rounds $rounds --cache-mb $cache_mb --job-mb $job_mb --rand-secs $rand_secs --rand-rounds $rand_rounds --beyond-secs $beyond_secs --beyond-mb $beyond_mb
EOS
vm_run bench-multidrive "$scenario" 3000 "${VM_MEMORY:-4G}"
cp "$VM_RUNS/bench-multidrive/console.log" "$out/console.log" 2>/dev/null || true
[ "$VM_RC" = 0 ] || vm_die "the guest run failed (exit $VM_RC; see $out/console.log)"
python3 - "$out" "$params" "$cache_mb" "$job_mb" <<'EOF2' | tee "$out/results.txt"
import csv, os, statistics, sys
out, params, cache_mb, job_mb = sys.argv[1:5]
runs, drained = {}, {}
for r in csv.DictReader(open(os.path.join(out, "runs.tsv")), delimiter="\t"):
    k = (r["target"], int(r["drives"]))
    runs.setdefault(k, []).append(float(r["MBps"]))
    drained.setdefault(k, []).append(float(r["drained_MBps"]))
med = {k: statistics.median(v) for k, v in runs.items()}
dmed = {k: statistics.median(v) for k, v in drained.items()}
if med:
    print(f"drives on the hdd model ({params}); cache {cache_mb} MiB; 4 streams x {job_mb} MiB, 1 MiB QD1 O_DIRECT, then fsync (cut at 300 s)")
    print("| target | drives | fio MB/s (median) | runs | 2 drives / 1 | MB/s until on the drives | runs | 2 drives / 1 |")
    print("|---|---|---|---|---|---|---|---|")
for (t, n), m in sorted(med.items()):
    two = med.get((t, 2), 0) / med[(t, 1)] if n == 2 and (t, 1) in med else None
    dtwo = dmed.get((t, 2), 0) / dmed[(t, 1)] if n == 2 and (t, 1) in dmed else None
    print(f"| {t} | {n} | {m:.2f} | {' '.join(f'{x:.2f}' for x in runs[(t, n)])} | {f'{two:.2f}x' if two else ''} "
          f"| {dmed[(t, n)]:.2f} | {' '.join(f'{x:.2f}' for x in drained[(t, n)])} | {f'{dtwo:.2f}x' if dtwo else ''} |")
for n in (1, 2):
    if ("zonedd", n) in med and ("dm-zoned", n) in med:
        print(f"\nzonedd / dm-zoned, {n} drive(s): fio {med[('zonedd', n)] / med[('dm-zoned', n)]:.2f}x, "
              f"until on the drives {dmed[('zonedd', n)] / dmed[('dm-zoned', n)]:.2f}x")
rand = os.path.join(out, "rand.tsv")
if os.path.exists(rand):
    iops = {}
    for r in csv.DictReader(open(rand), delimiter="\t"):
        iops.setdefault(r["target"], []).append(float(r["IOPS"]))
    imed = {t: statistics.median(v) for t, v in iops.items()}
    cache = imed.get("cache device")
    print("\n4 KiB random writes, QD32, 64 MiB span (fits the cache zones), two drives (medians)")
    print("| target | IOPS | runs | / cache device |")
    print("|---|---|---|---|")
    for t, v in imed.items():
        runs_ = " ".join(f"{x:.0f}" for x in iops[t])
        print(f"| {t} | {v:.0f} | {runs_} | {v / cache:.2f}x |" if cache else f"| {t} | {v:.0f} | {runs_} | |")
    if "zonedd" in imed and "zonedd (pool)" in imed:
        print(f"\nzonedd / zonedd (pool): {imed['zonedd'] / imed['zonedd (pool)']:.2f}x")
    fl = imed.get("floor (ublk, memory target)")
    if "zonedd" in imed and fl:
        print(f"zonedd / floor: {imed['zonedd'] / fl:.2f}x")
    if "zonedd" in imed and "zonedd (base)" in imed:
        print(f"zonedd / zonedd (base): {imed['zonedd'] / imed['zonedd (base)']:.2f}x")
    if "zonedd" in imed and "dm-zoned" in imed:
        print(f"zonedd / dm-zoned: {imed['zonedd'] / imed['dm-zoned']:.2f}x")
beyond = os.path.join(out, "beyond.tsv")
if os.path.exists(beyond):
    biops = {}
    for r in csv.DictReader(open(beyond), delimiter="\t"):
        biops.setdefault((r["target"], r["volume"]), []).append(float(r["IOPS"]))
    bmed = {k: statistics.median(v) for k, v in biops.items()}
    print("\n4 KiB random writes, QD32, beyond the cache zones after a sequential fill (memory null_blk devices; medians)")
    print("| target | volume | IOPS | runs |")
    print("|---|---|---|---|")
    for (t, v), m in sorted(bmed.items()):
        print(f"| {t} | {v} | {m:.0f} | {' '.join(f'{x:.0f}' for x in biops[(t, v)])} |")
    def ratio(a, b):
        if a in bmed and b in bmed:
            print(f"{a[0]} {a[1]} / {b[0]} {b[1]}: {bmed[a] / bmed[b]:.2f}x")
    print()
    ratio(("zonedd", "multi"), ("zonedd", "single"))
    ratio(("zonedd", "multi"), ("zonedd (base)", "multi"))
    ratio(("zonedd", "single"), ("zonedd (base)", "single"))
    ratio(("zonedd (base)", "multi"), ("zonedd (base)", "single"))
    ratio(("zonedd", "multi"), ("dm-zoned", "multi"))
    ratio(("zonedd", "single"), ("dm-zoned", "single"))
EOF2
