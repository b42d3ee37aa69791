// flash_attention_tc.cuh: flash attention on tensor cores (bf16 in, float32
// accumulate), the programs of its three kernels written once, for any
// "block" type Blk: kernels_cuda_flash_tc.cu runs them on a GPU with
// Blk = a CUDA thread block and WMMA (nvcuda::wmma, 16x16x16 bf16 tiles);
// tests/common/test_flash_attention_tc.cpp runs them on the CPU with a model
// of a block and of WMMA, so CI checks every index, mask, tail, barrier and
// rounding of the real sequence without a GPU.
//
//   build/tests/test_flash_attention_tc                        (the CPU harness)
//   build/tests/test_gpu_kernels --gtest_filter='*FlashTc*'    (the kernels, on a GPU)
//
// The math is flash_attention.cuh's (FlashAttention-2; read its header first);
// what changes is who does the products. There, one thread owns one row and
// walks the other side's rows on CUDA cores. Here a block of kWarps warps
// owns a tile of kBM rows, and the products of a tile with the other side's
// tile (64 x 64 x hs multiply-adds) are matrix products on tensor cores:
//
//   forward  S = Q K^T (scores), then on CUDA cores the online softmax of S
//            (P = exp(scale S - m), bf16, as FlashAttention-2 keeps it), then
//            P V on tensor cores, added to the output in registers.
//   dQ       S = Q K^T and dP = dO V^T, dS = P o (dP - D), dQ += dS K.
//   dK, dV   the transposes, from the key side: S^T = K Q^T, dP^T = V dO^T,
//            dV += P^T dO, dK += dS^T Q. No atomics, no T x T matrix.
//
// How the programs are written. A program is a sequence of phases; a phase
// is either threads(fn), every thread t of the block running fn(t), or
// warps(fn), every warp w running fn(w) (tile products are warp-wide), and
// EVERY phase ends with a barrier (__syncthreads on the GPU). So a phase may
// read anything an earlier phase wrote, and nothing written in its own phase
// by another thread: the CPU harness runs each phase's threads (and warps)
// in forward and in reverse order and demands the same bits, which catches a
// phase that does. Per-thread values that live across phases (a row's
// running max, its share of the output) are Blk::PerThread<T>: a register
// variable on the GPU, one T per thread on the CPU; per-warp accumulator
// tiles are Blk::PerWarp<T>.
//
// The loops over a tile's columns in the threads phases have constant
// bounds and are unrolled (ZF_UNROLL), so a thread's shared-memory loads and
// exponentials overlap: with 4 warps a block there is little else to hide
// their latency.
//
// Thread layout: warp w owns rows [16 w, 16 w + 16) of the block's tile (its
// products' rows); thread t works on row t / 2, and of that row on the
// columns (and channels) of parity t % 2, so a row's two threads are
// neighbours in the same warp, and a warp reading one column of its 16 rows
// meets each shared-memory bank at most twice.
//
// Blk provides (see the two implementations):
//   half                           the 16-bit type (float in the CPU model's
//                                  exact mode); to_half, to_float
//   PerThread<T>, PerWarp<T>       t -> T&, w -> T&
//   threads(fn), warps(fn)         a phase, then a barrier
//   Acc, zero(Acc&)                a warp's 16 x 16 float32 tile
//   mma(c, a, lda, b, ldb)         c += A B,    A and B 16 x 16 row-major
//   mma_bt(c, a, lda, b, ldb)      c += A B^T, b holds B's rows (row-major)
//   store(p, ldp, c)               the tile to float32 memory, row-major
//   copy16(dst, src)               16 bytes
#pragma once

#include "flash_attention.cuh"  // Shape, qkv_at, out_at, stat_at, padded_head_size

#if defined(__CUDACC__)
#define ZF_DEV __device__ __forceinline__
#else
#define ZF_DEV inline
#endif

