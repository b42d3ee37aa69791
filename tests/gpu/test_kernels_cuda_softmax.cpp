// test_kernels_cuda_softmax.cpp: the fused softmax + cross-entropy CUDA
// kernels (forward, backward) against their CPU twins.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Softmax*'
//
// How the comparisons and their tolerances work: kernels_cuda_test_util.h.
// Without a CUDA device every test here is skipped, with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dtype.h"
#include "gpu/kernels_cuda_test_util.h"
#include "kernels.h"

namespace {

using namespace zf::test;

// ---------------------------------------------------------------------------
// Softmax + cross-entropy

template <class F>
void check_softmax_ce(zf::CudaContext& ctx, int N, int V) {
  std::mt19937 rng = make_rng(707 + V);
  const vf logits = uniform<F>(rng, size_t(N) * V, -8.0f, 8.0f);
  const auto targets = random_tokens(rng, N, V);
  vf probs(logits.size()), losses(N);
  zf::softmax_cross_entropy_forward(probs.data(), losses.data(), logits.data(), targets.data(), N,
                                    V);
  auto d_logits = to_device<F>(logits);
  auto d_targets = to_device(targets);
  auto d_probs = poisoned<F>(probs.size());
  auto d_losses = poisoned<float>(N);
  zf::softmax_cross_entropy_forward_cuda(d_probs->get(), d_losses->get(), d_logits->get(),
                                         d_targets->get(), N, V, ctx.stream());
  // The same max on both sides (exact), exps good to 2 ulp, a float32 sum of
  // V positive terms (2 V u32 relative): each probability within 2 (V + 8)
  // u32 relative, and bf16 rounds it once more. loss = log(sum) - (x_t - max):
  // absolute error 2 (V + 8) u32 plus a few ulps of its terms.
  const double e = 2.0 * (V + 8) * kU32;
  EXPECT_TRUE(close("softmax probs", to_host(*d_probs), probs, [&](size_t i) {
    return (e + kStoreU<F>) * probs[i] + 1e-37;
  }));
  EXPECT_TRUE(close("cross-entropy losses", to_host(*d_losses), losses,
                    [&](size_t i) { return e * (1 + std::abs(losses[i])) + 8 * kU32 * 16; }));

  // Backward from the same probs: one multiply-add per element (8 u32 of
  // |g0| + |p - 1| |dloss|), then one bf16 rounding.
  const vf probs_in = representable<F>(probs);
  const vf dl0 = uniform<F>(rng, probs.size());
  const float dloss = 1.0f / float(3 * N);
  vf dl = dl0;
  zf::softmax_cross_entropy_backward(dl.data(), probs_in.data(), targets.data(), dloss, N, V);
  auto d_probs_in = to_device<F>(probs_in), d_dl = to_device<F>(dl0);
  zf::softmax_cross_entropy_backward_cuda(d_dl->get(), d_probs_in->get(), d_targets->get(), dloss,
                                          N, V, ctx.stream());
  EXPECT_TRUE(close("cross-entropy dlogits", to_host(*d_dl), dl, [&](size_t i) {
    return 8 * kU32 * (std::abs(dl0[i]) + (std::abs(probs_in[i]) + 1) * dloss) +
           kStoreU<F> * std::abs(dl[i]);
  }));
}

TEST_F(CudaKernels, SoftmaxCrossEntropyF32) {
  check_softmax_ce<float>(ctx(), 26, 37);
  check_softmax_ce<float>(ctx(), 3, 50257);  // rows far longer than the block
}
TEST_F(CudaKernels, SoftmaxCrossEntropyBf16) {
  check_softmax_ce<nvbf>(ctx(), 26, 37);
  check_softmax_ce<nvbf>(ctx(), 3, 50257);
}

// gpt2's logits are [B*T, V = 50304]: 4.1e8 elements at B = 8 (T = 1024),
// past 2^31 bytes in float32 from B = 6 and past 2^31 elements from B = 43,
// so every index into them must be 64-bit. Here N is the least number of
// rows for which row N - 2 straddles element 2^31 and row N - 1 lies past
// it. The last kRand rows hold random logits, all others 0 (a uniform
// softmax); the random rows and row 0 are compared with the CPU twin, under
// check_softmax_ce's tolerances, and every other row's loss with row 0's. A
// 32-bit index would wrap and touch the wrong row (or fault). In bf16: 3 x
// 4.3 GB of device memory; skipped (saying so) when the device has less free.
TEST_F(CudaKernels, SoftmaxCrossEntropyPastTwoTo31Elements) {
  using F = nvbf;
  const int V = 50304, kRand = 3;
  const size_t two31 = size_t(1) << 31;
  const int N = int(two31 / V) + 2;
  const size_t n = size_t(N) * V;
  ASSERT_LT(size_t(N - 2) * V, two31);
  ASSERT_GT(size_t(N - 1) * V, two31);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t need = 3 * n * sizeof(F) + (size_t(1) << 30);  // + 1 GiB for cuBLAS and the rest
  if (free_bytes < need)
    GTEST_SKIP() << "needs " << (need >> 20) << " MiB of free device memory, the device has "
                 << (free_bytes >> 20) << " MiB free";

  std::mt19937 rng = make_rng(1201);
  const auto targets = random_tokens(rng, N, V);
  const vf rand_rows = uniform<F>(rng, size_t(kRand) * V, -8.0f, 8.0f);
  std::vector<int> rows = {0};  // the rows compared with the CPU twin
  for (int r = N - kRand; r < N; ++r) rows.push_back(r);
  const int R = int(rows.size());

  DeviceBuffer<F> logits(n), probs(n), dlogits(n);
  DeviceBuffer<float> losses(N);
  auto d_targets = to_device(targets);
  std::vector<zf::bf16> staged(rand_rows.size());
  zf::float_to_bf16(rand_rows.data(), staged.data(), staged.size());
  // Plain cudaMemset/cudaMemcpy run on the legacy default stream, which the
  // context's non-blocking stream does not wait for: synchronise around them.
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemset(logits.get(), 0, n * sizeof(F)));
  CUDA_CHECK(cudaMemset(probs.get(), 0xFF, n * sizeof(F)));  // NaN: a row left unwritten fails
  CUDA_CHECK(cudaMemset(dlogits.get(), 0, n * sizeof(F)));
  CUDA_CHECK(cudaMemcpy(logits.get() + size_t(N - kRand) * V, staged.data(),
                        staged.size() * sizeof(F), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());

  // The rows of a device [N, V] array listed in `rows`, as float32.
  auto rows_of = [&](DeviceBuffer<F>& d) {
    vf out(size_t(R) * V);
    std::vector<zf::bf16> h(V);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int k = 0; k < R; ++k) {
      CUDA_CHECK(cudaMemcpy(h.data(), d.get() + size_t(rows[k]) * V, V * sizeof(F),
                            cudaMemcpyDeviceToHost));
      zf::bf16_to_float(h.data(), out.data() + size_t(k) * V, V);
    }
    return out;
  };
  vf x(size_t(R) * V, 0.0f);
  std::copy(rand_rows.begin(), rand_rows.end(), x.begin() + V);
  std::vector<int32_t> row_targets(R);
  for (int k = 0; k < R; ++k) row_targets[k] = targets[rows[k]];

