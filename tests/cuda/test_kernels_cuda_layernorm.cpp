// test_kernels_cuda_layernorm.cpp: the LayerNorm CUDA kernels (forward,
// backward) against their CPU twins.
//
//   build/tests/test_gpu_kernels --gtest_filter='*LayerNorm*'
//
// How the comparisons and their tolerances work: kernels_cuda_test_util.h.
// Without a CUDA device every test here is skipped, with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/kernels_cuda_test_util.h"
#include "kernels.h"

namespace {

using namespace zf::test;

// ---------------------------------------------------------------------------
// LayerNorm

template <class F>
void check_layernorm(zf::CudaContext& ctx, int N, int C) {
  std::mt19937 rng = make_rng(202);
  // Rows with a mean away from 0, so the centring matters.
  const vf inp = uniform<F>(rng, size_t(N) * C, -0.5f, 1.5f);
  const vf w = uniform<F>(rng, C, 0.5f, 1.5f), b = uniform<F>(rng, C);
  vf out(inp.size()), mean(N), rstd(N);
  zf::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  auto d_inp = to_device<F>(inp), d_w = to_device<F>(w), d_b = to_device<F>(b);
  auto d_out = poisoned<F>(out.size());
  auto d_mean = poisoned<float>(N), d_rstd = poisoned<float>(N);
  zf::layernorm_forward_cuda(d_out->get(), d_mean->get(), d_rstd->get(), d_inp->get(), d_w->get(),
                             d_b->get(), N, C, ctx.stream());
  // mean and rstd: float32 sums of C terms on both sides (the inputs are
  // equal), 2 C u32 each, a few more for the division and square root.
  const double k_stat = 2.0 * (C + 4) * kU32;
  EXPECT_TRUE(close("layernorm mean", to_host(*d_mean), mean,
                    [&](size_t) { return k_stat * 1.5; }));  // |x| <= 1.5
  EXPECT_TRUE(close("layernorm rstd", to_host(*d_rstd), rstd,
                    [&](size_t i) { return 2 * k_stat * rstd[i]; }));
  // out = xhat * w + b with xhat carrying the statistics' relative error:
  // k_stat (|xhat| |w| + |b|) in float32, then one bf16 rounding.
  EXPECT_TRUE(close("layernorm out", to_host(*d_out), out, [&](size_t i) {
    const size_t n = i / C, c = i % C;
    const double xhat = std::abs((inp[i] - mean[n]) * rstd[n]);
    return 4 * k_stat * (xhat * std::abs(w[c]) + std::abs(b[c])) + kStoreU<F> * std::abs(out[i]);
  }));

  // Backward: dinp sums over C (2 C u32 of the row's terms |rstd| (|g| +
  // |mean g| + |xhat| |mean g xhat|), bounded by 3 |rstd| max|g| max(1, |xhat|));
  // dweight and dbias sum over N rows (2 N u32 of sum |dout| (|xhat| + 1)).
  const vf dout = uniform<F>(rng, out.size());
  const vf dinp0 = uniform<F>(rng, inp.size()), dw0 = uniform<F>(rng, C), db0 = uniform<F>(rng, C);
  vf dinp = dinp0, dw = dw0, db = db0;
  zf::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                         mean.data(), rstd.data(), N, C);
  auto d_dout = to_device<F>(dout);
  auto d_dinp = to_device<F>(dinp0), d_dw = to_device<F>(dw0), d_db = to_device<F>(db0);
  auto d_mean_in = to_device<float>(mean), d_rstd_in = to_device<float>(rstd);
  zf::layernorm_backward_cuda(ctx, d_dinp->get(), d_dw->get(), d_db->get(), d_dout->get(),
                              d_inp->get(), d_w->get(), d_mean_in->get(), d_rstd_in->get(), N, C);
  float max_xhat = 0;
  for (size_t i = 0; i < inp.size(); ++i)
    max_xhat = std::max(max_xhat, std::abs((inp[i] - mean[i / C]) * rstd[i / C]));
  const double gmax = max_abs(dout) * max_abs(w);
  EXPECT_TRUE(close("layernorm dinp", to_host(*d_dinp), dinp, [&](size_t i) {
    const double terms = 3 * rstd[i / C] * gmax * std::max(1.0f, max_xhat);
    return 2.0 * (C + 4) * kU32 * terms + 2 * kU32 * std::abs(dinp0[i]) +
           kStoreU<F> * std::abs(dinp[i]);
  }));
  const double col = double(N) * max_abs(dout) * (max_xhat + 1);
  auto col_tol = [N, col](const vf& want, const vf& g0) {
    return [N, col, want = &want, g0 = &g0](size_t i) {
      return 2.0 * (N + 2) * kU32 * (col + std::abs((*g0)[i])) +
             kStoreU<F> * std::abs((*want)[i]);
    };
  };
  EXPECT_TRUE(close("layernorm dweight", to_host(*d_dw), dw, col_tol(dw, dw0)));
  EXPECT_TRUE(close("layernorm dbias", to_host(*d_db), db, col_tol(db, db0)));
}

