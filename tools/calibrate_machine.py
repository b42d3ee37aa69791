#!/usr/bin/env python3
"""calibrate_machine.py: a profile of this machine for the modeled clock, and
the modeled step beside the measured one for every stage.

The modeled clock (docs/SPEC.md section 13) models GPUs; its numbers can only
be checked against a machine one has. This measures the machine the CPU
device runs on with the project's own benchmarks, each rank a core:

    peak_tflops_f32, _bf16   build/bench/bench_kernels: sgemm 1024^3 on one thread
    hbm_gb_per_s             the same: the median rate of its memory-bound kernels
    intra_node_*_busbw       build/bench/bench_comm: the threads backend's
                             all-reduce, reduce-scatter and all-gather (in place)
                             on 2 ranks, each at its largest size
    intra_node_latency_us    the all-reduce's smallest size: its time, less its
                             bytes, per ring step
    pcie_*_gb_per_s          bench_comm's memcpy (the CPU device's copies are memcpys)
    host_adamw_params_per_s  build/bench/bench_adamw (the CPU AdamW, all cores)

and writes them as a profile (efficiencies 1: the rates are achieved ones;
one node of as many "GPUs" as cores). Then, with --compare, it runs every
stage on `small` at --ranks = the cores, on the wall clock and on the
modeled clock with that profile, and prints both medians side by side.

    tools/calibrate_machine.py --compare        # then: --clock modeled --hardware this-machine
    tools/calibrate_machine.py --out /tmp/mine.hw

By default it writes hardware/this-machine.hw, which `--hardware
this-machine` reads (git ignores it: it describes one machine). A profile
it did not write is never overwritten. Exit status: 0 done, 1 a
benchmark or a run failed, 2 a usage error.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "# written by tools/calibrate_machine.py"
STAGES = [("00_data_parallel/dp", []), ("01_zero1/zero1", []), ("02_zero2/zero2", []), ("03_zero3/zero3", []),
          ("04_fsdp/fsdp", []), ("05_offload/offload", [])]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(" ".join(cmd) + "\n" + p.stderr.strip())
    return p.stdout


def kernels(build):
    """(one-thread sgemm GFLOP/s, median GB/s of the memory-bound kernels)."""
    out = run([os.path.join(build, "bench", "bench_kernels")])
    sgemm = re.search(r"^sgemm, 1 thread\s+\S+ x \S+ x \S+\s+\S+\s+(\S+)", out, re.M)
    if not sgemm:
        raise RuntimeError("bench_kernels printed no one-thread sgemm rate")
    rates, other = [], False
    for line in out.splitlines():
        if line.startswith("other kernels"):
            other = True
        elif other and re.match(r"^\S.*\s[\d.]+\s+[\d.]+$", line):
            rates.append(float(line.split()[-1]))
    if not rates:
        raise RuntimeError("bench_kernels printed no memory-bound kernel")
    return float(sgemm.group(1)), statistics.median(rates)


COMM_KINDS = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter", "all_gather": "all_gather in place"}


def comm(build):
    """({kind: bus GB/s at the largest size}, latency per ring step in us, memcpy GB/s), on 2 ranks."""
    out = run([os.path.join(build, "bench", "bench_comm")])
    rows = {}
    for kind, title in COMM_KINDS.items():
        block = out.split("# %s, 2 ranks" % title)
        if len(block) < 2:
            raise RuntimeError("bench_comm printed no %s on 2 ranks" % title)
        rows[kind] = [line.split() for line in block[1].split("\n# ")[0].splitlines()
                      if re.match(r"^\s*[\d.]+ [KMG]iB", line)]
        if not rows[kind]:
            raise RuntimeError("bench_comm printed no sizes of %s on 2 ranks" % title)
    size = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    # Columns: size (a number and its unit), count, time, algbw, busbw, memcpy, bus/memcpy.
    busbw = {kind: float(r[-1][5]) for kind, r in rows.items()}
    memcpy = float(rows["all_reduce"][-1][6])
    small = rows["all_reduce"][0]
    small_bytes, small_us = float(small[0]) * size[small[1]], float(small[3])
    # An all-reduce on 2 ranks: 2 ring steps, and 2(N-1)/N = 1 of its bytes on the bus.
    latency = max(0.1, (small_us - small_bytes / (busbw["all_reduce"] * 1e3)) / 2)
    return busbw, latency, memcpy


def adamw(build):
    exe = os.path.join(build, "bench", "bench_adamw")
    if not os.access(exe, os.X_OK):
        return None
    out = run([exe, "--threads", str(os.cpu_count() or 1), "--json"])
    rates = [row["mparams_per_s"] for row in json.loads(out) if row["name"].startswith("ours")]
    return max(rates) * 1e6 if rates else None


def profile_text(gflops, mem_gbs, busbw, latency, memcpy, adamw_rate, cores):
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    def line(key, value, why):
        return "%-40s = %-12s # %s" % (key, ("%.6g" % value) if not isinstance(value, str) else value, why)
    return "\n".join([
        MARK + ": measured on this machine, each rank a core",
        line("name", "this machine (%d cores)" % cores, "the CPU device, ranks as threads"),
        line("gpus_per_node", cores, "every rank on this one machine, a core each"),
        line("collectives", "ring", "the threads backend: a ring at the latency below"),
        line("peak_tflops_bf16", gflops / 1e3, "bf16 computes as f32 on the CPU device: the same rate"),
        line("peak_tflops_f32", gflops / 1e3, "bench_kernels: sgemm 1024^3, one thread"),
        line("hbm_gb_per_s", mem_gbs, "bench_kernels: median rate of the memory-bound kernels"),
        line("memory_gib", round(mem_gib, 1), "this machine's memory"),
        line("gemm_efficiency", 1, "the rates above are achieved ones"),
        line("sm_count", 1, "a rank is a core, which computes one tile at a time"),
        line("gemm_tile_m", 1, "no tiles: every product at the sgemm rate"),
        line("gemm_tile_n", 1, "likewise"),
        line("collective_sms", 0, "the threads backend's collectives run on threads of their own"),
        line("flash_forward_tflops", gflops / 1e3, "the sgemm rate (bf16 computes as f32 on the CPU device)"),
        line("flash_backward_tflops", gflops / 1e3, "likewise"),
        line("memory_efficiency", 1, "likewise"),
        line("launch_us", 1, "a kernel call (assumed)"),
        line("intra_node_all_reduce_busbw_gb_per_s", busbw["all_reduce"],
             "bench_comm: all_reduce on 2 ranks, largest size"),
        line("intra_node_all_gather_busbw_gb_per_s", busbw["all_gather"],
             "bench_comm: all_gather in place on 2 ranks, largest size"),
        line("intra_node_reduce_scatter_busbw_gb_per_s", busbw["reduce_scatter"],
             "bench_comm: reduce_scatter on 2 ranks, largest size"),
        line("intra_node_latency_us", latency, "bench_comm: all_reduce on 2 ranks, smallest size, per ring step"),
        line("inter_node_busbw_gb_per_s", busbw["all_reduce"], "one machine: never crossed"),
        line("inter_node_latency_us", latency, "one machine: never crossed"),
        line("pcie_pinned_gb_per_s", memcpy, "bench_comm's memcpy: the CPU device's copies"),
        line("pcie_pageable_gb_per_s", memcpy, "likewise"),
        line("pcie_latency_us", 1, "a copy's hand-off to the copy thread (assumed)"),
        line("host_adamw_params_per_s", adamw_rate or 1e9,
             "bench_adamw, all cores" if adamw_rate else "(assumed: bench_adamw not built)"),
        line("host_memory_gb_per_s", mem_gbs * cores, "the memory-bound rate, all cores"),
        line("nvme_gb_per_s", 1, "not used (assumed)"),
    ]) + "\n"


def median_ms(build, exe, flags, extra):
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "run.json")
        run([os.path.join(build, exe)] + flags + extra + ["--quiet", "--log-json", log])
        steps = [json.loads(line) for line in open(log) if '"step"' in line]
    return statistics.median(s["ms"] for s in steps[1:])  # the first step carries the warm-up


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "hardware", "this-machine.hw"),
                    help="the profile to write (.hw); default hardware/this-machine.hw, which "
                         "--hardware this-machine reads")
    ap.add_argument("--compare", action="store_true", help="then every stage, wall against modeled")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args(argv)
    if os.path.exists(a.out):
        with open(a.out) as f:
            if not f.readline().startswith(MARK):
                ap.error("%s exists and was not written by this tool: give another --out" % a.out)
    cores = os.cpu_count() or 1
    try:
        gflops, mem_gbs = kernels(a.build)
        busbw, latency, memcpy = comm(a.build)
        rate = adamw(a.build)
    except (RuntimeError, OSError, IndexError) as e:
        print("calibrate_machine: a benchmark failed: %s" % e, file=sys.stderr)
        return 1
    with open(a.out, "w") as f:
        f.write(profile_text(gflops, mem_gbs, busbw, latency, memcpy, rate, cores))
    print("wrote %s: sgemm %.1f GFLOP/s, memory %.1f GB/s, all-reduce %.2f GB/s and %.1f us a step, "
          "memcpy %.1f GB/s, AdamW %s params/s" % (a.out, gflops, mem_gbs, busbw["all_reduce"], latency, memcpy,
                                                   "%.3g" % rate if rate else "-"))
    if not a.compare:
        return 0
    flags = ["--model", "small", "--ranks", str(cores), "--steps", str(a.steps)]
    print("\n| stage | measured ms/step (median) | modeled ms/step | modeled / measured |")
    print("|---|---:|---:|---:|")
    try:
        for exe, extra in STAGES:
            wall = median_ms(a.build, exe, flags, extra)
            modeled = median_ms(a.build, exe, flags, extra + ["--clock", "modeled", "--hardware", a.out])
            print("| %s | %.2f | %.2f | %.2f |" % (os.path.basename(exe), wall, modeled, modeled / wall))
    except RuntimeError as e:
        print("calibrate_machine: a run failed: %s" % e, file=sys.stderr)
        return 1
    print("\n`%s` on %d cores, each rank a core; measured: the wall clock's median step after the first." %
          (" ".join(flags), cores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
