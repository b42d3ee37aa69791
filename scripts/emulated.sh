#!/usr/bin/env bash
# emulated.sh: the GPU suites on the emulated GPU of the tests (tests/emu),
# in build-emu: the project's CUDA code compiled with g++ against the
# emulation instead of the CUDA toolkit, so that every kernel, the GPU
# Device, the threads backend on device buffers, the NCCL communicator
# (ranks as threads, one emulated GPU each) and every stage with
# --device cuda run here, on the CPU (docs/GPU.md says what that proves and
# what only scripts/gpu_check.sh on a real GPU can). scripts/test.sh runs it
# after the sanitizers; ZF_SKIP_EMULATED=1 skips it there.
#
#   scripts/emulated.sh [SUITE...]    (default: every gpu_* test)
#
# scripts/sanitize.sh runs the same suites under ASan + UBSan and under
# TSan, in its own builds (CI a selection, `full` all of them).
set -uo pipefail
cd "$(dirname "$0")/.."
dir=build-emu
start=$SECONDS
if [[ ! -f $dir/build.ninja ]]; then
  meson setup "$dir" --native-file scripts/emulated.ini >/dev/null ||
    { echo "emulated: meson setup failed"; exit 1; }
elif ! ninja -C "$dir" -t targets all 2>/dev/null | grep -q '^tests/test_gpu_comm:'; then
  # A folder set up with -Dnccl=disabled has no NCCL suite: NCCL back on.
  meson configure "$dir" -Dnccl=auto >/dev/null || { echo "emulated: meson configure failed"; exit 1; }
fi
# Regenerated now (after a configure above, or a meson.build's change), so
# that the tests read below, and their order (tests/meson.build's
# priorities), are current.
ninja -C "$dir" build.ninja >/dev/null || ninja -C "$dir" build.ninja || { echo "emulated: meson regenerate failed"; exit 1; }
suites=("$@")
if [[ ${#suites[@]} -eq 0 ]]; then
  mapfile -t suites < <(meson introspect "$dir" --tests |
    python3 -c 'import json, sys; sys.stdout.writelines(t["name"] + "\n" for t in json.load(sys.stdin) if t["name"].startswith("gpu_"))')
  [[ ${#suites[@]} -gt 0 ]] || { echo "emulated: $dir has no gpu_* test (is it a -Dgpu_emulation=true build?)"; exit 1; }
fi
rm -rf "$dir/tests/results" "$dir/meson-logs/testlog.json"
mkdir -p "$dir/tests/results"
targets=()
for s in "${suites[@]}"; do  # gpu_stages*: one binary, several tests
  [[ $s == gpu_stages* ]] && s=gpu_stages
  targets+=("tests/test_$s")
done
ninja -C "$dir" "${targets[@]}" >/dev/null || ninja -C "$dir" "${targets[@]}" || { echo "emulated: build failed"; exit 1; }
built=$SECONDS
meson test -C "$dir" --no-rebuild --num-processes 2 --print-errorlogs "${suites[@]}"
status=$?
echo "emulated GPU ($dir): build $((built - start)) s, tests $((SECONDS - built)) s"
exit $status
