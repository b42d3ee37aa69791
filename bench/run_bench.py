#!/usr/bin/python3
# run_bench.py: the benchmark report of zero-to-fsdp. Normally started through
# scripts/bench.sh (which installs PyTorch and builds first); by hand:
#
#   /usr/bin/python3 bench/run_bench.py [--markdown bench/last_run.md] [--repeats 2]
#
# Every number is printed next to its peer measured in the same run:
#   A. step time and tokens/s of build/00_data_parallel/dp (tiny and small;
#      1, 2, 4 ranks; fp32, B=8 per rank) beside bench/torch_ref.py on the same
#      configuration (1 process for 1 rank, DDP over gloo for 2 and 4). PyTorch
#      runs with OPENBLAS_CORETYPE set to the kernel set dp reports using, and,
#      for the two target configurations, also as Debian ships it (no
#      OPENBLAS_CORETYPE).
#   B. build/bench/bench_kernels (kernel GFLOP/s vs the sgemm rate) and
#      build/bench/bench_comm (threads collectives vs memcpy), with gloo's
#      all-reduce bandwidth measured by bench/torch_allreduce.py.
#   C. a loss cross-check: dp and torch_ref from the same initial model
#      (dp --save-init) on the same token file, step by step.
#   D. (with --fsdp or --only fsdp) stage 04 (FSDP) in its modes beside dp,
#      zero3 and PyTorch FSDP2 (torch_ref.py --fsdp): step time, memory per
#      rank, losses; bench/bench_fsdp.py says what is run and measured. It
#      needs PyTorch 2.4 or newer: scripts/bench.sh --fsdp runs it under
#      .venv-bench/'s interpreter, which it makes once.
# It ends with a summary table, and writes everything as markdown to
# --markdown (default bench/last_run.md, git-ignored) for bench/RESULTS.md.
#
# Timing rule, for both sides alike: the median of the per-step times of the
# run log (--log-json), leaving out the first --warmup steps. With --repeats R,
# each configuration runs R times (dp and PyTorch alternating) and the lowest
# median is kept: on a shared machine it is the least disturbed.
#
# Standard library only; PyTorch is needed by the scripts it starts, which run
# under the same interpreter (Debian's /usr/bin/python3 with python3-torch).

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

# bench/bench_util.py: the report, commands, run logs and formats every section shares.
from bench_util import (CONTEXT, CROSSCHECK_TOL, ROOT, R, base_env, best, core_from_blas, fmt_ms,  # noqa: F401
                        fmt_ratio, fmt_tps, loadavg, plural, read_log, run, tail, timed_median, torch_env,
                        verdict, write_corpus)

# The targets of the project (README / bench/RESULTS.md).
TARGET_SMALL_SPEEDUP = 2.0      # dp 1 rank small B=8 fp32 tokens/s >= 2x PyTorch 1 process
TARGET_BUSBW_VS_MEMCPY = 0.5    # threads busbw >= 0.5x memcpy: all-reduce at 16 MiB, 4 ranks; all-gather
                                # (in place, as the stages issue it) and reduce-scatter at 1 MiB and above
TARGET_BUSBW_VS_GLOO = 10.0     # ... and >= 10x gloo's all-reduce busbw


# ---------------------------------------------------------------------------
# A. training step time

