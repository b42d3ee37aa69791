#!/usr/bin/python3
"""plot_run.py: plot and tabulate zero-to-fsdp run logs (the `--log-json` files).

Compare runs of any stage, number of ranks or precision side by side. For each
run log given, the PNG shows

  1. the loss against the step (one line per log, labelled
     "stage NN (exe), N ranks, precision"), and the held-out loss of each
     evaluation (--val-every) as dashed points at the steps it followed;
  2. the peak device memory per rank, as a bar stacked by category (params,
     grads, optimizer, activations, comm, workspace), rank 0 only unless
     --all-ranks; a black tick marks the peak of the total, which is below the
     top of the stack when the categories peaked at different times;
  3. the communication per rank per step (ring-model bytes sent), stacked by
     collective, for the same ranks.

The same summary is printed to stdout as plain text tables.

Run it with Debian's matplotlib (python3-matplotlib), no display needed:

    build/00_data_parallel/dp --model tiny --ranks 2 --steps 30 --log-json /tmp/a.jsonl
    build/00_data_parallel/dp --model tiny --ranks 4 --precision bf16 --log-json /tmp/b.jsonl
    /usr/bin/python3 tools/plot_run.py /tmp/a.jsonl /tmp/b.jsonl -o runs.png

Options: -o FILE (default runs.png), --all-ranks, --place device|host (host for
the offload stage), --no-plot (tables only). The run log format is in docs/SPEC.md,
"Run log". A log without its final summary line (a run that failed or was cut
short) or a missing file is an error naming the file; exit status 1.
"""
import argparse
import json
import os
import sys

