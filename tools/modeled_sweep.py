#!/usr/bin/env python3
"""modeled_sweep.py: the time side of every stage, on a modeled cluster.

Runs stages 00-04 as dry runs on the modeled clock (docs/SPEC.md section 13:
no arithmetic, every op, collective and copy charged on the profile's
hardware) for a few model shapes over a range of rank counts, and writes
what a cluster plan needs: per run, the modeled step time, MFU, the exposed
communication and the peak device memory per rank against the card's. Then
data parallel, ZeRO-3 and FSDP over the same rank counts on a PCIe card
without NVLink (--pcie-hardware, L40S), beside the same runs on the first
profile; and ZeRO-3, stage 04's knobs (prefetch, resharding, hybrid
sharding) and stage 05's offload (with and without the delayed update), on
NVLink and without it, at one size. Every number comes from a run log; none
is typed here. Every time is modeled, not measured.

    tools/modeled_sweep.py --out /tmp/m                      # the default sweep
    tools/modeled_sweep.py --out /tmp/m --models gpt2-xl --ranks 8,64 --pcie-models gpt2-xl
    tools/modeled_sweep.py --out /tmp/m --no-plots
    tools/modeled_sweep.py --out /tmp/m --models gpt-7b --seq 2048 --batch 8   # every shape at T and B
    tools/modeled_sweep.py --out /tmp/m --write-docs docs/tour   # docs/tour/modeled.md and its pictures

The output folder gets logs/ (one run log per run), modeled.md (the tables),
modeled.json (every number: "runs", "pcie" and "knobs") and, with
matplotlib, scaling.png, pcie.png and knobs.png.
A folder that holds anything but an earlier sweep's output is refused.
Exit status: 0 done, 1 a run failed, 2 a usage error.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = [("dp", "00_data_parallel/dp"), ("zero1", "01_zero1/zero1"), ("zero2", "02_zero2/zero2"),
          ("zero3", "03_zero3/zero3"), ("fsdp", "04_fsdp/fsdp")]
# Micro-batch per rank for each shape: what a card of its size is given in practice (--batch: one for all).
BATCH = {"gpt2": 16, "gpt2-medium": 16, "gpt2-large": 8, "gpt2-xl": 8, "gpt-7b": 2, "gpt-70b": 1}


def shape_order(model):
    """Where a shape sorts: by its preset's place in BATCH ("gpt-7b,T=2048" as gpt-7b), then by name."""
    base = model.split(",")[0]
    return (list(BATCH).index(base) if base in BATCH else len(BATCH), model)


def shape_of(model, shape):
    """The --model and --batch of a run of `model`: shape holds --seq and --batch (0: the shape's own)."""
    seq, batch = shape
    return model + (",T=%d" % seq if seq else ""), batch if batch else BATCH.get(model, 4)
# Every run: the bf16 recipe on tensor cores, flash attention, full recomputation.
COMMON = ["--precision", "bf16", "--compute", "bf16", "--attention", "flash", "--recompute", "full",
          "--steps", "2", "--clock", "modeled", "--dry-run", "--quiet"]
OWN = {"logs", "modeled.md", "modeled.json", "scaling.png", "pcie.png", "knobs.png"}
# The stages of the PCIe series: the two that gather every unit's parameters before its compute, and
# data parallel, whose one all-reduce a step is what they are weighed against on the same card.
PCIE_STAGES = ["dp", "zero3", "fsdp"]