class Runner:
    def __init__(self, args, tmp):
        self.args, self.tmp = args, tmp
        self.dp = os.path.join(args.build, "00_data_parallel", "dp")
        self.torch_ref = os.path.join(ROOT, "bench", "torch_ref.py")
        self.count = 0
        self.problems = []   # (what, detail) for the report
        self.lines = []      # one line per timed run, for the markdown's details

    def _log(self, tag):
        self.count += 1
        return os.path.join(self.tmp, "%02d_%s.jsonl" % (self.count, tag))

    def dp_run(self, model, ranks, batch, steps, extra=(), quiet=False):
        log = self._log("dp_%s_%d" % (model, ranks))
        cmd = [self.dp, "--model", model, "--ranks", str(ranks), "--batch", str(batch), "--steps", str(steps),
               "--precision", "fp32", "--quiet", "--log-json", log] + list(extra)
        return self._finish("dp %s %s" % (model, plural(ranks, "rank")), cmd, base_env(), log,
                            ranks * batch * CONTEXT[model], quiet)

    def torch_run(self, model, ranks, batch, steps, coretype, extra=()):
        log = self._log("torch_%s_%d" % (model, ranks))
        cmd = [sys.executable, self.torch_ref, "--model", model, "--ranks", str(ranks), "--batch", str(batch),
               "--steps", str(steps), "--warmup", str(min(self.args.warmup, max(0, steps - 1))),
               "--precision", "fp32", "--log-json", log] + list(extra)
        return self._finish("torch %s %s%s" % (model, plural(ranks, "rank"), "" if coretype else " (Debian BLAS)"),
                            cmd, torch_env(coretype), log, ranks * batch * CONTEXT[model])

    def _finish(self, what, cmd, env, log, tokens, quiet=False):
        load = loadavg()
        rc, out, err, secs = run(cmd, env=env, timeout=self.args.timeout)
        res = {"what": what, "rc": rc, "load": load, "seconds": secs, "cmd": cmd}
        if rc != 0 or not os.path.exists(log):
            res["error"] = "exit %s: %s" % (rc, tail(err or out, 4))
            self.problems.append((what, res["error"]))
            print("  %-36s FAILED (%s)" % (what, res["error"].replace("\n", " | ")))
            return res
        steps, summary = read_log(log)
        res["steps"], res["summary"] = steps, summary or {}
        res["median_ms"] = timed_median(steps, self.args.warmup)
        res["tokens_per_s"] = tokens / (res["median_ms"] / 1e3) if res["median_ms"] else None
        if summary is None:
            self.problems.append((what, "no summary line in the run log"))
        if not quiet:
            self.lines.append("%-36s %8s ms/step %9s tok/s   (load %s, %.1f s)"
                              % (what, fmt_ms(res["median_ms"]), fmt_tps(res["tokens_per_s"]), load, secs))
            print("  %-36s %8s ms/step %9s tok/s   (load %s, %.1f s)"
                  % (what, fmt_ms(res["median_ms"]), fmt_tps(res["tokens_per_s"]), load, secs))
            sys.stdout.flush()
        return res



