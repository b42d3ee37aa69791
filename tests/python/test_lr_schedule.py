#!/usr/bin/env python3
# test_lr_schedule.py: the learning rate of every step of 100-step runs
# (--lr-schedule constant, cosine, linear with --warmup and --min-lr), as
# the run log records it, against docs/SPEC.md's formula computed here in
# Python, to the last bit of float32; a run resumed mid-schedule goes on
# with the uninterrupted run's rates and ends with its parameters; and,
# where PyTorch is at hand (the benchmark's .venv-bench, or ZF_TORCH_PYTHON),
# against torch.optim.lr_scheduler's LambdaLR and its own warmup-then-decay
# schedulers (SequentialLR of LinearLR and CosineAnnealingLR or LinearLR).
#
#   meson test -C build lr_schedule_py
#   ZF_BUILD=build python3 tests/python/test_lr_schedule.py [--xml FILE]

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_xml  # noqa: E402
from torch_peer import WHERE, torch_python  # noqa: E402

BUILD = os.environ.get("ZF_BUILD", os.path.join(ROOT, "build"))
DP = os.path.join(BUILD, "00_data_parallel", "dp")
STEPS, WARMUP, LR, MIN_LR = 100, 10, "3e-4", "3e-5"


def f32(x):
    """x rounded to float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected_lr(schedule, step):
    """docs/SPEC.md §3: the factor in double, times lr, rounded to float32 once."""
    lr, min_lr = f32(float(LR)), f32(float(MIN_LR))
    if step < WARMUP:
        factor = (step + 1) / WARMUP
    elif schedule == "constant":
        factor = 1.0
    else:
        p = (step - WARMUP) / (STEPS - WARMUP)
        r = min_lr / lr
        factor = r + (1 - r) * ((1 + math.cos(math.pi * p)) / 2 if schedule == "cosine" else 1 - p)
    return f32(lr * factor)


def run(log, *extra):
    args = [DP, "--model", "tiny", "--batch", "1", "--steps", str(STEPS), "--lr", LR, "--warmup", str(WARMUP),
            "--quiet", "--log-json", log] + list(extra)
    return subprocess.run(args, capture_output=True, text=True)


def read_log(path):
    lines = [json.loads(line) for line in open(path)]
    return [s for s in lines if "step" in s], lines[-1]["summary"]


# PyTorch's schedulers stepped as a training loop steps them: the rate of
# optimizer.step() number s is param_groups[0]["lr"] before the scheduler's
# s-th step(). Prints {"lambda": [...], "sequential": [...]} per schedule.
TORCH_SCRIPT = r"""
import json, math, struct, sys, warnings
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR
warnings.filterwarnings("ignore")
S, W = int(sys.argv[1]), int(sys.argv[2])
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
lr, min_lr = f32(float(sys.argv[3])), f32(float(sys.argv[4]))
r = min_lr / lr
def factor(kind):
    def f(s):
        if s < W: return (s + 1) / W
        if kind == "constant": return 1.0
        p = (s - W) / (S - W)
        return r + (1 - r) * ((1 + math.cos(math.pi * p)) / 2 if kind == "cosine" else 1 - p)
    return f
def rates(make):
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched, out = make(opt), []
    for _ in range(S):
        out.append(f32(opt.param_groups[0]["lr"]))
        opt.step()
        sched.step()
    return out
def decay(kind, opt):
    if kind == "cosine": return CosineAnnealingLR(opt, T_max=S - W, eta_min=min_lr)
    if kind == "linear": return LinearLR(opt, start_factor=1.0, end_factor=r, total_iters=S - W)
    return LinearLR(opt, start_factor=1.0, end_factor=1.0, total_iters=1)
out = {}
for kind in ["constant", "cosine", "linear"]:
    out[kind] = {"lambda": rates(lambda o: LambdaLR(o, factor(kind))),
                 "sequential": rates(lambda o: SequentialLR(
                     o, [LinearLR(o, start_factor=1 / W, end_factor=1.0, total_iters=W - 1), decay(kind, o)],
                     milestones=[W]))}
print(json.dumps(out))
"""


class LrScheduleTest(unittest.TestCase):
    logs = {}

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        if not os.path.exists(DP):
            return
        for schedule in ["constant", "cosine", "linear"]:
            log = os.path.join(cls.dir.name, schedule + ".jsonl")
            extra = ["--lr-schedule", schedule] + ([] if schedule == "constant" else ["--min-lr", MIN_LR])
            p = run(log, *extra)
            if p.returncode != 0:
                raise RuntimeError(p.stderr)
            cls.logs[schedule] = read_log(log)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def setUp(self):
        if not os.path.exists(DP):
            self.skipTest(f"{DP} is not built (ninja -C {BUILD})")

    def rates(self, schedule):
        return [s["lr"] for s in self.logs[schedule][0]]

    def test_every_step_has_the_formulas_rate(self):
        for schedule in ["constant", "cosine", "linear"]:
            got = self.rates(schedule)
            self.assertEqual(len(got), STEPS)
            want = [expected_lr(schedule, s) for s in range(STEPS)]
            bad = [s for s in range(STEPS) if got[s] != want[s]]
            self.assertEqual(bad, [], f"{schedule}: steps whose lr differs, first: "
                                      f"{[(s, got[s], want[s]) for s in bad[:3]]}")
        # Not vacuous: the warmup climbs, the decays fall to near --min-lr, and they differ.
        self.assertEqual(self.rates("constant")[WARMUP:], [f32(3e-4)] * (STEPS - WARMUP))
        self.assertLess(self.rates("cosine")[-1], 3.1e-5)
        self.assertNotEqual(self.rates("cosine")[50], self.rates("linear")[50])

    def test_a_resumed_run_goes_on_with_the_same_rates(self):
        d = self.dir.name
        ck, first, rest = os.path.join(d, "ck.safetensors"), os.path.join(d, "first.jsonl"), os.path.join(d, "rest.jsonl")
        # Saved after step 40, then a rank fails in step 45: the checkpoint holds step 40.
        p = run(first, "--lr-schedule", "cosine", "--min-lr", MIN_LR, "--save", ck, "--save-every", "40",
                "--inject-fault", "0:45")
        self.assertEqual(p.returncode, 1, p.stderr)
        p = run(rest, "--lr-schedule", "cosine", "--min-lr", MIN_LR, "--resume", ck)
        self.assertEqual(p.returncode, 0, p.stderr)
        steps, summary = read_log(rest)
        self.assertEqual([s["step"] for s in steps], list(range(40, STEPS)))
        self.assertEqual([s["lr"] for s in steps], self.rates("cosine")[40:])
        self.assertEqual(summary["param_hash"], self.logs["cosine"][1]["param_hash"])

    def test_pytorchs_schedulers_give_the_same_bits(self):
        py = torch_python()
        if py is None:
            self.skipTest(WHERE)
        p = subprocess.run([py, "-c", TORCH_SCRIPT, str(STEPS), str(WARMUP), LR, MIN_LR], capture_output=True,
                           text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        torch_rates = json.loads(p.stdout)
        for schedule in ["constant", "cosine", "linear"]:
            for form in ["lambda", "sequential"]:
                self.assertEqual(self.rates(schedule), torch_rates[schedule][form], f"{schedule}, {form}")


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "lr_schedule_py", "test_lr_schedule.py [--xml FILE]"))
