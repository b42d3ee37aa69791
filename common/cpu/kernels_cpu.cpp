// kernels_cpu.cpp: the CPU reference of the kernels in kernels.h, in model
// order (encoder, layernorm, matmul, gelu, residual), each forward followed by
// its backward; the two built on a softmax (attention, the head's
// cross-entropy) are in kernels_cpu_softmax.cpp, the shared helpers in
// kernels_cpu_util.h.
//
// Conventions (see kernels.h): float32, row-major, contiguous; Linear weights
// [OC, IC]; every backward ADDS into its gradients (+=), except the
// cross-entropy backward, which writes its dlogits (=), in place over the logits.
//
// How it is made fast without making it hard to read:
// - Matrix products, attention's included, go to cblas_sgemm. The trainers
//   run one BLAS thread per rank, and the kernels keep no state of their own,
//   so several rank threads may call any kernel at the same time.
// - Everything else is a plain loop that GCC vectorises: __restrict pointers,
//   no branches in inner loops, and no libm calls in them (exp below is a
//   short polynomial). ZF_VECTOR_CLONES compiles each such kernel for
//   AVX-512, AVX2 and baseline x86-64 and picks one when the program loads,
//   so the build needs no -march flag and runs on any x86-64.
// - Sums over a row (LayerNorm statistics, softmax denominators) keep 16
//   partial sums, which the compiler turns into vector registers: IEEE rules
//   forbid it to reorder a plain `s += x[j]` loop, so we fix an order that
//   vectorises. Results are deterministic on a given machine; across machines
//   the last bits may differ (the AVX-512 clone fuses multiply-adds).
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels.h"
#include "kernels_cpu_util.h"

namespace zf {

namespace {

// GELU (tanh form) rewritten with 0.5 (1 + tanh u) = sigmoid(2u): one exp.
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

}  // namespace

// ---------------------------------------------------------------------------
// Encoder: token embedding + position embedding.

ZF_VECTOR_CLONES
void encoder_forward(float* __restrict out, const int32_t* tokens, const float* __restrict wte,
                     const float* __restrict wpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      float* __restrict o = out + (size_t(b) * T + t) * C;
      const float* __restrict e = wte + size_t(tokens[b * T + t]) * C;
      const float* __restrict p = wpe + size_t(t) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
}

ZF_VECTOR_CLONES
void encoder_backward(float* __restrict dwte, float* __restrict dwpe, const float* __restrict dout,
                      const int32_t* tokens, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const float* __restrict d = dout + (size_t(b) * T + t) * C;
      float* __restrict de = dwte + size_t(tokens[b * T + t]) * C;
      float* __restrict dp = dwpe + size_t(t) * C;
      for (int c = 0; c < C; ++c) {
        de[c] += d[c];
        dp[c] += d[c];
      }
    }
}

// ---------------------------------------------------------------------------
// LayerNorm: out = (x - mean) * rstd * weight + bias, row by row.

ZF_VECTOR_CLONES
void layernorm_forward(float* __restrict out, float* __restrict mean, float* __restrict rstd,
                       const float* __restrict inp, const float* __restrict weight,
                       const float* __restrict bias, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* __restrict x = inp + size_t(n) * C;
    float* __restrict o = out + size_t(n) * C;
    float m = lane_sum(C, [&](int j) { return x[j]; }) / float(C);
    // Two passes (mean, then squared deviations): no cancellation as with E[x^2] - m^2.
    float v = lane_sum(C, [&](int j) { return (x[j] - m) * (x[j] - m); }) / float(C);
    float s = 1.0f / std::sqrt(v + 1e-5f);
    for (int j = 0; j < C; ++j) o[j] = (x[j] - m) * s * weight[j] + bias[j];
    mean[n] = m;
    rstd[n] = s;
  }
}

