#!/usr/bin/env python3
"""check_links.py: every relative link of the repository's markdown files
points at a file or folder that exists (relative to the file that links),
and a link to a heading (#anchor) of a markdown file at a heading it has.
Links inside code blocks and links to web addresses are not checked.
Standard library only.

    python3 scripts/check_links.py     # prints each broken link; exit 1 if any

tests/python/test_docs.py runs it as part of scripts/test.sh.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def markdown_files(root):
    """The tracked and untracked-but-not-ignored .md files, relative to root."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
                         cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         check=False).stdout.split()
    if out:
        return sorted(set(out))
    found = []  # not a git checkout: every .md file under root
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".") and not x.startswith("build")]
        found += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(".md")]
    return sorted(found)


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
    a = CODE.sub(lambda m: m.group(0)[1:-1], heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", a).replace(" ", "-")


def anchors(path):
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    return {anchor(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def broken_links(root=ROOT):
    """[(file, link, why)] for every relative link that does not resolve."""
    bad = []
    for rel in markdown_files(root):
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            text = CODE.sub("", FENCE.sub("", f.read()))
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            file_part, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                bad.append((rel, target, "no such file"))
            elif frag and dest.endswith(".md") and frag not in anchors(dest):
                bad.append((rel, target, "no such heading"))
    return bad


def main():
    bad = broken_links()
    for rel, target, why in bad:
        print(f"{rel}: ({target}): {why}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
