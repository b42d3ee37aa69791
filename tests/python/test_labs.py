#!/usr/bin/env python3
# test_labs.py: the labs of docs/labs/ and their checker, scripts/lab_check.py.
# Every lab's check passes on its unmodified stage with correct predictions
# (written here from docs/SPEC.md's tables as literals, apart from
# scripts/lab_formulas.py); a wrong prediction fails naming its key; the
# previous stage's executable (the student who did not make the lab's
# change) fails the lab's properties; every reading reference of every lab
# resolves, and the reference checker fails on a scratch lab whose anchors
# went stale. The data-parallel and last labs' wrong variants are
# executables made here: stage 00 whose run log's gradient norm is N times
# too large (a gradient summed, not averaged), and a stand-in for the
# student's hybrid ZeRO-2 (stage 00's training, the hybrid's counters).
# Standard library only.
#
#   meson test -C build labs
#   ZF_BUILD=build python3 tests/python/test_labs.py [--xml FILE]

import collections
import contextlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gtest_xml  # noqa: E402
import lab_check  # noqa: E402
import lab_refs  # noqa: E402
import lab_specs  # noqa: E402

BUILD = os.path.abspath(os.environ.get("ZF_BUILD") or os.path.join(ROOT, "build"))
EXE = {0: "00_data_parallel/dp", 1: "01_zero1/zero1", 2: "02_zero2/zero2", 3: "03_zero3/zero3",
       4: "04_fsdp/fsdp", 5: "05_offload/offload"}

# tiny (docs/SPEC.md section 1): V = 256, T = 64, L = 2, H = 4, C = 64.
P = 2 * 256 * 64 + 64 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64   # 136,960
BLOCK = 12 * 64 * 64 + 13 * 64                                         # 49,984
HEAD = 2 * 64 + 256 * 64                                               # 16,512
EMBED = 256 * 64 + 64 * 64                                             # 20,480: wte and wpe
# section 7, B = 2, f32, simple attention, no recompute: fixed + L·(block + att)
ACT = (14 * 128 * 64 * 4 + 128 * 256 * 4 + 24 * 128 + 4 * 64 * 64) + 2 * ((15 * 128 * 64 * 4 + 16 * 128) + 2 * 4 * 64 * 64 * 4)
SMALL_P = 2 * 256 * 128 + 128 * 128 + 4 * (12 * 128 * 128 + 13 * 128) + 2 * 128

# Correct predictions, each from SPEC's tables (no padding: tiny's units
# divide by 2 and 4). f = (N-1)/N.
PREDICTIONS = {
    0: {"tiny.P": P, "tiny.model_states": 16 * P, "small.P": SMALL_P, "small.model_states": 16 * SMALL_P},
    # N = 2, fp32: 16P; the gradient's all-reduce 2f*4P and the loss's 2f*4 bytes.
    1: {"model_states": 16 * P, "all_reduce": 2 * (1 / 2) * (4 * P + 4), "activations": ACT},
    # N = 4, bf16: 4P + 12P/N; each half of the all-reduce f*2P; loss + norm 2f*(4 + 160).
    2: {"model_states": 4 * P + 12 * P / 4, "reduce_scatter": 3 / 4 * 2 * P, "all_gather": 3 / 4 * 2 * P,
        "all_reduce": 2 * 3 / 4 * (4 + 160), "optimizer_bytes": 12 * P / 4},
    # N = 4, bf16, K = 2: 2P + 14P/N; K reduce-scatters; two blocks' bf16 gradients at the peak.
    3: {"model_states": 2 * P + 14 * P / 4, "reduce_scatter": 2 * 3 / 4 * 2 * P, "all_gather": 3 / 4 * 2 * P,
        "grads_bytes": 2 * P / 4, "comm_peak": 2 * (2 * BLOCK)},
    # N = 4, fp32: 16P/N; 2K all-gathers and K reduce-scatters; the two blocks gathered at the peak.
    # The device peak: as block 0 computes its backward, it and the embedding are gathered, its
    # gradient is being made and block 1's is in its reduce-scatter.
    4: {"model_states": 16 * P / 4, "all_gather": 2 * 3 / 4 * 4 * P, "reduce_scatter": 3 / 4 * 4 * P,
        "bytes_per_step": 3 * 3 / 4 * 4 * P + 2 * 3 / 4 * (4 + 160), "gathered_peak": 4 * (2 * BLOCK),
        "device_peak": 16 * P / 4 + ACT + 4 * (BLOCK + EMBED + BLOCK + BLOCK)},
    # N = 4, bf16: float32 shards 4+4+8 bytes; the head stays gathered: f*2(2P - h).
    5: {"model_states": 16 * P / 4, "params_bytes": 4 * P / 4, "all_gather": 3 / 4 * 2 * (2 * P - HEAD),
        "reduce_scatter": 3 / 4 * 2 * P, "gathered_peak": 2 * (2 * BLOCK)},
    # N = 2, bf16: device 2S, host 18S; d2h rS, h2d eS.
    6: {"model_states": 2 * P / 2, "host_model_states": 18 * P / 2, "to_host_bytes": 2 * P / 2,
        "to_device_bytes": 2 * P / 2},
}