def section_training(args, runner):
    R.title("A. Training step: dp (threads) vs PyTorch (torch_ref.py), fp32, B=%d per rank" % args.batch)
    R.note("Each run: %d steps; median of steps %d..%d (the first %d left out), for both sides alike; "
           "best of %d run(s) per configuration. PyTorch: 1 process for 1 rank, DDP over gloo "
           "(loopback) for 2 and 4; OMP_WAIT_POLICY=PASSIVE. Ranks share the machine's %d hardware threads."
           % (args.steps, args.warmup, args.steps - 1, args.warmup, args.repeats, os.cpu_count() or 1))

    # The kernel set dp selects, read from a short run's log, so PyTorch gets the same.
    probe = runner.dp_run("tiny", 1, 1, 1, quiet=True)
    dp_blas = probe.get("summary", {}).get("blas")
    core = core_from_blas(dp_blas)
    R.note("dp's BLAS: %s. PyTorch runs with OPENBLAS_CORETYPE=%s (the same kernel set) unless marked "
           "\"Debian\" (no OPENBLAS_CORETYPE: the kernels Debian's OpenBLAS picks by itself)."
           % (dp_blas or "?", core or "(unset: not found in dp's log)"))

    results = {}
    for model in args.models:
        for ranks in args.ranks:
            dps, tos = [], []
            for rep in range(args.repeats):
                # alternate the order, so that a drift of the machine's load hits both sides
                order = ("dp", "torch") if rep % 2 == 0 else ("torch", "dp")
                for side in order:
                    if side == "dp":
                        dps.append(runner.dp_run(model, ranks, args.batch, args.steps))
                    else:
                        tos.append(runner.torch_run(model, ranks, args.batch, args.steps, core))
            results[(model, ranks, "dp")] = best(dps)
            results[(model, ranks, "torch")] = best(tos)

    # PyTorch as Debian ships it, for the two target configurations.
    debian = {}
    for model, ranks in (("small", 1), ("tiny", 4)):
        if model in args.models and ranks in args.ranks:
            debian[(model, ranks)] = best([runner.torch_run(model, ranks, args.batch, args.steps, None)
                                           for _ in range(args.repeats)])

    torch_blas = next((r["summary"].get("blas") for k, r in results.items() if k[2] == "torch" and r.get("summary")), None)
    deb_blas = next((r["summary"].get("blas") for r in debian.values() if r.get("summary")), None)
    R.note("PyTorch BLAS (matched): %s  \nPyTorch BLAS (Debian): %s" % (torch_blas or "?", deb_blas or "?"))

    rows = []
    for model in args.models:
        for ranks in args.ranks:
            d, t = results[(model, ranks, "dp")], results[(model, ranks, "torch")]
            row = ["%s, %s" % (model, plural(ranks, "rank")),
                   fmt_ms(d.get("median_ms")), fmt_ms(t.get("median_ms")),
                   fmt_tps(d.get("tokens_per_s")), fmt_tps(t.get("tokens_per_s")),
                   fmt_ratio(d["tokens_per_s"] / t["tokens_per_s"]) if d.get("tokens_per_s") and t.get("tokens_per_s") else "-"]
            db = debian.get((model, ranks))
            if db is not None:
                row += [fmt_ms(db.get("median_ms")),
                        fmt_ratio(d["tokens_per_s"] / db["tokens_per_s"]) if d.get("tokens_per_s") and db.get("tokens_per_s") else "-"]
            else:
                row += ["", ""]
            row.append("%s / %s" % (d.get("load", "?"), t.get("load", "?")))
            rows.append(row)
    R.table(["config", "dp ms", "torch ms", "dp tok/s", "torch tok/s", "dp/torch",
             "torch Debian ms", "dp/Debian", "load dp/torch"], rows)
    R.md.append("<details><summary>every run, in order</summary>\n\n```\n%s\n```\n</details>\n"
                % "\n".join(runner.lines))
    return results, debian, core, dp_blas


# ---------------------------------------------------------------------------
# B. kernels and communication

def parse_kernels(text):
    """{'peak': sgemm 1-thread GFLOP/s, 'rows': [(name, ms, gflops, pct)], 'step_ms': x}"""
    out = {"rows": []}
    for line in text.splitlines():
        m = re.match(r"^(\S.*?)\s{2,}(\S.*?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s*$", line)
        if m:
            out["rows"].append((m.group(1).strip(), float(m.group(3)), float(m.group(4)), float(m.group(5))))
            if m.group(1).startswith("sgemm, 1 thread"):
                out["peak"] = float(m.group(4))
        m = re.search(r"kernel time of one training step.*?:\s*([\d.]+)\s*ms", line)
        if m:
            out["step_ms"] = float(m.group(1))
    return out


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_comm(text):
    """{(collective, ranks): {bytes: {column: value}}} from bench_comm's tables."""
    tables, key, cols = {}, None, None
    for line in text.splitlines():
        m = re.match(r"^#\s*(\w[\w ]*?),\s*(\d+)\s+ranks?", line)
        if m:
            key, cols = (m.group(1), int(m.group(2))), None
            tables[key] = {}
            continue
        if key is None or not line.strip() or line.startswith("#"):
            continue
        if cols is None and re.search(r"busbw", line):
            cols = line.split()
            continue
        m = re.match(r"^\s*([\d.]+)\s*(B|KiB|MiB|GiB)\s+(.*)$", line)
        if m and cols:
            size = int(round(float(m.group(1)) * _UNITS[m.group(2)]))
            vals = m.group(3).split()
            names = cols[1:]
            if len(vals) == len(names):
                row = {}
                for n, v in zip(names, vals):
                    try:
                        row[n] = float(v)
                    except ValueError:
                        pass
                tables[key][size] = row
    return tables


