// test_kernels_cuda_flash.cpp: the flash-style attention kernels
// (kernels_cuda_flash.cu) against the CPU reference (attention_forward /
// attention_backward of kernels_cpu.cpp) and a double log-sum-exp, in float32
// and bf16; the tails (T = 1, 33, 100, 130: partial tiles and blocks); head
// sizes padded to each HS (32, 64, 128); two runs giving the same bits; and
// the same for the tensor-core form (kernels_cuda_flash_tc.cu, bf16).
//
//   build/tests/test_gpu_kernels --gtest_filter='*Flash*'
//
// How the comparisons and their tolerances work: kernels_cuda_test_util.h.
// The same per-thread code runs on the CPU in tests/flash/test_flash_attention.cpp,
// which checks the logic; this file checks the GPU runs it as that harness does.
// Without a CUDA device every test here is skipped, with the reason (except
// the head-size limit, which fails before touching the device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "check.h"
#include "flash/attention_ref.h"
#include "cuda/kernels_cuda_test_util.h"
#include "kernels.h"

namespace {

using namespace zf::test;

// What one GPU run gives: out, lse, and dqkv after adding into g0.
template <class F>
struct FlashRun {
  vf out, lse, dqkv;
};

// The two flash forms: CUDA cores (float32 or bf16), tensor cores (bf16 only).
enum class Form { cuda_cores, tensor_cores };

template <class F>
FlashRun<F> run_flash(zf::CudaContext& ctx, const vf& qkv, const vf& dout, const vf& dqkv0, int B,
                      int T, int C, int H, Form form = Form::cuda_cores) {
  auto d_qkv = to_device<F>(qkv), d_dout = to_device<F>(dout), d_dqkv = to_device<F>(dqkv0);
  auto d_out = poisoned<F>(size_t(B) * T * C);
  auto d_lse = poisoned<float>(size_t(B) * H * T);
  auto scratch = poisoned<float>(zf::flash_attention_scratch_floats(B, T, H));
  if constexpr (std::is_same_v<F, nvbf>) {
    if (form == Form::tensor_cores) {
      zf::flash_attention_tc_forward_cuda(d_out->get(), d_lse->get(), d_qkv->get(), B, T, C, H,
                                          ctx.stream());
      zf::flash_attention_tc_backward_cuda(d_dqkv->get(), scratch->get(), d_dout->get(), d_out->get(),
                                           d_qkv->get(), d_lse->get(), B, T, C, H, ctx.stream());
      return {to_host(*d_out), to_host(*d_lse), to_host(*d_dqkv)};
    }
  }
  zf::flash_attention_forward_cuda(d_out->get(), d_lse->get(), d_qkv->get(), B, T, C, H,
                                   ctx.stream());
  zf::flash_attention_backward_cuda(d_dqkv->get(), scratch->get(), d_dout->get(), d_out->get(),
                                    d_qkv->get(), d_lse->get(), B, T, C, H, ctx.stream());
  return {to_host(*d_out), to_host(*d_lse), to_host(*d_dqkv)};
}

// Tolerances, inputs in [-1, 1] (u32 = 2^-24, u16 = 2^-8):
// - out: as the simple form's test (test_kernels_cuda_matmul.cpp): a score
//   sums hs products (|score| <= sqrt(hs)), off by 2 hs sqrt(hs) u32; softmax
//   doubles that as a relative error of each probability and adds its sum
//   over T; out sums T terms p v with sum p = 1: e = 2 (2 hs sqrt(hs) + T + 8)
//   u32, out within 4 e max|v|. bf16: the inputs are exact in float32 and
//   out is rounded once when stored: + u16 |out|.
// - lse: float32 in both precisions, within 2 e + 2 u32 |lse| of the double value.
// - dqkv: the simple form's backward bound, 8 (T + hs + 8) u32 of (the
//   magnitude of the element's terms + the largest gradient) + 2 u32 |g0|;
//   bf16 adds u16 |result| (rounded once when added to g0) and the effect of
//   D_i = dout_i . out_i computed from the bf16-rounded out: D_i is then off
//   by u16 sum_d |dout_id out_id| =: dD_i, so ds_ij by p_ij dD_i, dq_i by
//   scale sum_j p_ij dD_i |k_j| and dk_j by scale sum_i p_ij dD_i |q_i|
//   (attention_delta_magnitudes, in double).
// - Tensor cores add the roundings of FlashAttention-2 (bound derived in
//   tests/flash/test_flash_attention_tc.cpp, which runs the same programs on
//   the CPU): P rounded to bf16 before P V, and l summing those rounded p,
//   so out moves by 2 u16 max|v| and lse by u16; P^T and dS rounded before
//   the gradient products, u16 of each term: u16 mag. Each doubled for the
//   float32 work around it (the tile products' order is the hardware's), and
//   the stored gradient's rounding too (2 u16 |result| in all, as the CPU
//   harness bounds it: one rounding takes up to ~u16 |result| by itself, so
//   a value just above a power of two leaves no room for the rest).
template <class F>
void check_flash(zf::CudaContext& ctx, int B, int T, int C, int H, Form form = Form::cuda_cores) {
  SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
               " H=" + std::to_string(H));
  std::mt19937 rng = make_rng(505 + T + C);
  const int hs = C / H, C3 = 3 * C;
  const vf qkv = uniform<F>(rng, size_t(B) * T * C3), dout = uniform<F>(rng, size_t(B) * T * C);
  const vf dqkv0 = uniform<F>(rng, qkv.size());
  const FlashRun<F> got = run_flash<F>(ctx, qkv, dout, dqkv0, B, T, C, H, form);
  const double tc = form == Form::tensor_cores ? kU16 : 0.0;  // the roundings of P and dS

