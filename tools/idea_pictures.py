#!/usr/bin/env python3
"""idea_pictures.py: the labs' pictures of the ideas, drawn from the shard
layout and the bytes the memory estimator computes with the stages' own
code (build/tools/memory_estimate --json), never by hand:

  allreduce.png   an all-reduce is a reduce-scatter, then an all-gather
                  (N = 4): who holds what after each, and the bytes each
                  rank sends
  shards.png      tiny's flat parameters cut among N = 3 ranks, unit by
                  unit, each unit padded to N pieces of S_u (shard.h)
  unit_life.png   one step of ZeRO-3 on tiny, unit by unit: gathered ahead
                  of its use (prefetch 1), computed, freed, gathered again
                  for its backward, its gradient reduce-scattered
  offload.png     stage 05 on tiny, N = 2, bf16: what lives on the device
                  and on the host, and the bytes that cross PCIe each step

ideas.json beside them holds every number they draw; `--check` recomputes
those numbers and says whether the pictures are current (scripts/docs.py
check runs it).

    python3 tools/idea_pictures.py [--build build] [--out docs/labs/ideas] [--check]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "labs", "ideas")
RANK_COLOURS = ["#4472c4", "#ed7d31", "#70ad47", "#ffc000"]


def estimate(build, *args):
    exe = os.path.join(build, "tools", "memory_estimate")
    p = subprocess.run([exe, "--json", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{exe} {' '.join(args)}: {(p.stderr or p.stdout).strip()}")
    return json.loads(p.stdout)


def numbers(build):
    """Everything the pictures draw."""
    cut = estimate(build, "--model", "tiny", "--ranks", "3", "--stage", "zero3")
    z3 = estimate(build, "--model", "tiny", "--ranks", "2", "--stage", "zero3", "--precision", "bf16")
    off = estimate(build, "--model", "tiny", "--ranks", "2", "--stage", "offload", "--precision", "bf16")
    o = off["stages"][0]
    return {
        "shards": {"ranks": cut["ranks"], "units": cut["units"]},
        "unit_life": {"ranks": z3["ranks"], "units": z3["units"], "gather_bytes": 2},
        "offload": {"ranks": off["ranks"], "shard": off["shard"], "device": o["device"], "host": o["host"],
                    "transfers_per_step": o["transfers_per_step"]},
    }


def kib(b):
    return f"{b / 1024:,.1f} KiB"


def allreduce_picture(plt, path):
    N = 4
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    titles = ["before: each rank its own gradient g_r\n(N chunks of B/N bytes)",
              "after the reduce-scatter: rank r holds\nchunk r summed over the ranks",
              "after the all-gather: every rank holds\nevery chunk summed = the all-reduce"]
    for k, ax in enumerate(axes):
        for r in range(N):
            for c in range(N):
                if k == 0:
                    text, colour, alpha = f"g{r}[{c}]", RANK_COLOURS[r], 0.55
                elif k == 1 and c != r:
                    text, colour, alpha = "", "#ffffff", 1.0
                else:
                    text, colour, alpha = f"Σ[{c}]", RANK_COLOURS[c], 0.9
                ax.add_patch(plt.Rectangle((c, N - 1 - r), 0.95, 0.9, color=colour, alpha=alpha))
                ax.add_patch(plt.Rectangle((c, N - 1 - r), 0.95, 0.9, fill=False, edgecolor="#888888"))
                ax.text(c + 0.47, N - 1 - r + 0.45, text, ha="center", va="center", fontsize=8)
        ax.set_xlim(-0.7, N)
        ax.set_ylim(-0.3, N)
        for r in range(N):
            ax.text(-0.1, N - 1 - r + 0.45, f"rank {r}", ha="right", va="center", fontsize=8)
        ax.set_title(titles[k], fontsize=9)
        ax.axis("off")
    fig.suptitle(f"all-reduce = reduce-scatter + all-gather, N = {N}: each phase sends (N-1)/N of the buffer "
                 f"per rank, 2(N-1)/N in all; ZeRO keeps the middle state", fontsize=10)
    return fig


def shards_picture(plt, data):
    N, units = data["ranks"], data["units"]
    fig, ax = plt.subplots(figsize=(12, 0.8 + 0.75 * len(units)))
    widest = max(N * u["piece"] for u in units)
    for i, u in enumerate(units):
        y = len(units) - 1 - i
        S, n = u["piece"], u["numel"]
        for r in range(N):
            real = max(0, min(S, n - r * S))
            x0 = r * S / widest
            ax.add_patch(plt.Rectangle((x0, y), real / widest, 0.7, color=RANK_COLOURS[r], alpha=0.8))
            if real < S:
                ax.add_patch(plt.Rectangle((x0 + real / widest, y), (S - real) / widest, 0.7, fill=False,
                                           hatch="////", edgecolor="#c00000"))
            ax.add_patch(plt.Rectangle((x0, y), S / widest, 0.7, fill=False, edgecolor="#333333"))
        pad = N * S - n
        ax.text(-0.01, y + 0.35, f"{u['name']}  n = {n:,}", ha="right", va="center", fontsize=9)
        # The last piece's last 6 elements, magnified: the padding is a few
        # elements of thousands.
        x = N * S / widest + 0.015
        cell = 0.018
        for k in range(6):
            padding = k >= 6 - pad
            ax.add_patch(plt.Rectangle((x + k * cell, y + 0.15), cell * 0.9, 0.4,
                                       facecolor="none" if padding else RANK_COLOURS[N - 1],
                                       hatch="////" if padding else None,
                                       edgecolor="#c00000" if padding else "#333333"))
        ax.text(x + 6 * cell + 0.01, y + 0.35,
                f"(its end, magnified)  {N} x {S:,} = {N * S:,}" + (f": {pad} padding" if pad else ": no padding"),
                ha="left", va="center", fontsize=9)
    for r in range(N):
        ax.add_patch(plt.Rectangle((0, 0), 0, 0, color=RANK_COLOURS[r], label=f"rank {r}'s piece"))
    ax.add_patch(plt.Rectangle((0, 0), 0, 0, fill=False, hatch="////", edgecolor="#c00000",
                               label="padding (zeros, never updated)"))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=N + 1, fontsize=8, frameon=False)
    ax.set_xlim(-0.25, 1.55)
    ax.set_ylim(-0.3, len(units))
    ax.axis("off")
    ax.set_title(f"tiny cut among N = {N} ranks (shard.h): each unit padded to N pieces of S_u = ceil(n_u / N); "
                 f"a rank's shard is its piece of every unit", fontsize=10)
    return fig


def unit_life_picture(plt, data):
    units = [u["name"] for u in data["units"]]
    U = len(units)
    # The slots of a step, then each unit's state in each: stage 03's
    # schedule with prefetch 1 (03_zero3/zero3.cpp): unit u+1's all-gather
    # issued before u computes (u-1's in the backward); every unit freed
    # after its forward (the head too: gathered again for the loss's
    # backward) and after its backward, whose gradient is reduce-scattered
    # while the next unit's backward runs.
    slots = ["start"] + [f"F\n{u}" for u in units] + ["loss"] + [f"B\n{u}" for u in reversed(units)] + ["end"]
    states = {u: ["" for _ in slots] for u in units}
    states[units[0]][0] = "all-gather"
    for i, u in enumerate(units):
        states[u][1 + i] = "compute"
        if i + 1 < U:
            states[units[i + 1]][1 + i] = "all-gather"
    states[units[-1]][U + 1] = "all-gather"
    for i, u in enumerate(units):
        b = U + 2 + (U - 1 - i)
        states[u][b] = "compute"
        if i > 0:
            states[units[i - 1]][b] = "all-gather"
        states[u][b + 1] = "reduce-scatter"
    colours = {"all-gather": "#9dc3e6", "compute": "#70ad47", "reduce-scatter": "#f4b183", "": "#ffffff"}
    fig, ax = plt.subplots(figsize=(12, 0.9 + 0.6 * U))
    for i, u in enumerate(units):
        y = U - 1 - i
        for k, st in enumerate(states[u]):
            ax.add_patch(plt.Rectangle((k, y), 0.95, 0.8, color=colours[st]))
            ax.add_patch(plt.Rectangle((k, y), 0.95, 0.8, fill=False, edgecolor="#bbbbbb"))
            label = {"all-gather": "gather", "compute": "compute", "reduce-scatter": "reduce-\nscatter"}.get(st, "")
            ax.text(k + 0.47, y + 0.4, label, ha="center", va="center", fontsize=7)
        piece = data["units"][i]["piece"]
        ax.text(-0.1, y + 0.4, f"{u} ({data['ranks']} x {piece:,})", ha="right", va="center", fontsize=8)
    for k, name in enumerate(slots):
        ax.text(k + 0.47, U + 0.05, name, ha="center", va="bottom", fontsize=7)
    ax.text(1 + U / 2, U + 0.75, "forward", ha="center", fontsize=9)
    ax.text(U + 2 + U / 2, U + 0.75, "backward", ha="center", fontsize=9)
    ax.set_xlim(-2.2, len(slots))
    ax.set_ylim(-0.2, U + 1.2)
    ax.axis("off")
    ax.set_title("one step of ZeRO-3 on tiny, unit by unit (prefetch 1): gathered while the unit before computes, "
                 "freed (blank) after its use,\ngathered again for its backward, its gradient reduce-scattered "
                 "while the next unit's backward runs; at most two units gathered at once", fontsize=9)
    return fig


def offload_picture(plt, data):
    d, h, t = data["device"], data["host"], data["transfers_per_step"]
    fig, ax = plt.subplots(figsize=(11, 3.6))
    ax.add_patch(plt.Rectangle((0, 0), 3.2, 3, fill=False, edgecolor="#4472c4", linewidth=2))
    ax.add_patch(plt.Rectangle((6.3, 0), 3.7, 3, fill=False, edgecolor="#7030a0", linewidth=2))
    ax.text(1.6, 2.7, "device (GPU)", ha="center", fontsize=11, color="#4472c4")
    ax.text(8.15, 2.7, "host (CPU memory)", ha="center", fontsize=11, color="#7030a0")
    ax.text(1.6, 1.5, f"my shard, bf16 (eS): {kib(d['params'])}\ngrads: {kib(d['grads'])}\n"
                      f"optimizer: {kib(d['optimizer'])}\n+ the gathered units",
            ha="center", va="center", fontsize=9)
    ax.text(8.15, 1.5, f"float32 shard + its bf16 copy: {kib(h['params'])}\nfloat32 gradient shard: "
                       f"{kib(h['grads'])}\nAdamW's m and v: {kib(h['optimizer'])}\nthe CPU runs AdamW",
            ha="center", va="center", fontsize=9)
    ax.annotate("", xy=(6.25, 2.0), xytext=(3.25, 2.0), arrowprops=dict(arrowstyle="->", linewidth=2))
    ax.text(4.75, 2.15, f"each reduced piece: {kib(t['to_host'])} / step", ha="center", fontsize=9)
    ax.annotate("", xy=(3.25, 1.0), xytext=(6.25, 1.0), arrowprops=dict(arrowstyle="->", linewidth=2))
    ax.text(4.75, 1.15, f"each updated bf16 shard: {kib(t['to_device'])} / step", ha="center", fontsize=9)
    ax.text(4.75, 0.55, "PCIe", ha="center", fontsize=10, style="italic")
    ax.set_xlim(-0.2, 10.2)
    ax.set_ylim(-0.2, 3.2)
    ax.axis("off")
    ax.set_title(f"stage 05 on tiny, N = {data['ranks']}, bf16: my shard S = {data['shard']:,} elements; "
                 "the model states live on the host, the link carries the rest", fontsize=10)
    return fig


def write(build, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = numbers(build)
    os.makedirs(out, exist_ok=True)
    figs = {"allreduce.png": allreduce_picture(plt, None), "shards.png": shards_picture(plt, data["shards"]),
            "unit_life.png": unit_life_picture(plt, data["unit_life"]),
            "offload.png": offload_picture(plt, data["offload"])}
    for name, fig in figs.items():
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=90)
        plt.close(fig)
    with open(os.path.join(out, "ideas.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")


def stale(build, out=OUT):
    """[why] the pictures are not current: their numbers differ from the estimator's now."""
    path = os.path.join(out, "ideas.json")
    try:
        with open(path, encoding="utf-8") as f:
            drawn = json.load(f)
    except OSError:
        return [f"{os.path.relpath(path, ROOT)} is missing"]
    now = numbers(build)
    return [] if drawn == now else [f"{os.path.relpath(out, ROOT)}: the pictures' numbers are not the "
                                    "estimator's now (python3 tools/idea_pictures.py)"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the pictures are stale")
    a = ap.parse_args(argv)
    try:
        if a.check:
            problems = stale(a.build, a.out)
            for p in problems:
                print(p)
            return 1 if problems else 0
        write(a.build, a.out)
        return 0
    except RuntimeError as e:
        print(f"idea_pictures.py: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
