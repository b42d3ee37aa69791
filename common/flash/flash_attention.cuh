// flash_attention.cuh: the per-thread work of the flash-style causal attention
// kernels (kernels_cuda_flash.cu), written once as plain functions that nvcc
// compiles for the GPU and g++ compiles for the CPU harness of
// tests/flash/test_flash_attention.cpp, which runs every thread of every
// block in order, so CI checks the indexing, masks, tails and online softmax
// without a GPU.
//
//   build/tests/test_flash_attention                           (the CPU harness)
//   build/tests/test_gpu_kernels --gtest_filter='*Flash*'      (the kernels, on a GPU)
//
// The math (FlashAttention-2, Dao 2023), for one batch element b and head h,
// with scale = 1/sqrt(hs) and s_ij = scale q_i.k_j for keys j <= i (causal):
//   forward   out_i = sum_j softmax_j(s_i.) v_j over key tiles, with an online
//             softmax: a running max m, a running sum l of exp(s_ij - m), and
//             the output accumulator rescaled by exp(m_old - m_new) when m grows.
//             Saves lse_i = m + log l (float32, [B, H, T]) for the backward.
//   backward  p_ij = exp(s_ij - lse_i) (recomputed), D_i = dout_i.out_i,
//             dp_ij = dout_i.v_j, ds_ij = p_ij (dp_ij - D_i), then
//             dq_i += scale sum_j ds_ij k_j              (one thread per query row)
//             dv_j += sum_i p_ij dout_i, dk_j += scale sum_i ds_ij q_i
//                                                        (one thread per key row, two kernels)
// No T x T matrix is ever stored; every sum runs in a fixed order (no atomics).
//
// How a kernel is laid out: a block of kRows threads owns kRows consecutive
// rows of one (b, h) (query rows for the forward and dQ, key rows for dV, dK),
// one row per thread, kept in registers (the *Row structs). The rows of the
// other side stream through shared memory kTile at a time: all threads copy a
// tile together (load_*), __syncthreads, each thread runs its row against the
// tile (*_tile), __syncthreads, next tile. A thread past the last row T still
// copies its share of every tile (the copy needs all threads) but computes
// nothing. Tiles hold float32 as Vec4 (4 consecutive channels): the threads
// of a warp all read the same tile row at once (a broadcast, no bank
// conflicts), 16 bytes per load.
//
// Head size: hs = C/H is padded with zeros to HS in {32, 64, 128}, a
// compile-time constant, so the per-row arrays stay in registers (every loop
// over them has constant bounds and unrolls) and each dot product just adds
// exact zeros for the padding. All loops over a register array therefore run
// to HS with `d < hs` tests, never to hs. The loops over a tile's rows are
// not unrolled (ZF_NO_UNROLL): each iteration has HS-long unrolled loops
// already, and unrolling them too multiplies compile time and registers.
#pragma once

#include <math.h>  // expf, logf, fmaxf, INFINITY: the same names in host and device code
#include <stddef.h>

#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#define ZF_HD __host__ __device__ __forceinline__
#else
#define ZF_HD inline
#endif
// Unrolling hints for the device compiler only (the host compiler of an nvcc
// build, and g++, would warn about a pragma they do not know).
#if defined(__CUDA_ARCH__)
#define ZF_UNROLL _Pragma("unroll")
#define ZF_NO_UNROLL _Pragma("unroll 1")
#else
#define ZF_UNROLL
#define ZF_NO_UNROLL
#endif

