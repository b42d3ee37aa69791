#!/usr/bin/env bash
# sanitize.sh: the tests again under the sanitizers, each in its own build
# (MPI on, and the GPU code on the emulated GPU of the tests, tests/emu):
# build-asan with AddressSanitizer + LeakSanitizer +
# UndefinedBehaviorSanitizer, build-tsan with ThreadSanitizer.
#
#   scripts/sanitize.sh [asan|tsan|all|gpu|full] [--no-summary]
#
# all (CI's) runs the suites chosen below, in unity builds (below), to keep
# CI within its time on 2 cores; gpu runs both sanitizers over every test of
# tests/cuda and tests/emu on the emulated GPU, no test left out, in the
# same builds as all (about an hour on 2 cores, the stage tests under TSan
# most of it), for a change to the GPU code or the emulation; full runs
# both over every suite they can run, the GPU suites too, file by file (far
# longer), for a change to the communicators, the launch or a stage's
# threads.
# scripts/test.sh runs `all` after the normal tests (ZF_SKIP_SANITIZE=1 skips
# it) and sums these runs into its last line; alone, this script ends with
# its own "N passed, N failed, N skipped". A sanitizer finding fails the run
# twice over: the process exits non-zero (UBSan halts on its first error),
# and every process with a finding leaves a report in
# build-*/sanitizer-reports/, each of which scripts/test_summary.py counts as
# a failure, so that a finding in a child process whose failure its test
# expected (tests/failures/) still fails.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
which=${1:-all}
summary=1
[[ ${2:-} == --no-summary ]] && summary=0
case $which in
  asan | tsan | all | gpu | full) ;;
  *) echo "usage: scripts/sanitize.sh [asan|tsan|all|gpu|full] [--no-summary]" >&2; exit 2 ;;
esac

# Optimised a little (-O1) and with line tables only (-g1): on 2 cores the
# build is most of the time, and -O1 compiles much faster than the release
# -O3 while keeping the run fast enough. The test files as
# tests/meson.build builds them: those that only orchestrate at -O0, those
# that compute (references, the GPU suites) at -O1, where a sanitizer would
# otherwise instrument every access to an unoptimised local of a reference's
# loops. Stack traces keep their lines.
common_setup=(-Dmpi=enabled --buildtype=custom -Doptimization=1
              -Ddebug=true -Db_ndebug=true -Db_lundef=false)
# The GPU code compiled for the emulated GPU (tests/emu, docs/GPU.md): the
# GPU suites run in the same builds as the CPU ones, which share every
# library with them.
gpu_setup=(-Dgpu_emulation=true -Dcuda=auto -Dnccl=auto)
# CI's runs (asan, tsan, all) build each target as a few large translation
# units (Meson's unity build), which compiles the shared headers once per
# few files instead of once per file. One thing it hides: ASan's
# initialization-order check sees no order between the files merged into
# one unit (between the units and the libraries it still does), so full
# builds file by file and checks every order.
unity_size=8
unity=on tests_unity=true
[[ $which == full ]] && unity=off tests_unity=false
# And, in CI's runs, UBSan without its null, alignment and pointer-overflow
# checks: they instrument every access and every pointer step, which is
# much of the ASan build's compile time, and add little beside ASan here: a
# null dereference is a fault ASan reports with its stack, and the parsers
# read typed values out of bytes with memcpy, never through a misaligned
# pointer. full keeps every check.
ubsan_cut=(-fno-sanitize=null,alignment,pointer-overflow)
[[ $which == full ]] && ubsan_cut=()

