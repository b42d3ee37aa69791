#!/usr/bin/env bash
# nvcc_deps.sh: nvcc, asked to list the headers each .cu file includes, so
# that ninja recompiles a .cu file when one of them changes.
#
# Meson's rule for a .cu file reads the headers from OBJECT.d, but Meson
# before 1.4 never asks nvcc to write that file: build/ would then keep a
# .cu file's object after a header it includes changed, and a struct
# changed in a header the C++ files share would leave the GPU code with its
# old layout. scripts/build.sh sets build/ up with this script in front of
# nvcc (a Meson native file); with a later Meson, which asks for the file
# itself, it passes the command through unchanged.
#
#   scripts/nvcc_deps.sh --native-file     the native file for `meson setup`
#                                          (nvcc: the one on PATH)
#   scripts/nvcc_deps.sh NVCC ARGS...      NVCC ARGS, and -MD -MF OBJECT.d
#                                          where ARGS compile (-c) to -o OBJECT
#                                          (Meson's rule: -o $out -c $in)
set -uo pipefail
if [[ $# -eq 0 ]]; then
  echo "usage: scripts/nvcc_deps.sh --native-file | NVCC ARGS..." >&2
  exit 2
fi
if [[ ${1:-} == --native-file ]]; then
  nvcc=$(command -v nvcc) || { echo "nvcc_deps.sh: no nvcc on PATH" >&2; exit 1; }
  printf "[binaries]\ncuda = ['%s', '%s']\n" "$(cd "$(dirname "$0")" && pwd)/nvcc_deps.sh" "$nvcc"
  exit 0
fi
nvcc=$1
shift
out='' compile=0 asked=0 prev=''
for a in "$@"; do
  [[ $prev == -o ]] && out=$a
  [[ $a == -c ]] && compile=1
  [[ $a == -MD || $a == -MF || $a == -MMD ]] && asked=1
  prev=$a
done
if [[ $compile == 1 && $asked == 0 && -n $out ]]; then
  exec "$nvcc" "$@" -MD -MF "$out.d"
fi
exec "$nvcc" "$@"
