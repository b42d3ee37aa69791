#!/usr/bin/env bash
# setup.sh: the README's first command. Installs what is missing, builds, and
# runs the stage-00 demo: 4 data-parallel ranks (threads) train the `small`
# GPT on the built-in corpus (after 20 steps of warmup), printing the loss,
# the held-out loss every 100 steps, a text sample before and after, and the
# memory per rank.
# Then it names the next command: the tour of every stage side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
status=0
build/00_data_parallel/dp --ranks 4 --model small --batch 4 --steps 400 --lr 1e-3 --log-every 25 \
  --warmup 20 --val-every 100 --sample-every 400 \
  --log-json build/dp_demo.jsonl "$@" || status=$?
if [[ $status -eq 0 ]]; then
  echo
  echo "next: python3 tools/tour.py   # stages 00-05 side by side on tiny: tables and pictures in tour/"
fi
exit $status
