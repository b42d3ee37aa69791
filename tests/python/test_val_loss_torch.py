#!/usr/bin/env python3
# test_val_loss_torch.py: the held-out loss (docs/SPEC.md §5, --val-every)
# against PyTorch's, where a Python with torch is at hand (skipped, saying
# so, where not).
#
# Stage 00 trains `tiny` for a few steps on two ranks and evaluates the
# model it ends with on V held-out batches of a --val-data file; it saves
# that model. PyTorch (bench/torch_gpt.py: its own GPT, safetensors reader
# and sampler) loads the saved model and computes, from §5's words alone,
# the mean of the V·N micro-batch losses: batch b, rank r takes the B
# sequences from b·N·B + r·B of the file. Float sums in another order: equal
# to about 1e-6, far closer than two different held-out batches are.
#
#   meson test -C build val_loss_torch_py
#   ZF_BUILD=build ZF_TORCH_PYTHON=/usr/bin/python3 python3 tests/python/test_val_loss_torch.py

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_xml  # noqa: E402
from torch_peer import WHERE, torch_python  # noqa: E402

BUILD = os.environ.get("ZF_BUILD", os.path.join(ROOT, "build"))
DP = os.environ.get("ZF_DP_BIN", os.path.join(BUILD, "00_data_parallel", "dp"))
# Held-out text that the built-in corpus is not: this repository's contract.
VAL_DATA = os.path.join(ROOT, "docs", "SPEC.md")
N, B, V, STEPS = 2, 2, 4, 20

# argv: model file, held-out token file, N, B, V. Prints the mean loss and
# each batch's, as JSON.
TORCH_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[6])
import torch
import torch_gpt
init, data, N, B, V = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model = torch_gpt.GPT(*torch_gpt.PRESETS["tiny"])
torch_gpt.load_init(model, init)
tokens, _ = torch_gpt.load_tokens(data)
sampler = torch_gpt.Sampler(tokens, model.T, model.V, data)
losses = []
with torch.no_grad():
    for b in range(V):
        losses.append([model(*sampler.micro_batch(b, 0, r, N, B, 1)).item() for r in range(N)])
print(json.dumps({"mean": sum(sum(l) for l in losses) / (V * N), "batches": [sum(l) / N for l in losses]}))
"""


class ValLossTorchTest(unittest.TestCase):
    def test_the_held_out_loss_is_pytorchs(self):
        py = torch_python()
        if py is None:
            self.skipTest(WHERE)
        with tempfile.TemporaryDirectory(prefix="zf-val-torch-") as d:
            model, log = os.path.join(d, "model.safetensors"), os.path.join(d, "run.jsonl")
            p = subprocess.run([DP, "--model", "tiny", "--ranks", str(N), "--batch", str(B), "--steps", str(STEPS),
                                "--lr", "3e-3", "--val-data", VAL_DATA, "--val-every", str(STEPS),
                                "--val-batches", str(V), "--save", model, "--log-json", log, "--quiet"],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(log) as f:
                evals = [r["val"] for r in map(json.loads, f) if "val" in r]
            self.assertEqual([e["after_step"] for e in evals], [0, STEPS])
            self.assertEqual(evals[-1]["sequences"], V * N * B)
            t = subprocess.run([py, "-c", TORCH_SCRIPT, model, VAL_DATA, str(N), str(B), str(V),
                                os.path.join(ROOT, "bench")], capture_output=True, text=True)
            self.assertEqual(t.returncode, 0, t.stderr)
            ref = json.loads(t.stdout)
        # Batch 0 alone, or the sum divided by the wrong count, is far
        # outside the tolerance: neither can pass.
        delta = 1e-5 * ref["mean"]
        self.assertGreater(abs(ref["batches"][0] - ref["mean"]), 10 * delta, ref)
        self.assertAlmostEqual(evals[-1]["loss"], ref["mean"], delta=delta)


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "val_loss_torch_py", "test_val_loss_torch.py [--xml FILE]"))