// With xhat = (x - mean) * rstd and g = dout * weight:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
//   dweight += dout * xhat, dbias += dout.
ZF_VECTOR_CLONES
void layernorm_backward(float* __restrict dinp, float* __restrict dweight, float* __restrict dbias,
                        const float* __restrict dout, const float* __restrict inp,
                        const float* __restrict weight, const float* __restrict mean,
                        const float* __restrict rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* __restrict x = inp + size_t(n) * C;
    const float* __restrict d = dout + size_t(n) * C;
    float* __restrict dx = dinp + size_t(n) * C;
    const float m = mean[n], s = rstd[n];
    float g_mean = lane_sum(C, [&](int j) { return d[j] * weight[j]; }) / float(C);
    float gx_mean =
        lane_sum(C, [&](int j) { return d[j] * weight[j] * ((x[j] - m) * s); }) / float(C);
    for (int j = 0; j < C; ++j) {
      float xhat = (x[j] - m) * s;
      dbias[j] += d[j];
      dweight[j] += d[j] * xhat;
      dx[j] += s * (d[j] * weight[j] - g_mean - xhat * gx_mean);
    }
  }
}

// ---------------------------------------------------------------------------
// Matmul (a Linear layer): out = inp @ weight^T + bias.

void matmul_forward(float* __restrict out, const float* __restrict inp,
                    const float* __restrict weight, const float* __restrict bias, int N, int IC,
                    int OC) {
  if (N == 0 || OC == 0) return;
  // Start out from the bias and let sgemm add to it (beta = 1): one pass over
  // out, where beta = 0 and a bias loop afterwards would take two.
  if (bias)
    for (int n = 0; n < N; ++n) std::memcpy(out + size_t(n) * OC, bias, sizeof(float) * OC);
  else if (IC == 0)
    std::memset(out, 0, sizeof(float) * size_t(N) * OC);
  if (IC == 0) return;  // an empty product: BLAS refuses a leading dimension of 0
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC,
              bias ? 1.0f : 0.0f, out, OC);
}

ZF_VECTOR_CLONES
void matmul_backward(float* __restrict dinp, float* __restrict dweight, float* __restrict dbias,
                     const float* __restrict dout, const float* __restrict inp,
                     const float* __restrict weight, int N, int IC, int OC) {
  if (N == 0 || OC == 0) return;  // nothing to add (and BLAS refuses a leading dimension of 0)
  if (IC > 0) {
    if (dinp)  // dinp[N,IC] += dout[N,OC] @ weight[OC,IC]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight, IC,
                  1.0f, dinp, IC);
    // dweight[OC,IC] += dout^T @ inp
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f,
                dweight, IC);
  }
  if (dbias)  // column sums of dout, row after row: contiguous, vectorised across OC
    for (int n = 0; n < N; ++n) {
      const float* __restrict d = dout + size_t(n) * OC;
      for (int o = 0; o < OC; ++o) dbias[o] += d[o];
    }
}

// ---------------------------------------------------------------------------
// GELU, tanh approximation, as x * sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715 x^3).

ZF_VECTOR_CLONES
void gelu_forward(float* __restrict out, const float* __restrict inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u2 = 2.0f * kGeluS * (x + kGeluA * x * x * x);
    out[i] = x / (1.0f + fast_exp(-u2));
  }
}

// d/dx [x sigmoid(2u)] = s + 2 x s (1 - s) u', with s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3a x^2).
ZF_VECTOR_CLONES
void gelu_backward(float* __restrict dinp, const float* __restrict inp,
                   const float* __restrict dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u2 = 2.0f * kGeluS * (x + kGeluA * x * x * x);
    const float s = 1.0f / (1.0f + fast_exp(-u2));
    const float du = kGeluS * (1.0f + 3.0f * kGeluA * x * x);
    dinp[i] += dout[i] * (s + 2.0f * x * s * (1.0f - s) * du);
  }
}

// ---------------------------------------------------------------------------
// Residual add. out may alias a or b, so no __restrict here: the loop reads
// a[i] and b[i] before writing out[i], which is safe, and GCC still
// vectorises it (it checks for overlap at run time).

ZF_VECTOR_CLONES
void residual_forward(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace zf
