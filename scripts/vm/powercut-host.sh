#!/usr/bin/env bash
# Power-cut loop driver (host side) for tests/vm/powercut-loop.sh: an emulated SMR image in
# the host's tree (target/vm/powercut/, shared with the guest over 9p), then per round two
# boots: "write" (checkpoints, then the guest is powered off hard mid-write) and "verify"
# (a fresh guest creates the device on the image, checks every completed checkpoint, deletes,
# `zonedd check`).
#   scripts/vm/powercut-host.sh [ROUNDS]     (default $ZONEDD_VM_POWERCUT_LOOPS or 2)
# Uses $ZONEDD (default target/release/zonedd; build it first). Exit 0 when every round
# verified with nothing lost and `zonedd check` clean. Prints "powercut-loop: R/R power cuts
# survived, C slots verified, L lost, F in flight at the cut, zonedd check unclean after U".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
export ZONEDD=${ZONEDD:-$ROOT/target/release/zonedd}
[ -x "$ZONEDD" ] || {
    echo "powercut-host: $ZONEDD missing (cargo build --release -p zonedd)" >&2
    exit 2
}
rounds=${1:-${ZONEDD_VM_POWERCUT_LOOPS:-2}}
dir=$ROOT/target/vm/powercut
rm -rf "$dir"
mkdir -p "$dir"
"$ZONEDD" emulate "$dir/pc.img" --size 384M --zone-size 16M --conventional 8 >/dev/null
"$ZONEDD" format --backend "$dir/pc.img" --force >/dev/null 2>&1
head -c $((32 << 20)) /dev/urandom >"$dir/src"
: >"$dir/log"
export ZONEDD_VM_POWERCUT_DIR=$dir
# No 9p cache (docs/vm-testing.md): the write boot is cut off hard, and each line the guest appends
# to the checkpoint log must be on the host as soon as it is written.
export VM_9P_CACHE=

# phase ROUND PHASE MARKER WHAT: one boot of the guest scenario in PHASE; its exit status says
# nothing (the write boot ends without a result: the guest is cut; a failed verify still
# leaves its counts), so success is the file MARKER.ROUND the guest leaves in $dir.
phase() {
    ZONEDD_VM_POWERCUT_PHASE=$2 ZONEDD_VM_POWERCUT_ROUND=$1 \
        "$ROOT/scripts/vm-test.sh" --no-build "$ROOT/tests/vm/powercut-loop.sh" || true
    [ -f "$dir/$3.$1" ] || {
        echo "powercut-host: round $1: $4" >&2
        exit 1
    }
}

checked=0 lost=0 inflight=0 survived=0 unclean=0
for ((r = 1; r <= rounds; r++)); do
    echo "powercut-host: round $r/$rounds: write, power off hard"
    phase "$r" write cut "the write phase never reached the cut"
    echo "powercut-host: round $r/$rounds: boot again, verify"
    phase "$r" verify verified "the verify phase did not finish"
    read -r c l f chk <"$dir/verified.$r"
    checked=$((checked + c)) lost=$((lost + l)) inflight=$((inflight + f))
    [ "$l" = 0 ] && survived=$((survived + 1))
    [ "$chk" = clean ] || unclean=$((unclean + 1))
done
echo "powercut-loop: $survived/$rounds power cuts survived, $checked slots verified, $lost lost, $inflight in flight at the cut, zonedd check unclean after $unclean of $rounds rounds"
[ "$lost" = 0 ] && [ "$unclean" = 0 ]
