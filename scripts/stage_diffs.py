#!/usr/bin/env python3
"""stage_diffs.py: writes each stage's CHANGES.diff, the unified diff of its
files against the previous stage's, so that a reader who knows stage N-1
sees exactly what stage N changes. Standard library only (difflib).

    python3 scripts/stage_diffs.py           # (re)write every stage's CHANGES.diff
    python3 scripts/stage_diffs.py --check   # write nothing; exit 1 naming each stale file

scripts/docs.py runs --check's comparison (the docs test), so a stage
changed without its diffs refreshed fails a test; python3 scripts/docs.py
write refreshes them with every other generated part of the documents.

Stages. STAGES below lists the stage folders in order, each with the name of
its own files: adding a stage (04_fsdp, 05_offload) is one line there. A
stage's extensions (05_offload/extensions: what a reader can stop before)
are a folder inside it, listed after it, and diffed against it; the
stage's own diff leaves that folder out. Every
stage but the first gets a CHANGES.diff against the stage before it in the
list. A stage folder on disk that is not in the list, or whose predecessor in
the list has no folder yet, gets no diff and a note on stderr, never an error.

Pairing. A stage's files are every file in its folder (sub-folders included)
but README.md, CHANGES.diff, hidden files and editor leftovers. Each pairs
with a file of the previous stage:
  - the file named after the stage (zero2.cpp, zero2.h, also zero2_<x>.cpp)
    with the previous stage's file of the same role (zero1.cpp, zero1.h,
    zero1_<x>.cpp): the step loop with the step loop, its header with its
    header;
  - any other file with the file of the same name (train.cpp, meson.build).
Files named after the stage come first in the diff: the loop is what to read.

New files are listed at the top with their line counts, not added whole as
'+' lines. A new file (sharded_adamw.cpp, sharded_grads.cpp,
gathered_params.cpp, and their headers) is a new class: there is nothing to
compare it with, it reads better in the folder than with a '+' before every
line, and the README sends the reader to it anyway. Pasted in whole it would
also bury the loop's diff, the lines to read one by one, under a hundred
lines or more of '+'. Files of the previous stage that have no partner here
(01's sharded_adamw.* seen from 02: later stages use it from 01_zero1, they do
not copy it) are named too, so nothing is left out silently.

Output is deterministic (sorted files, no timestamps, LF line endings), so
--check can compare bytes.
"""
import argparse
import difflib
import os
import re
import sys

# (folder, name of the stage's own files), in ladder order.
STAGES = [
    ("00_data_parallel", "data_parallel"),
    ("01_zero1", "zero1"),
    ("02_zero2", "zero2"),
    ("03_zero3", "zero3"),
    ("04_fsdp", "fsdp"),
    ("05_offload", "offload"),
    ("05_offload/extensions", "offload"),
]

OUTPUT = "CHANGES.diff"
REFRESH = "python3 scripts/docs.py write"
CONTEXT = 3  # lines of context around each change, as diff -u
FIRST_LINE = "# {stage}/" + OUTPUT + ": the files of {stage} against those of {prev}."
SKIPPED_NAMES = {"README.md", OUTPUT}
SKIPPED_SUFFIXES = ("~", ".orig", ".rej", ".swp", ".pyc", ".bak")
STAGE_FOLDER = re.compile(r"^\d\d_\w+$")


def default_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stage_files(folder, nested=()):
    """Relative paths ('/'-separated, sorted) of the files a stage's diff
    covers; nested: absolute paths of folders inside it left out (its
    extensions, a stage of their own)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__"
                             and os.path.join(dirpath, d) not in nested)
        for f in filenames:
            if f in SKIPPED_NAMES or f.startswith(".") or f.endswith(SKIPPED_SUFFIXES):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), folder)
            out.append(rel.replace(os.sep, "/"))
    return sorted(out)


def read_lines(path):
    """The file's lines with their '\\n', or None if it is not UTF-8 text."""
    try:
        with open(path, encoding="utf-8", newline=None) as f:
            return f.read().splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def own_role(rel, name):
    """For a file named after its stage (name.cpp, name_x.h), the rest of its
    name ('.cpp', '_x.h'); else None."""
    d, base = os.path.split(rel)
    if base.startswith(name) and base[len(name):len(name) + 1] in (".", "_"):
        return d, base[len(name):]
    return None


def pair_files(prev_name, prev_files, name, files):
    """([(prev_rel, rel)] for the files that pair, own-named files first,
    the files new in this stage, the previous stage's files left unpaired)."""
    prev_set = set(prev_files)
    own, rest = [], []
    for rel in files:
        role = own_role(rel, name)
        partner = None
        if role is not None:
            d, tail = role
            partner = "/".join(p for p in (d, prev_name + tail) if p)
        if partner in prev_set:
            own.append((partner, rel))
        else:
            rest.append(rel)
    used = {p for p, _ in own}
    other, new = [], []
    for rel in rest:
        if rel in prev_set and rel not in used:
            other.append((rel, rel))
            used.add(rel)
        else:
            new.append(rel)
    gone = [p for p in prev_files if p not in used]
    return own + other, new, gone


def unified(a_lines, b_lines, a_label, b_label):
    out = []
    for line in difflib.unified_diff(a_lines, b_lines, a_label, b_label, n=CONTEXT, lineterm="\n"):
        if line.endswith("\n"):
            out.append(line)
        else:  # the file's last line has no newline: say so, as diff does
            out.append(line + "\n\\ No newline at end of file\n")
    return out


