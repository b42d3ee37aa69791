#!/usr/bin/env python3
# gpu_report.py: the benchmark tables that scripts/gpu_check.sh prints last,
# from the run logs (--log-json) of its runs. Standard library only (the GPU
# machine's python3 is enough); MFU from bench/mfu.py. Tested by
# tests/python/test_bench.py (meson test --suite bench_py) on made-up logs.
#
#   bench/gpu_report.py --gpu "NVIDIA H200" --warmup 5 \
#       --ours build-gpu/bench_dp.jsonl --torch build-gpu/bench_torch.jsonl \
#       [--ours-flash build-gpu/bench_dp_flash.jsonl] \
#       --stage-warmup 2 --stage build-gpu/dp.1.jsonl --stage build-gpu/zero1.4.jsonl ... \
#       [--json bench.json]
#
# Table 1, ours vs PyTorch (gpt2, bf16, 1 rank, the same B on the same GPU, in
# the same gpu_check run): tokens/s, ms/step, MFU, peak device memory, and the
# loss of the first and last step. Both sides are timed by the same rule: the
# median of the per-step times of the log, leaving out the first --warmup
# steps; tokens/s = tokens per step / that median. Targets (bench/RESULTS.md):
# tokens/s at least PyTorch eager's, MFU at least 40%. A missed target is
# reported, it does not fail gpu_check (that is for correctness). With
# --ours-flash, table 1 again for our run with --attention flash.
# Table 2, every stage run (1 and N virtual ranks on the one GPU): ms/step,
# tokens/s, the peak device memory per rank (the largest over the ranks, as
# each rank's memory tracker counts it) and the model states per rank / P
# beside docs/SPEC.md's formula.
# Table 3, modeled against measured: for each --modeled log (the same stage
# run as a dry run on the modeled clock, --clock modeled --hardware h200,
# docs/SPEC.md section 13), the measured stage run of the same stage and
# ranks beside it: ms/step of each and modeled / measured.
#
# A log that is missing or has no summary (the run failed) gives a row that
# says so; the script itself fails only on bad arguments.

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mfu  # noqa: E402

TARGET_RATIO = 1.0   # ours tokens/s >= PyTorch eager's
TARGET_MFU = 0.40    # ours MFU >= 40%

# docs/SPEC.md's model states per rank / P (up to shard padding), by the "stage"
# of the run log's summary, for the bf16 recipe and for fp32.
MODEL_STATES = {
    "dp": (lambda n: 16.0, lambda n: 16.0),
    "zero1": (lambda n: 4 + 12.0 / n, lambda n: 8 + 8.0 / n),
    "zero2": (lambda n: 2 + 14.0 / n, lambda n: 4 + 12.0 / n),
    "zero3": (lambda n: 16.0 / n, lambda n: 16.0 / n),
    "fsdp": (lambda n: 16.0 / n, lambda n: 16.0 / n),
}


def spec_model_states(stage, precision, n):
    """Model states per rank / P that docs/SPEC.md gives, or None (no formula for this stage)."""
    f = MODEL_STATES.get(stage)
    if f is None or precision not in ("bf16", "fp32"):
        return None
    return f[0 if precision == "bf16" else 1](n)


def read_log(path):
    """(per-step records, summary or None); ([], None) if the file is missing or unreadable."""
    steps, summary = [], None
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash: the rest still counts
                if "summary" in obj:
                    summary = obj["summary"]
                elif "step" in obj:
                    steps.append(obj)
    except OSError:
        pass
    return steps, summary


def timing(steps, summary, warmup):
    """{'ms', 'tokens_per_s', 'timed'}: median over steps >= warmup (all steps if none are left)."""
    ms = [s["ms"] for s in steps if s["step"] >= warmup] or [s["ms"] for s in steps]
    out = {"ms": None, "tokens_per_s": None, "timed": len(ms)}
    if ms:
        out["ms"] = statistics.median(ms)
        s0 = steps[0]
        tokens = round(s0["tokens_per_s"] * s0["ms"] / 1e3) if s0["ms"] > 0 else 0
        out["tokens_per_s"] = tokens / (out["ms"] / 1e3) if out["ms"] > 0 and tokens else None
    elif summary:
        out["ms"], out["tokens_per_s"] = summary.get("median_ms"), summary.get("tokens_per_s")
    return out


def peak_device_bytes(summary):
    """Ours: the largest device peak over the ranks; PyTorch: max_memory_allocated."""
    if summary is None:
        return None
    if "memory" in summary:
        peaks = [r.get("device", {}).get("peak_total") for r in summary["memory"]]
        peaks = [p for p in peaks if p is not None]
        return max(peaks) if peaks else None
    return summary.get("peak_memory_bytes")


