#!/usr/bin/env python3
"""modeled_vs_published.py: the modeled clock against published training speeds.

Each case is a published measurement (its source below) and the dry run
(docs/SPEC.md section 13) of the same configuration in this project: the
same number and kind of GPUs, the model's layers, width, heads, context and
vocabulary (--model takes the shape), the per-GPU micro-batch and
accumulation, bf16 with flash attention, the same recomputation and
sharding. The model differs in its details (GPT-2's form: GELU MLP,
LayerNorm, learned positions, an untied head), so the two rates are
compared as model FLOP/s: each side's tokens/s times its own model's FLOPs
per token, 6 P + 12 L C T (MosaicML's and the PyTorch blog's MFU
convention: no recomputation counted). Nothing is fitted: every number of
a profile comes from what it describes (hardware/README.md), the same for
every case.

The stated tolerance: the modeled model FLOP/s within 25 % of the published
one, either way (their ratio between 1/1.25 and 1.25). A case outside it is
printed as MISSED: the model lacks something there, which bench/RESULTS.md
names.

    bench/modeled_vs_published.py [--build build] [--only 8]   # prints a markdown table

--only N keeps the cases of N GPUs or fewer (the test suite's quick pass).
Every modeled number is modeled, not measured; every published one is the
source's.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = 0.25  # modeled over published model FLOP/s per GPU, either way
PROFILES = os.path.join(ROOT, "bench", "profiles")
COMMON = ["--precision", "bf16", "--compute", "bf16", "--attention", "flash", "--steps", "2",
          "--clock", "modeled", "--dry-run", "--quiet"]

MOSAIC = ("MosaicML LLM Foundry, scripts/train/benchmarking/README.md (MPT training benchmarks, "
          "commit c90b9b3), table \"%s\"")
A100_TABLE = MOSAIC % "A100 80GB with 1600 Gbps node-node interconnect (RoCE)"
H100_TABLE = MOSAIC % "H100 80GB BF16"
H100_LARGE = MOSAIC % "H100 80GB BF16 (Large Scale, >= 128 GPUs)"
# MPT's shapes (llm-foundry's scripts/train/yamls/pretrain/mpt-*.yaml): vocabulary 50368, MLP 4C.
MPT = {"125m": (12, 768, 12), "350m": (24, 1024, 16), "760m": (24, 1536, 12), "1b": (24, 2048, 16),
       "3b": (32, 2560, 20), "7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 56),
       "70b": (80, 8192, 64)}


def mpt(size, T, gpus, micro, accum, recompute, table, hardware, tps, mfu, params, reduce="fp32"):
    """A row of MosaicML's tables: FSDP FULL_SHARD, amp_bf16 (gradients reduced in fp32) unless PURE."""
    L, C, H = MPT[size]
    flags = ["--model", "L=%d,C=%d,H=%d,T=%d,V=50368" % (L, C, H, T), "--ranks", str(gpus),
             "--batch", str(micro), "--grad-accum", str(accum), "--reduce-dtype", reduce, "--hardware", hardware]
    if recompute:
        flags += ["--recompute", "full"]
    what = "MPT-%s, %dx %s, FSDP (B=%d, K=%d, T=%d%s)" % (
        size, gpus, "A100 80GB" if hardware.startswith("a100") else "H100 80GB", micro, accum, T,
        ", full recomputation" if recompute else "")
    return (what, table, tps, mfu, params, (L, C, T), "04_fsdp/fsdp", flags)