def human_bytes(n):
    for unit in ("GiB", "MiB", "KiB"):
        if n >= _UNITS[unit]:
            return "%g %s" % (n / _UNITS[unit], unit)
    return "%d B" % n


def comm_why(name, ranks, size, row):
    """Where a collective's time went, from bench_comm's split of the row."""
    t, moving, rest = col(row, "time"), col(row, "bytes"), col(row, "rest")
    if t is None or moving is None or rest is None:
        return "%s %d ranks at %s: no split of the time in bench_comm's output" % (name, ranks, human_bytes(size))
    sync = t - moving - rest
    text = ("%s %d ranks at %s: %.0f us = %.0f us moving the bytes (%d threads on %d cores, no synchronisation) "
            "+ %.0f us synchronising (the same collective with one element a rank)"
            % (name, ranks, human_bytes(size), t, moving, ranks, os.cpu_count() or 0, sync))
    text += (" + %.0f us rest" % rest) if rest >= 0 else (" - %.0f us (the two timings' noise)" % -rest)
    ratio = col(row, "bus/memcpy")
    if ratio is not None and moving > 0:
        text += "; the bytes alone, with no synchronisation, would give %.2fx memcpy" % (ratio * t / moving)
    return text


def col(row, prefix):
    for k, v in row.items():
        if k.lower().startswith(prefix):
            return v
    return None


def section_kernels_comm(args, runner):
    res = {}
    R.title("B1. Kernels: build/bench/bench_kernels")
    exe = os.path.join(args.build, "bench", "bench_kernels")
    load = loadavg()
    rc, out, err, secs = run([exe], env=base_env(), timeout=args.timeout)
    R.note("load average %s at the start; %.1f s" % (load, secs))
    if rc != 0:
        runner.problems.append(("bench_kernels", "exit %s: %s" % (rc, tail(err or out, 4))))
    R.pre(out + (("\n" + err) if rc != 0 else ""))
    res["kernels"] = parse_kernels(out)

    R.title("B2. Communication: build/bench/bench_comm vs memcpy and gloo")
    exe = os.path.join(args.build, "bench", "bench_comm")
    load = loadavg()
    rc, out, err, secs = run([exe], env=base_env(), timeout=args.timeout)
    R.note("load average %s at the start; %.1f s" % (load, secs))
    if rc != 0:
        runner.problems.append(("bench_comm", "exit %s: %s" % (rc, tail(err or out, 4))))
    R.pre(out + (("\n" + err) if rc != 0 else ""))
    res["comm"] = parse_comm(out)

    gl_json = os.path.join(runner.tmp, "gloo_allreduce.json")
    load = loadavg()
    rc, out, err, secs = run([sys.executable, os.path.join(ROOT, "bench", "torch_allreduce.py"),
                              "--size-mib", "16", "--ranks", "4", "--json", gl_json],
                             env=torch_env(None), timeout=args.timeout)
    R.note("gloo peer (bench/torch_allreduce.py, 4 local processes, loopback; load average %s at the start; %.1f s):"
           % (load, secs))
    R.pre(out.strip() if rc == 0 else "FAILED, exit %s:\n%s" % (rc, tail(err or out, 8)))
    if rc == 0 and os.path.exists(gl_json):
        with open(gl_json) as f:
            res["gloo"] = json.load(f)
    else:
        runner.problems.append(("torch_allreduce.py", "exit %s: %s" % (rc, tail(err or out, 4))))
    return res


# ---------------------------------------------------------------------------
# C. loss cross-check

