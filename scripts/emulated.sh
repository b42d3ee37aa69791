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
#   scripts/emulated.sh [--asan | --tsan] [SUITE...]
#       (default suites: gpu_emulation gpu_kernels gpu_comm gpu_comm_threads
#        gpu_stages gpu_stages_nccl gpu_stages_one_gpu)
#
# --asan: the same under AddressSanitizer and UndefinedBehaviorSanitizer, in
# build-emu-asan (a kernel's access past its buffer, a use after free, a
# leak; reports in build-emu-asan/sanitizer-reports/, printed at the end).
# --tsan: the same under ThreadSanitizer, in build-emu-tsan (a missing wait
# between streams, a host read before a synchronize, two GPU threads of a
# block touching the same memory without a barrier; the suppressions are
# scripts/sanitizers/tsan.supp's).
# Several times slower than the plain run (timeouts x4, x6), so not part of
# CI: scripts/sanitize.sh full runs both.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=build-emu
setup=(--native-file scripts/emulated.ini)
slower=1
sanitizer=
case ${1:-} in
  --asan)
    dir=build-emu-asan slower=4 sanitizer=address,undefined
    # File by file, as scripts/sanitize.sh full builds (ASan's
    # initialization-order check sees no order inside a unity file).
    setup+=(-Dunity=off -Dtests_unity=false)
    export ASAN_OPTIONS="log_path=$PWD/$dir/sanitizer-reports/asan:detect_leaks=1"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$PWD/$dir/sanitizer-reports/ubsan" ;;
  --tsan)
    dir=build-emu-tsan slower=6 sanitizer=thread
    export TSAN_OPTIONS="log_path=$PWD/$dir/sanitizer-reports/tsan:second_deadlock_stack=1:suppressions=$PWD/scripts/sanitizers/tsan.supp"
    export OPENBLAS_NUM_THREADS=1 ;;  # its thread pool is not instrumented (scripts/sanitize.sh says more)
esac
if [[ -n $sanitizer ]]; then
  shift
  setup+=(-Doptimization=1 -Ddebug=true -Db_lundef=false -Db_sanitize=$sanitizer)
  rm -rf "$dir/sanitizer-reports" && mkdir -p "$dir/sanitizer-reports"
fi
start=$SECONDS
suites=("$@")
[[ ${#suites[@]} -eq 0 ]] && suites=(gpu_emulation gpu_kernels gpu_comm gpu_comm_threads gpu_stages gpu_stages_nccl gpu_stages_one_gpu)
if [[ ! -f $dir/build.ninja ]]; then
  meson setup "$dir" "${setup[@]}" >/dev/null ||
    { echo "emulated: meson setup failed"; exit 1; }
elif [[ " ${suites[*]} " == *" gpu_comm "* ]] &&
     ! ninja -C "$dir" -t targets all 2>/dev/null | grep -q '^tests/test_gpu_comm:'; then
  # A folder set up with -Dnccl=disabled has no NCCL suite: NCCL back on.
  meson configure "$dir" -Dnccl=auto >/dev/null || { echo "emulated: meson configure failed"; exit 1; }
fi
if [[ -n $sanitizer && $(meson introspect "$dir" --buildoptions |
        python3 -c 'import json, sys; print(*[o["value"] for o in json.load(sys.stdin) if o["name"] == "b_sanitize"])') != "$sanitizer" ]]; then
  echo "emulated: $dir is not set up with -Db_sanitize=$sanitizer: remove it and run again"
  exit 1
fi
rm -rf "$dir/tests/results" "$dir/meson-logs/testlog.json"
mkdir -p "$dir/tests/results"
targets=()
for s in "${suites[@]}"; do  # gpu_stages*: one binary, three tests
  [[ $s == gpu_stages* ]] && s=gpu_stages
  targets+=("tests/test_$s")
done
ninja -C "$dir" "${targets[@]}" >/dev/null || ninja -C "$dir" "${targets[@]}" || { echo "emulated: build failed"; exit 1; }
built=$SECONDS
meson test -C "$dir" --no-rebuild --num-processes 2 --print-errorlogs \
  --timeout-multiplier "$slower" "${suites[@]}"
status=$?
if [[ -d $dir/sanitizer-reports ]]; then  # --asan, --tsan: every finding, with its stack
  for f in "$dir"/sanitizer-reports/*; do
    [[ -s $f ]] || continue
    echo "== $f"
    head -n 40 "$f"
    status=1
  done
fi
echo "emulated GPU ($dir): build $((built - start)) s, tests $((SECONDS - built)) s"
exit $status