# ASan + UBSan: the suites of the code that handles memory: tensors and
# their transfers, the kernels, the communicators (threads and MPI, and the
# OpenMPI start-up under mpirun), data and safetensors parsing, AdamW's
# vector forms, every stage, recomputation, checkpoints, flags and faults.
# Cut, to keep CI within its time (on 2 cores the build is most of the
# sanitizer time, and these are among its costliest files to compile):
# flash_attention (its two test files take an eighth of the whole build;
# the flash kernel still runs under ASan in compute's --attention flash
# trainings), trace, recorder, reference and memory_model (bookkeeping over
# what the stage suites already run), and the Python suites (stage_diffs and
# test_summary_py run no compiled code; docs, bench_py, bench_fsdp_py and
# trace_gantt_py run the stage binaries as the stage suites do). Also cut,
# to keep CI within its time: adamw (large arrays through every
# instruction set; its kernel runs in offload), dp, zero1, zero2, zero3 and
# fsdp (their collectives and buffers are offload's in other orders, and
# faults runs stage 00 in-process), kernels, compute,
# recompute, memory, model, optim (the stage suites run the same kernels
# and tensors), cli and signals (child processes running the same code as
# faults), mpi_comm_np4 and mpi_launch (np2 runs the same code). What stays:
# the communicators (threads and MPI), the launch, the modeled clock (a dry
# run's ranks are fibers, each on a stack of its own), every parser of untrusted
# input (token files, checkpoints), the failure paths, and stage 05 (stage
# 04's units and queues, transfers, pinned memory, the disk tier). scripts/sanitize.sh full runs
# every suite.
asan_tests=(comm launch clock data checkpoint faults offload mpi_comm_np2)
# Within those, not the tests that only repeat, in many child processes,
# code that shorter tests of the same suite run under ASan too: the
# output-path checks over every spelling of a file (Outputs.UnwritableOutputs*,
# Outputs.TwoOutputsOnOneFile* and the others run the same checks), and the
# ZeRO-3 against data-parallel ratio on two profiles (whole runs of
# arithmetic; the dry runs, whose fibers are why clock is here, stay).
asan_gtest_filter="-Outputs.OutputOntoAShardedCheckpointsFileIsRefused:Outputs.OutputThatIsAnInputIsRefused"
asan_gtest_filter+=":ModeledRun.ZeroThreeCostsMoreThanDataParallelOverPcieThanOverNvlink"

# TSan: the suites whose code runs threads: the threads communicator and its
# rendezvous (comm, launch), every stage (N ranks as threads, the offload
# copy queue), checkpoints and faults (a rank that fails while the others
# wait); AdamW's thread pool runs in offload (--optimizer-threads 1 to 3).
# Not the adamw suite: it passes large arrays through every instruction set
# and thread count (minutes under TSan, for a pool the offload suite
# already runs), it runs under ASan. Not the mpirun suites (mpi_*):
# OpenMPI is not instrumented, so the synchronisation of its progress
# threads and shared-memory transport is invisible to TSan and every
# message would be reported as a race; they run under ASan.
# Not dp, zero1, zero2, zero3 and fsdp in CI: their rank threads and
# two-queue collectives are offload's (stage 05 runs stage 04's units,
# prefetch and queues on stage 00's frame) and comm's split-queue
# scenarios'; nor checkpoint, whose files are written by one thread (full
# runs them all).
# And clock: the modeled clock's worker timeline, charged from the delayed
# update's thread while the rank's thread charges its device.
tsan_tests=(comm launch offload faults clock)
# Within those, not the tests that are long for their arithmetic alone and
# run no thread code the others do not (TSan slows them by an order of
# magnitude): each stage's gradient against the
# double-precision reference, the ring-byte and memory-peak sweeps, the
# stage-00 training to a low loss, and the output-path checks of faults
# (Outputs.*: file checks in child processes, one thread each). They run
# under ASan. The parity, checkpoint, schedule and failure tests that run
# every stage's rank threads, their communicator and the copy queue remain.
tsan_gtest_filter="-*Gradient.MatchesTheReference:*Comm.RingBytesFollowTheSizes"
tsan_gtest_filter+=":DataParallelMemory.*:Zero1Memory.*:Zero2Memory.*:Zero3Memory.*:FsdpMemory.*:OffloadMemory.*"
tsan_gtest_filter+=":DataParallel.LossFallsOnBuiltInCorpus:Outputs.*"
# And the long resumes (many steps of arithmetic; resuming is one thread's
# file reading, and the short resume tests stay), the rank-count and
# memory-budget sweeps, and the timeout test that waits out its timeouts.
tsan_gtest_filter+=":*Checkpoint.ResumeContinuesBitForBit:*Checkpoint.ResumeWith*:OffloadBudget.*"
tsan_gtest_filter+=":DataParallel.FourRanksOfTwoEqualOneRankOfEight:CommTimeout.EnvironmentSetsItAndTheFlagWins"
# In clock, the whole runs of the larger shapes (arithmetic and dry runs of
# many steps); its unit tests and the delayed update on disk remain.
tsan_gtest_filter+=":ModeledRun.*:ModeledFiles.ADryRun*:ModeledFiles.TheDiskTier*"
# In offload, the held-out evaluations (more steps of the parity runs'
# threads); in comm, the deferred transport at 9 ranks (its scenarios run
# at 1 to 4).
tsan_gtest_filter+=":OffloadParity.Validation*:Ranks/DeferredTransportRanks.EveryScenarioGivesTheSameBits/N9"

