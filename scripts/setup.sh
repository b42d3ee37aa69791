#!/usr/bin/env bash
# setup.sh: the README's first command. Installs what is missing, builds, and
# runs the stage-00 demo: 4 data-parallel ranks (threads) train the `small`
# GPT on the built-in corpus, printing the loss and the memory per rank.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
exec build/00_data_parallel/dp --ranks 4 --model small --batch 4 --steps 400 --lr 1e-3 --log-every 25 \
  --log-json build/dp_demo.jsonl "$@"
