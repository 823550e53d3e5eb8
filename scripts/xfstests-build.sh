#!/usr/bin/env bash
# Builds xfstests (fstests, GPL-2.0) for tests/vm/xfstests.sh from the snapshot in
# ../shared/third_party/xfstests/ (a `git archive` tarball; override with XFSTESTS_TARBALL). It is
# unpacked and built under target/xfstests/src, never in this repository's tree nor in the shared
# one. Idempotent: a stamp naming the tarball's checksum makes a second run a no-op (one sha256sum).
# The guest gets the built tree as one file, target/xfstests/fstests.tar (xfs and generic tests
# only, no objects): reading ~5,000 small files over 9p under TCG takes minutes, one tar seconds.
#   scripts/xfstests-build.sh        prints the built tree's path (target/xfstests/src)
# Build dependencies: scripts/install-deps.sh (autoconf, automake, libtool, xfslibs-dev, ...).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd -P)
shared=$(cd "$root/.." && pwd -P)/shared/third_party/xfstests
tarball=${XFSTESTS_TARBALL:-}
if [ -z "$tarball" ]; then
    # The shared folder sits beside the checkout (worktrees: beside the main repository).
    for d in "$shared" /work/shared/third_party/xfstests; do
        tarball=$(ls "$d"/xfstests-*.tar.gz 2>/dev/null | head -n 1) || true
        [ -z "$tarball" ] || break
    done
fi
[ -n "$tarball" ] && [ -f "$tarball" ] || {
    echo "xfstests-build: no xfstests snapshot (../shared/third_party/xfstests/xfstests-*.tar.gz; set XFSTESTS_TARBALL)" >&2
    exit 3 # scripts/test.sh: the xfstests scenario is then reported as skipped, not run
}
out=$root/target/xfstests
src=$out/src
stamp=$out/built.stamp
sum=$(sha256sum "$tarball" | cut -d' ' -f1)
# make_tar: the guest's copy of the built tree.
make_tar() {
    local d others=()
    for d in "$src"/tests/*/; do
        d=${d%/}
        case ${d##*/} in generic | xfs) ;; *) others+=(--exclude="./tests/${d##*/}") ;; esac
    done
    tar -C "$src" -cf "$out/fstests.tar.new" --exclude='*.o' "${others[@]}" .
    mv "$out/fstests.tar.new" "$out/fstests.tar"
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] && [ -x "$src/ltp/fsx" ]; then
    [ -f "$out/fstests.tar" ] || make_tar
    printf '%s\n' "$src"
    exit 0
fi
for tool in autoreconf libtoolize make gcc; do
    command -v "$tool" >/dev/null || {
        echo "xfstests-build: $tool is missing: run scripts/install-deps.sh" >&2
        exit 1
    }
done
rm -rf "$src" "$stamp"
mkdir -p "$src"
tar -xzf "$tarball" -C "$src" --strip-components=1
log=$out/build.log
echo "xfstests-build: building $(basename "$tarball") in $src (log: $log)" >&2
if ! make -C "$src" -j"$(nproc)" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "xfstests-build: make failed (whole log: $log)" >&2
    exit 1
fi
[ -x "$src/ltp/fsx" ] && [ -x "$src/ltp/fsstress" ] || {
    echo "xfstests-build: make succeeded but ltp/fsx or ltp/fsstress is missing (log: $log)" >&2
    exit 1
}
rm -f "$out/fstests.tar"
make_tar
echo "$sum" >"$stamp"
printf '%s\n' "$src"