def section_crosscheck(args, runner, core):
    R.title("C. Loss cross-check: dp vs torch_ref.py, same initial model and data")
    data = os.path.join(runner.tmp, "corpus.txt")
    nbytes = write_corpus(data)
    init = os.path.join(runner.tmp, "init.safetensors")
    steps = 20
    cfg = ["--data", data]
    d = runner.dp_run("tiny", 2, 4, steps, extra=cfg + ["--save-init", init])
    if "error" in d or not os.path.exists(init):
        R.note("dp failed; no cross-check. %s" % d.get("error", "no --save-init file"))
        return {"error": True}
    t = runner.torch_run("tiny", 2, 4, steps, core, extra=cfg + ["--init", init])
    if "error" in t:
        R.note("torch_ref failed; no cross-check. %s" % t["error"])
        return {"error": True}
    R.note("Config: --model tiny --ranks 2 --batch 4 --steps %d, fp32, lr 3e-4, clip 1.0; data: %d bytes of "
           "generated sentences (raw bytes, V=256); dp --save-init -> torch_ref --init (DDP gloo, 2 processes)."
           % (steps, nbytes))
    dl = {s["step"]: s["loss"] for s in d["steps"]}
    tl = {s["step"]: s["loss"] for s in t["steps"]}
    common = sorted(set(dl) & set(tl))
    diffs = [abs(dl[s] - tl[s]) for s in common]
    rows = []
    for s in common:
        if s < 3 or s % 4 == 3 or s == common[-1]:
            rows.append([str(s), "%.6f" % dl[s], "%.6f" % tl[s], "%.2e" % abs(dl[s] - tl[s])])
    R.table(["step", "dp loss", "torch loss", "|diff|"], rows, ["<", ">", ">", ">"])
    out = {"max": max(diffs) if diffs else None, "first": diffs[0] if diffs else None,
           "last": diffs[-1] if diffs else None, "steps": len(common),
           "loss0": dl.get(0), "lossN": dl.get(common[-1]) if common else None}
    if diffs:
        worst = common[diffs.index(out["max"])]
        R.note("max |loss difference| over %d steps: %.2e (at step %d); step 0: %.2e; last step: %.2e. "
               "Loss falls from %.4f to %.4f."
               % (len(common), out["max"], worst, out["first"], out["last"], out["loss0"], out["lossN"]))
    return out


# ---------------------------------------------------------------------------

