# lab_formulas.py: docs/SPEC.md's memory (section 7) and communication
# (section 8) tables written out in Python, from the model preset's shape
# alone, so that scripts/lab_check.py compares a run log against the
# formulas and never against numbers the code under test computed. Unit
# sizes are section 1's; shard padding is section 7's (each unit padded to
# a multiple of the ranks that share it). Standard library only.

import math
import os

# Section 1's presets (gpt2 is left out: the labs run on the CPU).
PRESETS = {
    "tiny": dict(V=256, T=64, L=2, H=4, C=64),
    "small": dict(V=256, T=128, L=4, H=4, C=128),
}

# The time lab's model: its runs are dry runs on the modeled clock (section
# 13), where a preset's size costs nothing.
MODELED = {"gpt2": dict(V=50304, T=1024, L=12, H=12, C=768)}
SHAPES = dict(PRESETS, **MODELED)

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
LOSS_BYTES = 4      # the loss: one float32 all-reduced per step
NORM_BYTES = 160    # the norm's partial sums: 20 int64 limbs, stages 01-04


def hardware(name):
    """hardware/NAME.hw's numbers: {key: float}, the name as text."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hardware", name + ".hw")
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            key, eq, value = line.split("#", 1)[0].partition("=")
            if eq:
                value = value.strip()
                try:
                    out[key.strip()] = float(value)
                except ValueError:
                    out[key.strip()] = value
    return out


def param_count(model):
    """P = 2VC + TC + L(12C^2 + 13C) + 2C (section 1)."""
    m = SHAPES[model]
    V, T, L, C = m["V"], m["T"], m["L"], m["C"]
    return 2 * V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def model_units(model):
    """Elements of each unit, in order: embedding (wte, wpe), h.0 .. h.L-1, head (ln_f, lm_head)."""
    m = SHAPES[model]
    V, T, L, C = m["V"], m["T"], m["L"], m["C"]
    return [V * C + T * C] + [12 * C * C + 13 * C] * L + [2 * C + V * C]


def fsdp_units(model, wrap_blocks=1):
    """Stage 04's FSDP units: the embedding, --wrap-blocks blocks per unit, the head."""
    u = model_units(model)
    blocks = u[1:-1]
    grouped = [sum(blocks[i:i + wrap_blocks]) for i in range(0, len(blocks), wrap_blocks)]
    return [u[0]] + grouped + [u[-1]]


