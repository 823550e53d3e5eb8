#!/usr/bin/env bash
# Fidelity of the `hdd` timing model: fio in the VM on `zonedd expose IMAGE --timing hdd`
# against what the model itself predicts for the same workloads (crates/zbd/examples/
# hdd_model.rs, on the host, on its virtual clock). Prints measured / model ratios for
# sequential 1 MiB writes and reads (MB/s, QD1) and 4 KiB random reads (IOPS, QD1 and QD32).
# A benchmark, not a test: the VM (qemu TCG) adds its own per-request cost.
#
#   scripts/bench-hdd-model.sh [--no-build] [--params "K=V ..."] [--scaled "K=V ..."]
#
# The image: 1 GiB, 64 MiB zones, 2 conventional; the model spans it (disk_size = the
# image: a seek across it is a full stroke). The write cache is scaled down with the sizes
# (cache_mib=64, default params otherwise). Under qemu TCG the VM moves 1 MiB requests far
# slower than the model's 261 MB/s (the `--timing none` column shows how fast), so the
# sequential jobs also run on a model scaled down to rates the VM keeps up with (SCALED),
# which checks the timing itself; the random reads (~100-200 IOPS) run at the defaults.
# Results: target/bench-vm/hdd-model-<UTC stamp>/ (fio JSON, status.json, results.txt).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
# shellcheck source=scripts/vm/lib.sh
source "$ROOT/scripts/vm/lib.sh"
build=1 params="cache_mib=64" scaled="outer_mbps=5 inner_mbps=4 iface_mbps=6 cache_mib=8"
while [ $# -gt 0 ]; do
    case $1 in
    --no-build) build=0 ;;
    --params) params=$2 && shift ;;
    --scaled) scaled=$2 && shift ;;
    *) vm_die "unknown argument $1" ;;
    esac
    shift
done
IMAGE_MB=1024 ZONE_MB=64 CONV=2 SEQ_OFF=128 SEQ_MB=192 RAND_SECS=20 RAND_N=5000
RAND_OFF=$SEQ_OFF RAND_MB=$SEQ_MB # fio --zonemode=zbd reads below the write pointers: what the sequential write wrote
vm_prepare
if [ "$build" = 1 ]; then
    (cd "$ROOT" && cargo build --release -p zonedd) || vm_die "building zonedd failed"
fi
(cd "$ROOT" && cargo build --release -q -p zbd --example hdd_model) || vm_die "building the model example failed"
out=$VM_TARGET_DIR/bench-vm/hdd-model-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
cp "$ZONEDD" "$out/zonedd"
model() { "$ROOT/target/release/examples/hdd_model" $((IMAGE_MB << 20)) "$@"; }
seq_w=("seqwrite:${SEQ_OFF}M:${SEQ_MB}M:1M:1" "seqread:${SEQ_OFF}M:${SEQ_MB}M:1M:1")
# shellcheck disable=SC2086 # PARAMS are K=V words
{
    model $params -- "${seq_w[@]}" "randread:${RAND_OFF}M:${RAND_MB}M:4K:1:$RAND_N" \
        "randread:${RAND_OFF}M:${RAND_MB}M:4K:32:$RAND_N"
    model $params $scaled -- "${seq_w[@]}" | sed 's/^seq[a-z]*/&-scaled/'
} >"$out/model.txt"
scenario=$out/hdd-model.sh
cat >"$scenario" <<EOS
#!/usr/bin/env bash
export ZONEDD=$(vm_shq "$out/zonedd")
exec bash $(vm_shq "$ROOT/scripts/bench/hdd-model-guest.sh") --out $(vm_shq "$out") --image-mb $IMAGE_MB --zone-mb $ZONE_MB --conv $CONV --params $(vm_shq "$params") --scaled $(vm_shq "$scaled") --seq-off-mb $SEQ_OFF --seq-mb $SEQ_MB --rand-secs $RAND_SECS
EOS
vm_run bench-hdd-model "$scenario" 1500 "${VM_MEMORY:-4G}"
cp "$VM_RUNS/bench-hdd-model/console.log" "$out/console.log" 2>/dev/null || true
[ "$VM_RC" = 0 ] || vm_die "the guest run failed (exit $VM_RC; see $out/console.log)"
python3 - "$out" <<'EOF2' | tee "$out/results.txt"
import json, sys, os
out = sys.argv[1]
model = dict(l.split() for l in open(os.path.join(out, "model.txt")))
def fio(name, d, key):
    j = json.load(open(os.path.join(out, f"{name}.fio.json")))["jobs"][0][d]
    return j[key] / 1e6 if key == "bw_bytes" else j[key]
rows = [("seq write 1 MiB QD1", "seqwrite", "write", "bw_bytes", "seqwrite", "MB/s"),
        ("seq read 1 MiB QD1", "seqread", "read", "bw_bytes", "seqread", "MB/s"),
        ("seq write 1 MiB QD1, scaled model", "seqwrite-scaled", "write", "bw_bytes", "seqwrite-scaled", "MB/s"),
        ("seq read 1 MiB QD1, scaled model", "seqread-scaled", "read", "bw_bytes", "seqread-scaled", "MB/s"),
        ("rand read 4 KiB QD1", "randread-qd1", "read", "iops", "randread_qd1", "IOPS"),
        ("rand read 4 KiB QD32", "randread-qd32", "read", "iops", "randread_qd32", "IOPS")]
print(f"| workload | model | measured | measured / model | --timing none (VM limit) |")
print("|---|---|---|---|---|")
for label, name, d, key, mk, unit in rows:
    m, v = float(model[mk]), fio(name, d, key)
    base = name.replace("-scaled", "")
    none = f"{fio(base + '-none', d, key):.1f} {unit}" if os.path.exists(os.path.join(out, f"{base}-none.fio.json")) else "-"
    print(f"| {label} | {m:.1f} {unit} | {v:.1f} {unit} | {v / m:.3f} | {none} |")
for f in ("status.json", "status-scaled.json"):
    st = json.load(open(os.path.join(out, f)))["timing"]
    print(f"\n{f}: model stats {json.dumps(st['stats'])}")
EOF2
vm_log "hdd-model bench: $out"
