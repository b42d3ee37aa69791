#!/usr/bin/env python3
# test_stage_diffs.py: scripts/stage_diffs.py on a copy of the stage folders
# (whether the committed CHANGES.diff files are current is the docs test's,
# through scripts/docs.py): a changed stage file makes the check fail,
# pairing and labels, a stage folder without a predecessor.
# Needs no built target. Standard library only.
#
#   meson test -C build stage_diffs               # as scripts/test.sh runs it
#   python3 tests/python/test_stage_diffs.py [--xml FILE]

import contextlib
import io
import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_xml  # noqa: E402
import stage_diffs  # noqa: E402


def quiet(fn, *args):
    """fn(*args) with its stdout and stderr captured: (result, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        result = fn(*args)
    return result, out.getvalue(), err.getvalue()


class GeneratorTest(unittest.TestCase):
    """On a copy of the stage folders, so the repository is never written."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        for stage, _ in stage_diffs.STAGES:
            if os.path.isdir(os.path.join(ROOT, stage)):
                # an extensions folder is copied with its stage, then again: the same files
                shutil.copytree(os.path.join(ROOT, stage), os.path.join(self.root, stage),
                                ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        quiet(stage_diffs.write, self.root)

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def read(self, *parts):
        with open(self.path(*parts), encoding="utf-8") as f:
            return f.read()

    def check(self):
        return quiet(stage_diffs.main, ["--check", "--root", self.root])

    def test_current_after_writing(self):
        rc, out, _ = self.check()
        self.assertEqual(rc, 0, out)
        self.assertIn("up to date", out)

    def test_a_changed_stage_file_fails_the_check(self):
        with open(self.path("02_zero2", "zero2.cpp"), "a", encoding="utf-8") as f:
            f.write("// one more line\n")
        rc, out, _ = self.check()
        self.assertEqual(rc, 1)
        # Both diffs that read zero2.cpp are stale, and only those.
        self.assertIn("02_zero2/CHANGES.diff: stale", out)
        self.assertIn("03_zero3/CHANGES.diff: stale", out)
        self.assertNotIn("01_zero1/CHANGES.diff", out)
        self.assertIn("refresh them with: " + stage_diffs.REFRESH, out)
        quiet(stage_diffs.write, self.root)
        self.assertEqual(self.check()[0], 0)

    def test_an_edited_or_missing_diff_fails_the_check(self):
        with open(self.path("01_zero1", "CHANGES.diff"), "a", encoding="utf-8") as f:
            f.write("+ edited by hand\n")
        os.remove(self.path("03_zero3", "CHANGES.diff"))
        rc, out, _ = self.check()
        self.assertEqual(rc, 1)
        self.assertIn("01_zero1/CHANGES.diff: stale", out)
        self.assertIn("03_zero3/CHANGES.diff: missing", out)

    def test_pairs_files_by_role_and_lists_new_ones(self):
        text = self.read("02_zero2", "CHANGES.diff")
        self.assertTrue(text.startswith("# 02_zero2/CHANGES.diff: the files of 02_zero2 against those of 01_zero1.\n"))
        self.assertIn("#   " + stage_diffs.REFRESH + "\n", text)
        # The loop with the loop, its header with its header, same names with same names.
        for a, b in (("01_zero1/zero1.cpp", "02_zero2/zero2.cpp"), ("01_zero1/zero1.h", "02_zero2/zero2.h"),
                     ("01_zero1/train.cpp", "02_zero2/train.cpp"), ("01_zero1/meson.build", "02_zero2/meson.build")):
            self.assertIn(f"--- a/{a}\n+++ b/{b}\n", text)  # no timestamp after the label
        self.assertLess(text.index("+++ b/02_zero2/zero2.cpp"), text.index("+++ b/02_zero2/train.cpp"))
        # New files are listed with their line counts, not diffed.
        for name in ("sharded_grads.cpp", "sharded_grads.h"):
            with open(self.path("02_zero2", name), encoding="utf-8") as f:
                n = len(f.read().splitlines())
            self.assertRegex(text, rf"\n#   {name} +{n} lines\n")
            self.assertNotIn(f"b/02_zero2/{name}", text)
        self.assertIn("# only in 01_zero1 (no file here in its place): sharded_adamw.cpp, sharded_adamw.h\n", text)
        self.assertNotIn("README.md", text)
        self.assertNotIn("CHANGES.diff\n+++", text)
        self.assertFalse(os.path.exists(self.path("00_data_parallel", "CHANGES.diff")))

    def test_deterministic(self):
        before = {s: self.read(s, "CHANGES.diff") for s, _ in stage_diffs.STAGES[1:] if os.path.isdir(self.path(s))}
        _, out, _ = quiet(stage_diffs.write, self.root)
        self.assertNotIn("wrote", out)
        for s, text in before.items():
            self.assertEqual(self.read(s, "CHANGES.diff"), text)

    def test_a_new_stage_is_one_line_in_the_table(self):
        # A stage 06 made from 05_offload with its own files renamed and one line changed.
        last, name = stage_diffs.STAGES[-1]
        shutil.copytree(self.path(last), self.path("06_next"))
        os.remove(self.path("06_next", "CHANGES.diff"))
        for ext in (".cpp", ".h"):
            os.rename(self.path("06_next", name + ext), self.path("06_next", "next" + ext))
        with open(self.path("06_next", "new_part.h"), "w", encoding="utf-8") as f:
            f.write("// new\n#pragma once")  # no newline at the end
        with open(self.path("06_next", "next.cpp"), "a", encoding="utf-8") as f:
            f.write("// next\n")
        # Not in the table yet: a note, no diff, and the check still passes.
        rc, out, err = self.check()
        self.assertEqual(rc, 0, out)
        self.assertIn("06_next: not in STAGES", err)
        self.assertFalse(os.path.exists(self.path("06_next", "CHANGES.diff")))
        # One line in the table.
        with mock.patch.object(stage_diffs, "STAGES", stage_diffs.STAGES + [("06_next", "next")]):
            rc, out, _ = self.check()
            self.assertEqual(rc, 1)
            self.assertIn("06_next/CHANGES.diff: missing", out)
            quiet(stage_diffs.write, self.root)
            self.assertEqual(self.check()[0], 0)
        text = self.read("06_next", "CHANGES.diff")
        self.assertIn(f"--- a/{last}/{name}.cpp\n+++ b/06_next/next.cpp\n", text)
        self.assertIn("+// next\n", text)
        self.assertIn("#   new_part.h  2 lines\n", text)
        same = sorted(f for f in os.listdir(self.path(last))
                      if f not in (name + ".cpp", name + ".h", "CHANGES.diff", "README.md")
                      and os.path.isfile(self.path(last, f)) and not f.endswith(".png"))
        self.assertIn(f"# unchanged: {name}.h -> next.h, " + ", ".join(same) + "\n", text)
        self.assertNotIn("+++ b/06_next/train.cpp", text)

    def test_extensions_are_diffed_against_their_stage_alone(self):
        # 05_offload/extensions is a stage inside 05_offload: out of 05's diff, diffed against 05.
        lesson = self.read("05_offload", "CHANGES.diff")
        self.assertNotIn("disk_tier", lesson)
        self.assertNotIn("b/05_offload/extensions/", lesson)
        ext = self.read("05_offload", "extensions", "CHANGES.diff")
        self.assertIn("--- a/05_offload/offload.cpp\n+++ b/05_offload/extensions/offload.cpp\n", ext)
        self.assertIn("#   disk_tier.cpp", ext)

    def test_a_stage_without_its_predecessor(self):
        shutil.rmtree(self.path("02_zero2"))
        rc, out, err = self.check()
        self.assertEqual(rc, 1)  # 03's diff is now one that should not exist
        self.assertIn("03_zero3/CHANGES.diff: should not exist", out)
        self.assertIn("03_zero3: its predecessor 02_zero2 has no folder", err)
        _, out, _ = quiet(stage_diffs.write, self.root)
        self.assertIn("removed 03_zero3/CHANGES.diff", out)
        self.assertEqual(self.check()[0], 0)

    def test_no_newline_at_end_of_file(self):
        with open(self.path("02_zero2", "meson.build"), "a", encoding="utf-8") as f:
            f.write("# last line")
        quiet(stage_diffs.write, self.root)
        self.assertIn("+# last line\n\\ No newline at end of file\n", self.read("02_zero2", "CHANGES.diff"))


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "stage_diffs", "test_stage_diffs.py [--xml FILE]"))
