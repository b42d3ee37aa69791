#!/usr/bin/env python3
"""docs.py: every part of the documents that is generated from the code, or
must point at it, checked or rewritten by one command. Standard library only.

    python3 scripts/docs.py check [--build build]   # write nothing; exit 1 naming each stale part
    python3 scripts/docs.py write [--build build]   # rewrite the generated parts, then check

The parts:
  stage diffs     every stage's CHANGES.diff against the stage before (stage_diffs.py)
  reading lists   docs/ARCHITECTURE.md's tables (reading_list.py)
  tour tables     the stage READMEs' tour sections and docs/tour/ (tools/tour.py;
                  only with --build, since they are a run's numbers)
  idea pictures   docs/labs/ideas/, drawn from the memory estimator's numbers
                  (tools/idea_pictures.py; only with --build)
  lab references  every anchor the labs quote is still in its file (lab_refs.py)
  links           every relative link of every markdown file resolves (check_links.py)

The first four are generated: `write` rewrites them. The last two are
written by hand: `write` cannot mend them, so it checks them and names what
to change. tests/python/test_docs.py runs `check` (with the build) as the
one freshness test of the repository.
"""
import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import check_links  # noqa: E402
import idea_pictures  # noqa: E402
import lab_refs  # noqa: E402
import plot_run  # noqa: E402
import reading_list  # noqa: E402
import stage_diffs  # noqa: E402
import tour  # noqa: E402
import tour_readme  # noqa: E402


def command(build):
    return "python3 scripts/docs.py write" + (f" --build {build}" if build else "")


def stale_stage_diffs():
    problems, _ = stage_diffs.stale(ROOT)
    return [f"{rel}: {why}" for rel, why in problems]


def stale_reading_lists():
    current = reading_list.is_current()
    return [] if current else [f"{reading_list.DOC}: the reading lists differ from scripts/reading_list.py's"]


def check_tour(build):
    """Runs the READMEs' tour (without pictures: the tables do not need them)
    and compares their tables. Returns (stale, failed): the READMEs whose
    tables differ, or why the tour itself failed (then nothing is known)."""
    out = tempfile.mkdtemp(prefix="zf-docs-tour-")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            records, _ = tour.run_tour(tour.README_CONFIG, build, out, plots=False, tty=False)
        return tour_readme.stale_readmes(ROOT, tour_readme.readme_blocks(records, tour.README_CONFIG)), []
    except (tour.TourError, plot_run.LogError) as e:
        return [], [f"the READMEs' tour did not run: {e}"]
    finally:
        shutil.rmtree(out, ignore_errors=True)


def write_tour(build):
    """tools/tour.py --write-readmes (the tables and docs/tour/'s pictures); why it failed, or []."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tour.py"), "--build", build,
                        "--write-readmes"], capture_output=True, text=True)
    return [] if r.returncode == 0 else [f"tools/tour.py --write-readmes failed: {(r.stderr or r.stdout).strip()}"]


def stale_lab_references():
    return lab_refs.check_all()[1]


def broken_links():
    return [f"{rel}: ({target}): {why}" for rel, target, why in check_links.broken_links(ROOT)]


def check(build=None, tour_failed=None, with_tour=True):
    """[(part, [problem])] of every part that is not current. tour_failed:
    what write_tour returned, when the tables were just written (then the
    tour is not run again); with_tour=False: the tables are checked
    elsewhere (the tour test, on the runs it makes)."""
    parts = [("stage diffs", stale_stage_diffs()), ("reading lists", stale_reading_lists())]
    if build and with_tour and tour_failed is None:
        stale, failed = check_tour(build)
        parts += [("tour tables", stale), ("tour run", failed)]
    elif tour_failed:
        parts.append(("tour run", tour_failed))
    if build:
        parts.append(("idea pictures", idea_pictures.stale(build)))
    parts += [("lab references", stale_lab_references()), ("links", broken_links())]
    return [(name, problems) for name, problems in parts if problems]


def write(build=None):
    """Rewrites the generated parts; returns write_tour's failures (None without a build)."""
    stage_diffs.write(ROOT)
    reading_list.main_write()
    if build:
        idea_pictures.write(build, idea_pictures.OUT)
    return write_tour(build) if build else None


def report(stale, build):
    for name, problems in stale:
        for p in problems:
            print(f"{name}: {p}")
    generated = {"stage diffs", "reading lists", "tour tables"}
    by_hand = {"lab references", "links"}
    if any(name in generated for name, _ in stale):
        print(f"docs: stale; refresh the generated parts with: {command(build)}")
    if any(name in by_hand for name, _ in stale):
        print("docs: the lab references and links above are written by hand: change the lines named")
    if any(name == "tour run" for name, _ in stale):
        print("docs: the tour did not run, so its tables were not checked: fix what it says, then check again")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Check or rewrite every generated part of the documents.")
    ap.add_argument("mode", choices=["check", "write"])
    ap.add_argument("--build", help="the build folder: also the tour tables, which are a run's numbers")
    args = ap.parse_args(argv)
    if args.build and not os.path.isdir(args.build):
        print(f"docs.py: error: --build {args.build}: no such folder (build first: scripts/build.sh)",
              file=sys.stderr)
        return 2
    tour_failed = write(args.build) if args.mode == "write" else None
    stale = check(args.build, tour_failed)
    if stale:
        report(stale, args.build)
        return 1
    print("docs: every generated part is current" + ("" if args.build else " (the tour tables need --build)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
