// test_kernels_cuda_matmul.cpp: the cuBLAS users, matmul (a Linear layer)
// and causal self-attention, against their CPU twins, in float32, bf16 and TF32.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Matmul*:*Attention*'
//
// How the comparisons and their tolerances work: kernels_cuda_test_util.h.
// Without a CUDA device every test here is skipped, with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "flash/attention_ref.h"  // attention_grad_magnitudes
#include "cuda/kernels_cuda_test_util.h"
#include "kernels.h"

namespace {

using namespace zf::test;

// ---------------------------------------------------------------------------
// Matmul

// Per element, sum |terms| of each product (the CPU kernels run on |values|):
// the magnitude the float32 bound is relative to.
template <class F>
void check_matmul(zf::CudaContext& ctx, int N, int IC, int OC, bool with_bias, bool tf32 = false) {
  std::mt19937 rng = make_rng(303 + N + IC + OC);
  const vf inp = uniform<F>(rng, size_t(N) * IC), w = uniform<F>(rng, size_t(OC) * IC);
  const vf bias = uniform<F>(rng, OC);
  const float* bp = with_bias ? bias.data() : nullptr;
  // float32: 2 K u32 of sum |terms|; TF32 adds kUTf32 of it per product.
  // bf16: the products of bf16 inputs are exact in float32, the sum is float32,
  // and the result is rounded once (u16 of |result|).
  auto bound = [&](int K) { return 2.0 * (K + 2) * kU32 + (tf32 ? kUTf32 : 0.0); };
  ctx.set_tf32(tf32);

  vf out(size_t(N) * OC), mag(out.size());
  zf::matmul_forward(out.data(), inp.data(), w.data(), bp, N, IC, OC);
  const vf abs_bias = abs_of(bias);
  zf::matmul_forward(mag.data(), abs_of(inp).data(), abs_of(w).data(),
                     with_bias ? abs_bias.data() : nullptr, N, IC, OC);
  auto d_inp = to_device<F>(inp), d_w = to_device<F>(w), d_bias = to_device<F>(bias);
  auto d_out = poisoned<F>(out.size());
  zf::matmul_forward_cuda(ctx, d_out->get(), d_inp->get(), d_w->get(),
                          with_bias ? d_bias->get() : nullptr, N, IC, OC);
  EXPECT_TRUE(close("matmul out", to_host(*d_out), out, [&](size_t i) {
    return bound(IC) * mag[i] + kStoreU<F> * std::abs(out[i]);
  }));

  // Backward: dinp sums over OC, dweight over N, dbias over N.
  const vf dout = uniform<F>(rng, out.size());
  const vf dinp0 = uniform<F>(rng, inp.size()), dw0 = uniform<F>(rng, w.size());
  const vf db0 = uniform<F>(rng, OC);
  vf dinp = dinp0, dw = dw0, db = db0;
  zf::matmul_backward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                      inp.data(), w.data(), N, IC, OC);
  vf mag_dinp = abs_of(dinp0), mag_dw = abs_of(dw0), mag_db = abs_of(db0);
  zf::matmul_backward(mag_dinp.data(), mag_dw.data(), mag_db.data(), abs_of(dout).data(),
                      abs_of(inp).data(), abs_of(w).data(), N, IC, OC);
  auto d_dout = to_device<F>(dout);
  auto d_dinp = to_device<F>(dinp0), d_dw = to_device<F>(dw0), d_db = to_device<F>(db0);
  zf::matmul_backward_cuda(ctx, d_dinp->get(), d_dw->get(), with_bias ? d_db->get() : nullptr,
                           d_dout->get(), d_inp->get(), d_w->get(), N, IC, OC);
  EXPECT_TRUE(close("matmul dinp", to_host(*d_dinp), dinp, [&](size_t i) {
    return bound(OC) * mag_dinp[i] + kStoreU<F> * std::abs(dinp[i]);
  }));
  EXPECT_TRUE(close("matmul dweight", to_host(*d_dw), dw, [&](size_t i) {
    return bound(N) * mag_dw[i] + kStoreU<F> * std::abs(dw[i]);
  }));
  // dbias: no TF32 (a plain float32 column sum in our own kernel).
  EXPECT_TRUE(close("matmul dbias", to_host(*d_db), db, [&](size_t i) {
    return 2.0 * (N + 2) * kU32 * mag_db[i] + kStoreU<F> * std::abs(db[i]);
  }));
  ctx.set_tf32(false);
}

TEST_F(CudaKernels, MatmulF32) {
  check_matmul<float>(ctx(), 7, 5, 11, true);      // odd shapes, below any tile
  check_matmul<float>(ctx(), 96, 77, 130, false);  // no bias: out is never read (beta = 0)
  check_matmul<float>(ctx(), 256, 256, 768, true);
}
TEST_F(CudaKernels, MatmulBf16) {
  check_matmul<nvbf>(ctx(), 7, 5, 11, true);
  check_matmul<nvbf>(ctx(), 96, 77, 130, false);
  check_matmul<nvbf>(ctx(), 256, 256, 768, true);
}
TEST_F(CudaKernels, MatmulTf32WhenAskedFor) { check_matmul<float>(ctx(), 256, 256, 768, true, true); }

