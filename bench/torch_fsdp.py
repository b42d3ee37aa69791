#!/usr/bin/python3
# torch_fsdp.py: PyTorch FSDP2 (fully_shard) for bench/torch_ref.py --fsdp, and
# the process-memory readings its summary carries (start at torch_ref.py: it
# says how to run it; torch_train.py calls what is here).
#
# FSDP2 wrapping as torchtitan writes it for a GPT: fully_shard on every
# block (one FSDP unit each: one all-gather and one reduce-scatter per block),
# then on the root, which takes what is left (wte, wpe, ln_f, lm_head) as one
# unit. Over gloo on the CPU: a 1-D DeviceMesh of the N local processes.
# Parameters become DTensors sharded on dim 0; their names do not change, so
# docs/SPEC.md's names still address them.
#
# Memory on the CPU has no torch.cuda.max_memory_allocated(): the readings are
# the process's resident set (VmRSS before the model is built, and the peak,
# getrusage's ru_maxrss). The peak minus the first is the growth the training
# caused: parameters, gradients, AdamW state, activations, gloo's buffers and
# what the allocator keeps cached; the torch library itself is in both.

import resource

import torch

MIN_VERSION = (2, 4)


def version_tuple(v):
    """'2.5.1+cpu' -> (2, 5); an unparsable part counts as 0."""
    parts = []
    for x in v.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in x if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def fully_shard_api():
    """fully_shard of this torch, or raises RuntimeError saying why there is none."""
    if version_tuple(torch.__version__) < MIN_VERSION:
        raise RuntimeError("--fsdp needs PyTorch %d.%d or newer (FSDP2's fully_shard); this is torch %s at %s. "
                           "scripts/bench.sh --fsdp makes .venv-bench/ with a current PyTorch from PyPI"
                           % (MIN_VERSION + (torch.__version__, torch.__file__)))
    try:
        from torch.distributed.fsdp import fully_shard  # 2.6 and later
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard  # 2.4, 2.5
        except ImportError as e:
            raise RuntimeError("--fsdp: torch %s has no fully_shard (%s)" % (torch.__version__, e))
    return fully_shard


def shard_model(model, nranks):
    """fully_shard on each block, then on the root, over a CPU DeviceMesh of nranks."""
    fully_shard = fully_shard_api()
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (nranks,))
    for block in model.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_parameters(model):
    """(name, full tensor) of every parameter; a collective under FSDP2: every rank must call it."""
    out = []
    for name, p in model.named_parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out.append((name, t))
    return out


def rss_bytes():
    """The resident set of this process now (VmRSS), in bytes; 0 where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_bytes():
    """The highest resident set this process has had (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
