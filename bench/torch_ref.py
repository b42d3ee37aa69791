#!/usr/bin/python3
# torch_ref.py: the PyTorch peer of zero-to-fsdp, for benchmarks and cross-checks.
#
# The model, optimizer and data sampler of docs/SPEC.md, written
# with plain PyTorch: one process (--ranks 1) or DistributedDataParallel over
# gloo on N local processes (--ranks N, loopback only); with --fsdp, FSDP2
# (fully_shard) over gloo instead of DDP.
#
# Files: this one is the program (flags, their checks, starting the ranks);
# bench/torch_gpt.py holds the model, AdamW, safetensors I/O and the sampler;
# bench/torch_fsdp.py the FSDP2 wrapping and the process-memory readings;
# bench/torch_train.py one rank's run (the timed steps, the summary, the CPU's
# threads and BLAS, the GPU's synchronisation, peak memory and MFU).
#
# Requirements: Debian's PyTorch and NumPy, run with the Debian interpreter:
#     apt-get install -y python3-torch        # 1.13 on Debian 12; pulls numpy
#     /usr/bin/python3 bench/torch_ref.py --model small --batch 8 --steps 23
# No other package: safetensors files are parsed by hand.
#
# Examples
#   timing, 1 rank:      /usr/bin/python3 bench/torch_ref.py --model tiny --batch 8 --steps 23
#   timing, DDP 4 ranks: /usr/bin/python3 bench/torch_ref.py --model tiny --batch 8 --ranks 4 --steps 23
#   cross-check against a stage (same init, same data, same batches):
#       build/00_data_parallel/dp --model tiny --save-init /tmp/init.safetensors \
#           --data data.bin --steps 10 --log-json /tmp/dp.jsonl
#       /usr/bin/python3 bench/torch_ref.py --model tiny --init /tmp/init.safetensors \
#           --data data.bin --steps 10 --log-json /tmp/torch.jsonl
#   then compare the "loss" of each step of the two logs.
#   on a GPU (PyTorch 2.x; scripts/gpu_check.sh runs it):
#       python3 bench/torch_ref.py --device cuda --model gpt2 --batch 16 --precision bf16 \
#           --steps 20 --warmup 5 --log-json /tmp/torch_gpu.jsonl
#
# Semantics
#   --steps S      optimizer steps in all; step s always uses the batch of step s
#                  (docs/SPEC.md's sampler), so step numbers line up with the C++ stages.
#   --warmup W     the first W of those S steps are run and logged but left out of
#                  the median and throughput of the summary (default 3).
#   ms             wall time of one optimizer step on rank 0 (forward, backward,
#                  gradient all-reduce, clipping, AdamW, loss all-reduce).
#   tokens_per_s   global tokens of the step (N*B*K*T) / its time.
#   loss           mean cross-entropy over the global batch (all micro-steps,
#                  all ranks).
#   --init FILE    a consolidated safetensors file with docs/SPEC.md's parameter names
#                  (F32; BF16/F16 are widened). Other tensors in it (optimizer
#                  state, step) are ignored: the run starts with fresh AdamW state.
#                  Without --init, torch's own normal init with docs/SPEC.md's stds,
#                  seeded by --seed: the right distribution, not the same values as
#                  the C++ Philox init, so use it for timing only.
#   --data FILE    raw bytes or llm.c tokens (magic 20240520). Without it, seeded
#                  uniform random tokens (1 MiB): for timing only, NOT the C++
#                  built-in corpus.
#   --save FILE    write the final parameters as safetensors (docs/SPEC.md names, F32).
#   --fsdp         FSDP2 instead of DDP (PyTorch 2.4 or newer, e.g. the .venv-bench/
#                  that scripts/bench.sh --fsdp makes; Debian's 1.13 has none):
#                  fully_shard on every block, then on the root, over a CPU
#                  DeviceMesh of the --ranks processes (gloo). Gradients are
#                  averaged over the ranks as DDP's are, so the losses are DDP's
#                  up to the order of the float sums.
#   --recompute    none (default) or full: every block's forward under
#                  torch.utils.checkpoint(use_reentrant=False), recomputed in
#                  backward (activation checkpointing; with or without --fsdp).
#   memory         every summary carries the resident-set readings of torch_fsdp.py
#                  (the largest over the ranks): peak_rss_bytes,
#                  rss_before_model_bytes and rss_growth_bytes (peak minus before).
#   --precision    fp32; or bf16 = torch.autocast(<device>, bfloat16) around the
#                  forward and the loss (fp32 parameters, gradients and AdamW
#                  moments): mixed precision as PyTorch users write it. That is not
#                  the bit-level recipe of docs/SPEC.md (bf16 gradients on the wire), and
#                  on CPUs without native bf16 matmul it is slow.
#   --sdpa         use F.scaled_dot_product_attention(is_causal=True) (torch >= 2.0)
#                  instead of the explicit q.k^T/sqrt(hs), mask, softmax, .v. The
#                  default on cuda (--no-sdpa turns it off); off by default on cpu.
#   --device cuda  one process on the current GPU (--ranks 1 only), eager mode (no
#                  torch.compile). The model is built and initialised on the CPU as
#                  without --device, then moved; the batches are sampled on the GPU.
#                  Each step is timed between two torch.cuda.synchronize() calls.
#                  AdamW: PyTorch's default implementation (foreach=None,
#                  fused=None), which PyTorch resolves to the multi-tensor "foreach"
#                  kernels when every parameter is a CUDA tensor; not fused. The run
#                  log's summary says which ran ("adamw_impl"). Clipping:
#                  clip_grad_norm_ with its defaults (foreach on CUDA as well).
#                  The summary adds the GPU's name, torch.cuda.max_memory_allocated()
#                  ("peak_memory_bytes"), "flops_per_token" and "mfu" (bench/mfu.py:
#                  flops_per_token * tokens_per_s / the card's dense bf16 peak;
#                  null on an unknown card unless ZF_PEAK_TFLOPS is set).
#
# Threads: 1 rank uses all cores; N ranks use max(1, cores // N) each (both
# torch's intra-op pool and OpenBLAS's own pool, via openblas_set_num_threads);
# --threads N overrides. OMP_WAIT_POLICY defaults to PASSIVE here (see below):
# spinning OpenMP threads on a loaded machine make steps much slower.
#
# BLAS: Debian's torch is built with BLAS_INFO=generic and calls libblas.so.3,
# which is normally OpenBLAS with DYNAMIC_ARCH. OpenBLAS 0.3.21 does not know
# recent Xeons (Sapphire/Emerald Rapids) and falls back to its generic
# "Prescott" (SSE3) kernels; OPENBLAS_CORETYPE=SkylakeX (or Haswell) in the
# environment picks AVX-512 (AVX2) kernels. The summary's "blas" field reports
# the core OpenBLAS actually chose.

