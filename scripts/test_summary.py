#!/usr/bin/env python3
"""test_summary.py: sums GoogleTest XML results into "N passed, N failed, N skipped".

    test_summary.py RESULTS_DIR TESTLOG [RESULTS_DIR TESTLOG ...] [--reports DIR ...]

Each RESULTS_DIR TESTLOG pair is one `meson test` run (the normal build, and
the sanitizer builds of scripts/sanitize.sh); the line sums over all of them.
Every suite that meson ran must have left its XML; a suite that crashed (no
XML, or a non-zero exit with no failure recorded) counts as one failure, so a
crash can never look like a pass. A run in which no suite ran is a failure.
Each non-empty file in a --reports DIR (sanitizer reports, one per process
that had a finding, written there through the sanitizers' log_path) counts as
one failure: a child process whose failure its test expected may still have
had a finding. A report that holds only ASan's notice on swapcontext is not
a finding: ASan prints it once per process whatever the program does, and
the dry run's fibers tell it of every switch (common/modeled/fibers.cpp).
Exit status 1 when anything failed.
"""
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

# "==PID==WARNING: ASan doesn't fully support makecontext/swapcontext functions ..."
NOTICE = re.compile(r"^==\d+==WARNING: ASan doesn't fully support makecontext/swapcontext functions")


def only_notices(path):
    """Whether a report holds nothing but the notice above."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if line.strip()]
    return bool(lines) and all(NOTICE.match(line) for line in lines)


def run_label(results_dir):
    """The build folder a results dir belongs to (build, build-asan, ...)."""
    parts = os.path.normpath(results_dir).split(os.sep)
    return parts[-3] if len(parts) >= 3 else results_dir


def count_run(results_dir, testlog, label, failures):
    passed = failed = skipped = 0
    suites = []
    if os.path.exists(testlog):
        with open(testlog) as f:
            suites = [json.loads(line) for line in f if line.strip()]
    for s in suites:
        name = s["name"]
        where = label + name
        path = os.path.join(results_dir, name + ".xml")
        suite_failed = 0
        try:
            written = os.path.exists(path)
            cases = list(ET.parse(path).getroot().iter("testcase")) if written else []
            if written and not cases:  # a filter that names no test passes nothing
                suite_failed += 1
                failures.append(f"{where}: ran no test ({path}): does its --gtest_filter name any?")
        except ET.ParseError as e:
            cases = []
            suite_failed += 1
            failures.append(f"{where}: unreadable results {path} ({e})")
        if cases:
            for case in cases:
                if case.find("failure") is not None or case.find("error") is not None:
                    suite_failed += 1
                    failures.append(f"{where}: {case.get('classname')}.{case.get('name')}")
                elif case.get("result") == "skipped" or case.find("skipped") is not None:
                    skipped += 1
                else:
                    passed += 1
        if s.get("result") not in ("OK", "EXPECTEDFAIL") and suite_failed == 0:
            suite_failed = 1  # crashed, timed out, or left no results
            failures.append(f"{where}: {s.get('result')} (exit {s.get('returncode')}) without a recorded failure")
        failed += suite_failed
    if not suites:
        failures.append(f"{label or results_dir + ': '}no test suite ran ({testlog})")
        failed += 1
    return passed, failed, skipped


def main(argv):
    runs, report_dirs = [], []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--reports":
            if not args:
                sys.exit("test_summary.py: --reports needs a directory")
            report_dirs.append(args.pop(0))
        elif args:
            runs.append((a, args.pop(0)))
        else:
            sys.exit("test_summary.py: give RESULTS_DIR TESTLOG pairs (a results dir without its testlog)")
    if not runs:
        sys.exit(__doc__)

    passed = failed = skipped = 0
    failures = []
    for results_dir, testlog in runs:
        # Names are prefixed with their build only when several runs are summed.
        label = run_label(results_dir) + "/" if len(runs) > 1 else ""
        p, f, s = count_run(results_dir, testlog, label, failures)
        passed, failed, skipped = passed + p, failed + f, skipped + s
    for d in report_dirs:
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            if os.path.isfile(path) and os.path.getsize(path) > 0 and not only_notices(path):
                failed += 1
                failures.append(f"sanitizer report {path}")
    for f in failures:
        print("FAILED:", f)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
