// test_flash_attention_tc.cpp: the tensor-core flash attention's programs
// (common/flash/flash_attention_tc.cuh) on the CPU. kernels_cuda_flash_tc.cu runs
// them with a CUDA thread block and WMMA; here CpuBlock stands in for both:
// a phase runs its threads (or warps) one after another, and a 16 x 16 tile
// product is a plain loop in float32. So CI runs the very sequence of phases
// the GPU runs (copies, masks, tails, barriers, the online softmax, the
// bf16 roundings) and compares it with the CPU reference
// (zf::attention_forward / attention_backward) and a double log-sum-exp. The
// GPU itself is checked by tests/cuda/test_kernels_cuda_flash.cpp.
//
//   build/tests/test_flash_attention --gtest_filter='FlashTc*'
//
// Three checks beyond the reference:
// - Races. Each phase must not read what another thread writes in the same
//   phase (the programs' one rule). Every case runs with each phase's threads
//   (and warps) in forward order and in reverse order, and must give the
//   same bits; a phase that broke the rule would see different values.
// - Unwritten memory. Shared memory starts as NaN in every block (all bytes
//   0xFF, a NaN in float32 and in bf16), outputs start as NaN, gradients as
//   random g0: a read of an element no phase wrote, or a backward that
//   overwrites instead of adding, shows.
// - Exact mode. With half = float the programs run in float32 throughout
//   (no rounding of P or dS), so the tight float32 tolerances of
//   test_flash_attention.cpp apply: an index or mask error cannot hide in
//   bf16's noise. bf16 mode then checks the roundings with wider bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "flash/attention_ref.h"
#include "flash/worst_ratio.h"
#include "dtype.h"
#include "flash_attention_tc.cuh"
#include "flash_attention_tc_backward.cuh"
#include "kernels.h"

namespace {

using namespace zf::flash_tc;
using zf::flash::Shape;
using vf = std::vector<float>;
constexpr double kU32 = 1.0 / (1 << 24);  // float32's unit roundoff
constexpr double kU16 = 1.0 / (1 << 8);   // bf16's: 8 bits of precision

// ---------------------------------------------------------------------------
// The block model.

template <class Half>
struct CpuBlock {
  using half = Half;
  template <class T>
  struct PerThread {
    struct Box {
      T value;
    };
    std::vector<Box> v = std::vector<Box>(kThreads);
    T& operator()(int t) { return v.at(t).value; }
  };
  template <class T>
  struct PerWarp {
    struct Box {
      T value;
    };
    std::vector<Box> v = std::vector<Box>(kWarps);
    T& operator()(int w) { return v.at(w).value; }
  };
  struct Acc {
    float x[16][16];
  };

  bool reverse = false;  // run each phase's threads (warps) last to first

  template <class Fn>
  void threads(Fn&& fn) {
    for (int n = 0; n < kThreads; ++n) fn(reverse ? kThreads - 1 - n : n);
  }
  template <class Fn>
  void warps(Fn&& fn) {
    for (int n = 0; n < kWarps; ++n) fn(reverse ? kWarps - 1 - n : n);
  }

  static float to_float(half x) {
    if constexpr (std::is_same_v<half, float>) return x;
    else return zf::bf16_to_float(x);
  }
  static half to_half(float x) {
    if constexpr (std::is_same_v<half, float>) return x;
    else return zf::float_to_bf16(x);
  }
  static void zero(Acc& c) { std::memset(&c, 0, sizeof c); }
  // WMMA's mma_sync: c + A B with float32 accumulation (the order of the
  // products inside a tile is the hardware's; here k = 0..15).
  static void mma(Acc& c, const half* a, int lda, const half* b, int ldb) {
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j) {
        float acc = c.x[i][j];
        for (int k = 0; k < 16; ++k) acc += to_float(a[i * lda + k]) * to_float(b[k * ldb + j]);
        c.x[i][j] = acc;
      }
  }
  static void mma_bt(Acc& c, const half* a, int lda, const half* b, int ldb) {
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j) {
        float acc = c.x[i][j];
        for (int k = 0; k < 16; ++k) acc += to_float(a[i * lda + k]) * to_float(b[j * ldb + k]);
        c.x[i][j] = acc;
      }
  }
  static void store(float* p, int ld, const Acc& c) {
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j) p[i * ld + j] = c.x[i][j];
  }
  static void copy16(half* dst, const half* src) { std::memcpy(dst, src, 16); }
};

