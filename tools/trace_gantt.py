#!/usr/bin/python3
"""trace_gantt.py: draw a `--trace FILE` timeline as a Gantt chart (PNG).

The trainers' `--trace FILE` writes Chrome trace-event JSON (docs/SPEC.md,
"Timeline"): per rank a "compute" track (each unit's forward and backward,
the optimizer), one track per communication queue ("comm", "comm q1", ...),
a "copy" track where the device copied between host and device (stage 05:
"h2d" and "d2h" spans) and a "device memory" counter; a modeled trace has
a span per op on "compute", a "units" track with each unit's forward and
backward, "host", "host worker" and "disk" tracks where there were any,
and no memory counter. This draws one row per rank and track, the spans
colored by kind (forward, backward, optimizer, each collective, each copy
direction), each collective and copy labelled with its kind and each
unit's span with the unit (turned on its side where the span is narrow),
the compute row's gaps hatched as waits (the queue stood waiting for a
collective, a copy or the host), and below them each rank's total device
bytes over time:

    build/03_zero3/zero3 --ranks 2 --model tiny --steps 2 --trace /tmp/t.json
    /usr/bin/python3 tools/trace_gantt.py /tmp/t.json gantt.png --step 1
    /usr/bin/python3 tools/trace_gantt.py /tmp/o.json o.png --step 1-2 --ranks 0

--step S draws only step S (its compute and the collectives issued in it),
--step S-E steps S to E (what a step waits for from the step before);
--ranks R or R-Q only those ranks (a run of many alike ranks is a tall
picture otherwise).
It needs Debian's matplotlib (python3-matplotlib) and draws with the Agg
backend, no display needed. A missing file, a file that is not JSON or not a
trace, or a step the trace does not hold is an error naming it; exit status 2.
"""
import argparse
import json
import sys

# Compute in blues and greys, collectives in warm colours.
COLORS = {
    "forward": "#4c78a8",
    "backward": "#9ecae9",
    "optimizer": "#54a24b",
    "all_reduce": "#e45756",
    "reduce_scatter": "#f58518",
    "all_gather": "#eeca3b",
    "broadcast": "#b279a2",
    "barrier": "#9d755d",
    "h2d": "#72b7b2",
    "d2h": "#ff9da6",
    "disk": "#8c6d31",
}
LABELS = {"all_reduce": "AR", "reduce_scatter": "RS", "all_gather": "AG", "broadcast": "BC", "barrier": "BAR",
          "h2d": "H2D", "d2h": "D2H", "disk": "DISK"}
NAMED_BY_KIND = ("comm", "copy")  # categories whose spans are named by their kind


class TraceError(Exception):
    pass


def load_trace(path):
    """The trace's event list; TraceError naming the file if it is unusable."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file")
    except OSError as e:
        raise TraceError(f"{path}: cannot read it: {e.strerror}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not JSON ({e})")
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise TraceError(f"{path}: not a trace (no \"traceEvents\" list; is it a --trace FILE?)")
    for e in events:
        if not isinstance(e, dict) or "ph" not in e or "pid" not in e:
            raise TraceError(f"{path}: not a trace (an event without \"ph\" and \"pid\": {str(e)[:80]})")
    return events


def kind_of(e):
    """forward, backward, optimizer, the collective's name, or h2d / d2h."""
    return e["name"] if e.get("cat") in NAMED_BY_KIND else e.get("cat", "")


def span_range(text, flag):
    """"3" -> (3, 3), "1-2" -> (1, 2); TraceError naming the flag otherwise."""
    lo, _, hi = text.partition("-")
    try:
        first, last = int(lo), int(hi or lo)
    except ValueError:
        raise TraceError(f"{flag} wants a number or a range such as 1-2 (got {text!r})")
    if first < 0 or last < first:
        raise TraceError(f"{flag} wants a number or a range such as 1-2, first not above last (got {text!r})")
    return first, last


