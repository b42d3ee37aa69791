// kernels_cpu_softmax.cpp: the CPU reference of the two kernels built on a
// softmax: causal self-attention and the fused softmax + cross-entropy of the
// head (kernels.h), each forward followed by its backward. The conventions
// and the ways of making loops fast are kernels_cpu.cpp's (read its header).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels.h"
#include "kernels_cpu_util.h"

namespace zf {

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
