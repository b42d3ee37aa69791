#!/usr/bin/env python3
# bench_adamw.py: the host AdamW of the offload stage (CpuAdamW) beside its
# peers on the same machine: torch.optim.AdamW(fused=True),
# torch.optim.AdamW(foreach=True) and DeepSpeed's DeepSpeedCPUAdam, each
# updating one flat float32 tensor of --n parameters (float32 gradients,
# decoupled weight decay), on 1 and 2 threads. Prints two markdown tables
# of M parameters per second:
#
# - side by side: ours (build/bench/libzf_adamw_c.so, through ctypes) and the
#   peers in one process, one step of each in turn, --reps times a round.
#   Where the memory bandwidth a VM gets comes and goes with its neighbours'
#   work, a rate measured a second apart, or in another process, can differ
#   by half from the same code's; steps taken in turn see the same machine.
#   Each cell is the fastest step and, in brackets, the median;
# - ours alone (build/bench/bench_adamw): its other forms (bf16 gradients,
#   a bf16 copy), the update's memory traffic without its arithmetic, and
#   memcpy, the limits of a pass bound by bandwidth.
#
#   .venv-bench/bin/python bench/bench_adamw.py [--n 16777216] [--threads 1,2] [--reps 10] [--rounds 3]
#   scripts/bench.sh --adamw            # the same, after making the build
#
# Each thread count runs in a fresh process with OMP_NUM_THREADS set, since
# DeepSpeed's kernel takes its OpenMP threads from there and not from
# torch.set_num_threads, and OMP_WAIT_POLICY=PASSIVE, so that no
# implementation's idle threads keep a core from the next one. DeepSpeedCPUAdam is compiled on first use (minutes);
# without deepspeed (pip install deepspeed, DS_BUILD_OPS=0) its row says why.

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BETAS, LR, EPS, WD = (0.9, 0.95), 3e-4, 1e-8, 0.1  # AdamWConfig's defaults (common/core/adamw.h)
OURS = "ours (CpuAdamW)"


class Ours:
    """CpuAdamW through bench/adamw_c.cpp's C interface, stepping like a torch optimizer."""

    def __init__(self, lib, p, threads):
        import ctypes
        import torch
        self.lib, self.p = lib, p
        self.m, self.v = torch.zeros_like(p), torch.zeros_like(p)
        self.handle = ctypes.c_void_p(lib.zf_adamw_new(threads))
        if not self.handle:
            raise RuntimeError("CpuAdamW refused %d threads" % threads)
        self.t = 0

    def step(self):
        self.t += 1
        ptr = [x.data_ptr() for x in (self.p, self.p.grad, self.m, self.v)]
        if self.lib.zf_adamw_step(self.handle, *ptr, self.p.numel(), self.t, LR, BETAS[0], BETAS[1], EPS, WD):
            raise RuntimeError("CpuAdamW refused the step")

    def close(self):
        self.lib.zf_adamw_free(self.handle)


def load_ours(path):
    import ctypes
    lib = ctypes.CDLL(path)
    lib.zf_adamw_new.restype = ctypes.c_void_p
    lib.zf_adamw_new.argtypes = [ctypes.c_int]
    lib.zf_adamw_free.argtypes = [ctypes.c_void_p]
    lib.zf_adamw_step.restype = ctypes.c_int
    lib.zf_adamw_step.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p] * 4 + [ctypes.c_size_t, ctypes.c_long] + \
        [ctypes.c_float] * 5
    return lib


