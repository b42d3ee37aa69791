#!/usr/bin/env python3
# test_bench.py: tests of bench/mfu.py (the one definition of MFU and the peak
# table) and bench/gpu_report.py (gpu_check.sh's benchmark tables), which the
# GPU run relies on but which this machine can check: the FLOP count against
# the C++ run log's flops_per_token (common/core/model.cpp), the arithmetic, and
# the tables built from made-up run logs. Standard library only.
#
#   meson test -C build bench_py                 # as scripts/test.sh runs it
#   ZF_DP_BIN=build/00_data_parallel/dp python3 tests/python/test_bench.py [--xml FILE]
#
# --xml writes GoogleTest's XML shape (gtest_xml.py), so
# scripts/test_summary.py counts these tests with the C++ ones.

import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_report  # noqa: E402
import gtest_xml  # noqa: E402
import mfu  # noqa: E402

PRESETS = {"tiny": (256, 64, 2, 4, 64), "small": (256, 128, 4, 4, 128), "gpt2": (50304, 1024, 12, 12, 768)}


class FlopsTest(unittest.TestCase):
    def test_gpt2_by_hand(self):
        # gpt2 (V=50304, T=1024, L=12, C=768), counted by hand from docs/SPEC.md's table:
        #   wte = lm_head = 50304*768 = 38,633,472 each; wpe = 1024*768 = 786,432;
        #   a block: ln 2*1536 + c_attn 768*2304+2304 + c_proj 768*768+768
        #            + c_fc 768*3072+3072 + mlp.c_proj 3072*768+768 = 7,087,872; 12 blocks 85,054,464;
        #   ln_f 1,536. P = 163,109,376.
        #   matrix-product parameters: P - wte - wpe = 123,689,472; 6x = 742,136,832;
        #   attention 12*L*T*C = 12*12*1024*768 = 113,246,208. Sum 855,383,040.
        V, T, L, H, C = PRESETS["gpt2"]
        self.assertEqual(mfu.gpt_params(V, T, L, C), 163109376)
        self.assertEqual(mfu.flops_per_token(163109376, V, T, L, C), 855383040.0)

    def test_same_count_as_the_cpp_run_log(self):
        # The C++ count (common/core/model.cpp, in the run log's summary) and this one
        # must be the same number: integers far below 2^53, so exactly equal.
        dp = os.environ.get("ZF_DP_BIN")
        if not dp or not os.access(dp, os.X_OK):
            self.skipTest("ZF_DP_BIN is not set to the built dp (meson test sets it)")
        for model in ("tiny", "small"):
            V, T, L, H, C = PRESETS[model]
            with tempfile.TemporaryDirectory() as tmp:
                log = os.path.join(tmp, "run.jsonl")
                subprocess.run([dp, "--model", model, "--steps", "1", "--batch", "1", "--quiet",
                                "--log-json", log], check=True, stdout=subprocess.DEVNULL)
                summary = [json.loads(l) for l in open(log) if l.strip()][-1]["summary"]
            self.assertEqual(summary["params"], mfu.gpt_params(V, T, L, C), model)
            self.assertEqual(summary["flops_per_token"], mfu.flops_per_token(summary["params"], V, T, L, C), model)


