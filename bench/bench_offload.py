#!/usr/bin/python3
# bench_offload.py: stage 05's step against stage 04's, mode by mode, with
# the step's phases (scripts/bench.sh --offload runs it; results go in
# bench/RESULTS.md). Model small, N = 2 and 4 ranks, B = 2 per rank, bf16,
# one token file for every run. Modes: fsdp (stage 04), offload, offload
# --offload-params, offload --offload-dir (a temporary folder), and offload
# --delay-update when the build has it. Step time: the median of each run
# log's steps after --warmup, the best of --repeats runs, the order reversed
# on every other repeat. The phases are the medians of the same steps'
# phases_ms. Target on the CPU device: every offload mode within 1.2x of
# stage 04's step time (the copies are memcpys here, the optimizer the same
# arithmetic); on a GPU the copies cross PCIe and the optimizer leaves the
# GPU for the CPU, which 05_offload/README.md works out.
#
#   python3 bench/bench_offload.py --build build --repeats 3 --markdown /tmp/offload.md

import argparse
import os
import re
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_util as rb  # noqa: E402

TARGET_VS_FSDP = 1.2
MODEL, BATCH, PRECISION = "small", 2, "bf16"
UNKNOWN_FLAG = re.compile(r"not expected|unknown (option|flag|argument)|unrecognized", re.I)


def modes(folder):
    return [
        ("fsdp", "04_fsdp/fsdp", []),
        ("offload", "05_offload/offload", []),
        ("offload --offload-params", "05_offload/offload", ["--offload-params"]),
        ("offload --offload-dir", "05_offload/offload", ["--offload-dir", folder]),
        ("offload --delay-update", "05_offload/offload", ["--delay-update"]),
    ]


def run_one(args, exe, extra, ranks, data, log):
    cmd = [os.path.join(args.build, exe), "--model", MODEL, "--ranks", str(ranks), "--batch", str(BATCH),
           "--steps", str(args.steps), "--precision", PRECISION, "--data", data, "--quiet", "--log-json", log] + extra
    rc, out, err, _ = rb.run(cmd, env=rb.base_env(), timeout=args.timeout)
    if rc == 2 and UNKNOWN_FLAG.search(err or out or ""):
        return {"skipped": rb.tail(err or out, 1)}
    if rc != 0 or not os.path.exists(log):
        return {"error": "exit %s: %s" % (rc, rb.tail(err or out, 3))}
    steps, summary = rb.read_log(log)
    timed = [s for s in steps if s["step"] >= args.warmup]
    phases = {}
    for s in timed:
        for k, v in (s.get("phases_ms") or {}).items():
            phases.setdefault(k, []).append(v)
    transfers = ((summary or {}).get("comm") or [{}])[0].get("transfers_per_step") or {}
    return {"median_ms": rb.timed_median(steps, args.warmup),
            "phases": {k: statistics.median(v) for k, v in phases.items()}, "transfers": transfers}


def main():
    ap = argparse.ArgumentParser(description="stage 05's step against stage 04's, with the phases")
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()
    R = rb.R
    tmp = tempfile.mkdtemp(prefix="zf-bench-offload-")
    data = os.path.join(tmp, "corpus.txt")
    rb.write_corpus(data)
    folder = os.path.join(tmp, "offload")
    os.makedirs(folder)
    R.title("E. Offload: stage 05 beside stage 04, %s, B=%d per rank, %s" % (MODEL, BATCH, PRECISION))
    R.note("CPU: %s; %d cores; load before: %s" % (rb.cpu_model(), os.cpu_count() or 0, rb.loadavg()))
    ok_all = True
    for ranks in [int(x) for x in args.ranks.split(",")]:
        results = {}
        for rep in range(args.repeats):
            order = modes(folder) if rep % 2 == 0 else list(reversed(modes(folder)))
            for label, exe, extra in order:
                log = os.path.join(tmp, "%s_%d_%d.jsonl" % (re.sub(r"\W+", "_", label), ranks, rep))
                results.setdefault(label, []).append(run_one(args, exe, extra, ranks, data, log))
        base = rb.best(results["fsdp"]).get("median_ms")
        rows = []
        for label, _, _ in modes(folder):
            r = rb.best(results[label])
            if "skipped" in r or "error" in r:
                rows.append([label, r.get("skipped") and "skipped" or r["error"], "", "", "", ""])
                continue
            ratio = r["median_ms"] / base if base else None
            ok = None if label == "fsdp" else (ratio is not None and ratio <= TARGET_VS_FSDP)
            ok_all = ok_all and ok is not False
            ph = r["phases"]
            order = ["fwd", "bwd", "cpu adamw", "adamw wait", "h2d", "wait"]
            names = [k for k in order if k in ph] + sorted(k for k in ph if k not in order)
            split = ", ".join("%s %s" % (k, rb.fmt_ms(ph[k])) for k in names) if ph else "-"
            t = r["transfers"]
            moved = ("%.2f / %.2f MiB" % (t.get("to_host_bytes", 0) / 2**20, t.get("to_device_bytes", 0) / 2**20)
                     if t else "-")
            rows.append([label, rb.fmt_ms(r["median_ms"]), rb.fmt_ratio(ratio),
                         "" if ok is None else rb.verdict(ok), moved, split])
        R.line("%s:" % rb.plural(ranks, "rank"))
        R.table(["mode", "ms/step", "vs fsdp", "<= %.1fx" % TARGET_VS_FSDP, "d2h / h2d per step", "phases (ms)"],
                rows, ["<", ">", ">", ">", ">", "<"])
    R.note("command: python3 bench/bench_offload.py --build %s --ranks %s --steps %d --warmup %d --repeats %d"
           % (args.build, args.ranks, args.steps, args.warmup, args.repeats))
    if args.markdown:
        R.write(args.markdown)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
