"""tour_readme.py: the tour's tables (tools/tour.py), as Markdown, and the
blocks they fill in the READMEs.

Each stage README ends with a block between the two marker lines below,
holding stage 00's row and that stage's runs; the top README holds every
run. `tools/tour.py --write-readmes` replaces what is between the markers
(or appends the block when a README has none); `--check-readmes` compares.
Step times are left out of the READMEs, being the machine's and not the
code's; tour.md has them.
"""
import os
import platform
import re

import plot_run

BEGIN = "<!-- tour: begin (written by tools/tour.py --write-readmes) -->"
END = "<!-- tour: end -->"
# Final losses may differ in the last printed digit between machines whose
# BLAS kernels round differently (the READMEs were written on one machine,
# CI may run on another): the check allows 1e-3 on those cells, exact on
# every other one (bytes, the bit-identity column, the formulas).
LOSS_TOLERANCE = 1e-3

STAGE_FOLDERS = ["00_data_parallel", "01_zero1", "02_zero2", "03_zero3", "04_fsdp", "05_offload"]
COLLECTIVES = [("all_reduce", "all-reduce"), ("reduce_scatter", "reduce-scatter"), ("all_gather", "all-gather")]


def config_text(cfg):
    return (f"`--model {cfg['model']} --ranks {cfg['ranks']} --batch {cfg['batch']} --grad-accum {cfg['grad_accum']}"
            f" --precision {cfg['precision']} --steps {cfg['steps']}`")


def nbytes(n):
    return plot_run.format_bytes(n) if n else "0"


def same(measured, estimated):
    """Equal bytes. Bytes per step are averages of ring-model counts, which
    are fractional where N does not divide a buffer (2(N-1)/N · n): those
    compare to 1e-9 of their size, the rounding of the sums and divisions
    that make them; whole counts (every byte held) compare exactly."""
    if float(measured).is_integer() and float(estimated).is_integer():
        return measured == estimated
    return abs(measured - estimated) <= 1e-9 * max(abs(measured), abs(estimated))


def checked(measured, estimated):
    """The measured bytes, with a mark saying whether the estimate is the same."""
    if estimated is None:
        return nbytes(measured)
    return nbytes(measured) + (" ✓" if same(measured, estimated) else f" ✗ (estimate {nbytes(estimated)})")


def est_device(rec, key):
    return rec["estimate"].get("device", {}).get(key)


def run_label(rec):
    flags = " ".join(rec["flags"])
    return f"{rec['key']} `{rec['stage']}{' ' + flags if flags else ''}`"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def memory_table(records):
    header = ["run", "final loss", "= 00", "params", "grads", "optimizer", "model states (✓ = formula)",
              "formula", "peak device (✓ = estimate)", "activations", "host model states"]
    rows = []
    for r in records:
        st = r["device_states"]
        est = r["estimate"]
        rows.append([
            run_label(r), f"{r['final_loss']:.4f}", "yes" if r["same_as_00"] else "**no**",
            nbytes(st["params"]), nbytes(st["grads"]), nbytes(st["optimizer"]),
            checked(r["device_model_states"], est_device(r, "model_states")), est.get("formula", ""),
            checked(r["device_peak"], est_device(r, "total")), checked(r["device"].get("activations", 0), est_device(r, "activations")),
            checked(r["host_model_states"], est.get("host", {}).get("model_states")),
        ])
    return table(header, rows)


def comm_table(records, with_time):
    header = ["run"] + [name for _, name in COLLECTIVES] + ["sent / step (✓ = formula)", "across groups",
                                                            "host→device", "device→host"]
    if with_time:
        header.append("ms / step")
    rows = []
    for r in records:
        by = r["comm"]["by_collective"]
        est_total = r["estimate"].get("comm_bytes_per_step", {}).get("total")
        t = r["transfers"]
        row = [run_label(r)] + [nbytes(by.get(k, 0)) for k, _ in COLLECTIVES] + [
            checked(r["comm"]["total"], est_total),
            checked(r["comm"]["cross_group"], r["estimate"].get("comm_bytes_per_step", {}).get("across_groups")),
            nbytes(t.get("to_device_bytes", 0)), nbytes(t.get("to_host_bytes", 0))]
        if with_time:
            row.append(f"{r['median_ms']:.1f}")
        rows.append(row)
    return table(header, rows)


def legend(cfg, records):
    return (f"Every run: {config_text(cfg)}, the built-in corpus, the default seed. Bytes are per rank "
            "(rank 0's; every rank's are the same here), model states and activations on the device "
            "(stage 05's model states are mostly on the host: last column). ✓: the measured bytes equal "
            "`build/tools/memory_estimate`'s for that run to the byte; \"= 00\": every step's loss and the "
            "final parameters are stage 00's to the bit. \"sent / step\" counts the ring model's bytes "
            "(docs/SPEC.md §8), the loss's and the norm's small all-reduces included." +
            (" Hybrid sharding (HSDP) adds each gradient in two hops, within its group and then across the "
             "groups, so its roundings differ from stage 00's: close, not equal (04_fsdp/README.md)."
             if any("--shard-group" in r["flags"] for r in records) else "") +
            (f" With --grad-accum {cfg['grad_accum']}, stages 02-05 add each micro-step's gradient after "
             "the ranks' sum (stage 00 before it), so they agree to rounding, not to the bit."
             if cfg["grad_accum"] > 1 else ""))