// A block's shared memory, all bytes 0xFF (NaN in float32 and bf16).
template <class Smem>
std::unique_ptr<Smem> poisoned_smem() {
  auto p = std::make_unique<Smem>();
  std::memset(static_cast<void*>(p.get()), 0xFF, sizeof(Smem));
  return p;
}

// ---------------------------------------------------------------------------
// The harness: kernels_cuda_flash_tc.cu's three kernels (and the D kernel of
// kernels_cuda_flash.cu), block after block, in the grid's order.

struct TcResult {
  vf out, lse, dqkv;  // as float32 (bf16 mode: the bf16 values, exactly)
};

template <class Half, int HS>
TcResult harness(const std::vector<Half>& qkv, const std::vector<Half>& dout,
               const std::vector<Half>& dqkv0, int B, const Shape& s, bool vec, bool reverse) {
  using Blk = CpuBlock<Half>;
  Blk blk;
  blk.reverse = reverse;
  const int tiles = (s.T + kBM - 1) / kBM;
  std::vector<Half> out(size_t(B) * s.T * s.C, Blk::to_half(NAN)), dqkv = dqkv0;
  vf lse(size_t(B) * s.H * s.T, NAN);
  for (int by = 0; by < B * s.H; ++by)
    for (int bx = 0; bx < tiles; ++bx) {
      auto sm = poisoned_smem<ForwardSmem<Blk, HS>>();
      forward_program<Blk, HS>(blk, *sm, s, vec, out.data(), lse.data(), qkv.data(), by / s.H,
                               by % s.H, tiles - 1 - bx);
    }
  // D, as flash_delta_kernel computes it (flash::backward_delta), from the
  // stored out; bf16 values widen to float32 exactly.
  vf D(lse.size(), NAN), outf(out.size()), doutf(dout.size());
  for (size_t i = 0; i < out.size(); ++i) outf[i] = Blk::to_float(out[i]);
  for (size_t i = 0; i < dout.size(); ++i) doutf[i] = Blk::to_float(dout[i]);
  for (int r = 0; r < int(D.size()); ++r) zf::flash::backward_delta(D.data(), outf.data(), doutf.data(), s, r);
  for (int by = 0; by < B * s.H; ++by)
    for (int bx = 0; bx < tiles; ++bx) {
      auto sm = poisoned_smem<DqSmem<Blk, HS>>();
      dq_program<Blk, HS>(blk, *sm, s, vec, dqkv.data(), dout.data(), qkv.data(), lse.data(),
                          D.data(), by / s.H, by % s.H, tiles - 1 - bx);
    }
  for (int by = 0; by < B * s.H; ++by)
    for (int bx = 0; bx < tiles; ++bx) {
      auto sm = poisoned_smem<KeySmem<Blk, HS>>();
      key_program<Blk, HS>(blk, *sm, s, vec, dqkv.data(), dout.data(), qkv.data(), lse.data(),
                           D.data(), by / s.H, by % s.H, bx);
    }
  TcResult r{outf, lse, vf(dqkv.size())};
  for (size_t i = 0; i < dqkv.size(); ++i) r.dqkv[i] = Blk::to_float(dqkv[i]);
  return r;
}

