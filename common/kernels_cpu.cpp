// kernels_cpu.cpp: the CPU reference of every kernel in kernels.h, in model
// order (encoder, layernorm, matmul, attention, gelu, residual, softmax +
// cross-entropy), each forward followed by its backward.
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
#include "simd.h"

#define ZF_INLINE inline __attribute__((always_inline))

namespace zf {

namespace {

// ---------------------------------------------------------------------------
// Helpers, inlined into each kernel (and so into each of its clones).

// Row sums and maxima in this many partial lanes, combined pairwise at the end.
constexpr int kLanes = 16;

// sum over j in [0, n) of term(j).
template <class Term>
ZF_INLINE float lane_sum(int n, Term term) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += term(j + k);
  for (int k = 0; j < n; ++j, ++k) acc[k] += term(j);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// n rounded up to a whole number of lanes, at most limit.
ZF_INLINE int lanes_up(int n, int limit) {
  return std::min(limit, (n + kLanes - 1) / kLanes * kLanes);
}

// max over j in [0, n) of x[j], n >= 1.
ZF_INLINE float lane_max(const float* __restrict x, int n) {
  float acc[kLanes];
  for (int k = 0; k < kLanes; ++k) acc[k] = x[0];
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] = x[j + k] > acc[k] ? x[j + k] : acc[k];
  for (int k = 0; j < n; ++j, ++k) acc[k] = x[j] > acc[k] ? x[j] : acc[k];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] = acc[k + w] > acc[k] ? acc[k + w] : acc[k];
  return acc[0];
}

// c ? a : b without a branch. A plain ?: on floats ahead of arithmetic keeps
// GCC from vectorising the loop: it copies the arithmetic into both arms, and
// under IEEE exception rules (-ftrapping-math, the default) it may then not
// run both arms for every lane. Bit logic has no such rule.
ZF_INLINE float select(bool c, float a, float b) {
  const uint32_t m = -uint32_t(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// e^x to about 2 ulp (Cephes' expf polynomial), branch-free so that a loop of
// it vectorises: x = n ln2 + r with |r| <= ln2/2, e^r by a polynomial, 2^n
// written straight into the exponent bits. Below -87 it returns 0 (e^x is then
// under 1.7e-38, subnormal at most) and above 88 +inf (e^x over 1.6e38, near
// float's largest): what softmax and sigmoid need at the extremes.
ZF_INLINE float fast_exp(float x) {
  const float xc = select(x < -87.0f, -87.0f, select(x > 88.0f, 88.0f, x));  // keeps 2^n normal
  const float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (xc * 1.44269504088896341f + round_magic) - round_magic;
  float r = xc - n * 0.693359375f;  // ln2 split in two so that n*ln2 stays exact
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float e = p * std::bit_cast<float>(uint32_t(int32_t(n) + 127) << 23);
  return select(x < -87.0f, 0.0f, select(x > 88.0f, std::numeric_limits<float>::infinity(), e));
}

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
// Causal self-attention, one (batch, head) pair at a time. Q, K and V of head
// h are column blocks of qkv (Q at h*hs, K at C + h*hs, V at 2C + h*hs), so
// sgemm reads them in place with leading dimension 3C: no copies.
//
// Causality in the products: the T x T matrices are done in blocks of
// kAttRows rows. Rows [i0, i1) only look at columns [0, i1), so each product
// skips the blocks right of the diagonal: 10/16 of the full work at T = 128,
// about half at large T. Inside a diagonal block the masked entries are
// computed, then zeroed, so that the products that read them see exact zeros.

constexpr int kAttRows = 32;  // a multiple of kLanes: see lanes_up in the softmax
static_assert(kAttRows % kLanes == 0);

ZF_VECTOR_CLONES
void attention_forward(float* __restrict out, float* __restrict att, const float* __restrict qkv,
                       int B, int T, int C, int H) {
  const int hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const float* q = qkv + size_t(b) * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + (size_t(b) * H + h) * T * T;
      float* o = out + size_t(b) * T * C + h * hs;
      for (int i0 = 0; i0 < T; i0 += kAttRows) {
        const int i1 = std::min(i0 + kAttRows, T), rows = i1 - i0;
        float* ab = a + size_t(i0) * T;
        // preatt[i0:i1, 0:i1] = scale Q[i0:i1] K[0:i1]^T, into att, softmaxed in place
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, i1, hs, scale,
                    q + size_t(i0) * C3, C3, k, C3, 0.0f, ab, T);
        for (int i = i0; i < i1; ++i) {
          float* __restrict row = a + size_t(i) * T;
          // Causal: position i sees positions 0..i. The row is processed up to
          // a whole number of lanes (still inside the columns computed above),
          // with the masked scores set to -inf, so that exp makes them exactly
          // 0: a scalar tail of up to 15 exps per row would cost more than the
          // whole vector part.
          const int len = i + 1, padded = lanes_up(len, T);
          for (int j = len; j < padded; ++j) row[j] = -std::numeric_limits<float>::infinity();
          const float mx = lane_max(row, padded);
          const float sum = lane_sum(padded, [&](int j) { return row[j] = fast_exp(row[j] - mx); });
          const float inv = 1.0f / sum;
          for (int j = 0; j < padded; ++j) row[j] *= inv;
          for (int j = padded; j < T; ++j) row[j] = 0.0f;
        }
        // out[i0:i1] = att[i0:i1, 0:i1] V[0:i1]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, i1, 1.0f, ab, T, v, C3,
                    0.0f, o + size_t(i0) * C, C);
      }
    }
}

