#!/usr/bin/env bash
# Installs libtutti under a prefix:
#   PREFIX/lib/libtutti.so.0.1.0 (+ libtutti.so.0, libtutti.so), libtutti.a
#   PREFIX/include/{tutti.h,nccl_compat.h,hccl_compat.h}
#   PREFIX/lib/pkgconfig/tutti.pc, PREFIX/lib/cmake/tutti/tuttiConfig*.cmake
#
#   crates/tutti-c/scripts/install.sh PREFIX            # builds first (cargo build --release -p tutti-c)
#   crates/tutti-c/scripts/install.sh --no-build PREFIX # installs what target/release holds
#   crates/tutti-c/scripts/install.sh --from DIR PREFIX # installs DIR/libtutti_c.{so,a} (no build)
# CARGO_TARGET_DIR is honoured. `--no-build` needs target/release's copies
# to be current: cargo refreshes them only when the library itself is a
# target of the build (`cargo build -p tutti-c`, or `--lib`), not when it
# is built as a dependency of an example or a test, which leaves the fresh
# copies in target/release/deps (hence `--from`, which tests/c_api.rs uses).
set -euo pipefail
build=1
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}/release"
if [ "${1:-}" = "--no-build" ]; then build=0; shift
elif [ "${1:-}" = "--from" ] && [ $# -ge 2 ]; then build=0; target="$2"; shift 2
fi
if [ $# -ne 1 ]; then
  echo "usage: $0 [--no-build | --from DIR] PREFIX" >&2
  exit 2
fi
mkdir -p "$1"
prefix="$(cd "$1" && pwd)"
if [ $build = 1 ]; then
  (cd "$repo" && cargo build --release --locked -p tutti-c)
fi
version=0.1.0
for f in libtutti_c.so libtutti_c.a; do
  [ -f "$target/$f" ] || { echo "$target/$f is missing: build with cargo build --release -p tutti-c" >&2; exit 1; }
done
install -d "$prefix/lib/pkgconfig" "$prefix/lib/cmake/tutti" "$prefix/include"
install -m 0755 "$target/libtutti_c.so" "$prefix/lib/libtutti.so.$version"
ln -sf "libtutti.so.$version" "$prefix/lib/libtutti.so.0"
ln -sf "libtutti.so.0" "$prefix/lib/libtutti.so"
install -m 0644 "$target/libtutti_c.a" "$prefix/lib/libtutti.a"
install -m 0644 "$here"/include/tutti.h "$here"/include/nccl_compat.h "$here"/include/hccl_compat.h "$prefix/include/"
sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" "$here/cmake/tutti.pc.in" > "$prefix/lib/pkgconfig/tutti.pc"
sed -e "s|@VERSION@|$version|g" "$here/cmake/tuttiConfig.cmake.in" > "$prefix/lib/cmake/tutti/tuttiConfig.cmake"
sed -e "s|@VERSION@|$version|g" "$here/cmake/tuttiConfigVersion.cmake.in" > "$prefix/lib/cmake/tutti/tuttiConfigVersion.cmake"
echo "installed libtutti $version under $prefix"
