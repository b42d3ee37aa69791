// kernels_ref.h: what the CPU kernel tests share (test_kernels.cpp,
// test_kernels_softmax.cpp): random inputs, finite differences, the
// tolerance check, and the double-precision references of every op,
// written as plainly as possible. How the tests use them is said at the top
// of test_kernels.cpp.
#pragma once

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

namespace kernels_test {

using vf = std::vector<float>;
using vd = std::vector<double>;

constexpr double kU = 1.0 / (1 << 24);  // float32 unit roundoff, 2^-24 ~ 6e-8
constexpr double kFdStep = 1e-4;        // finite-difference step (see the header)

// ---------------------------------------------------------------------------
// Helpers

inline vf uniform(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  vf v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n, int V) {
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline vd to_double(const vf& v) { return vd(v.begin(), v.end()); }

inline double max_abs(const vd& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// |got[i] - want[i]| <= tol for every i; reports the worst element.
inline ::testing::AssertionResult all_near(const vf& got, const vd& want, double tol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  size_t worst = 0;
  double worst_err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double e = std::abs(double(got[i]) - want[i]);
    if (std::isnan(e)) {
      worst_err = e, worst = i;
      break;
    }
    if (e > worst_err) worst_err = e, worst = i;
  }
  if (worst_err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << worst << ": got " << got[worst] << ", want " << want[worst] << " (error "
         << worst_err << " > tolerance " << tol << ")";
}

// A gradient buffer that started at g0: compares (got - g0) with want, within
// rtol of want's largest magnitude.
inline ::testing::AssertionResult grad_near(const vf& got, const vf& g0, const vd& want, double rtol) {
  vd want_total(want.size());
  for (size_t i = 0; i < want.size(); ++i) want_total[i] = double(g0[i]) + want[i];
  // Compare the totals: the float += of g0 adds at most u |g0 + want| to the error.
  double scale = max_abs(want);
  double tol = rtol * scale + 2 * kU * (max_abs(to_double(g0)) + scale);
  return all_near(got, want_total, tol);
}

// Central differences of L() with respect to x[i], for i in idx (all when empty).
inline vd numeric_grad(vd& x, const std::function<double()>& L, const std::vector<size_t>& idx = {}) {
  vd g(x.size(), 0.0);
  auto one = [&](size_t i) {
    double keep = x[i];
    x[i] = keep + kFdStep;
    double lp = L();
    x[i] = keep - kFdStep;
    double lm = L();
    x[i] = keep;
    g[i] = (lp - lm) / (2 * kFdStep);
  };
  if (idx.empty())
    for (size_t i = 0; i < x.size(); ++i) one(i);
  else
    for (size_t i : idx) one(i);
  return g;
}

inline double dot(const vd& a, const vd& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ---------------------------------------------------------------------------
// Double-precision references: the definitions, written as plainly as possible.

inline vd ref_encoder(const std::vector<int32_t>& tok, const vd& wte, const vd& wpe, int B, int T, int C) {
  vd out(size_t(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        out[(b * T + t) * C + c] = wte[tok[b * T + t] * C + c] + wpe[t * C + c];
  return out;
}

inline vd ref_layernorm(const vd& x, const vd& w, const vd& bias, int N, int C) {
  vd out(size_t(N) * C);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    for (int c = 0; c < C; ++c)
      out[n * C + c] = (x[n * C + c] - m) / std::sqrt(v + 1e-5) * w[c] + bias[c];
  }
  return out;
}

// out = x @ W^T + bias; abssum (if given) gets sum |terms| per output, for error bounds.
inline vd ref_matmul(const vd& x, const vd& W, const vd* bias, int N, int IC, int OC,
              vd* abssum = nullptr) {
  vd out(size_t(N) * OC);
  if (abssum) abssum->assign(out.size(), 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias ? (*bias)[o] : 0.0, a = std::abs(s);
      for (int i = 0; i < IC; ++i) {
        s += x[size_t(n) * IC + i] * W[size_t(o) * IC + i];
        a += std::abs(x[size_t(n) * IC + i] * W[size_t(o) * IC + i]);
      }
      out[size_t(n) * OC + o] = s;
      if (abssum) (*abssum)[size_t(n) * OC + o] = a;
    }
  return out;
}

inline vd ref_attention(const vd& qkv, int B, int T, int C, int H, vd* att_out = nullptr) {
  const int hs = C / H;
  const double scale = 1.0 / std::sqrt(double(hs));
  vd out(size_t(B) * T * C, 0.0);
  if (att_out) att_out->assign(size_t(B) * H * T * T, 0.0);
  vd p(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        const double* q = &qkv[(size_t(b) * T + i) * 3 * C + h * hs];
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          const double* k = &qkv[(size_t(b) * T + j) * 3 * C + C + h * hs];
          double s = 0;
          for (int d = 0; d < hs; ++d) s += q[d] * k[d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j <= i; ++j) {
          p[j] /= sum;
          if (att_out) (*att_out)[((size_t(b) * H + h) * T + i) * T + j] = p[j];
          const double* v = &qkv[(size_t(b) * T + j) * 3 * C + 2 * C + h * hs];
          for (int d = 0; d < hs; ++d) out[(size_t(b) * T + i) * C + h * hs + d] += p[j] * v[d];
        }
      }
  return out;
}

inline double ref_gelu(double x) {
  return 0.5 * x *
         (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

// losses[n] = -log softmax(logits[n])[targets[n]]; lse[n] = log sum_v exp(logits[n, v])
// and probs optionally.
inline vd ref_softmax_ce(const vd& logits, const std::vector<int32_t>& targets, int N, int V,
                  vd* lse = nullptr, vd* probs = nullptr) {
  vd losses(N);
  if (lse) lse->resize(N);
  if (probs) probs->resize(size_t(N) * V);
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, sum = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, logits[n * V + v]);
    for (int v = 0; v < V; ++v) sum += std::exp(logits[n * V + v] - mx);
    if (lse) (*lse)[n] = mx + std::log(sum);
    if (probs)
      for (int v = 0; v < V; ++v) (*probs)[n * V + v] = std::exp(logits[n * V + v] - mx) / sum;
    losses[n] = -(logits[n * V + targets[n]] - mx - std::log(sum));
  }
  return losses;
}

}  // namespace kernels_test