def rows_of(events, step=None, ranks=None):
    """The chart's rows, rank by rank, tracks in their sort order:
    [((rank, tid), "rank r compute", [span, ...])], each span (start_us,
    dur_us, kind, label); with `step` (a number or a (first, last) pair),
    only those steps' spans; with `ranks` (a (first, last) pair), only
    those ranks' rows."""
    steps = (step, step) if isinstance(step, int) else step
    keep_rank = (lambda pid: True) if ranks is None else (lambda pid: ranks[0] <= pid <= ranks[1])
    names, order = {}, {}
    for e in events:
        if e["ph"] == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e.get("tid", 0))] = e["args"]["name"]
        if e["ph"] == "M" and e.get("name") == "thread_sort_index":
            order[(e["pid"], e.get("tid", 0))] = e["args"]["sort_index"]
    spans = {key: [] for key in names if keep_rank(key[0])}
    for e in events:
        if e["ph"] != "X" or not keep_rank(e["pid"]):
            continue
        s = e.get("args", {}).get("step")
        if steps is not None and not (isinstance(s, int) and steps[0] <= s <= steps[1]):
            continue
        kind = kind_of(e)
        label = LABELS.get(kind, "") if e.get("cat") in NAMED_BY_KIND else ""
        if e["name"].startswith(("fwd ", "bwd ")):  # a unit's forward or backward: the unit
            label = e["name"][4:]
        spans.setdefault((e["pid"], e.get("tid", 0)), []).append((e["ts"], e["dur"], kind, label))
    keys = sorted(spans, key=lambda k: (k[0], order.get(k, k[1]), k[1]))
    return [(k, f"rank {k[0]} {names.get(k, 'tid %d' % k[1])}", sorted(spans[k])) for k in keys]


def waits_of(spans):
    """The gaps between a compute row's spans, from its first to its last:
    [(start_us, dur_us)], where the queue stood waiting."""
    gaps, end = [], None
    for ts, dur, _, _ in sorted(spans):
        if end is not None and ts > end:
            gaps.append((end, ts - end))
        end = ts + dur if end is None else max(end, ts + dur)
    return gaps


def memory_of(events):
    """Per rank, [(ts_us, total device bytes)] from the "device memory" counter."""
    out = {}
    for e in events:
        if e["ph"] == "C" and e.get("name") == "device memory":
            out.setdefault(e["pid"], []).append((e["ts"], sum(e.get("args", {}).values())))
    return {r: sorted(v) for r, v in out.items()}


def steps_of(events):
    return sorted({e["args"]["step"] for e in events
                   if e["ph"] == "X" and isinstance(e.get("args", {}).get("step"), int) and e["args"]["step"] >= 0})


def since(step):
    """The time axis's label: from the run's start, or from the first step drawn's."""
    if step is None:
        return "ms since the run started"
    return "ms since step %d started" % (step if isinstance(step, int) else step[0])


