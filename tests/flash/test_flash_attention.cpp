// test_flash_attention.cpp: the flash attention kernels' logic on the CPU.
// common/flash/flash_attention.cuh holds each kernel's per-thread work as plain
// functions; kernels_cuda_flash.cu runs them on a GPU between __syncthreads.
// The harness (common/cpu/flash_attention_cpu.h, also the CPU device's
// --attention flash) runs the very same functions for every thread of every
// block in order (one phase for all threads, then the next: what
// __syncthreads guarantees), in float32; this file compares the results with the
// CPU reference (zf::attention_forward / attention_backward) and a double
// log-sum-exp. So the index arithmetic, the causal masks, the tails (T not a
// multiple of the tiles, hs padded to HS) and the online softmax are checked
// by CI without a GPU; the GPU itself is checked by
// tests/cuda/test_kernels_cuda_flash.cpp.
//
//   build/tests/test_flash_attention
//
// Shared tiles are filled with NaN before each copy phase, so a tile element
// that no thread writes poisons the results; outputs start as NaN too, and
// gradients as random values g0 (a backward that overwrites instead of
// adding fails by O(1)).
//
// Tolerances (u = 2^-24, inputs in [-1, 1]): the flash form and the
// reference compute the same float32 formula in different orders, each within
// ~K u of the exact value for a sum of K terms, relative to the sum of the
// terms' magnitudes. Forward: a score sums hs products (|score| <= sqrt(hs)),
// so it is off by <= 2 hs sqrt(hs) u; softmax turns that into a relative
// error of twice as much in each probability and adds its own sum over T;
// out sums T terms p v with sum p = 1. e = 2 (2 hs sqrt(hs) + T + 8) u per
// side, out within 4 e max|v| (as the GPU test of the simple form), lse
// within 2 e + 2 u |lse| of the double value. Backward: the chain dp -> ds
// -> dq/dk sums over hs, then T terms, and ds = p (dp - D) can cancel, so
// the bound is 8 (T + hs + 8) u of (the magnitude of the element's terms +
// the largest gradient), + 2 u |g0| for the final addition (the GPU test's
// bound for the simple form). A wrong mask, offset or rescale is an O(1) error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "flash/attention_ref.h"
#include "flash/worst_ratio.h"
#include "flash_attention_cpu.h"
#include "kernels.h"

