#!/usr/bin/python3
# torch_ref.py: the PyTorch peer of zero-to-fsdp, for benchmarks and cross-checks.
#
# The model, optimizer and data sampler of /SPEC.md (shared/SPEC.md), written
# with plain PyTorch: one process (--ranks 1) or DistributedDataParallel over
# gloo on N local processes (--ranks N, loopback only).
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
#   on a GPU (PyTorch 2.x, as on the H200 machine; scripts/gpu_check.sh runs it):
#       python3 bench/torch_ref.py --device cuda --model gpt2 --batch 16 --precision bf16 \
#           --steps 20 --warmup 5 --log-json /tmp/torch_gpu.jsonl
#
# Semantics
#   --steps S      optimizer steps in all; step s always uses the batch of step s
#                  (SPEC.md's sampler), so step numbers line up with the C++ stages.
#   --warmup W     the first W of those S steps are run and logged but left out of
#                  the median and throughput of the summary (default 3).
#   ms             wall time of one optimizer step on rank 0 (forward, backward,
#                  gradient all-reduce, clipping, AdamW, loss all-reduce).
#   tokens_per_s   global tokens of the step (N*B*K*T) / its time.
#   loss           mean cross-entropy over the global batch (all micro-steps,
#                  all ranks).
#   --init FILE    a consolidated safetensors file with SPEC.md's parameter names
#                  (F32; BF16/F16 are widened). Other tensors in it (optimizer
#                  state, step) are ignored: the run starts with fresh AdamW state.
#                  Without --init, torch's own normal init with SPEC.md's stds,
#                  seeded by --seed: the right distribution, not the same values as
#                  the C++ Philox init, so use it for timing only.
#   --data FILE    raw bytes or llm.c tokens (magic 20240520). Without it, seeded
#                  uniform random tokens (1 MiB): for timing only, NOT the C++
#                  built-in corpus.
#   --save FILE    write the final parameters as safetensors (SPEC.md names, F32).
#   --precision    fp32; or bf16 = torch.autocast(<device>, bfloat16) around the
#                  forward and the loss (fp32 parameters, gradients and AdamW
#                  moments): mixed precision as PyTorch users write it. That is not
#                  the bit-level recipe of SPEC.md (bf16 gradients on the wire), and
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
# spinning OpenMP threads on a loaded machine made steps up to 10x slower.
#
# BLAS: Debian's torch is built with BLAS_INFO=generic and calls libblas.so.3,
# which is normally OpenBLAS with DYNAMIC_ARCH. OpenBLAS 0.3.21 does not know
# recent Xeons (Sapphire/Emerald Rapids) and falls back to its generic
# "Prescott" (SSE3) kernels; OPENBLAS_CORETYPE=SkylakeX (or Haswell) in the
# environment picks AVX-512 (AVX2) kernels. The summary's "blas" field reports
# the core OpenBLAS actually chose.

import argparse
import ctypes
import json
import math
import os
import re
import socket
import statistics
import struct
import sys
import time

# bench/mfu.py, beside this file: the one definition of MFU and of the peak table.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mfu  # noqa: E402

# libgomp (torch's OpenMP) spin-waits between parallel regions by default. With
# OpenBLAS's own threads, or other processes, on the same cores, the spinning
# threads steal the cores that do the work: on a loaded 2-core machine, small
# with 2 threads measured ~900-2200 ms/step spinning against ~200 ms passive.
# Passive waiting unless the caller chose; it must be set before torch loads
# libgomp, and spawned ranks inherit it. OMP_WAIT_POLICY=ACTIVE to compare.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit("torch_ref.py: PyTorch is not installed for %s; on Debian: apt-get install python3-torch, "
             "then run this script with /usr/bin/python3" % sys.executable)

try:
    import numpy as np
except ImportError:
    sys.exit("torch_ref.py: NumPy is not installed for %s; on Debian: apt-get install python3-numpy, "
             "then run this script with /usr/bin/python3" % sys.executable)


# ---------------------------------------------------------------------------
# Model (SPEC.md, nanoGPT names without the "transformer." prefix)

PRESETS = {
    # name: (V, T, L, H, C)
    "tiny": (256, 64, 2, 4, 64),
    "small": (256, 128, 4, 4, 128),
    "gpt2": (50304, 1024, 12, 12, 768),
}


def gelu_tanh(x):
    try:
        return F.gelu(x, approximate="tanh")
    except TypeError:  # torch < 1.12
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


