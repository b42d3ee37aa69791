// test_kernels_cuda_softmax.cpp: the fused softmax + cross-entropy CUDA
// kernels (forward: lse and losses; backward: dlogits written, in place or
// not) against their CPU twins.
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
#include "cuda/kernels_cuda_test_util.h"
#include "kernels.h"

namespace {

using namespace zf::test;

// ---------------------------------------------------------------------------
// Softmax + cross-entropy, fused: the forward writes lse and losses (no
// probabilities), the backward WRITES dlogits, out of place or in place.

// Tolerances of the comparisons with the CPU twin (u32 = 2^-24):
// - the two sides take the same max (exact) and sum V exps (each within 2
//   ulp) in different orders; the GPU's online rescaling adds ~3 u32 per new
//   max of a thread, the CPU's per chunk: the sums agree within 2 (V + 8) u32,
//   relative, and so log(sum) within that, absolute (= e below);
// - lse = max + log(sum) rounds once on each side: 2 u32 |lse| more;
// - loss = log(sum) - (x_t - max), x_t - max the same float operation on the
//   same values: e (1 + |loss|) and a few ulps of its terms;
// - dlogits from the same lse: x - lse is the same float subtraction on both
//   sides, exp within 2 ulp each, then the -1 and the product: 8 u32 of
//   (p + 1) |dloss|; bf16 rounds the stored gradient once more (kStoreU).
double softmax_sum_tol(int V) { return 2.0 * (V + 8) * kU32; }

// One row per case: random logits in [-8, 8); rows 2 and 3 (when N > 3)
// shifted by +1e4 and -1e4 (exp(x) overflows, exp(-x) underflows unless the
// max is taken out); targets at columns 0 and V - 1 in rows 0 and 1.
template <class F>
void check_softmax_ce(zf::CudaContext& ctx, int N, int V) {
  std::mt19937 rng = make_rng(707 + V);
  vf logits = uniform<F>(rng, size_t(N) * V, -8.0f, 8.0f);
  if (N > 3)
    for (int v = 0; v < V; ++v) {
      logits[2 * size_t(V) + v] += 1e4f;
      logits[3 * size_t(V) + v] -= 1e4f;
    }
  logits = representable<F>(logits);
  auto targets = random_tokens(rng, N, V);
  targets[0] = 0;
  if (N > 1) targets[1] = V - 1;
  vf lse(N), losses(N);
  zf::softmax_cross_entropy_forward(lse.data(), losses.data(), logits.data(), targets.data(), N,
                                    V);
  auto d_logits = to_device<F>(logits);
  auto d_targets = to_device(targets);
  auto d_lse = poisoned<float>(N), d_losses = poisoned<float>(N);
  zf::softmax_cross_entropy_forward_cuda(d_lse->get(), d_losses->get(), d_logits->get(),
                                         d_targets->get(), N, V, ctx.stream());
  const double e = softmax_sum_tol(V);
  EXPECT_TRUE(close("cross-entropy lse", to_host(*d_lse), lse,
                    [&](size_t i) { return e + 2 * kU32 * std::abs(lse[i]); }));
  EXPECT_TRUE(close("cross-entropy losses", to_host(*d_losses), losses,
                    [&](size_t i) { return e * (1 + std::abs(losses[i])) + 8 * kU32 * 16; }));

  // Backward, both sides from the CPU's lse: out of place into a poisoned
  // buffer (an element left unwritten, or added to, stays NaN), then in
  // place over the logits, which must give the out-of-place bits (the same
  // kernel, the same arithmetic per element).
  const float dloss = 1.0f / float(3 * N);
  vf dl(logits.size());
  zf::softmax_cross_entropy_backward(dl.data(), logits.data(), lse.data(), targets.data(), dloss,
                                     N, V);
  auto d_lse_in = to_device<float>(lse);
  auto d_dl = poisoned<F>(logits.size());
  zf::softmax_cross_entropy_backward_cuda(d_dl->get(), d_logits->get(), d_lse_in->get(),
                                          d_targets->get(), dloss, N, V, ctx.stream());
  const vf got = to_host(*d_dl);
  EXPECT_TRUE(close("cross-entropy dlogits", got, dl, [&](size_t i) {
    const double p = std::exp(double(logits[i]) - lse[i / V]);
    return 8 * kU32 * (p + 1) * dloss + kStoreU<F> * std::abs(dl[i]);
  }));
  zf::softmax_cross_entropy_backward_cuda(d_logits->get(), d_logits->get(), d_lse_in->get(),
                                          d_targets->get(), dloss, N, V, ctx.stream());
  EXPECT_TRUE(exact("cross-entropy dlogits in place, against out of place", to_host(*d_logits),
                    got));
}

TEST_F(CudaKernels, SoftmaxCrossEntropyF32) {
  check_softmax_ce<float>(ctx(), 26, 37);     // V < the block's 512 threads: idle threads
  check_softmax_ce<float>(ctx(), 5, 50257);   // rows far longer than the block, V odd
  check_softmax_ce<float>(ctx(), 4, 1024);    // V a multiple of the block
}
TEST_F(CudaKernels, SoftmaxCrossEntropyBf16) {
  check_softmax_ce<nvbf>(ctx(), 26, 37);
  check_softmax_ce<nvbf>(ctx(), 5, 50257);
  check_softmax_ce<nvbf>(ctx(), 4, 1024);
}

// gpt2's logits are [B*T, V = 50304]: 4.1e8 elements at B = 8 (T = 1024),
// past 2^31 bytes in float32 from B = 6 and past 2^31 elements from B = 43,
// so every index into them must be 64-bit. Here N is the least number of
// rows for which row N - 2 straddles element 2^31 and row N - 1 lies past
// it. The last kRand rows hold random logits, all others 0 (a uniform
// softmax); the random rows and row 0 are compared with the CPU twin, under
// check_softmax_ce's tolerances, and every other row's lse and loss with
// row 0's. A 32-bit index would wrap and touch the wrong row (or fault).
// The backward runs in place, as the model runs it. In bf16: 4.3 GB of
// device memory (the logits, then their gradient); skipped (saying so) when
// the device has less free.
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
  const size_t need = n * sizeof(F) + (size_t(1) << 30);  // + 1 GiB for the rest
  if (free_bytes < need)
    GTEST_SKIP() << "needs " << (need >> 20) << " MiB of free device memory, the device has "
                 << (free_bytes >> 20) << " MiB free";

