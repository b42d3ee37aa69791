// test_kernels.cpp: every kernel of kernels.h against an independent
// double-precision computation, and every backward against finite differences.
//
//   build/tests/test_kernels                       (all of them)
//   build/tests/test_kernels --gtest_filter='*Attention*'
//
// How each kernel is checked:
// - forward: the float kernel against a direct double computation written
//   here with the simplest loops (no BLAS, nothing shared with kernels_cpu.cpp);
// - backward: the scalar objective L = sum(w * out), w random, is computed by
//   the double reference forward; its central finite differences (step 1e-4 in
//   double: truncation error ~ h^2 f'''/6 ~ 1e-9, rounding ~ 1e-16 L / h
//   ~ 1e-11, so the reference gradient is good to ~1e-8) are compared with the
//   kernel's gradient;
// - accumulation: every gradient buffer starts from random values g0 and the
//   test compares (result - g0), so a backward that overwrites (=) instead of
//   accumulating (+=) fails by O(1).
//
// Tolerances come from float rounding, with u = 2^-24 the float32 unit
// roundoff: a float sum of K terms is off by at most ~K u of the sum of the
// terms' magnitudes. Most are taken relative to the size of the tensor
// compared (its largest |value|); matmul uses that bound per element, GELU a
// per-element relative one. A bug (a missing or wrong term) shows up as an
// O(1) relative error, orders of magnitude above every tolerance here.
//
// Shapes are small and odd (C = 12 is not a multiple of the kernels' 16 lanes,
// IC/OC not multiples of 8) so that the vector tails run; one larger shape per
// matrix kernel runs the BLAS paths with real blocking and strides.
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "blas.h"
#include "cpu/kernels_ref.h"
#include "dtype.h"
#include "kernels.h"

namespace {

using namespace kernels_test;

// ---------------------------------------------------------------------------
// Encoder

TEST(Kernels, EncoderForwardBackward) {
  const int B = 2, T = 5, C = 12, V = 11;
  std::mt19937 rng(1);
  vf wte = uniform(rng, size_t(V) * C), wpe = uniform(rng, size_t(T) * C);
  auto tok = random_tokens(rng, size_t(B) * T, V);
  tok[7] = tok[2];  // a token used twice: its gradient rows must add up

  vf out(size_t(B) * T * C);
  zf::encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  // One float addition per element: within u of the result.
  vd want = ref_encoder(tok, to_double(wte), to_double(wpe), B, T, C);
  EXPECT_TRUE(all_near(out, want, 2 * kU * max_abs(want)));

  vf w = uniform(rng, out.size());
  vf dwte0 = uniform(rng, wte.size()), dwpe0 = uniform(rng, wpe.size());
  vf dwte = dwte0, dwpe = dwpe0;
  zf::encoder_backward(dwte.data(), dwpe.data(), w.data(), tok.data(), B, T, C);

  vd wte_d = to_double(wte), wpe_d = to_double(wpe), w_d = to_double(w);
  auto L = [&] { return dot(w_d, ref_encoder(tok, wte_d, wpe_d, B, T, C)); };
  // The gradient is a sum of at most B*T = 10 floats: 10 u relative; 1e-5 leaves room.
  EXPECT_TRUE(grad_near(dwte, dwte0, numeric_grad(wte_d, L), 1e-5));
  EXPECT_TRUE(grad_near(dwpe, dwpe0, numeric_grad(wpe_d, L), 1e-5));
}

// ---------------------------------------------------------------------------
// LayerNorm

void check_layernorm(int N, int C, float offset, uint32_t seed) {
  SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) +
               " offset=" + std::to_string(offset));
  std::mt19937 rng(seed);
  vf x = uniform(rng, size_t(N) * C, offset - 1.0f, offset + 1.0f);
  vf wt = uniform(rng, C, 0.5f, 1.5f), bias = uniform(rng, C);
  vf out(x.size()), mean(N), rstd(N);
  zf::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), wt.data(), bias.data(), N,
                        C);
  vd x_d = to_double(x), wt_d = to_double(wt), bias_d = to_double(bias);
  vd want = ref_layernorm(x_d, wt_d, bias_d, N, C);
  // Sums of C terms for mean and variance, then a few ops per element: ~(2C + 10) u
  // relative. The float inputs at |offset| carry no more error than that: x - mean is
  // exact to u |offset| / std, which the offset test keeps at 1e3 * u ~ 6e-5.
  double rel = (2 * C + 10) * kU + std::abs(offset) * 4 * kU;
  EXPECT_TRUE(all_near(out, want, 4 * rel * max_abs(want)));
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x_d[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x_d[n * C + c] - m) * (x_d[n * C + c] - m);
    v /= C;
    EXPECT_NEAR(mean[n], m, 4 * C * kU * (std::abs(offset) + 1));
    EXPECT_NEAR(rstd[n], 1 / std::sqrt(v + 1e-5), 4 * rel / std::sqrt(v + 1e-5));
  }

  vf dout = uniform(rng, x.size());
  vf dx0 = uniform(rng, x.size()), dw0 = uniform(rng, C), db0 = uniform(rng, C);
  vf dx = dx0, dw = dw0, db = db0;
  zf::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), wt.data(),
                         mean.data(), rstd.data(), N, C);
  vd dout_d = to_double(dout);
  auto L = [&] { return dot(dout_d, ref_layernorm(x_d, wt_d, bias_d, N, C)); };
  // Row sums of C terms and column sums of N terms, a handful of ops each:
  // ~(C + N) u ~ 1e-5 relative at most here; 1e-4 leaves the margin, plus the
  // forward's relative error for the offset case (xhat inherits it).
  double rtol = 1e-4 + 4 * rel;
  EXPECT_TRUE(grad_near(dx, dx0, numeric_grad(x_d, L), rtol));
  EXPECT_TRUE(grad_near(dw, dw0, numeric_grad(wt_d, L), rtol));
  EXPECT_TRUE(grad_near(db, db0, numeric_grad(bias_d, L), rtol));
}