namespace zf::flash {

constexpr int kRows = 64;  // threads of a block = rows it owns
constexpr int kTile = 32;  // rows of a shared-memory tile
constexpr int kMaxHeadSize = 128;

// HS for a head size hs: 32, 64 or 128; 0 when hs is not in 1..kMaxHeadSize.
constexpr int padded_head_size(int hs) {
  return hs <= 0 ? 0 : hs <= 32 ? 32 : hs <= 64 ? 64 : hs <= kMaxHeadSize ? 128 : 0;
}

// Blocks of kRows rows needed for T rows.
constexpr int row_blocks(int T) { return (T + kRows - 1) / kRows; }

struct alignas(16) Vec4 {
  float x, y, z, w;
};

// One call's sizes. scale = 1/sqrt(hs), computed once by the launcher.
struct Shape {
  int T, C, H, hs;
  float scale;
};

// Calls fn(std::integral_constant<int, HS>) for the padded head size of s
// (the launchers' choice of kernel; hs already checked to be at most 128).
template <class Fn>
void with_head_size(const Shape& s, Fn&& fn) {
  switch (padded_head_size(s.hs)) {
    case 32: fn(std::integral_constant<int, 32>{}); break;
    case 64: fn(std::integral_constant<int, 64>{}); break;
    default: fn(std::integral_constant<int, 128>{}); break;
  }
}

// Where row t of (b, h) lives (kernels.h's layout): part 0, 1, 2 of qkv[B,T,3C]
// are q, k, v, head h at channels h*hs..; out and dout are [B,T,C]; lse and D
// are [B,H,T].
ZF_HD size_t qkv_at(const Shape& s, int b, int h, int part, int t) {
  return (size_t(b) * s.T + t) * 3 * s.C + size_t(part) * s.C + size_t(h) * s.hs;
}
ZF_HD size_t out_at(const Shape& s, int b, int h, int t) {
  return (size_t(b) * s.T + t) * s.C + size_t(h) * s.hs;
}
ZF_HD size_t stat_at(const Shape& s, int b, int h, int t) {
  return (size_t(b) * s.H + h) * s.T + t;
}
ZF_HD int imin(int a, int b) { return a < b ? a : b; }

// float32 in registers and shared memory; F (float or bf16) in global memory.
ZF_HD float to_float(float x) { return x; }
ZF_HD void store_as(float* p, float x) { *p = x; }
#if defined(__CUDACC__)
ZF_HD float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
ZF_HD void store_as(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
#endif

// ---------------------------------------------------------------------------
// Building blocks

// x[0..HS) = factor * row[0..hs), zeros after (and all zeros when !valid, a
// row past T, which is then never read).
template <int HS, class F>
ZF_HD void load_row(float (&x)[HS], const F* row, int hs, float factor, bool valid) {
  ZF_UNROLL for (int d = 0; d < HS; ++d) x[d] = (valid && d < hs) ? factor * to_float(row[d]) : 0.0f;
}

// Rows [r0, r0 + kTile) of one head's [T, hs] matrix (row t at base + t * stride)
// into tile, as float32, zeros past hs and past row T. Thread tid copies the
// Vec4s tid, tid + kRows, ...: consecutive threads read consecutive channels.
template <int HS, class F>
ZF_HD void load_tile(Vec4 (&tile)[kTile][HS / 4], const F* base, size_t stride, int r0, int T,
                     int hs, int tid) {
  constexpr int kVecs = HS / 4;
  for (int e = tid; e < kTile * kVecs; e += kRows) {
    const int r = e / kVecs, d = 4 * (e % kVecs), t = r0 + r;
    float x[4];
    for (int c = 0; c < 4; ++c)
      x[c] = (t < T && d + c < hs) ? to_float(base[size_t(t) * stride + d + c]) : 0.0f;
    tile[r][e % kVecs] = Vec4{x[0], x[1], x[2], x[3]};
  }
}

// x . y over HS channels: four partial sums (channels 4n, 4n+1, 4n+2, 4n+3),
// so that a thread has four independent chains of multiply-adds in flight
// rather than one; combined in a fixed order.
template <int HS>
ZF_HD float dot(const float (&x)[HS], const Vec4* y) {
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
  ZF_UNROLL for (int d4 = 0; d4 < HS / 4; ++d4) {
    const Vec4 w = y[d4];
    a0 += x[4 * d4] * w.x;
    a1 += x[4 * d4 + 1] * w.y;
    a2 += x[4 * d4 + 2] * w.z;
    a3 += x[4 * d4 + 3] * w.w;
  }
  return (a0 + a1) + (a2 + a3);
}

// acc += a * y over HS channels.
template <int HS>
ZF_HD void axpy(float (&acc)[HS], float a, const Vec4* y) {
  ZF_UNROLL for (int d4 = 0; d4 < HS / 4; ++d4) {
    const Vec4 w = y[d4];
    acc[4 * d4] += a * w.x;
    acc[4 * d4 + 1] += a * w.y;
    acc[4 * d4 + 2] += a * w.z;
    acc[4 * d4 + 3] += a * w.w;
  }
}

// dst[0..hs) = F(dst + factor * x) (a gradient: read, add in float32, round once).
template <int HS, class F>
ZF_HD void add_row(F* dst, const float (&x)[HS], float factor, int hs) {
  ZF_UNROLL for (int d = 0; d < HS; ++d)
    if (d < hs) store_as(dst + d, to_float(dst[d]) + factor * x[d]);
}

// ---------------------------------------------------------------------------
// Forward: block (rt, b*H + h) owns query rows [rt kRows, (rt + 1) kRows) and
// streams key/value tiles [j0, j0 + kTile) for j0 < forward_keys(rt, T).

template <int HS>
struct KVTiles {  // shared memory of the forward and of dQ
  Vec4 k[kTile][HS / 4];
  Vec4 v[kTile][HS / 4];
  // The forward's scores of the current tile, column tid for thread tid (a
  // register array would need the key loop fully unrolled: long compiles,
  // more registers). Each thread reads only its own column.
  float score[kTile][kRows];
};

template <int HS>
struct ForwardRow {  // registers of thread i
  float q[HS];       // scale q_i
  float o[HS];       // sum_j exp(s_ij - m) v_j over the keys seen so far
  float m, l;        // running max of s_ij; running sum of exp(s_ij - m)
};

// Causal: the last row of block rt sees keys up to itself.
ZF_HD int forward_keys(int rt, int T) { return imin(T, (rt + 1) * kRows); }

template <int HS, class F>
ZF_HD void load_kv_tile(KVTiles<HS>& t, const Shape& s, const F* qkv, int b, int h, int j0,
                        int tid) {
  const size_t stride = 3 * size_t(s.C);
  load_tile<HS>(t.k, qkv + qkv_at(s, b, h, 1, 0), stride, j0, s.T, s.hs, tid);
  load_tile<HS>(t.v, qkv + qkv_at(s, b, h, 2, 0), stride, j0, s.T, s.hs, tid);
}

template <int HS, class F>
ZF_HD void forward_begin(ForwardRow<HS>& r, const Shape& s, const F* qkv, int b, int h, int i) {
  const bool valid = i < s.T;
  load_row(r.q, valid ? qkv + qkv_at(s, b, h, 0, i) : qkv, s.hs, s.scale, valid);
  ZF_UNROLL for (int d = 0; d < HS; ++d) r.o[d] = 0.0f;
  r.m = -INFINITY;
  r.l = 0.0f;
}

// Row i (thread tid) against keys [j0, j0 + kTile): only keys j <= i count
// (which also keeps j < T). Scores of the whole tile first, then one rescale
// of o and l to the tile's new max, then the probabilities times v.
template <int HS>
ZF_HD void forward_tile(ForwardRow<HS>& r, KVTiles<HS>& t, int i, int tid, int j0, int T) {
  if (i >= T || j0 > i) return;  // past the last row, or a tile wholly above the diagonal
  const int n = imin(kTile, i - j0 + 1);  // keys j0 .. j0 + n - 1 are visible
  float mx = r.m;
  ZF_NO_UNROLL for (int jj = 0; jj < n; ++jj) {
    const float x = dot(r.q, t.k[jj]);
    t.score[jj][tid] = x;
    mx = fmaxf(mx, x);
  }
  // The first tile has m = -inf: corr = exp(-inf) = 0, and o, l are still 0.
  const float corr = expf(r.m - mx);
  r.l *= corr;
  ZF_UNROLL for (int d = 0; d < HS; ++d) r.o[d] *= corr;
  ZF_NO_UNROLL for (int jj = 0; jj < n; ++jj) {
    const float p = expf(t.score[jj][tid] - mx);
    r.l += p;
    axpy(r.o, p, t.v[jj]);
  }
  r.m = mx;
}

template <int HS, class F>
ZF_HD void forward_end(const ForwardRow<HS>& r, const Shape& s, F* out, float* lse, int b, int h,
                       int i) {
  if (i >= s.T) return;
  const float inv = 1.0f / r.l;  // l >= 1: the max term contributes exp(0)
  F* o = out + out_at(s, b, h, i);
  ZF_UNROLL for (int d = 0; d < HS; ++d)
    if (d < s.hs) store_as(o + d, r.o[d] * inv);
  lse[stat_at(s, b, h, i)] = r.m + logf(r.l);
}

// ---------------------------------------------------------------------------
// Backward, step 1: D_i = dout_i . out_i, one thread per row r of [B*H*T].
// (sum_j p_ij dp_ij = dout_i . sum_j p_ij v_j = dout_i . out_i: the softmax
// backward's row sum, without the probabilities.)

template <class F>
ZF_HD void backward_delta(float* D, const F* out, const F* dout, const Shape& s, int row) {
  const int i = row % s.T, bh = row / s.T, b = bh / s.H, h = bh % s.H;
  const size_t at = out_at(s, b, h, i);
  float acc = 0.0f;
  for (int d = 0; d < s.hs; ++d) acc += to_float(dout[at + d]) * to_float(out[at + d]);
  D[row] = acc;
}

// Backward, step 2: dQ. Block (rt, b*H + h) owns query rows as the forward
// does and streams the same key/value tiles (KVTiles, load_kv_tile).

template <int HS>
struct DqRow {
  float q[HS];     // scale q_i
  float dout[HS];  // dout_i
  float dq[HS];    // sum_j ds_ij k_j (times scale at the end)
  float lse, D;
};

template <int HS, class F>
ZF_HD void dq_begin(DqRow<HS>& r, const Shape& s, const F* qkv, const F* dout, const float* lse,
                    const float* D, int b, int h, int i) {
  const bool valid = i < s.T;
  load_row(r.q, valid ? qkv + qkv_at(s, b, h, 0, i) : qkv, s.hs, s.scale, valid);
  load_row(r.dout, valid ? dout + out_at(s, b, h, i) : dout, s.hs, 1.0f, valid);
  ZF_UNROLL for (int d = 0; d < HS; ++d) r.dq[d] = 0.0f;
  r.lse = valid ? lse[stat_at(s, b, h, i)] : 0.0f;
  r.D = valid ? D[stat_at(s, b, h, i)] : 0.0f;
}

template <int HS>
ZF_HD void dq_tile(DqRow<HS>& r, const KVTiles<HS>& t, int i, int j0, int T) {
  if (i >= T || j0 > i) return;
  const int n = imin(kTile, i - j0 + 1);
  ZF_NO_UNROLL for (int jj = 0; jj < n; ++jj) {
    const float p = expf(dot(r.q, t.k[jj]) - r.lse);
    const float dp = dot(r.dout, t.v[jj]);
    axpy(r.dq, p * (dp - r.D), t.k[jj]);
  }
}

template <int HS, class F>
ZF_HD void dq_end(const DqRow<HS>& r, const Shape& s, F* dqkv, int b, int h, int i) {
  if (i >= s.T) return;
  add_row(dqkv + qkv_at(s, b, h, 0, i), r.dq, s.scale, s.hs);
}

// Backward, steps 3 and 4: dV, then dK, each by its own kernel. Block
// (kt, b*H + h) owns key rows [kt kRows, (kt + 1) kRows) and streams query
// tiles [i0, i0 + kTile) of q, dout, lse and D from i0 = kt kRows to T
// (causal: queries i >= j). One kernel for both would keep k, v, dk and dv
// in registers (4 HS floats: 256 for GPT-2's 64, more than a thread has);
// apart, dV keeps 2 HS and dK 3 HS, for one more q.k product per pair. One
// kernel template runs both: key_begin / key_tile / key_end are overloaded
// on the row type (DvRow, DkRow).

template <int HS>
struct QTiles {
  Vec4 q[kTile][HS / 4];
  Vec4 dout[kTile][HS / 4];
  float lse[kTile], D[kTile];
};

template <int HS>
struct DvRow {
  float k[HS];   // scale k_j
  float dv[HS];  // sum_i p_ij dout_i
};

template <int HS>
struct DkRow {
  float k[HS];   // scale k_j
  float v[HS];   // v_j
  float dk[HS];  // sum_i ds_ij q_i (times scale at the end)
};

ZF_HD int key_first_query(int kt) { return kt * kRows; }

template <int HS, class F>
ZF_HD void load_q_tile(QTiles<HS>& t, const Shape& s, const F* qkv, const F* dout,
                       const float* lse, const float* D, int b, int h, int i0, int tid) {
  load_tile<HS>(t.q, qkv + qkv_at(s, b, h, 0, 0), 3 * size_t(s.C), i0, s.T, s.hs, tid);
  load_tile<HS>(t.dout, dout + out_at(s, b, h, 0), size_t(s.C), i0, s.T, s.hs, tid);
  if (tid < kTile) {
    const int i = i0 + tid;
    t.lse[tid] = i < s.T ? lse[stat_at(s, b, h, i)] : 0.0f;
    t.D[tid] = i < s.T ? D[stat_at(s, b, h, i)] : 0.0f;
  }
}

// The queries of the tile [i0, i0 + kTile) that key row j sees: [first, last).
ZF_HD bool key_range(int j, int i0, int T, int& first, int& last) {
  if (j >= T || i0 + kTile <= j) return false;  // past the last row, or a tile wholly before j
  first = j > i0 ? j - i0 : 0;
  last = imin(kTile, T - i0);
  return true;
}

template <int HS, class F>
ZF_HD void key_begin(DvRow<HS>& r, const Shape& s, const F* qkv, int b, int h, int j) {
  const bool valid = j < s.T;
  load_row(r.k, valid ? qkv + qkv_at(s, b, h, 1, j) : qkv, s.hs, s.scale, valid);
  ZF_UNROLL for (int d = 0; d < HS; ++d) r.dv[d] = 0.0f;
}

template <int HS>
ZF_HD void key_tile(DvRow<HS>& r, const QTiles<HS>& t, int j, int i0, int T) {
  int first, last;
  if (!key_range(j, i0, T, first, last)) return;
  ZF_NO_UNROLL for (int ii = first; ii < last; ++ii) axpy(r.dv, expf(dot(r.k, t.q[ii]) - t.lse[ii]), t.dout[ii]);
}

template <int HS, class F>
ZF_HD void key_end(const DvRow<HS>& r, const Shape& s, F* dqkv, int b, int h, int j) {
  if (j < s.T) add_row(dqkv + qkv_at(s, b, h, 2, j), r.dv, 1.0f, s.hs);
}

template <int HS, class F>
ZF_HD void key_begin(DkRow<HS>& r, const Shape& s, const F* qkv, int b, int h, int j) {
  const bool valid = j < s.T;
  load_row(r.k, valid ? qkv + qkv_at(s, b, h, 1, j) : qkv, s.hs, s.scale, valid);
  load_row(r.v, valid ? qkv + qkv_at(s, b, h, 2, j) : qkv, s.hs, 1.0f, valid);
  ZF_UNROLL for (int d = 0; d < HS; ++d) r.dk[d] = 0.0f;
}

template <int HS>
ZF_HD void key_tile(DkRow<HS>& r, const QTiles<HS>& t, int j, int i0, int T) {
  int first, last;
  if (!key_range(j, i0, T, first, last)) return;
  ZF_NO_UNROLL for (int ii = first; ii < last; ++ii) {
    const float p = expf(dot(r.k, t.q[ii]) - t.lse[ii]);
    const float dp = dot(r.v, t.dout[ii]);
    axpy(r.dk, p * (dp - t.D[ii]), t.q[ii]);
  }
}

template <int HS, class F>
ZF_HD void key_end(const DkRow<HS>& r, const Shape& s, F* dqkv, int b, int h, int j) {
  if (j < s.T) add_row(dqkv + qkv_at(s, b, h, 1, j), r.dk, s.scale, s.hs);
}

}  // namespace zf::flash
