// test_optim.cpp: AdamW against a direct computation of PyTorch's formula,
// the clipping coefficient, the exact sum of squares behind the global norm
// (and the host half of its GPU version), and the bf16 gradient folding of
// the mixed-precision recipe.
//
//   build/tests/test_optim --gtest_filter='SumOfSquares*'
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "adamw.h"
#include "gradnorm.h"
#include "host_collectives.h"
#include "launch.h"
#include "precision.h"
#include "test_util.h"
#include "zero1.h"

namespace zf {
namespace {

TEST(AdamW, MatchesTorchFormulaInDouble) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t n = 1001;
  std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f);
  for (auto& x : p) x = nd(rng);
  std::vector<double> pd(p.begin(), p.end()), md(n, 0.0), vd(n, 0.0);
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  const float scale = 0.5f;
  for (long t = 1; t <= 5; ++t) {
    for (auto& x : g) x = nd(rng);
    for (bool decay : {true}) {
      adamw_update(p.data(), g.data(), m.data(), v.data(), n, cfg, t, scale, decay);
      for (size_t i = 0; i < n; ++i) {
        double gi = double(g[i]) * scale;
        pd[i] *= 1.0 - double(cfg.lr) * cfg.weight_decay;
        md[i] = 0.9 * md[i] + 0.1 * gi;
        vd[i] = 0.95 * vd[i] + 0.05 * gi * gi;
        double mhat = md[i] / (1.0 - std::pow(0.9, double(t)));
        double denom = std::sqrt(vd[i]) / std::sqrt(1.0 - std::pow(0.95, double(t))) + 1e-8;
        pd[i] -= double(cfg.lr) * mhat / denom;
      }
    }
  }
  // Float32 arithmetic over five updates of size ~lr: the parameters agree
  // to a few float32 ulps of their magnitude plus a few ulps of lr per step.
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], pd[i], 1e-6 * (1.0 + std::fabs(pd[i]))) << i;
}

TEST(AdamW, NoDecayLeavesTheDecayTermOut) {
  AdamWConfig cfg;
  cfg.lr = 0.1f;
  float p1 = 1.0f, p2 = 1.0f, g = 0.0f, m1 = 0, v1 = 0, m2 = 0, v2 = 0;
  adamw_update(&p1, &g, &m1, &v1, 1, cfg, 1, 1.0f, false);
  adamw_update(&p2, &g, &m2, &v2, 1, cfg, 1, 1.0f, true);
  EXPECT_EQ(p1, 1.0f);                          // zero gradient, no decay: unchanged
  EXPECT_FLOAT_EQ(p2, 1.0f - 0.1f * 0.1f);      // decay alone: p * (1 - lr * wd)
}

TEST(AdamW, Bf16GradientsEqualTheirFloatValues) {
  std::vector<bf16> gb = {float_to_bf16(0.5f), float_to_bf16(-1.25f), float_to_bf16(3e-3f)};
  std::vector<float> gf(gb.size());
  for (size_t i = 0; i < gb.size(); ++i) gf[i] = bf16_to_float(gb[i]);
  std::vector<float> pa = {1, 2, 3}, pb = pa, ma(3), va(3), mb(3), vb(3);
  AdamWConfig cfg;
  adamw_update(pa.data(), gb.data(), ma.data(), va.data(), 3, cfg, 1, 0.7f, true);
  adamw_update(pb.data(), gf.data(), mb.data(), vb.data(), 3, cfg, 1, 0.7f, true);
  EXPECT_EQ(pa, pb);
}

