#!/usr/bin/env bash
# Fuzz the metadata decoders, the load/check/engine path and the ublk request decoding with
# libFuzzer (cargo fuzz, crate tests/fuzz), FUZZ_SECONDS per target (default 20).
#
#   scripts/fuzz.sh                    # every target, 20 s each
#   FUZZ_SECONDS=300 scripts/fuzz.sh load
#   scripts/fuzz.sh --install          # install cargo-fuzz first if missing (~40 s)
#
# Needs only the stable toolchain (RUSTC_BOOTSTRAP=1 unlocks the sanitizer-coverage flags).
# Without cargo-fuzz (and without --install) it says so and exits 0: the same target bodies
# run over the seeds and past findings in plain `cargo test --test fuzz_regressions`.
# Prints executions, corpus size and findings per target; exits 1 when anything was found.
# A finding is left in tests/fuzz/artifacts/<target>/: copy it to
# tests/fuzz/regressions/<target>/<what-it-is> so that cargo test keeps checking it.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER=${FUZZ_SECONDS:-20}
ALL=(superblock layout load lsl_load request)
install=0
targets=()
for a in "$@"; do
    case "$a" in
        --install) install=1 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) targets+=("$a") ;;
    esac
done
[ ${#targets[@]} -eq 0 ] && targets=("${ALL[@]}")

if ! cargo fuzz --version >/dev/null 2>&1; then
    if [ "$install" = 1 ]; then
        cargo install cargo-fuzz --locked
    else
        echo "fuzz: cargo-fuzz not installed, skipping the libFuzzer run" \
             "(scripts/fuzz.sh --install installs it; the target bodies run in" \
             "cargo test --test fuzz_regressions)"
        exit 0
    fi
fi

export RUSTC_BOOTSTRAP=1
mkdir -p tests/fuzz/artifacts
FUZZ_DIR=tests/fuzz
# No sanitizer (the code under test is safe Rust; ASan would only slow it down), but debug
# assertions and overflow checks on.
build_start=$(date +%s)
# One build for all targets (they share every dependency).
cargo fuzz build --fuzz-dir "$FUZZ_DIR" --sanitizer none --debug-assertions \
    >"$FUZZ_DIR/artifacts/build.log" 2>&1 || { cat "$FUZZ_DIR/artifacts/build.log"; exit 1; }
echo "fuzz: built in $(( $(date +%s) - build_start )) s"

triple=$(rustc -vV | sed -n 's/^host: //p')
bin_dir="$FUZZ_DIR/target/$triple/release"
found=0
printf '%-11s %10s %8s %7s %s\n' target execs exec/s corpus findings
for t in "${targets[@]}"; do
    corpus="$FUZZ_DIR/corpus/$t"
    artifacts="$FUZZ_DIR/artifacts/$t"
    mkdir -p "$corpus" "$artifacts" "$FUZZ_DIR/seeds/$t" "$FUZZ_DIR/regressions/$t"
    log="$FUZZ_DIR/artifacts/$t.log"
    before=$(ls "$artifacts" | wc -l)
    rc=0
    # New inputs go to the first (git-ignored) corpus dir; seeds and regressions are read only.
    "$bin_dir/$t" -max_total_time="$SECONDS_PER" -timeout=20 -rss_limit_mb=4096 \
        -max_len=8192 -print_final_stats=1 -artifact_prefix="$artifacts/" \
        "$corpus" "$FUZZ_DIR/seeds/$t" "$FUZZ_DIR/regressions/$t" >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    new=$(( $(ls "$artifacts" | wc -l) - before ))
    finding="none"
    if [ "$rc" != 0 ] || [ "$new" -gt 0 ]; then
        found=1
        finding="$(grep -m1 -E 'panicked at|ERROR: libFuzzer' "$log" || echo "exit $rc") -> $(ls -t "$artifacts" | head -1) (log $log)"
    fi
    printf '%-11s %10s %8s %7s %s\n' "$t" "${execs:-?}" "${rate:-?}" "$(ls "$corpus" | wc -l)" "$finding"
    if [ "$rc" != 0 ]; then
        grep -A3 'panicked at' "$log" | head -8 || true
    fi
done
exit $found
