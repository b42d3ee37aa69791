#!/usr/bin/env bash
# gpu_check.sh RESULTS_DIR: on a GPU host, build the project with CUDA
# and NCCL in its own build folder (build-gpu/), run the GPU test suites
# (gpu_kernels: every CUDA kernel against its CPU twin; gpu_comm: every
# collective of the NCCL communicator against a host computation;
# gpu_comm_threads: the threads backend on device buffers, N virtual ranks on
# the one GPU, bit for bit against a host computation and the host threads
# backend; every tests/test_gpu_* target is run), then the NCCL communicator with
# one rank per process: two processes on the one GPU (NCCL_HOSTID each, a
# rendezvous file for the id), once checking every collective, once with
# rank 1 dying (rank 0 must raise, not hang); then dp launched the same way
# (RANK / WORLD_SIZE, no MPI) against dp --ranks 2; then every stage on the gpt2
# preset (bf16) with 1 rank and with 4 virtual ranks on the one GPU (step time,
# peak device memory per rank, model states / P), each 1-rank run also as a
# dry run on the modeled clock (--hardware of this card, h200 if unknown:
# modeled against measured);
# last, the gpt2 preset in
# bf16 with 1 rank timed against PyTorch eager on the same GPU, model, batch
# and precision (bench/torch_ref.py --device cuda), in tokens/s, ms/step, MFU
# (bench/mfu.py) and peak memory, then the same dp run's device time op by
# op (ZF_PROFILE=1, in stages.log), with the simple and the flash attention
# (the flash one also timed, a second table); last, with the time left, the
# flash kernels under compute-sanitizer. Logs go into RESULTS_DIR; the steps' table and
# the benchmark tables (bench/gpu_report.py) are printed last and saved as
# RESULTS_DIR/summary.txt.
#
# Time: the whole script stays inside ZF_GPU_CHECK_BUDGET_S (default 465 s,
# so that a check fits in 8 minutes of GPU time): every step's time limit
# is cut to what is left, a step with no time left is skipped (and the check
# fails), and the stage runs leave ZF_BENCH_RESERVE_S (150 s) for the timing
# against PyTorch.
# Files: RESULTS_DIR gets build.log, tests.log, stages.log, summary.txt and one
# XML per GPU suite (4: gpu_kernels, gpu_comm, gpu_comm_threads, gpu_stages),
# 8 files and no more, so that the results of a remote GPU host are few and
# small to copy back: a new log goes into one of these.
#
# Dependencies: the GPU host needs the CUDA toolkit (or PyTorch's cuBLAS and
# NCCL wheels, below), Meson, Ninja, a C++ compiler, Python and PyTorch, and
# no package access: CLI11, GoogleTest, nlohmann-json and OpenBLAS come from
# gpu_carry/ (git-ignored), which scripts/prepare_gpu_carry.sh bundles on a
# Debian 12 machine that has them (scripts/install_deps.sh):
#   scripts/prepare_gpu_carry.sh      # on the Debian machine, once: writes gpu_carry/
#   scripts/gpu_check.sh OUTDIR       # on the GPU host, in a copy of the repository with gpu_carry/
#
# Exit status 0 only if every step passed and the GPU tests really ran on a
# GPU (a suite whose tests skipped for want of a device counts as a failure
# here: on a GPU host that would be a vacuous pass).
#
# NCCL: from the CUDA toolkit, else from the nvidia-nccl-cu13 (or -cu12)
# wheel that PyTorch brings (-Dnccl_dir=<wheel>; Meson links its
# lib/libnccl.so.2 by full path with an rpath).
#
# Environment: ZF_GPU_BUILD_DIR (default build-gpu), ZF_GPU_ARCH (the SM
# architectures to build for, Meson's -Dgpu_arch; default 90: the H100/H200
# only, a faster build than the option's default 80;90), ZF_BENCH_BATCH (16)
# and ZF_BENCH_STEPS (20, of which the first 5 are warmup) for the timing
# against PyTorch, ZF_PEAK_TFLOPS (the card's dense bf16 peak, for MFU on a
# card bench/mfu.py does not know), ZF_GPU_CHECK_WITHOUT_GPU=1 to go on past a
# failed device check (to test this script's build steps on a machine
# without a GPU; the test step then fails, as it must).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [[ $# -ne 1 ]]; then
  echo "usage: scripts/gpu_check.sh RESULTS_DIR" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