TEST(Clip, CoefficientAsPyTorch) {
  EXPECT_EQ(clip_coefficient(0.5, 1.0f), 1.0f);          // under the norm: untouched
  EXPECT_FLOAT_EQ(clip_coefficient(4.0, 1.0f), float(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(clip_coefficient(1e9, 0.0f), 1.0f);          // clipping off
}

TEST(SumOfSquares, ExactOnRepresentableSums) {
  // Powers of two and small integers: the exact sum is known.
  std::vector<float> x = {1.0f, 2.0f, 3.0f, 0.5f, -4.0f, 1e-20f};
  SumOfSquares s;
  s.add(x.data(), x.size());
  EXPECT_EQ(s.value(), 1.0 + 4.0 + 9.0 + 0.25 + 16.0 + double(1e-20f) * double(1e-20f));
  // Extremes of float32: the largest finite value and the smallest subnormal.
  float big = 3.4028234663852886e38f, tiny_sub = 1.401298464324817e-45f;
  SumOfSquares e;
  e.add(&big, 1);
  e.add(&tiny_sub, 1);
  EXPECT_EQ(e.value(), double(big) * double(big));  // the subnormal's square is far below an ulp
}

TEST(SumOfSquares, IndependentOfOrderAndSplit) {
  std::mt19937 rng(11);
  std::lognormal_distribution<float> ld(0.0f, 8.0f);  // values over many orders of magnitude
  std::vector<float> x(100000);
  for (auto& v : x) v = ld(rng) * ((rng() & 1) ? 1.0f : -1.0f);
  SumOfSquares whole;
  whole.add(x.data(), x.size());
  // A float32/double running sum in another order differs in its last bits;
  // the accumulator must not.
  std::shuffle(x.begin(), x.end(), rng);
  SumOfSquares parts[3];
  parts[0].add(x.data(), 12345);
  parts[1].add(x.data() + 12345, 50000);
  parts[2].add(x.data() + 62345, x.size() - 62345);
  parts[0].add(parts[2]);
  parts[0].add(parts[1]);
  EXPECT_EQ(whole.value(), parts[0].value());
  // And close to a long-double reference.
  long double ref = 0;
  for (float v : x) ref += (long double)v * v;
  EXPECT_NEAR(whole.value() / double(ref), 1.0, 1e-15);
}

TEST(SumOfSquares, AllReduceAcrossRanksEqualsLocal) {
  const int N = 3;
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * float(i);
  SumOfSquares local;
  local.add(x.data(), x.size());
  std::vector<double> got(N);
  run_ranks({N, std::nullopt}, [&](RankContext& ctx) {
    size_t lo = x.size() * ctx.rank / N, hi = x.size() * (ctx.rank + 1) / N;
    SumOfSquares s;
    s.add(x.data() + lo, hi - lo);
    all_reduce(s, ctx.comm, ctx.dev);
    got[ctx.rank] = s.value();
  });
  for (double g : got) EXPECT_EQ(g, local.value());
}

TEST(SumOfSquares, RefusesNonFinite) {
  float bad[2] = {1.0f, std::nanf("")};
  SumOfSquares s;
  EXPECT_THROW(s.add(bad, 2), Error);
}

// ---------------------------------------------------------------------------
// The host half of the GPU path (gradnorm_cuda.cu): the kernel bins mant^2 by
// exponent field per block of 2^15 elements and adds each block's bin into
// two global sums, its low 32 bits and its high bits; add_bin_halves turns
// those into limbs. Here the bins are computed on the host the same way, so
// this runs on any machine; tests/cuda/test_gradnorm_cuda.cpp checks the
// kernel itself. Exact comparisons: both sides hold the same integer sum.

constexpr size_t kGpuBlock = size_t(1) << 15;

uint32_t float_bits(float x) { return std::bit_cast<uint32_t>(x); }
uint32_t float_bits(bf16 x) { return uint32_t(x.bits) << 16; }

template <class T>
void gpu_style_bins(const std::vector<T>& x, std::vector<uint64_t>& lo, std::vector<uint64_t>& hi) {
  lo.assign(256, 0);
  hi.assign(256, 0);
  for (size_t begin = 0; begin < x.size(); begin += kGpuBlock) {
    uint64_t bin[256] = {};
    for (size_t i = begin; i < std::min(x.size(), begin + kGpuBlock); ++i) {
      uint32_t bits = float_bits(x[i]), e = (bits >> 23) & 0xffu;
      uint64_t mant = (bits & 0x7fffffu) | (e ? 0x800000u : 0u);
      bin[e] += mant * mant;
    }
    for (int e = 0; e < 256; ++e) {
      lo[e] += bin[e] & 0xffffffffu;
      hi[e] += bin[e] >> 32;
    }
  }
}

// Every finite bit pattern equally likely: all exponents, subnormals, zeros, both signs.
template <class T>
std::vector<T> random_finite(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<T> x;
  while (x.size() < n) {
    uint32_t b = rng();
    if constexpr (std::is_same_v<T, float>) {
      if (((b >> 23) & 0xffu) != 0xffu) x.push_back(std::bit_cast<float>(b));
    } else {
      if (((b >> 7) & 0xffu) != 0xffu) x.push_back(bf16{uint16_t(b)});
    }
  }
  return x;
}

template <class T>
void expect_bin_halves_equal_add(const std::vector<T>& x) {
  SCOPED_TRACE("n = " + std::to_string(x.size()));
  std::vector<uint64_t> lo, hi;
  gpu_style_bins(x, lo, hi);
  SumOfSquares direct, binned;
  direct.add(x.data(), x.size());
  binned.add_bin_halves(lo.data(), hi.data());
  EXPECT_EQ(binned.limbs(), direct.limbs());
  EXPECT_EQ(binned.value(), direct.value());
}

TEST(SumOfSquares, BinHalvesEqualAddFloat32) {
  for (size_t n : {size_t(0), size_t(1), kGpuBlock - 1, 5 * kGpuBlock + 123})
    expect_bin_halves_equal_add(random_finite<float>(n, uint32_t(n) + 1));
  // The extremes: FLT_MAX fills a block's bin to just under 2^63 (high half
  // near 2^31), 1e19 squares near FLT_MAX, tiny normals, subnormals, zeros.
  std::vector<float> x(6 * kGpuBlock + 5, 3.4028234663852886e38f);
  for (size_t i = 0; i < x.size(); i += 5) x[i] = 1e19f;
  for (size_t i = 1; i < x.size(); i += 7) x[i] = -1e-37f;
  for (size_t i = 2; i < x.size(); i += 11) x[i] = std::bit_cast<float>(uint32_t(i) & 0x807fffffu);
  for (size_t i = 3; i < x.size(); i += 13) x[i] = 0.0f;
  expect_bin_halves_equal_add(x);
}

TEST(SumOfSquares, BinHalvesEqualAddBf16) {
  for (size_t n : {size_t(1), kGpuBlock + 1, 4 * kGpuBlock + 9})
    expect_bin_halves_equal_add(random_finite<bf16>(n, uint32_t(n) + 7));
  std::vector<bf16> x(3 * kGpuBlock, bf16{0x7f7f});  // bf16's largest finite value
  for (size_t i = 0; i < x.size(); i += 3) x[i] = bf16{uint16_t(i & 0x807f)};  // subnormals, zeros
  expect_bin_halves_equal_add(x);
}

TEST(SumOfSquares, BinHalvesAtTheirLimit) {
  // Halves just under 2^63 (what 2^31 - 1 blocks could sum) in every bin.
  // The high half of bin e weighs 2^32 times more, the weight of bin e + 16
  // (bin e stands for 2^(2e - 300), bin 0 for 2^(2 - 300)), so flush() of
  // shifted bins is an independent way to the same sum. Bins over 238 have
  // no bin e + 16: their high halves stay 0 here.
  std::vector<uint64_t> lo(256, 0), hi(256, 0), lo_bins(256, 0), hi_bins(256, 0);
  for (int e = 0; e < 255; ++e) {
    lo[e] = lo_bins[e] = (uint64_t(1) << 63) - 1 - uint64_t(e);
    if (e <= 238) {
      hi[e] = (uint64_t(1) << 61) + uint64_t(e);
      hi_bins[(e == 0 ? 1 : e) + 16] += hi[e];  // bins 0 and 1 both land on 17: 2^62 + 1 < 2^63
    }
  }
  SumOfSquares halves, bins;
  halves.add_bin_halves(lo.data(), hi.data());
  bins.flush(lo_bins.data());
  bins.flush(hi_bins.data());
  EXPECT_EQ(halves.limbs(), bins.limbs());
  EXPECT_EQ(halves.value(), bins.value());
  // A half at 2^63 could only come from an overflowing caller: refused.
  lo[3] = uint64_t(1) << 63;
  SumOfSquares over;
  EXPECT_THROW(over.add_bin_halves(lo.data(), hi.data()), Error);
}

TEST(SumOfSquares, BinHalvesRefuseNonFiniteWithTheCpuMessage) {
  // An inf or a NaN lands in bin 255 on the GPU; add_bin_halves must say
  // what add says.
  std::string cpu_msg;
  float bad = std::nanf("");
  try {
    SumOfSquares s;
    s.add(&bad, 1);
  } catch (const Error& e) {
    cpu_msg = e.what();
  }
  ASSERT_NE(cpu_msg.find(kNonFiniteGradientMessage), std::string::npos) << cpu_msg;
  for (int half = 0; half < 2; ++half) {
    std::vector<uint64_t> lo(256, 0), hi(256, 0);
    (half ? hi : lo)[255] = 1;
    SumOfSquares s;
    try {
      s.add_bin_halves(lo.data(), hi.data());
      ADD_FAILURE() << "bin 255 (inf/NaN) accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(kNonFiniteGradientMessage), std::string::npos) << e.what();
    }
  }
}

// The message is raised inside the sum, which cannot know --clip; the two
// clipping call sites (stage 00's, and the ZeRO stages' clip_scale) add what
// applies to the run. --lr 1e30 makes the second step's gradient overflow.
TEST(SumOfSquares, DivergenceAdviceNamesTheRunsClipSetting) {
  auto diverge = [](float clip, StageFn fn) {
    TrainConfig cfg = test::quiet_config("tiny", 2, 2, 4);
    cfg.lr = 1e30f;
    cfg.clip = clip;
    try {
      run_training(cfg, fn);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  for (StageFn fn : {StageFn(train_data_parallel), StageFn(train_zero1)}) {
    const std::string on = diverge(1.0f, fn);
    EXPECT_NE(on.find(kNonFiniteGradientMessage), std::string::npos) << on;
    EXPECT_NE(on.find("clipping is on (--clip 1), so lower --lr"), std::string::npos) << on;
    EXPECT_EQ(on.find("--clip 1.0"), std::string::npos) << "suggests what is already on: " << on;
    const std::string off = diverge(0.0f, fn);
    EXPECT_NE(off.find("clipping is off (--clip 0): turn it on (--clip 1.0)"), std::string::npos) << off;
    EXPECT_NE(off.find("refused when read"), std::string::npos) << off;
  }
}

TEST(UnitCompute, Bf16GradientsAccumulateRoundedOnce) {
  MemoryTracker mem;
  auto dev = make_cpu_device();
  UnitCompute uc(Precision::bf16, DType::f32, mem, *dev, 4);
  std::vector<bf16> g = {float_to_bf16(1.0f), float_to_bf16(0.0f), float_to_bf16(-2.0f), float_to_bf16(0.0f)};
  float* w = static_cast<float*>(uc.grads_begin(g.data(), 4));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(w[i], 0.0f);  // the workspace starts zeroed
  w[0] = 0.5f; w[1] = 1.0f / 3.0f; w[2] = 2.0f; w[3] = 1e-3f;
  uc.grads_end(g.data(), 4);
  EXPECT_EQ(bf16_to_float(g[0]), 1.5f);
  EXPECT_EQ(g[1].bits, float_to_bf16(1.0f / 3.0f).bits);
  EXPECT_EQ(bf16_to_float(g[2]), 0.0f);
  EXPECT_EQ(g[3].bits, float_to_bf16(1e-3f).bits);
  // Workspaces are counted.
  EXPECT_EQ(mem.counts().cur(Place::device, Category::workspace), 2 * 4 * sizeof(float));
}

// With bf16 compute the kernels use the bf16 buffers themselves: no
// workspace, no widening, and the device computes in bf16 from then on.
TEST(UnitCompute, Bf16ComputeUsesTheBuffersDirectly) {
  MemoryTracker mem;
  auto dev = make_cpu_device();
  UnitCompute uc(Precision::bf16, DType::bf16, mem, *dev, 4);
  std::vector<bf16> p(4), g(4);
  EXPECT_EQ(uc.params(p.data(), 4), p.data());
  EXPECT_EQ(uc.grads_begin(g.data(), 4), g.data());
  uc.grads_end(g.data(), 4);
  EXPECT_EQ(dev->compute_dtype(), DType::bf16);
  EXPECT_EQ(mem.counts().cur(Place::device, Category::workspace), 0u);
}

TEST(UnitCompute, Bf16ComputeNeedsTheBf16Recipe) {
  MemoryTracker mem;
  auto dev = make_cpu_device();
  EXPECT_THROW(UnitCompute(Precision::fp32, DType::bf16, mem, *dev, 4), Error);
}

}  // namespace
}  // namespace zf