TEST_F(CudaKernels, LayerNormF32) {
  check_layernorm<float>(ctx(), 26, 12);
  check_layernorm<float>(ctx(), 256, 768);
}
TEST_F(CudaKernels, LayerNormBf16) {
  check_layernorm<nvbf>(ctx(), 26, 12);
  check_layernorm<nvbf>(ctx(), 256, 768);
}

// dweight and dbias over many rows (gpt2: N = 8192, C = 768, so 64 slices
// of 128 rows in the two-pass column sums), against the exact sums in
// double, within the depth of the GPU's summation tree (column_sum_depth):
// a lost or doubled slice, even a lost row, is far above that bound, where
// the CPU comparison's 2 N u32 of N max|term| would not see it. Each dweight
// term d ((x - mean) rstd) is itself rounded up to 3 times (3 more u32).
// bf16: the result is rounded once more when stored (u16 of it). N = 5000,
// C = 100: slices of uneven length (79 rows, the last 23) and a partial tile
// of columns.
template <class F>
void check_layernorm_param_grads(zf::CudaContext& ctx, int N, int C) {
  SCOPED_TRACE("N " + std::to_string(N) + " C " + std::to_string(C));
  std::mt19937 rng = make_rng(212 + N);
  const vf inp = uniform<F>(rng, size_t(N) * C, -0.5f, 1.5f), dout = uniform<F>(rng, inp.size());
  const vf w = uniform<F>(rng, C, 0.5f, 1.5f), b = uniform<F>(rng, C);
  const vf dw0 = uniform<F>(rng, C), db0 = uniform<F>(rng, C);
  vf out(inp.size()), mean(N), rstd(N);
  zf::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  // The exact sums, and the sums of |terms| the bound is relative to.
  std::vector<double> dw(dw0.begin(), dw0.end()), db(db0.begin(), db0.end());
  std::vector<double> mag_dw(C), mag_db(C);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      const size_t i = size_t(n) * C + c;
      const double xhat = (double(inp[i]) - mean[n]) * rstd[n];
      dw[c] += double(dout[i]) * xhat;
      db[c] += dout[i];
      mag_dw[c] += std::abs(double(dout[i]) * xhat);
      mag_db[c] += std::abs(double(dout[i]));
    }
  auto d_inp = to_device<F>(inp), d_dout = to_device<F>(dout), d_w = to_device<F>(w);
  auto d_mean = to_device<float>(mean), d_rstd = to_device<float>(rstd);
  auto d_dinp = to_device<F>(vf(inp.size(), 0.0f));
  auto d_dw = to_device<F>(dw0), d_db = to_device<F>(db0);
  zf::layernorm_backward_cuda(ctx, d_dinp->get(), d_dw->get(), d_db->get(), d_dout->get(),
                              d_inp->get(), d_w->get(), d_mean->get(), d_rstd->get(), N, C);
  const double depth = column_sum_depth(N);
  auto bound = [](const std::vector<double>& want, const std::vector<double>& mag, const vf& g0,
                  double d) {
    return [&want, &mag, &g0, d](size_t i) {
      const double t32 = d * kU32 * (mag[i] + std::abs(g0[i]));
      return t32 + kStoreU<F> * (std::abs(want[i]) + t32);
    };
  };
  EXPECT_TRUE(close("layernorm dweight, many rows", to_host(*d_dw), vf(dw.begin(), dw.end()),
                    bound(dw, mag_dw, dw0, depth + 3)));
  EXPECT_TRUE(close("layernorm dbias, many rows", to_host(*d_db), vf(db.begin(), db.end()),
                    bound(db, mag_db, db0, depth)));
}

TEST_F(CudaKernels, LayerNormParamGradsOverManyRows) {
  check_layernorm_param_grads<float>(ctx(), 8192, 768);
  check_layernorm_param_grads<float>(ctx(), 5000, 100);
  check_layernorm_param_grads<nvbf>(ctx(), 8192, 768);
  check_layernorm_param_grads<nvbf>(ctx(), 5000, 100);
}

}  // namespace
