#!/usr/bin/env bash
# The full test suite: formatting and lints, the host tests, then every VM scenario.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test (host)"
cargo test --workspace --release
echo "== VM scenarios (tests/vm/*.sh, real kernel in qemu)"
scripts/vm-test.sh
echo "== power-cut loop (tests/vm/powercut-loop.sh driven from the host: two boots per round)"
scripts/vm/powercut-host.sh