# Under both, not the two tests that run tools/memory_estimate (a profile
# that is not a file, a batch out of range), so that neither build compiles
# the tool (its flags and tables; the slowest file of either build): the
# profile parser and the size checks they reach run in the same suites
# in-process (Hardware.*, RunSizes.EachProductOutOfRange...).
estimator_tests=":Hardware.AProfileThatIsNotARegularFileIsRefused:RunSizes.DryRunsAndTheEstimatorRefuseABatchOutOfRange"
asan_gtest_filter+=$estimator_tests
tsan_gtest_filter+=$estimator_tests
skip_targets=(tools/memory_estimate)

# The GPU suites on the emulated GPU. Under ASan + UBSan: the emulation
# itself, the NCCL and threads communicators on device buffers, the GPU
# Device, every kernel against its CPU twin (each allocation ends where its
# size says, so a kernel's step past its buffer is a report), and every
# stage on 4 ranks over NCCL in one recipe (bf16 computed in bf16: bf16
# parameters beside float32 masters, the bf16 kernels). Not, in CI: the
# kernel tests that repeat a kernel on GPT-2's shapes (the same indexing
# on larger grids) or run it twice for determinism (the same accesses
# again); the other recipes, the one- and two-GPU runs and `small` run
# the same stage code on other sizes.
# (The stage tests name their part with --gtest_filter, tests/meson.build,
# which the filters here do not narrow.)
asan_tests+=(gpu_emulation gpu_kernels gpu_comm gpu_comm_threads gpu_stages_nccl_bf16_bf16)
gpu_repeats=":CudaKernels.*AtGpt2Shapes:CudaKernels.*IsDeterministic"
asan_gpu_filter=$gpu_repeats
# Under TSan: the emulation, both communicators on device buffers, the GPU
# Device (each stream is a thread: a missing wait between two streams, or a
# host read before a synchronize, is a race it reports) and every kernel:
# the products, layernorm, softmax, attention, the encoder, AdamW, the
# gradient norm, and flash attention's on CUDA cores and on tensor cores.
# Not, in CI: the repeats above; the tests over many rows, or that pass
# millions of values through the gradient norm (its short tests stay: tails,
# subnormals, unaligned starts, nothing); the threads communicator on
# device buffers at 8 and 9 ranks (1 to 4 run the same code). Of the stage
# tests, every stage on 2 GPUs over NCCL in 2 steps of one sequence, bf16
# computed in bf16 (each stage's compute and communication streams, stage
# 04's prefetch, stage 05's copy stream, and what one step leaves the next);
# the four-rank and one-GPU runs of two sequences a rank, and the other
# recipes, would take many times as long under TSan.
tsan_tests+=(gpu_emulation gpu_kernels gpu_comm gpu_comm_threads gpu_stages_two_gpus_bf16_bf16)
tsan_gpu_filter="$gpu_repeats:CudaKernels.*OverManyRows:SumSquaresCuda.RandomBits*:SumSquaresCuda.GradientLike*"
tsan_gpu_filter+=":SumSquaresCuda.TopOfTheRange*:SumSquaresCuda.NonFinite*"
tsan_gpu_filter+=":N/CudaThreadsRanks.*/N8:N/CudaThreadsRanks.*/N9:N/HostSideRanks.*/N9"