# Lab 8, by hand from SPEC section 13, the profiles' numbers and
# hardware/README.md's table of NCCL's protocols: GPT-2's shape, bf16, N = 8
# on one node, L + 2 = 14 units none padded.
V2, T2, L2, C2 = 50304, 1024, 12, 768
GPT2_UNITS = [V2 * C2 + T2 * C2] + [12 * C2 * C2 + 13 * C2] * L2 + [2 * C2 + V2 * C2]
GPT2_P = sum(GPT2_UNITS)
UNITS = len(GPT2_UNITS)
# NCCL's tree all-reduce correction by size (64 B * 2^i), per protocol, as
# src/graph/tuning.cc has it (treeCorrectionFactor): the sizes below use i <= 1.
TREE_CORRECTION = {"LL": [1.0, 1.0], "LL128": [1.0, 1.0], "Simple": [.9, .9]}
# A node's numbers: NVLink or PCIe, each kind's bus bandwidth, LL's cap, NVLS's rate (Hopper).
H100 = dict(nvlink=True, all_gather=350, reduce_scatter=360, all_reduce=350, ll_most=141, nvls=460)
L40S = dict(nvlink=False, all_gather=20, reduce_scatter=20, all_reduce=20, ll_most=87.7, nvls=None)


def nccl_seconds(kind, nbytes, node, n=8, latency=True, protocols=("LL", "LL128", "Simple")):
    """The fastest of NCCL's ways for one collective inside a node: each a latency
    (base + steps x the step's) and the bytes over the protocol's bandwidth."""
    nvlink, bw = node["nvlink"], node[kind]
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    moved = (2 if kind == "all_reduce" else 1) * (n - 1) / n * nbytes
    ring = {"LL": (6.6 + steps * (0.6 if nvlink else 1.0), moved, min(node["ll_most"], bw / 2)),
            "Simple": (8.4 + steps * (3.4 if nvlink else 5.7), moved, bw)}
    if nvlink:
        ring["LL128"] = (14 + steps * 1.9, moved, 0.92 * bw)
    ways = [(p, w) for p, w in ring.items()]
    if kind == "all_reduce":  # a chain of the node's GPUs, up and down; NVLS in a Hopper node
        i = (nbytes // 64).bit_length() - 1  # none under 64 B
        hop = {"LL": 0.6 if nvlink else 1.0, "LL128": 1.25, "Simple": 4.0}
        base = {"LL": 6.8, "LL128": 14, "Simple": 8.4}
        tree_bw = {"LL": min(0.92 * bw / 3.8, node["ll_most"]), "LL128": 0.92 * bw * 7 / 9, "Simple": 0.92 * bw}
        for p in ring:
            correction = TREE_CORRECTION[p][i] if i >= 0 else 1.0
            ways.append((p, (base[p] + 2 * (n - 1) * hop[p], 2 * nbytes, tree_bw[p] * correction)))
        if node["nvls"]:
            ways.append(("Simple", (25, moved, node["nvls"])))
    return min((1 if latency else 0) * l * 1e-6 + m / (b * 1e9) for p, (l, m, b) in ways if p in protocols)


def zero3_comm_ms(node, **how):
    """2U all-gathers and U reduce-scatters of each unit's bf16 bytes, and the loss's (4 B)
    and the norm's (160 B) all-reduces, each as NCCL would run it."""
    seconds = sum(2 * nccl_seconds("all_gather", 2 * u, node, **how) +
                  nccl_seconds("reduce_scatter", 2 * u, node, **how) for u in GPT2_UNITS)
    seconds += nccl_seconds("all_reduce", 4, node, **how) + nccl_seconds("all_reduce", 160, node, **how)
    return 1e3 * seconds


S8 = GPT2_P // 8
TIME_PREDICTIONS = {
    "nvlink.comm_ms": zero3_comm_ms(H100),   # h100-sxm
    "pcie.comm_ms": zero3_comm_ms(L40S),     # l40s
    # AdamW at 2e9 params/s; the norm's 4S bytes, the landed bf16 piece added into the
    # float32 shard (10S bytes) and that shard zeroed after the update (4S) at 100 GB/s; each
    # shared by 8 GPUs
    "offload.host_ms": 1e3 * (S8 / (2e9 / 8) + (4 + 10 + 4) * S8 / (100e9 / 8)),
    # each unit's bf16 piece down and its bf16 shard up, 10 us and 55 GB/s (pinned) a copy; the
    # inputs, targets and losses, B·T = 4 x 1024 four-byte values each, 10 us and 20 GB/s (pageable)
    "offload.copy_ms": 1e3 * (2 * UNITS * 10e-6 + 2 * 2 * S8 / 55e9 + 3 * (10e-6 + 4 * 4 * 1024 / 20e9)),
}


def check(*argv):
    """lab_check.py's exit status and output, run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = lab_check.main([str(a) for a in argv] + ["--build", BUILD])
    return rc, out.getvalue()


def predict(values):
    return ["--predict"] + [f"{k}={v!r}" for k, v in values.items()]


def missing_executables():
    return [e for e in EXE.values() if not os.access(os.path.join(BUILD, e), os.X_OK)]


class LabTestCase(unittest.TestCase):
    def setUp(self):
        gone = missing_executables()
        if gone:
            self.skipTest(f"not built under {BUILD}: {', '.join(gone)} (ninja -C build ...)")

    def passes(self, *argv):
        rc, out = check(*argv)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out.strip().splitlines()[-1], r"^lab \d: passed \(\d+ checks\)$")
        self.assertNotIn("FAIL", out)
        return out

    def fails(self, *argv, naming=()):
        rc, out = check(*argv)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out.strip().splitlines()[-1], r"^lab \d: failed \(\d+ of \d+ checks\)$")
        for what in naming:
            self.assertRegex(out, r"FAIL  [^\n]*" + what, out)
        return out


class EveryLabPassesOnItsStage(LabTestCase):
    def test_labs_0_to_6(self):
        for lab, values in PREDICTIONS.items():
            with self.subTest(lab=lab):
                out = self.passes(lab, *predict(values))
                for key in values:
                    self.assertRegex(out, rf"ok    prediction {key}: predicted [\d,.]+, measured [\d,.]+")

    def test_time_lab(self):
        # A step estimated 30 % too long, and the compute half of what it is, are reported, not failed.
        guess = {"nvlink.step_ms": 100.0, "nvlink.compute_ms": 5.0}
        out = self.passes(8, *predict({**TIME_PREDICTIONS, **guess}))
        for key in TIME_PREDICTIONS:
            self.assertRegex(out, rf"ok    prediction {key}: predicted [\d,.]+, measured [\d,.]+")
        self.assertRegex(out, r"note  estimate nvlink.step_ms: predicted 100, measured [\d,.]+, off by [-+][\d.]+ %")
        self.assertRegex(out, r"note  estimate nvlink.compute_ms: predicted 5, measured [\d,.]+, off by -[\d.]+ %")
        for what in ("ZeRO-3 over PCIe", "prefetch moves no byte", "pcie_prefetch0: two queues, one link",
                     "pcie_prefetch1: two queues, one link", "the delayed update hides"):
            self.assertRegex(out, "ok    " + what)

    def test_padding_counts_at_three_ranks(self):
        # tiny at N = 3: pieces of 6,827 (embedding), 16,662 (blocks), 5,504 (head)
        padded, shard = 3 * 6827 + 2 * 3 * 16662 + 3 * 5504, 6827 + 2 * 16662 + 5504
        self.passes(2, "--ranks", 3, "--predict", f"model_states={2 * 2 * padded + 12 * shard}",
                    f"all_gather={2 / 3 * 2 * padded!r}")

    def test_fsdp_knobs(self):
        self.passes(5, "--stage-flags=--prefetch=0", "--predict", f"gathered_peak={2 * BLOCK}")  # one block, bf16
        self.passes(5, "--stage-flags=--reduce-dtype fp32", "--predict", f"reduce_scatter={3 / 4 * 4 * P!r}")
        self.passes(5, "--stage-flags=--reshard-after-forward false", "--predict",
                    f"all_gather={3 / 4 * 2 * P!r}", f"gathered_peak={2 * P}")

    def test_offload_params(self):
        # device 0; every all-gather's input uploaded: e(2S - S_head)
        self.passes(6, "--stage-flags=--offload-params", "--predict", "model_states=0",
                    f"to_device_bytes={2 * (2 * P // 2 - HEAD // 2)}")


class WrongPredictionsFail(LabTestCase):
    def test_zero1_predicted_as_zero3(self):
        out = self.fails(2, "--predict", f"model_states={16 * P // 4}", naming=["prediction model_states"])
        self.assertIn(f"predicted {16 * P // 4:,}, measured {7 * P:,}", out)

    def test_off_by_one_byte(self):
        self.fails(4, "--predict", f"all_gather={2 * 3 * P + 1}", naming=["prediction all_gather"])
        self.fails(0, "--predict", f"tiny.P={P - 1}", naming=["prediction tiny.P"])

    def test_reduce_scatter_once_under_accumulation(self):
        # ZeRO-2 reduce-scatters on every micro-step: K = 2 of them
        self.fails(3, "--predict", f"reduce_scatter={3 / 4 * 2 * P!r}", naming=["prediction reduce_scatter"])

    def test_time_without_the_latencies(self):
        # the bytes over the bus bandwidth alone: NCCL's latencies are a third of NVLink's time
        bytes_only = zero3_comm_ms(H100, latency=False)
        self.assertGreater(TIME_PREDICTIONS["nvlink.comm_ms"] / bytes_only, 1.1)
        self.fails(8, "--predict", f"nvlink.comm_ms={bytes_only!r}", naming=["prediction nvlink.comm_ms"])

    def test_time_at_the_all_reduces_bus_bandwidth(self):
        # every kind at the all-reduce's 460 GB/s, which only NVLink SHARP's all-reduce reaches
        one_rate = zero3_comm_ms(dict(H100, all_gather=460, reduce_scatter=460))
        self.fails(8, "--predict", f"nvlink.comm_ms={one_rate!r}", naming=["prediction nvlink.comm_ms"])

    def test_time_with_one_protocol(self):
        # every collective with Simple, NCCL's protocol for large messages: the blocks'
        # all-gathers and reduce-scatters take LL128, and the all-reduces LL
        simple_only = zero3_comm_ms(H100, protocols=("Simple",))
        self.fails(8, "--predict", f"nvlink.comm_ms={simple_only!r}", naming=["prediction nvlink.comm_ms"])

    def test_time_without_the_batch_copies(self):
        # the units' copies alone, without the three pageable copies of the batch: under 2 % off
        units_only = 1e3 * (2 * UNITS * 10e-6 + 2 * 2 * S8 / 55e9)
        self.assertLess(abs(units_only / TIME_PREDICTIONS["offload.copy_ms"] - 1), 0.03)
        self.fails(8, "--predict", f"offload.copy_ms={units_only!r}", naming=["prediction offload.copy_ms"])

    def test_fsdp_bf16_parameters_are_float32_shards(self):
        self.fails(5, "--predict", f"params_bytes={2 * P // 4}", naming=["prediction params_bytes"])


class PreviousStageFails(LabTestCase):
    """The student who did not make the lab's change: the stage before it."""

    def test_zero1_lab_with_dp(self):
        # A copy, as in the student's second checkout before the change (the
        # reference dp itself is refused as --binary).
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "dp")
            shutil.copy2(os.path.join(BUILD, EXE[0]), copy)
            self.fails(2, "--binary", copy, naming=["model states per rank", "reduce_scatter"])

    def test_zero2_lab_with_zero1(self):
        self.fails(3, "--binary", os.path.join(BUILD, EXE[1]),
                   naming=["model states per rank", "grads bytes", "reduce_scatter bytes", "peak comm"])

    def test_zero3_lab_with_zero2(self):
        self.fails(4, "--binary", os.path.join(BUILD, EXE[2]),
                   naming=["model states per rank", "all_gather bytes", "device peak", "--device-mem"])

    def test_fsdp_lab_with_zero3(self):
        # Stage 03 gathers the same units, two at a time, as stage 04 by default: its gathered peak is
        # stage 04's; its bf16 parameter shards are not (the lab's change), nor its category comm (no
        # float32 piece to cast or widen), nor its head gathered twice (stage 04's, noted: not
        # required of the student).
        out = self.fails(5, "--binary", os.path.join(BUILD, EXE[3]), naming=["params bytes", "peak comm bytes"])
        self.assertNotRegex(out, r"FAIL  [^\n]*all_gather")
        self.assertRegex(out, r"note  all_gather bytes per step[^\n]*stage 04's, not required")

    def test_offload_lab_with_fsdp(self):
        self.fails(6, "--binary", os.path.join(BUILD, EXE[4]), naming=["device model states", "device->host"])

    def test_hybrid_lab_with_zero2(self):
        out = self.fails(7, "--binary", os.path.join(BUILD, EXE[2]), naming=["the run"])
        self.assertIn("StageFlags::fsdp", out)