  vf out(size_t(B) * T * C), att(size_t(B) * H * T * T);
  zf::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  const double e = 2.0 * (2 * hs * std::sqrt(double(hs)) + T + 8) * kU32;
  EXPECT_TRUE(close("flash out", got.out, out,
                    [&](size_t i) { return 4 * e + kStoreU<F> * std::abs(out[i]) + 4 * tc; }));
  const std::vector<double> lse_d = attention_lse(qkv, B, T, C, H);
  const vf lse(lse_d.begin(), lse_d.end());
  EXPECT_TRUE(close("flash lse", got.lse, lse,
                    [&](size_t i) { return 2 * e + 2 * kU32 * std::abs(lse_d[i]) + 2 * tc; }));

  vf dqkv = dqkv0, scratch(zf::attention_scratch_floats(T));
  zf::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                         H);
  double gmax = 0;
  for (size_t i = 0; i < dqkv.size(); ++i) gmax = std::max(gmax, std::abs(double(dqkv[i]) - dqkv0[i]));
  const vf mag = attention_grad_magnitudes(qkv, att, dout, B, T, C, H);
  // the bf16 out's effect through D (see above)
  const vf dmag = kIsBf16<F> ? attention_delta_magnitudes(qkv, att, dout, out, B, T, C, H, kU16)
                             : vf(qkv.size(), 0.0f);
  EXPECT_TRUE(close("flash dqkv", got.dqkv, dqkv, [&](size_t i) {
    return 8.0 * (T + hs + 8) * kU32 * (mag[i] + gmax) + 2 * kU32 * std::abs(dqkv0[i]) +
           kStoreU<F> * std::abs(dqkv[i]) + 2 * dmag[i] + tc * (2 * mag[i] + std::abs(dqkv[i]));
  }));
}

