#!/usr/bin/env python3
"""tour.py: every stage side by side, in one command.

Runs stages 00-05 and the notable modes of 04 and 05 on the same model, data,
ranks and seed, and prints the table the project exists for: per run, the
final loss and whether it is stage 00's to the bit, the model-state bytes
per rank by category beside the formula (tools/memory_estimate, the same
formulas the stage tests hold the trainers to), the peak device bytes and
activations, the bytes each collective sends per step beside the formula
(and, under hybrid sharding, how much of it crosses the shard groups), the
host<->device copies of stage 05, and the step time. Every number comes from
a run log (--log-json) or from the estimator's --json; none is typed here.

    tools/tour.py                       # tiny, 4 ranks, bf16, 20 steps -> tour/
    tools/tour.py --model small --steps 50 --out /tmp/t
    tools/tour.py --write-readmes       # refresh the READMEs' tables and docs/tour/
    tools/tour.py --check-readmes       # exit 1 if those are stale (scripts/docs.py check, the `docs` test)

The output folder gets logs/ (one run log per run), traces/ (stages 03 and
04), tour.md (the tables), tour.json (every number, per run) and the
pictures (tools/tour_plots.py; needs matplotlib, else --no-plots). A folder
that holds anything but an earlier tour's output is refused, so no other
file is ever overwritten.

Exit status: 0 done (and fresh, with --check-readmes), 1 a run failed or the
READMEs are stale, 2 a usage error.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
import plot_run  # noqa: E402
import tour_readme  # noqa: E402

# key, stage executable, its folder, the flags that make the mode, what it shows.
RUNS = [
    ("00", "dp", "00_data_parallel", [], "every rank keeps everything"),
    ("01", "zero1", "01_zero1", [], "optimizer state sharded"),
    ("02", "zero2", "02_zero2", [], "and the gradients"),
    ("03", "zero3", "03_zero3", [], "and the parameters, gathered per unit"),
    ("04", "fsdp", "04_fsdp", [], "flat units, float32 shards, prefetch"),
    ("04 no reshard", "fsdp", "04_fsdp", ["--reshard-after-forward", "false"], "keep units gathered to the backward"),
    ("04 recompute", "fsdp", "04_fsdp", ["--recompute", "full"], "re-run each block's forward in the backward"),
    ("04 HSDP", "fsdp", "04_fsdp", ["--shard-group", "2"], "shard in groups of 2, replicate across"),
    ("05", "offload", "05_offload", [], "model states on the host, AdamW on the CPU"),
    ("05 params", "offload", "05_offload", ["--offload-params"], "and the parameters too"),
]
TRACED = ("03", "04")  # the runs whose timeline is drawn

# The configuration of the tables in the READMEs and of docs/tour/: small
# enough for CI, and the bf16 recipe, the ZeRO paper's 16 bytes a parameter;
# `wide`, whose model states outweigh its activations, so that what each
# stage saves shows in the memory pictures.
README_CONFIG = {"model": "wide", "ranks": 4, "steps": 20, "batch": 2, "precision": "bf16", "grad_accum": 1}


class TourError(Exception):
    """What went wrong, said once; exit status 1 (a failed run) or 2 (usage)."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


def executable(build, folder, name):
    path = os.path.join(build, folder, name)
    if not os.access(path, os.X_OK):
        raise TourError(f"{path} is missing: build first (ninja -C {build})", 2)
    return path


def common_flags(cfg):
    return ["--model", cfg["model"], "--ranks", str(cfg["ranks"]), "--batch", str(cfg["batch"]),
            "--precision", cfg["precision"], "--grad-accum", str(cfg["grad_accum"])]


def selected_runs(cfg):
    """The runs this configuration can make: HSDP needs groups of 2 and more than one group."""
    runs, skipped = [], []
    for run in RUNS:
        if "--shard-group" in run[3] and (cfg["ranks"] < 4 or cfg["ranks"] % 2):
            skipped.append(f"{run[0]} (needs an even --ranks of 4 or more)")
            continue
        runs.append(run)
    return runs, skipped


