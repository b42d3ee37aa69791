#!/usr/bin/python3
# torch_gpt.py: the model, optimizer and data of docs/SPEC.md in
# plain PyTorch, for bench/torch_ref.py, which runs them (start there: it says
# how to run it and what each flag means).
#
# What is here: the GPT of docs/SPEC.md with nanoGPT's parameter names (without the
# "transformer." prefix) and its init stds; docs/SPEC.md's AdamW (betas 0.9/0.95,
# eps 1e-8, weight decay 0.1 on matrices only); safetensors read and written by
# hand (F32; BF16/F16 widened on reading); token files (raw bytes or llm.c's
# format) and docs/SPEC.md's sampler, which gives step s the same batch as the C++
# stages do.
#
# A library, not a program: torch_ref.py imports it with bench/ on sys.path,
# after setting OMP_WAIT_POLICY (which must come before torch loads). Needs
# torch and numpy. A bad --data or --init file raises UsageError, with a
# message that names the flag.

import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint  # noqa: F401  (torch.utils.checkpoint is not loaded by import torch)


class UsageError(Exception):
    pass


# ---------------------------------------------------------------------------
# Model (docs/SPEC.md, nanoGPT names without the "transformer." prefix)

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
        # "full": each block's forward runs under torch.utils.checkpoint (non-reentrant),
        # so backward recomputes its activations instead of keeping them.
        self.recompute = "none"

    def init_normal(self):
        """torch's RNG with docs/SPEC.md's stds (same distribution as the C++ init, not the same values)."""
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
            if self.recompute == "full" and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))
        # mean over all B*T positions; computed in fp32 even under autocast
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


# ---------------------------------------------------------------------------
# Optimizer (docs/SPEC.md): AdamW, weight decay on the matrices only

def make_adamw(model, lr):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


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
# Data: token files and docs/SPEC.md's sampler

LLMC_MAGIC = 20240520


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


def build_tokens(args, V):
    """The tokens of --data, or without it 1 Mi seeded random ones (timing only)."""
    if args.data:
        toks, fmt = load_tokens(args.data)
        return toks, args.data, fmt
    rng = np.random.default_rng(args.seed)
    return rng.integers(0, V, size=1 << 20, dtype=np.int64), "synthetic random tokens", "synthetic"
