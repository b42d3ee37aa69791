#!/usr/bin/env python3
# test_tour.py: tests of tools/tour.py, the run of every stage side by side.
# One tour of the READMEs' configuration (tiny, 4 ranks) runs; then:
#   - it passed, and the READMEs' tour sections are what it writes (the
#     check scripts/docs.py makes with --build; the docs test leaves it to
#     this one, which has the runs already);
#   - every number of tour.json and of tour.md's tables is the run log's
#     (read here from the logs, with this file's own parsing), the "= 00"
#     column is recomputed from the logs, and the estimator agreed with every
#     run (no ✗ in the tables);
#   - every picture is a non-empty PNG;
#   - the staleness check itself fails on a changed number, a missing
#     section and a loss off by more than its tolerance, and passes within it;
#   - an output folder holding another file is refused, and the file kept.
#
#   meson test -C build tour
#   ZF_BUILD=build python3 tests/python/test_tour.py [--xml FILE]

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "tour.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_xml  # noqa: E402
import tour  # noqa: E402
import tour_readme  # noqa: E402

BUILD = os.environ.get("ZF_BUILD", os.path.join(ROOT, "build"))
UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}


def parse_bytes(cell):
    """'267.50 KiB ✓' -> (267.5 * 1024, the unit's rounding), '0' -> (0, 0)."""
    m = re.match(r"^([0-9.]+)(?: (B|KiB|MiB|GiB))?", cell)
    if not m:
        raise ValueError(f"not a byte count: {cell!r}")
    unit = UNITS[m.group(2) or "B"]
    decimals = len(m.group(1).split(".")[1]) if "." in m.group(1) else 0
    return float(m.group(1)) * unit, 0.5 * 10 ** -decimals * unit


def read_log(path):
    steps, summary = [], None
    with open(path) as f:
        for line in f:
            obj = json.loads(line)
            if "summary" in obj:
                summary = obj["summary"]
            elif "step" in obj:
                steps.append(obj["loss"])
    return steps, summary


def read_val(path):
    """The (steps done, held-out loss) of each evaluation in a run log."""
    with open(path) as f:
        return [[o["val"]["after_step"], o["val"]["loss"]] for o in map(json.loads, f) if "val" in o]