def draw(rows, memory, out_path, title, step=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    # The whole run from its start, or the step from its first span.
    t0 = 0.0 if step is None else min((s[0] for _, _, sp in rows for s in sp), default=0.0)
    t1 = max((s[0] + s[1] for _, _, sp in rows for s in sp), default=1.0)
    width_ms = max(t1 - t0, 1.0) / 1000.0
    if memory:
        fig, (ax, mem_ax) = plt.subplots(2, 1, figsize=(14, 1.0 + 0.55 * len(rows) + 2.2), sharex=True,
                                         gridspec_kw={"height_ratios": [max(len(rows), 1), 2.5]})
    else:  # a trace without the counter (the modeled clock's): the spans alone
        fig, ax = plt.subplots(figsize=(14, 1.0 + 0.55 * len(rows) + 0.6))
        mem_ax = ax
    kinds, waited = set(), False
    for i, (_, name, spans) in enumerate(rows):
        y = len(rows) - 1 - i
        for ts, dur, kind, label in spans:
            kinds.add(kind)
            x, w = (ts - t0) / 1000.0, dur / 1000.0
            ax.broken_barh([(x, max(w, width_ms * 1e-4))], (y - 0.4, 0.8), facecolors=COLORS.get(kind, "#bab0ac"),
                           edgecolor="black", linewidth=0.2)
            if label and w > width_ms * 0.012:  # where the label fits across
                ax.text(x + w / 2, y, label, ha="center", va="center", fontsize=6)
            elif label and w > width_ms * 0.002:  # on its side, where it fits only so
                ax.text(x + w / 2, y, label, ha="center", va="center", fontsize=5, rotation=90)
        if name.endswith(" compute"):
            for ts, dur in waits_of(spans):
                if dur / 1000.0 > width_ms * 1e-3:  # a gap too narrow to see is no wait to show
                    waited = True
                    ax.broken_barh([((ts - t0) / 1000.0, dur / 1000.0)], (y - 0.4, 0.8), facecolors="none",
                                   edgecolor="#e45756", hatch="////", linewidth=0.3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([name for _, name, _ in reversed(rows)], fontsize=8)
    ax.set_title(title)
    handles = [Patch(color=COLORS.get(k, "#bab0ac"), label=k) for k in sorted(kinds)]
    if waited:
        handles.append(Patch(facecolor="none", edgecolor="#e45756", hatch="////", label="waiting"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if not memory:
        ax.set_xlabel(since(step))
        ax.set_xlim(0, width_ms)
        fig.tight_layout()
        fig.savefig(out_path, dpi=120)
        plt.close(fig)
        return
    for r, samples in sorted(memory.items()):
        before = [(t0, b) for t, b in samples if t < t0][-1:]  # the value the window starts with
        inside = before + [(t, b) for t, b in samples if t0 <= t <= t1]
        if inside:
            inside.append((t1, inside[-1][1]))  # samples are written on change: the last value holds on
        mem_ax.step([(t - t0) / 1000.0 for t, _ in inside], [b / 2**20 for _, b in inside], where="post",
                    label=f"rank {r}")
    mem_ax.set_ylabel("device MiB")
    mem_ax.set_xlabel(since(step))
    mem_ax.set_xlim(0, width_ms)
    if memory:
        mem_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description="Draw a --trace FILE timeline as a Gantt chart (PNG).")
    p.add_argument("trace", help="the --trace FILE of a run")
    p.add_argument("out", help="the PNG to write")
    p.add_argument("--step", help="draw only this step, or a range of steps such as 1-2")
    p.add_argument("--ranks", help="draw only this rank, or a range of ranks such as 0-1")
    args = p.parse_args(argv)
    try:
        step = None if args.step is None else span_range(args.step, "--step")
        ranks = None if args.ranks is None else span_range(args.ranks, "--ranks")
        events = load_trace(args.trace)
        steps = steps_of(events)
        if step is not None and not (step[0] in steps and step[1] in steps):
            have = f"steps {steps[0]}..{steps[-1]}" if steps else "no step"
            raise TraceError(f"{args.trace}: --step {args.step} is not in the trace (it holds {have})")
        pids = sorted({e["pid"] for e in events if e["ph"] == "X"})
        if ranks is not None and not any(ranks[0] <= r <= ranks[1] for r in pids):
            raise TraceError(f"{args.trace}: --ranks {args.ranks} holds none of its ranks "
                             f"({pids[0]}..{pids[-1]})" if pids else f"{args.trace}: no rank has a span")
    except TraceError as e:
        print(f"trace_gantt.py: error: {e}", file=sys.stderr)
        return 2
    if step is not None and step[0] == step[1]:
        step = step[0]
    rows = rows_of(events, step, ranks)
    for _, name, spans in rows:
        print(f"{name}: {len(spans)} spans")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("trace_gantt.py: error: matplotlib is missing (apt-get install python3-matplotlib)", file=sys.stderr)
        return 1
    title = args.trace + (f", step {args.step}" if args.step is not None else "")
    title += f", rank {args.ranks}" if args.ranks is not None else ""
    memory = {r: m for r, m in memory_of(events).items() if ranks is None or ranks[0] <= r <= ranks[1]}
    try:
        draw(rows, memory, args.out, title, step)
    except OSError as e:
        print(f"trace_gantt.py: error: cannot write {args.out}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
