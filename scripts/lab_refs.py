# lab_refs.py: the labs' reading references still point at the code. A
# reference in docs/labs/*.md is a link to a repository file followed by an
# anchor, a quoted line of that file, and optionally the lines it sits in:
#
#   [01_zero1/zero1.cpp](../../01_zero1/zero1.cpp), anchor `RankResult train_zero1(` (lines 60-70)
#
# Each reference's file must exist (the link and the shown path the same
# file), its anchor must be found in it, once or more, and with a line range
# the anchor's first line must lie in it, at most K_LEAD lines below its start
# (the comment above it): a range that starts far above the anchor sends the
# reader to other code. A failure names the lab's line, the
# file, and where the anchor is now, so the fix is in the message.
# Standard library only; scripts/lab_check.py --check-refs runs it.

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF = re.compile(r"\[`?([\w./-]+?)`?\]\(([^)\s#]+)\),?\s+anchor\s+`([^`]+)`"
                 r"(?:\s*\(lines?\s+(\d+)\s*-\s*(\d+)\))?")


K_LEAD = 8


def references(doc):
    """[(line number, shown path, link target, anchor, first, last)] of one lab file."""
    out = []
    with open(doc, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            for m in REF.finditer(line):
                first = int(m.group(4)) if m.group(4) else None
                last = int(m.group(5)) if m.group(5) else None
                out.append((i, m.group(1), m.group(2), m.group(3), first, last))
    return out


def check_doc(doc, root=ROOT):
    """The problems of one lab file's references, one string each."""
    problems = []
    rel_doc = os.path.relpath(doc, root)
    for line, shown, target, anchor, first, last in references(doc):
        where = f"{rel_doc}:{line}: {shown}"
        path = os.path.normpath(os.path.join(os.path.dirname(doc), target))
        if os.path.normpath(os.path.join(root, shown)) != path:
            problems.append(f"{where}: the link goes to {os.path.relpath(path, root)}, not to the path shown")
            continue
        if not os.path.isfile(path):
            problems.append(f"{where}: no such file (moved or renamed? fix the link)")
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        found = [n for n, text in enumerate(lines, 1) if anchor in text]
        if not found:
            problems.append(f"{where}: anchor `{anchor}` not found in the file (the code changed: "
                            "quote a line it has now)")
        elif first is not None and not any(first <= n <= min(last, first + K_LEAD) for n in found):
            n = found[0]
            problems.append(f"{where}: anchor `{anchor}` is at line {n}, not at the start of lines "
                            f"{first}-{last}: write (lines {n}-{n + last - first})")
    return problems


def lab_docs(root=ROOT):
    return sorted(glob.glob(os.path.join(root, "docs", "labs", "lab*.md")))


def check_all(docs=None, root=ROOT):
    """(number of references, problems) over the given lab files (default: every lab)."""
    docs = lab_docs(root) if docs is None else docs
    count, problems = 0, []
    for d in docs:
        count += len(references(d))
        problems += check_doc(d, root)
    return count, problems