def run(build, exe, args, log, n_steps=2, shown=1):
    """One dry run of `n_steps` steps; the numbers of step `shown`: by default the second, the first to
    overlap the step before it (with the delayed update, 4 steps and step 2: the first that waits for
    the update before it; the last waits for its own too)."""
    args = [str(n_steps) if i > 0 and args[i - 1] == "--steps" else a for i, a in enumerate(args)]
    cmd = [os.path.join(build, exe)] + args + ["--log-json", log]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(" ".join(cmd) + "\n" + p.stderr.strip())
    steps, summary = [], None
    with open(log) as f:
        for line in f:
            j = json.loads(line)
            if "summary" in j:
                summary = j["summary"]
            elif "step" in j:  # not an evaluation's {"val": ...}
                steps.append(j)
    last = steps[shown]
    return {"ms": last["ms"], "mfu": last["mfu"], "exposed_ms": last["phases_ms"]["exposed comm"],
            "comm_ms": last["phases_ms"]["comm"], "compute_ms": last["phases_ms"]["compute"],
            "peak_gib": max(m["device"]["peak_total"] for m in summary["memory"]) / 2**30,
            "tokens_per_s": last["tokens_per_s"], "clock": summary["clock_detail"]}


def profile_path(hardware):
    """--hardware's file: a path as given, else a profile of hardware/ (as the stages read it)."""
    if "/" in hardware or hardware.endswith(".hw"):
        return hardware
    return os.path.join(ROOT, "hardware", hardware + ".hw")


def label(hardware):
    """A profile's name for file names and tables: "h100-sxm" for hardware/h100-sxm.hw or a path to it."""
    name = os.path.basename(hardware)
    return name[:-3] if name.endswith(".hw") else name


def profile_value(hardware, wanted):
    with open(profile_path(hardware)) as f:
        for line in f:
            key, _, value = line.split("#")[0].partition("=")
            if key.strip() == wanted:
                return float(value)
    raise SystemExit("modeled_sweep: no %s in %s" % (wanted, profile_path(hardware)))


def memory_gib(hardware):
    return profile_value(hardware, "memory_gib")


def sweep(build, out, models, ranks, hardware, shape, stages=None):
    """Every stage of `stages` (by default all five) for every shape and rank count, on one profile."""
    rows = []
    for model in models:
        for stage, exe in STAGES:
            if stages is not None and stage not in stages:
                continue
            for n in ranks:
                spec, batch = shape_of(model, shape)
                args = ["--model", spec, "--batch", str(batch), "--ranks", str(n), "--hardware", hardware] + COMMON
                r = run(build, exe, args, os.path.join(out, "logs", "%s_%s_%s_%d.json" % (label(hardware), model, stage, n)))
                r.update(model=spec, stage=stage, ranks=n, hardware=hardware, mode="", batch=batch)
                rows.append(r)
                print("%-8s %-12s %-6s N=%-5d %10.1f ms  MFU %5.1f%%  exposed %8.1f ms  peak %7.1f GiB" %
                      (label(hardware), model, stage, n, r["ms"], 100 * r["mfu"], r["exposed_ms"], r["peak_gib"]), flush=True)
    return rows


def knobs(build, out, model, n, shape):
    """ZeRO-3, stage 04's modes and stage 05's offload, with and without NVLink, at one size."""
    rows = []
    modes = [("zero3", "03_zero3/zero3", []),
             ("prefetch 0", "04_fsdp/fsdp", ["--prefetch", "0"]), ("prefetch 1", "04_fsdp/fsdp", ["--prefetch", "1"]),
             ("prefetch 2", "04_fsdp/fsdp", ["--prefetch", "2", "--max-gathered", "3"]),
             ("no reshard", "04_fsdp/fsdp", ["--reshard-after-forward", "false"]),
             ("HSDP F=8", "04_fsdp/fsdp", ["--shard-group", "8"]),
             ("offload", "05_offload/offload", []),
             ("offload params", "05_offload/offload", ["--offload-params"]),
             ("offload delayed", "05_offload/offload", ["--delay-update"])]
    for hardware in ("h100-sxm", "l40s"):
        for name, exe, extra in modes:
            spec, batch = shape_of(model, shape)
            args = ["--model", spec, "--batch", str(batch), "--ranks", str(n), "--hardware", hardware] + COMMON + extra
            log = os.path.join(out, "logs", "knob_%s_%s.json" % (hardware, name.replace(" ", "_").replace("=", "")))
            delayed = "--delay-update" in extra
            r = run(build, exe, args, log, n_steps=4 if delayed else 2, shown=2 if delayed else 1)
            r.update(model=spec, stage=os.path.basename(exe), ranks=n, hardware=hardware, mode=name, batch=batch)
            rows.append(r)
            print("%-8s %-12s %-12s N=%-5d %10.1f ms  MFU %5.1f%%  exposed %8.1f ms" %
                  (hardware, model, name, n, r["ms"], 100 * r["mfu"], r["exposed_ms"]), flush=True)
    return rows


