#!/usr/bin/env bash
# bench.sh: the one benchmark command. Installs what is missing (PyTorch
# included: Debian's python3-torch is the peer of every number), builds, then
# runs bench/run_bench.py, which prints each measurement beside its peer and
# writes the report as markdown (default bench/last_run.md). Takes about five
# minutes on a 2-core machine. Arguments go to run_bench.py, e.g.
#
#   scripts/bench.sh --markdown /tmp/run.md --repeats 2
#   scripts/bench.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --bench
scripts/build.sh
# Debian's interpreter: python3-torch is installed for it, not for a pyenv/venv python3.
exec /usr/bin/python3 bench/run_bench.py "$@"