def tour_markdown(records, cfg, skipped):
    parts = ["# The tour: every stage side by side", "", legend(cfg, records), "", "## Memory per rank", "",
             memory_table(records), "", "## Communication per rank per step", "", comm_table(records, True), ""]
    if skipped:
        parts += ["Not run at this number of ranks: " + ", ".join(skipped) + ".", ""]
    parts += ["Commands: " + "; ".join(f"`{r['command']}`" for r in records[:1]) +
              " and the same with each stage's executable and flags (tour.json has every command; OUT is "
              "the output folder). Step times: the median step, on "
              f"{platform.machine()} with {os.cpu_count()} cores, the ranks as threads sharing them: the "
              "time side of each stage on GPUs is [modeled.md](modeled.md), on a modeled cluster.", ""]
    return "\n".join(parts)


def tour_text(records, cfg, skipped):
    return tour_markdown(records, cfg, skipped)


def stage_block(records, folder, cfg):
    """The block at the end of one stage README: stage 00 and this stage's runs."""
    mine = [r for r in records if r["folder"] == folder]
    rows = ([records[0]] if folder != STAGE_FOLDERS[0] else []) + mine
    key = folder[:2]
    pictures = [f"![memory per rank, stages 00 to {key}](../docs/tour/stage_{key}.png)"]
    if key in ("03", "04"):
        pictures.append(f"![one step of stage {key}, every rank](../docs/tour/timeline_{key}.png)")
    return "\n".join([
        BEGIN, "## Measured by the tour", "",
        "`python3 tools/tour.py --write-readmes` wrote this section (and [docs/tour/](../docs/tour/tour.md), "
        "with the step times); the `docs` test fails when it is stale (`python3 scripts/docs.py write --build build` refreshes it). " + legend(cfg, rows), "",
        memory_table(rows), "", comm_table(rows, False), "", *pictures, END])


def top_block(records, cfg):
    header = ["run", "= 00", "model states / rank (✓ = formula)", "formula", "peak device (✓ = estimate)", "sent / step",
              "host model states"]
    rows = []
    for r in records:
        rows.append([run_label(r), "yes" if r["same_as_00"] else "**no**",
                     checked(r["device_model_states"], est_device(r, "model_states")),
                     r["estimate"].get("formula", ""), checked(r["device_peak"], est_device(r, "total")), nbytes(r["comm"]["total"]),
                     nbytes(r["host_model_states"])])
    return "\n".join([
        BEGIN, "`python3 tools/tour.py` runs it all; `--write-readmes` wrote this table, the stage READMEs' "
        "and [docs/tour/](docs/tour/tour.md) (the `docs` test fails when they are stale: `python3 scripts/docs.py write --build build` refreshes them). " + legend(cfg, records), "",
        table(header, rows), "", "![memory per rank of every run, by category](docs/tour/memory.png)", END])


def readme_blocks(records, cfg):
    """{README path relative to the root: its block}."""
    blocks = {"README.md": top_block(records, cfg)}
    for folder in STAGE_FOLDERS:
        blocks[os.path.join(folder, "README.md")] = stage_block(records, folder, cfg)
    return blocks


def current_block(text):
    m = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, re.S)
    return m.group(0) if m else None


def cells_match(old, new):
    if old == new:
        return True
    try:
        return abs(float(old) - float(new)) <= LOSS_TOLERANCE
    except ValueError:
        return False


def blocks_match(old, new):
    a, b = old.splitlines(), new.splitlines()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        if not (x.startswith("|") and y.startswith("|")):
            return False
        cx, cy = x.split("|"), y.split("|")
        if len(cx) != len(cy) or not all(cells_match(p.strip(), q.strip()) for p, q in zip(cx, cy)):
            return False
    return True


def readmes_with_blocks(root, blocks):
    """(relative path, path, its text, its current block or None) of each README."""
    for rel, block in blocks.items():
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        yield rel, path, text, current_block(text), block


def stale_readmes(root, blocks):
    """What is stale, one phrase per README: missing block or different numbers."""
    stale = []
    for rel, _, _, old, block in readmes_with_blocks(root, blocks):
        if old is None:
            stale.append(f"{rel} has no tour section")
        elif not blocks_match(old, block):
            stale.append(f"{rel}'s tour section differs from a fresh tour")
    return stale


def write_readmes(root, blocks):
    """Replaces each README's block (or appends one); returns the files changed."""
    written = []
    for rel, path, text, old, block in readmes_with_blocks(root, blocks):
        new = text.replace(old, block) if old is not None else text.rstrip("\n") + "\n\n" + block + "\n"
        if new != text:
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(new)
            os.replace(path + ".tmp", path)
            written.append(rel)
    return written
