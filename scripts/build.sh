#!/usr/bin/env bash
# build.sh: configure (once) and build into build/. Release, C++20, Meson + Ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
# Read when build/ is first set up (a later change: meson configure build):
# ZF_GPU_ARCH (CI's, .ci/run), the SM architectures nvcc compiles for, in
# place of meson_options.txt's default; ZF_UNITY=N (CI's), N files compiled
# at a time as one translation unit (Meson's unity build), as the sanitizer
# and emulated builds do; unset, each file on its own, so that an edit
# recompiles that file alone.
[[ -f build/build.ninja ]] || meson setup build --buildtype=release ${ZF_GPU_ARCH:+-Dgpu_arch=$ZF_GPU_ARCH} \
  ${ZF_UNITY:+-Dunity=on -Dunity_size=$ZF_UNITY} >/dev/null
ninja -C build >/dev/null || ninja -C build  # quiet unless it fails