class PeakAndMfuTest(unittest.TestCase):
    def test_known_cards(self):
        self.assertEqual(mfu.peak_flops("NVIDIA H200", env={})[0], 989.4e12)
        self.assertEqual(mfu.peak_flops("NVIDIA H100 80GB HBM3", env={})[0], 989.4e12)
        self.assertEqual(mfu.peak_flops("NVIDIA A100-SXM4-80GB", env={})[0], 312e12)

    def test_unknown_cards_get_no_peak(self):
        # Variants with lower clocks must not borrow the SXM figure.
        for name in ("NVIDIA H200 NVL", "NVIDIA H100 PCIe", "Tesla T4", "", "no GPU"):
            peak, why = mfu.peak_flops(name, env={})
            self.assertIsNone(peak, name)
            self.assertIn("unknown card", why)
            self.assertIn(mfu.ENV_PEAK, why)

    def test_override(self):
        self.assertEqual(mfu.peak_flops("Tesla T4", env={mfu.ENV_PEAK: "65"})[0], 65e12)
        self.assertEqual(mfu.peak_flops("NVIDIA H200", env={mfu.ENV_PEAK: "500.5"})[0], 500.5e12)
        for bad in ("abc", "0", "-3", "inf"):
            with self.assertRaises(mfu.PeakError) as e:
                mfu.peak_flops("NVIDIA H200", env={mfu.ENV_PEAK: bad})
            self.assertIn("ZF_PEAK_TFLOPS", str(e.exception))

    def test_mfu(self):
        # 1e9 FLOP/token at 1e3 tokens/s on a 1e12 FLOP/s card: all exact in binary floating point.
        self.assertEqual(mfu.mfu(1e9, 1e3, 1e12), 1.0)
        # a gpt2 rate chosen just under 40% MFU of an H200's peak: 855383040 * 462600 / 989.4e12 = 0.39994...;
        # one multiplication and one division, each rounded to half an ulp (1.1e-16 relative).
        self.assertAlmostEqual(mfu.mfu(855383040.0, 462600.0, 989.4e12), 855383040 * 462600 / 989.4e12, delta=1e-15)
        self.assertLess(mfu.mfu(855383040.0, 462600.0, 989.4e12), 0.40)
        self.assertIsNone(mfu.mfu(855383040.0, 462600.0, None))
        self.assertIsNone(mfu.mfu(855383040.0, None, 989.4e12))


class AdamWShimTest(unittest.TestCase):
    """bench/adamw_c.cpp as bench_adamw.py calls it (ctypes): the step of
    common/core/adamw.h's formula, every operation rounded to float32, on a
    range that CpuAdamW cuts into 2 threads' chunks (at least kMinPerThread
    = 32,768 elements each, adamw_kernel.h), vectors and a scalar tail. A
    shim that passed beta1 for beta2, or dropped the decay, would compare
    something else with the peers."""

    N, LR, B1, B2, EPS, WD = 2 * 32768 + 35, 3e-3, 0.9, 0.95, 1e-8, 0.1

    def test_verdicts(self):
        import bench_adamw
        side = {bench_adamw.OURS: {1: [1000.0, 2000.0, 1500.0], 2: [3000.0, 2000.0]},
                "torch AdamW fused": {1: [1000.0, 1250.0, 1600.0], 2: [2400.0, 1000.0]},
                "DeepSpeedCPUAdam": {1: "unavailable: not installed"}}
        alone = {"the update's traffic, no AdamW math": {1: 2000.0, 2: 3200.0}}
        got = bench_adamw.verdicts(side, alone, [1, 2])
        # fastest 2000/1600, medians 1500/1250; 3000/2400, 2500/1700; 3000/2000 and 3200/2000
        self.assertEqual(got, [
            "1 thread: ours / torch AdamW fused = 1.25x by the fastest step, 1.20x by the median",
            "2 threads: ours / torch AdamW fused = 1.25x by the fastest step, 1.47x by the median",
            "2 threads over 1: ours 1.50x (fastest steps, side by side); the update's traffic without its "
            "arithmetic 1.60x (alone, in its own process): what the memory let a second thread add at some "
            "moment of this run"])

    def test_two_steps_by_the_formula(self):
        path = os.environ.get("ZF_ADAMW_C")
        if not path:
            self.skipTest("ZF_ADAMW_C unset: a sanitized build makes no bench/libzf_adamw_c.so "
                          "(a Python without the sanitizer's runtime cannot load it)")
        import ctypes
        import math
        import struct
        import bench_adamw

        def f32(x):
            return struct.unpack("f", struct.pack("f", x))[0]

        lib = bench_adamw.load_ours(path)
        arr = ctypes.c_float * self.N
        p = arr(*[f32(0.02 * math.sin(i + 1)) for i in range(self.N)])
        g = arr(*[f32(1e-3 * math.cos(3 * i)) for i in range(self.N)])
        m, v = arr(), arr()
        want = [list(p), list(m), list(v)]
        lr, b1, b2, eps, wd = (f32(x) for x in (self.LR, self.B1, self.B2, self.EPS, self.WD))
        handle = ctypes.c_void_p(lib.zf_adamw_new(2))
        self.assertTrue(handle)
        try:
            for t in (1, 2):
                self.assertEqual(0, lib.zf_adamw_step(handle, p, g, m, v, self.N, t, self.LR, self.B1, self.B2,
                                                      self.EPS, self.WD))
                decay = f32(1 - f32(lr * wd))
                step_size = f32(lr / (1 - b1 ** t))          # in double, then float32, as PyTorch
                bias2_sqrt = f32(math.sqrt(1 - b2 ** t))
                for i in range(self.N):
                    pi, mi, vi = want[0][i], want[1][i], want[2][i]
                    gi = g[i]
                    pi = f32(pi * decay)
                    mi = f32(mi + f32(f32(1 - b1) * f32(gi - mi)))
                    vi = f32(f32(vi * b2) + f32(f32(f32(1 - b2) * gi) * gi))
                    denom = f32(f32(f32(math.sqrt(vi)) / bias2_sqrt) + eps)
                    pi = f32(pi - f32(step_size * f32(mi / denom)))
                    want[0][i], want[1][i], want[2][i] = pi, mi, vi
                got = [list(p), list(m), list(v)]
                bad = next(((k, i) for k in range(3) for i in range(self.N) if got[k][i] != want[k][i]), None)
                self.assertIsNone(bad, f"step {t}: {'pmv'[bad[0]]}[{bad[1]}] = {got[bad[0]][bad[1]]!r}, "
                                       f"the formula gives {want[bad[0]][bad[1]]!r}" if bad else "")
        finally:
            lib.zf_adamw_free(handle)


