#!/usr/bin/env bash
# build.sh: configure (once) and build into build/. Release, C++20, Meson + Ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f build/build.ninja ]] || meson setup build --buildtype=release >/dev/null
ninja -C build >/dev/null || ninja -C build  # quiet unless it fails
