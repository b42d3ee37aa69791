#!/usr/bin/env python3
# test_docs.py: every generated part of the documents is current and every
# reference they make resolves (scripts/docs.py check: the stage diffs, the
# reading lists, the idea pictures when ZF_BUILD names the build, the labs'
# anchors, the links; the tour tables are the tour test's, which runs that
# tour anyway); a stale part names `python3 scripts/docs.py write`.
# Also tests the report and the link checker on a scratch folder.
# Standard library only.
#
#   meson test -C build docs                   # as scripts/test.sh runs it
#   ZF_BUILD=build python3 tests/python/test_docs.py [--xml FILE]

import contextlib
import io
import os
import shutil
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_links  # noqa: E402
import docs  # noqa: E402
import gtest_xml  # noqa: E402
import reading_list  # noqa: E402


BUILD = os.environ.get("ZF_BUILD")


class RepositoryDocsTest(unittest.TestCase):
    def test_every_generated_part_is_current(self):
        # The one freshness test: stage diffs, reading lists, the idea
        # pictures (with the build), lab references, links. Its message
        # names the command. Not the tour tables: the tour test checks them
        # on the runs it makes (the same tour, run once).
        stale = docs.check(BUILD, with_tour=False)
        if stale:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                docs.report(stale, BUILD)
            self.fail("\n" + out.getvalue())

    def test_the_architecture_document_has_the_markers(self):
        with open(os.path.join(ROOT, reading_list.DOC), encoding="utf-8") as f:
            text = f.read()
        self.assertIn(reading_list.BEGIN, text)
        self.assertIn(reading_list.END, text)


class DocsCommandTest(unittest.TestCase):
    def report(self, stale, build=None):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            docs.report(stale, build)
        return out.getvalue()

    def test_a_stale_generated_part_names_the_command(self):
        text = self.report([("stage diffs", ["01_zero1/CHANGES.diff: stale"])], "build")
        self.assertIn("stage diffs: 01_zero1/CHANGES.diff: stale", text)
        self.assertIn("python3 scripts/docs.py write --build build", text)
        self.assertNotIn("written by hand", text)

    def test_a_broken_link_is_for_a_hand(self):
        text = self.report([("links", ["README.md: (x.md): no such file"])])
        self.assertIn("written by hand", text)
        self.assertNotIn("docs.py write", text)

    def test_a_tour_that_did_not_run_is_not_called_stale(self):
        text = self.report([("tour run", ["tools/tour.py --check-readmes failed (exit 1): no build"])], "build")
        self.assertIn("the tour did not run", text)
        self.assertNotIn("docs.py write", text)

    def test_a_stale_count_is_found(self):
        body = reading_list.tables()
        doc = reading_list.with_tables(f"x\n{reading_list.BEGIN}\nold\n{reading_list.END}\ny\n", body)
        self.assertEqual(reading_list.with_tables(doc, body), doc)
        stale = doc.replace(reading_list.course_size(), "The course, followed through every table: 1 files, 9 lines.")
        self.assertNotEqual(stale, doc)
        self.assertNotEqual(reading_list.with_tables(stale, body), stale)

    def test_a_missing_build_folder_is_a_usage_error(self):
        with contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(docs.main(["check", "--build", "/nonexistent/zf-build"]), 2)
        self.assertIn("no such folder", err.getvalue())


class LinkCheckerTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="zf-docs-")
        os.makedirs(os.path.join(self.root, "docs"))
        self.write("docs/A.md", "# Title\n\n## Why these `shapes`\n\ntext\n")

    def tearDown(self):
        shutil.rmtree(self.root)

    def write(self, rel, text):
        with open(os.path.join(self.root, rel), "w", encoding="utf-8") as f:
            f.write(text)

    def broken(self):
        return [(f, t) for f, t, _ in check_links.broken_links(self.root)]

    def test_links_relative_to_the_linking_file(self):
        self.write("README.md", "[a](docs/A.md) [b](docs/B.md) [up](README.md)\n")
        self.write("docs/C.md", "[a](A.md) [readme](../README.md) [gone](../gone.h) [dir](../docs)\n")
        self.assertEqual(self.broken(), [("README.md", "docs/B.md"), ("docs/C.md", "../gone.h")])

    def test_headings(self):
        self.write("README.md", "[ok](docs/A.md#why-these-shapes) [no](docs/A.md#nothing) [self](#x)\n")
        self.assertEqual(self.broken(), [("README.md", "docs/A.md#nothing"), ("README.md", "#x")])

    def test_code_and_web_addresses_are_not_links_to_check(self):
        self.write("README.md", "```\n[x](missing.md)\n```\n`[y](missing.md)` [w](https://example.com/x)\n")
        self.assertEqual(self.broken(), [])


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "docs", "test_docs.py [--xml FILE]"))
