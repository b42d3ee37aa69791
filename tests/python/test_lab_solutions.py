#!/usr/bin/env python3
# test_lab_solutions.py: every reference solution of docs/labs/solutions/
# (labN_*.patch, a patch against the stage before lab N's) applies to a copy
# of the repository, builds there, and passes its lab's check
# (scripts/lab_check.py LAB --binary, at the lab's rank count and where the
# units are padded); the stage before, unchanged, fails the same check (the
# labs test's PreviousStageFails). Every lab with a solution names it in its
# text. The copy is the repository's files as git lists them (tracked, and
# new ones not ignored); without git the suite skips, saying why. Building
# the copy (at -O1, unity, without the GPU layer) is most of its time.
# Standard library only.
#
#   meson test -C build lab_solutions
#   ZF_BUILD=build python3 tests/python/test_lab_solutions.py [--xml FILE]

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_xml  # noqa: E402

BUILD = os.path.abspath(os.environ.get("ZF_BUILD") or os.path.join(ROOT, "build"))
SOLUTIONS = os.path.join(ROOT, "docs", "labs", "solutions")
# The executable a lab's change is made in: the stage before the lab's
# (lab 7: the new stage its solution adds, a copy of stage 02).
CHANGED = {2: "00_data_parallel/dp", 3: "01_zero1/zero1", 4: "02_zero2/zero2", 5: "03_zero3/zero3",
           6: "04_fsdp/fsdp", 7: "06_hybrid_zero2/hybrid_zero2"}


def solutions():
    """{lab number: patch path}."""
    found = {}
    for path in sorted(glob.glob(os.path.join(SOLUTIONS, "lab*.patch"))):
        m = re.match(r"lab(\d)_", os.path.basename(path))
        if m:
            found[int(m.group(1))] = path
    return found


def repository_files():
    """The repository's files as git lists them, or None without git."""
    try:
        p = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    if p.returncode != 0:
        return None
    return [f for f in p.stdout.decode().split("\0") if f and os.path.isfile(os.path.join(ROOT, f))]


class LabSolutions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = None
        cls.found = solutions()
        files = repository_files()
        if files is None:
            raise unittest.SkipTest("not a git checkout (or no git): the copy to patch is the files git lists")
        cls.tmp = tempfile.mkdtemp(prefix="zf-lab-solutions-")
        cls.copy = os.path.join(cls.tmp, "repo")
        for f in files:
            dst = os.path.join(cls.copy, f)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), dst)
        # The copy builds at -O1 without the GPU layer, each library as a few
        # large translation units (unity: the shared headers once per few
        # files), which compiles much faster than the release build; parity
        # with the release build's stage 00 (--build BUILD) stays bit for
        # bit: without -ffast-math or FMA contraction (meson.build turns it off)
        # x86-64 rounds the same at every -O level.
        build = os.path.join(cls.tmp, "build")
        setup = subprocess.run(["meson", "setup", build, "--buildtype=custom", "-Doptimization=1", "-Ddebug=false",
                                "-Db_ndebug=true", "-Dcuda=disabled", "-Dnccl=disabled", "-Dunity=on"],
                               cwd=cls.copy, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        cls.setup = (setup.returncode, setup.stdout[-3000:])
        # One patch, then its stage's build, from the last lab to the first:
        # a stage links the libraries of the stages before it, and a
        # solution turns its stage into the next one (lab 3's ZeRO-1 gets
        # ZeRO-2's gradients), so each stage is built before the patch to
        # the stage below it. After the first build each is incremental.
        cls.applied, cls.built = {}, {}
        for lab, patch in sorted(cls.found.items(), reverse=True):
            p = subprocess.run(["git", "apply", patch], cwd=cls.copy, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            cls.applied[lab] = (p.returncode, p.stdout)
            target = CHANGED.get(lab)
            if setup.returncode or p.returncode or target is None:
                continue
            p = subprocess.run(["ninja", "-C", build, target], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
            cls.built[lab] = (p.returncode, p.stdout[-3000:], os.path.join(build, target))

    @classmethod
    def tearDownClass(cls):
        if cls.tmp:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_there_is_a_solution(self):
        for lab in (2, 3, 4, 5, 6, 7):
            self.assertIn(lab, self.found, f"docs/labs/solutions/lab{lab}_*.patch")

    def test_each_solution_applies_builds_and_passes_its_check(self):
        self.assertEqual(self.setup[0], 0, self.setup[1])
        for lab, patch in self.found.items():
            with self.subTest(lab=lab, patch=os.path.basename(patch)):
                self.assertIn(lab, CHANGED, "a solution for a lab without a stage before it")
                rc, out = self.applied[lab]
                self.assertEqual(rc, 0, f"git apply {patch}: {out}")
                rc, out, exe = self.built[lab]
                self.assertEqual(rc, 0, out)
                p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "lab_check.py"), str(lab),
                                    "--build", BUILD, "--binary", exe],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                self.assertEqual(p.returncode, 0, p.stdout)
                self.assertIn("where the units are padded", p.stdout)  # checked at both rank counts
                self.assertRegex(p.stdout.strip().splitlines()[-1], rf"^lab {lab}: passed \(\d+ checks\)$")

    def test_each_lab_names_its_solution(self):
        for lab, patch in self.found.items():
            with self.subTest(lab=lab):
                doc = glob.glob(os.path.join(ROOT, "docs", "labs", f"lab{lab}_*.md"))
                self.assertEqual(len(doc), 1, doc)
                with open(doc[0], encoding="utf-8") as f:
                    self.assertIn("solutions/" + os.path.basename(patch), f.read())


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "lab_solutions", "test_lab_solutions.py [--xml FILE]"))
