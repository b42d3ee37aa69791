#!/usr/bin/env python3
"""test_summary.py: sums GoogleTest XML results into "N passed, N failed, N skipped".

Every suite that meson ran must have left its XML; a suite that crashed (no
XML, or a non-zero exit with no failure recorded) counts as one failure, so a
crash can never look like a pass. Exit status 1 when anything failed.
"""
import json
import os
import sys
import xml.etree.ElementTree as ET

results_dir, testlog = sys.argv[1], sys.argv[2]
passed = failed = skipped = 0
failures = []

suites = []
if os.path.exists(testlog):
    with open(testlog) as f:
        suites = [json.loads(line) for line in f if line.strip()]

for s in suites:
    name = s["name"]
    path = os.path.join(results_dir, name + ".xml")
    suite_failed = 0
    try:
        cases = list(ET.parse(path).getroot().iter("testcase")) if os.path.exists(path) else []
    except ET.ParseError as e:
        cases = []
        suite_failed += 1
        failures.append(f"{name}: unreadable results {path} ({e})")
    if cases:
        for case in cases:
            if case.find("failure") is not None or case.find("error") is not None:
                suite_failed += 1
                failures.append(f"{name}: {case.get('classname')}.{case.get('name')}")
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    if s.get("result") not in ("OK", "EXPECTEDFAIL") and suite_failed == 0:
        suite_failed = 1  # crashed, timed out, or left no results
        failures.append(f"{name}: {s.get('result')} (exit {s.get('returncode')}) without a recorded failure")
    failed += suite_failed

if not suites:
    failures.append("no test suite ran")
    failed += 1
for f in failures:
    print("FAILED:", f)
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
