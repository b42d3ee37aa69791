#!/usr/bin/env bash
# build.sh: configure (once) and build into build/. Release, C++20, Meson + Ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
# ZF_GPU_ARCH (CI's, .ci/run): the SM architectures nvcc compiles for, in
# place of meson_options.txt's default.
[[ -f build/build.ninja ]] || meson setup build --buildtype=release ${ZF_GPU_ARCH:+-Dgpu_arch=$ZF_GPU_ARCH} >/dev/null
ninja -C build >/dev/null || ninja -C build  # quiet unless it fails
