"""tour_plots.py: the tour's pictures (tools/tour.py), drawn with matplotlib
(Agg, no display needed) from the tour's records, traces and the memory
estimator:

  loss.png         loss against step, one line per group of runs whose
                   losses (and held-out losses, the squares) are the same
                   at every step (the point: one line)
  memory.png       device bytes per rank by category, per run, with the
                   formula's model states marked
  stage_NN.png     the same for stages 00 to NN only (each stage README's)
  comm.png         bytes sent per rank per step, by collective, per run,
                   with the formula's total marked
  timeline_03.png, timeline_04.png
                   one step of stages 03 and 04, every rank (tools/trace_gantt.py)
  fits.png         the largest model each stage fits on an 80 GB device
                   against the number of ranks (memory_estimate --fit)
"""
import argparse
import json
import os
import subprocess
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import plot_run  # noqa: E402
import trace_gantt  # noqa: E402

CATEGORY_COLOURS = dict(plot_run.CATEGORY_COLOURS, gathered="#f8cbad")
# Persistent model states first, then what comes and goes.
STACK = ["params", "grads", "optimizer", "activations", "gathered", "comm", "workspace"]
STAGE_COLOURS = {"dp": "#c00000", "zero1": "#ed7d31", "zero2": "#ffc000", "zero3": "#70ad47", "fsdp": "#4472c4",
                 "offload": "#7030a0"}
# The "what fits" chart: by default an H100/A100-80GB's memory, the bf16 recipe, one
# sequence of 1024 tokens per rank with full recomputation (docs/SPEC.md §7),
# activations in bf16 as on a GPU (--device cuda resolves --compute auto so).
FIT = {"device_mem": "80GB", "ranks": "1,2,4,8,16,32,64,128,256,512,1024", "batch": "1", "recompute": "full",
       "precision": "bf16", "device": "cuda"}


