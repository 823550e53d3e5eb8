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
echo "== VM scenarios (tests/vm/*.sh, real kernel in qemu)"
scripts/vm-test.sh
echo "== power-cut loop (tests/vm/powercut-loop.sh driven from the host: two boots per round)"
scripts/vm/powercut-host.sh
