# gtest_xml.py: runs a module's unittest cases and, with --xml FILE, writes
# their results in GoogleTest's XML shape (testsuites/testsuite/testcase,
# with <failure> or <skipped>), so that scripts/test_summary.py counts the
# Python tests with the C++ ones. Standard library only.

import os
import sys
import unittest
import xml.etree.ElementTree as ET


def write_xml(result, cases, path, suite_name):
    """GoogleTest's XML shape, as scripts/test_summary.py reads it."""
    failed = {t.id(): tb for t, tb in result.failures + result.errors}
    skipped = {t.id(): why for t, why in result.skipped}
    suites = ET.Element("testsuites", name="AllTests", tests=str(len(cases)),
                        failures=str(len(failed)))
    suite = ET.SubElement(suites, "testsuite", name=suite_name, tests=str(len(cases)), failures=str(len(failed)))
    for case in cases:
        cls, name = case.id().rsplit(".", 1)
        tc = ET.SubElement(suite, "testcase", name=name, classname=cls.rsplit(".", 1)[-1],
                           result="skipped" if case.id() in skipped else "completed")
        if case.id() in failed:
            ET.SubElement(tc, "failure", message=failed[case.id()].strip().splitlines()[-1]).text = failed[case.id()]
        elif case.id() in skipped:
            ET.SubElement(tc, "skipped", message=skipped[case.id()])
    ET.ElementTree(suites).write(path, encoding="UTF-8", xml_declaration=True)


def all_cases(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from all_cases(t)
        else:
            yield t


def main(module_name, suite_name, usage):
    """Runs every test of module_name; the exit status for sys.exit."""
    xml = None
    argv = sys.argv[1:]
    if len(argv) == 2 and argv[0] == "--xml":
        xml = argv[1]
    elif argv:
        sys.exit("usage: " + usage)
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[module_name])
    cases = list(all_cases(suite))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    if xml:
        os.makedirs(os.path.dirname(os.path.abspath(xml)), exist_ok=True)
        write_xml(result, cases, xml, suite_name)
    return 0 if result.wasSuccessful() else 1