def lines_word(n):
    return f"{n} line" if n == 1 else f"{n} lines"


def stage_diff(root, prev, prev_name, stage, name):
    """The text of stage's CHANGES.diff against prev."""
    prev_dir, stage_dir = os.path.join(root, prev), os.path.join(root, stage)
    nested = {os.path.join(root, s) for s, _ in STAGES}
    prev_files, files = stage_files(prev_dir, nested), stage_files(stage_dir, nested)
    pairs, new, gone = pair_files(prev_name, prev_files, name, files)

    body, diffed, unchanged, binary = [], [], [], []
    for a, b in pairs:
        a_lines = read_lines(os.path.join(prev_dir, a))
        b_lines = read_lines(os.path.join(stage_dir, b))
        shown = a if a == b else f"{a} -> {b}"
        if a_lines is None or b_lines is None:
            binary.append(shown)
            continue
        d = unified(a_lines, b_lines, f"a/{prev}/{a}", f"b/{stage}/{b}")
        if d:
            body += d
            diffed.append(shown)
        else:
            unchanged.append(shown)

    head = [FIRST_LINE.format(stage=stage, prev=prev),
            f"# Generated by scripts/stage_diffs.py ({CONTEXT} lines of context); do not edit by hand.",
            "# After changing either stage, refresh every stage's diff with:",
            f"#   {REFRESH}",
            "#"]
    if new:
        head.append("# new in this stage, read them whole (not shown below):")
        width = max(len(f) for f in new)
        for f in new:
            lines = read_lines(os.path.join(stage_dir, f))
            head.append(f"#   {f.ljust(width)}  " + ("binary" if lines is None else lines_word(len(lines))))
    if gone:
        head.append(f"# only in {prev} (no file here in its place): " + ", ".join(gone))
    if unchanged:
        head.append("# unchanged: " + ", ".join(unchanged))
    if binary:
        head.append("# binary, not compared: " + ", ".join(binary))
    head.append(f"# changed, below ({prev} -> {stage}):" + ("" if diffed else " none"))
    head += [f"#   {f}" for f in diffed]
    return "\n".join(head) + "\n" + "".join(body)


def plan(root):
    """[(stage, text or None)] for every stage in STAGES that has a folder
    (None: it gets no diff), and notes about folders that get none."""
    notes, out = [], []
    for i, (stage, name) in enumerate(STAGES):
        if not os.path.isdir(os.path.join(root, stage)):
            continue
        if i == 0:
            out.append((stage, None))
            continue
        prev, prev_name = STAGES[i - 1]
        if not os.path.isdir(os.path.join(root, prev)):
            notes.append(f"{stage}: its predecessor {prev} has no folder, so it gets no {OUTPUT}")
            out.append((stage, None))
            continue
        out.append((stage, stage_diff(root, prev, prev_name, stage, name)))
    listed = {s for s, _ in STAGES}
    for d in sorted(os.listdir(root)):
        if STAGE_FOLDER.match(d) and os.path.isdir(os.path.join(root, d)) and d not in listed:
            notes.append(f"{d}: not in STAGES (scripts/stage_diffs.py), so it gets no {OUTPUT}; "
                         f"add a line there to diff it against the stage before it")
    return out, notes


def is_generated(path):
    """Whether path is a CHANGES.diff this script wrote (safe to remove)."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError):
        return False
    return first.startswith("# ") and f"/{OUTPUT}: the files of " in first


def read_text(path):
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def first_difference(a, b):
    a_lines, b_lines = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(a_lines, b_lines)):
        if x != y:
            return i + 1
    return min(len(a_lines), len(b_lines)) + 1


def stale(root):
    """([(path relative to root, why)] for every CHANGES.diff that is not
    what the stages give now, empty when all are current; plan's notes)."""
    out = []
    diffs, notes = plan(root)
    for stage, text in diffs:
        rel = f"{stage}/{OUTPUT}"
        path = os.path.join(root, stage, OUTPUT)
        have = read_text(path)
        if text is None:
            if have is not None and is_generated(path):
                out.append((rel, "should not exist: this stage gets no diff"))
        elif have is None:
            out.append((rel, "missing"))
        elif have != text:
            out.append((rel, f"stale: differs from the stage files from line {first_difference(have, text)}"))
    return out, notes


def check_message(problems):
    lines = [f"{rel}: {why}" for rel, why in problems]
    lines.append(f"{len(problems)} stage diff(s) out of date; refresh them with: {REFRESH}")
    return "\n".join(lines)


def write(root):
    diffs, notes = plan(root)
    for stage, text in diffs:
        rel = f"{stage}/{OUTPUT}"
        path = os.path.join(root, stage, OUTPUT)
        if text is None:
            if os.path.exists(path) and is_generated(path):
                os.remove(path)
                print(f"removed {rel}")
            continue
        if read_text(path) == text:
            print(f"up to date {rel}")
            continue
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        print(f"wrote {rel}")
    return notes


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write (or --check) each stage's CHANGES.diff against the stage before it.")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming every stale or missing diff")
    ap.add_argument("--root", default=default_root(), help="the repository root (default: this script's)")
    args = ap.parse_args(argv)
    if args.check:
        problems, notes = stale(args.root)
        for n in notes:
            print("note:", n, file=sys.stderr)
        if problems:
            print(check_message(problems))
            return 1
        print("stage diffs up to date")
        return 0
    for n in write(args.root):
        print("note:", n, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