def markdown_rows(text, first_header):
    """The rows of the table whose header starts with first_header, as cells."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("| " + first_header))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for l in lines[start + 2:]:
        if not l.startswith("|"):
            break
        rows.append(dict(zip(header, [c.strip() for c in l.strip("|").split("|")])))
    return rows


class Tour(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = os.path.join(cls.tmp.name, "tour")
        cls.r = subprocess.run([sys.executable, TOOL, "--build", BUILD, "--out", cls.out],
                               capture_output=True, text=True, cwd=ROOT)
        cls.doc = None
        if os.path.exists(os.path.join(cls.out, "tour.json")):
            with open(os.path.join(cls.out, "tour.json")) as f:
                cls.doc = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_run_succeeds(self):
        self.assertEqual(self.r.returncode, 0, self.r.stdout + self.r.stderr)

    def test_the_readmes_tour_sections_are_current(self):
        self.assertIsNotNone(self.doc, self.r.stderr)
        self.assertEqual(self.doc["config"], tour.README_CONFIG)
        blocks = tour_readme.readme_blocks(self.doc["runs"], tour.README_CONFIG)
        self.assertEqual(tour_readme.stale_readmes(ROOT, blocks), [],
                         f"refresh them with: python3 scripts/docs.py write --build {BUILD}")

    def test_every_run_ran(self):
        self.assertIsNotNone(self.doc, self.r.stderr)
        keys = [r["key"] for r in self.doc["runs"]]
        self.assertEqual(keys, [r[0] for r in tour.RUNS])  # 4 ranks: HSDP too, nothing skipped
        self.assertEqual(self.doc["skipped"], [])

    def test_numbers_are_the_run_logs(self):
        dp_losses, dp_summary = read_log(os.path.join(self.out, "logs", "00.jsonl"))
        for rec in self.doc["runs"]:
            losses, s = read_log(os.path.join(self.out, "logs", rec["log"]))
            with self.subTest(run=rec["key"]):
                self.assertEqual(rec["final_loss"], s["final_loss"])
                self.assertEqual(rec["losses"], losses)
                self.assertEqual(rec["param_hash"], s["param_hash"])
                dev = s["memory"][0]["device"]
                self.assertEqual(rec["device_model_states"], dev["model_states"])
                self.assertEqual(rec["device_peak"], dev["peak_total"])
                self.assertEqual(rec["device"]["activations"], dev["activations"]["peak"])
                self.assertEqual(rec["host_model_states"], s["memory"][0]["host"]["model_states"])
                self.assertEqual(rec["comm"]["total"], s["comm"][0]["bytes_per_step"])
                self.assertEqual(rec["comm"]["by_collective"], s["comm"][0]["by_collective"])
                val = read_val(os.path.join(self.out, "logs", rec["log"]))
                self.assertEqual([list(v) for v in rec["val"]], val)
                self.assertEqual([v[0] for v in val], [0, 10, 20])  # --steps 20: before, halfway and at the end
                same = (losses == dp_losses and s["param_hash"] == dp_summary["param_hash"]
                        and val == read_val(os.path.join(self.out, "logs", "00.jsonl")))
                self.assertEqual(rec["same_as_00"], same)
        # The point of the ladder, as the logs have it: bit-identical but for
        # hybrid sharding, which adds in another order (04_fsdp/README.md).
        self.assertEqual([r["key"] for r in self.doc["runs"] if not r["same_as_00"]], ["04 HSDP"])

    def test_tables_show_the_logs_numbers(self):
        with open(os.path.join(self.out, "tour.md")) as f:
            text = f.read()
        self.assertNotIn("✗", text)  # the estimator agreed with every run
        memory = markdown_rows(text, "run | final loss")
        comm = markdown_rows(text, "run | all-reduce")
        self.assertEqual(len(memory), len(self.doc["runs"]))
        for rec, mrow, crow in zip(self.doc["runs"], memory, comm):
            _, s = read_log(os.path.join(self.out, "logs", rec["log"]))
            dev = s["memory"][0]["device"]
            c = s["comm"][0]
            with self.subTest(run=rec["key"]):
                self.assertTrue(mrow["run"].startswith(rec["key"] + " "))
                self.assertAlmostEqual(float(mrow["final loss"]), s["final_loss"], delta=5e-5)
                for cell, want in [(mrow["model states (✓ = formula)"], dev["model_states"]),
                                   (mrow["peak device (✓ = estimate)"], dev["peak_total"]),
                                   (mrow["activations"], dev["activations"]["peak"]),
                                   (mrow["params"], dev["params"]["current"]),
                                   (mrow["host model states"], s["memory"][0]["host"]["model_states"]),
                                   (crow["sent / step (✓ = formula)"], c["bytes_per_step"]),
                                   (crow["all-gather"], c["by_collective"].get("all_gather", 0)),
                                   (crow["host→device"], c.get("transfers_per_step", {}).get("to_device_bytes", 0))]:
                    got, rounding = parse_bytes(cell)
                    self.assertLessEqual(abs(got - want), rounding, cell)

    def test_every_picture_is_a_png(self):
        for name in tour.TOUR_PICTURES:
            path = os.path.join(self.out, name)
            with self.subTest(picture=name):
                self.assertTrue(os.path.exists(path), self.r.stderr)
                with open(path, "rb") as f:
                    head = f.read(8)
                self.assertEqual(head, b"\x89PNG\r\n\x1a\n")
                self.assertGreater(os.path.getsize(path), 5000)  # a drawing, not an empty canvas


class Staleness(unittest.TestCase):
    """tour_readme's check on a scratch copy of the READMEs."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        for rel in ["README.md"] + [os.path.join(f, "README.md") for f in tour_readme.STAGE_FOLDERS]:
            os.makedirs(os.path.dirname(os.path.join(self.root, rel)), exist_ok=True)
            shutil.copyfile(os.path.join(ROOT, rel), os.path.join(self.root, rel))
        self.blocks = {}
        for rel in ["README.md"] + [os.path.join(f, "README.md") for f in tour_readme.STAGE_FOLDERS]:
            with open(os.path.join(self.root, rel)) as f:
                self.blocks[rel] = tour_readme.current_block(f.read())

    def tearDown(self):
        self.tmp.cleanup()

    def edit(self, rel, old, new):
        path = os.path.join(self.root, rel)
        with open(path) as f:
            text = f.read()
        self.assertIn(old, text)
        with open(path, "w") as f:
            f.write(text.replace(old, new, 1))

    def test_committed_readmes_have_their_sections(self):
        for rel, block in self.blocks.items():
            self.assertIsNotNone(block, f"{rel}: no tour section (python3 tools/tour.py --write-readmes)")
        self.assertEqual(tour_readme.stale_readmes(self.root, self.blocks), [])

    def test_a_changed_number_is_stale(self):
        rel = os.path.join("02_zero2", "README.md")
        cell = re.search(r"\| ([0-9.]+ (?:KiB|MiB)) ✓", self.blocks[rel]).group(1)
        self.edit(rel, cell + " ✓", "1" + cell + " ✓")
        self.assertEqual(tour_readme.stale_readmes(self.root, self.blocks),
                         [f"{rel}'s tour section differs from a fresh tour"])

    def test_a_missing_section_is_stale(self):
        self.edit("README.md", self.blocks["README.md"], "")
        self.assertEqual(tour_readme.stale_readmes(self.root, self.blocks), ["README.md has no tour section"])

    def test_losses_within_the_tolerance_are_fresh_beyond_it_stale(self):
        rel = os.path.join("01_zero1", "README.md")
        loss = re.search(r"\| (\d\.\d{4}) \| yes", self.blocks[rel]).group(1)
        near = f"{float(loss) + 0.0009:.4f}"
        self.edit(rel, f"| {loss} | yes", f"| {near} | yes")
        self.assertEqual(tour_readme.stale_readmes(self.root, self.blocks), [])
        self.edit(rel, f"| {near} | yes", f"| {float(loss) + 0.0100:.4f} | yes")
        self.assertEqual(len(tour_readme.stale_readmes(self.root, self.blocks)), 1)

    def test_write_then_fresh(self):
        changed = dict(self.blocks)
        changed["README.md"] = self.blocks["README.md"].replace("✓", "✗", 1)
        self.assertEqual(tour_readme.write_readmes(self.root, changed), ["README.md"])
        self.assertEqual(tour_readme.stale_readmes(self.root, changed), [])
        self.assertEqual(len(tour_readme.stale_readmes(self.root, self.blocks)), 1)