def worker(n, reps, threads, lib_path):
    """Ours and the peers at one thread count, one step of each in turn, reps
    times: prints {name: [M params/s of each step] or the reason}."""
    import torch
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(1)

    def param():
        p = torch.nn.Parameter(0.02 * torch.randn(n, generator=gen))
        p.grad = 1e-3 * torch.randn(n, generator=gen)
        return p

    steps, out = {}, {}
    try:
        steps[OURS] = Ours(load_ours(lib_path), param(), threads)
    except Exception as e:  # not built, or refused
        out[OURS] = "unavailable: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:120])
    for name, kw in (("torch AdamW fused", {"fused": True}), ("torch AdamW foreach", {"foreach": True})):
        steps[name] = torch.optim.AdamW([param()], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **kw)
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        steps["DeepSpeedCPUAdam"] = DeepSpeedCPUAdam([param()], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                                     adamw_mode=True)
    except Exception as e:  # not installed, or its kernel failed to compile
        out["DeepSpeedCPUAdam"] = "unavailable: %s: %s" % (type(e).__name__, str(e).splitlines()[0][:120])
    for opt in steps.values():
        opt.step()  # allocation of the state, first touch of the pages
    for name in steps:
        out[name] = []
    for _ in range(reps):
        for name, opt in steps.items():
            t0 = time.perf_counter()
            opt.step()
            out[name].append(n / (time.perf_counter() - t0) / 1e6)
    if OURS in steps:
        steps[OURS].close()
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
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # one thread count, in its own process
    a = ap.parse_args()
    bench_bin = os.path.join(a.build, "bench", "bench_adamw")
    lib = os.path.join(a.build, "bench", "libzf_adamw_c.so")
    if a.worker:
        worker(a.n, a.reps, a.worker, lib)
        return
    for path in (bench_bin, lib):
        if not os.path.exists(path):
            sys.exit("error: %s not found: build it with ninja -C %s" % (path, a.build))
    threads = [int(t) for t in a.threads.split(",")]
    side = {}   # name -> {threads: [rates of every step] or the reason}
    alone = {}  # bench_adamw's rows: name -> {threads: best rate}
    for _, t in [(k, t) for k in range(a.rounds) for t in threads]:
        ours = json.loads(subprocess.run([bench_bin, "--n", str(a.n), "--threads", str(t), "--reps", str(a.reps),
                                          "--json"], check=True, capture_output=True, text=True).stdout)
        for row in ours:
            cell = alone.setdefault(row["name"].split(" (")[0], {})  # describe() goes to the note below
            cell[t] = max(cell.get(t, 0.0), row["mparams_per_s"])
        # DeepSpeed's OpenMP threads; PASSIVE: an OpenMP thread sleeps when
        # its loop ends, where by default it spins on a core for a while,
        # slowing whichever implementation steps next (ours, on 2 cores)
        env = dict(os.environ, OMP_NUM_THREADS=str(t), OMP_WAIT_POLICY="PASSIVE")
        peers = subprocess.run([sys.executable, __file__, "--worker", str(t), "--n", str(a.n), "--reps",
                                str(a.reps), "--build", a.build], env=env, check=True, capture_output=True,
                               text=True).stdout
        for name, r in json.loads(peers.strip().splitlines()[-1]).items():
            cell = side.setdefault(name, {})
            if isinstance(r, list):
                cell[t] = (cell[t] if isinstance(cell.get(t), list) else []) + r
            else:
                cell.setdefault(t, r)
    v = versions()
    print("AdamW on %d float32 parameters, float32 gradients unless said, M params/s" % a.n)
    print("CPU: %s; torch %s, deepspeed %s; ours: %s" % (cpu_model(), v["torch"], v["deepspeed"],
                                                       ours[0]["name"].split(" (")[1].rstrip(")").split(",")[0]))
    print("%d CPUs, load average %.2f when done (other processes share them)" % (os.cpu_count(), os.getloadavg()[0]))
    print()
    print("Side by side: one step of each in turn, %d times a round, %d rounds; the fastest step and the median"
          % (a.reps, a.rounds))
    print()
    print("| implementation | " + " | ".join("%d thread%s" % (t, "" if t == 1 else "s") for t in threads) + " |")
    print("| --- |" + " ---: |" * len(threads))

    def fmt(c):
        return "%.0f (%.0f)" % (max(c), statistics.median(c)) if isinstance(c, list) else str(c)
    for name in [OURS, "torch AdamW fused", "torch AdamW foreach", "DeepSpeedCPUAdam"]:
        print("| %s | %s |" % (name, " | ".join(fmt(side[name].get(t)) for t in threads)))
    print()
    print("Ours alone (bench/bench_adamw.cpp): its other forms, and what the memory allows; the fastest of %d "
          "calls, best of %d rounds" % (a.reps, a.rounds))
    print()
    print("| case | " + " | ".join("%d thread%s" % (t, "" if t == 1 else "s") for t in threads) + " |")
    print("| --- |" + " ---: |" * len(threads))
    for name, cells in alone.items():
        print("| %s | %s |" % (name, " | ".join("%.0f" % cells[t] for t in threads)))
    print()
    for line in verdicts(side, alone, threads):
        print(line)


def verdicts(side, alone, threads):
    """Ours against each peer (side by side), and what a second thread gave
    ours beside what it gave the traffic row, which does no arithmetic: the
    bandwidth the machine had for it."""
    out = []
    ours = side.get(OURS, {})
    for t in threads:
        if not isinstance(ours.get(t), list):
            continue
        for peer in ("torch AdamW fused", "DeepSpeedCPUAdam"):
            theirs = side.get(peer, {}).get(t)
            if isinstance(theirs, list):
                out.append("%d thread%s: ours / %s = %.2fx by the fastest step, %.2fx by the median"
                           % (t, "" if t == 1 else "s", peer, max(ours[t]) / max(theirs),
                              statistics.median(ours[t]) / statistics.median(theirs)))
    traffic = alone.get("the update's traffic, no AdamW math", {})
    if all(isinstance(ours.get(t), list) for t in (1, 2)) and 1 in traffic and 2 in traffic:
        out.append("2 threads over 1: ours %.2fx (fastest steps, side by side); the update's traffic without "
                   "its arithmetic %.2fx (alone, in its own process): what the memory let a second thread add "
                   "at some moment of this run"
                   % (max(ours[2]) / max(ours[1]), traffic[2] / traffic[1]))
    return out


if __name__ == "__main__":
    main()
