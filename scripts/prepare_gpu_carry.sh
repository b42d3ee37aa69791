#!/usr/bin/env bash
# prepare_gpu_carry.sh: for a GPU host without internet access, bundles the
# build dependencies into gpu_carry/ (git-ignored), so that
# scripts/gpu_check.sh can build the project there (it always builds with
# gpu_carry/, so the GPU host needs no package access). Run it on a Debian 12
# machine where scripts/install_deps.sh (or scripts/setup.sh) has installed
# the packages, then copy the repository with gpu_carry/ to the GPU host.
#
#   scripts/prepare_gpu_carry.sh          # writes gpu_carry/
#
# The GPU host is expected to have nvcc, cuBLAS, meson, ninja, Python and
# PyTorch; CLI11, GoogleTest, nlohmann-json and OpenBLAS come from
# gpu_carry/, and pkg-config too if the host has none. What goes in, and why in this form:
#   include/CLI, include/nlohmann   header-only libraries, copied as they are
#   include/openblas/               OpenBLAS's cblas.h + openblas_config.h
#   lib/libopenblas.a.xz            the part of Debian's static OpenBLAS that
#                                   the project calls (ld -r keeps only the
#                                   objects those symbols need, compressed).
#                                   Static, so nothing to find at run time,
#                                   and it needs no libgfortran.
#   src/googletest/                 GoogleTest's sources: gpu_check.sh compiles
#                                   them with the GPU host's compiler (no C++
#                                   ABI mismatch with a library built on
#                                   another machine)
#   bin/pkgconf, lib/libpkgconf.so.3, bin/pkg-config
#                                   Debian's pkgconf, used only if the GPU host
#                                   has no pkg-config of its own
#   pkgconfig/*.pc                  how Meson finds all of the above
#                                   (paths relative to ${pcfiledir})
# OpenBLAS is kept rather than made optional: the CPU kernels that every GPU
# kernel is tested against call cblas_sgemm, and a slower stand-in would be
# a second, untested CPU reference.
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu_carry

need() { [[ -e "$1" ]] || { echo "prepare_gpu_carry: missing $1 ($2); run scripts/setup.sh" >&2; exit 1; }; }
blas_dir=/usr/lib/x86_64-linux-gnu/openblas-pthread
blas_inc=/usr/include/x86_64-linux-gnu/openblas-pthread
need /usr/include/CLI/CLI.hpp "libcli11-dev"
need /usr/include/nlohmann/json.hpp "nlohmann-json3-dev"
need /usr/src/googletest/googletest/src/gtest-all.cc "libgtest-dev / googletest"
need "$blas_dir/libopenblas.a" "libopenblas0-pthread-dev"
need "$blas_inc/cblas.h" "libopenblas-pthread-dev"
need /usr/bin/pkgconf "pkgconf"
command -v xz >/dev/null || { echo "prepare_gpu_carry: needs xz (xz-utils)" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"/{include/openblas,lib,bin,pkgconfig,src/googletest}

cp -r /usr/include/CLI /usr/include/nlohmann "$out/include/"
cp "$blas_inc/cblas.h" "$blas_inc/openblas_config.h" "$out/include/openblas/"
cp -r /usr/src/googletest/googletest/include /usr/src/googletest/googletest/src \
  "$out/src/googletest/"

# OpenBLAS: every cblas_*/openblas_* function the sources name, pulled out of
# the static library with everything they need, into one relocatable object.
symbols=$(grep -rhoE '\b(cblas_[a-z0-9_]+|openblas_[a-z0-9_]+)\s*\(' \
            common 0*_*/ tests bench tools 2>/dev/null |
          sed -E 's/\s*\($//' | sort -u)
undef=()
for s in $symbols; do undef+=(-u "$s"); done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ld -r "${undef[@]}" -o "$tmp/openblas_part.o" "$(readlink -f "$blas_dir/libopenblas.a")"
strip --strip-debug "$tmp/openblas_part.o"
ar rcs "$tmp/libopenblas.a" "$tmp/openblas_part.o"
xz -T0 -6 -c "$tmp/libopenblas.a" > "$out/lib/libopenblas.a.xz"
echo "$symbols" > "$out/lib/openblas_symbols.txt"
blas_version=$(pkg-config --modversion openblas 2>/dev/null || echo 0.3.21)

# pkgconf, in case the GPU host has no pkg-config.
cp /usr/bin/pkgconf "$out/bin/pkgconf"
cp "$(readlink -f /lib/x86_64-linux-gnu/libpkgconf.so.3)" "$out/lib/libpkgconf.so.3"
cat > "$out/bin/pkg-config" <<'EOF'
#!/bin/sh
# pkg-config for the GPU host: the bundled pkgconf and its library.
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/pkgconf" "$@"
EOF
chmod +x "$out/bin/pkg-config"

pc() {  # pc NAME VERSION CFLAGS [LIBS]
  cat > "$out/pkgconfig/$1.pc" <<EOF
prefix=\${pcfiledir}/..
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: $1
Description: $1, carried to the GPU machine by scripts/prepare_gpu_carry.sh
Version: $2
Cflags: $3
${4:+Libs: $4}
EOF
}
pc CLI11 "$(pkg-config --modversion CLI11)" '-I${includedir}'
pc nlohmann_json "$(pkg-config --modversion nlohmann_json)" '-I${includedir}'
pc openblas "$blas_version" '-I${includedir}/openblas' '-L${libdir} -lopenblas -lpthread -lm'
# libgtest.a is built on the GPU host by gpu_check.sh, into lib/.
pc gtest "$(pkg-config --modversion gtest)" \
  '-I${prefix}/src/googletest/include -DGTEST_HAS_PTHREAD=1' '-L${libdir} -lgtest -lpthread'

cat > "$out/README" <<EOF
Made by scripts/prepare_gpu_carry.sh on $(date -u +%Y-%m-%dT%H:%MZ) from this machine's
Debian packages; used by scripts/gpu_check.sh. OpenBLAS symbols kept: $(echo $symbols)
EOF
echo "gpu_carry/: $(du -sh "$out" | cut -f1) ($(find "$out" -type f | wc -l) files)"
