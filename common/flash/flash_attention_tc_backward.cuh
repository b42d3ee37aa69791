// flash_attention_tc_backward.cuh: the backward programs of the tensor-core
// flash attention (dQ; dK and dV), over the same block type and pieces as the
// forward in flash_attention_tc.cuh (read that file's header first: phases,
// thread layout, the Blk interface). Run on the GPU by kernels_cuda_flash_tc.cu
// and on the CPU by tests/flash/test_flash_attention_tc.cpp.
//
//   build/tests/test_flash_attention --gtest_filter='FlashTc*'   (the CPU harness)
#pragma once

#include "flash_attention_tc.cuh"

namespace zf::flash_tc {

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
