#!/usr/bin/env bash
# install_deps.sh: installs the Debian 12 packages this project needs, only
# those missing (sudo when not root). Called by setup.sh and test.sh.
#
#   scripts/install_deps.sh            build + test dependencies
#   scripts/install_deps.sh --bench    also PyTorch (the benchmarks' peer) and python3-venv
set -euo pipefail

packages=(meson ninja-build pkg-config g++ python3 python3-matplotlib
          libopenblas-dev libcli11-dev nlohmann-json3-dev libgtest-dev
          libopenmpi-dev openmpi-bin)
# python3-venv: scripts/bench.sh --fsdp makes .venv-bench/ with a current PyTorch (FSDP2) from PyPI.
if [[ "${1:-}" == "--bench" ]]; then packages+=(python3-torch python3-numpy python3-venv); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "installing missing packages: ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "error: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