  std::mt19937 rng = make_rng(1201);
  const auto targets = random_tokens(rng, N, V);
  const vf rand_rows = uniform<F>(rng, size_t(kRand) * V, -8.0f, 8.0f);
  std::vector<int> rows = {0};  // the rows compared with the CPU twin
  for (int r = N - kRand; r < N; ++r) rows.push_back(r);
  const int R = int(rows.size());

  DeviceBuffer<F> logits(n);
  auto lse = poisoned<float>(N), losses = poisoned<float>(N);
  auto d_targets = to_device(targets);
  std::vector<zf::bf16> staged(rand_rows.size());
  zf::float_to_bf16(rand_rows.data(), staged.data(), staged.size());
  // Plain cudaMemset/cudaMemcpy run on the legacy default stream, which the
  // context's non-blocking stream does not wait for: synchronise around them.
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemset(logits.get(), 0, n * sizeof(F)));
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
  // The entries of a device [N] float array at `rows`, and all the others.
  auto split = [&](const vf& all, vf& at_rows, vf& others) {
    for (int k = 0; k < R; ++k) at_rows.push_back(all[rows[k]]);
    for (int r = 1; r < N - kRand; ++r) others.push_back(all[r]);
  };
  vf x(size_t(R) * V, 0.0f);
  std::copy(rand_rows.begin(), rand_rows.end(), x.begin() + V);
  std::vector<int32_t> row_targets(R);
  for (int k = 0; k < R; ++k) row_targets[k] = targets[rows[k]];

  zf::softmax_cross_entropy_forward_cuda(lse->get(), losses->get(), logits.get(), d_targets->get(),
                                         N, V, stream());
  vf want_lse(R), want_l(R);
  zf::softmax_cross_entropy_forward(want_lse.data(), want_l.data(), x.data(), row_targets.data(),
                                    R, V);
  const double e = softmax_sum_tol(V);  // as in check_softmax_ce
  vf got_lse, zero_rows_lse, got_l, zero_rows_l;
  split(to_host(*lse), got_lse, zero_rows_lse);
  split(to_host(*losses), got_l, zero_rows_l);
  EXPECT_TRUE(close("cross-entropy lse, rows 0 and N-3..N-1", got_lse, want_lse,
                    [&](size_t i) { return e + 2 * kU32 * std::abs(want_lse[i]); }));
  EXPECT_TRUE(close("cross-entropy losses, rows 0 and N-3..N-1", got_l, want_l, [&](size_t i) {
    return e * (1 + std::abs(want_l[i])) + 8 * kU32 * 16;
  }));
  // The zero rows: the very same float operations as row 0's, so equal bits.
  EXPECT_TRUE(exact("cross-entropy lse of the zero rows, against row 0's", zero_rows_lse,
                    vf(zero_rows_lse.size(), got_lse[0])));
  EXPECT_TRUE(exact("cross-entropy losses of the zero rows, against row 0's", zero_rows_l,
                    vf(zero_rows_l.size(), got_l[0])));

  // Backward in place over the logits, from the GPU's own lse (as the model
  // runs it); the CPU twin from the same lse (check_softmax_ce's tolerance).
  const float dloss = 1.0f / float(N);
  vf want_dl(x.size());
  zf::softmax_cross_entropy_backward(want_dl.data(), x.data(), got_lse.data(), row_targets.data(),
                                     dloss, R, V);
  zf::softmax_cross_entropy_backward_cuda(logits.get(), logits.get(), lse->get(), d_targets->get(),
                                          dloss, N, V, stream());
  EXPECT_TRUE(close("cross-entropy dlogits in place, rows 0 and N-3..N-1", rows_of(logits),
                    want_dl, [&](size_t i) {
                      const double p = std::exp(double(x[i]) - got_lse[i / V]);
                      return 8 * kU32 * (p + 1) * dloss + kU16 * std::abs(want_dl[i]);
                    }));
}

}  // namespace
