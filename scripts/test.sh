#!/usr/bin/env bash
# test.sh: the README's second command (and what CI runs). Installs what is
# missing, builds, runs every GoogleTest suite through `meson test`, and ends
# with one line "N passed, N failed, N skipped" summed over all suites.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh || exit 1
scripts/build.sh || exit 1
rm -rf build/tests/results && mkdir -p build/tests/results
meson test -C build --num-processes 2 --print-errorlogs "$@"
meson_status=$?
python3 scripts/test_summary.py build/tests/results build/meson-logs/testlog.json
summary_status=$?
[[ $meson_status -eq 0 && $summary_status -eq 0 ]]
