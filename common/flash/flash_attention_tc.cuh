// flash_attention_tc.cuh: flash attention on tensor cores (bf16 in, float32
// accumulate), the programs of its three kernels written once, for any
// "block" type Blk: kernels_cuda_flash_tc.cu runs them on a GPU with
// Blk = a CUDA thread block and WMMA (nvcuda::wmma, 16x16x16 bf16 tiles);
// tests/flash/test_flash_attention_tc.cpp runs them on the CPU with a model
// of a block and of WMMA, so CI checks every index, mask, tail, barrier and
// rounding of the real sequence without a GPU.
//
//   build/tests/test_flash_attention --gtest_filter='FlashTc*' (the CPU harness)
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

}  // namespace zf::flash_tc