sanitizer_env() {  # $1: asan|tsan, $2: the report folder
  local san=$1 rep=$2
  if [[ $san == asan ]]; then
    export ASAN_OPTIONS="log_path=$rep/asan:detect_leaks=1:check_initialization_order=1:strict_init_order=1"
    export LSAN_OPTIONS="suppressions=$root/scripts/sanitizers/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$rep/ubsan"
    # The processes mpirun starts (and only those: the variable is
    # OpenMPI's) record full allocation stacks, so that lsan.supp can name
    # OpenMPI's entry points (see there). Not everywhere: the slow unwinder
    # on every allocation would slow the other suites several times.
    export OMPI_MCA_mca_base_env_list="ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=0"
    local cut=$asan_gtest_filter$asan_gpu_filter  # the tests left out, each after a - or :
    [[ -n $cut ]] && export GTEST_FILTER=-${cut#[-:]}
  else
    export TSAN_OPTIONS="log_path=$rep/tsan:second_deadlock_stack=1"
    # Suppressions only for third-party false positives, each explained there.
    local supp=$root/scripts/sanitizers/tsan.supp
    [[ -f $supp ]] && TSAN_OPTIONS+=":suppressions=$supp"
    # OpenBLAS's own thread pool is not TSan-instrumented: its hand-off of
    # work to its threads is invisible, so the matrices they read and write
    # would be reported as races. One BLAS thread per call keeps every
    # product on the calling (instrumented) thread; blas_set_threads()
    # never raises the count above this.
    export OPENBLAS_NUM_THREADS=1
    local cut=$tsan_gtest_filter$tsan_gpu_filter
    [[ -n $cut ]] && export GTEST_FILTER=$cut
  fi
}

# The build targets the chosen tests need: their executables and every
# built program they run (the stage binaries named in their environment),
# less those of skip_targets.
needed_targets() {  # $1: build dir, $2: targets to leave out, then test names
  local dir=$1 skip=$2; shift 2
  meson introspect "$dir" --targets --tests | ZF_SKIP_TARGETS=$skip python3 -c '
import json, os, sys
data = json.load(sys.stdin)
dir, wanted = sys.argv[1], set(sys.argv[2:])
files = {}
for t in data["targets"]:
    for f in t["filename"]:
        files[f] = t["id"]
ids = {i: f for f, i in files.items()}
out = set()
for t in data["tests"]:
    if t["name"] not in wanted:
        continue
    out.update(ids[d] for d in t["depends"] if d in ids)
    for word in t["cmd"] + list(t["env"].values()):
        if word in files:
            out.add(word)
skip = set(os.environ["ZF_SKIP_TARGETS"].split())
print(" ".join(sorted(t for t in (os.path.relpath(f, dir) for f in out) if t not in skip)))
' "$dir" "$@"
}

run_sanitizer() {  # $1: asan|tsan
  local san=$1 dir=build-$1 start=$SECONDS
  local -n tests=${san}_tests
  local sanitize args=(-g1 -fno-omit-frame-pointer)
  if [[ $san == asan ]]; then
    # UBSan halts on its first error here (the flag) and at run time
    # (halt_on_error in UBSAN_OPTIONS, for code built without the flag).
    sanitize=address,undefined
    args+=(-fno-sanitize-recover=all "${ubsan_cut[@]}")
  else
    sanitize=thread
  fi
  local quoted
  quoted=$(printf ",'%s'" "${args[@]}")
  local options=(-Dunity=$unity -Dtests_unity=$tests_unity -Dunity_size=$unity_size "-Dcpp_args=[${quoted:1}]"
                 -Dtests_optimization=1 "${gpu_setup[@]}")
  rm -rf "$dir/tests/results" "$dir/meson-logs/testlog.json" "$dir/sanitizer-reports"
  if [[ ! -f $dir/build.ninja ]]; then
    meson setup "$dir" "${common_setup[@]}" -Db_sanitize=$sanitize "${options[@]}" >/dev/null ||
      { echo "$san: meson setup failed"; return 1; }
  elif [[ $(meson introspect "$dir" --buildoptions |
            python3 -c 'import json, sys; o = {o["name"]: o["value"] for o in json.load(sys.stdin)}; print(o["unity"], o["gpu_emulation"], o["tests_optimization"], *o["cpp_args"])') != "$unity True 1 ${args[*]}" ]]; then
    # A build of the other mode (all or full): its unity and UBSan's
    # checks; or one without the emulated GPU, or with the test files
    # built otherwise.
    meson configure "$dir" "${options[@]}" >/dev/null || { echo "$san: meson configure failed"; return 1; }
  fi
  # Regenerated now (after a configure above, or a meson.build's change),
  # so that the tests, their order and the targets read below are current.
  ninja -C "$dir" build.ninja >/dev/null || ninja -C "$dir" build.ninja || { echo "$san: meson regenerate failed"; return 1; }
  # In meson's order (the suites' priorities, tests/meson.build: the long
  # ones first), which meson test keeps only for tests it is not given by
  # name; full adds every GPU test there is (tests/meson.build names them
  # gpu_*). A name the build has no test of is refused here: meson test
  # would pass over it.
  local ordered
  ordered=$(meson introspect "$dir" --tests | python3 -c '
import json, sys
which, names = sys.argv[1], set(sys.argv[2:])
known = [t["name"] for t in json.load(sys.stdin)]
if which in ("full", "gpu"):
    names.update(t for t in known if t.startswith("gpu_"))
unknown = sorted(names - set(known))
if unknown:
    sys.exit("no test named " + ", ".join(unknown))
print("\n".join(t for t in known if t in names))
' "$which" "${tests[@]}") || { echo "$san: the tests to run could not be read from $dir"; return 1; }
  mapfile -t tests <<<"$ordered"
  mkdir -p "$dir/tests/results" "$dir/sanitizer-reports"
  local targets
  targets=$(needed_targets "$dir" "${skip_targets[*]}" "${tests[@]}") || return 1
  # shellcheck disable=SC2086
  ninja -C "$dir" $targets >/dev/null || ninja -C "$dir" $targets || { echo "$san: build failed"; return 1; }
  local built=$SECONDS
  # Sanitized code runs several times slower, and the suites' timeouts are
  # set for the normal build; TSan slows the emulated GPU's stage runs of
  # full the most.
  local slower=4
  [[ $san == tsan && ( $which == gpu || $which == full ) ]] && slower=8
  (
    sanitizer_env "$san" "$root/$dir/sanitizer-reports"
    meson test -C "$dir" --no-rebuild --num-processes 2 --print-errorlogs --timeout-multiplier $slower "${tests[@]}"
  )
  local status=$?
  for r in "$dir"/sanitizer-reports/*; do
    [[ -s $r ]] || continue
    # ASan's notice on swapcontext alone is no finding (the dry run's fibers
    # tell it of every switch): scripts/test_summary.py's rule.
    python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import test_summary as t; sys.exit(not t.only_notices(sys.argv[2]))' \
      "$root/scripts" "$r" && continue
    status=1
    echo "=== $san finding: $r"
    head -n 80 "$r"
  done
  echo "$san: build $((built - start)) s, tests $((SECONDS - built)) s"
  return $status
}

if [[ $which == full ]]; then
  asan_tests=(memory kernels flash_attention comm launch data model optim adamw dp zero1 zero2 zero3 fsdp offload
              compute checkpoint recorder trace reference memory_model recompute cli faults signals mpi_comm_np2
              mpi_comm_np4 mpi_launch mpi_signals)
  tsan_tests=(comm launch dp zero1 zero2 zero3 fsdp offload checkpoint faults signals clock)
  asan_gtest_filter="" asan_gpu_filter="" tsan_gpu_filter="" skip_targets=()
fi
if [[ $which == gpu ]]; then  # the GPU tests alone (run_sanitizer adds them), whole
  asan_tests=() tsan_tests=()
  asan_gtest_filter="" asan_gpu_filter="" tsan_gtest_filter="" tsan_gpu_filter=""
fi
status=0
runs=()
for san in asan tsan; do
  [[ $which == all || $which == gpu || $which == full || $which == "$san" ]] || continue
  run_sanitizer "$san" || status=1
  runs+=("build-$san/tests/results" "build-$san/meson-logs/testlog.json" --reports "build-$san/sanitizer-reports")
done
if [[ $summary -eq 1 ]]; then
  python3 scripts/test_summary.py "${runs[@]}" || status=1
fi
exit $status
