#!/usr/bin/env bash
# Builds zonedd's Debian package with cargo-deb (installed with `cargo install` if missing) and
# prints its path (<cargo target dir>/debian/zonedd_VERSION-1_ARCH.deb).
#   scripts/package.sh [--no-build]
# What it holds ([package.metadata.deb] in Cargo.toml):
#   /usr/sbin/zonedd
#   /lib/systemd/system/zonedd@.service   scripts/systemd/zonedd@.service with ExecStart/ExecStop on
#                                          /usr/sbin/zonedd (`zonedd install-unit --print --bin ...`)
#   /usr/lib/modules-load.d/zonedd.conf   ublk_drv, loaded at boot
#   /usr/share/doc/zonedd/                copyright, README.md
#   man pages and shell completions, when they exist: $ZONEDD_MAN_DIR (*.1 ... *.8) and
#   $ZONEDD_COMPLETIONS_DIR (zonedd.bash, _zonedd, zonedd.fish); by default assets/man and
#   assets/completions next to the release binary
# Install: dpkg -i FILE.deb (or apt install ./FILE.deb); remove: dpkg -r zonedd.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$ROOT"
CARGO_DEB_VERSION=${CARGO_DEB_VERSION:-3.8.0}

build=1
for a in "$@"; do
    case $a in
    --no-build) build=0 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "package: unknown argument $a (try --help)" >&2
        exit 2
        ;;
    esac
done

say() { printf 'package: %s\n' "$*" >&2; }
die() {
    printf 'package: error: %s\n' "$*" >&2
    exit 1
}

if ! cargo deb --version >/dev/null 2>&1; then
    say "installing cargo-deb $CARGO_DEB_VERSION (cargo install, once)"
    cargo install --locked --quiet cargo-deb --version "$CARGO_DEB_VERSION" ||
        die "cargo install cargo-deb failed"
fi
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (a Debian system is needed)"

# The cargo target directory (honours CARGO_TARGET_DIR and .cargo/config), absolute.
target=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
    grep -o '"target_directory":"[^"]*"' | head -n1 | cut -d'"' -f4) || true
[ -n "$target" ] || target=${CARGO_TARGET_DIR:-$ROOT/target}
bin=$target/release/zonedd

if [ "$build" = 1 ]; then
    say "cargo build --release -p zonedd"
    cargo build --release -p zonedd
fi
[ -x "$bin" ] || die "$bin not built (run without --no-build)"

# Everything but the binary, laid out as installed, under target/deb-root/ of this checkout
# (the path Cargo.toml's assets name).
stage=$ROOT/target/deb-root
rm -rf "$stage"
mkdir -p "$stage/lib/systemd/system" "$stage/usr/lib/modules-load.d"
"$bin" install-unit --print --bin /usr/sbin/zonedd >"$stage/lib/systemd/system/zonedd@.service"
grep -q '^ExecStart=/usr/sbin/zonedd ' "$stage/lib/systemd/system/zonedd@.service" ||
    die "the unit printed by install-unit does not run /usr/sbin/zonedd"
cp scripts/package/modules-load.conf "$stage/usr/lib/modules-load.d/zonedd.conf"

man_dir=${ZONEDD_MAN_DIR:-$target/release/assets/man}
comp_dir=${ZONEDD_COMPLETIONS_DIR:-$target/release/assets/completions}
pages=0
if [ -d "$man_dir" ]; then
    for f in "$man_dir"/*.[1-8]; do
        [ -f "$f" ] || continue
        s=${f##*.}
        mkdir -p "$stage/usr/share/man/man$s"
        cp "$f" "$stage/usr/share/man/man$s/" # cargo-deb gzips them
        pages=$((pages + 1))
    done
fi
shells=()
if [ -d "$comp_dir" ]; then
    if [ -f "$comp_dir/zonedd.bash" ]; then
        mkdir -p "$stage/usr/share/bash-completion/completions"
        cp "$comp_dir/zonedd.bash" "$stage/usr/share/bash-completion/completions/zonedd"
        shells+=(bash)
    fi
    if [ -f "$comp_dir/_zonedd" ]; then
        mkdir -p "$stage/usr/share/zsh/vendor-completions"
        cp "$comp_dir/_zonedd" "$stage/usr/share/zsh/vendor-completions/_zonedd"
        shells+=(zsh)
    fi
    if [ -f "$comp_dir/zonedd.fish" ]; then
        mkdir -p "$stage/usr/share/fish/vendor_completions.d"
        cp "$comp_dir/zonedd.fish" "$stage/usr/share/fish/vendor_completions.d/zonedd.fish"
        shells+=(fish)
    fi
fi
say "man pages: $pages (from $man_dir); completions: ${shells[*]:-none} (from $comp_dir)"

# cargo-deb writes <target>/debian/NAME_VERSION-REV_ARCH.deb and prints its path.
# --strip: the release profile keeps line tables (debug = 1) for backtraces in development.
out=$(cargo deb --no-build --strip -p zonedd --quiet) || die "cargo deb failed"
deb=$(printf '%s\n' "$out" | tail -n1)
[ -f "$deb" ] || die "cargo deb printed no package path: $out"
say "contents:"
dpkg-deb -c "$deb" | awk '{ print "  " $1 " " $6 }' >&2
echo "$deb"