CATEGORIES = ["params", "grads", "optimizer", "activations", "comm", "workspace", "gathered"]
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"]
STAGE_NUMBERS = {"dp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 4, "offload": 5}
SUMMARY_KEYS = ["stage", "ranks", "precision", "params", "memory", "comm"]

# Memory categories in blues/greens/greys (model states darker), collectives in warm
# colours, so that the two bar charts cannot be confused.
CATEGORY_COLOURS = {
    "params": "#1f4e79", "grads": "#2e75b6", "optimizer": "#9dc3e6",
    "activations": "#548235", "comm": "#a9d18e", "workspace": "#a6a6a6",
}
COLLECTIVE_COLOURS = {
    "all_reduce": "#c55a11", "reduce_scatter": "#f4b183", "all_gather": "#7030a0",
    "broadcast": "#ffd966", "barrier": "#7f6000",
}
EXTRA_COLOURS = ["#ff0000", "#00b0f0", "#00b050", "#ff66cc", "#663300"]


class LogError(Exception):
    """A run log that cannot be used; the message names the file."""


def format_bytes(n):
    """Bytes as the trainer prints them: 535.00 KiB, 2.09 MiB (binary units)."""
    n = float(n)
    if n < 1024:
        return f"{n:.0f} B"
    v, units = n / 1024.0, ["KiB", "MiB", "GiB", "TiB"]
    u = 0
    while v >= 1024.0 and u < len(units) - 1:
        v /= 1024.0
        u += 1
    return f"{v:.2f} {units[u]}"


def byte_unit(max_bytes):
    """The (divisor, name) that puts max_bytes between 1 and 1024."""
    divisor, name = 1.0, "B"
    for unit in ["KiB", "MiB", "GiB", "TiB"]:
        if max_bytes < divisor * 1024:
            break
        divisor *= 1024.0
        name = unit
    return divisor, name


def stage_label(stage):
    """'stage 00 (dp)' for the executable name the log records; a number as is."""
    if isinstance(stage, (int, float)) and not isinstance(stage, bool):
        return f"stage {int(stage):02d}"
    if stage in STAGE_NUMBERS:
        return f"stage {STAGE_NUMBERS[stage]:02d} ({stage})"
    return f"stage {stage}"


class Run:
    """One run log: its steps and its summary."""

    def __init__(self, path, steps, summary, val=()):
        self.path = path
        self.steps = steps  # list of (step, loss)
        self.val = list(val)  # list of (steps done, held-out loss)
        self.s = summary
        self.label = self.base_label()

    def base_label(self):
        s = self.s
        ranks = s["ranks"]
        return f"{stage_label(s['stage'])}, {ranks} rank{'s' if ranks != 1 else ''}, {s['precision']}"

    def memory(self, rank_entry, place):
        """{category: peak bytes} and the peak of the total for one rank and place."""
        p = rank_entry.get(place, {})
        peaks = {}
        for cat, v in p.items():
            if isinstance(v, dict) and "peak" in v:
                peaks[cat] = v["peak"]
        return peaks, p.get("peak_total"), p.get("model_states")


def load_run(path):
    """Reads one run log, or raises LogError saying which file and what is wrong."""
    if not os.path.exists(path):
        raise LogError(f"{path}: no such file")
    if os.path.isdir(path):
        raise LogError(f"{path}: is a folder, not a run log")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as e:
        raise LogError(f"{path}: cannot read it ({e})") from None
    steps, val, summary = [], [], None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            last = i == len(lines) or not any(l.strip() for l in lines[i:])
            hint = " (the last line is cut short: did the run stop while writing?)" if last else ""
            raise LogError(f"{path}, line {i}: not valid JSON: {e.msg}{hint}") from None
        if not isinstance(obj, dict):
            raise LogError(f"{path}, line {i}: expected a JSON object, found {type(obj).__name__}")
        if "summary" in obj:
            if summary is not None:
                raise LogError(f"{path}, line {i}: a second summary (two runs written to one file?)")
            summary = obj["summary"]
        elif "step" in obj and "loss" in obj:
            steps.append((obj["step"], obj["loss"]))
        elif isinstance(obj.get("val"), dict) and "after_step" in obj["val"] and "loss" in obj["val"]:
            val.append((obj["val"]["after_step"], obj["val"]["loss"]))
        elif isinstance(obj.get("sample"), dict):
            pass  # a text sample: nothing to draw
        else:
            raise LogError(f"{path}, line {i}: neither a step (step, loss, ms, tokens_per_s), an evaluation "
                           f"(val), a sample nor a summary; keys: {', '.join(sorted(obj)) or 'none'}")
    if summary is None:
        if not steps:
            what = "it is empty" if not any(l.strip() for l in lines) else "it has no step lines either"
            raise LogError(f"{path}: not a finished run log: no final summary line and {what} "
                           f"(the run failed before its first step, or this is not a --log-json file)")
        raise LogError(f"{path}: no final {{\"summary\": ...}} line after {len(steps)} step line(s) "
                       f"(last step {steps[-1][0]}): the run failed or was stopped before it finished")
    if not isinstance(summary, dict):
        raise LogError(f"{path}: the summary is not a JSON object")
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise LogError(f"{path}: the summary lacks {', '.join(missing)} (a log from an older trainer?)")
    for key in ("memory", "comm"):
        if not isinstance(summary[key], list) or not summary[key]:
            raise LogError(f"{path}: the summary's \"{key}\" should be a non-empty list, one entry per rank")
    return Run(path, steps, summary, val)


def unique_labels(runs):
    """Adds the model, then the file name, then the position, to labels that would otherwise repeat."""
    def repeats():
        seen = {}
        for r in runs:
            seen[r.label] = seen.get(r.label, 0) + 1
        return {l for l, n in seen.items() if n > 1}
    dup = repeats()
    for r in runs:
        if r.label in dup and r.s.get("model"):
            r.label += f", {r.s['model']}"
    dup = repeats()
    for r in runs:
        if r.label in dup:
            r.label += f" [{os.path.basename(r.path)}]"
    dup = repeats()
    for i, r in enumerate(runs, 1):
        if r.label in dup:
            r.label += f" #{i}"  # the same file given twice, or two folders' logs of one name


def selected_ranks(run, all_ranks, key):
    entries = sorted(run.s[key], key=lambda e: e.get("rank", 0))
    return entries if all_ranks else entries[:1]


def ordered(known, found):
    """The known names in their order, then any others the log holds, sorted."""
    return [k for k in known if k in found] + sorted(k for k in found if k not in known)


# ------------------------------------------------------------------ text tables

def print_table(header, rows, out, left=(0,)):
    """Columns padded to their widest cell: those in left aligned left, the rest right."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    for row in [header] + rows:
        cells = []
        for i, (c, w) in enumerate(zip(row, widths)):
            cells.append(str(c).ljust(w) if i in left else str(c).rjust(w))
        print("  ".join(cells).rstrip(), file=out)


def print_tables(runs, all_ranks, place, out=sys.stdout):
    rows = []
    for r in runs:
        s = r.s
        final = r.steps[-1][1] if r.steps else s.get("final_loss")
        rows.append([r.label, r.path, s.get("model", "-"), s["params"],
                     s.get("steps", len(r.steps)),
                     f"{final:.4f}" if isinstance(final, (int, float)) else "-",
                     f"{r.val[-1][1]:.4f}" if r.val else "-",
                     f"{s['median_ms']:.2f}" if "median_ms" in s else "-",
                     f"{s['tokens_per_s']:.0f}" if "tokens_per_s" in s else "-",
                     s.get("param_hash", "-")])
    print("runs", file=out)
    print_table(["run", "file", "model", "P", "steps", "final loss", "val loss", "median ms", "tokens/s",
                 "param hash"], rows, out, left=(0, 1, 2, 9))

    which = "all ranks" if all_ranks else "rank 0"
    print(f"\npeak {place} memory per rank by category ({which}; "
          f"'peak total' is the peak of the sum, 'model states' is at the end of the run)", file=out)
    cats = ordered(CATEGORIES, {c for r in runs for e in r.s["memory"]
                                for c, v in e.get(place, {}).items() if isinstance(v, dict)})
    rows = []
    for r in runs:
        for e in selected_ranks(r, all_ranks, "memory"):
            peaks, total, states = r.memory(e, place)
            per_p = (f"{states / r.s['params']:.2f}P" if states is not None and r.s["params"] else "-")
            rows.append([r.label, e.get("rank", "?")] + [format_bytes(peaks.get(c, 0)) for c in cats] +
                        [format_bytes(total) if total is not None else "-",
                         format_bytes(states) if states is not None else "-", per_p])
    print_table(["run", "rank"] + cats + ["peak total", "model states", "/ P"], rows, out)

    print(f"\ncommunication per rank per step, ring-model bytes sent ({which})", file=out)
    colls = ordered(COLLECTIVES, {k for r in runs for e in r.s["comm"] for k in e.get("by_collective", {})})
    rows = []
    for r in runs:
        for e in selected_ranks(r, all_ranks, "comm"):
            by = e.get("by_collective", {})
            rows.append([r.label, e.get("rank", "?"), format_bytes(e.get("bytes_per_step", sum(by.values())))] +
                        [format_bytes(by[k]) if k in by else "-" for k in colls])
    print_table(["run", "rank", "total"] + colls, rows, out)


# ------------------------------------------------------------------ the figure

def bar_positions(runs, all_ranks, key):
    """x position and tick label of each bar, runs separated by a gap."""
    xs, labels, groups, x = [], [], [], 0.0
    for r in runs:
        entries = selected_ranks(r, all_ranks, key)
        start = x
        for e in entries:
            xs.append((r, e, x))
            labels.append(f"r{e.get('rank', '?')}" if all_ranks else "")
            x += 1.0
        groups.append((r, start, x - 1.0))
        x += 1.2 if all_ranks else 0.6
    return xs, labels, groups


def label_groups(ax, groups, all_ranks, fontsize):
    """Names each run under its group of bars (the tick labels hold the ranks)."""
    def stacked(label):
        return "\n".join(label.split(", "))
    if all_ranks:
        for r, a, b in groups:
            ax.annotate(stacked(r.label), xy=((a + b) / 2, 0), xycoords=("data", "axes fraction"),
                        xytext=(0, -16), textcoords="offset points", ha="center", va="top", fontsize=fontsize)
    else:
        ax.set_xticks([(a + b) / 2 for _, a, b in groups])
        ax.set_xticklabels([stacked(r.label) for r, _, _ in groups], fontsize=fontsize)


def label_values(ax, values, fontsize):
    """Writes each bar's size above it, or once above a run's bars when its ranks agree.

    values: (run, x, bytes, bar top in axis units) per bar, a run's bars together."""
    groups = {}
    for r, x, b, top in values:
        groups.setdefault(id(r), []).append((x, b, top))
    for bars in groups.values():
        if len({format_bytes(b) for _, b, _ in bars}) == 1:
            xs = [x for x, _, _ in bars]
            ax.annotate(format_bytes(bars[0][1]), ((min(xs) + max(xs)) / 2, max(t for _, _, t in bars)),
                        xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=fontsize)
        else:
            for x, b, top in bars:
                ax.annotate(format_bytes(b), (x, top), xytext=(0, 3), textcoords="offset points",
                            ha="center", va="bottom", fontsize=fontsize, rotation=90)


def plot(runs, all_ranks, place, out_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    n_bars = sum(len(selected_ranks(r, all_ranks, "memory")) for r in runs)
    units = n_bars + (1.2 if all_ranks else 0.6) * (len(runs) - 1)  # bar widths along each bar chart's axis
    width = max(12.0, min(36.0, 5.0 + 1.1 * units))
    fig = plt.figure(figsize=(width, 11), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1.25])
    ax_loss = fig.add_subplot(grid[0, :])
    ax_mem = fig.add_subplot(grid[1, 0])
    ax_comm = fig.add_subplot(grid[1, 1])
    small = 8 if len(runs) > 4 else 9

    # 1. loss against step
    for r in runs:
        if r.steps:
            xs, ys = zip(*r.steps)
            marker = "o" if len(xs) <= 40 else None
            line, = ax_loss.plot(xs, ys, label=f"{r.label}  (final {ys[-1]:.4f})", marker=marker, markersize=3,
                                 linewidth=1.4)
            if r.val:
                vx, vy = zip(*r.val)
                ax_loss.plot(vx, vy, linestyle="--", marker="s", markersize=4, color=line.get_color(),
                             label=f"{r.label}, held out  (final {vy[-1]:.4f})")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (global-batch mean)")
    ax_loss.set_title("Training loss" + (" and held-out loss (dashed)" if any(r.val for r in runs) else ""))
    ax_loss.grid(True, alpha=0.3)
    ax_loss.legend(fontsize=small, loc="upper right")

    which = "all ranks" if all_ranks else "rank 0"

    # 2. peak memory by category, stacked
    bars, tick_labels, groups = bar_positions(runs, all_ranks, "memory")
    found = {c for r, e, _ in bars for c in r.memory(e, place)[0]}
    cats = ordered(CATEGORIES, found)
    extra = iter(EXTRA_COLOURS)
    colours = {c: CATEGORY_COLOURS.get(c) or next(extra, "#000000") for c in cats}
    tops = [max(sum(r.memory(e, place)[0].values()), r.memory(e, place)[1] or 0) for r, e, _ in bars]
    divisor, unit = byte_unit(max(tops + [1]))
    values = []
    for r, e, x in bars:
        peaks, total, _ = r.memory(e, place)
        bottom = 0.0
        for c in cats:
            h = peaks.get(c, 0) / divisor
            if h > 0:
                ax_mem.bar(x, h, bottom=bottom, color=colours[c], width=0.7, edgecolor="white", linewidth=0.5)
                bottom += h
        if total is not None:
            ax_mem.plot([x - 0.45, x + 0.45], [total / divisor] * 2, color="black", linewidth=2)
        values.append((r, x, max(total or 0, bottom * divisor), max(bottom, (total or 0) / divisor)))
    label_values(ax_mem, values, small - 1)
    ax_mem.set_xticks([x for _, _, x in bars] if all_ranks else [])
    if all_ranks:
        ax_mem.set_xticklabels(tick_labels, fontsize=small)
    label_groups(ax_mem, groups, all_ranks, small)
    ax_mem.set_ylabel(f"peak {place} memory ({unit})")
    ax_mem.set_title(f"Peak {place} memory per rank, by category ({which})")
    ax_mem.grid(True, axis="y", alpha=0.3)
    ax_mem.margins(y=0.12)
    held = {c for r, e, _ in bars for c, v in r.memory(e, place)[0].items() if v}
    handles = [Patch(color=colours[c], label=c if c in held else f"{c} (0 bytes)") for c in reversed(cats)]
    handles.append(Line2D([], [], color="black", linewidth=2, label="peak of the total"))
    ax_mem.legend(handles=handles, fontsize=small, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if not cats:
        ax_mem.text(0.5, 0.5, f"no {place} memory recorded", transform=ax_mem.transAxes, ha="center")

    # 3. communication per step by collective, stacked
    bars, tick_labels, groups = bar_positions(runs, all_ranks, "comm")
    colls = ordered(COLLECTIVES, {k for _, e, _ in bars for k in e.get("by_collective", {})})
    extra = iter(EXTRA_COLOURS)
    ccolours = {k: COLLECTIVE_COLOURS.get(k) or next(extra, "#000000") for k in colls}
    totals = [e.get("bytes_per_step", sum(e.get("by_collective", {}).values())) for _, e, _ in bars]
    divisor, unit = byte_unit(max(totals + [1]))
    values = []
    for (r, e, x), total in zip(bars, totals):
        by = e.get("by_collective", {})
        bottom = 0.0
        for k in colls:
            h = by.get(k, 0) / divisor
            if h > 0:
                ax_comm.bar(x, h, bottom=bottom, color=ccolours[k], width=0.7, edgecolor="white", linewidth=0.5)
                bottom += h
        values.append((r, x, total, bottom))
    label_values(ax_comm, values, small - 1)
    ax_comm.set_xticks([x for _, _, x in bars] if all_ranks else [])
    if all_ranks:
        ax_comm.set_xticklabels(tick_labels, fontsize=small)
    label_groups(ax_comm, groups, all_ranks, small)
    ax_comm.set_ylabel(f"ring-model bytes sent per step ({unit})")
    ax_comm.set_title(f"Communication per rank per step, by collective ({which})")
    ax_comm.grid(True, axis="y", alpha=0.3)
    ax_comm.margins(y=0.12)
    # A collective that was called but moved no bytes (a barrier) has no bar; the legend says so.
    moved = {k for _, e, _ in bars for k, v in e.get("by_collective", {}).items() if v}
    handles = [Patch(color=ccolours[k], label=k if k in moved else f"{k} (0 bytes)") for k in reversed(colls)]
    if handles:
        ax_comm.legend(handles=handles, fontsize=small, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if not any(totals):
        ax_comm.text(0.5, 0.5, "no communication (1 rank)", transform=ax_comm.transAxes, ha="center")

    fig.suptitle("zero-to-fsdp runs: " + ", ".join(os.path.basename(r.path) for r in runs), fontsize=11)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Plot and tabulate zero-to-fsdp run logs (--log-json files): loss, peak memory "
                    "by category, communication by collective.")
    ap.add_argument("logs", nargs="+", metavar="LOG", help="run log(s) written by --log-json")
    ap.add_argument("-o", "--output", default="runs.png", metavar="FILE", help="PNG to write (default runs.png)")
    ap.add_argument("--all-ranks", action="store_true", help="memory and communication of every rank, not rank 0")
    ap.add_argument("--place", choices=["device", "host"], default="device",
                    help="which place's memory to chart (default device; host for the offload stage)")
    ap.add_argument("--no-plot", action="store_true", help="print the tables only")
    args = ap.parse_args(argv)

    runs, errors = [], []
    for path in args.logs:
        try:
            runs.append(load_run(path))
        except LogError as e:
            errors.append(str(e))
    if errors:
        for e in errors:
            print(f"plot_run.py: error: {e}", file=sys.stderr)
        print(f"plot_run.py: {len(errors)} of {len(args.logs)} run log(s) unusable; nothing written",
              file=sys.stderr)
        return 1

    unique_labels(runs)
    try:
        print_tables(runs, args.all_ranks, args.place)
        sys.stdout.flush()
    except BrokenPipeError:  # piped into head: still write the PNG
        sys.stdout = open(os.devnull, "w")
    if not args.no_plot:
        try:
            plot(runs, args.all_ranks, args.place, args.output)
        except OSError as e:
            print(f"plot_run.py: error: cannot write {args.output}: {e.strerror}", file=sys.stderr)
            return 1
        print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
