#!/usr/bin/env python3
# bench_adamw.py: the host AdamW of the offload stage (CpuAdamW, through
# build/bench/bench_adamw) beside its peers on the same machine in the same
# run: torch.optim.AdamW(fused=True), torch.optim.AdamW(foreach=True) and
# DeepSpeed's DeepSpeedCPUAdam, each updating one flat float32 tensor of --n
# parameters (float32 gradients, decoupled weight decay), on 1 and 2 threads;
# memcpy of the bytes the update reads as the limit. Prints a markdown table
# of M parameters per second, the fastest of --reps steps of each, best over
# --rounds rounds that alternate ours and the peers (so that a neighbour's
# burst of work on a shared machine does not land on one side only).
#
#   .venv-bench/bin/python bench/bench_adamw.py [--n 16777216] [--threads 1,2] [--reps 10]
#   scripts/bench.sh --adamw            # the same, after making the build
#
# Each thread count runs in a fresh process with OMP_NUM_THREADS set, since
# DeepSpeed's kernel takes its OpenMP threads from there and not from
# torch.set_num_threads. DeepSpeedCPUAdam is compiled on first use (minutes);
# without deepspeed (pip install deepspeed, DS_BUILD_OPS=0) its row says why.

import argparse
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BETAS, LR, EPS, WD = (0.9, 0.95), 3e-4, 1e-8, 0.1  # AdamWConfig's defaults (common/core/adamw.h)


def best_rate(step, n, reps):
    step()  # allocation of the state, first touch of the pages
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    return n / best / 1e6


def worker(n, reps, threads):
    """The peers at one thread count; prints {name: M params/s or the reason}."""
    import torch
    torch.set_num_threads(threads)
    out = {}
    gen = torch.Generator().manual_seed(1)
    for name, kw in (("torch AdamW fused", {"fused": True}), ("torch AdamW foreach", {"foreach": True})):
        p = torch.nn.Parameter(0.02 * torch.randn(n, generator=gen))
        p.grad = 1e-3 * torch.randn(n, generator=gen)
        opt = torch.optim.AdamW([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **kw)
        out[name] = best_rate(opt.step, n, reps)
        del opt, p
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        p = torch.nn.Parameter(0.02 * torch.randn(n, generator=gen))
        p.grad = 1e-3 * torch.randn(n, generator=gen)
        opt = DeepSpeedCPUAdam([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True)
        out["DeepSpeedCPUAdam"] = best_rate(opt.step, n, reps)
    except Exception as e:  # not installed, or its kernel failed to compile
        out["DeepSpeedCPUAdam"] = "unavailable: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:120])
    print(json.dumps(out))


def versions():
    import torch
    v = {"torch": torch.__version__}
    try:
        import deepspeed
        v["deepspeed"] = deepspeed.__version__
    except Exception:
        v["deepspeed"] = "not installed"
    return v


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bench-bin", default=os.path.join(ROOT, "build", "bench", "bench_adamw"))
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # one thread count of the peers
    a = ap.parse_args()
    if a.worker:
        worker(a.n, a.reps, a.worker)
        return
    if not os.access(a.bench_bin, os.X_OK):
        sys.exit("error: %s not found: build it with ninja -C build bench/bench_adamw" % a.bench_bin)
    threads = [int(t) for t in a.threads.split(",")]
    rates = {}  # name -> {threads: rate or reason}
    def keep(name, t, r):  # the best rate, or the reason it is missing
        old = rates.setdefault(name, {}).get(t)
        if not isinstance(old, float) or (isinstance(r, float) and r > old):
            rates[name][t] = r

    for _, t in [(k, t) for k in range(a.rounds) for t in threads]:
        ours = json.loads(subprocess.run([a.bench_bin, "--n", str(a.n), "--threads", str(t), "--reps", str(a.reps),
                                          "--json"], check=True, capture_output=True, text=True).stdout)
        for row in ours:
            name = row["name"].split(" (")[0]  # the describe() part goes to the note below
            keep(name, t, row["mparams_per_s"])
        env = dict(os.environ, OMP_NUM_THREADS=str(t))
        peers = subprocess.run([sys.executable, __file__, "--worker", str(t), "--n", str(a.n), "--reps",
                                str(a.reps)], env=env, check=True, capture_output=True, text=True).stdout
        for name, r in json.loads(peers.strip().splitlines()[-1]).items():
            keep(name, t, r)
    v = versions()
    print("AdamW on %d float32 parameters, f32 gradients unless said, M params/s (best of %d steps, %d rounds)"
          % (a.n, a.reps, a.rounds))
    print("CPU: %s; torch %s, deepspeed %s; ours: %s" % (cpu_model(), v["torch"], v["deepspeed"],
                                                       ours[0]["name"].split(" (")[1].rstrip(")").split(",")[0]))
    print("%d CPUs, load average %.2f when done (other processes share them)" % (os.cpu_count(), os.getloadavg()[0]))
    print()
    print("| implementation | " + " | ".join("%d thread%s" % (t, "" if t == 1 else "s") for t in threads) + " |")
    print("| --- |" + " ---: |" * len(threads))
    order = [k for k in rates if k.startswith("ours")] + ["torch AdamW fused", "torch AdamW foreach",
                                                          "DeepSpeedCPUAdam"] + [k for k in rates if k.startswith(("the update", "memcpy"))]
    for name in order:
        cells = [rates[name].get(t) for t in threads]
        print("| %s | %s |" % (name, " | ".join(("%.0f" % c) if isinstance(c, float) else str(c) for c in cells)))


if __name__ == "__main__":
    main()