class MadeUpVariants(LabTestCase):
    """Executables made here: a stage's training under a wrapper that edits its run log."""

    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="zf-labs-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def wrapper(self, name, body, stage=0):
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(WRAPPER.format(python=sys.executable, exe=os.path.join(BUILD, EXE[stage]), body=body))
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        return path

    def test_dp_lab_with_a_gradient_summed_not_averaged(self):
        body = "for s in steps: s['grad_norm'] *= summary['ranks']"
        self.fails(1, "--binary", self.wrapper("dp_sum", body), naming=["grad_norm at every step"])

    def test_dp_lab_with_the_wrapper_unchanged(self):
        self.passes(1, "--binary", self.wrapper("dp_same", "pass"))

    def test_zero1_lab_with_other_final_parameters(self):
        # ZeRO-1's bytes and memory, but not stage 00's training: parity must catch it
        body = "summary['param_hash'] = '0x0123456789abcdef'\nsteps[-1]['loss'] += 1e-6"
        self.fails(2, "--binary", self.wrapper("zero1_off", body, stage=1),
                   naming=["final parameter hash", "loss and grad_norm at every step"])

    def test_a_shard_cut_without_padding_fails_where_the_units_are_padded(self):
        # A cut that ignores the padding (each unit's shard floor(numel/N)):
        # right at N = 4, where tiny's units divide, and the optimizer's
        # bytes wrong at N = 3. The check of a student's executable looks at both.
        body = ("if summary['ranks'] == 3:\n"
                "    for m in summary['memory']:\n"
                f"        o = 12 * (2 * ({BLOCK} // 3) + 2 * 256 * 64 // 3 + {HEAD} // 3)\n"
                "        m['device']['model_states'] += o - m['device']['optimizer']['current']\n"
                "        m['device']['optimizer']['current'] = o")
        cut = self.wrapper("zero1_cut", body, stage=1)
        self.passes(2, "--binary", cut, "--ranks", 4)
        self.fails(2, "--binary", cut, naming=[r"N=3: model states per rank", r"N=3: optimizer bytes"])

    # A stand-in for the lab's change made to stage 03: float32 shards of
    # the parameters and gradients (4S each), no master (AdamW's 8S),
    # S = tiny's padded shard (N = 4: P/4; N = 3: the units padded to 3).
    # At N = 4 in bf16 category comm also holds what the change adds: as
    # h.1's reduce-scatter completes during h.0's backward, the embedding's
    # bf16 all-gather input (prefetched for its backward), h.0's gradient
    # buffer, h.1's buffer and my piece of it widened to float32
    # (04_fsdp/README.md's moments); at N = 3 the check runs in fp32, where
    # there is neither the cast nor the widening.
    FSDP_STAND_IN = ("S = {4: %d, 3: %d}[summary['ranks']]\n"
                     "for m in summary['memory']:\n"
                     "    d = m['device']\n"
                     "    d['params']['current'], d['grads']['current'], d['optimizer']['current'] = 4 * S, 4 * S, 8 * S\n"
                     "    d['model_states'] = 16 * S\n") % (
        P // 4, sum(-(-u // 3) for u in (256 * 64 + 64 * 64, BLOCK, BLOCK, HEAD)))
    FSDP_COMM_PEAK = ("    if summary['ranks'] == 4:\n"
                      "        d['comm']['peak'] = %d\n") % (2 * EMBED // 4 + 2 * BLOCK + 2 * BLOCK + 4 * BLOCK // 4)

    def test_the_fsdp_lab_from_stage_03_passes_without_stage_04s_extras(self):
        out = self.passes(5, "--binary", self.wrapper("zero3_f32", self.FSDP_STAND_IN + self.FSDP_COMM_PEAK, stage=3))
        self.assertIn("note  all_gather bytes per step", out)

    def test_the_fsdp_lab_with_the_send_buffer_outside_comm(self):
        # The same shards, but category comm as stage 03's: the bf16 input of
        # each all-gather and the widened piece counted elsewhere
        out = self.fails(5, "--binary", self.wrapper("zero3_f32_comm", self.FSDP_STAND_IN, stage=3),
                         naming=[r"peak comm bytes \(rank 0\)"])
        self.assertIn("failed (1 of", out)

    def test_one_rank_that_differs(self):
        body = "summary['memory'][1]['device']['model_states'] += 2"
        self.fails(2, "--binary", self.wrapper("zero1_rank1", body, stage=1), naming=[r"model states per rank \(rank 1\)"])

    def test_a_collective_the_formula_lacks(self):
        body = "for c in summary['comm']: c['by_collective']['broadcast'] = 8.0"
        self.fails(1, "--binary", self.wrapper("dp_broadcast", body), naming=["broadcast bytes per step"])

    def test_tests_runs_the_stage_suite(self):
        # a stand-in meson on PATH: records its arguments, fails
        fake = os.path.join(self.dir, "meson")
        with open(fake, "w", encoding="utf-8") as f:
            f.write(f"#!/bin/sh\necho \"$@\" > {self.dir}/args\nexit 1\n")
        os.chmod(fake, 0o755)
        path = os.environ["PATH"]
        os.environ["PATH"] = self.dir + os.pathsep + path
        try:
            self.fails(2, "--tests", naming=["meson test zero1"])
        finally:
            os.environ["PATH"] = path
        with open(os.path.join(self.dir, "args"), encoding="utf-8") as f:
            self.assertEqual(f.read().split(), ["test", "-C", BUILD, "zero1"])

    def hybrid(self, all_reduce):
        # N = 4, groups of F = 2, fp32: 4P + 12P/F; within the group f = 1/2 of
        # 4P; across the R = 2 groups the piece 2(1/2)(4P/2); loss over 4, norm over 2.
        body = HYBRID.format(params=4 * P, grads=4 * P // 2, opt=8 * P // 2, rs=1 / 2 * 4 * P, ag=1 / 2 * 4 * P,
                             ar=all_reduce)
        return self.wrapper("hybrid", body)

    def test_hybrid_lab_passes_with_the_hybrid_counters(self):
        good = 2 * (1 / 2) * (4 * P / 2) + 2 * 3 / 4 * 4 + 2 * 1 / 2 * 160
        self.passes(7, "--binary", self.hybrid(good), "--ranks", 4,  # its counters are N = 4's
                    "--predict", f"model_states={10 * P}", f"all_reduce={good!r}")

    def test_hybrid_lab_fails_without_the_all_reduce_across_groups(self):
        self.fails(7, "--binary", self.hybrid(2 * 3 / 4 * 4 + 2 * 1 / 2 * 160), naming=["all_reduce bytes"])


class TimeExperiments(LabTestCase):
    """Lab 8's three experiments, run as solutions/lab8_tradeoffs.md answers them."""

    def run_time(self, exe, *extra, hardware="h100-sxm", ranks=8):
        """The third step of a dry run of lab 8's flags, and its collectives' protocols on rank 0."""
        with tempfile.TemporaryDirectory() as d:
            log, trace = os.path.join(d, "log.jsonl"), os.path.join(d, "trace.json")
            args = [os.path.join(BUILD, exe), "--model", "gpt2", "--ranks", str(ranks), "--batch", "4",
                    "--precision", "bf16", "--compute", "bf16", "--attention", "flash", "--steps", "4",
                    "--clock", "modeled", "--dry-run", "--quiet", "--hardware", hardware, "--log-json", log,
                    "--trace", trace, *extra]
            self.assertEqual(subprocess.run(args, capture_output=True).returncode, 0, args)
            step = [json.loads(x) for x in open(log) if '"step"' in x][2]
            protocols = collections.Counter(
                e["args"]["protocol"] for e in json.load(open(trace))["traceEvents"]
                if e["ph"] == "X" and e.get("cat") == "comm" and e["pid"] == 0 and e["args"].get("step") == 2
                and e["name"] != "all_reduce")
        return step, protocols

    def test_four_ranks(self):
        (eight, p8), (four, p4) = (self.run_time(EXE[3], ranks=n) for n in (8, 4))
        self.assertLess(four["phases_ms"]["comm"], eight["phases_ms"]["comm"])
        self.assertGreater(p8["LL128"], p8["Simple"])  # most of the units' collectives: LL128 at 8 ranks
        self.assertEqual(set(p4), {"Simple"})          # Simple at 4

    def test_a_host_four_times_faster(self):
        with tempfile.TemporaryDirectory() as d:
            fast = os.path.join(d, "fast-host.hw")
            with open(os.path.join(ROOT, "hardware", "h100-sxm.hw")) as f, open(fast, "w") as out:
                for line in f:
                    key, _, rest = line.partition("=")
                    if key.strip() == "host_adamw_params_per_s":
                        value, _, comment = rest.partition("#")
                        line = "%s= %r  #%s" % (key, 4 * float(value), comment)
                    out.write(line)
            steps = {(hw, delay): self.run_time("05_offload/offload", *delay, hardware=hw)[0]["ms"]
                     for hw in ("h100-sxm", fast) for delay in ((), ("--delay-update",))}
        fell = steps[("h100-sxm", ())] - steps[(fast, ())]
        self.assertGreater(fell, 0)
        self.assertAlmostEqual(steps[("h100-sxm", ("--delay-update",))] - steps[(fast, ("--delay-update",))], fell,
                               delta=1e-6 * fell)  # both steps fall by the same amount

    def test_half_as_many_all_gathers(self):
        (one, p1), (two, p2) = (self.run_time("04_fsdp/fsdp", "--prefetch", "1", "--wrap-blocks", str(w),
                                              hardware="l40s") for w in (1, 2))
        self.assertLess(two["phases_ms"]["comm"], one["phases_ms"]["comm"])
        self.assertLess(two["phases_ms"]["exposed comm"], one["phases_ms"]["exposed comm"])
        self.assertEqual(set(p1), set(p2))  # the same protocol: the bandwidth terms stay


# A stand-in executable: runs a stage with the flags it is given (less
# --shard-group), then edits the run log's steps and summary with `body`.
WRAPPER = '''#!{python}
import json, subprocess, sys
args = sys.argv[1:]
if "--shard-group" in args:
    i = args.index("--shard-group"); del args[i:i + 2]
rc = subprocess.run(["{exe}"] + args).returncode
if rc: sys.exit(rc)
log = args[args.index("--log-json") + 1]
lines = [json.loads(x) for x in open(log)]
steps, summary = lines[:-1], lines[-1]["summary"]
{body}
with open(log, "w") as f:
    for x in steps + [{{"summary": summary}}]:
        f.write(json.dumps(x) + "\\n")
'''

HYBRID = '''for m in summary["memory"]:
    d = m["device"]
    d["params"]["current"], d["grads"]["current"], d["optimizer"]["current"] = {params}, {grads}, {opt}
    d["model_states"] = {params} + {grads} + {opt}
for c in summary["comm"]:
    c["by_collective"] = {{"reduce_scatter": {rs!r}, "all_gather": {ag!r}, "all_reduce": {ar!r}}}
    c["bytes_per_step"] = sum(c["by_collective"].values())'''


class Usage(unittest.TestCase):
    def test_an_unknown_key_is_a_usage_error(self):
        rc, out = check(2, "--predict", "gathered_peak=1")
        self.assertEqual(rc, 2)
        self.assertIn("lab 2 accepts", out)

    def test_an_unknown_lab_or_a_bad_value(self):
        self.assertEqual(check(9)[0], 2)
        self.assertEqual(check(2, "--predict", "model_states=7P")[0], 2)
        self.assertEqual(check(5, "--stage-flags=--prefetch 3")[0], 2)

    def test_the_reference_itself_as_the_binary_is_refused(self):
        # Lab 2 has the student edit stage 00: checking that very dp against
        # itself would make the parity checks pass whatever the edit.
        rc, out = check(2, "--binary", os.path.join(BUILD, EXE[0]))
        self.assertEqual(rc, 2)
        self.assertIn("--reference", out)

    def test_the_last_lab_needs_a_binary(self):
        rc, out = check(7)
        self.assertEqual(rc, 2)
        self.assertIn("--binary", out)


class References(unittest.TestCase):
    def test_every_lab_has_anchored_references(self):  # that they resolve: the docs test
        docs = lab_refs.lab_docs()
        self.assertEqual(len(docs), 9, "docs/labs/lab0 ... lab8")
        for d in docs:
            self.assertGreaterEqual(len(lab_refs.references(d)), 3, f"{d}: a Read section of anchored references")

    def test_every_key_a_lab_names_is_one_its_check_accepts(self):
        # the first column of the Predict table, and every --predict KEY= of the Check commands:
        # the keys the lab documents are those its check accepts
        for lab, doc in zip(lab_specs.LABS, lab_refs.lab_docs()):
            with open(doc, encoding="utf-8") as f:
                text = f.read()
            predict = text.split("## Predict before running")[1].split("\n## ")[0]
            named = set(re.findall(r"^\| ((?:`[\w.]+`(?:, )?)+) \|", predict, re.M))
            keys = {k for cell in named for k in re.findall(r"`([\w.]+)`", cell)}
            keys |= set(re.findall(r"(?:--predict| ) ?([\w.]+)=", text.split("## Check")[1]))
            self.assertTrue(keys, doc)
            self.assertEqual(keys - set(lab.keys), set(), f"{doc} names keys lab {lab.number} does not accept")
            self.assertEqual(set(lab.keys) - keys, set(), f"{doc} leaves out keys its check accepts")

    def test_a_stale_lab_fails(self):
        root = tempfile.mkdtemp(prefix="zf-refs-")
        try:
            os.makedirs(os.path.join(root, "docs", "labs"))
            os.makedirs(os.path.join(root, "src"))
            with open(os.path.join(root, "src", "a.cpp"), "w") as f:
                f.write("// a.cpp\nint zero() {\n  return 0;\n}\nint one() { return 1; }\n" + "\n" * 8 +
                        "int three() { return 3; }\n")
            doc = os.path.join(root, "docs", "labs", "lab9_scratch.md")
            with open(doc, "w") as f:
                f.write("1. [src/a.cpp](../../src/a.cpp), anchor `int zero() {` (lines 1-3): fine\n"
                        "2. [src/a.cpp](../../src/a.cpp), anchor `int one()` (lines 1-3): moved down\n"
                        "3. [src/a.cpp](../../src/a.cpp), anchor `int two()`: gone\n"
                        "4. [src/b.cpp](../../src/b.cpp), anchor `x`: no such file\n"
                        "5. [src/a.cpp](../../src/b.cpp), anchor `x`: shown path is not the link\n"
                        "6. [src/a.cpp](../../src/a.cpp), anchor `int three()` (lines 1-14): starts 13 lines above\n")
            count, problems = lab_refs.check_all([doc], root)
            self.assertEqual(count, 6)
            self.assertEqual(len(problems), 5, "\n".join(problems))
            self.assertIn("lab9_scratch.md:2: src/a.cpp: anchor `int one()` is at line 5, not at the start of lines "
                          "1-3: write (lines 5-7)", problems[0])
            self.assertIn("lab9_scratch.md:6: src/a.cpp: anchor `int three()` is at line 14, not at the start of "
                          "lines 1-14: write (lines 14-27)", problems[4])
            self.assertIn("lab9_scratch.md:3", problems[1])
            self.assertIn("not found", problems[1])
            self.assertIn("no such file", problems[2])
            self.assertIn("not to the path shown", problems[3])
            rc, out = check("--check-refs", doc)
            self.assertEqual(rc, 1, out)
            self.assertIn("references: 5 of 6 stale", out)
        finally:
            shutil.rmtree(root)


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "labs", "test_labs.py [--xml FILE]"))