TEST(Kernels, LayerNorm) {
  check_layernorm(10, 12, 0.0f, 2);  // C below one 16-lane block: only the tail
  check_layernorm(7, 37, 0.0f, 3);   // two blocks and a tail
  // Rows with mean 1000 and spread 1: a one-pass variance (E[x^2] - mean^2) in
  // float would lose ~1e6 u ~ 6% of the variance here and fail.
  check_layernorm(6, 40, 1000.0f, 4);
}

// ---------------------------------------------------------------------------
// Matmul

// Checks forward against the double product with the standard bound for a
// float sum of K terms (Higham, Accuracy and Stability, Thm 3.5):
// |error| <= gamma_K * sum |terms|, gamma_K = K u / (1 - K u), any order, FMA or not.
double gamma(int K) { return K * kU / (1 - K * kU); }

void check_matmul(int N, int IC, int OC, bool with_bias, bool with_dinp, bool full_fd,
                  uint32_t seed) {
  SCOPED_TRACE("N=" + std::to_string(N) + " IC=" + std::to_string(IC) +
               " OC=" + std::to_string(OC) + (with_bias ? " bias" : " no bias") +
               (with_dinp ? " dinp" : " no dinp"));
  std::mt19937 rng(seed);
  vf x = uniform(rng, size_t(N) * IC), W = uniform(rng, size_t(OC) * IC), bias = uniform(rng, OC);
  vf out(size_t(N) * OC, 12345.0f);  // garbage: the forward must overwrite it
  zf::matmul_forward(out.data(), x.data(), W.data(), with_bias ? bias.data() : nullptr, N, IC, OC);
  vd x_d = to_double(x), W_d = to_double(W), bias_d = to_double(bias), abssum;
  vd want = ref_matmul(x_d, W_d, with_bias ? &bias_d : nullptr, N, IC, OC, &abssum);
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_NEAR(out[i], want[i], gamma(IC + 1) * abssum[i] + 1e-30) << "out[" << i << "]";

  vf dout = uniform(rng, out.size());
  vf dx0 = uniform(rng, x.size()), dW0 = uniform(rng, W.size()), db0 = uniform(rng, OC);
  vf dx = dx0, dW = dW0, db = db0;
  zf::matmul_backward(with_dinp ? dx.data() : nullptr, dW.data(), with_bias ? db.data() : nullptr,
                      dout.data(), x.data(), W.data(), N, IC, OC);
  if (!with_dinp) {
    EXPECT_EQ(dx, dx0);
  }
  if (!with_bias) {
    EXPECT_EQ(db, db0);
  }

  // Against the direct double formulas, with the same bound (K terms plus g0).
  vd dout_d = to_double(dout);
  for (int n = 0; n < N && with_dinp; ++n)
    for (int i = 0; i < IC; ++i) {
      double s = dx0[n * IC + i], a = std::abs(s);
      for (int o = 0; o < OC; ++o) {
        s += dout_d[size_t(n) * OC + o] * W_d[size_t(o) * IC + i];
        a += std::abs(dout_d[size_t(n) * OC + o] * W_d[size_t(o) * IC + i]);
      }
      ASSERT_NEAR(dx[n * IC + i], s, gamma(OC + 1) * a) << "dinp[" << n << "," << i << "]";
    }
  for (int o = 0; o < OC; ++o) {
    for (int i = 0; i < IC; ++i) {
      double s = dW0[o * IC + i], a = std::abs(s);
      for (int n = 0; n < N; ++n) {
        s += dout_d[size_t(n) * OC + o] * x_d[size_t(n) * IC + i];
        a += std::abs(dout_d[size_t(n) * OC + o] * x_d[size_t(n) * IC + i]);
      }
      ASSERT_NEAR(dW[o * IC + i], s, gamma(N + 1) * a) << "dweight[" << o << "," << i << "]";
    }
    if (with_bias) {
      double s = db0[o], a = std::abs(s);
      for (int n = 0; n < N; ++n)
        s += dout_d[size_t(n) * OC + o], a += std::abs(dout_d[n * OC + o]);
      ASSERT_NEAR(db[o], s, gamma(N + 1) * a) << "dbias[" << o << "]";
    }
  }

  // And against finite differences of L = sum(dout * out): every entry on the
  // small shape, a random sample on the large one. The objective is linear in
  // each input, so the differences are exact up to rounding; 1e-4 of the
  // gradient's scale covers float sums of up to ~1000 terms (1000 u = 6e-5).
  auto L = [&] {
    return dot(dout_d, ref_matmul(x_d, W_d, with_bias ? &bias_d : nullptr, N, IC, OC));
  };
  auto sample = [&](size_t n) {
    std::vector<size_t> idx;
    if (full_fd) return idx;  // empty: all
    std::uniform_int_distribution<size_t> d(0, n - 1);
    for (int i = 0; i < 12; ++i) idx.push_back(d(rng));
    return idx;
  };
  auto check_fd = [&](const vf& got, const vf& g0, vd& param, const char* what) {
    auto idx = sample(param.size());
    vd fd = numeric_grad(param, L, idx);
    if (idx.empty())
      for (size_t i = 0; i < fd.size(); ++i) idx.push_back(i);
    double scale = max_abs(fd);
    for (size_t i : idx)
      EXPECT_NEAR(double(got[i]) - g0[i], fd[i], 1e-4 * scale + 2 * kU * std::abs(g0[i]))
          << what << "[" << i << "]";
  };
  if (with_dinp) check_fd(dx, dx0, x_d, "dinp");
  check_fd(dW, dW0, W_d, "dweight");
  if (with_bias) check_fd(db, db0, bias_d, "dbias");
}

