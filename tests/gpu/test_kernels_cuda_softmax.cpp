// test_kernels_cuda_softmax.cpp: the fused softmax + cross-entropy CUDA
// kernels (forward, backward) against their CPU twins.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Softmax*'
//
// How the comparisons and their tolerances work: kernels_cuda_test_util.h.
// Without a CUDA device every test here is skipped, with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

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

}  // namespace