namespace {

using namespace zf::flash;
using vf = std::vector<float>;
constexpr double kU = 1.0 / (1 << 24);

Shape make_shape(int T, int C, int H) {
  const int hs = C / H;
  return Shape{T, C, H, hs, 1.0f / std::sqrt(float(hs))};  // as the launcher computes it
}

// The launchers' choice of HS, or a forced one (to show that padding changes nothing).
template <class Fn>
void with_hs(int HS, Fn&& fn) {
  switch (HS) {
    case 32: fn(std::integral_constant<int, 32>{}); break;
    case 64: fn(std::integral_constant<int, 64>{}); break;
    case 128: fn(std::integral_constant<int, 128>{}); break;
    default: FAIL() << "no HS " << HS;
  }
}

struct Result {
  vf out, lse, dqkv;
};

Result run_flash(const vf& qkv, const vf& dout, const vf& dqkv0, int B, int T, int C, int H,
                 int HS) {
  const Shape s = make_shape(T, C, H);
  Result r{vf(size_t(B) * T * C, NAN), vf(size_t(B) * H * T, NAN), dqkv0};
  with_hs(HS, [&](auto hs) {
    constexpr int kHS = decltype(hs)::value;
    vf D(size_t(B) * s.H * s.T, NAN);
    blocks_forward<kHS>(r.out.data(), r.lse.data(), qkv.data(), B, s, /*poison_tiles=*/true);
    blocks_backward<kHS>(r.dqkv.data(), D.data(), dout.data(), r.out.data(), qkv.data(), r.lse.data(), B, s,
                         /*poison_tiles=*/true);
  });
  return r;
}

vf uniform(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  vf v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

using zf::test::worst_ratio;

std::vector<double> to_double(const vf& x) { return std::vector<double>(x.begin(), x.end()); }

void check_flash(int B, int T, int C, int H) {
  SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
               " H=" + std::to_string(H));
  const int hs = C / H;
  std::mt19937 rng(1000 + T + C);
  const vf qkv = uniform(rng, size_t(B) * T * 3 * C), dout = uniform(rng, size_t(B) * T * C);
  const vf dqkv0 = uniform(rng, qkv.size());
  const Result got = run_flash(qkv, dout, dqkv0, B, T, C, H, padded_head_size(hs));

  vf out(size_t(B) * T * C), att(size_t(B) * H * T * T);
  zf::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  const double e = 2.0 * (2 * hs * std::sqrt(double(hs)) + T + 8) * kU;
  worst_ratio("out", got.out, to_double(out), [&](size_t) { return 4 * e; });  // max|v| <= 1
  const std::vector<double> lse = zf::test::attention_lse(qkv, B, T, C, H);
  worst_ratio("lse", got.lse, lse, [&](size_t i) { return 2 * e + 2 * kU * std::abs(lse[i]); });

  vf dqkv = dqkv0, scratch(zf::attention_scratch_floats(T));
  zf::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                         H);
  double gmax = 0;
  for (size_t i = 0; i < dqkv.size(); ++i) gmax = std::max(gmax, std::abs(double(dqkv[i]) - dqkv0[i]));
  const vf mag = zf::test::attention_grad_magnitudes(qkv, att, dout, B, T, C, H);
  worst_ratio("dqkv", got.dqkv, to_double(dqkv), [&](size_t i) {
    return 8.0 * (T + hs + 8) * kU * (mag[i] + gmax) + 2 * kU * std::abs(dqkv0[i]);
  });
}

// ---------------------------------------------------------------------------

TEST(FlashAttention, PaddedHeadSizes) {
  EXPECT_EQ(padded_head_size(1), 32);
  EXPECT_EQ(padded_head_size(32), 32);
  EXPECT_EQ(padded_head_size(33), 64);
  EXPECT_EQ(padded_head_size(64), 64);
  EXPECT_EQ(padded_head_size(65), 128);
  EXPECT_EQ(padded_head_size(128), 128);
  EXPECT_EQ(padded_head_size(129), 0) << "over the maximum: the launcher refuses it";
  EXPECT_EQ(padded_head_size(0), 0);
}

// One row, one key: out = v, lse = the one score.
TEST(FlashAttention, SinglePosition) { check_flash(2, 1, 8, 2); }

// T below one tile, over one tile and under a block, over a block: the
// diagonal tiles, the rows and keys past T, the last partial block.
TEST(FlashAttention, TailsAndHeadSizes) {
  check_flash(2, 33, 48, 3);   // hs 16 -> HS 32
  check_flash(1, 100, 64, 2);  // hs 32
  check_flash(2, 130, 128, 2);  // hs 64, three row blocks, the last of 2 rows
  check_flash(1, 70, 200, 2);  // hs 100 -> HS 128
}

// GPT-2's head size (64) with a longer sequence: many key tiles, so the
// online softmax rescales many times.
TEST(FlashAttention, Gpt2HeadSize) { check_flash(1, 300, 256, 4); }

// Padding hs with zeros to a larger HS adds exact zeros to every dot product
// and changes no other operation: the same bits with HS = 32 and HS = 128.
TEST(FlashAttention, PaddingChangesNoBits) {
  const int B = 2, T = 45, C = 40, H = 2;  // hs = 20
  std::mt19937 rng(77);
  const vf qkv = uniform(rng, size_t(B) * T * 3 * C), dout = uniform(rng, size_t(B) * T * C);
  const vf dqkv0 = uniform(rng, qkv.size());
  const Result a = run_flash(qkv, dout, dqkv0, B, T, C, H, 32);
  const Result b = run_flash(qkv, dout, dqkv0, B, T, C, H, 128);
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * 4), 0);
}

}  // namespace
