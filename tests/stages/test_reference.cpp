// test_reference.cpp: the double-precision reference of docs/SPEC.md's GPT
// (tests/stages/gpt_reference.h) that every stage's Gradient test
// (test_dp.cpp, test_zero1.cpp, ...; stage_test_util.h) measures the
// gradient against, checked on its own: it samples docs/SPEC.md's
// sequences, and its backward is the derivative of its forward.
//
//   meson test -C build reference
//
// ZF_TEST_PRINT=1 prints the measured values beside their tolerances.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "data.h"
#include "stages/gradient_check.h"
#include "stages/stage_test_util.h"

namespace zf {
namespace {

using test::gradient_shared;
using test::spec_sequence;
using test::tiny_shape;

TEST(GradientReference, SamplerIsSpecs) {
  // The stages sample through zf::Sampler, the reference through the rule
  // written out in stage_test_util.h: they agree on every sequence the sweep uses.
  const ref::Shape s = tiny_shape();
  Sampler sampler(gradient_shared().data, s.T, s.V);
  std::vector<int32_t> in, tgt, sin(s.T), stgt(s.T);
  for (int j = 0; j < test::kGradMaxSequences; ++j) {
    spec_sequence(gradient_shared().data, s.T, j, in, tgt);
    sampler.sequence(j, sin.data(), stgt.data());
    EXPECT_EQ(in, sin) << "sequence " << j;
    EXPECT_EQ(tgt, stgt) << "sequence " << j;
  }
}

// The reference's backward against central differences of its forward, in
// double, on one sequence (the batch loss is a plain mean of sequences), at
// three elements of every parameter tensor of both blocks.
//
// Error of (L(x+h) - L(x-h)) / 2h: truncation h^2/6 |L'''| plus rounding,
// about eps |L| / h = 1.1e-16 * 5.5 / h. With h = 1e-5 the rounding is
// ~1e-10; the truncation scales as h^2 and is largest on c_proj biases,
// whose gradients are the largest. Tolerance 1e-9 + 1e-6 |g| on
// |fd - backward| (ZF_TEST_PRINT=1 prints the measured value), while a wrong
// term of the backward is an error of the order of the gradient itself.
TEST(GradientReference, BackwardMatchesFiniteDifferences) {
  const ref::Shape s = tiny_shape();
  std::vector<int32_t> in, tgt;
  spec_sequence(gradient_shared().data, s.T, 0, in, tgt);
  ref::Params p = gradient_shared().init;
  ref::Params g = ref::zeros_like(s);
  ref::sequence_loss(s, p, in.data(), tgt.data(), &g);
  const double h = 1e-5;
  double worst = 0.0, worst_ratio = 0.0;
  int checked = 0;
  for (const auto& [name, shape] : ref::parameter_shapes(s)) {
    const size_t n = ref::numel(shape);
    // Three elements spread over the tensor (for c_attn one in each of q, k
    // and v); for wte in the rows of two tokens of the sequence and of one
    // absent from it (token 0: a zero gradient).
    std::vector<size_t> at = {n / 7, n / 3 + n / 11, 2 * n / 3 + n / 5};
    if (name == "wte.weight") at = {size_t(in[0]) * s.C + 5, size_t(in[s.T / 2]) * s.C + 17, 9};
    for (size_t i : at) {
      double& x = p[name][i];
      const double x0 = x;
      x = x0 + h;
      const double lp = ref::sequence_loss(s, p, in.data(), tgt.data());
      x = x0 - h;
      const double lm = ref::sequence_loss(s, p, in.data(), tgt.data());
      x = x0;
      const double fd = (lp - lm) / (2 * h), bw = g[name][i], tol = 1e-9 + 1e-6 * std::fabs(bw);
      const double err = std::fabs(fd - bw);
      worst = std::max(worst, err);
      worst_ratio = std::max(worst_ratio, err / tol);
      EXPECT_LE(err, tol) << name << "[" << i << "]: backward " << bw << ", finite differences " << fd;
      ++checked;
    }
  }
  // The token rows really were exercised (a nonzero gradient).
  EXPECT_NE(g["wte.weight"][size_t(in[0]) * s.C + 5], 0.0);
  if (test::print_measures())
    std::printf("finite differences: %d elements, worst |fd - backward| %.3g, worst error / tolerance %.3g\n",
                checked, worst, worst_ratio);
}

}  // namespace
}  // namespace zf
