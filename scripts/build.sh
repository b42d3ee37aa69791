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
# With nvcc on PATH, nvcc runs behind scripts/nvcc_deps.sh, which asks it
# for the headers each .cu file includes (older Meson does not), so that
# editing a header recompiles the GPU code that includes it.
setup() {  # meson setup ARGS...
  if command -v nvcc >/dev/null; then
    meson setup "$@" --native-file <(scripts/nvcc_deps.sh --native-file) >/dev/null
  else
    meson setup "$@" >/dev/null
  fi
}
if [[ ! -f build/build.ninja ]]; then
  setup build --buildtype=release ${ZF_GPU_ARCH:+-Dgpu_arch=$ZF_GPU_ARCH} \
    ${ZF_UNITY:+-Dunity=on -Dunity_size=$ZF_UNITY}
fi
cuda_rule=$(sed -n '/^rule cuda_COMPILER/,/^$/p' build/build.ninja)
if [[ -n $cuda_rule && $cuda_rule != *nvcc_deps.sh* && $cuda_rule != *-MF* ]]; then
  # A build/ set up before without it, under a Meson that does not ask nvcc
  # either: said, not mended, since setting it up again empties build/.
  echo "build.sh: build/ was set up without scripts/nvcc_deps.sh: an edited header does not recompile" \
       "the GPU code that includes it (the cuda_deps_py test fails). To set it up again, which empties" \
       "build/ (move what you keep there first):" \
       "meson setup --wipe build --native-file <(scripts/nvcc_deps.sh --native-file)" >&2
fi
ninja -C build >/dev/null || ninja -C build  # quiet unless it fails