// IC = 0, a Linear with no inputs: no model has one, but the op is plain.
// out = bias (or 0 without one), and the backward still adds dout's column
// sums to dbias (dinp and dweight have no elements). Both are easy to get
// wrong: a forward that passes cuBLAS a leading dimension of 0 fails
// (CUBLAS_STATUS_INVALID_VALUE), a backward that returns early skips dbias.
// The CPU twin's sgemm rejects IC = 0 too, so the expected values are written
// out here: out exactly (copies of bias, or zeros), dbias within the
// column-sum bound of check_matmul (2 (N + 2) u32 of sum |terms|, + u16).
template <class F>
void check_matmul_no_inputs(zf::CudaContext& ctx, int N, int OC) {
  std::mt19937 rng = make_rng(313);
  const vf bias = uniform<F>(rng, OC), dout = uniform<F>(rng, size_t(N) * OC);
  const vf db0 = uniform<F>(rng, OC);
  DeviceBuffer<F> empty(0);  // inp, weight, dinp, dweight: no elements
  auto d_bias = to_device<F>(bias), d_dout = to_device<F>(dout), d_db = to_device<F>(db0);

  vf with_bias(size_t(N) * OC);
  for (size_t i = 0; i < with_bias.size(); ++i) with_bias[i] = bias[i % OC];
  auto d_out = poisoned<F>(with_bias.size());
  zf::matmul_forward_cuda(ctx, d_out->get(), empty.get(), empty.get(), d_bias->get(), N, 0, OC);
  EXPECT_TRUE(exact("matmul IC=0 out, bias", to_host(*d_out), with_bias));
  d_out->poison();
  zf::matmul_forward_cuda<F>(ctx, d_out->get(), empty.get(), empty.get(), nullptr, N, 0, OC);
  EXPECT_TRUE(exact("matmul IC=0 out, no bias", to_host(*d_out), vf(with_bias.size(), 0.0f)));

  vf db = db0, mag = abs_of(db0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      db[o] += dout[size_t(n) * OC + o];
      mag[o] += std::abs(dout[size_t(n) * OC + o]);
    }
  zf::matmul_backward_cuda(ctx, empty.get(), empty.get(), d_db->get(), d_dout->get(), empty.get(),
                           empty.get(), N, 0, OC);
  EXPECT_TRUE(close("matmul IC=0 dbias", to_host(*d_db), db, [&](size_t i) {
    return 2.0 * (N + 2) * kU32 * mag[i] + kStoreU<F> * std::abs(db[i]);
  }));
}

TEST_F(CudaKernels, MatmulWithNoInputChannels) {
  check_matmul_no_inputs<float>(ctx(), 70, 40);  // two slices of rows, columns over one tile
  check_matmul_no_inputs<nvbf>(ctx(), 70, 40);
}

// dbias over many rows: gpt2's N = 8192 at the widest bias, c_fc's OC = 3072
// (64 slices of 128 rows, 96 tiles of columns), and N = 5000, OC = 50 (uneven
// slices, a partial tile), against the exact column sums in double within
// the depth of the GPU's summation tree (column_sum_depth; why not the CPU
// comparison's bound: kernels_cuda_test_util.h). IC = 0 leaves dbias the
// only output (the dbias kernel does not depend on IC). Every dout is
// positive here, so each sum is as large as its sum of |terms|: a lost
// slice is far out of bounds, and in float32 so is a lost row.
template <class F>
void check_bias_grad(zf::CudaContext& ctx, int N, int OC) {
  SCOPED_TRACE("N " + std::to_string(N) + " OC " + std::to_string(OC));
  std::mt19937 rng = make_rng(323 + N);
  const vf dout = uniform<F>(rng, size_t(N) * OC, 0.25f, 1.0f), db0 = uniform<F>(rng, OC);
  std::vector<double> db(db0.begin(), db0.end()), mag(OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      db[o] += dout[size_t(n) * OC + o];
      mag[o] += dout[size_t(n) * OC + o];
    }
  DeviceBuffer<F> empty(0);
  auto d_dout = to_device<F>(dout), d_db = to_device<F>(db0);
  zf::matmul_backward_cuda(ctx, empty.get(), empty.get(), d_db->get(), d_dout->get(), empty.get(),
                           empty.get(), N, 0, OC);
  const double depth = column_sum_depth(N);
  EXPECT_TRUE(close("matmul dbias, many rows", to_host(*d_db), vf(db.begin(), db.end()),
                    [&](size_t i) {
                      const double t32 = depth * kU32 * (mag[i] + std::abs(db0[i]));
                      return t32 + kStoreU<F> * (std::abs(db[i]) + t32);
                    }));
}