size_t attention_scratch_floats(int T) { return size_t(T) * T; }

// Backward of out = softmax(scale Q K^T) V, per (b, h), with datt held in scratch:
//   datt = dout V^T              dV += att^T dout
//   dpre = att * (datt - rowsum(att * datt))      (softmax backward, in place)
//   dQ += scale dpre K           dK += scale dpre^T Q
// By row blocks as in the forward. A transposed product reads a column block
// [j0, j1) of att or dpre, which is nonzero only in rows [j0, T).
ZF_VECTOR_CLONES
void attention_backward(float* __restrict dqkv, float* __restrict scratch,
                        const float* __restrict dout, const float* __restrict qkv,
                        const float* __restrict att, int B, int T, int C, int H) {
  const int hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  float* __restrict d = scratch;  // datt, then dpreatt
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const size_t qoff = size_t(b) * T * C3 + h * hs;
      const float* q = qkv + qoff;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + qoff;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att + (size_t(b) * H + h) * T * T;
      const float* dy = dout + size_t(b) * T * C + h * hs;
      for (int i0 = 0; i0 < T; i0 += kAttRows) {
        const int i1 = std::min(i0 + kAttRows, T), rows = i1 - i0;
        // datt[i0:i1, 0:i1] = dout[i0:i1] V[0:i1]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, i1, hs, 1.0f,
                    dy + size_t(i0) * C, C, v, C3, 0.0f, d + size_t(i0) * T, T);
        // dV[i0:i1] += att[i0:T, i0:i1]^T dout[i0:T]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, hs, T - i0, 1.0f,
                    a + size_t(i0) * T + i0, T, dy + size_t(i0) * C, C, 1.0f, dv + size_t(i0) * C3,
                    C3);
        for (int i = i0; i < i1; ++i) {
          const float* __restrict arow = a + size_t(i) * T;
          float* __restrict drow = d + size_t(i) * T;
          // As in the forward, whole lanes: att is 0 past the diagonal, so the
          // extra terms add exact zeros and the extra dpre entries are 0.
          const int padded = lanes_up(i + 1, T);
          const float dot = lane_sum(padded, [&](int j) { return arow[j] * drow[j]; });
          for (int j = 0; j < padded; ++j) drow[j] = arow[j] * (drow[j] - dot);
          for (int j = padded; j < T; ++j) drow[j] = 0.0f;
        }
        // dQ[i0:i1] += scale dpre[i0:i1, 0:i1] K[0:i1]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, i1, scale,
                    d + size_t(i0) * T, T, k, C3, 1.0f, dq + size_t(i0) * C3, C3);
      }
      // dK[j0:j1] += scale dpre[j0:T, j0:j1]^T Q[j0:T], once all of dpre is known
      for (int j0 = 0; j0 < T; j0 += kAttRows) {
        const int j1 = std::min(j0 + kAttRows, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, T - j0, scale,
                    d + size_t(j0) * T + j0, T, q + size_t(j0) * C3, C3, 1.0f, dk + size_t(j0) * C3,
                    C3);
      }
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