def side(path, warmup, peak):
    steps, summary = read_log(path)
    if not steps and summary is None:
        return {"log": path, "error": "no run log (the run failed or did not run)"}
    t = timing(steps, summary, warmup)
    fpt = (summary or {}).get("flops_per_token")
    res = {"log": path, "ms": t["ms"], "tokens_per_s": t["tokens_per_s"], "timed_steps": t["timed"],
           "flops_per_token": fpt, "mfu": mfu.mfu(fpt, t["tokens_per_s"], peak),
           "peak_device_bytes": peak_device_bytes(summary),
           "loss_first": steps[0]["loss"] if steps else None, "loss_last": steps[-1]["loss"] if steps else None,
           "steps": len(steps), "summary": summary is not None}
    for k in ("model", "precision", "compute", "ranks", "batch"):
        res[k] = (summary or {}).get(k)
    if summary is None:
        res["error"] = "no summary line: the run stopped after %d steps" % len(steps)
    return res


def gib(b):
    if b is None:
        return "-"
    return "%.2f GiB" % (b / 2**30) if b >= 2**30 else "%.1f MiB" % (b / 2**20)


def num(x, fmt):
    return "-" if x is None else fmt % x


def verdict(ok):
    return "n/a" if ok is None else ("MET" if ok else "MISSED")


def table(headers, rows):
    w = [max(len(str(r[i])) for r in [headers] + rows) for i in range(len(headers))]
    line = lambda r: "  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(r))
    return "\n".join([line(headers), "  ".join("-" * x for x in w)] + [line(r) for r in rows])


def compare(ours, torch, peak, peak_src, warmup, label=None, variant=None):
    """Text of table 1 and its verdicts (variant: how this run of ours differs, for the header)."""
    o, t = ours, torch
    ratio = (o["tokens_per_s"] / t["tokens_per_s"]
             if o.get("tokens_per_s") and t.get("tokens_per_s") else None)
    ok_ratio = None if ratio is None else ratio >= TARGET_RATIO
    ok_mfu = None if o.get("mfu") is None else o["mfu"] >= TARGET_MFU
    pct = lambda x: "-" if x is None else "%.1f%%" % (100 * x)
    rows = [
        ["tokens/s", num(o.get("tokens_per_s"), "%.0f"), num(t.get("tokens_per_s"), "%.0f"),
         num(ratio, "%.2fx"), ">= %.2fx" % TARGET_RATIO, verdict(ok_ratio)],
        ["ms/step (median, from step %d)" % warmup, num(o.get("ms"), "%.2f"), num(t.get("ms"), "%.2f"),
         num(t["ms"] / o["ms"] if o.get("ms") and t.get("ms") else None, "%.2fx"), "", ""],
        ["MFU", pct(o.get("mfu")), pct(t.get("mfu")), "", ">= %.0f%%" % (100 * TARGET_MFU), verdict(ok_mfu)],
        ["peak device memory", gib(o.get("peak_device_bytes")), gib(t.get("peak_device_bytes")), "", "", ""],
        ["loss, first / last step", "%s / %s" % (num(o.get("loss_first"), "%.4f"), num(o.get("loss_last"), "%.4f")),
         "%s / %s" % (num(t.get("loss_first"), "%.4f"), num(t.get("loss_last"), "%.4f")), "", "", ""],
    ]
    cfg = next((s for s in (o, t) if s.get("model")), None)
    title = ("%s %s%s, %s rank, B=%s" % (cfg["model"], cfg.get("precision"),
                                         " (compute %s)" % o["compute"] if o.get("compute") else "",
                                         cfg.get("ranks"), cfg.get("batch"))
             if cfg else label or "ours vs PyTorch")
    ours_header = "zero-to-fsdp dp" + (" (%s)" % variant if variant else "")
    lines = [table([title, ours_header, "PyTorch eager", "ratio", "target", "verdict"], rows)]
    for name, s in (("ours", o), ("PyTorch", t)):
        if s.get("error"):
            lines.append("%s: %s (%s)" % (name, s["error"], s["log"]))
    fo, ft = o.get("flops_per_token"), t.get("flops_per_token")
    lines.append("MFU = flops_per_token x tokens/s / peak; flops_per_token %s%s; peak %s"
                 % (num(fo, "%.0f"), "" if fo is None or ft is None or fo == ft else
                    " (PyTorch's log says %.0f: NOT the same model?)" % ft,
                    "%.1f TFLOP/s (%s)" % (peak / 1e12, peak_src) if peak else peak_src))
    lines.append("memory: ours = the rank's tracked device allocations at their peak; PyTorch = "
                 "torch.cuda.max_memory_allocated()")
    return "\n".join(lines), {"ratio": ratio, "ratio_met": ok_ratio, "mfu_met": ok_mfu}