def write_log(path, ms, tokens_per_step, summary, losses=None):
    with open(path, "w") as f:
        for i, t in enumerate(ms):
            loss = losses[i] if losses else 10.0 - i
            f.write(json.dumps({"step": i, "loss": loss, "ms": t, "tokens_per_s": tokens_per_step / (t / 1e3)}) + "\n")
        if summary is not None:
            f.write(json.dumps({"summary": summary}) + "\n")


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        # The tables read the peak from the environment too: test the built-in table.
        self.saved_peak = os.environ.pop(mfu.ENV_PEAK, None)

    def tearDown(self):
        self.tmp.cleanup()
        if self.saved_peak is not None:
            os.environ[mfu.ENV_PEAK] = self.saved_peak

    def run_report(self, *args):
        out = os.path.join(self.dir, "report.json")
        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = gpu_report.main(list(args) + ["--json", out])
        self.assertEqual(rc, 0)
        with open(out) as f:
            return json.load(f), buf.getvalue()

    def test_ours_against_torch(self):
        fpt = 855383040.0
        tokens = 16 * 1024
        ours = os.path.join(self.dir, "dp.jsonl")
        torch = os.path.join(self.dir, "torch.jsonl")
        # Warmup steps (the first 5) are slow and must not count: the medians are
        # 40 ms (ours) and 50 ms (PyTorch), exact in binary.
        write_log(ours, [900, 300, 80, 70, 60, 40, 40, 41, 39, 40], tokens,
                  {"stage": "dp", "model": "gpt2", "precision": "bf16", "compute": "bf16", "ranks": 1, "batch": 16,
                   "params": 163109376, "flops_per_token": fpt,
                   "memory": [{"rank": 0, "device": {"peak_total": 3 << 30, "model_states": 16 * 163109376}}]})
        write_log(torch, [2000, 60, 55, 52, 51, 50, 50, 49, 51, 50], tokens,
                  {"impl": "pytorch", "model": "gpt2", "precision": "bf16", "ranks": 1, "batch": 16,
                   "flops_per_token": fpt, "peak_memory_bytes": 5 << 30})
        data, text = self.run_report("--gpu", "NVIDIA H200", "--warmup", "5", "--ours", ours, "--torch", torch)
        o, t = data["ours"], data["torch"]
        self.assertEqual(o["ms"], 40.0)
        self.assertEqual(t["ms"], 50.0)
        # tokens per step is recovered from the log's own ms and tokens_per_s (rounded to an integer).
        self.assertAlmostEqual(o["tokens_per_s"], tokens / 0.040, delta=1e-6)
        self.assertAlmostEqual(data["ratio"], 1.25, delta=1e-12)
        self.assertTrue(data["ratio_met"])
        # The same product and quotients in another order: equal to a few ulps of 0.35.
        self.assertAlmostEqual(o["mfu"], fpt * tokens / 0.040 / 989.4e12, delta=1e-12)
        self.assertFalse(data["mfu_met"])  # 855383040 * 409600 / 989.4e12 = 0.354 < 0.40
        self.assertEqual(o["peak_device_bytes"], 3 << 30)
        self.assertEqual(t["peak_device_bytes"], 5 << 30)
        self.assertEqual((o["loss_first"], o["loss_last"]), (10.0, 1.0))
        self.assertIn("gpt2 bf16 (compute bf16), 1 rank, B=16", text)
        self.assertIn("1.25x", text)
        self.assertNotIn("NOT the same model", text)

    def test_second_table_for_flash_attention(self):
        fpt, tokens = 855383040.0, 16 * 1024
        cfg = {"stage": "dp", "model": "gpt2", "precision": "bf16", "compute": "bf16", "ranks": 1, "batch": 16,
               "params": 163109376, "flops_per_token": fpt, "memory": []}
        paths = {n: os.path.join(self.dir, n + ".jsonl") for n in ("dp", "flash", "torch")}
        write_log(paths["dp"], [900, 60, 60, 60], tokens, cfg)
        write_log(paths["flash"], [900, 25, 25, 25], tokens, cfg)
        write_log(paths["torch"], [900, 50, 50, 50], tokens, dict(cfg, impl="pytorch"))
        data, text = self.run_report("--gpu", "NVIDIA H200", "--warmup", "1", "--ours", paths["dp"],
                                     "--torch", paths["torch"], "--ours-flash", paths["flash"])
        self.assertEqual(data["ours_flash"]["ms"], 25.0)
        self.assertAlmostEqual(data["flash_ratio"], 2.0, delta=1e-12)
        self.assertTrue(data["flash_ratio_met"])
        self.assertFalse(data["ratio_met"])  # 50 / 60 < 1: the simple run's own verdict stands
        self.assertIn("zero-to-fsdp dp (--attention flash)", text)
        self.assertEqual(text.count("PyTorch eager"), 2)

    def test_missing_and_cut_short_logs(self):
        torch = os.path.join(self.dir, "torch.jsonl")
        write_log(torch, [100, 10, 10], 1024, None)  # crashed before its summary
        data, text = self.run_report("--gpu", "Tesla T4", "--warmup", "1",
                                     "--ours", os.path.join(self.dir, "absent.jsonl"), "--torch", torch)
        self.assertIn("no run log", data["ours"]["error"])
        self.assertIn("stopped after 3 steps", data["torch"]["error"])
        self.assertIsNone(data["ratio"])
        self.assertIsNone(data["ratio_met"])
        self.assertIsNone(data["peak_flops"])  # unknown card: no MFU, and the table says why
        self.assertIn("unknown card", text)

    def test_stage_rows(self):
        P = 1000
        log = os.path.join(self.dir, "zero2.4.jsonl")
        # zero2 with 4 ranks, bf16: SPEC gives 2 + 14/4 = 5.5 P per rank. Rank 2 holds
        # the padding (5.6 P) and the largest peak: the table reports the largest.
        mem = [{"rank": r, "device": {"peak_total": (7 if r == 2 else 6) << 20,
                                      "model_states": 5600 if r == 2 else 5500}} for r in range(4)]
        write_log(log, [500, 200, 30, 20, 30, 25], 4 * 4 * 1024,
                  {"stage": "zero2", "ranks": 4, "precision": "bf16", "params": P, "memory": mem})
        data, text = self.run_report("--stage-warmup", "2", "--stage", log,
                                     "--stage", os.path.join(self.dir, "zero3.4.jsonl"))
        row, missing = data["stages"]
        self.assertEqual(row["ms"], 27.5)  # median of 30, 20, 30, 25
        self.assertEqual(row["peak_device_bytes_per_rank"], 7 << 20)
        self.assertAlmostEqual(row["model_states_per_P"], 5.6, delta=1e-12)
        self.assertEqual(row["spec_model_states_per_P"], 5.5)
        self.assertIn("error", missing)
        self.assertIn("no summary in its log", text)

    def test_modeled_against_measured(self):
        measured = os.path.join(self.dir, "zero3.1.jsonl")
        write_log(measured, [900, 300, 40, 50, 60], 4 * 1024, {"stage": "zero3", "ranks": 1, "precision": "bf16"})
        modeled = os.path.join(self.dir, "zero3.1.modeled.jsonl")
        write_log(modeled, [25.0, 25.0, 25.0], 4 * 1024,
                  {"stage": "zero3", "ranks": 1, "clock": "modeled", "clock_detail": "modeled on H200 x1"})
        data, text = self.run_report("--stage-warmup", "2", "--stage", measured, "--modeled", modeled,
                                     "--modeled", os.path.join(self.dir, "dp.1.modeled.jsonl"))
        row, missing = data["modeled"]
        self.assertEqual((row["measured_ms"], row["modeled_ms"]), (50, 25.0))  # median of 40, 50, 60
        self.assertEqual(row["modeled_over_measured"], 0.5)
        self.assertIn("error", missing)
        self.assertIn("modeled on H200 x1", text)

    def test_spec_formulas(self):
        # docs/SPEC.md's memory table at N = 4.
        expect = {("dp", "bf16"): 16, ("zero1", "bf16"): 7, ("zero2", "bf16"): 5.5, ("zero3", "bf16"): 4,
                  ("dp", "fp32"): 16, ("zero1", "fp32"): 10, ("zero2", "fp32"): 7, ("zero3", "fp32"): 4}
        for (stage, prec), v in expect.items():
            self.assertEqual(gpu_report.spec_model_states(stage, prec, 4), v, (stage, prec))
        self.assertIsNone(gpu_report.spec_model_states("offload", "bf16", 4))