def machine_lines():
    model, cpus, tpc = "?", str(os.cpu_count()), None
    try:
        lscpu = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
        for line in lscpu.splitlines():
            k, _, v = line.partition(":")
            k, v = k.strip(), v.strip()
            if k == "Model name":
                model = v
            elif k == "CPU(s)":
                cpus = v
            elif k == "Thread(s) per core":
                tpc = v
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            fl = next((l for l in f if l.startswith("flags")), "")
        flags = ", ".join(x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if (" %s " % x) in fl + " ")
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(l for l in f if l.startswith("MemTotal")).split()[1])
        mem = "%.1f GiB" % (kb / 2**20)
    except (OSError, StopIteration, ValueError):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True).stdout.strip() or "?"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
    try:
        torch_v = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                 env=torch_env(None)).stdout.strip() or "not importable"
    except OSError:
        torch_v = "?"
    return [
        ("machine", "%s; %s CPUs (%s thread(s) per core); %s; %s" % (model, cpus, tpc or "?", flags or "-", mem)),
        ("date", datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")),
        ("commit", commit + (" (with uncommitted changes)" if dirty else "")),
        ("software", "%s; Python %s; PyTorch %s (%s)" % (platform.platform(terse=True), platform.python_version(),
                                                         torch_v, sys.executable)),
        ("load average", "%s at the start (other work on the machine makes every number noisier)"
         % " / ".join("%.2f" % x for x in os.getloadavg())),
    ]


def main():
    ap = argparse.ArgumentParser(description="zero-to-fsdp benchmarks, each beside its peer (see the header).")
    ap.add_argument("--markdown", default=os.path.join(ROOT, "bench", "last_run.md"),
                    help="write the report as markdown here (default bench/last_run.md)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="Meson build folder")
    ap.add_argument("--steps", type=int, default=20, help="steps per training run")
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the median")
    ap.add_argument("--batch", type=int, default=8, help="micro-batch per rank")
    ap.add_argument("--repeats", type=int, default=2, help="runs per configuration, the best median kept")
    ap.add_argument("--models", default="tiny,small", help="comma list of presets for part A")
    ap.add_argument("--ranks", default="1,2,4", help="comma list of rank counts for part A")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: train,kernels,crosscheck")
    ap.add_argument("--fsdp", action="store_true", help="add part D (stage 04 vs PyTorch FSDP2; PyTorch >= 2.4)")
    ap.add_argument("--only", default="", help="comma list of the parts to run, e.g. fsdp (train,kernels,crosscheck,fsdp)")
    ap.add_argument("--fsdp-ranks", default="2,4", help="comma list of rank counts for part D")
    ap.add_argument("--fsdp-steps", type=int, default=0, help="steps per run of part D (default: --steps)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds before one command is given up")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder of logs")
    args = ap.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    args.ranks = [int(x) for x in args.ranks.split(",") if x]
    parts = {"train", "kernels", "crosscheck", "fsdp"}
    only = set(x for x in args.only.split(",") if x)
    if only - parts:
        ap.error("--only %s: unknown part(s) %s; the parts are %s"
                 % (args.only, ",".join(sorted(only - parts)), ",".join(sorted(parts))))
    run_parts = only or ({"train", "kernels", "crosscheck"} | ({"fsdp"} if args.fsdp else set()))
    skip = set(x for x in args.skip.split(",") if x) | (parts - run_parts)
    args.fsdp_ranks = [int(x) for x in args.fsdp_ranks.split(",") if x]
    args.fsdp_steps = args.fsdp_steps or args.steps
    if args.steps <= args.warmup or args.fsdp_steps <= args.warmup:
        ap.error("--steps and --fsdp-steps must exceed --warmup")
    needed = ["00_data_parallel/dp"]
    if "kernels" not in skip:
        needed += ["bench/bench_kernels", "bench/bench_comm"]
    if "fsdp" not in skip:
        needed += ["03_zero3/zero3", "04_fsdp/fsdp"]
    for exe in needed:
        if not os.access(os.path.join(args.build, exe), os.X_OK):
            sys.exit("run_bench.py: %s/%s is missing: build first (scripts/build.sh)" % (args.build, exe))

    t_start = time.time()
    tmp = tempfile.mkdtemp(prefix="zf_bench_")
    runner = Runner(args, tmp)
    R.md.append("# zero-to-fsdp benchmark run\n")
    info = machine_lines()
    for k, v in info:
        R.line("%-13s %s" % (k + ":", v))

    train = debian = kc = cross = fsdp = None
    core = dp_blas = None
    try:
        if "train" not in skip:
            train, debian, core, dp_blas = section_training(args, runner)
        if "kernels" not in skip:
            kc = section_kernels_comm(args, runner)
        if "crosscheck" not in skip:
            if core is None:
                probe = runner.dp_run("tiny", 1, 1, 1, quiet=True)
                dp_blas = probe.get("summary", {}).get("blas")
                core = core_from_blas(dp_blas)
            cross = section_crosscheck(args, runner, core)
        if "fsdp" not in skip:
            if core is None:
                probe = runner.dp_run("tiny", 1, 1, 1, quiet=True)
                dp_blas = probe.get("summary", {}).get("blas")
                core = core_from_blas(dp_blas)
            import bench_fsdp  # bench/, beside this file: section D
            fsdp = bench_fsdp.section_fsdp(args, runner, core)
    finally:
        summary(args, train, debian, kc, cross, runner, time.time() - t_start, fsdp)
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        R.write(args.markdown)
        print("\nmarkdown report: %s" % args.markdown)
        if args.keep:
            print("logs kept in %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def summary(args, train, debian, kc, cross, runner, elapsed, fsdp=None):
    R.title("Summary")
    rows = []
    met = []
    whys = []  # the reading of each miss (bench_comm's split, section D's "  why:" rows): too long for a cell

    def add(name, ours, peer, ratio, target, ok):
        rows.append([name, ours, peer, ratio, target, verdict(ok)])
        if ok is not None:
            met.append(ok)

    if train:
        d = train.get(("small", 1, "dp"), {})
        t = train.get(("small", 1, "torch"), {})
        db = (debian or {}).get(("small", 1), {})
        if d.get("tokens_per_s"):
            if db.get("tokens_per_s"):
                r = d["tokens_per_s"] / db["tokens_per_s"]
                add("small, 1 rank, tok/s vs Debian PyTorch", fmt_tps(d["tokens_per_s"]), fmt_tps(db["tokens_per_s"]),
                    fmt_ratio(r), ">= %.1fx" % TARGET_SMALL_SPEEDUP, r >= TARGET_SMALL_SPEEDUP)
            if t.get("tokens_per_s"):
                r = d["tokens_per_s"] / t["tokens_per_s"]
                add("  same, PyTorch on dp's BLAS kernels", fmt_tps(d["tokens_per_s"]), fmt_tps(t["tokens_per_s"]),
                    fmt_ratio(r), ">= %.1fx" % TARGET_SMALL_SPEEDUP, r >= TARGET_SMALL_SPEEDUP)
        d = train.get(("tiny", 4, "dp"), {})
        t = train.get(("tiny", 4, "torch"), {})
        db = (debian or {}).get(("tiny", 4), {})
        if d.get("median_ms"):
            if db.get("median_ms"):
                add("tiny, 4 ranks, ms/step vs Debian DDP gloo", fmt_ms(d["median_ms"]) + " ms",
                    fmt_ms(db["median_ms"]) + " ms", fmt_ratio(db["median_ms"] / d["median_ms"]),
                    "dp faster", d["median_ms"] < db["median_ms"])
            if t.get("median_ms"):
                add("  same, PyTorch on dp's BLAS kernels", fmt_ms(d["median_ms"]) + " ms",
                    fmt_ms(t["median_ms"]) + " ms", fmt_ratio(t["median_ms"] / d["median_ms"]),
                    "dp faster", d["median_ms"] < t["median_ms"])
        for model in args.models:
            for ranks in args.ranks:
                if (model, ranks) in (("small", 1), ("tiny", 4)):
                    continue
                d, t = train.get((model, ranks, "dp"), {}), train.get((model, ranks, "torch"), {})
                if d.get("median_ms") and t.get("median_ms"):
                    rows.append(["%s, %s, ms/step" % (model, plural(ranks, "rank")),
                                 fmt_ms(d["median_ms"]) + " ms", fmt_ms(t["median_ms"]) + " ms",
                                 fmt_ratio(t["median_ms"] / d["median_ms"]), "(info)", ""])
    if kc:
        ar = kc.get("comm", {}).get(("all_reduce", 4), {}).get(16 << 20)
        gl = kc.get("gloo")
        if ar:
            bus, cp = col(ar, "busbw"), col(ar, "memcpy")
            if bus is not None and cp:
                add("all_reduce 16 MiB 4 ranks, busbw vs memcpy", "%.2f GB/s" % bus, "%.2f GB/s" % cp,
                    "%.3gx" % (bus / cp), ">= %.1fx" % TARGET_BUSBW_VS_MEMCPY, bus >= TARGET_BUSBW_VS_MEMCPY * cp)
            if bus is not None and gl:
                add("all_reduce 16 MiB 4 ranks, busbw vs gloo", "%.2f GB/s" % bus, "%.3f GB/s" % gl["busbw_GBps"],
                    "%.3gx" % (bus / gl["busbw_GBps"]), ">= %.0fx" % TARGET_BUSBW_VS_GLOO,
                    bus >= TARGET_BUSBW_VS_GLOO * gl["busbw_GBps"])
        else:
            rows.append(["all_reduce 16 MiB 4 ranks", "not found in bench_comm's output", "", "", "", "n/a"])
        for name in ("all_gather in place", "reduce_scatter"):
            for ranks in (2, 4):
                table = kc.get("comm", {}).get((name, ranks), {})
                big = [(size, row) for size, row in sorted(table.items()) if size >= 1 << 20]
                ratios = [(col(row, "busbw") / col(row, "memcpy"), size, row) for size, row in big
                          if col(row, "busbw") is not None and col(row, "memcpy")]
                if not ratios:
                    rows.append(["%s %d ranks" % (name, ranks), "not found in bench_comm's output", "", "", "", "n/a"])
                    continue
                r, size, row = min(ratios)
                add("%s %d ranks, busbw vs memcpy (worst size >= 1 MiB: %s)" % (name, ranks, human_bytes(size)),
                    "%.2f GB/s" % col(row, "busbw"), "%.2f GB/s" % col(row, "memcpy"), "%.3gx" % r,
                    ">= %.1fx" % TARGET_BUSBW_VS_MEMCPY, r >= TARGET_BUSBW_VS_MEMCPY)
                if r < TARGET_BUSBW_VS_MEMCPY:
                    whys.append("- " + comm_why(name, ranks, size, row))
        k = kc.get("kernels", {})
        if k.get("peak") and k.get("rows"):
            mat = [r for r in k["rows"] if not r[0].startswith("sgemm") and not r[0].startswith("attention")]
            att = [r for r in k["rows"] if r[0].startswith("attention")]
            if mat:
                rows.append(["Linear kernels (small shapes), GFLOP/s", "%.0f-%.0f" % (min(r[2] for r in mat), max(r[2] for r in mat)),
                             "%.0f (sgemm 1 thr)" % k["peak"], "%.0f-%.0f%%" % (min(r[3] for r in mat), max(r[3] for r in mat)),
                             "(info)", ""])
            if att:
                rows.append(["attention fwd / bwd, GFLOP/s", " / ".join("%.0f" % r[2] for r in att),
                             "%.0f (sgemm 1 thr)" % k["peak"], " / ".join("%.0f%%" % r[3] for r in att), "(info)", ""])
        if k.get("step_ms") and train and train.get(("small", 1, "dp"), {}).get("median_ms"):
            rows.append(["small 1 rank: kernel floor vs dp step", "%.1f ms (1 thread)" % k["step_ms"],
                         fmt_ms(train[("small", 1, "dp")]["median_ms"]) + " ms (dp)", "", "(info)", ""])
    if cross and cross.get("max") is not None:
        add("loss cross-check tiny 2 ranks B=4, max |diff|", "%.2e" % cross["max"], "over %d steps" % cross["steps"],
            "", "<= %.0e" % CROSSCHECK_TOL, cross["max"] <= CROSSCHECK_TOL)
    for name, ours, peer, ratio, target, ok in fsdp or []:
        if target:
            add(name, ours, peer, ratio, target, ok)
        else:
            whys.append("- " + name.strip().replace("why: ", "", 1))
    R.table(["measure", "zero-to-fsdp", "peer", "ratio", "target", "verdict"], rows,
            ["<", ">", ">", ">", "<", "<"])
    if whys:
        R.note("What stands in the way of each miss, from the logs:")
        for w in whys:
            R.line(w)
    if met:
        R.note("%d of %d checks met. Load average now %s. Total time %.0f s."
               % (sum(met), len(met), " / ".join("%.2f" % x for x in os.getloadavg()), elapsed))
    if runner.problems:
        R.note("Problems:")
        for what, detail in runner.problems:
            R.line("- %s: %s" % (what, detail.replace("\n", " | ")))


if __name__ == "__main__":
    main()