TEST(Kernels, MatmulSmall) {
  check_matmul(10, 13, 11, true, true, true, 5);
  check_matmul(10, 13, 11, false, false, true, 6);  // bias, dinp and dbias null
}

// IC = 0: the product is empty, so out is the bias (or 0) and the backward
// adds only dbias; N = 0 or OC = 0: nothing is touched. (BLAS itself refuses
// a leading dimension of 0, which the kernel must not pass it.)
TEST(Kernels, MatmulEmptySizes) {
  const int N = 3, OC = 4;
  std::vector<float> out(N * OC, -7.0f), bias = {1, 2, 3, 4}, dout(N * OC), db(OC, 0.5f);
  for (int i = 0; i < N * OC; ++i) dout[i] = float(i);
  float dummy = 0.0f;
  zf::matmul_forward(out.data(), &dummy, &dummy, bias.data(), N, 0, OC);
  for (int i = 0; i < N * OC; ++i) EXPECT_EQ(out[i], bias[i % OC]) << i;
  zf::matmul_forward(out.data(), &dummy, &dummy, nullptr, N, 0, OC);
  for (int i = 0; i < N * OC; ++i) EXPECT_EQ(out[i], 0.0f) << i;
  zf::matmul_backward(nullptr, &dummy, db.data(), dout.data(), &dummy, &dummy, N, 0, OC);
  for (int o = 0; o < OC; ++o) EXPECT_EQ(db[o], 0.5f + float(o) + float(OC + o) + float(2 * OC + o)) << o;
  std::vector<float> untouched(N * OC, -7.0f);
  zf::matmul_forward(untouched.data(), &dummy, &dummy, bias.data(), 0, 5, OC);
  zf::matmul_forward(untouched.data(), &dummy, &dummy, bias.data(), N, 5, 0);
  for (float v : untouched) EXPECT_EQ(v, -7.0f);
}