# (what, source, published tokens/s per GPU, published MFU or None, published parameters,
#  (L, C, T), stage, flags)
CASES = [
    ("GPT-2 124M, 8x A100 80GB SXM, llm.c (ZeRO-1, B=64, T=1024)",
     "llm.c discussion #481 (2024-05-28): 10B tokens in about 90 min on one 8x A100 80GB SXM node",
     10e9 / (90 * 60) / 8, None, 124475904, (12, 768, 1024), "01_zero1/zero1",
     ["--model", "gpt2", "--ranks", "8", "--batch", "64", "--hardware", "a100-sxm"]),
    ("Llama 2 7B shape, 128x A100 80GB, 400 Gb/s a node, FSDP (B=2, T=4096, no recomputation)",
     "PyTorch blog, \"Maximizing training throughput using PyTorch FSDP\" (IBM and Meta, 2024-03-13), table 1",
     3700, 0.57, 6738415616, (32, 4096, 4096), "04_fsdp/fsdp",
     ["--model", "gpt-7b,V=32000", "--ranks", "128", "--batch", "2",
      "--hardware", os.path.join(PROFILES, "a100-400gbps-node.hw")]),
    ("Llama 2 7B shape, 96x H100 80GB, 800 Gb/s a node, FSDP (B=2, T=4096, no recomputation)",
     "the same blog, table 1", 7500, 0.37, 6738415616, (32, 4096, 4096), "04_fsdp/fsdp",
     ["--model", "gpt-7b,V=32000", "--ranks", "96", "--batch", "2",
      "--hardware", os.path.join(PROFILES, "h100-800gbps-node.hw")]),
    ("Llama 2 70B shape, 128x A100 80GB, 400 Gb/s a node, FSDP (B=2, T=4096, full recomputation)",
     "the same blog, table 1", 370, 0.50, 68976648192, (80, 8192, 4096), "04_fsdp/fsdp",
     ["--model", "gpt-70b,V=32000", "--ranks", "128", "--batch", "2", "--recompute", "full",
      "--hardware", os.path.join(PROFILES, "a100-400gbps-node.hw")]),
    mpt("125m", 2048, 8, 32, 2, False, A100_TABLE, "a100-sxm", 141737, 0.4445, 125311488),
    mpt("350m", 2048, 8, 32, 2, False, A100_TABLE, "a100-sxm", 58782, 0.5162, 355985408),
    mpt("1b", 2048, 8, 14, 4, False, A100_TABLE, "a100-sxm", 20513, 0.5986, 1315950592),
    mpt("3b", 2048, 8, 10, 2, False, A100_TABLE, "a100-sxm", 10811, 0.6211, 2651837440),
    mpt("7b", 2048, 8, 6, 2, False, A100_TABLE, "a100-sxm", 4641, 0.6423, 6658859008),
    mpt("7b", 8192, 8, 8, 2, True, A100_TABLE, "a100-sxm", 3206, 0.5447, 6684024832),
    mpt("13b", 2048, 8, 2, 3, False, A100_TABLE, "a100-sxm", 2262, 0.5957, 12853954560),
    mpt("30b", 2048, 8, 3, 21, True, A100_TABLE, "a100-sxm", 916, 0.553, 29975214080),
    mpt("70b", 2048, 64, 8, 4, True, A100_TABLE, "a100-sxm", 410, 0.5333, 64862437376, reduce="bf16"),
    mpt("760m", 2048, 8, 24, 2, False, H100_TABLE, "h100-sxm", 63147, 0.349, 760470528),
    mpt("1b", 2048, 8, 14, 1, False, H100_TABLE, "h100-sxm", 45455, 0.4182, 1315950592),
    mpt("3b", 2048, 16, 10, 3, False, H100_TABLE, "h100-sxm", 24142, 0.4373, 2651837440),
    mpt("7b", 2048, 8, 6, 1, False, H100_TABLE, "h100-sxm", 10643, 0.4644, 6658859008),
    mpt("13b", 2048, 32, 2, 1, False, H100_TABLE, "h100-sxm", 4811, 0.3995, 12853954560),
    mpt("30b", 2048, 32, 14, 3, True, H100_TABLE, "h100-sxm", 2308, 0.4392, 29975214080),
    mpt("70b", 2048, 64, 8, 4, True, H100_TABLE, "h100-sxm", 1039, 0.4257, 64862437376),
    mpt("7b", 2048, 512, 6, 1, False, H100_LARGE, "h100-sxm", 9670, 0.422, 6658859008),
    mpt("70b", 2048, 512, 8, 1, True, H100_LARGE, "h100-sxm", 1007, 0.4125, 64862437376),
]


def flops_per_token(params, L, C, T):
    """Training FLOPs a token: 6 per parameter, and attention's 12 L C T (no recomputation)."""
    return 6 * params + 12 * L * C * T


def dry_run(build, exe, flags):
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "run.json")
        cmd = [os.path.join(build, exe)] + flags + COMMON + ["--log-json", log]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit("modeled_vs_published: %s failed:\n%s" % (" ".join(cmd), p.stderr))
        lines = [json.loads(line) for line in open(log)]
    steps = [j for j in lines if "step" in j]
    summary = lines[-1]["summary"]
    last = steps[-1]
    return {"tokens_per_s_gpu": last["tokens_per_s"] / summary["ranks"], "mfu": last["mfu"],
            "exposed_ms": last["phases_ms"]["exposed comm"], "ms": last["ms"], "params": summary["params"],
            "peak_gib": max(m["device"]["peak_total"] for m in summary["memory"]) / 2**30,
            "clock": summary["clock_detail"],
            "cmd": os.path.basename(exe) + " " + " ".join(os.path.relpath(f, ROOT) if os.path.isabs(f) else f for f in flags)}


def verdict(ratio):
    """'within 25 %', or 'MISSED' with the ratio, for modeled over published model FLOP/s."""
    if 1 / (1 + TOLERANCE) <= ratio <= 1 + TOLERANCE:
        return "within %.0f %%" % (100 * TOLERANCE)
    return "MISSED (%.2fx)" % ratio


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--only", type=int, metavar="N", help="only the cases of N GPUs or fewer")
    a = ap.parse_args(argv)
    print("| case | published tok/s/GPU | modeled tok/s/GPU | FLOPs/token, ours over theirs | ratio | verdict | "
          "published MFU | modeled MFU | modeled exposed comm | modeled peak GiB/GPU |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    sources, ratios = [], []
    for what, source, tps, mfu, params, (L, C, T), exe, flags in CASES:
        gpus = int(flags[flags.index("--ranks") + 1])
        if a.only is not None and gpus > a.only:
            continue
        m = dry_run(a.build, exe, flags)
        scale = flops_per_token(m["params"], L, C, T) / flops_per_token(params, L, C, T)
        ratio = m["tokens_per_s_gpu"] * scale / tps
        ratios.append(ratio)
        print("| %s | %.0f | %.0f | %.4f | %.3f | %s | %s | %.1f%% | %.0f ms of %.0f | %.1f |" % (
            what, tps, m["tokens_per_s_gpu"], scale, ratio, verdict(ratio),
            "%.1f%%" % (100 * mfu) if mfu else "-", 100 * m["mfu"], m["exposed_ms"], m["ms"], m["peak_gib"]))
        sources.append("- %s: %s. Modeled: `%s` + `%s`" % (what, source, m["cmd"], " ".join(COMMON)))
    logs = sorted(abs(math.log(r)) for r in ratios)
    within = sum(verdict(r).startswith("within") for r in ratios)
    print("\n%d of %d cases within %.0f %%; median |ln(ratio)| %.3f." % (
        within, len(ratios), 100 * TOLERANCE, statistics.median(logs)))
    print("\n" + "\n".join(sources))
    return 0


if __name__ == "__main__":
    sys.exit(main())
