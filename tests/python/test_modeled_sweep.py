#!/usr/bin/env python3
# test_modeled_sweep.py: tools/modeled_sweep.py on a small sweep of real dry
# runs: every run's numbers reach the table and the JSON as the run logs
# wrote them, the step's MFU agrees with its tokens/s, a folder holding
# other files is refused, and bench/modeled_vs_published.py's cases all run.
#
#   meson test -C build modeled_sweep_py
#   ZF_BUILD=build python3 tests/python/test_modeled_sweep.py [--xml FILE]

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_xml  # noqa: E402

BUILD = os.environ.get("ZF_BUILD", os.path.join(ROOT, "build"))
TOOL = os.path.join(ROOT, "tools", "modeled_sweep.py")


class SweepTest(unittest.TestCase):
    def test_a_small_sweep_reports_what_the_run_logs_say(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "m")
            p = subprocess.run([sys.executable, TOOL, "--build", BUILD, "--out", out, "--models", "gpt2",
                                "--ranks", "2,8", "--no-knobs", "--no-plots"], capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            runs = json.load(open(os.path.join(out, "modeled.json")))["runs"]
            self.assertEqual(len(runs), 5 * 2)  # five stages, two rank counts
            table = open(os.path.join(out, "modeled.md")).read()
            self.assertIn("Modeled, not measured", table)
            for r in runs:
                log = os.path.join(out, "logs", "h100-sxm_gpt2_%s_%d.json" % (r["stage"], r["ranks"]))
                steps = [json.loads(line) for line in open(log) if '"step"' in line]
                self.assertEqual(r["ms"], steps[-1]["ms"])
                self.assertIn("| %s | %d | %.1f |" % (r["stage"], r["ranks"], r["ms"]), table.replace(" |  | ", " | "))
                # MFU = tokens/s x FLOPs per token / (N x the H100's 989 TFLOP/s in bf16)
                summary = json.loads(open(log).read().strip().split("\n")[-1])["summary"]
                expected = steps[-1]["tokens_per_s"] * summary["flops_per_token"] / (r["ranks"] * 989e12)
                self.assertAlmostEqual(r["mfu"], expected, places=12)

    def test_a_folder_of_other_files_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "notes.txt"), "w").write("mine")
            p = subprocess.run([sys.executable, TOOL, "--build", BUILD, "--out", d], capture_output=True, text=True)
            self.assertEqual(p.returncode, 2)
            self.assertIn("did not write", p.stderr)
            self.assertEqual(open(os.path.join(d, "notes.txt")).read(), "mine")

    def test_the_published_comparison_runs_every_case(self):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "modeled_vs_published.py"), "--build", BUILD],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = [line for line in p.stdout.split("\n") if line.startswith("| ") and "---" not in line]
        self.assertEqual(len(rows), 1 + 4)  # the header and four cases


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "modeled_sweep_py", "test_modeled_sweep.py [--xml FILE]"))
