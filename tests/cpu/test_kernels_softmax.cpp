// test_kernels_softmax.cpp: the fused softmax + cross-entropy of kernels.h
// and the bf16 conversions, against double-precision references. The method
// and the tolerances' reasoning are at the top of test_kernels.cpp.
//
//   build/tests/test_kernels --gtest_filter='*SoftmaxCrossEntropy*:Bf16*'
#include <cblas.h>
#include <gtest/gtest.h>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include "dtype.h"
#include "kernels.h"
#include "cpu/kernels_ref.h"

namespace {

using namespace kernels_test;

// ---------------------------------------------------------------------------
// Softmax + cross-entropy, fused: the forward keeps lse (no probabilities),
// the backward WRITES dlogits (=), out of place or in place over the logits.

// Tolerances (u = 2^-24):
// - lse: the float sum of V exps (each to ~2 ulp) is within (V + 10) u of
//   its value, relative, so log(sum) within (V + 10) u absolute; max +
//   log(sum) rounds once more, by u |lse|. x4 and x2 margins.
double lse_tol(int V, double lse) { return 4 * (V + 10) * kU + 2 * kU * std::abs(lse); }
// - loss = log(sum) - (x_t - max): log(sum) as above; x_t - max is exact
//   where it matters (Sterbenz), then one rounding of |loss|, x8.
double loss_tol(int V, double loss) { return 4 * (V + 10) * kU + 8 * kU * (std::abs(loss) + 10); }
// - dlogits from a given lse: x - lse rounds by u |x - lse|, which is at most
//   ~30 u where p = e^(x - lse) is not negligible (e^-30 ~ 1e-13), exp to 2
//   ulp, then the -1 and the product with dloss: 34 u of |dloss|, x2 margin.
double dlogit_tol(float dloss) { return 64 * kU * std::abs(dloss); }

// The backward twice: out of place into a buffer of NaNs (an element left
// unwritten stays NaN, and so does one added to: NaN + g is NaN), and in
// place over a copy of the logits. The two run the same arithmetic in two
// loops, so they must give the same bits. Returns the in-place result.
vf ce_backward_both_ways(const vf& logits, const vf& lse, const std::vector<int32_t>& targets,
                         float dloss, int N, int V) {
  vf out(logits.size(), std::numeric_limits<float>::quiet_NaN());
  zf::softmax_cross_entropy_backward(out.data(), logits.data(), lse.data(), targets.data(), dloss,
                                     N, V);
  vf in_place = logits;
  zf::softmax_cross_entropy_backward(in_place.data(), in_place.data(), lse.data(), targets.data(),
                                     dloss, N, V);
  for (size_t i = 0; i < out.size(); ++i)
    if (std::bit_cast<uint32_t>(out[i]) != std::bit_cast<uint32_t>(in_place[i])) {
      ADD_FAILURE() << "element " << i << ": out of place " << out[i] << ", in place "
                    << in_place[i];
      break;
    }
  return in_place;
}

// (e^(x - lse) - [j == t]) dloss in double, from the kernel's own float lse.
vd ref_dlogits(const vf& logits, const vf& lse, const std::vector<int32_t>& targets, float dloss,
               int N, int V) {
  vd g(logits.size());
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v)
      g[n * V + v] = (std::exp(double(logits[n * V + v]) - lse[n]) - (v == targets[n])) * dloss;
  return g;
}

// Forward against the double reference; returns the kernel's lse.
vf check_ce_forward(const vf& logits, const std::vector<int32_t>& targets, int N, int V) {
  vf lse(N, -1.0f), losses(N, -1.0f);
  zf::softmax_cross_entropy_forward(lse.data(), losses.data(), logits.data(), targets.data(), N,
                                    V);
  vd lse_want;
  const vd losses_want = ref_softmax_ce(to_double(logits), targets, N, V, &lse_want);
  for (int n = 0; n < N; ++n) {
    EXPECT_TRUE(std::isfinite(lse[n]) && std::isfinite(losses[n])) << "row " << n;
    EXPECT_NEAR(lse[n], lse_want[n], lse_tol(V, lse_want[n])) << "lse, row " << n;
    EXPECT_NEAR(losses[n], losses_want[n], loss_tol(V, losses_want[n])) << "loss, row " << n;
  }
  return lse;
}