  zf::softmax_cross_entropy_forward_cuda(probs.get(), losses.get(), logits.get(), d_targets->get(),
                                         N, V, stream());
  vf want_p(x.size()), want_l(R);
  zf::softmax_cross_entropy_forward(want_p.data(), want_l.data(), x.data(), row_targets.data(), R,
                                    V);
  const double e = 2.0 * (V + 8) * kU32;  // as in check_softmax_ce
  const vf got_p = rows_of(probs);
  EXPECT_TRUE(close("softmax probs, rows 0 and N-3..N-1", got_p, want_p, [&](size_t i) {
    return (e + kU16) * want_p[i] + 1e-37;
  }));
  const vf all_losses = to_host(losses);
  vf got_l(R), zero_rows_l, zero_rows_want;
  for (int k = 0; k < R; ++k) got_l[k] = all_losses[rows[k]];
  for (int r = 1; r < N - kRand; ++r) zero_rows_l.push_back(all_losses[r]);
  zero_rows_want.assign(zero_rows_l.size(), all_losses[0]);
  auto loss_tol = [&](const vf& want) {
    return [&](size_t i) { return e * (1 + std::abs(want[i])) + 8 * kU32 * 16; };
  };
  EXPECT_TRUE(close("cross-entropy losses, rows 0 and N-3..N-1", got_l, want_l, loss_tol(want_l)));
  EXPECT_TRUE(exact("cross-entropy losses of the zero rows, against row 0's", zero_rows_l,
                    zero_rows_want));  // the very same float operations: equal bits

  // Backward from 0 and the GPU's own probabilities (as check_softmax_ce).
  const float dloss = 1.0f / float(N);
  vf want_dl(x.size(), 0.0f);
  zf::softmax_cross_entropy_backward(want_dl.data(), got_p.data(), row_targets.data(), dloss, R,
                                     V);
  zf::softmax_cross_entropy_backward_cuda(dlogits.get(), probs.get(), d_targets->get(), dloss, N,
                                          V, stream());
  EXPECT_TRUE(close("cross-entropy dlogits, rows 0 and N-3..N-1", rows_of(dlogits), want_dl,
                    [&](size_t i) {
                      return 8 * kU32 * (std::abs(got_p[i]) + 1) * dloss +
                             kU16 * std::abs(want_dl[i]);
                    }));
}

}  // namespace