TEST(Kernels, MatmulLarge) {
  // Larger than OpenBLAS's register and cache blocks in every dimension.
  check_matmul(300, 261, 190, true, true, false, 7);
}

// ---------------------------------------------------------------------------
// Attention

void check_attention(int B, int T, int C, int H, bool full_fd, uint32_t seed) {
  SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
               " H=" + std::to_string(H));
  std::mt19937 rng(seed);
  const int hs = C / H;
  vf qkv = uniform(rng, size_t(B) * T * 3 * C, -2.0f, 2.0f);  // wide enough for peaked softmaxes
  vf out(size_t(B) * T * C, 12345.0f), att(size_t(B) * H * T * T, 12345.0f);
  zf::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);

  vd qkv_d = to_double(qkv), att_want;
  vd want = ref_attention(qkv_d, B, T, C, H, &att_want);
  // Scores: sums of hs products; softmax: T terms and exp to a few ulp; output:
  // sums of T terms. Each stage adds ~K u of its scale: (hs + 2T + 10) u, x4 margin.
  double rel = 4 * (hs + 2 * T + 10) * kU;
  EXPECT_TRUE(all_near(att, att_want, rel));  // probabilities: scale 1
  EXPECT_TRUE(all_near(out, want, rel * max_abs(want)));
  for (int bh = 0; bh < B * H; ++bh)
    for (int i = 0; i < T; ++i) {
      const float* row = &att[(size_t(bh) * T + i) * T];
      double sum = 0;
      for (int j = 0; j < T; ++j) sum += row[j];
      EXPECT_NEAR(sum, 1.0, (T + 4) * kU) << "softmax row sums to 1 (T float roundings)";
      for (int j = i + 1; j < T; ++j) ASSERT_EQ(row[j], 0.0f) << "above the diagonal";
    }

  vf dout = uniform(rng, out.size());
  vf dqkv0 = uniform(rng, qkv.size()), dqkv = dqkv0;
  vf scratch(zf::attention_scratch_floats(T), 12345.0f);
  zf::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                         H);
  vd dout_d = to_double(dout);
  auto L = [&] { return dot(dout_d, ref_attention(qkv_d, B, T, C, H)); };
  std::vector<size_t> idx;
  if (!full_fd) {  // a sample from each of q, k and v, all batches and heads
    std::uniform_int_distribution<int> bd(0, B - 1), td(0, T - 1), cd(0, C - 1);
    for (int part = 0; part < 3; ++part)
      for (int i = 0; i < 16; ++i)
        idx.push_back((size_t(bd(rng)) * T + td(rng)) * 3 * C + part * C + cd(rng));
  }
  vd fd = numeric_grad(qkv_d, L, idx);
  if (idx.empty())
    for (size_t i = 0; i < fd.size(); ++i) idx.push_back(i);
  // The chain of four products and a softmax backward, each a float sum of up
  // to T or hs terms: ~(2T + 2hs) u of the gradient's scale; 1e-4 covers T=97
  // (~250 u = 1.5e-5) with margin and is still far below any real mistake.
  double scale = max_abs(fd);
  for (size_t i : idx)
    EXPECT_NEAR(double(dqkv[i]) - dqkv0[i], fd[i], 1e-4 * scale + 2 * kU * std::abs(dqkv0[i]))
        << "dqkv[" << i << "] (b,t = " << i / (3 * C) << ", channel " << i % (3 * C) << ")";
}