class CausalSelfAttention(nn.Module):
    def __init__(self, T, H, C, sdpa):
        super().__init__()
        self.H, self.C, self.sdpa = H, C, sdpa
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        # A plain attribute, not a buffer: DDP would broadcast a buffer, and gloo has no bool.
        self.mask = torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T)

    def forward(self, x):
        B, T, C = x.shape
        H, hs = self.H, C // self.H
        q, k, v = self.c_attn(x).split(C, dim=2)           # q, k, v stacked in that order
        q = q.view(B, T, H, hs).transpose(1, 2)             # (B, H, T, hs), heads split in order
        k = k.view(B, T, H, hs).transpose(1, 2)
        v = v.view(B, T, H, hs).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            if self.mask.device != x.device:  # a plain attribute: .to(device) leaves it behind
                self.mask = self.mask.to(x.device)
            att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, T, H, C, sdpa):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = CausalSelfAttention(T, H, C, sdpa)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, V, T, L, H, C, sdpa=False):
        super().__init__()
        assert C % H == 0
        self.V, self.T, self.L = V, T, L
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(T, H, C, sdpa) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.lm_head = nn.Linear(C, V, bias=False)  # untied from wte

    def init_normal(self):
        """torch's RNG with SPEC.md's stds (same distribution as the C++ init, not the same values)."""
        std_proj = 0.02 / math.sqrt(2 * self.L)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("ln") or ".ln_" in name:
                    p.fill_(1.0 if name.endswith("weight") else 0.0)
                elif name.endswith("bias"):
                    p.zero_()
                elif name.endswith("c_proj.weight"):
                    p.normal_(0.0, std_proj)
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        # mean over all B*T positions; computed in fp32 even under autocast
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


# ---------------------------------------------------------------------------
# safetensors, by hand: u64 little-endian header length, JSON header, raw data

def _bf16_to_f32(raw):
    u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32)
    return (u16 << 16).view(np.float32)


def read_safetensors(path):
    if not os.path.isfile(path):
        raise UsageError("--init %s: no such file" % path)
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise UsageError("--init %s: too short to be a safetensors file (%d bytes)" % (path, len(blob)))
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise UsageError("--init %s: header length %d runs past the end of the file (%d bytes)"
                         % (path, n, len(blob)))
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise UsageError("--init %s: bad JSON header: %s" % (path, e))
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        if e > len(data) or b > e:
            raise UsageError("--init %s: tensor %s: data_offsets [%d, %d) outside the data (%d bytes)"
                             % (path, name, b, e, len(data)))
        raw = data[b:e]
        if dtype == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dtype == "BF16":
            arr = _bf16_to_f32(raw)
        elif dtype == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            out[name] = None  # optimizer step counters etc.: not parameters, skipped
            continue
        count = int(np.prod(shape)) if shape else 1
        if arr.size != count:
            raise UsageError("--init %s: tensor %s: shape %s needs %d values, the data holds %d"
                             % (path, name, shape, count, arr.size))
        out[name] = arr.reshape(shape)
    return out


def write_safetensors(path, named):
    header, chunks, off = {}, [], 0
    for name, t in named:
        a = np.ascontiguousarray(t.detach().cpu().float().numpy()).astype("<f4")
        raw = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def load_init(model, path):
    tensors = read_safetensors(path)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in tensors or tensors[name] is None:
                raise UsageError("--init %s: no F32 tensor named %s (found: %s)"
                                 % (path, name, ", ".join(sorted(tensors)[:8]) + (", ..." if len(tensors) > 8 else "")))
            a = tensors[name]
            if tuple(a.shape) != tuple(p.shape):
                raise UsageError("--init %s: %s has shape %s, the model (--model) needs %s"
                                 % (path, name, list(a.shape), list(p.shape)))
            p.copy_(torch.from_numpy(a.astype(np.float32)))


# ---------------------------------------------------------------------------
# Data: token files and SPEC.md's sampler

LLMC_MAGIC = 20240520


class UsageError(Exception):
    pass