def table(rows, mem):
    lines = ["| hardware | model | stage | mode | N | B | step ms | MFU | exposed comm ms | peak GiB/rank | fits |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append("| %s | %s | %s | %s | %d | %d | %.1f | %.1f%% | %.1f | %.1f | %s |" % (
            label(r["hardware"]), r["model"], r["stage"], r["mode"] or "", r["ranks"], r["batch"], r["ms"], 100 * r["mfu"],
            r["exposed_ms"], r["peak_gib"], "yes" if r["peak_gib"] <= mem[r["hardware"]] else "no"))
    return "\n".join(lines) + "\n"


def plots(rows, pcie_rows, knob_rows, out, mem):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = sorted({r["model"] for r in rows}, key=shape_order)
    fig, axes = plt.subplots(2, len(models), figsize=(4.2 * len(models), 7), squeeze=False)
    for i, model in enumerate(models):
        for stage, _ in STAGES:
            rs = [r for r in rows if r["model"] == model and r["stage"] == stage]
            fits = [r["peak_gib"] <= mem[r["hardware"]] for r in rs]
            for ax, key, scale in ((axes[0][i], "ms", 1.0), (axes[1][i], "mfu", 100.0)):
                line, = ax.plot([r["ranks"] for r in rs], [r[key] * scale for r in rs], marker="o", label=stage)
                # Hollow markers where the run does not fit the card's memory.
                ax.plot([r["ranks"] for r, f in zip(rs, fits) if not f],
                        [r[key] * scale for r, f in zip(rs, fits) if not f], "o", mfc="white",
                        color=line.get_color())
        axes[0][i].set_title("%s, B=%d per rank" % (model, rs[0]["batch"]), fontsize=10)
        axes[0][i].set_ylabel("modeled step, ms")
        axes[1][i].set_ylabel("modeled MFU, %")
        ranks = sorted({r["ranks"] for r in rows if r["model"] == model})
        for ax in (axes[0][i], axes[1][i]):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ranks, ["{:,}".format(n) for n in ranks])
            ax.set_xlabel("ranks (GPUs)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Modeled on %s (hollow: does not fit its %g GiB)" % (rows[0]["clock"].split(" x")[0]
                                                                     .replace("modeled on ", ""),
                                                                     mem[rows[0]["hardware"]]), fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scaling.png"), dpi=110)
    plt.close(fig)
    if pcie_rows:
        pcie_plot(plt, rows, pcie_rows, out, mem)
    if not knob_rows:
        return
    fig, ax = plt.subplots(figsize=(9, 4.4))
    names = [r["mode"] for r in knob_rows if r["hardware"] == "h100-sxm"]
    width = 0.38
    for k, hw in enumerate(("h100-sxm", "l40s")):
        rs = [r for r in knob_rows if r["hardware"] == hw]
        xs = [i + (k - 0.5) * width for i in range(len(rs))]
        ax.bar(xs, [r["ms"] - r["exposed_ms"] for r in rs], width, color="C%d" % k, alpha=0.5,
               label="%s: the rest of the step" % hw)
        ax.bar(xs, [r["exposed_ms"] for r in rs], width, bottom=[r["ms"] - r["exposed_ms"] for r in rs],
               color="C%d" % k, label="%s: exposed comm" % hw, hatch="//", alpha=0.9)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=8, rotation=20, ha="right")
    ax.set_ylabel("modeled step, ms")
    ax.set_title("%s, N=%d: ZeRO-3, stage 04's knobs and offload, NVLink (H100) against PCIe (L40S)" % (
        knob_rows[0]["model"], knob_rows[0]["ranks"]), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "knobs.png"), dpi=110)
    plt.close(fig)