res=$(cd "$1" && pwd)
build=${ZF_GPU_BUILD_DIR:-build-gpu}
carry=$root/gpu_carry
t0=$SECONDS
deadline=$((t0 + ${ZF_GPU_CHECK_BUDGET_S:-465}))
reserve=0  # seconds kept back for later steps (the stage runs keep the timing's)

# ---------------------------------------------------------------------------
# Steps and the final table

rows=()
failed=0
device="?"
gpu_name=""      # the card's name alone (nvidia-smi), for MFU's peak
stage_logs=()    # run logs of the stage runs (step 6) and of the timing (step 7),
modeled_logs=()  # the 1-rank stage runs' dry runs on the modeled clock (step 6),
bench_logs=()    # for bench/gpu_report.py's tables at the end
record() {  # record STEP RESULT SECONDS
  rows+=("$(printf '%-26s %-50s %5ss' "$1" "$2" "$3")")
}
finish() {
  {
    echo
    echo "== gpu_check: $device =="
    printf '%-26s %-50s %6s\n' step result time
    printf '%s\n' "${rows[@]}"
    printf '%-26s %-50s %5ss\n' total "$([[ $failed -eq 0 ]] && echo PASS || echo FAIL)" \
      "$((SECONDS - t0))"
    rm -f "$build/bench.json"  # never an earlier check's numbers
    if [[ ${#stage_logs[@]} -gt 0 || ${#bench_logs[@]} -gt 0 ]]; then
      echo
      local args=()
      for l in "${stage_logs[@]}"; do args+=(--stage "$l"); done
      for l in "${modeled_logs[@]}"; do args+=(--modeled "$l"); done
      python3 "$root/bench/gpu_report.py" --gpu "$gpu_name" --warmup 5 --stage-warmup 2 \
        "${bench_logs[@]}" "${args[@]}" --json "$build/bench.json" 2>&1
    fi
    echo "logs: $res"
  } | tee "$res/summary.txt"
  if [[ -f $build/bench.json ]]; then  # every number of the tables, for bench/RESULTS.md
    { echo "== bench.json (bench/gpu_report.py) =="; cat "$build/bench.json"; } >>"$res/stages.log"
  fi
  exit "$failed"
}
# run_step NAME LIMIT_S LOG CMD...: runs CMD with a time limit, output to LOG.
run_step() {
  local name=$1 limit=$2 log=$3 s=$SECONDS rc left
  shift 3
  left=$((deadline - reserve - SECONDS))  # the time budget: cut the limit to what is left
  if [[ $left -lt 10 ]]; then
    record "$name" "SKIPPED (time budget spent)" 0
    failed=1
    return 1
  fi
  [[ $limit -gt $left ]] && limit=$left
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then
    record "$name" ok $((SECONDS - s))
  else
    [[ $rc -eq 124 || $rc -eq 137 ]] && rc="timed out after ${limit}s" || rc="exit $rc"
    record "$name" "FAILED ($rc, see $(basename "$log"))" $((SECONDS - s))
    failed=1
    echo "gpu_check: $name failed ($rc); last lines of $log:" >&2
    tail -n 25 "$log" >&2
  fi
  [[ $rc == 0 ]]
}
# two_ranks OUT HOSTID LINE_FMT STATUS_FMT [NAME=VALUE...] CMD...: step 5's
# launch of two processes (nccl_two_process, then dp's env launch). Starts CMD
# twice at once, in the background, as RANK=0 and RANK=1 of WORLD_SIZE=2, NCCL
# over sockets on lo (NCCL_NET=Socket: NCCL's own socket transport even where
# an external net plugin is installed; no InfiniBand; warnings only; P2P and
# SHM need no switch: NCCL offers them only between ranks of one NCCL_HOSTID),
# with the NAME=VALUE words
# (env(1)) and, if HOSTID is not empty, NCCL_HOSTID=HOSTID<r>; process r's
# output goes to the file OUT<r>. Waits for both, then prints each one's
# output, every line after LINE_FMT (printf, %s: r), then STATUS_FMT (printf,
# the two %s: their exit statuses). Returns 0 if both exited 0. Its callers run
# under run_step's bash -c: pass it along with them (declare -f two_ranks ...).
two_ranks() {
  local out=$1 hostid=$2 line_fmt=$3 status_fmt=$4 r pre vars=() pids=() rcs=()
  shift 4
  for r in 0 1; do
    vars=("RANK=$r" WORLD_SIZE=2 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_DEBUG=WARN)
    [[ -n $hostid ]] && vars+=("NCCL_HOSTID=$hostid$r")
    env "${vars[@]}" "$@" >"$out$r" 2>&1 &
    pids[r]=$!
  done
  for r in 0 1; do
    rcs[r]=0
    wait "${pids[r]}" || rcs[r]=$?
    # shellcheck disable=SC2059  # the formats are the callers' own
    printf -v pre "$line_fmt" "$r"
    sed "s/^/$pre/" "$out$r"
  done
  # shellcheck disable=SC2059
  printf "$status_fmt\n" "${rcs[0]}" "${rcs[1]}"
  [[ ${rcs[0]} -eq 0 && ${rcs[1]} -eq 0 ]]
}

# ---------------------------------------------------------------------------
# 1. Preflight: the GPU, the tools, the bundled dependencies (gpu_carry/).

pre=$res/build.log  # preflight, setup, configure and build: one log (RESULTS_DIR keeps to 8 files)
: >"$pre"
s=$SECONDS
[[ -d /usr/local/cuda/bin ]] && export PATH=/usr/local/cuda/bin:$PATH
problems=()
if command -v nvidia-smi >/dev/null && nvidia-smi -L >>"$pre" 2>&1; then
  device=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
           head -n 1)
  gpu_name=${device%%,*}
  nvidia-smi >>"$pre" 2>&1
elif [[ -e /dev/nvidia0 ]]; then
  device="a GPU at /dev/nvidia0 (no nvidia-smi)"
else
  problems+=("no GPU visible: nvidia-smi is $(command -v nvidia-smi >/dev/null &&
               echo 'failing' || echo 'absent') and there is no /dev/nvidia0")
  device="no GPU"
fi
meson_cmd=(meson)
command -v meson >/dev/null || meson_cmd=(python3 -m mesonbuild.mesonmain)
"${meson_cmd[@]}" --version >>"$pre" 2>&1 || problems+=("meson not found (neither meson nor python3 -m mesonbuild)")
command -v ninja >/dev/null || problems+=("ninja not found")
command -v nvcc >/dev/null && nvcc --version >>"$pre" 2>&1 || problems+=("nvcc not found (looked in PATH and /usr/local/cuda/bin)")
c++ --version >>"$pre" 2>&1 || problems+=("no C++ compiler (c++)")
[[ -f $carry/pkgconfig/gtest.pc ]] ||
  problems+=("gpu_carry/ missing: run scripts/prepare_gpu_carry.sh on the build machine and carry gpu_carry")
if [[ ${#problems[@]} -gt 0 ]]; then
  printf 'gpu_check: %s\n' "${problems[@]}" | tee -a "$pre" >&2
  if [[ ${ZF_GPU_CHECK_WITHOUT_GPU:-0} == 1 && ${#problems[@]} -eq 1 && $device == "no GPU" ]]; then
    record preflight "no GPU (going on: ZF_GPU_CHECK_WITHOUT_GPU=1)" $((SECONDS - s))
    failed=1
  else
    record preflight "FAILED: $(IFS=';'; echo "${problems[*]}")" $((SECONDS - s))
    failed=1
    finish
  fi
else
  record preflight "ok" $((SECONDS - s))
fi

# cuBLAS: from the CUDA toolkit; if the toolkit has none, from PyTorch's
# nvidia-cublas wheel (headers and libraries found through CPATH,
# LIBRARY_PATH and LD_LIBRARY_PATH, with the unversioned links that
# configure's check for cuBLAS needs made in gpu_carry/cublas/; the programs
# open it through LD_LIBRARY_PATH, common/cuda/cublas_loader.cpp).
cuda_root=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
if ! ls "$cuda_root"/lib64/libcublas.so "$cuda_root"/lib/libcublas.so \
       "$cuda_root"/targets/x86_64-linux/lib/libcublas.so >/dev/null 2>&1; then
  wheel=$(python3 -c 'import nvidia.cublas, os; print(list(nvidia.cublas.__path__)[0])' 2>/dev/null)
  if [[ -n $wheel && -d $wheel/lib ]]; then
    mkdir -p "$carry/cublas"
    for lib in cublas cublasLt; do
      so=$(ls "$wheel"/lib/lib$lib.so.* 2>/dev/null | head -n 1)
      [[ -n $so ]] && ln -sf "$so" "$carry/cublas/lib$lib.so"
    done
    export LIBRARY_PATH=$carry/cublas${LIBRARY_PATH:+:$LIBRARY_PATH}
    export LD_LIBRARY_PATH=$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export CPATH=$wheel/include${CPATH:+:$CPATH}
    echo "cuBLAS: not in $cuda_root, using the wheel at $wheel" >>"$pre"
  else
    echo "cuBLAS: not in $cuda_root and no nvidia-cublas wheel; configure will say so" >>"$pre"
  fi
fi

# NCCL: the toolkit's, else the wheel's (its headers in include/, its library
# in lib/ as libnccl.so.2 only; meson.build handles that name).
nccl_opt=()
if ! ls "$cuda_root"/include/nccl.h >/dev/null 2>&1; then
  wheel=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  if [[ -n $wheel && -f $wheel/include/nccl.h ]]; then
    nccl_opt=(-Dnccl_dir="$wheel")
    export LD_LIBRARY_PATH=$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "NCCL: not in $cuda_root, using the wheel at $wheel: $(ls "$wheel"/lib)" >>"$pre"
  else
    echo "NCCL: not in $cuda_root and no nvidia-nccl wheel; configure will say so" >>"$pre"
  fi
fi

# ---------------------------------------------------------------------------
# 2. The bundled dependencies (gpu_carry/): unpack OpenBLAS, compile
# GoogleTest with this host's compiler, point pkg-config at gpu_carry/pkgconfig.

# One log for setup, configure and build; one for the tests (RESULTS_DIR
# keeps to 8 files).
setup_log=$res/build.log
setup_carry() {
  set -e
  if [[ ! -f $carry/lib/libopenblas.a ]]; then
    if command -v xz >/dev/null; then
      xz -dc "$carry/lib/libopenblas.a.xz" >"$carry/lib/libopenblas.a"
    else
      python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' \
        "$carry/lib/libopenblas.a.xz" >"$carry/lib/libopenblas.a"
    fi
  fi
  if [[ ! -f $carry/lib/libgtest.a ]]; then
    local g=$carry/src/googletest
    c++ -std=c++17 -O2 -fPIC -pthread -I"$g/include" -I"$g" -c "$g/src/gtest-all.cc" \
      -o "$carry/lib/gtest-all.o"
    ar rcs "$carry/lib/libgtest.a" "$carry/lib/gtest-all.o"
  fi
  ls -la "$carry/lib"
}
if command -v pkg-config >/dev/null; then
  echo "pkg-config: $(command -v pkg-config)" >>"$setup_log"
else
  export PATH=$carry/bin:$PATH
  export PKG_CONFIG=$carry/bin/pkg-config
  echo "pkg-config: none here, using the carried pkgconf" >>"$setup_log"
fi
export PKG_CONFIG_PATH=$carry/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
run_step "carried deps" 60 "$setup_log" bash -c "$(declare -f setup_carry); carry='$carry' setup_carry" ||
  finish

# ---------------------------------------------------------------------------
# 3. Configure and build (only what the GPU tests need).

conf=$res/build.log
# sm_90 only (H100/H200): half the device code of the default "80;90".
arch_opt=(-Dgpu_arch="${ZF_GPU_ARCH:-90}")
conf_args=(-Dcuda=enabled -Dnccl=enabled "${nccl_opt[@]}" -Dmpi=disabled -Dbuildtype=release "${arch_opt[@]}")
if [[ -f $build/build.ninja ]]; then
  run_step "configure (cuda)" 60 "$conf" "${meson_cmd[@]}" setup --reconfigure "$build" "${conf_args[@]}" || finish
else
  # nvcc behind scripts/nvcc_deps.sh, as scripts/build.sh sets it up: a
  # header edited between two checks recompiles the GPU code that includes it.
  run_step "configure (cuda)" 60 "$conf" "${meson_cmd[@]}" setup "$build" \
    --native-file <(scripts/nvcc_deps.sh --native-file) "${conf_args[@]}" || finish
fi
grep -E '^\s+(BLAS|MPI|CUDA|NCCL|GoogleTest)\s*:' "$conf" | sed 's/^ */  /' >&2

blog=$res/build.log
targets=$(ninja -C "$build" -t targets all 2>/dev/null |
          sed -nE 's#^(tests/test_gpu_[A-Za-z0-9_]+):.*#\1#p' | sort -u)
if [[ -z $targets ]]; then
  record build "FAILED (no tests/test_gpu_* target: CUDA off?)" 0
  failed=1
  finish
fi
# nccl_two_process: not a meson test, run below as two processes.
two_proc=$(ninja -C "$build" -t targets all 2>/dev/null | sed -nE 's#^(tests/nccl_two_process):.*#\1#p' | head -n 1)
# Every stage executable this build has (04_fsdp/fsdp, 05_offload/offload as
# they arrive).
all_targets=$(ninja -C "$build" -t targets all 2>/dev/null)
stages=""
for st in 00_data_parallel/dp 01_zero1/zero1 02_zero2/zero2 03_zero3/zero3 04_fsdp/fsdp 05_offload/offload; do
  grep -q "^$st:" <<<"$all_targets" && stages+="$st "
done
run_step "build" 240 "$blog" ninja -C "$build" $targets $two_proc $stages || finish

# ---------------------------------------------------------------------------
# 4. The GPU test suites (those named gpu_*: gpu_kernels, gpu_comm,
# gpu_comm_threads, found from the tests/test_gpu_* targets above), through
# meson test so that scripts/test_summary.py can count them.

tlog=$res/tests.log
: >"$tlog"
suites=$(for t in $targets; do echo "${t#tests/test_}"; done)  # tests/test_gpu_x -> gpu_x
rm -rf "$build/tests/results" && mkdir -p "$build/tests/results"
s=$SECONDS
# 150 s at most (the suites run side by side; the stage suite alone trains
# tiny 30 times), less if the budget is short.
test_limit=$((deadline - SECONDS - 60))
[[ $test_limit -gt 150 ]] && test_limit=150
[[ $test_limit -lt 10 ]] && test_limit=10
timeout --kill-after=10 "$test_limit" "${meson_cmd[@]}" test -C "$build" --no-rebuild --print-errorlogs \
  $suites >>"$tlog" 2>&1
python3 scripts/test_summary.py "$build/tests/results" "$build/meson-logs/testlog.json" \
  >"$build/test_summary.txt" 2>&1
summary_rc=$?
cat "$build/test_summary.txt" >>"$tlog"
counts=$(tail -n 1 "$build/test_summary.txt")
cp "$build/meson-logs/testlog.txt" "$tlog.full" 2>/dev/null && cat "$tlog.full" >>"$tlog" && rm -f "$tlog.full"
cp "$build"/tests/results/*.xml "$res/" 2>/dev/null
vacuous=$(grep -l 'no CUDA device' "$build"/tests/results/gpu_*.xml 2>/dev/null | wc -l)
if [[ $summary_rc -ne 0 ]]; then
  record "gpu tests ($(echo $suites))" "FAILED: $counts" $((SECONDS - s))
  failed=1
elif [[ $vacuous -gt 0 ]]; then
  record "gpu tests ($(echo $suites))" "FAILED: skipped, no CUDA device ($counts)" $((SECONDS - s))
  failed=1
else
  record "gpu tests ($(echo $suites))" "$counts" $((SECONDS - s))
fi
# The headroom of each comparison (max error / tolerance), for the record.
grep -h 'max error / tolerance' "$tlog" | sort -t= -k2 -g -r | head -n 5 | sed 's/^ */  worst: /' >&2

# ---------------------------------------------------------------------------
# 5. The NCCL communicator with one rank per process: two processes on the one
# GPU, each with its own NCCL_HOSTID (NCCL then sees two hosts and connects
# them over sockets on lo), the id passed through a fresh rendezvous file.
# First every collective (each process checks its results), then a fault:
# rank 1 dies before the last collective, and rank 0 must raise (NCCL's
# asynchronous error, or the watchdog after ZF_NCCL_TIMEOUT_S=8) and exit.
# (ZF_NCCL_TIMEOUT_S=20 in the first run: a hang is reported by the
# communicator, naming the collective, well inside the step's 60 s.)
two_process() {  # two_process BIN MODE (normal|fault): both processes' output on stdout
  local bin=$1 mode=$2 dir timeout_s=20 ok=0
  local extra=()
  [[ $mode == fault ]] && extra=(--fault) && timeout_s=8
  dir=$(mktemp -d "${TMPDIR:-/tmp}/zf-nccl.XXXXXX")
  two_ranks "$dir/out" zf-gpu-check-rank "[$mode, process %s] " \
    "[$mode] exit status: process 0: %s, process 1: %s" \
    "ZF_NCCL_TIMEOUT_S=$timeout_s" "$bin" "$dir/id" "${extra[@]}" || ok=1
  [[ $mode == fault ]] && ! grep -q 'fault check ok' "$dir/out0" && ok=1
  rm -rf "$dir"
  return $ok
}
if [[ -z $two_proc ]]; then
  record "nccl 2 processes" "FAILED (no tests/nccl_two_process target: NCCL off?)" 0
  failed=1
else
  echo "== nccl_two_process ==" >>"$tlog"
  run_step "nccl 2 processes (+fault)" 60 "$tlog" bash -c "$(declare -f two_ranks two_process)
    two_process '$build/tests/nccl_two_process' normal &&
    two_process '$build/tests/nccl_two_process' fault"
  grep -hE 'checks, [0-9]+ failed|fault detected' "$tlog" | sed 's/^/  /' >&2
fi

# The env launch of a stage (common/launch/launch.h): dp as two plain background
# processes on the one GPU, each with RANK / WORLD_SIZE / ZF_RENDEZVOUS and no
# NCCL_HOSTID of ours (the launcher must give the second process one, or NCCL
# refuses two ranks on one GPU), against dp --ranks 2 in one process (virtual
# ranks, the threads backend on device buffers): the same global batch, so
# the same losses. Tolerance 1e-4 on every step's loss: with 2 ranks NCCL's
# sum is one addition per element, as the threads backend's (the same bits
# are expected; param_hash says whether they were), while an update 1% off
# moves the tiny model's loss by 8e-4 from step 1 on (measured on the CPU).
# Output into tests.log only (no file of its own in RESULTS_DIR).
env_launch() {  # env_launch DP_BINARY: both runs' output on stdout
  local bin=$1 dir ok=0
  local flags=(--device cuda --model tiny --batch 2 --steps 6 --lr 1e-3 --log-every 1)
  dir=$(mktemp -d "${TMPDIR:-/tmp}/zf-env.XXXXXX")
  "$bin" "${flags[@]}" --ranks 2 --log-json "$dir/threads.jsonl" >"$dir/threads.out" 2>&1 || ok=1
  sed 's/^/[dp --ranks 2] /' "$dir/threads.out"
  two_ranks "$dir/env" "" "[dp RANK=%s] " "[env launch] exit status: rank 0: %s, rank 1: %s" \
    "ZF_RENDEZVOUS=$dir/rendezvous" ZF_NCCL_TIMEOUT_S=30 "$bin" "${flags[@]}" --log-json "$dir/env.jsonl" ||
    ok=1
  grep -q '2 ranks (processes, RANK/WORLD_SIZE)' "$dir/env0" ||
    { echo "[env launch] FAILED: rank 0 did not run as one of 2 processes"; ok=1; }
  grep -q 'correctness-only' "$dir/env1" ||
    { echo "[env launch] FAILED: rank 1 did not say it shares the GPU (NCCL_HOSTID)"; ok=1; }
  [[ -e $dir/rendezvous ]] && { echo "[env launch] FAILED: rank 0 left the rendezvous file"; ok=1; }
  python3 - "$dir/threads.jsonl" "$dir/env.jsonl" <<'PY' || ok=1
import json, sys
def load(path):
    try:
        rows = [json.loads(l) for l in open(path) if l.strip()]
    except OSError:
        rows = []
    steps = [r for r in rows if "summary" not in r]
    summary = [r["summary"] for r in rows if "summary" in r]
    return steps, (summary[-1] if summary else None)
(a, sa), (b, sb) = load(sys.argv[1]), load(sys.argv[2])
tol = 1e-4
if not a or len(a) != len(b) or sa is None or sb is None:
    print(f"[env launch] FAILED: the runs logged {len(a)} and {len(b)} steps")
    sys.exit(1)
worst = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
ok = worst <= tol and sb["ranks"] == 2
same = "equal" if sa["param_hash"] == sb["param_hash"] else "different"
print(f"[env launch] dp, 2 processes (NCCL) vs --ranks 2 (threads): {len(a)} steps, "
      f"max |loss difference| {worst:.3g} (tolerance {tol:g}), param_hash {same}: "
      f"{'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
PY
  rm -rf "$dir"
  return $ok
}
if [[ -n $two_proc ]]; then  # (NCCL was built)
  echo "== dp, env launch ==" >>"$tlog"
  run_step "dp env launch (2 procs)" 120 "$tlog" bash -c "$(declare -f two_ranks env_launch)
    env_launch '$build/00_data_parallel/dp'"
  grep -h '^\[env launch\] dp' "$tlog" | sed 's/^/  /' >&2
fi

# ---------------------------------------------------------------------------
# 6. Every stage on the gpt2 preset, bf16, 1 rank and 4 virtual ranks on this
# GPU (B=4, 6 steps): step time, peak device memory per rank and model states
# per rank / P, from each run log, in the tables at the end (bench/gpu_report.py;
# the median leaves out the first 2 steps). The time limits leave
# ZF_BENCH_RESERVE_S for step 7.
slog=$res/stages.log
: >"$slog"
reserve=${ZF_BENCH_RESERVE_S:-150}
case $gpu_name in  # the modeled twin of this card (hardware/*.hw); the H200 where none is known
  *H100*SXM* | *"H100 80GB HBM3"*) hw=h100-sxm ;;
  *A100*SXM* | *"A100-SXM"*) hw=a100-sxm ;;
  *L40S*) hw=l40s ;;
  *) hw=h200 ;;
esac
for st in $stages; do
  for n in 1 4; do
    name=$(basename "$st")
    log=$build/$name.$n.jsonl
    rm -f "$log"  # no stale log from an earlier check may stand in for a failed run
    stage_logs+=("$log")
    echo "== $name gpt2 bf16 ranks=$n ==" >>"$slog"
    run_step "$name gpt2 bf16 ranks=$n" 120 "$slog" "$build/$st" --device cuda --model gpt2 --precision bf16 \
      --ranks "$n" --batch 4 --steps 6 --log-every 1 --log-json "$log"
    if [[ $n == 1 ]]; then  # the same run, modeled on this card (on the CPU: a dry run, seconds)
      mlog=$build/$name.1.modeled.jsonl
      rm -f "$mlog"
      modeled_logs+=("$mlog")
      run_step "$name modeled on $hw" 60 "$slog" "$build/$st" --model gpt2 --precision bf16 --compute bf16 \
        --ranks 1 --batch 4 --steps 6 --clock modeled --hardware "$hw" --dry-run --log-every 1 --log-json "$mlog"
    fi
  done
done
reserve=0

# ---------------------------------------------------------------------------
# 7. Timing against PyTorch: the gpt2 preset, bf16, 1 rank, batch B, on this
# GPU, our stage 00 (dp) then bench/torch_ref.py --device cuda (PyTorch eager:
# autocast bf16 around forward and loss, fp32 parameters and AdamW, SDPA
# attention). Both read the same token file (random tokens, llm.c format) and
# start from the same model (dp --save-init -> torch_ref --init), so their
# first losses must agree closely (bf16 rounding apart). Both logs: per-step times; the
# tables take the median of the steps after the first 5 on both sides alike.
bench_b=${ZF_BENCH_BATCH:-16}
bench_steps=${ZF_BENCH_STEPS:-20}
if ! [[ $bench_b =~ ^[1-9][0-9]*$ && $bench_steps =~ ^[0-9]+$ && $bench_steps -gt 5 ]]; then
  echo "gpu_check: ZF_BENCH_BATCH=$bench_b must be a positive integer and ZF_BENCH_STEPS=$bench_steps" \
       "more than the 5 warmup steps" >&2
  record "timing vs PyTorch" "FAILED (bad ZF_BENCH_BATCH / ZF_BENCH_STEPS)" 0
  failed=1
  finish
fi
data=$build/bench_tokens.bin
init=$build/bench_init.safetensors
bench_dp=$build/bench_dp.jsonl
bench_flash=$build/bench_dp_flash.jsonl
bench_torch=$build/bench_torch.jsonl
rm -f "$data" "$init" "$bench_dp" "$bench_flash" "$bench_torch"
bench_logs=(--ours "$bench_dp" --ours-flash "$bench_flash" --torch "$bench_torch"
            --label "gpt2 bf16, 1 rank, B=$bench_b")
echo "== timing: dp and PyTorch, gpt2 bf16 ranks=1 B=$bench_b, $bench_steps steps ==" >>"$slog"
# 2^20 random tokens below GPT-2's 50257, in llm.c's format (docs/SPEC.md "Data").
python3 - "$data" >>"$slog" 2>&1 <<'PY'
import array, random, sys
n, rng = 1 << 20, random.Random(1337)
header = array.array("i", [20240520, 1, n] + [0] * 253)
tokens = array.array("H", (rng.randrange(50257) for _ in range(n)))
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.tobytes())
print("token file: %s, %d random tokens" % (sys.argv[1], n))
PY
run_step "timing: dp B=$bench_b" 120 "$slog" "$build/00_data_parallel/dp" --device cuda --model gpt2 \
  --precision bf16 --ranks 1 --batch "$bench_b" --steps "$bench_steps" --data "$data" \
  --save-init "$init" --log-every 5 --log-json "$bench_dp"
init_opt=()
[[ -f $init ]] && init_opt=(--init "$init")  # else PyTorch's own init: timing only
# The same run with --attention flash (tensor cores, kernels_cuda_flash_tc.cu):
# the same init and tokens, so its losses must follow the simple form's.
run_step "timing: dp flash B=$bench_b" 90 "$slog" "$build/00_data_parallel/dp" --attention flash \
  --device cuda --model gpt2 --precision bf16 --ranks 1 --batch "$bench_b" --steps "$bench_steps" \
  --data "$data" "${init_opt[@]}" --log-every 5 --log-json "$bench_flash"
run_step "timing: PyTorch eager B=$bench_b" 150 "$slog" env PYTHONUNBUFFERED=1 python3 bench/torch_ref.py \
  --device cuda --model gpt2 --precision bf16 --batch "$bench_b" --steps "$bench_steps" --warmup 5 \
  --data "$data" "${init_opt[@]}" --log-json "$bench_torch"
rm -f "$init"  # 650 MB
# 8. Where our step's device time goes, op by op (common/report/device_profile.h):
# the same run, 4 steps, ZF_PROFILE=1; the table lands in stages.log.
echo "== op profile: dp gpt2 bf16 ranks=1 B=$bench_b (ZF_PROFILE=1) ==" >>"$slog"
run_step "op profile: dp B=$bench_b" 60 "$slog" env ZF_PROFILE=1 "$build/00_data_parallel/dp" \
  --device cuda --model gpt2 --precision bf16 --ranks 1 --batch "$bench_b" --steps 4 --data "$data" \
  --log-every 4
echo "== op profile: the same with --attention flash ==" >>"$slog"
run_step "op profile: flash attention" 60 "$slog" env ZF_PROFILE=1 \
  "$build/00_data_parallel/dp" --attention flash --device cuda --model gpt2 --precision bf16 --ranks 1 --batch "$bench_b" \
  --steps 4 --data "$data" --log-every 4
# 9. Last, with the time that is left: the flash kernels under
# compute-sanitizer (the CUDA toolkit's, when there):
# racecheck finds a shared-memory race the CPU harnesses cannot (they run a
# phase's threads one after another), memcheck an out-of-bounds access. On
# FlashAttentionIsDeterministic: both flash forms, small shapes (B=2, T=200),
# so the tools' slowdown stays within the limit. Output into tests.log.
sanitizer=$(command -v compute-sanitizer || true)
[[ -z $sanitizer && -x $cuda_root/bin/compute-sanitizer ]] && sanitizer=$cuda_root/bin/compute-sanitizer
if [[ -n $sanitizer && -x $build/tests/test_gpu_kernels ]]; then
  echo "== compute-sanitizer: racecheck, memcheck on the flash kernels ==" >>"$tlog"
  run_step "sanitizer: flash kernels" 90 "$tlog" bash -c "
    '$sanitizer' --tool racecheck --error-exitcode 1 \
      '$build/tests/test_gpu_kernels' --gtest_filter='CudaKernels.FlashAttentionIsDeterministic' &&
    '$sanitizer' --tool memcheck --error-exitcode 1 \
      '$build/tests/test_gpu_kernels' --gtest_filter='CudaKernels.FlashAttentionIsDeterministic'"
else
  record "sanitizer: flash kernels" "not run (no compute-sanitizer)" 0
fi
finish
