#!/usr/bin/env python3
# mfu.py: model FLOPs utilisation (MFU), defined once for every report of
# zero-to-fsdp: bench/torch_ref.py (PyTorch's side) and bench/gpu_report.py
# (the table of scripts/gpu_check.sh, for our stages and PyTorch alike).
# Standard library only. Tested by tests/python/test_bench.py (meson test
# --suite bench_py).
#
#   MFU = flops_per_token * tokens_per_s / peak
#
# flops_per_token: one training step's forward + backward per token, as
#   nanoGPT's estimate counts them (and common/core/model.cpp's flops_per_token,
#   which our run logs carry in their summary): 6 per parameter of a matrix
#   product, i.e. every parameter but the two embedding tables wte [V, C] and
#   wpe [T, C] (lookups, not products; lm_head is untied and is a product),
#   plus 12 * L * T * C for attention's q.k^T and att.v (counted over the full
#   T x T square, as nanoGPT does, not only its causal half).
#   For the gpt2 preset: 855,383,040 FLOPs per token.
# peak: the card's dense bf16 tensor-core rate, from PEAK_BF16_DENSE below
#   (the vendor's datasheet figure without sparsity), keyed by the name the
#   driver reports (nvidia-smi, torch.cuda.get_device_name). A card not in the
#   table is an "unknown card" and gets no MFU, unless ZF_PEAK_TFLOPS (dense
#   TFLOP/s, e.g. 989.4) says what its peak is.

import os
import re

# (pattern matched against the device name, dense bf16 TFLOP/s, what it is).
# Only cards whose name fixes the part: "NVIDIA H200 NVL" and "NVIDIA H100
# PCIe" have lower clocks and power than the SXM parts, so they are left out
# (unknown) rather than given the SXM figure.
PEAK_BF16_DENSE = [
    (r"^NVIDIA H200$", 989.4, "H200 SXM: 1,979 TFLOP/s bf16 with sparsity, 989.4 dense"),
    (r"^NVIDIA H100 80GB HBM3$|^NVIDIA H100 SXM", 989.4, "H100 SXM: 1,979 TFLOP/s bf16 with sparsity, 989.4 dense"),
    (r"^NVIDIA A100\b", 312.0, "A100: 312 TFLOP/s bf16 dense"),
]

ENV_PEAK = "ZF_PEAK_TFLOPS"


class PeakError(ValueError):
    pass


def gpt_params(V, T, L, C):
    """P of docs/SPEC.md's GPT: wte, wpe, L blocks of 12C^2 + 13C, ln_f, untied lm_head."""
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C + V * C


def flops_per_token(params, V, T, L, C):
    """Training FLOPs per token (forward + backward): 6 per matrix-product parameter + attention."""
    return 6.0 * (params - V * C - T * C) + 12.0 * L * T * C


def peak_flops(device_name, env=None):
    """(peak FLOP/s or None, where it comes from). ZF_PEAK_TFLOPS overrides the table."""
    env = os.environ if env is None else env
    override = env.get(ENV_PEAK, "").strip()
    if override:
        try:
            tflops = float(override)
        except ValueError:
            tflops = -1.0
        if not (tflops > 0 and tflops < 1e6):
            raise PeakError("%s=%r is not a positive number of TFLOP/s (dense bf16 peak of the card, "
                            "e.g. ZF_PEAK_TFLOPS=989.4); unset it to use the built-in table" % (ENV_PEAK, override))
        return tflops * 1e12, "%s=%s" % (ENV_PEAK, override)
    name = (device_name or "").strip()
    for pattern, tflops, what in PEAK_BF16_DENSE:
        if re.search(pattern, name):
            return tflops * 1e12, what
    return None, "unknown card %r: no MFU (set %s to its dense bf16 TFLOP/s)" % (name or "?", ENV_PEAK)


def mfu(flops_per_tok, tokens_per_s, peak):
    """Model FLOPs utilisation as a fraction (0.40 = 40%), or None without a peak or a rate."""
    if not peak or not tokens_per_s or not flops_per_tok:
        return None
    return flops_per_tok * tokens_per_s / peak
