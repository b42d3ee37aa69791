#!/usr/bin/python3
# torch_train.py: one rank's training run for bench/torch_ref.py (start there:
# it says how to run it and what each flag means, checks the flags and starts
# the ranks; this file is what each rank then does).
#
# train(rank, args): threads (and OpenBLAS's), the gloo process group when
# there are N ranks, the model and AdamW of torch_gpt.py, then args.steps
# optimizer steps. Each step is timed on rank 0, between two synchronisations
# of the device on a GPU, and logged (text, and JSON lines with --log-json);
# the summary follows: median ms/step and tokens/s after the warmup steps. On
# --device cuda: autocast bf16 (--precision bf16), the card's name, which AdamW
# kernels PyTorch picked, peak memory allocated and MFU (bench/mfu.py).
# With args.fsdp the model is sharded by torch_fsdp.py (FSDP2) instead of
# wrapped in DDP; every run's summary carries the resident-set readings.
# The BLAS helpers below say which BLAS kernels the CPU side runs (the
# summary's "blas").
#
# A library, not a program: torch_ref.py imports it with bench/ on sys.path,
# after setting OMP_WAIT_POLICY (which must come before torch loads).

import ctypes
import json
import math
import os
import re
import statistics
import sys
import time

import torch

import mfu
from torch_gpt import GPT, PRESETS, Sampler, build_tokens, load_init, make_adamw, write_safetensors
from torch_fsdp import full_parameters, peak_rss_bytes, rss_bytes, shard_model


# ---------------------------------------------------------------------------
# BLAS introspection