class OutputFolder(unittest.TestCase):
    def test_a_folder_with_other_files_is_refused_and_kept(self):
        with tempfile.TemporaryDirectory() as tmp:
            mine = os.path.join(tmp, "notes.txt")
            with open(mine, "w") as f:
                f.write("mine")
            r = subprocess.run([sys.executable, TOOL, "--build", BUILD, "--out", tmp, "--no-plots"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("notes.txt", r.stderr)
            self.assertIn("name a new or empty folder", r.stderr)
            self.assertEqual(sorted(os.listdir(tmp)), ["notes.txt"])
            with open(mine) as f:
                self.assertEqual(f.read(), "mine")


class EarlierTour(unittest.TestCase):
    def test_rerun_removes_the_earlier_pictures_and_skips_hsdp_at_two_ranks(self):
        # An earlier tour's folder: its tour.json and a picture of other flags.
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("tour.json", "loss.png"):
                with open(os.path.join(tmp, name), "w") as f:
                    f.write("old")
            r = subprocess.run([sys.executable, TOOL, "--build", BUILD, "--out", tmp, "--no-plots", "--ranks", "2",
                                "--steps", "2"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "loss.png")))  # not this run's
            with open(os.path.join(tmp, "tour.json")) as f:
                doc = json.load(f)
            self.assertNotIn("04 HSDP", [run["key"] for run in doc["runs"]])
            self.assertEqual(len(doc["skipped"]), 1)
            self.assertIn("04 HSDP", doc["skipped"][0])
            self.assertIn("Not run at this number of ranks: 04 HSDP", r.stdout)


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "tour", "test_tour.py [--xml FILE]"))