import argparse
import os
import socket
import sys

# bench/mfu.py, torch_gpt.py and torch_train.py, beside this file (mfu.py: the one
# definition of MFU and of the peak table).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mfu  # noqa: E402

# libgomp (torch's OpenMP) spin-waits between parallel regions by default. With
# OpenBLAS's own threads, or other processes, on the same cores, the spinning
# threads steal the cores that do the work: on a loaded machine a step takes
# much longer spinning than passive.
# Passive waiting unless the caller chose; it must be set before torch loads
# libgomp, and spawned ranks inherit it. OMP_WAIT_POLICY=ACTIVE to compare.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("torch_ref.py: PyTorch is not installed for %s; on Debian: apt-get install python3-torch, "
             "then run this script with /usr/bin/python3" % sys.executable)

try:
    import numpy
except ImportError:
    sys.exit("torch_ref.py: NumPy is not installed for %s; on Debian: apt-get install python3-numpy, "
             "then run this script with /usr/bin/python3" % sys.executable)
del numpy  # only checked here, for that message: torch_gpt.py uses it

from torch_gpt import GPT, PRESETS, Sampler, UsageError, build_tokens, load_init  # noqa: E402
from torch_train import train  # noqa: E402


def _worker(rank, args):
    try:
        train(rank, args)
    except UsageError as e:
        sys.exit("torch_ref.py (rank %d): %s" % (rank, e))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description="PyTorch reference for zero-to-fsdp (docs/SPEC.md model, AdamW, sampler).")
    ap.add_argument("--model", choices=sorted(PRESETS), default="small")
    ap.add_argument("--batch", type=int, default=8, help="micro-batch per rank (B)")
    ap.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step (K)")
    ap.add_argument("--steps", type=int, default=23, help="optimizer steps in all, warmup included")
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the timing summary")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--clip", type=float, default=1.0, help="global grad-norm clip; 0 turns it off")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--ranks", type=int, default=1, help="1: one process; N: DDP over gloo, N local processes")
    ap.add_argument("--data", help="token file (raw bytes or llm.c format); synthetic random tokens if absent")
    ap.add_argument("--init", help="safetensors file with docs/SPEC.md parameter names")
    ap.add_argument("--save", help="write the final parameters to this safetensors file")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--sdpa", action="store_true", default=None,
                    help="use F.scaled_dot_product_attention(is_causal=True) (torch >= 2.0); the default on cuda")
    ap.add_argument("--no-sdpa", dest="sdpa", action="store_false",
                    help="the explicit q.k^T, mask, softmax, .v (the default on cpu)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cpu (default), or cuda: one process on the current GPU (--ranks 1)")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads per rank (default: all cores for 1 rank, max(1, cores // N) for N ranks)")
    ap.add_argument("--fsdp", action="store_true",
                    help="FSDP2 (fully_shard per block, then the root) over gloo instead of DDP; PyTorch >= 2.4")
    ap.add_argument("--recompute", choices=["none", "full"], default="none",
                    help="full: every block under torch.utils.checkpoint (non-reentrant)")
    ap.add_argument("--log-json", help="JSON lines run log")
    args = ap.parse_args()

    for flag, v, lo in (("--batch", args.batch, 1), ("--grad-accum", args.grad_accum, 1),
                        ("--ranks", args.ranks, 1), ("--steps", args.steps, 0), ("--warmup", args.warmup, 0)):
        if v < lo:
            ap.error("%s must be >= %d, got %d" % (flag, lo, v))
    if args.fsdp:
        if args.device != "cpu":
            ap.error("--fsdp runs over gloo on the CPU: use --device cpu")
        try:
            from torch_fsdp import fully_shard_api
            fully_shard_api()
        except RuntimeError as e:
            sys.exit("torch_ref.py: %s" % e)
    if args.lr <= 0 or args.clip < 0:
        ap.error("--lr must be > 0 and --clip >= 0")
    if args.device == "cuda":
        if args.ranks != 1:
            ap.error("--device cuda runs one process on one GPU: use --ranks 1 (DDP here is gloo on the CPU)")
        if not torch.cuda.is_available():
            sys.exit("torch_ref.py: --device cuda: torch %s sees no CUDA device (built with CUDA: %s); "
                     "run on a GPU machine or use --device cpu" % (torch.__version__, torch.version.cuda or "no"))
        try:
            mfu.peak_flops(torch.cuda.get_device_name())
        except mfu.PeakError as e:
            sys.exit("torch_ref.py: %s" % e)
    if args.sdpa is None:
        args.sdpa = args.device == "cuda"
    if args.sdpa and not hasattr(F, "scaled_dot_product_attention"):
        ap.error("--sdpa (the default on cuda): torch %s has no F.scaled_dot_product_attention (needs torch >= 2.0); "
                 "--no-sdpa uses the explicit form" % torch.__version__)
    if args.precision == "bf16" and not hasattr(torch, "autocast"):
        ap.error("--precision bf16: torch %s has no torch.autocast" % torch.__version__)
    for flag, path in (("--data", args.data), ("--init", args.init)):
        if path and not os.path.isfile(path):
            sys.exit("torch_ref.py: %s %s: no such file" % (flag, path))
    if args.log_json:
        d = os.path.dirname(os.path.abspath(args.log_json))
        if not os.path.isdir(d):
            sys.exit("torch_ref.py: --log-json %s: directory %s does not exist" % (args.log_json, d))

    # Validate data and init once here, so a bad file is one clear message, not N rank tracebacks.
    V, T, L, H, C = PRESETS[args.model]
    try:
        toks, source, _ = build_tokens(args, V)
        Sampler(toks, T, V, source)
        if args.init:
            load_init(GPT(V, T, L, H, C), args.init)
    except UsageError as e:
        sys.exit("torch_ref.py: %s" % e)
    del toks

    if args.ranks == 1 and not args.fsdp:
        _worker(0, args)
        return
    import torch.distributed as dist
    import torch.multiprocessing as mp
    if not dist.is_available() or not dist.is_gloo_available():
        sys.exit("torch_ref.py: --ranks %d%s needs torch.distributed with gloo, absent from this torch build"
                 % (args.ranks, " --fsdp" if args.fsdp else ""))
    args.port = free_port()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(args,), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