def prepare_out(out):
    """Makes the output folder, refusing one that holds anything but a tour's output."""
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise TourError(f"--out {out} is a file: name a folder (it is made if missing)", 2)
        mine = {"logs", "traces", "tour.md", "tour.json"} | set(TOUR_PICTURES)
        foreign = sorted(set(os.listdir(out)) - mine)
        if foreign:
            raise TourError(f"--out {out} already holds {', '.join(foreign[:3])}"
                            f"{' ...' if len(foreign) > 3 else ''}, which a tour did not write: "
                            "name a new or empty folder", 2)
    # An earlier tour's pictures and traces would outlive this run's tables
    # (with --no-plots, or other flags): remove them first.
    for name in TOUR_PICTURES:
        if os.path.isfile(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    for sub in ("logs", "traces"):
        folder = os.path.join(out, sub)
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                if name.endswith((".jsonl", ".json")):
                    os.remove(os.path.join(folder, name))
    for sub in ("", "logs", "traces"):
        try:
            os.makedirs(os.path.join(out, sub), exist_ok=True)
        except OSError as e:
            raise TourError(f"cannot make the folder {os.path.join(out, sub)}: {e.strerror}", 2) from None
    probe = os.path.join(out, ".write-test")
    try:
        with open(probe, "w") as f:
            f.write("x")
        os.remove(probe)
    except OSError as e:
        raise TourError(f"cannot write into --out {out}: {e.strerror}", 2) from None


TOUR_PICTURES = ["loss.png", "memory.png", "comm.png", "timeline_03.png", "timeline_04.png", "fits.png"] + [
    f"stage_{key}.png" for key in ("00", "01", "02", "03", "04", "05")]


def progress(text, tty, end=False):
    if tty:
        sys.stdout.write("\r\033[K" + text + ("\n" if end else ""))
    elif end:
        sys.stdout.write(text + "\n")
    sys.stdout.flush()


def train(run, index, total, cfg, build, out, tty):
    """Runs one stage; returns the path of its run log."""
    key, name, folder, flags, _ = run
    slug = key.replace(" ", "_")
    log = os.path.join(out, "logs", slug + ".jsonl")
    # The held-out loss halfway and at the end, on two batches: the loss picture's squares.
    cmd = [executable(build, folder, name)] + common_flags(cfg) + flags + [
        "--steps", str(cfg["steps"]), "--val-every", str(max(1, cfg["steps"] // 2)), "--val-batches", "2",
        "--log-every", "1", "--log-json", log]
    if key in TRACED:
        cmd += ["--trace", os.path.join(out, "traces", slug + ".json")]
    head = f"[{index}/{total}] {key:<14}"
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for line in proc.stdout:
        # "step     7/20 | loss ... | ETA 1.2s": the step and what is left.
        if line.startswith("step "):
            fields = [f.strip() for f in line.split("|")]
            progress(f"{head} {fields[0].replace('step', 'step', 1)}, {fields[-1]}", tty)
    err = proc.stderr.read()
    if proc.wait() != 0:
        progress("", tty)
        raise TourError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{err.strip()}")
    progress(f"{head} {cfg['steps']} steps in {time.monotonic() - start:.1f} s", tty, end=True)
    return log, cmd


def estimate(run, cfg, build):
    """The estimator's record for this run's stage and flags."""
    est = os.path.join(build, "tools", "memory_estimate")
    if not os.access(est, os.X_OK):
        raise TourError(f"{est} is missing: build first (ninja -C {build})", 2)
    cmd = [est, "--stage", run[1], "--json"] + common_flags(cfg) + run[3]  # the run's own flags
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise TourError(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr.strip()}")
    stages = json.loads(r.stdout)["stages"]
    if len(stages) != 1:
        raise TourError(f"{' '.join(cmd)} gave {len(stages)} stages, not the one asked for")
    return stages[0], cmd


def shown_path(word, out):
    """A command's word as the tables print it: the output folder as OUT, the
    rest relative to the repository (so the tables do not depend on where
    the tour wrote)."""
    if word.startswith(out.rstrip("/") + "/"):
        return "OUT/" + word[len(out.rstrip("/")) + 1:]
    return os.path.relpath(word, ROOT) if os.path.isabs(word) else word


def record(run, log, cmd, est, dp, out):
    """Everything the tables and pictures show for one run, from its log and estimate."""
    r = plot_run.load_run(log)
    s = r.s
    mem, comm = s["memory"][0], s["comm"][0]
    dev, host = mem["device"], mem["host"]
    losses = [loss for _, loss in r.steps]
    rec = {
        "key": run[0], "stage": run[1], "folder": run[2], "flags": run[3], "what": run[4],
        "command": " ".join(shown_path(c, out) for c in cmd),
        "log": os.path.basename(log), "losses": losses, "final_loss": s["final_loss"], "val": r.val,
        "param_hash": s["param_hash"], "median_ms": s["median_ms"], "params": s["params"],
        "device": {c: dev[c]["peak"] for c in plot_run.CATEGORIES if c in dev},
        "device_model_states": dev["model_states"], "device_peak": dev["peak_total"],
        "host_model_states": host["model_states"], "host_peak": host["peak_total"],
        "comm": {"total": comm["bytes_per_step"], "by_collective": comm["by_collective"],
                 "cross_group": comm.get("cross_group_bytes_per_step", 0)},
        "transfers": comm.get("transfers_per_step", {}),
        "estimate": est,
    }
    # The persistent model states: current bytes at the end (a peak could
    # include a stage's transient copies).
    rec["device_states"] = {c: dev[c]["current"] for c in ("params", "grads", "optimizer")}
    rec["host_states"] = {c: host[c]["current"] for c in ("params", "grads", "optimizer")}
    if dp is None:
        rec["same_as_00"] = True
    else:
        rec["same_as_00"] = rec["param_hash"] == dp["param_hash"] and losses == dp["losses"] and r.val == dp["val"]
    return rec


def run_tour(cfg, build, out, plots=True, tty=None, fit_mem="80GB"):
    """Every run, then tour.json, tour.md and the pictures; returns the records."""
    tty = sys.stdout.isatty() if tty is None else tty
    runs, skipped = selected_runs(cfg)
    if plots:  # a bad --fit-mem is said before any run, not after them all
        est = os.path.join(build, "tools", "memory_estimate")
        if not os.access(est, os.X_OK):
            raise TourError(f"{est} is missing: build first (ninja -C {build})", 2)
        r = subprocess.run([est, "--fit", fit_mem, "--ranks", "1", "--json"], capture_output=True, text=True)
        if r.returncode != 0:
            raise TourError(f"--fit-mem {fit_mem}: " + r.stderr.strip().replace("memory_estimate: error: ", ""), 2)
    prepare_out(out)
    records, dp = [], None
    for i, run in enumerate(runs, 1):
        log, cmd = train(run, i, len(runs), cfg, build, out, tty)
        est, est_cmd = estimate(run, cfg, build)
        rec = record(run, log, cmd, est, dp, out)
        rec["estimate_command"] = " ".join([os.path.relpath(est_cmd[0], ROOT)] + est_cmd[1:])
        dp = dp or rec
        records.append(rec)
    doc = {"config": cfg, "skipped": skipped, "runs": records}
    write_text(os.path.join(out, "tour.json"), json.dumps(doc, indent=1) + "\n")
    write_text(os.path.join(out, "tour.md"), tour_readme.tour_markdown(records, cfg, skipped))
    if plots:
        draw_pictures(out, build, fit_mem)
    return records, skipped


def draw_pictures(out, build, fit_mem):
    """tools/tour_plots.py on tour.json: here when this Python has matplotlib,
    else under the system's Python (Debian's python3-matplotlib) when a
    virtual environment or pyenv shadows it."""
    try:
        import matplotlib  # noqa: F401
        python = sys.executable
    except ImportError:
        python = "/usr/bin/python3"
        probe = subprocess.run([python, "-c", "import matplotlib"], capture_output=True) if os.access(
            python, os.X_OK) else None
        if probe is None or probe.returncode != 0:
            raise TourError("matplotlib is missing for the pictures: apt-get install python3-matplotlib "
                            "(scripts/install_deps.sh does), or run with --no-plots", 2)
    cmd = [python, os.path.join(TOOLS, "tour_plots.py"), out, "--build", build, "--fit-mem", fit_mem]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise TourError(f"drawing the pictures failed ({' '.join(cmd)}):\n{r.stderr.strip()}")


def write_text(path, text):
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise TourError(f"cannot write {path}: {e.strerror}") from None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (default build/)")
    ap.add_argument("--out", help="output folder (default tour/; with --write/--check-readmes a temporary one)")
    for k, v in README_CONFIG.items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=v, help=f"(default {v})")
    ap.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib needed)")
    ap.add_argument("--fit-mem", default="80GB", help="the device memory of fits.png's GPU (default 80GB)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write-readmes", action="store_true",
                      help="run the READMEs' configuration and write their tables and docs/tour/")
    mode.add_argument("--check-readmes", action="store_true",
                      help="run the READMEs' configuration; exit 1 if their tables are stale")
    args = ap.parse_args(argv)
    cfg = {k: getattr(args, k) for k in README_CONFIG}
    try:
        if args.write_readmes or args.check_readmes:
            if cfg != README_CONFIG:
                raise TourError("--write-readmes and --check-readmes run the READMEs' own configuration "
                                f"({tour_readme.config_text(README_CONFIG)}): drop the other flags", 2)
            if args.fit_mem != "80GB":
                raise TourError("--write-readmes and --check-readmes draw the READMEs' 80GB chart: drop --fit-mem", 2)
            if args.no_plots and args.write_readmes:
                raise TourError("--write-readmes also writes docs/tour/'s pictures: drop --no-plots", 2)
            return readmes(args, cfg)
        out = args.out or "tour"
        records, skipped = run_tour(cfg, args.build, out, plots=not args.no_plots, fit_mem=args.fit_mem)
        print()
        print(tour_readme.tour_text(records, cfg, skipped))
        print(f"\nwrote {out}/: tour.md, tour.json, logs/, traces/" + ("" if args.no_plots else ", the pictures"))
        return 0
    except (TourError, plot_run.LogError) as e:
        print(f"tour.py: error: {e}", file=sys.stderr)
        return getattr(e, "status", 1)


def readmes(args, cfg):
    """--write-readmes / --check-readmes."""
    out = args.out or tempfile.mkdtemp(prefix="tour-")
    try:
        records, skipped = run_tour(cfg, args.build, out, plots=not args.no_plots)
        blocks = tour_readme.readme_blocks(records, cfg)
        if args.check_readmes:
            stale = tour_readme.stale_readmes(ROOT, blocks)
            if stale:
                print("tour.py: stale: " + "; ".join(stale) + ". Refresh them with: python3 tools/tour.py "
                      "--write-readmes", file=sys.stderr)
                return 1
            print(f"the READMEs' tour tables are fresh ({len(blocks)} files)")
            return 0
        for name in TOUR_PICTURES + ["tour.md"]:
            os.makedirs(os.path.join(ROOT, "docs", "tour"), exist_ok=True)
            shutil.copyfile(os.path.join(out, name), os.path.join(ROOT, "docs", "tour", name))
        for path in tour_readme.write_readmes(ROOT, blocks):
            print(f"wrote {path}")
        return 0
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
