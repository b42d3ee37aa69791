// test_gradients.cpp: the gradient every stage trains with has the right
// VALUE, checked against an independent double-precision reference of
// docs/SPEC.md's model (tests/stages/gpt_reference.h).
//
// The other stage tests compare stages with each other, bit for bit. That
// cannot see an error they share, and AdamW hides a wrong constant scale of
// the gradient (its update is nearly invariant to it): a backward scaled by
// 1/K instead of 1/(N K) trains almost the same. Here the objective is
// docs/SPEC.md's: the mean cross-entropy over every position of the step's
// global batch of G = N B K sequences.
//
// How the stage's gradient is read, with no hook inside the stages: one
// step with --clip 0 and --save. AdamW's first moment after step 1 is
//   m = 0 + (1 - beta1) (g - 0) = (1 - 0.9f) g     (adamw.cpp, float32)
// so g = m / (1 - 0.9f) up to one float32 rounding (2^-24 relative). The
// initial model comes from --save-init; docs/SPEC.md makes it the same in every
// stage and at every N.
//
// Checked for every stage (dp, zero1, zero2, zero3), N = 1, 2, 4 and
// K = 1, 2, in fp32 and in the bf16 recipe:
//   - each parameter tensor's gradient against the reference's;
//   - the logged grad_norm of step 0 against the reference's full norm, and
//     against the norm of the gradient read back from m;
//   - the logged loss of step 0 against the reference's loss.
// And the reference itself: its backward against central finite differences
// of its forward, on elements of every kind of parameter.
//
// ZF_TEST_PRINT=1 prints the measured errors the comments quote.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "stages/gpt_reference.h"
#include "data.h"
#include "dtype.h"
#include "safetensors.h"
#include "test_util.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

bool print_measures() { return std::getenv("ZF_TEST_PRINT") != nullptr; }

constexpr int kBatch = 2;                  // --batch: B = 2 exercises the batch dimension
constexpr int kMaxSequences = 4 * kBatch * 2;  // G at N = 4, K = 2

ref::Shape tiny_shape() {
  const ModelConfig m = model_preset("tiny");
  return ref::Shape{m.V, m.T, m.L, m.H, m.C};
}

// docs/SPEC.md's sampler, written out: sequence j is tokens [o, o + T + 1) with
// o = (j T) mod (n_tokens - T - 1); step 0 takes j = 0 .. G - 1.
void spec_sequence(const TokenData& data, int T, int64_t j, std::vector<int32_t>& in, std::vector<int32_t>& tgt) {
  const int64_t n = int64_t(data.tokens.size());
  const int64_t o = (j * T) % (n - T - 1);
  in.assign(data.tokens.begin() + o, data.tokens.begin() + o + T);
  tgt.assign(data.tokens.begin() + o + 1, data.tokens.begin() + o + T + 1);
}

// Every parameter of a safetensors file, as double, by name.
ref::Params read_params(const std::string& path, const std::string& prefix = "") {
  SafetensorsReader st(path);
  ref::Params p;
  std::vector<float> buf;
  for (const auto& [name, shape] : ref::parameter_shapes(tiny_shape())) {
    buf.resize(ref::numel(shape));
    st.read(prefix + name, shape, DType::f32, buf.data());
    p[name].assign(buf.begin(), buf.end());
  }
  return p;
}

// The bf16 recipe computes with the parameters rounded to bf16 (its float32
// master stays exact): the reference is taken at those values.
ref::Params rounded_to_bf16(ref::Params p) {
  for (auto& [name, v] : p)
    for (double& x : v) x = double(bf16_to_float(float_to_bf16(float(x))));
  return p;
}

// The reference on the initial model: for each G of the sweep, the mean loss
// over sequences 0 .. G-1 and its gradient (sequences are added one at a time,
// so the G of the sweep are prefixes).
struct Reference {
  std::map<int, double> loss;
  std::map<int, ref::Params> grad;
};

Reference compute_reference(const ref::Params& params, const TokenData& data) {
  const ref::Shape s = tiny_shape();
  Reference r;
  ref::Params sum = ref::zeros_like(s);
  double loss_sum = 0.0;
  std::vector<int32_t> in, tgt;
  for (int j = 0; j < kMaxSequences; ++j) {
    spec_sequence(data, s.T, j, in, tgt);
    loss_sum += ref::sequence_loss(s, params, in.data(), tgt.data(), &sum);
    const int G = j + 1, NK = G / kBatch;
    if (G % kBatch == 0 && (NK & (NK - 1)) == 0) {  // G = B, 2B, 4B, 8B: N K = 1, 2, 4, 8
      r.loss[G] = loss_sum / G;
      ref::Params mean = sum;
      for (auto& [name, v] : mean)
        for (double& x : v) x /= G;
      r.grad[G] = std::move(mean);
    }
  }
  return r;
}

