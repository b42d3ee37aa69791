#!/usr/bin/env python3
# test_trace_gantt.py: tests of tools/trace_gantt.py, the Gantt chart of a
# `--trace FILE` timeline, on the trace of a real short run of zero3: the rows
# it draws (one per rank and track, with the run's spans), --step, the PNG,
# and a clear error for a missing, non-JSON or non-trace file; on one of
# offload (stage 05), the copy track's row. The drawing needs matplotlib;
# without it those tests skip, saying so.
#
#   meson test -C build trace_gantt_py
#   ZF_ZERO3_BIN=build/03_zero3/zero3 ZF_OFFLOAD_BIN=build/05_offload/offload \
#     python3 tests/python/test_trace_gantt.py [--xml FILE]

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "trace_gantt.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_xml  # noqa: E402
import trace_gantt  # noqa: E402

try:
    import matplotlib  # noqa: F401
    NO_MATPLOTLIB = None
except ImportError:
    NO_MATPLOTLIB = "matplotlib is missing (apt-get install python3-matplotlib)"

# tiny has embedding, h.0, h.1, head (docs/SPEC.md, section 1).
UNITS = 4
STEPS = 2


def run_tool(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


class TracedRun(unittest.TestCase):
    """The trace of a short run of STAGE (its binary in ENV), in a temporary folder."""
    STAGE, ENV = "zero3", "ZF_ZERO3_BIN"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.trace = os.path.join(cls.tmp.name, cls.STAGE + ".json")
        exe = os.environ.get(cls.ENV)
        cls.why_not = None
        if not exe or not os.access(exe, os.X_OK):
            cls.why_not = f"{cls.ENV} is not set to the built {cls.STAGE} (meson test sets it)"
            return
        subprocess.run([exe, "--ranks", "2", "--model", "tiny", "--steps", str(STEPS), "--batch", "1", "--quiet",
                        "--trace", cls.trace], check=True, stdout=subprocess.DEVNULL)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        if self.why_not:
            self.skipTest(self.why_not)


class TraceOfARun(TracedRun):

    def test_rows(self):
        events = trace_gantt.load_trace(self.trace)
        rows = trace_gantt.rows_of(events)
        self.assertEqual([name for _, name, _ in rows],
                         ["rank 0 compute", "rank 0 comm", "rank 1 compute", "rank 1 comm"])
        for (rank, tid), name, spans in rows:
            kinds = [k for _, _, k, _ in spans]
            if tid == 0:
                # Each step: every unit's forward and backward, then the optimizer.
                self.assertEqual(kinds.count("forward"), UNITS * STEPS, name)
                self.assertEqual(kinds.count("backward"), UNITS * STEPS, name)
                self.assertEqual(kinds.count("optimizer"), STEPS, name)
                # A unit's span is labelled with the unit ("fwd h.0": "h.0").
                self.assertIn("h.0", [label for _, _, k, label in spans if k == "forward"], name)
                self.assertIn("embedding", [label for _, _, k, label in spans if k == "backward"], name)
            else:
                # ZeRO-3 gathers every unit before its forward and before its backward.
                self.assertGreaterEqual(kinds.count("all_gather"), 2 * UNITS * STEPS, name)
                self.assertGreaterEqual(kinds.count("reduce_scatter"), UNITS * STEPS, name)
                self.assertTrue(all(label for _, _, _, label in spans), name)
        one = trace_gantt.rows_of(events, step=1)
        for (_, _, all_spans), (_, _, step_spans) in zip(rows, one):
            self.assertLess(len(step_spans), len(all_spans))
        self.assertEqual(sum(k == "optimizer" for _, _, sp in one for _, _, k, _ in sp), 2)  # one per rank
        self.assertEqual(sorted(trace_gantt.memory_of(events)), [0, 1])

    def test_png(self):
        if NO_MATPLOTLIB:
            self.skipTest(NO_MATPLOTLIB)
        for extra in ([], ["--step", "1"]):
            out = os.path.join(self.tmp.name, "gantt%s.png" % "".join(extra))
            r = run_tool(self.trace, out, *extra)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            self.assertIn("rank 1 comm:", r.stdout)

    def test_a_range_of_steps_and_of_ranks(self):
        events = trace_gantt.load_trace(self.trace)
        # Steps 0 to 1: each step's spans, not the ones before step 0 (the initial broadcast).
        both = trace_gantt.rows_of(events, (0, 1))
        each = zip(trace_gantt.rows_of(events, 0), trace_gantt.rows_of(events, 1))
        self.assertEqual([sp for _, _, sp in both], [sorted(a[2] + b[2]) for a, b in each])
        one = trace_gantt.rows_of(events, 1, (1, 1))
        self.assertEqual([name for _, name, _ in one], ["rank 1 compute", "rank 1 comm"])
        self.assertEqual([sp for _, _, sp in one], [sp for _, _, sp in trace_gantt.rows_of(events, 1)[2:]])
        for bad, says in ((["--ranks", "5"], "--ranks 5 holds none of its ranks (0..1)"),
                          (["--ranks", "1-0"], "--ranks wants a number or a range"),
                          (["--step", "0-9"], "--step 0-9 is not in the trace"),
                          (["--step", "x"], "--step wants a number or a range")):
            r = run_tool(self.trace, os.path.join(self.tmp.name, "bad.png"), *bad)
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn(says, r.stderr)
        if NO_MATPLOTLIB:
            return
        out = os.path.join(self.tmp.name, "r1.png")
        r = run_tool(self.trace, out, "--step", "0-1", "--ranks", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([line.split(":")[0] for line in r.stdout.splitlines()[:-1]], ["rank 1 compute", "rank 1 comm"])

    def test_waits_are_the_compute_rows_gaps(self):
        # Spans (start, duration): 0-10, 5-12 (overlapping), 20-25, 25-30 (touching), 40-41.
        spans = [(0, 10, "forward", ""), (5, 7, "forward", ""), (20, 5, "backward", ""), (25, 5, "backward", ""),
                 (40, 1, "optimizer", "")]
        self.assertEqual(trace_gantt.waits_of(spans), [(12, 8), (30, 10)])
        self.assertEqual(trace_gantt.waits_of([]), [])

    def test_step_not_in_the_trace(self):
        r = run_tool(self.trace, os.path.join(self.tmp.name, "x.png"), "--step", "7")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--step 7 is not in the trace (it holds steps 0..1)", r.stderr)


class CopyTrackOfAnOffloadRun(TracedRun):
    STAGE, ENV = "offload", "ZF_OFFLOAD_BIN"

    def test_copy_row_after_the_queues(self):
        rows = trace_gantt.rows_of(trace_gantt.load_trace(self.trace))
        # Stage 05 has stage 04's two queues, then the copies.
        self.assertEqual([name for _, name, _ in rows],
                         ["rank 0 compute", "rank 0 comm", "rank 0 comm q1", "rank 0 copy",
                          "rank 1 compute", "rank 1 comm", "rank 1 comm q1", "rank 1 copy"])
        for _, name, spans in rows:
            if not name.endswith("copy"):
                continue
            kinds = [k for _, _, k, _ in spans]
            # Every step copies each unit's gradient piece down and its parameters up.
            self.assertGreaterEqual(kinds.count("d2h"), UNITS * STEPS, name)
            self.assertGreaterEqual(kinds.count("h2d"), UNITS * STEPS, name)
            self.assertEqual(set(kinds), {"h2d", "d2h"}, name)
            self.assertEqual({label for _, _, _, label in spans}, {"H2D", "D2H"}, name)

    def test_png(self):
        if NO_MATPLOTLIB:
            self.skipTest(NO_MATPLOTLIB)
        out = os.path.join(self.tmp.name, "offload.png")
        r = run_tool(self.trace, out, "--step", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertIn("rank 1 copy:", r.stdout)


class BadFiles(unittest.TestCase):
    def test_missing_invalid_or_not_a_trace(self):
        with tempfile.TemporaryDirectory() as tmp:
            bad_json = os.path.join(tmp, "bad.json")
            with open(bad_json, "w") as f:
                f.write("{\"traceEvents\": [")
            not_trace = os.path.join(tmp, "log.json")
            with open(not_trace, "w") as f:
                json.dump({"step": 0, "loss": 1.0}, f)
            cases = [(os.path.join(tmp, "none.json"), "no such file"), (bad_json, "not JSON"),
                     (not_trace, "not a trace")]
            for path, why in cases:
                r = run_tool(path, os.path.join(tmp, "out.png"))
                self.assertEqual(r.returncode, 2, path)
                self.assertIn(path, r.stderr)
                self.assertIn(why, r.stderr)
                self.assertFalse(os.path.exists(os.path.join(tmp, "out.png")))


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "trace_gantt_py", "test_trace_gantt.py [--xml FILE]"))