TEST_F(CudaKernels, FlashAttentionF32) {
  check_flash<float>(ctx(), 2, 1, 8, 2);      // one position; hs 4 -> HS 32
  check_flash<float>(ctx(), 2, 33, 48, 3);    // one key tile and a bit; hs 16
  check_flash<float>(ctx(), 2, 100, 128, 2);  // two row blocks, the last partial; hs 64
  check_flash<float>(ctx(), 1, 130, 200, 2);  // hs 100 -> HS 128
  check_flash<float>(ctx(), 1, 256, 768, 12); // GPT-2's heads
}
TEST_F(CudaKernels, FlashAttentionBf16) {
  check_flash<nvbf>(ctx(), 2, 1, 8, 2);
  check_flash<nvbf>(ctx(), 2, 33, 48, 3);
  check_flash<nvbf>(ctx(), 2, 100, 128, 2);
  check_flash<nvbf>(ctx(), 1, 130, 200, 2);
  check_flash<nvbf>(ctx(), 1, 256, 768, 12);
}

// The tensor-core form, bf16 only: the same shapes, then GPT-2's and T = 1024.
TEST_F(CudaKernels, FlashTcBf16) {
  const Form tc = Form::tensor_cores;
  check_flash<nvbf>(ctx(), 2, 1, 8, 2, tc);
  check_flash<nvbf>(ctx(), 2, 33, 48, 3, tc);
  check_flash<nvbf>(ctx(), 2, 100, 128, 2, tc);
  check_flash<nvbf>(ctx(), 1, 130, 200, 2, tc);
}

TEST_F(CudaKernels, FlashTcBf16AtGpt2Shapes) {
  const Form tc = Form::tensor_cores;
  check_flash<nvbf>(ctx(), 1, 256, 768, 12, tc);
  check_flash<nvbf>(ctx(), 1, 1024, 128, 2, tc);  // hs 64, 16 tiles
}

// No atomics and fixed orders: a second run gives the same bits (both forms).
TEST_F(CudaKernels, FlashAttentionIsDeterministic) {
  const int B = 2, T = 200, C = 256, H = 4;
  std::mt19937 rng = make_rng(606);
  const vf qkv = uniform<nvbf>(rng, size_t(B) * T * 3 * C), dout = uniform<nvbf>(rng, size_t(B) * T * C);
  const vf dqkv0 = uniform<nvbf>(rng, qkv.size());
  const FlashRun<nvbf> a = run_flash<nvbf>(ctx(), qkv, dout, dqkv0, B, T, C, H);
  const FlashRun<nvbf> b = run_flash<nvbf>(ctx(), qkv, dout, dqkv0, B, T, C, H);
  EXPECT_TRUE(exact("flash out, run 2", b.out, a.out));
  EXPECT_TRUE(exact("flash lse, run 2", b.lse, a.lse));
  EXPECT_TRUE(exact("flash dqkv, run 2", b.dqkv, a.dqkv));
  const FlashRun<nvbf> c = run_flash<nvbf>(ctx(), qkv, dout, dqkv0, B, T, C, H, Form::tensor_cores);
  const FlashRun<nvbf> d = run_flash<nvbf>(ctx(), qkv, dout, dqkv0, B, T, C, H, Form::tensor_cores);
  EXPECT_TRUE(exact("flash tc out, run 2", d.out, c.out));
  EXPECT_TRUE(exact("flash tc lse, run 2", d.lse, c.lse));
  EXPECT_TRUE(exact("flash tc dqkv, run 2", d.dqkv, c.dqkv));
}

// A head size over the kernels' maximum is refused with a clear error before
// anything is launched (so this runs without a GPU too).
TEST(FlashAttentionLimits, HeadSizeOver128IsAClearError) {
  try {
    zf::flash_attention_forward_cuda<float>(nullptr, nullptr, nullptr, 1, 4, 2 * 129, 2, nullptr);
    FAIL() << "hs = 129 was accepted";
  } catch (const zf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("maximum of 128"), std::string::npos) << e.what();
  }
  EXPECT_THROW(zf::flash_attention_forward_cuda<float>(nullptr, nullptr, nullptr, 1, 4, 10, 3,
                                                       nullptr),
               zf::Error)
      << "C % H != 0";
}

}  // namespace
