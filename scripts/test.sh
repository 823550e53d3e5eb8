#!/usr/bin/env bash
# The full test suite: formatting and lints, the host tests, the Debian package, then every VM
# scenario. Does its own set-up: the Debian packages it needs (scripts/install-deps.sh, quick when
# none is missing), cargo-fuzz and cargo-deb (cargo install, once), the VM kernel (downloaded once).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test (host)"
# The long engine tests run on their own below so that their counts reach the log; --exact so
# that the skips do not also drop tests whose names merely contain theirs (check_crash's
# repair/resync_survives_a_power_cut_at_every_write).
cargo test --workspace --release -- --exact --skip power_cut_at_every_write --skip model_greedy \
    --skip model_oldest_first --skip model_parallel_reclaim
echo "== engine model test (1,000,000 ops in release) and power cuts at every write boundary"
mkdir -p target
if ! cargo test --release -p dmz --test engine_model --test engine_powercut -- --nocapture 2>&1 |
    tee target/engine-long-tests.log | grep -E "ops done|crash points|^test |test result"; then
    tail -n 60 target/engine-long-tests.log
    exit 1
fi
echo "== fuzz smoke run (libFuzzer, 10 s per target; installs cargo-fuzz if missing)"
FUZZ_SECONDS=10 scripts/fuzz.sh --install
echo "== Debian package (scripts/package.sh; installs cargo-deb if missing)"
# tests/vm/package.sh installs and removes it in the guest.
ZONEDD_VM_DEB=$(scripts/package.sh)
export ZONEDD_VM_DEB
echo "== cargo build --release -p zonedd (the binary every VM scenario below uses)"
cargo build --release -p zonedd
# The newest kernel too (ZONEDD_VM_KERNEL=7.3, trixie-backports; docs/vm-testing.md): the
# scenarios where ublk's lifecycle and the kernel's zoned stack differ between releases. They
# run alongside the 6.12 scenarios and the power-cut loop: a guest keeps about one of the two
# cores busy, so the second guest costs little wall time. Their console goes to a log, their
# summary (and on failure the whole log) comes after the power-cut loop.
k73_pid=""
k73_log=target/vm/vm-test-7.3.log
# ublk-xfs on 7.3 (11 minutes of wall time beside the 6.12 scenarios on 2 cores) is left to
# ZONEDD_TEST_KERNEL_73="kernel-smoke ublk-xfs ublk-recover dmzoned-interop": the whole suite
# must stay well inside CI's limit.
k73_scenarios=${ZONEDD_TEST_KERNEL_73:-kernel-smoke ublk-recover dmzoned-interop}
if [ "${ZONEDD_VM_KERNEL:-6.12}" != 7.3 ]; then
    mkdir -p target/vm
    echo "== started in the background: $k73_scenarios on kernel 7.3 (log: $k73_log)"
    k73_t0=$(date +%s)
    # shellcheck disable=SC2086 # a list of scenario names
    ZONEDD_VM_KERNEL=7.3 scripts/vm-test.sh --no-build $k73_scenarios \
        >"$k73_log" 2>&1 &
    k73_pid=$!
    trap '[ -z "$k73_pid" ] || kill "$k73_pid" 2>/dev/null || true' EXIT
fi
echo "== xfstests build (scripts/xfstests-build.sh, for tests/vm/xfstests.sh; quick once built)"
scripts/xfstests-build.sh >/dev/null
echo "== VM scenarios (tests/vm/*.sh, real kernel in qemu: ${ZONEDD_VM_KERNEL:-6.12})"
scripts/vm-test.sh --no-build
echo "== power-cut loop (tests/vm/powercut-loop.sh driven from the host: two boots per round)"
scripts/vm/powercut-host.sh
if [ -n "$k73_pid" ]; then
    echo "== VM scenarios on kernel 7.3 (ZONEDD_VM_KERNEL=7.3): $k73_scenarios"
    k73_wait_t0=$(date +%s)
    k73_rc=0
    wait "$k73_pid" || k73_rc=$?
    k73_pid=""
    now=$(date +%s)
    if [ "$k73_rc" = 0 ]; then
        sed -n '/^vm: scenario results/,$p' "$k73_log"
    else
        cat "$k73_log"
    fi
    echo "kernel 7.3 pass: $((now - k73_t0)) s in all, $((now - k73_wait_t0)) s of them after the 6.12 scenarios and the power-cut loop ended"
    [ "$k73_rc" = 0 ]
fi
