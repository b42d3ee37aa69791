#!/usr/bin/env bash
# bench.sh: the one benchmark command. Installs what is missing (PyTorch
# included: Debian's python3-torch is the peer of every number), builds, then
# runs bench/run_bench.py, which prints each measurement beside its peer and
# writes the report as markdown (default bench/last_run.md). Takes about five
# minutes on a 2-core machine. Arguments go to run_bench.py, e.g.
#
#   scripts/bench.sh --markdown /tmp/run.md --repeats 2
#   scripts/bench.sh --help
#
# --fsdp (first argument): section D only, stage 04 against PyTorch FSDP2
# (run_bench.py --only fsdp). FSDP2 needs PyTorch 2.4 or newer, which Debian 12
# does not ship: the first such run makes .venv-bench/ (git-ignored) with
# python3 -m venv and pip install torch numpy from PyPI (about 5 GB), later
# runs reuse it. ZF_BENCH_VENV names another folder for it. Minutes per
# repeat, most of it PyTorch's runs.
#
#   scripts/bench.sh --fsdp --repeats 3
#
# --offload (first argument): section E only, stage 05's step against stage
# 04's with the phases (bench/bench_offload.py; no PyTorch).
#
#   scripts/bench.sh --offload --repeats 3 --markdown /tmp/offload.md
#
# --checkpoint (first argument): save and load times and host memory of the
# consolidated, sharded and async checkpoints (bench/bench_checkpoint.py; no
# PyTorch needed, which is the peer when .venv-bench has it). About half an
# hour for small and gpt2 at N = 1, 2, 4, 8 with two repeats.
#
#   scripts/bench.sh --checkpoint --repeats 2 --skip gpt2:8:consolidated --markdown /tmp/ck.md
#
# --adamw (first argument): the host AdamW (CpuAdamW) against torch.optim.AdamW
# (fused, foreach) and DeepSpeedCPUAdam (bench/bench_adamw.py), in the venv
# above (ZF_BENCH_VENV); deepspeed is pip-installed there when missing
# (DS_BUILD_OPS=0: its CPU kernel compiles on first use, a few minutes).
# About a minute after that; arguments go to bench_adamw.py.
#
#   scripts/bench.sh --adamw --reps 20
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--offload" ]]; then
  shift
  scripts/install_deps.sh
  scripts/build.sh
  exec /usr/bin/python3 bench/bench_offload.py "$@"
fi

if [[ "${1:-}" == "--checkpoint" ]]; then
  shift
  scripts/install_deps.sh
  scripts/build.sh
  exec /usr/bin/python3 bench/bench_checkpoint.py "$@"
fi

if [[ "${1:-}" == "--adamw" ]]; then
  shift
  venv="${ZF_BENCH_VENV:-.venv-bench}"
  py="$venv/bin/python"
  [[ -x "$py" ]] && "$py" -c 'import torch' 2>/dev/null ||
    { echo "error: $py has no PyTorch: make the venv with scripts/bench.sh --fsdp first" >&2; exit 1; }
  "$py" -c 'import deepspeed' 2>/dev/null || DS_BUILD_OPS=0 "$py" -m pip install --quiet deepspeed
  scripts/build.sh
  exec "$py" bench/bench_adamw.py "$@"
fi

if [[ "${1:-}" == "--fsdp" ]]; then
  shift
  scripts/install_deps.sh --bench
  venv="${ZF_BENCH_VENV:-.venv-bench}"
  py="$venv/bin/python"
  # A PyTorch that has fully_shard (2.4 or newer), or the venv is (re)made.
  has_fsdp2() {
    "$py" -c 'import sys, torch, numpy
v = tuple(int("".join(c for c in x if c.isdigit()) or 0) for x in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if v >= (2, 4) else 1)' 2>/dev/null
  }
  if [[ ! -x "$py" ]] || ! has_fsdp2; then
    echo "making $venv: python3 -m venv, then pip install torch numpy (PyPI, about 5 GB)"
    /usr/bin/python3 -m venv "$venv"
    "$py" -m pip install --quiet --upgrade pip
    "$py" -m pip install --quiet torch numpy
    has_fsdp2 || { echo "error: $py has no PyTorch >= 2.4 after pip install torch" >&2; exit 1; }
  fi
  scripts/build.sh
  exec "$py" bench/run_bench.py --only fsdp "$@"
fi

scripts/install_deps.sh --bench
scripts/build.sh
# Debian's interpreter: python3-torch is installed for it, not for a pyenv/venv python3.
exec /usr/bin/python3 bench/run_bench.py "$@"