def _openblas():
    """The OpenBLAS library this process has loaded (through libblas.so.3), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        paths = set()
    for p in sorted(paths, key=lambda s: ("libopenblas" not in s, s)):
        try:
            lib = ctypes.CDLL(p)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            lib.openblas_get_config.restype = ctypes.c_char_p
            return lib
        except (OSError, AttributeError):
            continue
    return None


def blas_line():
    cfg = torch.__config__.show()
    m = re.search(r"BLAS_INFO=([^,\s]*)", cfg)
    info = "BLAS_INFO=" + (m.group(1) if m else "?")
    # Make sure a GEMM has run so that the BLAS library is mapped.
    torch.ones(2, 2) @ torch.ones(2, 2)
    lib = _openblas()
    if lib is not None:
        conf = lib.openblas_get_config().decode()
        core = lib.openblas_get_corename().decode()
        ver = " ".join(conf.split()[:2])
        info += "; %s core=%s" % (ver, core)
        if os.environ.get("OPENBLAS_CORETYPE"):
            info += " (OPENBLAS_CORETYPE=%s)" % os.environ["OPENBLAS_CORETYPE"]
    if "USE_MKLDNN=ON" in cfg:
        info += "; oneDNN on"
    return info


def adamw_implementation(opt):
    """Which AdamW kernels this optimizer runs: "fused", "foreach" or "for-loop" (and why)."""
    d = opt.defaults
    if d.get("fused"):
        return "fused (asked for)"
    if d.get("foreach"):
        return "foreach (asked for)"
    if d.get("foreach") is None and d.get("fused") is None:
        params = [p for g in opt.param_groups for p in g["params"]]
        try:  # PyTorch's own choice when neither is given (torch/optim/optimizer.py)
            from torch.optim.optimizer import _default_to_fused_or_foreach
            fused, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
        except (ImportError, TypeError):
            return "PyTorch's default (foreach=None, fused=None)"
        return ("fused" if fused else "foreach" if foreach else "for-loop") + " (PyTorch's default)"
    return "for-loop (foreach=False)"


def set_threads(n):
    torch.set_num_threads(n)
    lib = _openblas()
    if lib is not None:
        try:
            lib.openblas_set_num_threads(ctypes.c_int(n))
        except AttributeError:
            pass


# ---------------------------------------------------------------------------
# Training

def train(rank, args):
    nranks = args.ranks
    cores = os.cpu_count() or 1
    set_threads(args.threads or (cores if nranks == 1 else max(1, cores // nranks)))
    fsdp = getattr(args, "fsdp", False)
    distributed = nranks > 1 or fsdp  # FSDP2 needs a process group even for one rank
    if distributed:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                                rank=rank, world_size=nranks)
    blas = blas_line()  # its GEMM maps the BLAS library before the first reading
    rss_before_model = rss_bytes()
    V, T, L, H, C = PRESETS[args.model]
    B, K = args.batch, args.grad_accum

    cuda = args.device == "cuda"
    dev = torch.device("cuda") if cuda else torch.device("cpu")
    toks, source, fmt = build_tokens(args, V)
    sampler = Sampler(toks, T, V, source, device=dev)

    torch.manual_seed(args.seed)
    model = GPT(V, T, L, H, C, sdpa=args.sdpa)
    model.recompute = getattr(args, "recompute", "none")
    if args.init:
        load_init(model, args.init)
    else:
        model.init_normal()
    nparams = sum(p.numel() for p in model.parameters())
    if cuda:
        model.to(dev)  # initialised on the CPU, so the same seed gives the same model as there

    if fsdp:  # before the optimizer: AdamW must hold the sharded DTensors
        shard_model(model, nranks)
    opt = make_adamw(model, args.lr)
    adamw_impl = adamw_implementation(opt)

    ddp = model
    if nranks > 1 and not fsdp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model)

    import contextlib
    if args.precision == "bf16":
        autocast = lambda: torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    else:
        autocast = contextlib.nullcontext

    log = open(args.log_json, "w") if (args.log_json and rank == 0) else None
    gpu_name = torch.cuda.get_device_name(dev) if cuda else None
    # Device work is asynchronous: a step's time is read between two
    # synchronisations, so it holds all the work the step queued and nothing else.
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    if rank == 0:
        print("torch_ref: torch %s, model %s (P=%d), ranks %d x %d threads, B=%d K=%d T=%d, data %s (%s, %d tokens), "
              "init %s, precision %s, attention %s, %s, recompute %s"
              % (torch.__version__, args.model, nparams, nranks, torch.get_num_threads(), B, K, T, source, fmt,
                 len(toks), args.init or "torch normal (seed %d)" % args.seed, args.precision,
                 "sdpa" if args.sdpa else "explicit",
                 "FSDP2 fully_shard per block + root" if fsdp else ("DDP" if nranks > 1 else "1 process"),
                 model.recompute))
        print("torch_ref: blas: %s" % blas)
        if cuda:
            print("torch_ref: cuda: %s, AdamW %s, eager (no torch.compile)" % (gpu_name, adamw_impl))
        sys.stdout.flush()

    G = nranks * B * K
    tokens_per_step = G * T
    times = []
    lv = None
    for step in range(args.steps):
        sync()
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=dev)
        for k in range(K):
            x, y = sampler.micro_batch(step, k, rank, nranks, B, K)
            if fsdp:  # FSDP2's no_sync: reduce-scatter on the last micro-step only
                model.set_requires_gradient_sync(k == K - 1)
                grad_sync = contextlib.nullcontext()
            else:
                grad_sync = contextlib.nullcontext() if (nranks == 1 or k == K - 1) else ddp.no_sync()
            with grad_sync:
                with autocast():
                    loss = ddp(x, y)
                (loss / K).backward()
            loss_sum += loss.detach().float()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean_loss = loss_sum / K
        if distributed:
            dist.all_reduce(mean_loss)
            mean_loss /= nranks
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        lv = float(mean_loss)
        if not math.isfinite(lv):
            raise RuntimeError("step %d: loss is %r" % (step, lv))
        if step >= args.warmup:
            times.append(ms)
        if rank == 0:
            tps = tokens_per_step / (ms / 1e3)
            print("step %4d | loss %.6f | %8.2f ms | %10.0f tok/s%s"
                  % (step, lv, ms, tps, "" if step >= args.warmup else " (warmup)"))
            sys.stdout.flush()
            if log:
                log.write(json.dumps({"step": step, "loss": lv, "ms": ms, "tokens_per_s": tps}) + "\n")
                log.flush()

    # The largest of each rank's resident-set readings (torch_fsdp.py says what they hold).
    rss = torch.tensor([peak_rss_bytes(), peak_rss_bytes() - rss_before_model, rss_before_model], dtype=torch.float64)
    if distributed:
        dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    final = full_parameters(model) if (args.save and fsdp) else None  # a collective: every rank

    if rank == 0:
        med = statistics.median(times) if times else None   # None, not NaN: the log stays valid JSON
        tps = tokens_per_step / (med / 1e3) if times else None
        summary = {"impl": "pytorch", "torch_version": torch.__version__, "ranks": nranks,
                   "threads_per_rank": torch.get_num_threads(), "model": args.model, "params": nparams,
                   "batch": B, "grad_accum": K, "precision": args.precision, "steps": args.steps,
                   "timed_steps": len(times), "median_ms": med, "tokens_per_s": tps,
                   "final_loss": lv, "blas": blas, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                   "device": args.device, "attention": "sdpa" if args.sdpa else "explicit",
                   "flops_per_token": mfu.flops_per_token(nparams, V, T, L, C),
                   "parallel": "fsdp2" if fsdp else ("ddp" if nranks > 1 else "none"),
                   "recompute": model.recompute,
                   "peak_rss_bytes": int(rss[0]), "rss_growth_bytes": int(rss[1]),
                   "rss_before_model_bytes": int(rss[2])}
        print("summary: pytorch %s, %s, %d rank(s), B=%d K=%d: median %s ms/step over %d steps, %s tok/s"
              % (torch.__version__, args.model, nranks, B, K, "%.2f" % med if times else "-", len(times),
                 "%.0f" % tps if times else "-"))
        if cuda:
            peak, peak_src = mfu.peak_flops(gpu_name)
            util = mfu.mfu(summary["flops_per_token"], tps, peak)
            summary.update({"gpu": gpu_name, "adamw_impl": adamw_impl, "compile": False,
                            "peak_memory_bytes": torch.cuda.max_memory_allocated(dev),
                            "peak_flops": peak, "peak_source": peak_src, "mfu": util})
            print("summary: %s, MFU %s (%.4g GFLOP/token; peak: %s), peak memory allocated %.2f GiB"
                  % (gpu_name, "%.1f%%" % (100 * util) if util is not None else "-",
                     summary["flops_per_token"] / 1e9, peak_src, summary["peak_memory_bytes"] / 2**30))
        if log:
            log.write(json.dumps({"summary": summary}) + "\n")
            log.close()
        if args.save:
            write_safetensors(args.save, final if fsdp else model.named_parameters())
            print("torch_ref: final parameters written to %s" % args.save)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