def load_tokens(path):
    if not os.path.isfile(path):
        raise UsageError("--data %s: no such file" % path)
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) >= 4 and struct.unpack("<i", blob[:4])[0] == LLMC_MAGIC:
        if len(blob) < 1024:
            raise UsageError("--data %s: llm.c magic but the 1024-byte header is truncated" % path)
        hdr = np.frombuffer(blob[:1024], dtype="<i4")
        if hdr[1] != 1:
            raise UsageError("--data %s: llm.c token file version %d, only version 1 is known" % (path, hdr[1]))
        count = int(hdr[2])
        if count < 0 or 1024 + 2 * count > len(blob):
            raise UsageError("--data %s: header says %d tokens, the file holds %d"
                             % (path, count, (len(blob) - 1024) // 2))
        toks = np.frombuffer(blob, dtype="<u2", count=count, offset=1024).astype(np.int64)
        fmt = "llm.c tokens"
    else:
        toks = np.frombuffer(blob, dtype=np.uint8).astype(np.int64)
        fmt = "raw bytes"
    return toks, fmt


class Sampler:
    def __init__(self, tokens, T, V, source, device="cpu"):
        n = len(tokens)
        if n < T + 2:
            raise UsageError("%s: %d tokens, the model's context T=%d needs at least %d"
                             % (source, n, T, T + 2))
        mx = int(tokens.max())
        if mx >= V:
            raise UsageError("%s: token id %d is outside the vocabulary V=%d of this --model"
                             % (source, mx, V))
        # On a GPU the token array lives there too, so a batch is a gather on the
        # device, with no copy from the host and no synchronisation in the step.
        self.tokens = torch.from_numpy(np.ascontiguousarray(tokens)).to(device)
        self.T = T
        self.mod = n - T - 1
        self.device = device
        self.ar = torch.arange(T + 1, dtype=torch.long, device=device)

    def micro_batch(self, step, micro, rank, nranks, B, K):
        G = nranks * B * K
        first = step * G + micro * nranks * B + rank * B
        j = torch.arange(first, first + B, dtype=torch.long, device=self.device)
        o = (j * self.T) % self.mod                     # exact in int64 for any realistic run
        seq = self.tokens[o.unsqueeze(1) + self.ar]     # (B, T+1)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


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

def build_tokens(args, V):
    if args.data:
        toks, fmt = load_tokens(args.data)
        return toks, args.data, fmt
    rng = np.random.default_rng(args.seed)
    return rng.integers(0, V, size=1 << 20, dtype=np.int64), "synthetic random tokens", "synthetic"


def train(rank, args):
    nranks = args.ranks
    cores = os.cpu_count() or 1
    set_threads(args.threads or (cores if nranks == 1 else max(1, cores // nranks)))
    if nranks > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                                rank=rank, world_size=nranks)
    V, T, L, H, C = PRESETS[args.model]
    B, K = args.batch, args.grad_accum

    cuda = args.device == "cuda"
    dev = torch.device("cuda") if cuda else torch.device("cpu")
    toks, source, fmt = build_tokens(args, V)
    sampler = Sampler(toks, T, V, source, device=dev)

    torch.manual_seed(args.seed)
    model = GPT(V, T, L, H, C, sdpa=args.sdpa)
    if args.init:
        load_init(model, args.init)
    else:
        model.init_normal()
    nparams = sum(p.numel() for p in model.parameters())
    if cuda:
        model.to(dev)  # initialised on the CPU, so the same seed gives the same model as there

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    adamw_impl = adamw_implementation(opt)

    ddp = model
    if nranks > 1:
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
    blas = blas_line()
    if rank == 0:
        print("torch_ref: torch %s, model %s (P=%d), ranks %d x %d threads, B=%d K=%d T=%d, data %s (%s, %d tokens), "
              "init %s, precision %s, attention %s"
              % (torch.__version__, args.model, nparams, nranks, torch.get_num_threads(), B, K, T, source, fmt,
                 len(toks), args.init or "torch normal (seed %d)" % args.seed, args.precision,
                 "sdpa" if args.sdpa else "explicit"))
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
        if nranks > 1:
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

    if rank == 0:
        med = statistics.median(times) if times else None   # None, not NaN: the log stays valid JSON
        tps = tokens_per_step / (med / 1e3) if times else None
        summary = {"impl": "pytorch", "torch_version": torch.__version__, "ranks": nranks,
                   "threads_per_rank": torch.get_num_threads(), "model": args.model, "params": nparams,
                   "batch": B, "grad_accum": K, "precision": args.precision, "steps": args.steps,
                   "timed_steps": len(times), "median_ms": med, "tokens_per_s": tps,
                   "final_loss": lv, "blas": blas, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                   "device": args.device, "attention": "sdpa" if args.sdpa else "explicit",
                   "flops_per_token": mfu.flops_per_token(nparams, V, T, L, C)}
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
            write_safetensors(args.save, model.named_parameters())
            print("torch_ref: final parameters written to %s" % args.save)
    if nranks > 1:
        dist.barrier()
        dist.destroy_process_group()


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
    ap = argparse.ArgumentParser(description="PyTorch reference for zero-to-fsdp (SPEC.md model, AdamW, sampler).")
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
    ap.add_argument("--init", help="safetensors file with SPEC.md parameter names")
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
    ap.add_argument("--log-json", help="JSON lines run log")
    args = ap.parse_args()

    for flag, v, lo in (("--batch", args.batch, 1), ("--grad-accum", args.grad_accum, 1),
                        ("--ranks", args.ranks, 1), ("--steps", args.steps, 0), ("--warmup", args.warmup, 0)):
        if v < lo:
            ap.error("%s must be >= %d, got %d" % (flag, lo, v))
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

    if args.ranks == 1:
        _worker(0, args)
        return
    import torch.distributed as dist
    import torch.multiprocessing as mp
    if not dist.is_available() or not dist.is_gloo_available():
        sys.exit("torch_ref.py: --ranks %d needs torch.distributed with gloo, absent from this torch build" % args.ranks)
    args.port = free_port()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(args,), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