TEST_F(CudaKernels, MatmulBiasGradOverManyRows) {
  check_bias_grad<float>(ctx(), 8192, 3072);
  check_bias_grad<float>(ctx(), 5000, 50);
  check_bias_grad<nvbf>(ctx(), 8192, 3072);
  check_bias_grad<nvbf>(ctx(), 5000, 50);
}

// ---------------------------------------------------------------------------
// Attention

template <class F>
void check_attention(zf::CudaContext& ctx, int B, int T, int C, int H) {
  std::mt19937 rng = make_rng(404 + T);
  const int hs = C / H;
  const vf qkv = uniform<F>(rng, size_t(B) * T * 3 * C);
  vf out(size_t(B) * T * C), att(size_t(B) * H * T * T);
  zf::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  auto d_qkv = to_device<F>(qkv);
  auto d_out = poisoned<F>(out.size()), d_att = poisoned<F>(att.size());
  DeviceBuffer<float> scratch(zf::attention_scratch_floats_cuda(T, H));
  scratch.poison();
  zf::attention_forward_cuda(ctx, d_out->get(), d_att->get(), scratch.get(), d_qkv->get(), B, T, C,
                             H);
  // float32: a score is a sum of hs products (|score| <= sqrt(hs) here, as
  // |q|, |k| <= 1), off by 2 hs u32 sqrt(hs); softmax turns an absolute score
  // error e into a relative probability error of at most 2 e, and adds its
  // own sum over T (2 T u32). out sums T products att * v, sum att = 1, so
  // its error is the probabilities' error times max|v| plus 2 T u32 max|v|.
  // bf16: probabilities are stored as bf16 (u16 each, relative), and out is
  // rounded once more: 2 u16 max|v|.
  const double e = 2.0 * (2 * hs * std::sqrt(double(hs)) + T + 8) * kU32;
  const double vmax = max_abs(qkv);
  EXPECT_TRUE(close("attention att", to_host(*d_att), att, [&](size_t i) {
    return 2 * e * att[i] + e * 1e-3 + kStoreU<F> * att[i];
  }));
  EXPECT_TRUE(close("attention out", to_host(*d_out), out,
                    [&](size_t) { return 4 * e * vmax + 2 * kStoreU<F> * vmax; }));

  // Backward, both sides from the same att (the CPU's, as bf16 if F is).
  // Each gradient element is a sum whose terms' magnitudes add up to mag
  // (attention_grad_magnitudes); the float32 chain datt -> dpre -> dq/dk sums
  // over hs, then T, then T terms: 2 (T + hs) u32 each, 8 (T + hs + 8) u32 of
  // mag allowed, and as much of the largest gradient gmax (the softmax
  // backward's subtraction can cancel). bf16: dpre is stored as bf16 before
  // the dq/dk products (u16 of mag) and each gradient is rounded once when
  // added to g0 (u16 of the element).
  const vf att_in = representable<F>(att);
  const vf dout = uniform<F>(rng, out.size());
  const vf dqkv0 = uniform<F>(rng, qkv.size());
  vf dqkv = dqkv0;
  std::vector<float> cpu_scratch(zf::attention_scratch_floats(T));
  zf::attention_backward(dqkv.data(), cpu_scratch.data(), dout.data(), qkv.data(), att_in.data(),
                         B, T, C, H);
  vf delta(dqkv.size());
  for (size_t i = 0; i < dqkv.size(); ++i) delta[i] = dqkv[i] - dqkv0[i];
  const double gmax = max_abs(delta);
  const vf mag = attention_grad_magnitudes(qkv, att_in, dout, B, T, C, H);
  auto d_att_in = to_device<F>(att_in), d_dout = to_device<F>(dout);
  auto d_dqkv = to_device<F>(dqkv0);
  scratch.poison();
  zf::attention_backward_cuda(ctx, d_dqkv->get(), scratch.get(), d_dout->get(), d_qkv->get(),
                              d_att_in->get(), B, T, C, H);
  EXPECT_TRUE(close("attention dqkv", to_host(*d_dqkv), dqkv, [&](size_t i) {
    return 8.0 * (T + hs + 8) * kU32 * (mag[i] + gmax) + 2 * kU32 * std::abs(dqkv0[i]) +
           kStoreU<F> * (mag[i] + std::abs(dqkv[i]));
  }));
}

TEST_F(CudaKernels, AttentionF32) {
  check_attention<float>(ctx(), 2, 13, 12, 3);   // hs = 4, T below a warp
  check_attention<float>(ctx(), 2, 37, 24, 2);   // T over a warp: lanes loop
  check_attention<float>(ctx(), 2, 128, 128, 4);
}
TEST_F(CudaKernels, AttentionBf16) {
  check_attention<nvbf>(ctx(), 2, 13, 12, 3);
  check_attention<nvbf>(ctx(), 2, 37, 24, 2);
  check_attention<nvbf>(ctx(), 2, 128, 128, 4);
}

}  // namespace
