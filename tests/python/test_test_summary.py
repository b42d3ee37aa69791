#!/usr/bin/env python3
# test_test_summary.py: scripts/test_summary.py, the last line of CI, on
# made-up meson runs: the counts of one run, the sum over several (the normal
# build and the sanitizer builds of scripts/sanitize.sh), a crash without a
# recorded failure, a run in which no suite ran, and a sanitizer report,
# which must count as a failure even when every test passed. Needs no built
# target. Standard library only.
#
#   meson test -C build test_summary_py
#   python3 tests/python/test_test_summary.py [--xml FILE]

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_xml  # noqa: E402
import test_summary  # noqa: E402

CASE = '<testcase name="{name}" classname="S"{attr}>{body}</testcase>'


def make_run(top, build, suites):
    """A build folder with results and a testlog: suites maps a name to
    (meson result, [(case name, "ok"|"fail"|"skip")]) or (result, None) for no XML."""
    results = os.path.join(top, build, "tests", "results")
    logs = os.path.join(top, build, "meson-logs")
    os.makedirs(results)
    os.makedirs(logs)
    with open(os.path.join(logs, "testlog.json"), "w") as log:
        for name, (result, cases) in suites.items():
            log.write(json.dumps({"name": name, "result": result, "returncode": 0 if result == "OK" else 1}) + "\n")
            if cases is None:
                continue
            xml = []
            for case, how in cases:
                attr = ' result="skipped"' if how == "skip" else ""
                body = '<failure message="x"/>' if how == "fail" else ""
                xml.append(CASE.format(name=case, attr=attr, body=body))
            with open(os.path.join(results, name + ".xml"), "w") as f:
                f.write("<testsuites><testsuite>" + "".join(xml) + "</testsuite></testsuites>")
    return [results, os.path.join(logs, "testlog.json")]


def summary(args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = test_summary.main(args)
    lines = out.getvalue().splitlines()
    return status, lines[-1], lines[:-1]


class SummaryTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.top = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_one_run(self):
        run = make_run(self.top, "build", {"a": ("OK", [("x", "ok"), ("y", "skip")]),
                                           "b": ("FAIL", [("z", "fail")])})
        status, last, failures = summary(run)
        self.assertEqual(last, "1 passed, 1 failed, 1 skipped")
        self.assertEqual(status, 1)
        self.assertEqual(failures, ["FAILED: b: S.z"])

    def test_runs_are_summed_and_named_by_build(self):
        normal = make_run(self.top, "build", {"a": ("OK", [("x", "ok"), ("y", "ok")])})
        asan = make_run(self.top, "build-asan", {"a": ("OK", [("x", "ok")]),
                                                 "c": ("FAIL", None)})  # crashed, left no XML
        status, last, failures = summary(normal + asan)
        self.assertEqual(last, "3 passed, 1 failed, 0 skipped")
        self.assertEqual(status, 1)
        self.assertEqual(len(failures), 1)
        self.assertIn("build-asan/c: FAIL", failures[0])

    def test_a_run_without_suites_fails(self):
        normal = make_run(self.top, "build", {"a": ("OK", [("x", "ok")])})
        missing = [os.path.join(self.top, "build-tsan", "tests", "results"),
                   os.path.join(self.top, "build-tsan", "meson-logs", "testlog.json")]
        status, last, _ = summary(normal + missing)
        self.assertEqual(last, "1 passed, 1 failed, 0 skipped")
        self.assertEqual(status, 1)

    def test_results_without_a_test_fail(self):
        run = make_run(self.top, "build-emu", {"a": ("OK", [("x", "ok")]), "b": ("OK", [])})
        status, last, failures = summary(run)
        self.assertEqual((status, last), (1, "1 passed, 1 failed, 0 skipped"))
        self.assertIn("b: ran no test", failures[0])

    def test_each_sanitizer_report_is_a_failure(self):
        run = make_run(self.top, "build-asan", {"a": ("OK", [("x", "ok")])})
        reports = os.path.join(self.top, "build-asan", "sanitizer-reports")
        os.makedirs(reports)
        open(os.path.join(reports, "empty.1"), "w").close()  # no finding: not counted
        status, last, _ = summary(run + ["--reports", reports])
        self.assertEqual((status, last), (0, "1 passed, 0 failed, 0 skipped"))
        with open(os.path.join(reports, "asan.42"), "w") as f:
            f.write("ERROR: AddressSanitizer: heap-use-after-free\n")
        status, last, failures = summary(run + ["--reports", reports])
        self.assertEqual((status, last), (1, "1 passed, 1 failed, 0 skipped"))
        self.assertIn("asan.42", failures[0])

    def test_asans_swapcontext_notice_alone_is_not_a_finding(self):
        run = make_run(self.top, "build-asan", {"a": ("OK", [("x", "ok")])})
        reports = os.path.join(self.top, "build-asan", "sanitizer-reports")
        os.makedirs(reports)
        notice = ("==7==WARNING: ASan doesn't fully support makecontext/swapcontext functions and may produce "
                  "false positives in some cases!\n")
        with open(os.path.join(reports, "asan.7"), "w") as f:
            f.write(notice)
        status, last, _ = summary(run + ["--reports", reports])
        self.assertEqual((status, last), (0, "1 passed, 0 failed, 0 skipped"))
        with open(os.path.join(reports, "asan.8"), "w") as f:  # the notice, then a finding
            f.write(notice + "==8==ERROR: AddressSanitizer: stack-buffer-overflow\n")
        status, last, failures = summary(run + ["--reports", reports])
        self.assertEqual((status, last), (1, "1 passed, 1 failed, 0 skipped"))
        self.assertIn("asan.8", failures[0])


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "test_summary_py", "test_test_summary.py [--xml FILE]"))
