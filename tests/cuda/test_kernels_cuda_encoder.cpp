// test_kernels_cuda_encoder.cpp: the encoder CUDA kernels (token + position
// embedding, forward and backward) against their CPU twin, from tokens that
// rarely repeat to a batch of one token, and the backward's determinism.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Encoder*'
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

// Every check is exact. Forward: one float32 addition per element on both
// sides, then (bf16) one rounding to nearest even on both sides. Backward:
// the GPU adds, for each dwte and dwpe element, the same terms as the CPU in
// the same order (dwpe: b = 0, 1, ...; dwte: the positions holding that
// token in increasing order, after a stable sort by token), in float32 from
// the starting gradient, and rounds once when it stores: the CPU's float32
// bits, or (bf16) those bits rounded once, exactly what representable<F>()
// does to the CPU's result.
template <class F>
void check_encoder(zf::CudaContext& ctx, int B, int T, int C, int V) {
  SCOPED_TRACE("B " + std::to_string(B) + " T " + std::to_string(T) + " C " + std::to_string(C) +
               " V " + std::to_string(V));
  std::mt19937 rng = make_rng(101 + V);
  const int N = B * T;
  const auto tokens = random_tokens(rng, N, V);  // V small: tokens repeat
  const vf wte = uniform<F>(rng, size_t(V) * C), wpe = uniform<F>(rng, size_t(T) * C);
  auto d_tok = to_device(tokens);
  auto d_wte = to_device<F>(wte), d_wpe = to_device<F>(wpe);

  vf out(size_t(N) * C);
  zf::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  auto d_out = poisoned<F>(out.size());
  zf::encoder_forward_cuda(d_out->get(), d_tok->get(), d_wte->get(), d_wpe->get(), B, T, C,
                           ctx.stream());
  EXPECT_TRUE(exact("encoder out", to_host(*d_out), representable<F>(out)));

  const vf dout = uniform<F>(rng, out.size());
  const vf dwte0 = uniform<F>(rng, wte.size()), dwpe0 = uniform<F>(rng, wpe.size());
  vf dwte = dwte0, dwpe = dwpe0;
  zf::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  auto d_dout = to_device<F>(dout);
  auto d_dwte = to_device<F>(dwte0), d_dwpe = to_device<F>(dwpe0);
  zf::encoder_backward_cuda(ctx, d_dwte->get(), d_dwpe->get(), d_dout->get(), d_tok->get(), B, T,
                            C);
  EXPECT_TRUE(exact("encoder dwpe", to_host(*d_dwpe), representable<F>(dwpe)));
  EXPECT_TRUE(exact("encoder dwte", to_host(*d_dwte), representable<F>(dwte)));
}

template <class F>
void check_encoder_shapes(zf::CudaContext& ctx) {
  check_encoder<F>(ctx, 2, 13, 12, 7);     // odd sizes, C below one block of channels
  check_encoder<F>(ctx, 4, 64, 128, 256);  // byte tokens
  check_encoder<F>(ctx, 2, 300, 130, 1);   // one run of 600 positions; C just over a block
  // gpt2's N = 8192: heavy repeats (runs of ~2700 positions, many batches of
  // 16 rows each) at C = 768, and gpt2's vocabulary (mostly runs of one;
  // more sorted positions than blocks along them, 1024) at a narrow C.
  check_encoder<F>(ctx, 8, 1024, 768, 3);
  check_encoder<F>(ctx, 8, 1024, 64, 50304);
}

TEST_F(CudaKernels, EncoderF32) { check_encoder_shapes<float>(ctx()); }
TEST_F(CudaKernels, EncoderBf16) { check_encoder_shapes<nvbf>(ctx()); }

// The same inputs twice give the same bits, at gpt2's shape with heavy
// repeats (the sort and the runs), in both dtypes.
template <class F>
void check_encoder_deterministic(zf::CudaContext& ctx) {
  std::mt19937 rng = make_rng(1003);
  const int B = 8, T = 1024, C = 768, V = 50;
  const auto tokens = random_tokens(rng, B * T, V);
  const vf dout = uniform<F>(rng, size_t(B) * T * C);
  auto d_tok = to_device(tokens);
  auto d_dout = to_device<F>(dout);
  auto run = [&] {
    auto dwte = to_device<F>(vf(size_t(V) * C, 0.0f)), dwpe = to_device<F>(vf(size_t(T) * C, 0.0f));
    zf::encoder_backward_cuda(ctx, dwte->get(), dwpe->get(), d_dout->get(), d_tok->get(), B, T, C);
    return std::vector<vf>{to_host(*dwte), to_host(*dwpe)};
  };
  const auto first = run(), second = run();
  EXPECT_TRUE(exact("encoder dwte rerun", second[0], first[0]));
  EXPECT_TRUE(exact("encoder dwpe rerun", second[1], first[1]));
}

TEST_F(CudaKernels, EncoderBackwardIsDeterministic) {
  check_encoder_deterministic<float>(ctx());
  check_encoder_deterministic<nvbf>(ctx());
}

}  // namespace