TEST(Kernels, AttentionSmall) { check_attention(2, 5, 12, 3, true, 8); }

TEST(Kernels, AttentionLarge) {
  // Odd T, head size 30, leading dimension 3C = 360: the strided BLAS paths.
  check_attention(2, 97, 120, 4, false, 9);
}

TEST(Kernels, AttentionIsCausal) {
  // Changing q, k and v at position s must leave every output before s exactly
  // unchanged (the masked probabilities are exactly 0), and change those at s.
  const int B = 1, T = 9, C = 12, H = 3;
  std::mt19937 rng(10);
  vf qkv = uniform(rng, size_t(B) * T * 3 * C);
  vf out(size_t(B) * T * C), att(size_t(B) * H * T * T);
  zf::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  for (int s = 1; s < T; ++s) {
    vf qkv2 = qkv;
    for (int c = 0; c < 3 * C; ++c) qkv2[s * 3 * C + c] += 0.5f;
    vf out2(out.size()), att2(att.size());
    zf::attention_forward(out2.data(), att2.data(), qkv2.data(), B, T, C, H);
    for (int t = 0; t < s; ++t)
      for (int c = 0; c < C; ++c)
        ASSERT_EQ(out2[t * C + c], out[t * C + c]) << "t=" << t << " s=" << s;
    bool changed = false;
    for (int c = 0; c < C; ++c) changed |= out2[s * C + c] != out[s * C + c];
    EXPECT_TRUE(changed) << "position " << s << " must see itself";
  }
}

TEST(Kernels, ConcurrentCallsAgree) {
  // Rank threads call the kernels at once; no hidden shared state may mix them up.
  const int B = 2, T = 33, C = 48, H = 4, R = 4;
  int blas_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);  // as the trainers run it
  std::vector<vf> qkv, out(R), att(R), dqkv(R);
  std::mt19937 rng(11);
  for (int r = 0; r < R; ++r) qkv.push_back(uniform(rng, size_t(B) * T * 3 * C));
  vf dout = uniform(rng, size_t(B) * T * C);
  auto run = [&](int r) {
    out[r].assign(size_t(B) * T * C, 0.0f);
    att[r].assign(size_t(B) * H * T * T, 0.0f);
    dqkv[r].assign(qkv[r].size(), 0.0f);
    vf scratch(zf::attention_scratch_floats(T));
    for (int rep = 0; rep < 20; ++rep) {
      zf::attention_forward(out[r].data(), att[r].data(), qkv[r].data(), B, T, C, H);
      std::fill(dqkv[r].begin(), dqkv[r].end(), 0.0f);
      zf::attention_backward(dqkv[r].data(), scratch.data(), dout.data(), qkv[r].data(),
                             att[r].data(), B, T, C, H);
    }
  };
  std::vector<vf> serial_out(R), serial_dqkv(R);
  for (int r = 0; r < R; ++r) {
    run(r);
    serial_out[r] = out[r];
    serial_dqkv[r] = dqkv[r];
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) threads.emplace_back(run, r);
  for (auto& t : threads) t.join();
  openblas_set_num_threads(blas_threads);
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(out[r], serial_out[r]) << "rank " << r;
    EXPECT_EQ(dqkv[r], serial_dqkv[r]) << "rank " << r;
  }
}