// ---------------------------------------------------------------------------
// Softmax and cross-entropy, fused (the head's last step): the forward keeps
// only lse per row, the backward recomputes each probability from its logit.
// The forward's max and sum in one pass over memory ("online" softmax), a
// chunk at a time: the chunk's max, the running sum rescaled to it if it is
// a new max (one libm exp a chunk), then the chunk's exps added. A 4 KiB
// chunk is read twice from L1, and each logit costs one exp (a per-element
// online update costs two). With V <= kSoftmaxChunk (tiny, small) this is
// exactly the two-pass arithmetic.
constexpr int kSoftmaxChunk = 1024;

ZF_VECTOR_CLONES
void softmax_cross_entropy_forward(float* __restrict lse, float* __restrict losses,
                                   const float* __restrict logits, const int32_t* targets, int N,
                                   int V) {
  if (V == 0) return;  // no row has a target: nothing to do (as the CUDA twin)
  for (int n = 0; n < N; ++n) {
    const float* __restrict x = logits + size_t(n) * V;
    float mx = -std::numeric_limits<float>::infinity(), sum = 0.0f;
    for (int j0 = 0; j0 < V; j0 += kSoftmaxChunk) {
      const float* __restrict xc = x + j0;
      const int len = std::min(kSoftmaxChunk, V - j0);
      const float cmx = lane_max(xc, len);
      if (cmx > mx) {
        sum *= std::exp(mx - cmx);  // first chunk: 0 * exp(-inf) = 0
        mx = cmx;
      }
      sum += lane_sum(len, [&](int j) { return fast_exp(xc[j] - mx); });
    }
    const float log_sum = std::log(sum);
    lse[n] = mx + log_sum;
    // -log p[t] = log(sum) - (x[t] - max): x[t] - max is exact when the two are
    // close (Sterbenz), where lse - x[t] would lose lse's rounding (u |lse|).
    losses[n] = log_sum - (x[targets[n]] - mx);
  }
}

namespace {

// A row of the gradient, less the target's -1: g[j] = e^(x[j] - lse) dloss,
// out of place and in place, each with __restrict pointers: GCC then
// vectorises it without run-time overlap checks (which would send the
// in-place call, equal pointers, down the scalar path).
ZF_INLINE void ce_grad_row(float* __restrict g, const float* __restrict x, float lse, float dloss,
                           int V) {
  for (int j = 0; j < V; ++j) g[j] = fast_exp(x[j] - lse) * dloss;
}
ZF_INLINE void ce_grad_row_in_place(float* __restrict xg, float lse, float dloss, int V) {
  for (int j = 0; j < V; ++j) xg[j] = fast_exp(xg[j] - lse) * dloss;
}

}  // namespace

// No __restrict on dlogits and logits: they may be the same buffer.
ZF_VECTOR_CLONES
void softmax_cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                    const int32_t* targets, float dloss, int N, int V) {
  if (V == 0) return;
  for (int n = 0; n < N; ++n) {
    const size_t row = size_t(n) * V;
    const int t = targets[n];
    const float l = lse[n];
    const float x_t = logits[row + t];  // read before an in-place row overwrites it
    if (dlogits == logits)
      ce_grad_row_in_place(dlogits + row, l, dloss, V);
    else
      ce_grad_row(dlogits + row, logits + row, l, dloss, V);
    dlogits[row + t] = (fast_exp(x_t - l) - 1.0f) * dloss;  // the target's term, with its -1
  }
}

}  // namespace zf