def stage_rows(paths, warmup):
    rows, data = [], []
    for path in paths:
        steps, summary = read_log(path)
        name = os.path.basename(path)
        name = name[:-len(".jsonl")] if name.endswith(".jsonl") else name
        if summary is None:
            rows.append([name, "", "no summary in its log (failed, timed out or skipped)", "", "", "", ""])
            data.append({"log": path, "error": "no summary"})
            continue
        t = timing(steps, summary, warmup)
        n = summary.get("ranks", 1)
        states = [r.get("device", {}).get("model_states") for r in summary.get("memory", [])]
        states = max(s for s in states if s is not None) / summary["params"] if any(
            s is not None for s in states) and summary.get("params") else None
        expect = spec_model_states(summary.get("stage"), summary.get("precision"), n)
        peak = peak_device_bytes(summary)
        rows.append([summary.get("stage", name), str(n), num(t["ms"], "%.1f"), num(t["tokens_per_s"], "%.0f"),
                     gib(peak), num(states, "%.2f"), num(expect, "%.2f")])
        data.append({"log": path, "stage": summary.get("stage"), "ranks": n, "ms": t["ms"],
                     "tokens_per_s": t["tokens_per_s"], "peak_device_bytes_per_rank": peak,
                     "model_states_per_P": states, "spec_model_states_per_P": expect})
    text = table(["stage", "ranks", "ms/step", "tok/s", "peak device/rank", "states/P",
                  "SPEC"], rows) if rows else "(no stage runs)"
    return text, data


def modeled_rows(paths, measured):
    """Table 3: each modeled run beside the measured stage run of its stage and ranks (stage_rows' data)."""
    rows, data = [], []
    for path in paths:
        steps, summary = read_log(path)
        if summary is None or summary.get("clock") != "modeled":
            rows.append([os.path.basename(path), "", "not a modeled run's log (failed, or not run)", "", ""])
            data.append({"log": path, "error": "no modeled summary"})
            continue
        stage, n = summary.get("stage"), summary.get("ranks", 1)
        modeled = statistics.median(s["ms"] for s in steps) if steps else summary.get("median_ms")
        m = next((d for d in measured if d.get("stage") == stage and d.get("ranks") == n and d.get("ms")), None)
        ratio = modeled / m["ms"] if m and modeled else None
        rows.append([stage, str(n), num(m["ms"] if m else None, "%.1f"), num(modeled, "%.1f"), num(ratio, "%.2f")])
        data.append({"log": path, "stage": stage, "ranks": n, "measured_ms": m["ms"] if m else None,
                     "modeled_ms": modeled, "modeled_over_measured": ratio,
                     "modeled_on": summary.get("clock_detail")})
    detail = next((d["modeled_on"] for d in data if d.get("modeled_on")), "the modeled clock")
    text = table(["stage", "ranks", "measured ms/step", "modeled ms/step", "modeled/measured"], rows)
    return text + "\nmodeled: " + detail + " (docs/SPEC.md section 13), dry runs of the same flags", data


def main(argv=None):
    ap = argparse.ArgumentParser(description="gpu_check.sh's benchmark tables (see the header).")
    ap.add_argument("--gpu", default="", help="device name, as nvidia-smi prints it (for the peak)")
    ap.add_argument("--ours", help="run log of build-gpu/00_data_parallel/dp (the timing run)")
    ap.add_argument("--torch", help="run log of bench/torch_ref.py --device cuda (the timing run)")
    ap.add_argument("--ours-flash", help="run log of the same dp run with --attention flash (a second table 1)")
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the timing median")
    ap.add_argument("--label", help="title of the first table when neither log says what ran")
    ap.add_argument("--stage", action="append", default=[], help="run log of a stage run (repeat)")
    ap.add_argument("--stage-warmup", type=int, default=2, help="steps left out of the stage runs' median")
    ap.add_argument("--modeled", action="append", default=[],
                    help="run log of a stage run's dry run on the modeled clock (repeat): table 3")
    ap.add_argument("--json", help="also write the numbers here as JSON")
    args = ap.parse_args(argv)
    if args.warmup < 0 or args.stage_warmup < 0:
        ap.error("--warmup and --stage-warmup must be >= 0")
    try:
        peak, peak_src = mfu.peak_flops(args.gpu)
    except mfu.PeakError as e:
        ap.error(str(e))
    out = {"gpu": args.gpu, "peak_flops": peak, "peak_source": peak_src}
    if args.ours or args.torch:
        ours = side(args.ours or "", args.warmup, peak)
        torch = side(args.torch or "", args.warmup, peak)
        text, verdicts = compare(ours, torch, peak, peak_src, args.warmup, args.label)
        print(text)
        out.update({"ours": ours, "torch": torch, **verdicts})
        if args.ours_flash:
            flash = side(args.ours_flash, args.warmup, peak)
            text, verdicts = compare(flash, torch, peak, peak_src, args.warmup, args.label,
                                     variant="--attention flash")
            print()
            print(text)
            out.update({"ours_flash": flash, **{"flash_" + k: v for k, v in verdicts.items()}})
    if args.stage:
        if args.ours or args.torch:
            print()
        text, data = stage_rows(args.stage, args.stage_warmup)
        print(text)
        out["stages"] = data
    if args.modeled:
        print()
        text, data = modeled_rows(args.modeled, out.get("stages", []))
        print(text)
        out["modeled"] = data
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