// An explicit OPENBLAS_NUM_THREADS caps what the trainers ask for (the TSan
// run of scripts/sanitize.sh relies on it: one BLAS thread per call).
TEST(Blas, SetThreadsKeepsToOpenblasNumThreads) {
  const int before = openblas_get_num_threads();
  const char* env = std::getenv("OPENBLAS_NUM_THREADS");
  const std::string saved = env ? env : "";
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  zf::blas_set_threads(4);
  const int capped = openblas_get_num_threads();
  if (env) setenv("OPENBLAS_NUM_THREADS", saved.c_str(), 1); else unsetenv("OPENBLAS_NUM_THREADS");
  openblas_set_num_threads(before);
  EXPECT_EQ(capped, 1);
}

// ---------------------------------------------------------------------------
// GELU

TEST(Kernels, Gelu) {
  std::mt19937 rng(12);
  vf x = uniform(rng, 203, -6.0f, 6.0f);  // 203: vector blocks and a tail
  // Points where a careless exp overflows or a tanh saturates.
  for (float s :
       {0.0f, -0.0f, 1e-20f, -1e-20f, 9.0f, -9.0f, 20.0f, -20.0f, 100.0f, -100.0f, 1e4f, -1e4f})
    x.push_back(s);
  vf out(x.size());
  zf::gelu_forward(out.data(), x.data(), x.size());
  vd want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = ref_gelu(x[i]);
  // A dozen float ops and an exp good to a few ulp: relative error ~20 u per
  // element, measured against each element's own size. Plus the reference's
  // own error: for x << 0, 1 + tanh(u) cancels to ~1e-16 absolute in double
  // (it gives 0 where the true value is 1e-28).
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(out[i], want[i], 32 * kU * std::abs(want[i]) + 4e-16 * std::abs(x[i]))
        << "gelu(" << x[i] << ")";

  // Backward on the random points only: far out (|x| >= 9) the function is
  // x or 0 to within float, and the finite difference tells nothing new.
  const size_t n = 203;
  vf dout = uniform(rng, n), dx0 = uniform(rng, n), dx = dx0;
  zf::gelu_backward(dx.data(), x.data(), dout.data(), n);
  vd x_d(x.begin(), x.begin() + n), dout_d = to_double(dout);
  auto L = [&] {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += dout_d[i] * ref_gelu(x_d[i]);
    return s;
  };
  // Each entry is one product of ~20 float ops: ~1e-6 relative; the 1e-5 is
  // of the tensor's scale, since GELU' has cancellation near its zero (x ~ -0.75).
  EXPECT_TRUE(grad_near(dx, dx0, numeric_grad(x_d, L), 1e-5));
  // Far out the derivative is 1 (right) or 0 (left), and must not be NaN.
  vf far = {30.0f, -30.0f, 1e4f, -1e4f}, one(4, 1.0f), dfar(4, 0.0f);
  zf::gelu_backward(dfar.data(), far.data(), one.data(), 4);
  EXPECT_FLOAT_EQ(dfar[0], 1.0f);
  EXPECT_NEAR(dfar[1], 0.0f, 1e-30);
  EXPECT_FLOAT_EQ(dfar[2], 1.0f);
  EXPECT_NEAR(dfar[3], 0.0f, 1e-30);
}

// ---------------------------------------------------------------------------
// Residual

TEST(Kernels, Residual) {
  std::mt19937 rng(13);
  const size_t n = 101;
  vf a = uniform(rng, n), b = uniform(rng, n), out(n);
  zf::residual_forward(out.data(), a.data(), b.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]);  // one float add: exact match
  vf a2 = a;
  zf::residual_forward(a2.data(), a2.data(), b.data(), n);  // out aliases a
  EXPECT_EQ(a2, out);
  vf b2 = b;
  zf::residual_forward(b2.data(), a.data(), b2.data(), n);  // out aliases b
  EXPECT_EQ(b2, out);
}

}  // namespace