def pcie_plot(plt, rows, pcie_rows, out, mem):
    """pcie.png: the PCIe series beside the same stages, shapes and rank counts of the main sweep."""
    import matplotlib.ticker
    models = sorted({r["model"] for r in pcie_rows}, key=shape_order)
    fig, axes = plt.subplots(len(models), 3, figsize=(15, 4.2 * len(models)), squeeze=False)
    for i, model in enumerate(models):
        ax_ms, ax_mfu, ax_exp = axes[i]
        for k, stage in enumerate(PCIE_STAGES):
            for series, style in ((rows, "-"), (pcie_rows, "--")):
                rs = [r for r in series if r["model"] == model and r["stage"] == stage]
                if not rs:
                    continue
                color = "C%d" % [s for s, _ in STAGES].index(stage)  # as in scaling.png
                for ax, value in ((ax_ms, lambda r: r["ms"]), (ax_mfu, lambda r: 100 * r["mfu"]),
                                  (ax_exp, lambda r: 100 * r["exposed_ms"] / r["ms"])):
                    ax.plot([r["ranks"] for r in rs], [value(r) for r in rs], style, marker="o", color=color,
                            label="%s, %s" % (stage, label(rs[0]["hardware"])))
                    # Hollow markers where the run does not fit the card's memory, as in scaling.png.
                    out_of = [r for r in rs if r["peak_gib"] > mem[r["hardware"]]]
                    ax.plot([r["ranks"] for r in out_of], [value(r) for r in out_of], "o", mfc="white", color=color)
        ax_ms.set_ylabel("modeled step, ms")
        ax_ms.set_yscale("log")  # the cards differ several-fold: a ratio reads the same at every N
        ax_ms.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1, 2, 5)))
        ax_ms.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
        ax_ms.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax_mfu.set_ylabel("modeled MFU, % of each card's own peak")
        ax_exp.set_ylabel("modeled exposed comm, % of the step")
        ranks = sorted({r["ranks"] for r in pcie_rows if r["model"] == model})
        for ax in (ax_ms, ax_mfu, ax_exp):
            batch = next(r["batch"] for r in pcie_rows if r["model"] == model)
            ax.set_title("%s, B=%d per rank" % (model, batch), fontsize=10)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ranks, ["{:,}".format(n) for n in ranks])
            ax.set_xlabel("ranks (GPUs)")
            ax.grid(alpha=0.3, which="both")
        ax_exp.legend(fontsize=8)
    cards = []
    for r in rows + pcie_rows:
        card = r["clock"].split(" x")[0].replace("modeled on ", "")
        if r["model"] in models and card not in cards:
            cards.append(card)
    fig.suptitle("Data parallel, ZeRO-3 and FSDP, modeled: %s, solid; %s, dashed" % (cards[0], cards[-1])
                 if len(cards) == 2 else "Data parallel, ZeRO-3 and FSDP, modeled: %s" % cards[0], fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pcie.png"), dpi=110)
    plt.close(fig)


def timelines(build, out, docs):
    """One modeled step of stage 04 on 8 L40S (PCIe), without prefetch and with it, drawn by trace_gantt.py."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import trace_gantt
    drawn = []
    for depth in (0, 1):
        trace = os.path.join(out, "logs", "timeline_prefetch%d.json" % depth)
        args = ["--model", "gpt2", "--ranks", "8", "--batch", "16", "--hardware", "l40s",
                "--prefetch", str(depth), "--trace", trace] + COMMON
        run(build, "04_fsdp/fsdp", args, os.path.join(out, "logs", "timeline_prefetch%d.jsonl" % depth))
        events = trace_gantt.load_trace(trace)
        rows = trace_gantt.rows_of(events, 1, (0, 1))  # ranks 0 and 1: the rest alike
        png = os.path.join(docs, "modeled_prefetch%d.png" % depth)
        trace_gantt.draw(rows, {}, png, "fsdp, gpt2 on 8 L40S (PCIe), --prefetch %d: step 1, modeled" % depth, 1)
        drawn.append(png)
    return drawn


def side_by_side(rows, pcie_rows):
    """The PCIe series beside the main sweep's same stage, shape and N: one table row each."""
    lines = ["| model | stage | N | %s ms | MFU | exposed ms | %s ms | MFU | exposed ms | step ratio |" % (
                 label(rows[0]["hardware"]), label(pcie_rows[0]["hardware"])),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r, p in pairs(rows, pcie_rows):
        lines.append("| %s | %s | %d | %.1f | %.1f%% | %.1f | %.1f | %.1f%% | %.1f | %.2f |" % (
            p["model"], p["stage"], p["ranks"], r["ms"], 100 * r["mfu"], r["exposed_ms"],
            p["ms"], 100 * p["mfu"], p["exposed_ms"], p["ms"] / r["ms"]))
    return "\n".join(lines) + "\n"


def batch_words(rows):
    """The micro-batch per rank of each shape, from the runs: "8 for gpt2-xl, 2 for gpt-7b"."""
    seen = {}
    for r in rows:
        seen.setdefault(r["model"], r["batch"])
    return ", ".join("%d for %s" % (b, m) for m, b in seen.items())


def first_exposed(rows, stage, share):
    """Where `stage`'s exposed communication first passes `share` of the step, per shape: "N = 512 for
    gpt2-xl, ..."; "nowhere" for a shape where it does not within the sweep."""
    words = []
    for model in sorted({r["model"] for r in rows}, key=shape_order):
        over = [r["ranks"] for r in rows if r["model"] == model and r["stage"] == stage
                and r["exposed_ms"] > share * r["ms"]]
        words.append("%s for %s" % ("N = {:,}".format(min(over)) if over else "nowhere", model))
    return ", ".join(words)


def exposed_words(rows, pcie_rows, stage):
    """`stage`'s exposed communication on both cards at the PCIe series' two smallest N, from the runs."""
    words = []
    for r, p in list(pairs(rows, pcie_rows, stage))[:2]:
        words.append("at N = %d, %.1f ms of a %.1f ms step on %s (%.1f%%) against %.1f of %.1f on %s (%.1f%%)" % (
            p["ranks"], p["exposed_ms"], p["ms"], label(p["hardware"]), 100 * p["exposed_ms"] / p["ms"],
            r["exposed_ms"], r["ms"], label(r["hardware"]), 100 * r["exposed_ms"] / r["ms"]))
    return "; ".join(words)


def choices(rows, mem):
    """Per shape and N, in the sweep's order: the runs whose peak fits the card, shortest step first."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    for model in models:
        for n in sorted({r["ranks"] for r in rows if r["model"] == model}):
            fit = [r for r in rows if r["model"] == model and r["ranks"] == n and r["peak_gib"] <= mem[r["hardware"]]]
            yield model, n, sorted(fit, key=lambda r: r["ms"])


def choice_table(rows, mem):
    """The fastest stage that fits, and the next, for each shape and N."""
    lines = ["| model | N | fastest stage that fits | step ms | MFU | the next | its step ms |",
             "|---|---:|---|---:|---:|---|---:|"]
    for model, n, fit in choices(rows, mem):
        if not fit:
            lines.append("| %s | %d | none fits |  |  |  |  |" % (model, n))
            continue
        a, b = fit[0], fit[1] if len(fit) > 1 else None
        lines.append("| %s | %d | %s | %.1f | %.1f%% | %s | %s |" % (
            model, n, a["stage"], a["ms"], 100 * a["mfu"], b["stage"] if b else "none fits",
            "%.1f" % b["ms"] if b else ""))
    return "\n".join(lines) + "\n"


def published_ratios(build):
    """bench/modeled_vs_published.py's ratios, modeled over published model FLOP/s per GPU, run here."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "modeled_vs_published.py"), "--build", build],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("bench/modeled_vs_published.py failed: " + p.stderr.strip()[-300:])
    cells = [line.split("|") for line in p.stdout.split("\n") if line.startswith("| ") and "---" not in line]
    return [float(c[5]) for c in cells[1:]]


def caveat_words(ratios):
    """What the published comparison says of the model, from its ratios."""
    if all(x > 1 for x in ratios):
        return ("every one of the %d published training runs bench/modeled_vs_published.py sets it beside (A100 "
                "and H100, none on L40S) ran slower than modeled, by %.2f to %.2f times" %
                (len(ratios), min(ratios), max(ratios)))
    return ("against the %d published training runs of bench/modeled_vs_published.py (A100 and H100, none on "
            "L40S) the modeled speed is %.2f to %.2f times the published" % (len(ratios), min(ratios), max(ratios)))


def pairs(rows, pcie_rows, stage=None):
    """(main run, PCIe run) of `stage` (default: every stage) at the same shape and N, in the PCIe series'
    order."""
    for p in pcie_rows:
        same = [r for r in rows if (r["model"], r["stage"], r["ranks"]) == (p["model"], p["stage"], p["ranks"])]
        if stage in (None, p["stage"]) and same:
            yield same[0], p


def step_ratio_words(rows, pcie_rows, stage):
    """"dp's on gpt2-xl at N = 8 is 3.1 times h100-sxm's": the PCIe card's step against the main one's,
    at the first run of `stage` in both."""
    for r, p in pairs(rows, pcie_rows, stage):
        return "%s's on %s at N = %d is %.1f times %s's" % (stage, p["model"], p["ranks"], p["ms"] / r["ms"],
                                                             label(r["hardware"]))
    return "than %s's" % label(rows[0]["hardware"])


def exposed_range_words(pcie_rows, stage):
    """How `stage`'s exposed communication on the PCIe card grows from the series' smallest N to its
    largest: "hardly grows with N on it (...)" while it stays within 2 % of the step, else "grows with N
    on it (...)"."""
    rs = [r for r in pcie_rows if r["stage"] == stage and r["model"] == pcie_rows[0]["model"]]
    if not rs:
        return "was not run on it"
    lo, hi = rs[0], rs[-1]
    how = "hardly grows" if hi["exposed_ms"] / hi["ms"] - lo["exposed_ms"] / lo["ms"] < 0.02 else "grows"
    return "%s with N on it (%.1f ms of %.1f at N = {:,} on %s, %.1f of %.1f at N = {:,})".format(
        lo["ranks"], hi["ranks"]) % (how, lo["exposed_ms"], lo["ms"], label(lo["hardware"]), hi["exposed_ms"],
                                     hi["ms"])


def docs_page(rows, pcie_rows, knob_rows, mem, pictures, ratios):
    """docs/tour/modeled.md: what the sweep shows, with its pictures and tables."""
    names = {k: os.path.basename(p) for k, p in pictures.items()}
    ranks = sorted({r["ranks"] for r in rows})
    return "\n".join([
        "# The tour, on a modeled cluster: the time side of every stage",
        "",
        "Every number here is **modeled, not measured** (docs/SPEC.md section 13): the stages run as dry runs "
        "on `--clock modeled`, which charges each op, collective, copy and host job from the stage's own "
        "order of issues and waits to the machine of a profile in hardware/. Written by "
        "`tools/modeled_sweep.py --out DIR --write-docs docs/tour`; the same command gives the same numbers "
        "on any machine. Every run: `%s`, the micro-batch per rank held at every N (B: %s)." % (
            " ".join(COMMON), batch_words(rows + pcie_rows + knob_rows)),
        "",
        "## Every stage against the number of GPUs",
        "",
        "![modeled step and MFU per stage](%s)" % names["scaling"],
        "",
        "From %s to %s GPUs, with the micro-batch per GPU held (weak scaling: the ideal is a flat line). "
        "Data parallel keeps the whole model and optimizer on every GPU (hollow: it does not fit) and pays "
        "its AdamW over all of P on each; its one all-reduce a step hides under the backward at every N. "
        "ZeRO-1 and -2 shard the optimizer but all-gather the parameters after it, exposed. ZeRO-3 and FSDP "
        "gather each unit ahead of its use, and that hides behind the compute until the all-gathers' "
        "latency outgrows a unit's compute: a ring pays one network hop a node per pass, and %s GPUs are "
        "%s nodes. ZeRO-3's exposed communication first passes a tenth of its step at %s: first for the "
        "smallest shape, whose units compute least." % (
            ranks[0], "{:,}".format(ranks[-1]), "{:,}".format(ranks[-1]),
            "{:,}".format(ranks[-1] // int(profile_value(rows[0]["hardware"], "gpus_per_node"))),
            first_exposed(rows, "zero3", 0.1)),
        "",
        "## Data parallel, ZeRO-3 and FSDP without NVLink",
        "",
        "![data parallel, ZeRO-3 and FSDP on H100 and L40S](%s)" % names["pcie"],
        "",
        "The same runs on L40S: a PCIe card with no NVLink, eight to a node, its nodes on Ethernet. Its "
        "steps are longer to begin with, %s (slower tensor cores and memory; MFU is against each card's own "
        "peak), and data parallel's one all-reduce a step, under the backward, %s. ZeRO-3 moves one and a half times data parallel's bytes (each unit's parameters gathered in "
        "the forward and again in the backward, its gradients reduce-scattered), and each unit's compute "
        "waits for its gather: on NVLink and InfiniBand that hides under the previous unit's compute, over "
        "PCIe and Ethernet it shows from the first node. ZeRO-3's exposed communication is, %s. Beyond that, "
        "the rings' latency grows with the nodes on either card and, at the largest N, takes over both "
        "steps. ZeRO-3 wants NVLink or InfiniBand." % (
            step_ratio_words(rows, pcie_rows, "dp"), exposed_range_words(pcie_rows, "dp"),
            exposed_words(rows, pcie_rows, "zero3")),
        "",
        side_by_side(rows, pcie_rows),
        "## ZeRO-3, stage 04's knobs and offload, with NVLink and without",
        "",
        "![the knobs on H100 and L40S](%s)" % names["knobs"],
        "",
        "Offload pays for its PCIe copies and, above all, for AdamW on the host's CPU, which the node's GPUs "
        "share; the delayed update (`--delay-update`) runs a step's AdamW on a worker thread while the GPU "
        "computes the next step, so a step costs about the longer of the two instead of their sum. Its runs "
        "take `--steps 4` and show step 2, the first that waits for the update before it (the last waits "
        "for its own too).",
        "",
        "## One step of FSDP on 8 L40S (no NVLink), without prefetch and with it",
        "",
        "![prefetch 0](%s)" % names["prefetch0"],
        "",
        "![prefetch 1](%s)" % names["prefetch1"],
        "",
        "Without prefetch each unit's all-gather is issued when the unit is needed and the compute waits for "
        "it; with `--prefetch 1` the next unit's is issued first and runs under this unit's compute.",
        "",
        "## Which stage, by these runs",
        "",
        "For each shape and N: the stage whose modeled step is shortest among those whose peak fits the card, "
        "and the next.",
        "",
        choice_table(rows, mem),
        "These are the model's answers, and the model is optimistic: %s (bench/RESULTS.md). It leaves out the "
        "memory bandwidth a running collective takes from the ops, a matrix product's rate below its best "
        "shape's beyond the waves of tiles, an eager framework's extra kernels, and what grows with the number "
        "of GPUs besides the collectives (stragglers, a large network's congestion): read its steps as a bound "
        "and its ranking of the stages as the lesson." % caveat_words(ratios),
        "",
        "## The numbers",
        "",
        table(rows, mem),
        table(pcie_rows, mem),
        table(knob_rows, mem),
    ])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--models", default="gpt2-xl,gpt-7b,gpt-70b")
    ap.add_argument("--ranks", default="8,64,512,4096")
    ap.add_argument("--seq", type=int, default=0,
                    help="the sequence length T of every shape (default: each preset's own)")
    ap.add_argument("--batch", type=int, default=0,
                    help="the micro-batch per rank of every run (default: each shape's, %s)" %
                         ", ".join("%s %d" % kv for kv in BATCH.items()))
    ap.add_argument("--pcie-hardware", default="l40s",
                    help="the card without NVLink of the PCIe series (default l40s)")
    ap.add_argument("--pcie-models", default="gpt2-xl",
                    help="shapes of the PCIe series: dp, ZeRO-3 and FSDP over --ranks ('' for none)")
    ap.add_argument("--knobs-model", default="gpt2-medium")
    ap.add_argument("--knobs-ranks", type=int, default=16)
    ap.add_argument("--no-knobs", action="store_true")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--write-docs", metavar="DIR",
                    help="also write DIR/modeled.md and its pictures (modeled_*.png), and two step timelines")
    a = ap.parse_args(argv)
    try:
        ranks = sorted({int(x) for x in a.ranks.split(",")})
    except ValueError:
        ap.error("--ranks takes numbers separated by commas (got %r)" % a.ranks)
    if a.seq < 0 or a.batch < 0:
        ap.error("--seq and --batch take a number above 0 (or 0, the default: each shape's own)")
    shape = (a.seq, a.batch)
    pcie_models = [m for m in a.pcie_models.split(",") if m]
    if a.write_docs and (a.no_plots or a.no_knobs or not pcie_models):
        ap.error("--write-docs draws the pictures, the PCIe series and the knobs: "
                 "leave out --no-plots and --no-knobs, and give --pcie-models")
    if a.write_docs and set(pcie_models) - set(a.models.split(",")):
        ap.error("--write-docs sets the PCIe series beside the same shapes of --models: give --pcie-models "
                 "among them")
    if os.path.exists(a.out) and set(os.listdir(a.out)) - OWN:
        ap.error("%s holds files this tool did not write: give an empty or new folder" % a.out)
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    start = time.time()
    try:
        rows = sweep(a.build, a.out, a.models.split(","), ranks, a.hardware, shape)
        pcie_rows = sweep(a.build, a.out, pcie_models, ranks, a.pcie_hardware, shape, PCIE_STAGES)
        knob_rows = [] if a.no_knobs else knobs(a.build, a.out, a.knobs_model, a.knobs_ranks, shape)
    except RuntimeError as e:
        print("modeled_sweep: a run failed: %s" % e, file=sys.stderr)
        return 1
    mem = {hw: memory_gib(hw) for hw in {r["hardware"] for r in rows + pcie_rows + knob_rows}}
    with open(os.path.join(a.out, "modeled.json"), "w") as f:
        json.dump({"runs": rows, "pcie": pcie_rows, "knobs": knob_rows}, f, indent=1)
    with open(os.path.join(a.out, "modeled.md"), "w") as f:
        f.write("Modeled, not measured (docs/SPEC.md section 13): dry runs, `%s`; micro-batch per rank B: %s.\n\n"
                % (" ".join(COMMON), batch_words(rows + pcie_rows + knob_rows)))
        f.write(table(rows, mem))
        for more in (pcie_rows, knob_rows):
            if more:
                f.write("\n" + table(more, mem))
    if not a.no_plots:
        plots(rows, pcie_rows, knob_rows, a.out, mem)
    if a.write_docs:
        import shutil
        pictures = {}
        for name in ("scaling", "pcie", "knobs"):
            pictures[name] = os.path.join(a.write_docs, "modeled_%s.png" % name)
            shutil.copyfile(os.path.join(a.out, name + ".png"), pictures[name])
        pictures["prefetch0"], pictures["prefetch1"] = timelines(a.build, a.out, a.write_docs)
        with open(os.path.join(a.write_docs, "modeled.md"), "w") as f:
            f.write(docs_page(rows, pcie_rows, knob_rows, mem, pictures, published_ratios(a.build)))
    n_runs = len(rows) + len(pcie_rows) + len(knob_rows) + (2 if a.write_docs else 0)
    print("modeled_sweep: %d runs in %.0f s -> %s" % (n_runs, time.time() - start, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