TEST(Kernels, SoftmaxCrossEntropy) {
  const int N = 10, V = 37;  // V: two 16-lane blocks and a tail
  std::mt19937 rng(14);
  vf logits = uniform(rng, size_t(N) * V, -4.0f, 4.0f);
  // Large logits in the tail past the 16-lane blocks (index 32..36): a max that
  // missed them would overflow exp (e^200) and give inf/NaN.
  logits[3 * V + 33] = 80.0f;
  logits[4 * V + 34] = 200.0f;
  auto targets = random_tokens(rng, N, V);
  targets[4] = 0;      // the first column, and a target whose probability underflows to 0
  targets[5] = V - 1;  // the last column
  const vf lse = check_ce_forward(logits, targets, N, V);

  const float dloss = 1.0f / 7;
  const vf dl = ce_backward_both_ways(logits, lse, targets, dloss, N, V);
  EXPECT_TRUE(all_near(dl, ref_dlogits(logits, lse, targets, dloss, N, V), dlogit_tol(dloss)));
  // End to end, the gradient of dloss * sum of the losses: central
  // differences of the double reference. The float lse adds (V + 10) u +
  // u |lse| (<= 200 here) of relative error to each probability: 1e-5 of
  // |dloss| covers it with margin; a wrong term is off by O(|dloss| / V).
  vd logits_d = to_double(logits);
  auto L = [&] {
    double s = 0;
    for (double l : ref_softmax_ce(logits_d, targets, N, V)) s += double(dloss) * l;
    return s;
  };
  EXPECT_TRUE(all_near(dl, numeric_grad(logits_d, L), 1e-5 * dloss));
}

// Logits of 1e4: exp(x) overflows and exp(-x) underflows unless the max is
// taken out first. Rows: all near +1e4, all near -1e4, one 1e4 among small
// ones (the target's probability underflows: loss ~1e4), all equal to 1e4
// (a uniform softmax: loss = log V).
TEST(Kernels, SoftmaxCrossEntropyHugeLogitsAreStable) {
  const int N = 4, V = 37;
  std::mt19937 rng(141);
  vf logits = uniform(rng, size_t(N) * V, -4.0f, 4.0f);
  for (int v = 0; v < V; ++v) {
    logits[0 * V + v] += 1e4f;
    logits[1 * V + v] -= 1e4f;
    logits[3 * V + v] = 1e4f;
  }
  logits[2 * V + 0] = 1e4f;
  const std::vector<int32_t> targets = {5, V - 1, V - 1, 0};
  // loss_tol is taken relative to the loss, not to lse: rows 0, 1 and 3 have
  // losses of a few units under lse's of 1e4, so this also checks that the
  // loss does not carry lse's rounding (u 1e4 ~ 6e-4, far above their 1e-5).
  const vf lse = check_ce_forward(logits, targets, N, V);
  EXPECT_NEAR(lse[3], 1e4 + std::log(double(V)), lse_tol(V, 1e4));

  const float dloss = 0.25f;
  const vf dl = ce_backward_both_ways(logits, lse, targets, dloss, N, V);
  EXPECT_TRUE(all_near(dl, ref_dlogits(logits, lse, targets, dloss, N, V), dlogit_tol(dloss)));
  // Against the exact gradient, (softmax - onehot) dloss: the float lse is
  // off by up to lse_tol (~1.2e-3 at 1e4), and so, relatively, is every
  // probability (<= 1), on top of dlogit_tol; a wrong term is off by
  // O(|dloss| / V) ~ 7e-3.
  vd probs;
  ref_softmax_ce(to_double(logits), targets, N, V, nullptr, &probs);
  for (int n = 0; n < N; ++n) probs[n * V + targets[n]] -= 1.0;
  for (auto& g : probs) g *= dloss;
  EXPECT_TRUE(all_near(dl, probs, lse_tol(V, 1e4) * dloss + dlogit_tol(dloss)));
}

