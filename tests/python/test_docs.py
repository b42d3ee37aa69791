#!/usr/bin/env python3
# test_docs.py: the documents point at what exists. Every relative link of
# every markdown file resolves (scripts/check_links.py), and every file that
# docs/ARCHITECTURE.md's reading lists name exists, and the lists are
# the ones scripts/reading_list.py writes (`python3
# scripts/reading_list.py --write` refreshes them). Also tests the link
# checker on a scratch folder. Needs no built target. Standard library only.
#
#   meson test -C build docs                   # as scripts/test.sh runs it
#   python3 tests/python/test_docs.py [--xml FILE]

import os
import shutil
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_links  # noqa: E402
import gtest_xml  # noqa: E402
import reading_list  # noqa: E402


class RepositoryDocsTest(unittest.TestCase):
    def test_every_markdown_link_resolves(self):
        bad = check_links.broken_links(ROOT)
        self.assertEqual(bad, [], "\n".join(f"{f}: ({t}): {why}" for f, t, why in bad))

    def test_every_file_of_the_reading_lists_exists(self):
        missing = [f for _, diff, files, further in reading_list.READING
                   for f in ([diff] if diff else []) + [x for x, _ in files] + list(further)
                   if not os.path.isfile(os.path.join(ROOT, f))]
        self.assertEqual(missing, [], "listed in scripts/reading_list.py but missing")

    def test_the_reading_lists_are_current(self):
        with open(os.path.join(ROOT, reading_list.DOC), encoding="utf-8") as f:
            text = f.read()
        self.assertEqual(reading_list.with_tables(text, reading_list.tables()), text,
                         f"{reading_list.DOC}'s reading lists are stale: "
                         "refresh them with python3 scripts/reading_list.py --write")

    def test_the_architecture_document_has_the_markers(self):
        with open(os.path.join(ROOT, reading_list.DOC), encoding="utf-8") as f:
            text = f.read()
        self.assertIn(reading_list.BEGIN, text)
        self.assertIn(reading_list.END, text)


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
