#!/usr/bin/env bash
# test.sh: the README's second command (and what CI runs). Installs what is
# missing, builds, runs every GoogleTest suite through `meson test`, then the
# suites again under AddressSanitizer + UBSan and ThreadSanitizer
# (scripts/sanitize.sh; ZF_SKIP_SANITIZE=1 skips that), then the GPU suites
# on the emulated GPU (scripts/emulated.sh; ZF_SKIP_EMULATED=1 skips that;
# naming suites, `scripts/test.sh zero1`, runs only those, in build/), and
# ends with one line "N passed, N failed, N skipped" summed over every run.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh || exit 1
scripts/build.sh || exit 1
rm -rf build/tests/results && mkdir -p build/tests/results
meson test -C build --num-processes 2 --print-errorlogs "$@"
meson_status=$?
runs=(build/tests/results build/meson-logs/testlog.json)
sanitize_status=0
if [[ $# -eq 0 && ${ZF_SKIP_SANITIZE:-0} != 1 ]]; then
  scripts/sanitize.sh all --no-summary
  sanitize_status=$?
  for san in asan tsan; do
    runs+=("build-$san/tests/results" "build-$san/meson-logs/testlog.json" --reports "build-$san/sanitizer-reports")
  done
fi
emulated_status=0
if [[ $# -eq 0 && ${ZF_SKIP_EMULATED:-0} != 1 ]]; then
  scripts/emulated.sh
  emulated_status=$?
  runs+=(build-emu/tests/results build-emu/meson-logs/testlog.json)
fi
python3 scripts/test_summary.py "${runs[@]}"
summary_status=$?
[[ $meson_status -eq 0 && $sanitize_status -eq 0 && $emulated_status -eq 0 && $summary_status -eq 0 ]]