// Everything the tests share, computed once: the initial model (from
// --save-init of a 0-step run), the corpus, and the reference at that model
// (fp32) and at its bf16 rounding.
struct Shared {
  std::string dir = test::temp_dir();
  ref::Params init;
  TokenData data = builtin_corpus();
  Reference fp32, bf16;

  Shared() {
    TrainConfig cfg = test::quiet_config("tiny", 1, kBatch, 0);
    cfg.save_init = dir + "/init.safetensors";
    run_training(cfg, train_data_parallel);
    init = read_params(cfg.save_init);
    fp32 = compute_reference(init, data);
    bf16 = compute_reference(rounded_to_bf16(init), data);
  }
  ~Shared() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

const Shared& shared() {
  static const Shared s;
  return s;
}

// ------------------------------------------------------------------ the reference itself

TEST(GradientReference, SamplerIsSpecs) {
  // The stages sample through zf::Sampler, the reference through the rule
  // written out above: they agree on every sequence the sweep uses.
  const ref::Shape s = tiny_shape();
  Sampler sampler(shared().data, s.T, s.V);
  std::vector<int32_t> in, tgt, sin(s.T), stgt(s.T);
  for (int j = 0; j < kMaxSequences; ++j) {
    spec_sequence(shared().data, s.T, j, in, tgt);
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
// ~1e-10; the truncation, measured, scales as h^2 (worst 7.4e-8 at h = 1e-4,
// 7.8e-10 at h = 1e-5, on c_proj biases, whose gradients are the largest,
// ~0.5). Tolerance 1e-9 + 1e-6 |g|: measured worst |fd - backward| 7.8e-10,
// while a wrong term of the backward is an error of the order of the
// gradient itself.
TEST(GradientReference, BackwardMatchesFiniteDifferences) {
  const ref::Shape s = tiny_shape();
  std::vector<int32_t> in, tgt;
  spec_sequence(shared().data, s.T, 0, in, tgt);
  ref::Params p = shared().init;
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
  if (print_measures())
    std::printf("finite differences: %d elements, worst |fd - backward| %.3g, worst error / tolerance %.3g\n",
                checked, worst, worst_ratio);
}

// ------------------------------------------------------------------ every stage against it

// Tolerances, stage (float32 compute) against the double reference.
//
// fp32: every operation of the float32 forward and backward rounds by up to
// 2^-24 = 6e-8 relative, and dot products of up to 4C = 256 terms, two
// blocks and the softmaxes accumulate that to ~1e-7..1e-6. Measured over the
// whole sweep (every stage, N = 1, 2, 4, K = 1, 2):
//   per tensor ||g - ref|| / ||ref||             worst 4.0e-7, tolerance 1e-5
//   per element |g - ref| / (|ref| + rms(ref))    worst 2.4e-6, tolerance 3e-5
//   (rms of the tensor as the floor: elements that are 0 in exact arithmetic,
//   as the k part of c_attn's bias, keep float32 noise of the tensor's scale)
//   step-0 grad_norm vs ||ref||, relative         worst 3.7e-8, tolerance 1e-6
//   step-0 loss vs the reference's, absolute      worst 3.7e-7, tolerance 5e-6
//   (one float32 ulp of a loss of 5.5 is 4.8e-7)
// bf16 recipe: the reference is taken at the bf16-rounded parameters the
// stage computes with; the compute is float32, but the gradient is stored in
// bf16 (8 significant bits: a rounding is up to 2^-8 = 3.9e-3 relative):
// rounded when a micro-step's backward is folded into it (K times) and at
// each of the N - 1 additions of the reduction, so up to 5 roundings here,
// which partly average out over a tensor:
//   per tensor, relative                          worst 3.2e-3, tolerance 2e-2
//   (the bound of 5 roundings, 5 x 3.9e-3)
//   per element, as above                         worst 2.6e-2, tolerance 1e-1
//   (partial sums larger than the total round by more than the total's 2^-8)
//   step-0 grad_norm vs ||ref||, relative         worst 2.2e-4, tolerance 5e-3
//   (at most the whole gradient's relative error: | |g| - |r| | <= |g - r|)
//   step-0 loss (float32 forward)                 worst 2.4e-7, tolerance 5e-6
// In both, the logged grad_norm against the norm of the g read back from m
// (the same float32 gradient, rounded once more into m): worst 3.7e-8,
// tolerance 1e-6.
// The errors these guard against are far larger: a backward scaled by 1/K
// instead of 1/(N K) makes g N times too large, a tensor's relative error
// N - 1 >= 1 (and the same for the norm).
struct Tolerances {
  double tensor, element, norm, loss;
};
constexpr Tolerances kFp32Tol{1e-5, 3e-5, 1e-6, 5e-6};
constexpr Tolerances kBf16Tol{2e-2, 1e-1, 5e-3, 5e-6};
constexpr double kNormVsMomentTol = 1e-6;

struct StageCase {
  const char* name;
  StageFn fn;
};
void PrintTo(const StageCase& c, std::ostream* os) { *os << c.name; }

class StageGradient : public ::testing::TestWithParam<StageCase> {};

TEST_P(StageGradient, MatchesTheReference) {
  const StageCase st = GetParam();
  const ref::Shape s = tiny_shape();
  const double one_minus_beta1 = double(1.0f - 0.9f);  // as adamw.cpp computes it, in float
  for (Precision prec : {Precision::fp32, Precision::bf16}) {
    const Reference& R = prec == Precision::fp32 ? shared().fp32 : shared().bf16;
    const Tolerances& tol = prec == Precision::fp32 ? kFp32Tol : kBf16Tol;
    for (int N : {1, 2, 4})
      for (int K : {1, 2}) {
        const int G = N * kBatch * K;
        SCOPED_TRACE(std::string(st.name) + " " + precision_name(prec) + " N=" + std::to_string(N) +
                     " K=" + std::to_string(K) + " (G=" + std::to_string(G) + ")");
        TrainConfig cfg = test::quiet_config("tiny", N, kBatch, 1);
        cfg.grad_accum = K;
        cfg.clip = 0.0f;  // m = (1 - beta1) g exactly, unscaled
        cfg.precision = prec;
        cfg.save = shared().dir + "/" + st.name + ".safetensors";
        const RunResult run = run_training(cfg, st.fn);
        const ref::Params m = read_params(cfg.save, "optim.m.");
        const ref::Params& want = R.grad.at(G);

        double sq_got = 0.0, sq_ref = 0.0, worst_tensor = 0.0, worst_element = 0.0;
        std::string worst_tensor_name, worst_element_at;
        for (const auto& [name, shape] : ref::parameter_shapes(s)) {
          const std::vector<double>& mm = m.at(name);
          const std::vector<double>& r = want.at(name);
          double sq_diff = 0.0, sq_r = 0.0;
          for (double x : r) sq_r += x * x;
          const double rms = std::sqrt(sq_r / double(r.size()));
          for (size_t i = 0; i < r.size(); ++i) {
            const double g = mm[i] / one_minus_beta1, d = g - r[i];
            sq_got += g * g;
            sq_diff += d * d;
            const double e = std::fabs(d) / (std::fabs(r[i]) + rms);
            if (e > worst_element) {
              worst_element = e;
              worst_element_at = name + "[" + std::to_string(i) + "]: got " + std::to_string(g) + ", want " +
                                 std::to_string(r[i]);
            }
          }
          sq_ref += sq_r;
          const double rel = std::sqrt(sq_diff / sq_r);
          if (rel > worst_tensor) worst_tensor = rel, worst_tensor_name = name;
        }
        const double ref_norm = std::sqrt(sq_ref), m_norm = std::sqrt(sq_got);
        ASSERT_EQ(run.ranks[0].grad_norms.size(), 1u);
        const double logged = run.ranks[0].grad_norms[0];
        const double norm_err = std::fabs(logged - ref_norm) / ref_norm;
        const double moment_err = std::fabs(logged - m_norm) / m_norm;
        const double loss_err = std::fabs(double(run.ranks[0].losses.at(0)) - R.loss.at(G));
        EXPECT_LE(worst_tensor, tol.tensor) << "worst tensor " << worst_tensor_name;
        EXPECT_LE(worst_element, tol.element) << worst_element_at;
        EXPECT_LE(norm_err, tol.norm) << "logged grad_norm " << logged << ", reference " << ref_norm;
        EXPECT_LE(moment_err, kNormVsMomentTol) << "logged grad_norm " << logged << ", from m " << m_norm;
        EXPECT_LE(loss_err, tol.loss) << "loss " << run.ranks[0].losses[0] << ", reference " << R.loss.at(G);
        if (print_measures())
          std::printf("%-5s %s N=%d K=%d: tensor %.3g (%s), element %.3g, norm %.3g, norm vs m %.3g, loss %.3g\n",
                      st.name, precision_name(prec), N, K, worst_tensor, worst_tensor_name.c_str(), worst_element,
                      norm_err, moment_err, loss_err);
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, StageGradient,
                         ::testing::Values(StageCase{"dp", train_data_parallel}, StageCase{"zero1", train_zero1},
                                           StageCase{"zero2", train_zero2}, StageCase{"zero3", train_zero3}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zf