template <class Half>
TcResult run(const vf& qkv, const vf& dout, const vf& dqkv0, int B, int T, int C, int H, bool vec,
           bool reverse, int HS = 0) {
  const int hs = C / H;
  const Shape s{T, C, H, hs, 1.0f / std::sqrt(float(hs))};  // as cuda_impl::flash_shape makes it
  auto cast = [](const vf& x) {
    std::vector<Half> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = CpuBlock<Half>::to_half(x[i]);
    return y;
  };
  TcResult r;
  auto go = [&](auto hs_const) {
    constexpr int kHS = decltype(hs_const)::value;
    r = harness<Half, kHS>(cast(qkv), cast(dout), cast(dqkv0), B, s, vec, reverse);
  };
  if (HS == 0) zf::flash::with_head_size(s, go);  // the launcher's choice
  else if (HS == 32) go(std::integral_constant<int, 32>{});
  else if (HS == 64) go(std::integral_constant<int, 64>{});
  else go(std::integral_constant<int, 128>{});
  return r;
}

// Uniform in [-1, 1], then rounded to bf16 in bf16 mode so that the
// reference computes on exactly the kernels' inputs.
vf uniform(std::mt19937& rng, size_t n, bool bf16) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  vf v(n);
  for (auto& x : v) x = bf16 ? zf::bf16_to_float(zf::float_to_bf16(d(rng))) : d(rng);
  return v;
}

using zf::test::worst_ratio;

bool same_bits(const vf& a, const vf& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Tolerances (inputs in [-1, 1]; u32 = 2^-24, u16 = 2^-8).
// Exact mode: test_flash_attention.cpp's float32 bounds (the same formula in
// a different order): e = 2 (2 hs sqrt(hs) + T + 8) u32; out within 4 e, lse
// within 2 e + 2 u32 |lse|, dqkv within 8 (T + hs + 8) u32 (mag + gmax)
// + 2 u32 |g0|.
// bf16 mode adds what the roundings cost (u16 relative each, on top of the
// float32 bound):
// - out: every p rounded (relative u16) and l summing the same rounded p,
//   so out is a weighted mean of v with each weight off by at most 2 u16
//   relative: 2 u16 max|v|; then out rounded when stored: u16 |out|.
// - lse: log of l, which sums p rounded by u16 each: u16 (+ the float32 e).
// - dqkv: P^T (for dV) and dS (for dQ, dK) rounded before their products,
//   relative u16 on each term: u16 mag; D from the bf16 out:
//   attention_delta_magnitudes; g0 + the gradient rounded once: u16 |result|.
//   Each is doubled for the float32 work around it.
void check(int B, int T, int C, int H, bool bf16) {
  SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
               " H=" + std::to_string(H) + (bf16 ? " bf16" : " exact"));
  const int hs = C / H;
  std::mt19937 rng(4000 + T + C);
  const vf qkv = uniform(rng, size_t(B) * T * 3 * C, bf16), dout = uniform(rng, size_t(B) * T * C, bf16);
  const vf dqkv0 = uniform(rng, qkv.size(), bf16);
  // 16-byte copies when hs and C are multiples of 16 bytes' worth of elements
  // (the launcher's rule; std::vector's storage is 16-byte aligned).
  const int chunk = bf16 ? 8 : 4;
  const bool vec = hs % chunk == 0 && C % chunk == 0;
  auto run_mode = [&](bool v, bool reverse) {
    return bf16 ? run<zf::bf16>(qkv, dout, dqkv0, B, T, C, H, v, reverse)
                : run<float>(qkv, dout, dqkv0, B, T, C, H, v, reverse);
  };
  const TcResult got = run_mode(vec, false);
  const TcResult rev = run_mode(vec, true);
  EXPECT_TRUE(same_bits(got.out, rev.out) && same_bits(got.lse, rev.lse) && same_bits(got.dqkv, rev.dqkv))
      << "reversing the order of each phase's threads changed the result: a phase reads what "
         "another thread writes in the same phase";
  if (vec) {
    const TcResult scalar = run_mode(false, false);
    EXPECT_TRUE(same_bits(got.out, scalar.out) && same_bits(got.dqkv, scalar.dqkv))
        << "16-byte copies and element copies differ";
  }

  vf out(size_t(B) * T * C), att(size_t(B) * H * T * T);
  zf::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  const double e = 2.0 * (2 * hs * std::sqrt(double(hs)) + T + 8) * kU32;
  const double u = bf16 ? kU16 : 0.0;
  worst_ratio("out", got.out, out, [&](size_t i) { return 4 * e + 2 * (2 * u + u * std::abs(out[i])); });
  const std::vector<double> lse_d = zf::test::attention_lse(qkv, B, T, C, H);
  const vf lse(lse_d.begin(), lse_d.end());
  worst_ratio("lse", got.lse, lse, [&](size_t i) { return 2 * e + 2 * kU32 * std::abs(lse_d[i]) + 2 * u; });

  vf dqkv = dqkv0, scratch(zf::attention_scratch_floats(T));
  zf::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, H);
  double gmax = 0;
  for (size_t i = 0; i < dqkv.size(); ++i) gmax = std::max(gmax, std::abs(double(dqkv[i]) - dqkv0[i]));
  const vf mag = zf::test::attention_grad_magnitudes(qkv, att, dout, B, T, C, H);
  const vf dmag = bf16 ? zf::test::attention_delta_magnitudes(qkv, att, dout, out, B, T, C, H, kU16)
                       : vf(qkv.size(), 0.0f);
  worst_ratio("dqkv", got.dqkv, dqkv, [&](size_t i) {
    return 8.0 * (T + hs + 8) * kU32 * (mag[i] + gmax) + 2 * kU32 * std::abs(dqkv0[i]) +
           2 * (u * mag[i] + dmag[i] + u * std::abs(dqkv[i]));
  });
}