namespace zf::flash_tc {

using flash::imin;
using flash::Shape;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;  // 128
constexpr int kBM = 16 * kWarps;       // rows a block owns: 16 per warp
constexpr int kBN = 64;                // rows of the other side per tile

// Row pitches, in elements, padded so that (a) each 16-row, 16-column tile
// starts 32 bytes aligned (WMMA's rule; pitches are multiples of 16 bytes and
// 16 rows of them multiples of 32) and (b) consecutive rows start in
// different shared-memory banks.
template <int HS>
constexpr int ld_half = HS + 8;  // a [rows, HS] matrix of half
constexpr int ld_p = kBN + 8;    // a [rows, kBN] matrix of half
template <int HS>
constexpr int ld_f = (HS > kBN ? HS : kBN) + 4;  // float32 [rows, max(kBN, HS)]

// A thread's row, and the parity of its columns (column 2 c + half_of(t)
// for c < kBN / 2; channel 2 d + half_of(t) for d < HS / 2).
ZF_DEV int row_of(int t) { return t / 2; }
ZF_DEV int half_of(int t) { return t % 2; }

// Row i sees key j (causal, and i a real row: j <= i < T implies j < T).
ZF_DEV bool visible(int i, int j, int T) { return i < T && j <= i; }

// ---------------------------------------------------------------------------
// Copies from global memory: rows [r0, r0 + 64) of one head's [T, hs] matrix
// (row t at base + t * stride) into a [64, ld] tile of half, zeros past hs
// and past row T (so padding adds exact zeros to every product). 16-byte
// chunks when s.vec (hs and C multiples of the chunk, the base aligned: the
// launcher checks), element by element otherwise; consecutive threads take
// consecutive chunks of a row.
template <class Blk, int HS>
ZF_DEV void load_tile(typename Blk::half (*tile)[ld_half<HS>], const typename Blk::half* base,
                      size_t stride, int r0, const Shape& s, bool vec, int t) {
  using half = typename Blk::half;
  constexpr int kChunk = 16 / int(sizeof(half));  // elements of 16 bytes
  constexpr int kPerRow = HS / kChunk;
  for (int e = t; e < 64 * kPerRow; e += kThreads) {
    const int r = e / kPerRow, d = (e % kPerRow) * kChunk, row = r0 + r;
    half* dst = &tile[r][d];
    const half* src = row < s.T ? base + size_t(row) * stride + d : base;  // base: never read
    if (vec && row < s.T && d + kChunk <= s.hs) {
      Blk::copy16(dst, src);
    } else {
      for (int c = 0; c < kChunk; ++c)
        dst[c] = (row < s.T && d + c < s.hs) ? src[c] : Blk::to_half(0.0f);
    }
  }
}

// The float32 statistics of rows [r0, r0 + 64): lse and D (zeros past T).
ZF_DEV void load_stats(float* lse_tile, float* D_tile, const float* lse, const float* D,
                       const Shape& s, int b, int h, int r0, int t) {
  if (t < 64) {
    const int i = r0 + t;
    lse_tile[t] = i < s.T ? lse[flash::stat_at(s, b, h, i)] : 0.0f;
    D_tile[t] = i < s.T ? D[flash::stat_at(s, b, h, i)] : 0.0f;
  }
}

// c[n] = A (rows 16 w.. of a, width K) times B (K x 16n..) for every 16-column
// block n of the result: the warp's 16 rows of A B (b row-major [K, N]) or of
// A B^T (bt: b holds B's N rows of width K).
template <class Blk, int K, int N, bool kTransposeB>
ZF_DEV void warp_product(typename Blk::Acc (&c)[N / 16], const typename Blk::half* a, int lda,
                         const typename Blk::half* b, int ldb) {
  ZF_UNROLL for (int n = 0; n < N / 16; ++n) {
    ZF_UNROLL for (int k = 0; k < K / 16; ++k) {
      if (kTransposeB)
        Blk::mma_bt(c[n], a + 16 * k, lda, b + size_t(16 * n) * ldb + 16 * k, ldb);
      else
        Blk::mma(c[n], a + 16 * k, lda, b + size_t(16 * k) * ldb + 16 * n, ldb);
    }
  }
}

template <class Blk, int N>
ZF_DEV void zero_all(typename Blk::Acc (&c)[N]) {
  ZF_UNROLL for (int n = 0; n < N; ++n) Blk::zero(c[n]);
}

// The warp's N/16 tiles into rows [16 w, 16 w + 16) of a float32 [.., ld] matrix.
template <class Blk, int N>
ZF_DEV void store_all(float* dst, int ld, const typename Blk::Acc (&c)[N / 16]) {
  ZF_UNROLL for (int n = 0; n < N / 16; ++n) Blk::store(dst + 16 * n, ld, c[n]);
}

// dst[d] += factor * x[d] for the thread's channels d = 2 dd + hf of one row
// (a gradient: read, add in float32, round once), d < hs.
template <class Blk, int HS>
ZF_DEV void add_half_row(typename Blk::half* dst, const float* x, float factor, int hf, int hs) {
  ZF_UNROLL for (int dd = 0; dd < HS / 2; ++dd) {
    const int d = 2 * dd + hf;
    if (d < hs) dst[d] = Blk::to_half(Blk::to_float(dst[d]) + factor * x[d]);
  }
}

// ---------------------------------------------------------------------------
// Forward: block (qt, b*H + h) owns query rows [qt kBM, qt kBM + kBM) and
// streams key/value tiles [j0, j0 + kBN) for j0 below the last row + 1.

template <class Blk, int HS>
struct ForwardSmem {
  using half = typename Blk::half;
  alignas(32) half q[kBM][ld_half<HS>];
  alignas(32) half k[kBN][ld_half<HS>];
  alignas(32) half v[kBN][ld_half<HS>];
  alignas(32) float s[kBM][ld_f<HS>];  // scores S, then the tile's P V
  alignas(32) half p[kBM][ld_p];       // probabilities exp(scale S - m), bf16
  float part[kBM][2];                   // the two halves' max, then their sums l
};

template <int HS>
struct ForwardRow {  // thread t: row t/2, channels 2 dd + t%2
  float o[HS / 2];   // sum_j p_ij v_j over the keys seen so far
  float m, l;        // running max of scale s_ij; this half's running sum of p_ij
};

template <class Blk, int HS>
ZF_DEV void forward_program(Blk& blk, ForwardSmem<Blk, HS>& sm, const Shape& s, bool vec,
                            typename Blk::half* out, float* lse, const typename Blk::half* qkv,
                            int b, int h, int qt) {
  using Acc = typename Blk::Acc;
  const int i0 = qt * kBM;
  const size_t stride = 3 * size_t(s.C);
  typename Blk::template PerThread<ForwardRow<HS>> rows;
  blk.threads([&](int t) {
    ForwardRow<HS>& r = rows(t);
    ZF_UNROLL for (int d = 0; d < HS / 2; ++d) r.o[d] = 0.0f;
    r.m = -INFINITY;
    r.l = 0.0f;
    load_tile<Blk, HS>(sm.q, qkv + flash::qkv_at(s, b, h, 0, 0), stride, i0, s, vec, t);
  });
  const int keys = imin(s.T, i0 + kBM);  // causal: the block's last row sees keys < i0 + kBM
  for (int j0 = 0; j0 < keys; j0 += kBN) {
    blk.threads([&](int t) {
      load_tile<Blk, HS>(sm.k, qkv + flash::qkv_at(s, b, h, 1, 0), stride, j0, s, vec, t);
      load_tile<Blk, HS>(sm.v, qkv + flash::qkv_at(s, b, h, 2, 0), stride, j0, s, vec, t);
    });
    blk.warps([&](int w) {  // S = Q K^T, the warp's 16 rows
      Acc c[kBN / 16];
      zero_all<Blk, kBN / 16>(c);
      warp_product<Blk, HS, kBN, true>(c, &sm.q[16 * w][0], ld_half<HS>, &sm.k[0][0], ld_half<HS>);
      store_all<Blk, kBN>(&sm.s[16 * w][0], ld_f<HS>, c);
    });
    blk.threads([&](int t) {  // each half's max of its visible scores
      const int r = row_of(t), hf = half_of(t), i = i0 + r;
      float mx = -INFINITY;
      ZF_UNROLL for (int cc = 0; cc < kBN / 2; ++cc) {
        const int c = 2 * cc + hf;
        if (visible(i, j0 + c, s.T)) mx = fmaxf(mx, s.scale * sm.s[r][c]);
      }
      sm.part[r][hf] = mx;
    });
    blk.threads([&](int t) {  // the row's new max; rescale; probabilities
      ForwardRow<HS>& row = rows(t);
      const int r = row_of(t), hf = half_of(t), i = i0 + r;
      if (i >= s.T) {  // past the last row: all zeros, never stored
        ZF_UNROLL for (int cc = 0; cc < kBN / 2; ++cc) sm.p[r][2 * cc + hf] = Blk::to_half(0.0f);
        return;
      }
      // Every real row sees key j0 (j0 <= i0 <= i), so mx is finite; on the
      // first tile m = -inf and corr = exp(-inf) = 0 (o and l are still 0).
      const float mx = fmaxf(row.m, fmaxf(sm.part[r][0], sm.part[r][1]));
      const float corr = expf(row.m - mx);
      float sum = 0.0f;
      ZF_UNROLL for (int cc = 0; cc < kBN / 2; ++cc) {
        const int c = 2 * cc + hf;
        const typename Blk::half p =
            Blk::to_half(visible(i, j0 + c, s.T) ? expf(s.scale * sm.s[r][c] - mx) : 0.0f);
        sm.p[r][c] = p;
        sum += Blk::to_float(p);  // l sums the rounded p that P V multiplies: out stays a weighted mean
      }
      row.l = row.l * corr + sum;
      ZF_UNROLL for (int d = 0; d < HS / 2; ++d) row.o[d] *= corr;
      row.m = mx;
    });
    blk.warps([&](int w) {  // the tile's P V into s (the scores are no longer needed)
      Acc c[HS / 16];
      zero_all<Blk, HS / 16>(c);
      warp_product<Blk, kBN, HS, false>(c, &sm.p[16 * w][0], ld_p, &sm.v[0][0], ld_half<HS>);
      store_all<Blk, HS>(&sm.s[16 * w][0], ld_f<HS>, c);
    });
    blk.threads([&](int t) {
      ForwardRow<HS>& row = rows(t);
      const float* pv = sm.s[row_of(t)];
      ZF_UNROLL for (int dd = 0; dd < HS / 2; ++dd) row.o[dd] += pv[2 * dd + half_of(t)];
    });
  }
  blk.threads([&](int t) { sm.part[row_of(t)][half_of(t)] = rows(t).l; });
  blk.threads([&](int t) {
    const ForwardRow<HS>& row = rows(t);
    const int r = row_of(t), hf = half_of(t), i = i0 + r;
    if (i >= s.T) return;
    const float l = sm.part[r][0] + sm.part[r][1];  // >= 1: the max's own term is exp(0) = 1
    const float inv = 1.0f / l;
    typename Blk::half* o = out + flash::out_at(s, b, h, i);
    ZF_UNROLL for (int dd = 0; dd < HS / 2; ++dd)
      if (2 * dd + hf < s.hs) o[2 * dd + hf] = Blk::to_half(row.o[dd] * inv);
    if (hf == 0) lse[flash::stat_at(s, b, h, i)] = row.m + logf(l);
  });
}

// ---------------------------------------------------------------------------
// Backward. D_i = dout_i . out_i comes first (flash_attention.cuh's
// backward_delta, its own kernel); then two programs, whose writes are
// disjoint (the q part of dqkv; the k and v parts).
//
// dQ: block (qt, b*H + h) owns query rows as the forward does and streams the
// same key/value tiles.

template <class Blk, int HS>
struct DqSmem {
  using half = typename Blk::half;
  alignas(32) half q[kBM][ld_half<HS>];
  alignas(32) half dout[kBM][ld_half<HS>];
  alignas(32) half k[kBN][ld_half<HS>];
  alignas(32) half v[kBN][ld_half<HS>];
  alignas(32) float s[kBM][ld_f<HS>];  // scores S, at the end dQ
  alignas(32) float dp[kBM][ld_f<HS>];  // dP = dO V^T
  alignas(32) half ds[kBM][ld_p];       // dS = P o (dP - D), bf16
  float lse[kBM], D[kBM];
};

template <class Blk, int HS>
ZF_DEV void dq_program(Blk& blk, DqSmem<Blk, HS>& sm, const Shape& s, bool vec,
                       typename Blk::half* dqkv, const typename Blk::half* dout,
                       const typename Blk::half* qkv, const float* lse, const float* D, int b,
                       int h, int qt) {
  using Acc = typename Blk::Acc;
  const int i0 = qt * kBM;
  const size_t stride = 3 * size_t(s.C);
  typename Blk::template PerWarp<Acc[HS / 16]> dq;  // sum_j ds_ij k_j, the warp's rows
  blk.threads([&](int t) {
    load_tile<Blk, HS>(sm.q, qkv + flash::qkv_at(s, b, h, 0, 0), stride, i0, s, vec, t);
    load_tile<Blk, HS>(sm.dout, dout + flash::out_at(s, b, h, 0), size_t(s.C), i0, s, vec, t);
    load_stats(sm.lse, sm.D, lse, D, s, b, h, i0, t);
  });
  blk.warps([&](int w) { zero_all<Blk, HS / 16>(dq(w)); });
  const int keys = imin(s.T, i0 + kBM);
  for (int j0 = 0; j0 < keys; j0 += kBN) {
    blk.threads([&](int t) {
      load_tile<Blk, HS>(sm.k, qkv + flash::qkv_at(s, b, h, 1, 0), stride, j0, s, vec, t);
      load_tile<Blk, HS>(sm.v, qkv + flash::qkv_at(s, b, h, 2, 0), stride, j0, s, vec, t);
    });
    blk.warps([&](int w) {  // S = Q K^T and dP = dO V^T
      Acc c[kBN / 16];
      zero_all<Blk, kBN / 16>(c);
      warp_product<Blk, HS, kBN, true>(c, &sm.q[16 * w][0], ld_half<HS>, &sm.k[0][0], ld_half<HS>);
      store_all<Blk, kBN>(&sm.s[16 * w][0], ld_f<HS>, c);
      zero_all<Blk, kBN / 16>(c);
      warp_product<Blk, HS, kBN, true>(c, &sm.dout[16 * w][0], ld_half<HS>, &sm.v[0][0], ld_half<HS>);
      store_all<Blk, kBN>(&sm.dp[16 * w][0], ld_f<HS>, c);
    });
    blk.threads([&](int t) {  // dS = P o (dP - D), P recomputed from lse
      const int r = row_of(t), hf = half_of(t), i = i0 + r;
      ZF_UNROLL for (int cc = 0; cc < kBN / 2; ++cc) {
        const int c = 2 * cc + hf;
        const float p = visible(i, j0 + c, s.T) ? expf(s.scale * sm.s[r][c] - sm.lse[r]) : 0.0f;
        sm.ds[r][c] = Blk::to_half(p * (sm.dp[r][c] - sm.D[r]));
      }
    });
    blk.warps([&](int w) {  // dQ += dS K
      warp_product<Blk, kBN, HS, false>(dq(w), &sm.ds[16 * w][0], ld_p, &sm.k[0][0], ld_half<HS>);
    });
  }
  blk.warps([&](int w) { store_all<Blk, HS>(&sm.s[16 * w][0], ld_f<HS>, dq(w)); });
  blk.threads([&](int t) {
    const int r = row_of(t), i = i0 + r;
    if (i < s.T)
      add_half_row<Blk, HS>(dqkv + flash::qkv_at(s, b, h, 0, i), sm.s[r], s.scale, half_of(t), s.hs);
  });
}

// dK and dV: block (kt, b*H + h) owns key rows [kt kBN, kt kBN + kBN) (kBN =
// kBM: the same 16 rows a warp) and streams query tiles from i0 = kt kBN to T
// (causal: queries i >= j). Its rows are keys, its columns queries: every
// product is the transpose of dQ's.

static_assert(kBN == kBM, "the key program's warps own 16 key rows each, as the query programs'");

template <class Blk, int HS>
struct KeySmem {
  using half = typename Blk::half;
  alignas(32) half k[kBN][ld_half<HS>];
  alignas(32) half v[kBN][ld_half<HS>];
  alignas(32) half q[kBM][ld_half<HS>];
  alignas(32) half dout[kBM][ld_half<HS>];
  alignas(32) float st[kBN][ld_f<HS>];   // S^T = K Q^T; at the end dK, then dV
  alignas(32) float dpt[kBN][ld_f<HS>];  // dP^T = V dO^T
  alignas(32) half pt[kBN][ld_p];        // P^T, bf16
  alignas(32) half dst[kBN][ld_p];       // dS^T, bf16
  float lse[kBM], D[kBM];
};

template <class Blk, int HS>
ZF_DEV void key_program(Blk& blk, KeySmem<Blk, HS>& sm, const Shape& s, bool vec,
                        typename Blk::half* dqkv, const typename Blk::half* dout,
                        const typename Blk::half* qkv, const float* lse, const float* D, int b,
                        int h, int kt) {
  using Acc = typename Blk::Acc;
  const int j0 = kt * kBN;
  const size_t stride = 3 * size_t(s.C);
  typename Blk::template PerWarp<Acc[HS / 16]> dk, dv;
  blk.threads([&](int t) {
    load_tile<Blk, HS>(sm.k, qkv + flash::qkv_at(s, b, h, 1, 0), stride, j0, s, vec, t);
    load_tile<Blk, HS>(sm.v, qkv + flash::qkv_at(s, b, h, 2, 0), stride, j0, s, vec, t);
  });
  blk.warps([&](int w) {
    zero_all<Blk, HS / 16>(dk(w));
    zero_all<Blk, HS / 16>(dv(w));
  });
  for (int i0 = j0; i0 < s.T; i0 += kBM) {
    blk.threads([&](int t) {
      load_tile<Blk, HS>(sm.q, qkv + flash::qkv_at(s, b, h, 0, 0), stride, i0, s, vec, t);
      load_tile<Blk, HS>(sm.dout, dout + flash::out_at(s, b, h, 0), size_t(s.C), i0, s, vec, t);
      load_stats(sm.lse, sm.D, lse, D, s, b, h, i0, t);
    });
    blk.warps([&](int w) {  // S^T = K Q^T and dP^T = V dO^T
      Acc c[kBM / 16];
      zero_all<Blk, kBM / 16>(c);
      warp_product<Blk, HS, kBM, true>(c, &sm.k[16 * w][0], ld_half<HS>, &sm.q[0][0], ld_half<HS>);
      store_all<Blk, kBM>(&sm.st[16 * w][0], ld_f<HS>, c);
      zero_all<Blk, kBM / 16>(c);
      warp_product<Blk, HS, kBM, true>(c, &sm.v[16 * w][0], ld_half<HS>, &sm.dout[0][0], ld_half<HS>);
      store_all<Blk, kBM>(&sm.dpt[16 * w][0], ld_f<HS>, c);
    });
    blk.threads([&](int t) {  // P^T and dS^T: key row r, query column c
      const int r = row_of(t), hf = half_of(t), j = j0 + r;
      ZF_UNROLL for (int cc = 0; cc < kBM / 2; ++cc) {
        const int c = 2 * cc + hf;
        const float p = visible(i0 + c, j, s.T) ? expf(s.scale * sm.st[r][c] - sm.lse[c]) : 0.0f;
        sm.pt[r][c] = Blk::to_half(p);
        sm.dst[r][c] = Blk::to_half(p * (sm.dpt[r][c] - sm.D[c]));
      }
    });
    blk.warps([&](int w) {  // dV += P^T dO, dK += dS^T Q
      warp_product<Blk, kBM, HS, false>(dv(w), &sm.pt[16 * w][0], ld_p, &sm.dout[0][0], ld_half<HS>);
      warp_product<Blk, kBM, HS, false>(dk(w), &sm.dst[16 * w][0], ld_p, &sm.q[0][0], ld_half<HS>);
    });
  }
  // dK (times scale) into the k part, then dV into the v part, through st.
  blk.warps([&](int w) { store_all<Blk, HS>(&sm.st[16 * w][0], ld_f<HS>, dk(w)); });
  blk.threads([&](int t) {
    const int r = row_of(t), j = j0 + r;
    if (j < s.T)
      add_half_row<Blk, HS>(dqkv + flash::qkv_at(s, b, h, 1, j), sm.st[r], s.scale, half_of(t), s.hs);
  });
  blk.warps([&](int w) { store_all<Blk, HS>(&sm.st[16 * w][0], ld_f<HS>, dv(w)); });
  blk.threads([&](int t) {
    const int r = row_of(t), j = j0 + r;
    if (j < s.T)
      add_half_row<Blk, HS>(dqkv + flash::qkv_at(s, b, h, 2, j), sm.st[r], 1.0f, half_of(t), s.hs);
  });
}

}  // namespace zf::flash_tc
