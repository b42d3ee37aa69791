#!/usr/bin/env python3
# test_cuda_deps.py: ninja knows which headers each .cu file of the build
# includes, so that editing one recompiles the GPU code (scripts/nvcc_deps.sh:
# nvcc asked for its dependency file, which Meson before 1.4 does not do).
# scripts/nvcc_deps.sh against a stand-in nvcc that records its words; and
# every CUDA object of the build (ZF_BUILD, as scripts/build.sh sets it up)
# with the repository's headers among its recorded dependencies (skips,
# saying so, where the build compiles no CUDA). Standard library only.
#
#   meson test -C build cuda_deps_py
#   ZF_BUILD=build python3 tests/python/test_cuda_deps.py [--xml FILE]

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_xml  # noqa: E402

BUILD = os.path.realpath(os.environ.get("ZF_BUILD") or os.path.join(ROOT, "build"))
WRAPPER = os.path.join(ROOT, "scripts", "nvcc_deps.sh")


class Wrapper(unittest.TestCase):
    """scripts/nvcc_deps.sh in front of a stand-in nvcc that writes its words, one a line."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.words = os.path.join(self.tmp.name, "words")
        self.nvcc = os.path.join(self.tmp.name, "nvcc")
        with open(self.nvcc, "w") as f:
            f.write(f'#!/bin/sh\nprintf "%s\\n" "$@" > {self.words}\n')
        os.chmod(self.nvcc, 0o755)

    def tearDown(self):
        self.tmp.cleanup()

    def run_nvcc(self, *words):
        p = subprocess.run([WRAPPER, self.nvcc, *words], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.assertEqual(p.returncode, 0, p.stdout)
        with open(self.words) as f:
            return f.read().splitlines()

    def test_a_compile_writes_the_dependency_file_ninja_reads(self):
        words = ["-O3", "-o", "lib.p/a.cu.o", "-c", "../a.cu"]
        self.assertEqual(self.run_nvcc(*words), words + ["-MD", "-MF", "lib.p/a.cu.o.d"])

    def test_a_link_or_a_compile_that_asks_already_passes_through(self):
        for words in (["-o", "prog", "a.o", "b.o"],  # a link
                      ["-MD", "-MT", "a.cu.o", "-MF", "a.cu.o.d", "-o", "a.cu.o", "-c", "a.cu"],  # a later Meson
                      ["--version"]):
            with self.subTest(words=words):
                self.assertEqual(self.run_nvcc(*words), words)

    def test_the_native_file_puts_it_in_front_of_the_nvcc_on_path(self):
        env = dict(os.environ, PATH=self.tmp.name + os.pathsep + os.environ.get("PATH", ""))
        p = subprocess.run([WRAPPER, "--native-file"], stdout=subprocess.PIPE, text=True, env=env)
        self.assertEqual(p.returncode, 0)
        self.assertEqual(p.stdout, f"[binaries]\ncuda = ['{WRAPPER}', '{self.nvcc}']\n")

    def test_without_words_it_says_how_to_call_it(self):
        p = subprocess.run([WRAPPER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("usage: scripts/nvcc_deps.sh", p.stderr)

    def test_without_nvcc_the_native_file_is_refused(self):
        env = dict(os.environ, PATH=self.tmp.name + "/none")
        p = subprocess.run(["/bin/bash", WRAPPER, "--native-file"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no nvcc on PATH", p.stderr)


class BuildTracksHeaders(unittest.TestCase):
    def test_every_cuda_object_lists_the_headers_it_includes(self):
        try:
            with open(os.path.join(BUILD, "compile_commands.json")) as f:
                commands = json.load(f)
        except OSError as e:
            self.fail(f"{BUILD} has no compile_commands.json (is it a Meson build?): {e}")
        objects = [c["output"] for c in commands if c["file"].endswith(".cu")]
        if not objects:
            self.skipTest(f"{BUILD} compiles no CUDA (no nvcc): no GPU object to track")
        ninja = shutil.which("ninja")
        self.assertIsNotNone(ninja, "ninja is not on PATH")
        for obj in objects:
            with self.subTest(object=obj):
                p = subprocess.run([ninja, "-C", BUILD, "-t", "deps", obj], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
                self.assertEqual(p.returncode, 0, p.stdout)
                self.assertNotIn("deps not found", p.stdout, f"{obj} is not built yet: ninja -C {BUILD}")
                deps = [os.path.realpath(os.path.join(BUILD, line.strip())) for line in p.stdout.splitlines()[1:]
                        if line.strip()]
                headers = [d for d in deps if d.startswith(os.path.join(ROOT, "common") + os.sep)
                           and d.endswith((".h", ".cuh"))]
                self.assertTrue(headers, f"ninja records no header of common/ for {obj}: nvcc wrote no dependency "
                                         f"file. Set {BUILD} up again, which empties it: meson setup --wipe {BUILD} "
                                         f"--native-file <(scripts/nvcc_deps.sh --native-file). {p.stdout[:300]}")


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "cuda_deps_py", "test_cuda_deps.py [--xml FILE]"))
