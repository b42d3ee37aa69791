// gradient_check.h: the stage tests' check of the gradient's value (each
// stage file's Gradient test), against the double-precision reference of
// gpt_reference.h. stage_test_util.h has the rest of what the stage suites
// share.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "data.h"
#include "dtype.h"
#include "safetensors.h"
#include "stages/gpt_reference.h"
#include "stages/stage_test_util.h"
#include "test_util.h"

namespace zf::test {

// ================================================================== gradients against a reference
//
// The gradient every stage trains with has the right VALUE, checked against
// an independent double-precision reference of docs/SPEC.md's model
// (gpt_reference.h). The other stage tests compare stages with each other,
// bit for bit. That cannot see an error they share, and AdamW hides a wrong
// constant scale of the gradient (its update is nearly invariant to it): a
// backward scaled by 1/K instead of 1/(N K) trains almost the same. Here the
// objective is docs/SPEC.md's: the mean cross-entropy over every position of
// the step's global batch of G = N B K sequences.
//
// How the stage's gradient is read, with no hook inside the stages: one
// step with --clip 0 and --save. AdamW's first moment after step 1 is
//   m = 0 + (1 - beta1) (g - 0) = (1 - 0.9f) g     (adamw.cpp, float32)
// so g = m / (1 - 0.9f) up to one float32 rounding (2^-24 relative). The
// initial model comes from --save-init; docs/SPEC.md makes it the same in every
// stage and at every N. The reference itself is checked in test_reference.cpp.

constexpr int kGradBatch = 2;                          // --batch: B = 2 exercises the batch dimension
constexpr int kGradMaxSequences = 4 * kGradBatch * 2;  // G at N = 4, K = 2

inline ref::Shape tiny_shape() {
  const ModelConfig m = model_preset("tiny");
  return ref::Shape{m.V, m.T, m.L, m.H, m.C};
}

// docs/SPEC.md's sampler, written out: sequence j is tokens [o, o + T + 1) with
// o = (j T) mod (n_tokens - T - 1); step 0 takes j = 0 .. G - 1.
inline void spec_sequence(const TokenData& data, int T, int64_t j, std::vector<int32_t>& in,
                          std::vector<int32_t>& tgt) {
  const int64_t n = int64_t(data.tokens.size());
  const int64_t o = (j * T) % (n - T - 1);
  in.assign(data.tokens.begin() + o, data.tokens.begin() + o + T);
  tgt.assign(data.tokens.begin() + o + 1, data.tokens.begin() + o + T + 1);
}

// Every parameter of a safetensors file, as double, by name.
inline ref::Params read_params(const std::string& path, const std::string& prefix = "") {
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
inline ref::Params rounded_to_bf16(ref::Params p) {
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

inline Reference compute_reference(const ref::Params& params, const TokenData& data) {
  const ref::Shape s = tiny_shape();
  Reference r;
  ref::Params sum = ref::zeros_like(s);
  double loss_sum = 0.0;
  std::vector<int32_t> in, tgt;
  for (int j = 0; j < kGradMaxSequences; ++j) {
    spec_sequence(data, s.T, j, in, tgt);
    loss_sum += ref::sequence_loss(s, params, in.data(), tgt.data(), &sum);
    const int G = j + 1, NK = G / kGradBatch;
    if (G % kGradBatch == 0 && (NK & (NK - 1)) == 0) {  // G = B, 2B, 4B, 8B: N K = 1, 2, 4, 8
      r.loss[G] = loss_sum / G;
      ref::Params mean = sum;
      for (auto& [name, v] : mean)
        for (double& x : v) x /= G;
      r.grad[G] = std::move(mean);
    }
  }
  return r;
}

// What the gradient tests share, computed once per test program: the
// initial model (from --save-init of a 0-step run) and the corpus; and,
// when first asked for, the reference at that model (fp32) and at its bf16
// rounding.
struct GradientShared {
  std::string dir = temp_dir();
  ref::Params init;
  TokenData data = builtin_corpus();

  GradientShared() {
    TrainConfig cfg = quiet_config("tiny", 1, kGradBatch, 0);
    cfg.save_init = dir + "/init.safetensors";
    run_training(cfg, train_data_parallel);
    init = read_params(cfg.save_init);
  }
  ~GradientShared() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

inline const GradientShared& gradient_shared() {
  static const GradientShared s;
  return s;
}

struct GradientReferences {
  Reference fp32 = compute_reference(gradient_shared().init, gradient_shared().data);
  Reference bf16 = compute_reference(rounded_to_bf16(gradient_shared().init), gradient_shared().data);
};

inline const GradientReferences& gradient_references() {
  static const GradientReferences r;
  return r;
}

// Tolerances, stage (float32 compute) against the double reference.
//
// fp32: every operation of the float32 forward and backward rounds by up to
// 2^-24 = 6e-8 relative, and dot products of up to 4C = 256 terms, two
// blocks and the softmaxes accumulate that to ~1e-7..1e-6. Over the whole
// sweep (every stage, N = 1, 2, 4, K = 1, 2; ZF_TEST_PRINT=1 prints the
// measured values):
//   per tensor ||g - ref|| / ||ref||             tolerance 1e-5
//   per element |g - ref| / (|ref| + rms(ref))    tolerance 3e-5
//   (rms of the tensor as the floor: elements that are 0 in exact arithmetic,
//   as the k part of c_attn's bias, keep float32 noise of the tensor's scale)
//   step-0 grad_norm vs ||ref||, relative         tolerance 1e-6
//   step-0 loss vs the reference's, absolute      tolerance 5e-6
//   (one float32 ulp of a loss of 5.5 is 4.8e-7)
// bf16 recipe: the reference is taken at the bf16-rounded parameters the
// stage computes with; the compute is float32, but the gradient is stored in
// bf16 (8 significant bits: a rounding is up to 2^-8 = 3.9e-3 relative):
// rounded when a micro-step's backward is folded into it (K times) and at
// each of the N - 1 additions of the reduction, so up to 5 roundings here,
// which partly average out over a tensor:
//   per tensor, relative                          tolerance 2e-2
//   (the bound of 5 roundings, 5 x 3.9e-3)
//   per element, as above                         tolerance 1e-1
//   (partial sums larger than the total round by more than the total's 2^-8)
//   step-0 grad_norm vs ||ref||, relative         tolerance 5e-3
//   (at most the whole gradient's relative error: | |g| - |r| | <= |g - r|)
//   step-0 loss (float32 forward)                 tolerance 5e-6
// In both, the logged grad_norm against the norm of the g read back from m
// (the same float32 gradient, rounded once more into m): tolerance 1e-6.
// The errors these guard against are far larger: a backward scaled by 1/K
// instead of 1/(N K) makes g N times too large, a tensor's relative error
// N - 1 >= 1 (and the same for the norm).
struct GradTolerances {
  double tensor, element, norm, loss;
};
constexpr GradTolerances kGradFp32Tol{1e-5, 3e-5, 1e-6, 5e-6};
constexpr GradTolerances kGradBf16Tol{2e-2, 1e-1, 5e-3, 5e-6};
constexpr double kNormVsMomentTol = 1e-6;

// Checked for the stage at N = 1, 2, 4 and K = 1, 2, in fp32 and in the
// bf16 recipe:
//   - each parameter tensor's gradient against the reference's;
//   - the logged grad_norm of step 0 against the reference's full norm, and
//     against the norm of the gradient read back from m;
//   - the logged loss of step 0 against the reference's loss.
// recompute: the --recompute the stage runs with (test_recompute.cpp); the
// reference and the tolerances are the same, the arithmetic being the same.
inline void expect_gradient_matches_reference(const char* stage, const StageFn& fn,
                                              Recompute recompute = Recompute::none) {
  const GradientShared& shared = gradient_shared();
  const GradientReferences& refs = gradient_references();
  const ref::Shape s = tiny_shape();
  const double one_minus_beta1 = double(1.0f - 0.9f);  // as adamw.cpp computes it, in float
  for (Precision prec : {Precision::fp32, Precision::bf16}) {
    const Reference& R = prec == Precision::fp32 ? refs.fp32 : refs.bf16;
    const GradTolerances& tol = prec == Precision::fp32 ? kGradFp32Tol : kGradBf16Tol;
    for (int N : {1, 2, 4})
      for (int K : {1, 2}) {
        const int G = N * kGradBatch * K;
        SCOPED_TRACE(std::string(stage) + " " + precision_name(prec) + " N=" + std::to_string(N) +
                     " K=" + std::to_string(K) + " (G=" + std::to_string(G) + ")");
        TrainConfig cfg = quiet_config("tiny", N, kGradBatch, 1);
        cfg.grad_accum = K;
        cfg.clip = 0.0f;  // m = (1 - beta1) g exactly, unscaled
        cfg.precision = prec;
        cfg.recompute = recompute;
        cfg.save = shared.dir + "/" + stage + ".safetensors";
        const RunResult run = run_training(cfg, fn);
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
                      stage, precision_name(prec), N, K, worst_tensor, worst_tensor_name.c_str(), worst_element,
                      norm_err, moment_err, loss_err);
      }
  }
}

}  // namespace zf::test
