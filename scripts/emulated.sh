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
#   scripts/emulated.sh [SUITE...]     (default: gpu_emulation gpu_kernels gpu_comm gpu_comm_threads
#                                       gpu_stages gpu_stages_one_gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
dir=build-emu
start=$SECONDS
suites=("$@")
[[ ${#suites[@]} -eq 0 ]] && suites=(gpu_emulation gpu_kernels gpu_comm gpu_comm_threads gpu_stages gpu_stages_one_gpu)
# -O2 for the libraries (the emulated kernels run long enough to matter),
# the test files at -O1 as in build/. NCCL is the emulation's; no MPI.
if [[ ! -f $dir/build.ninja ]]; then
  meson setup "$dir" -Dgpu_emulation=true -Dmpi=disabled --buildtype=custom \
    -Doptimization=2 -Db_ndebug=true >/dev/null || { echo "emulated: meson setup failed"; exit 1; }
fi
rm -rf "$dir/tests/results" "$dir/meson-logs/testlog.json"
mkdir -p "$dir/tests/results"
targets=()
for s in "${suites[@]}"; do targets+=("tests/test_${s%_one_gpu}"); done  # one binary, two tests
ninja -C "$dir" "${targets[@]}" >/dev/null || ninja -C "$dir" "${targets[@]}" || { echo "emulated: build failed"; exit 1; }
built=$SECONDS
meson test -C "$dir" --no-rebuild --num-processes 2 --print-errorlogs "${suites[@]}"
status=$?
echo "emulated GPU: build $((built - start)) s, tests $((SECONDS - built)) s"
exit $status