// ---------------------------------------------------------------------------

// One row, one key: out = v, lse = the one score.
TEST(FlashTc, SinglePosition) {
  check(2, 1, 8, 2, false);
  check(2, 1, 8, 2, true);
}

// T below one tile, over one tile, over two (the last partial), head sizes
// padded to each HS, hs not a multiple of the copy chunk (element copies).
TEST(FlashTc, TailsAndHeadSizes) {
  for (bool bf16 : {false, true}) {
    check(2, 33, 48, 3, bf16);    // hs 16 -> HS 32
    check(1, 100, 64, 2, bf16);   // hs 32
    check(2, 130, 128, 2, bf16);  // hs 64, three tiles, the last of 2 rows
    check(1, 70, 200, 2, bf16);   // hs 100 -> HS 128
    check(1, 40, 36, 3, bf16);    // hs 12: no 16-byte copies in bf16 mode
  }
}

// GPT-2's head size with many key tiles: the online softmax rescales often.
TEST(FlashTc, Gpt2HeadSize) {
  check(1, 300, 256, 4, false);
  check(1, 300, 256, 4, true);
}

// Padding hs with zeros adds exact zeros to every product: the same bits with
// HS = 32 and HS = 128 (exact mode; bf16 mode likewise).
TEST(FlashTc, PaddingChangesNoBits) {
  const int B = 2, T = 45, C = 40, H = 2;  // hs = 20
  for (bool bf16 : {false, true}) {
    std::mt19937 rng(77);
    const vf qkv = uniform(rng, size_t(B) * T * 3 * C, bf16), dout = uniform(rng, size_t(B) * T * C, bf16);
    const vf dqkv0 = uniform(rng, qkv.size(), bf16);
    auto at = [&](int HS) {
      return bf16 ? run<zf::bf16>(qkv, dout, dqkv0, B, T, C, H, false, false, HS)
                  : run<float>(qkv, dout, dqkv0, B, T, C, H, false, false, HS);
    };
    const TcResult a = at(32), b = at(128);
    EXPECT_TRUE(same_bits(a.out, b.out)) << (bf16 ? "bf16" : "exact");
    EXPECT_TRUE(same_bits(a.lse, b.lse)) << (bf16 ? "bf16" : "exact");
    EXPECT_TRUE(same_bits(a.dqkv, b.dqkv)) << (bf16 ? "bf16" : "exact");
  }
}

}  // namespace
