#!/usr/bin/env python3
# test_plot_run.py: tools/plot_run.py on a real run log with evaluations
# (--val-every) and samples (--sample-every): the steps and the held-out
# losses read as the log has them, the samples passed over, the table's
# last held-out loss, and a line that is neither a step, an evaluation, a
# sample nor a summary refused, naming the file and the line.
#
#   meson test -C build plot_run_py
#   ZF_BUILD=build python3 tests/python/test_plot_run.py [--xml FILE]

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gtest_xml  # noqa: E402
import plot_run  # noqa: E402

BUILD = os.environ.get("ZF_BUILD", os.path.join(ROOT, "build"))
ZERO3 = os.path.join(BUILD, "03_zero3", "zero3")


class PlotRunTest(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(ZERO3):
            self.skipTest(f"{ZERO3} is not built (ninja -C {BUILD})")
        self.tmp = tempfile.TemporaryDirectory()
        self.log = os.path.join(self.tmp.name, "run.jsonl")
        p = subprocess.run([ZERO3, "--model", "tiny", "--ranks", "2", "--batch", "1", "--steps", "6",
                            "--val-every", "3", "--val-batches", "1", "--sample-every", "6", "--sample-length", "4",
                            "--quiet", "--log-json", self.log],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(self.log) as f:
            self.lines = [json.loads(line) for line in f]

    def tearDown(self):
        self.tmp.cleanup()

    def test_steps_and_evaluations_are_the_logs(self):
        run = plot_run.load_run(self.log)
        self.assertEqual(run.steps, [(o["step"], o["loss"]) for o in self.lines if "step" in o])
        val = [(o["val"]["after_step"], o["val"]["loss"]) for o in self.lines if "val" in o]
        self.assertEqual([s for s, _ in val], [0, 3, 6])
        self.assertEqual(run.val, val)
        self.assertEqual(val[-1][1], self.lines[-1]["summary"]["final_val_loss"])
        p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot_run.py"), "--no-plot", self.log],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        header, row = [line for line in p.stdout.split("\n") if "final loss" in line or self.log in line][:2]
        self.assertIn("val loss", header)
        self.assertIn(f"{val[-1][1]:.4f}", row)

    def test_an_unknown_line_is_refused_with_its_place(self):
        with open(self.log, "a") as f:
            f.write('{"eval": 1}\n')
        with self.assertRaises(plot_run.LogError) as e:
            plot_run.load_run(self.log)
        self.assertIn(f"{self.log}, line {len(self.lines) + 1}", str(e.exception))


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "plot_run_py", "test_plot_run.py [--xml FILE]"))
