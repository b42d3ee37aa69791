# torch_peer.py: finds a Python that imports torch, for the tests that check
# a number against PyTorch's where PyTorch is at hand (the benchmark's
# .venv-bench, Debian's python3-torch through ZF_TORCH_PYTHON) and skip,
# saying so, where it is not.

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WHERE = ("PyTorch is not installed (scripts/bench.sh --fsdp makes .venv-bench with it; "
         "or set ZF_TORCH_PYTHON to a Python that imports torch)")


def torch_python():
    """A Python that imports torch, or None."""
    for py in [os.environ.get("ZF_TORCH_PYTHON", ""),
               os.path.join(os.environ.get("ZF_BENCH_VENV", os.path.join(ROOT, ".venv-bench")), "bin", "python")]:
        if py and os.path.exists(py) and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
            return py
    return None