def piece(n, N):
    """S_u = ceil(n_u / N): one rank's piece of a unit of n_u elements."""
    return -(-n // N)


def padded(units, N):
    """Sum over units of N * S_u: the padded size."""
    return sum(N * piece(n, N) for n in units)


def shard_total(units, N):
    """Sum over units of S_u: one rank's shard."""
    return sum(piece(n, N) for n in units)


def all_reduce(n, N):
    """Ring-model bytes a rank sends for an all-reduce of n bytes (section 8)."""
    return 2 * (N - 1) / N * n


def gather_or_scatter(n, N):
    """Ring-model bytes for a reduce-scatter or all-gather of a full buffer of n bytes."""
    return (N - 1) / N * n


def optimizer_bytes_per_element(precision):
    """AdamW's m and v (8 bytes), and the float32 master in bf16 (4 more)."""
    return 12 if precision == "bf16" else 8


def zero_memory(stage, model, N, precision):
    """Device bytes of params, grads, optimizer per rank, stages 00-03 (section 7)."""
    units, b = model_units(model), DTYPE_BYTES[precision]
    o = optimizer_bytes_per_element(precision)
    if stage == 0:  # no padding; 16 bytes an element in both recipes
        P = sum(units)
        return {"params": b * P, "grads": b * P, "optimizer": (16 - 2 * b) * P}
    Pp, S = padded(units, N), shard_total(units, N)
    params = b * (S if stage >= 3 else Pp)
    grads = b * (S if stage >= 2 else Pp)
    return {"params": params, "grads": grads, "optimizer": o * S}


def zero_comm(stage, model, N, precision, K=1):
    """Ring-model bytes per step by collective, stages 00-03 (section 8)."""
    units, b = model_units(model), DTYPE_BYTES[precision]
    if N == 1:
        return {}
    if stage == 0:
        return {"all_reduce": all_reduce(b * sum(units), N) + all_reduce(LOSS_BYTES, N)}
    Pp = padded(units, N)
    small = all_reduce(LOSS_BYTES, N) + all_reduce(NORM_BYTES, N)
    one = gather_or_scatter(b * Pp, N)
    if stage == 1:
        return {"all_reduce": small, "reduce_scatter": one, "all_gather": one}
    if stage == 2:
        return {"all_reduce": small, "reduce_scatter": K * one, "all_gather": one}
    return {"all_reduce": small, "reduce_scatter": K * one, "all_gather": 2 * K * one}


def zero2_comm_peak(model, N, precision):
    """Stage 02's peak comm bytes: two neighbouring units' full gradients."""
    g = [N * piece(n, N) for n in model_units(model)]
    return DTYPE_BYTES[precision] * max(a + c for a, c in zip(g, g[1:]))


def zero3_gathered_peak(model, N, precision):
    """Stage 03's peak gathered bytes: the unit computing and the one
    prefetched, two neighbouring units' full parameters."""
    g = [N * piece(n, N) for n in model_units(model)]
    return DTYPE_BYTES[precision] * max(a + c for a, c in zip(g, g[1:]))


def zero3_device_peak(model, N, precision, B, compute="f32", attention="simple", recompute="none"):
    """Stage 03's device peak, everything at once: the model states and the
    activations (held all step), the bf16 recipe's float32 workspace (two
    buffers of the largest unit, when compute is f32), and the worst moment
    of the backward: as unit u computes, u and the prefetched u-1 are
    gathered, u's full gradient is being made and u+1's is still in its
    reduce-scatter."""
    units, e = model_units(model), DTYPE_BYTES[precision]
    a = [N * piece(n, N) for n in units]
    U = len(a)
    states = sum(zero_memory(3, model, N, precision).values())
    workspace = 2 * 4 * max(units) if precision == "bf16" and compute == "f32" else 0
    moment = max(a[u] + (a[u - 1] if u > 0 else 0) + a[u] + (a[u + 1] if u + 1 < U else 0) for u in range(U))
    return states + activation_peak(model, B, compute, attention, recompute) + workspace + e * moment


def fsdp_sizes(model, N, wrap_blocks=1):
    """(padded FSDP units a_g, the head's padded size h, my shard S)."""
    units = fsdp_units(model, wrap_blocks)
    a = [N * piece(n, N) for n in units]
    return a, a[-1], shard_total(units, N)


def fsdp_comm(model, N, precision, K=1, reduce_dtype=None, reshard=True, no_sync=False, wrap_blocks=1):
    """Stage 04's bytes per step by collective (section 8 and 04_fsdp/README.md)."""
    if N == 1:
        return {}
    a, h, _ = fsdp_sizes(model, N, wrap_blocks)
    e, r = DTYPE_BYTES[precision], DTYPE_BYTES[reduce_dtype or precision]
    gathered = 2 * sum(a) - h if reshard else sum(a)
    K_rs = 1 if no_sync else K
    return {"all_reduce": all_reduce(LOSS_BYTES, N) + all_reduce(NORM_BYTES, N),
            "all_gather": K * gather_or_scatter(e * gathered, N),
            "reduce_scatter": K_rs * gather_or_scatter(r * sum(a), N)}


def fsdp_gathered_peak(model, N, precision, reshard=True, prefetch=1, wrap_blocks=1):
    """Peak of category `gathered` at the default --max-gathered 2: the unit
    computing and the one prefetched (prefetch 1), the unit alone (prefetch
    0), the whole model without resharding."""
    a, _, _ = fsdp_sizes(model, N, wrap_blocks)
    e = DTYPE_BYTES[precision]
    if not reshard:
        return e * sum(a)
    if prefetch == 0:
        return e * max(a)
    return e * max(x + y for x, y in zip(a, a[1:]))


def fsdp_comm_peak(model, N, precision, reduce_dtype=None, reshard=True, no_sync=False, wrap_blocks=1):
    """Peak of category `comm` at the default --prefetch 1: the moments of
    04_fsdp/README.md, Memory of the communication buffers. c: a bf16
    all-gather's input (the cast shard), e: a unit's gradient buffer, h: a
    buffer in its reduce-scatter (under --no-sync only the float32 copy of
    a kept gradient); under a bf16 reduce, my reduced piece is widened to
    float32 (4 S) as its reduce-scatter completes."""
    a, _, _ = fsdp_sizes(model, N, wrap_blocks)
    G, e = len(a), DTYPE_BYTES[precision]
    r = DTYPE_BYTES[reduce_dtype or precision]
    c = e if precision == "bf16" else 0
    cb = c if reshard else 0  # the backward gathers again only after a reshard

    def A(g):
        return a[g] if 0 <= g < G else 0

    def S(g):
        return A(g) // N

    def h(g):
        return (4 * A(g) if r != e else 0) if no_sync else r * A(g)

    piece = r == 2
    peak = h(0) + 4 * S(0) if piece else 0  # the last wait: unit 0's buffer and its widened piece
    for g in range(G):
        before = cb * S(g - 1) + h(g + 1)  # g-1's all-gather input, g+1's buffer in flight
        made = 0 if no_sync else e * A(g)
        peak = max(peak, c * (S(g) + S(g + 1)),                                  # the forward's prefetch
                   before + cb * (S(g) if g < G - 1 else 0),                    # g's prefetch issued
                   before + made + (4 * A(g) if r != e else 0),                 # g's buffer made
                   before + h(g) + (4 * S(g + 1) if piece and g + 1 < G else 0))  # g+1's completing
    return peak


def offload_memory(model, N, precision, K=1):
    """Stage 05 per rank: device model states eS, host 16S (+2S bf16 copy);
    per step d2h K*r*S, h2d e*S (05_offload/README.md's tables)."""
    _, _, S = fsdp_sizes(model, N)
    e = DTYPE_BYTES[precision]
    return {"device_model_states": e * S, "host_model_states": (18 if precision == "bf16" else 16) * S,
            "to_host_bytes": K * e * S, "to_device_bytes": e * S}


def hybrid_zero2(model, N, F, precision, K=1):
    """The last lab's variant: ZeRO-2 sharded within groups of F ranks,
    each accumulated piece all-reduced across the N/F groups once per step;
    the loss over all N ranks, the norm's limbs within the group."""
    units, b = model_units(model), DTYPE_BYTES[precision]
    R = N // F
    Pp, S = padded(units, F), shard_total(units, F)
    mem = {"params": b * Pp, "grads": b * S, "optimizer": optimizer_bytes_per_element(precision) * S}
    comm = {"all_reduce": all_reduce(b * S, R) + all_reduce(LOSS_BYTES, N) + all_reduce(NORM_BYTES, F),
            "reduce_scatter": K * gather_or_scatter(b * Pp, F),
            "all_gather": gather_or_scatter(b * Pp, F)}
    return mem, {k: v for k, v in comm.items() if v}


def activation_peak(model, B, precision_compute="f32", attention="simple", recompute="none"):
    """Section 7's activation bytes of a rank: fixed + L(block + att), fixed + block + att, fixed + L·block + att."""
    m = SHAPES[model]
    V, T, L, H, C = m["V"], m["T"], m["L"], m["H"], m["C"]
    e = 4 if precision_compute == "f32" else 2
    BT = B * T
    scratch = 4 * T * T if attention == "simple" else 4 * B * H * T
    fixed = (L + 12) * BT * C * e + BT * V * e + 24 * BT + scratch
    block = 15 * BT * C * e + 16 * BT
    att = B * H * T * T * e if attention == "simple" else 4 * B * H * T
    att = 4 * math.ceil(att / 4)
    if recompute == "full":
        return fixed + block + att
    if recompute == "attn" and attention == "simple":
        return fixed + L * block + att
    return fixed + L * (block + att)