# The stack puts each category at its own peak, and those need not come at
# one moment: the black line, the peak of their sum, can sit below the top.
MEMORY_TITLE = ("device memory per rank, {what}: model states as held, the others at their own peaks\n"
                "(red: the formula's model states; black: the peak of the total, all categories at once)")


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def loss_chart(records, path):
    groups = []  # [losses, held-out losses, [keys]]
    for r in records:
        for g in groups:
            if g[0] == r["losses"] and g[1] == r["val"]:
                g[2].append(r["key"])
                break
        else:
            groups.append([r["losses"], r["val"], [r["key"]]])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (losses, val, keys) in enumerate(groups):
        line, = ax.plot(range(len(losses)), losses, lw=2.5 if i == 0 else 1.2, ls="-" if i == 0 else "--",
                        label=("runs " if len(keys) > 1 else "run ") + ", ".join(keys))
        if val:  # after s steps: beside the loss of step s, computed on the same parameters
            ax.plot([s for s, _ in val], [v for _, v in val], ls="none", marker="s", ms=7 if i == 0 else 4,
                    color=line.get_color(), label="held-out loss" if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    n = len(records)
    ax.set_title(f"{n} runs, {len(groups)} line{'s' if len(groups) != 1 else ''}: "
                 + ("every run's loss is stage 00's at every step" if len(groups) == 1 else
                    "runs on one line have the same loss at every step"))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save(fig, path)


def stacked_chart(records, path, title, ylabel, parts, colours, formula, formula_label, peak=None):
    """One bar per run, stacked by parts(r) (name -> bytes), with the formula's
    value (formula(r), or None) in red and, when given, peak(r) in black."""
    width = max(6.5, 2.8 + 0.9 * len(records))
    fig, ax = plt.subplots(figsize=(width, 4.8))
    # A narrow chart (the first stages' alone) wraps its title rather than cut it off.
    title = "\n".join(textwrap.fill(line, int(width * 9)) for line in title.split("\n"))
    top = max(max(sum(parts(r).values()), peak(r) if peak else 0) for r in records) or 1
    div, unit = plot_run.byte_unit(top)
    for i, r in enumerate(records):
        bottom = 0.0
        for name, v in parts(r).items():
            if v:
                ax.bar(i, v / div, bottom=bottom / div, color=colours[name],
                       label=name if name not in ax.get_legend_handles_labels()[1] else None)
            bottom += v
        est = formula(r)
        if est is not None:
            ax.plot([i - 0.45, i + 0.45], [est / div] * 2, color="red", lw=2, label=formula_label if i == 0 else None)
        if peak:
            ax.plot([i - 0.3, i + 0.3], [peak(r) / div] * 2, color="black", lw=1.5,
                    label="peak of the total" if i == 0 else None)
    ax.set_xticks(range(len(records)))
    ax.set_xticklabels([r["key"].replace(" ", "\n", 1) for r in records], fontsize=8)
    ax.set_ylabel(f"{ylabel} ({unit})")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never on them
    save(fig, path)


def memory_parts(r):
    """The persistent model states as held, the other categories at their peaks."""
    return {c: r["device_states"][c] if c in ("params", "grads", "optimizer") else r["device"].get(c, 0)
            for c in STACK}


def memory_chart(records, path, title):
    stacked_chart(records, path, title, "device bytes per rank", memory_parts, CATEGORY_COLOURS,
                  lambda r: r["estimate"].get("device", {}).get("model_states"), "formula's model states",
                  peak=lambda r: r["device_peak"])


def comm_chart(records, path):
    stacked_chart(records, path, "communication per rank per step, by collective (ring model)",
                  "bytes sent per rank per step",
                  lambda r: {c: r["comm"]["by_collective"].get(c, 0) for c in plot_run.COLLECTIVES},
                  plot_run.COLLECTIVE_COLOURS,
                  lambda r: r["estimate"].get("comm_bytes_per_step", {}).get("total"), "formula")


def timeline(trace, path, title):
    events = trace_gantt.load_trace(trace)
    steps = trace_gantt.steps_of(events)
    step = steps[1] if len(steps) > 1 else steps[0]  # step 0 carries the warm-up
    trace_gantt.draw(trace_gantt.rows_of(events, step), trace_gantt.memory_of(events), path, title, step)


def fits(build, device_mem):
    """memory_estimate --fit's records, at the tour's model family."""
    cmd = [os.path.join(build, "tools", "memory_estimate"), "--fit", device_mem, "--ranks", FIT["ranks"],
           "--batch", FIT["batch"], "--recompute", FIT["recompute"], "--precision", FIT["precision"],
           "--device", FIT["device"], "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {r.returncode}): {r.stderr.strip()}")
    return json.loads(r.stdout), cmd


def fits_chart(doc, path):
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    by_stage = {}
    for f in doc["fits"]:
        by_stage.setdefault(f["stage"], []).append((f["ranks"], f["params"]))
    for stage, pts in by_stage.items():
        pts.sort()
        # ZeRO-3 and FSDP fit the same models: dashes let both lines show.
        ax.plot([p[0] for p in pts], [max(p[1], 1) / 1e9 for p in pts], marker="o", ms=3,
                color=STAGE_COLOURS.get(stage), ls="--" if stage == "fsdp" else "-", lw=1.5,
                label=stage + (" (device only: the host's memory is not limited here)" if stage == "offload" else ""))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks (GPUs)")
    ax.set_ylabel("largest model that fits (billion parameters)")
    mem = doc.get("device_mem", 0) / 1e9
    ax.set_title(f"what fits in {mem:.0f} GB per GPU: {FIT['precision']} recipe, compute {doc.get('compute', '?')}, "
                 f"batch {FIT['batch']} sequence per rank, --recompute {FIT['recompute']}\n"
                 f"{doc.get('family', '')}", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fits_of = {(f["stage"], f["ranks"]): f["params"] for f in doc["fits"]}
    below = sorted(n for (s, n), p in fits_of.items() if s == "fsdp" and p < fits_of.get(("zero3", n), 0))
    if below:  # the device peaks are exact, so a gap between the two is a real difference
        ax.text(0.99, 0.09, f"FSDP below ZeRO-3 at N = {', '.join(map(str, below))}: its bf16 cast of each shard "
                "before the all-gather\nand its float32 widening of each reduced piece are buffers ZeRO-3 does "
                "not have, and large when N is small", transform=ax.transAxes, ha="right", va="bottom", fontsize=7)
    save(fig, path)


def draw_all(records, out, build, fit_mem=FIT["device_mem"]):
    loss_chart(records, os.path.join(out, "loss.png"))
    memory_chart(records, os.path.join(out, "memory.png"), MEMORY_TITLE.format(what="per run"))
    for k in range(6):
        key = f"{k:02d}"
        mine = [r for r in records if r["key"][:2] <= key]
        what = "stage 00" if k == 0 else f"stages 00 to {key}"
        memory_chart(mine, os.path.join(out, f"stage_{key}.png"), MEMORY_TITLE.format(what=what))
    comm_chart(records, os.path.join(out, "comm.png"))
    for key in ("03", "04"):
        trace = os.path.join(out, "traces", key + ".json")
        timeline(trace, os.path.join(out, f"timeline_{key}.png"), f"stage {key}, one step, every rank")
    doc, _ = fits(build, fit_mem)
    fits_chart(doc, os.path.join(out, "fits.png"))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Draw the tour's pictures from its output folder's tour.json.")
    ap.add_argument("out", help="the tour's output folder (tour.json, traces/); the pictures go there")
    ap.add_argument("--build", default="build", help="the build folder, for tools/memory_estimate")
    ap.add_argument("--fit-mem", default=FIT["device_mem"], help="fits.png's device memory (memory_estimate --fit)")
    args = ap.parse_args(argv)
    with open(os.path.join(args.out, "tour.json"), encoding="utf-8") as f:
        records = json.load(f)["runs"]
    draw_all(records, args.out, args.build, args.fit_mem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