class CommTableTest(unittest.TestCase):
    """run_bench.py's reading of bench_comm's tables (a made-up output in its layout)."""

    TEXT = """# threads backend, float32, sum.

# all_gather, 2 ranks (sync: 50.0 us)
      size   count(f32)   time(us)  algbw(GB/s)  busbw(GB/s) memcpy(GB/s) bus/memcpy  bytes(us)   rest(us)
  1.00 MiB       262144      100.0        10.49         5.24        20.00       0.26       30.0       20.0

# all_gather in place, 2 ranks (sync: 50.0 us)
      size   count(f32)   time(us)  algbw(GB/s)  busbw(GB/s) memcpy(GB/s) bus/memcpy  bytes(us)   rest(us)
  1.00 MiB       262144       80.0        13.11         6.55        20.00       0.33       20.0       10.0
  4.00 MiB      1048576      200.0        20.97        10.49        20.00       0.52      140.0       10.0
"""

    def test_tables_kept_apart(self):
        import run_bench
        t = run_bench.parse_comm(self.TEXT)
        self.assertEqual(sorted(t), [("all_gather", 2), ("all_gather in place", 2)])
        self.assertEqual(t[("all_gather", 2)][1 << 20]["time(us)"], 100.0)
        self.assertEqual(t[("all_gather in place", 2)][1 << 20]["time(us)"], 80.0)
        self.assertEqual(sorted(t[("all_gather in place", 2)]), [1 << 20, 4 << 20])

    def test_where_the_time_went(self):
        import run_bench
        row = run_bench.parse_comm(self.TEXT)[("all_gather in place", 2)][1 << 20]
        why = run_bench.comm_why("all_gather in place", 2, 1 << 20, row)
        # 80 us = 20 moving + (80 - 20 - 10) = 50 synchronising + 10 rest.
        self.assertIn("80 us = 20 us moving the bytes", why)
        self.assertIn("+ 50 us synchronising", why)
        self.assertIn("+ 10 us rest", why)
        self.assertIn("at 1 MiB", why)
        # bus/memcpy 0.33 at 80 us: 0.33 * 80 / 20 = 1.32 with the bytes alone.
        self.assertIn("would give 1.32x memcpy", why)
        row = dict(row, **{"rest(us)": -5.0})
        self.assertIn("+ 65 us synchronising (the same collective with one element a rank) - 5 us",
                      run_bench.comm_why("all_gather in place", 2, 1 << 20, row))


if __name__ == "__main__":
    sys.exit(gtest_xml.main(__name__, "bench_py", "test_bench.py [--xml FILE]"))