// Rows longer than the forward's 1024-logit chunk (2 whole chunks and a
// partial one): the running sum is rescaled when a later chunk holds a new
// max. Row 0 rises (a new max in every chunk), row 1 falls (the max in the
// first), row 2 is flat with spikes in the middle and in the partial chunk.
TEST(Kernels, SoftmaxCrossEntropyLongRows) {
  const int N = 3, V = 2500;
  std::mt19937 rng(142);
  vf logits = uniform(rng, size_t(N) * V, -1.0f, 1.0f);
  for (int v = 0; v < V; ++v) {
    logits[0 * V + v] += 0.01f * float(v);
    logits[1 * V + v] -= 0.01f * float(v);
  }
  logits[2 * V + 1500] = 20.0f;
  logits[2 * V + 2400] = 30.0f;
  const std::vector<int32_t> targets = {V - 1, 0, 1500};
  const vf lse = check_ce_forward(logits, targets, N, V);
  const float dloss = 1.0f / 3;
  const vf dl = ce_backward_both_ways(logits, lse, targets, dloss, N, V);
  EXPECT_TRUE(all_near(dl, ref_dlogits(logits, lse, targets, dloss, N, V), dlogit_tol(dloss)));
}

// ---------------------------------------------------------------------------
// bf16 conversions

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t u) { return std::bit_cast<float>(u); }

TEST(Bf16, RoundsToNearestEven) {
  struct Case {
    uint32_t in;
    uint16_t want;
    const char* what;
  };
  const Case cases[] = {
      {0x3f800000, 0x3f80, "1.0 exactly"},
      {0x3f808000, 0x3f80, "tie, even below: stays"},
      {0x3f818000, 0x3f82, "tie, odd below: rounds up to even"},
      {0x3f808001, 0x3f81, "just above the tie: up"},
      {0x3f807fff, 0x3f80, "just below the tie: down"},
      {0xbf818000, 0xbf82, "negative tie, odd: away from zero to even"},
      {0x3f7fffff, 0x3f80, "rounds up across an exponent"},
      {0x7f7fffff, 0x7f80, "largest float rounds to +inf"},
      {0x7f800000, 0x7f80, "+inf"},
      {0xff800000, 0xff80, "-inf"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0"},
      {0x00008000, 0x0000, "subnormal tie, even: 0"},
      {0x00018000, 0x0002, "subnormal tie, odd: up"},
      {0x7fc00000, 0x7fc0, "quiet NaN"},
      {0x7f800001, 0x7fc0, "signalling NaN with only low bits: still a NaN, not inf"},
      {0xffffffff, 0xffff, "NaN with all bits"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(zf::float_to_bf16(float_of(c.in)).bits, c.want) << "scalar: " << c.what;
    float f = float_of(c.in);
    zf::bf16 h{0};
    zf::float_to_bf16(&f, &h, 1);
    EXPECT_EQ(h.bits, c.want) << "bulk: " << c.what;
  }
}

TEST(Bf16, BulkMatchesScalar) {
  // Random bit patterns (NaNs, infinities, subnormals included) in every
  // length 0..40 and one long odd length, so that vector bodies and tails run.
  std::mt19937 rng(15);
  std::vector<float> in(100003);
  for (auto& f : in) f = float_of(rng());
  for (size_t i = 0; i < 64; ++i) in[i * 7] = float_of(uint32_t(i) << 10 | 0x7f800000);  // NaN/inf
  std::vector<zf::bf16> out(in.size());
  auto check = [&](size_t n) {
    std::fill(out.begin(), out.end(), zf::bf16{0xdead});
    zf::float_to_bf16(in.data(), out.data(), n);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(out[i].bits, zf::float_to_bf16(in[i]).bits) << "n=" << n << " i=" << i;
    if (n < out.size()) {
      ASSERT_EQ(out[n].bits, 0xdead) << "wrote past n=" << n;
    }
  };
  for (size_t n = 0; n <= 40; ++n) check(n);
  check(in.size());

  // bf16 -> float: all 65536 patterns, exact, and back again unchanged (NaNs
  // stay NaNs; they may come back quieted).
  std::vector<zf::bf16> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i].bits = uint16_t(i);
  std::vector<float> f(all.size());
  zf::bf16_to_float(all.data(), f.data(), all.size());
  std::vector<zf::bf16> back(all.size());
  zf::float_to_bf16(f.data(), back.data(), f.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(bits_of(f[i]), i << 16) << "bf16 " << i;
    ASSERT_EQ(bits_of(f[i]), bits_of(zf::bf16_to_float(all[i]))) << "bf16 " << i;
    if (std::isnan(f[i]))
      ASSERT_TRUE(std::isnan(zf::bf16_to_float(back[i]))) << "bf16 " << i;
    else
      ASSERT_EQ(back[i].bits, i) << "bf16 " << i;
  }
}

}  // namespace
