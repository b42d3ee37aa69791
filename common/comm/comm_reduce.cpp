// comm_reduce.cpp: the rank-ordered reduction and the piece partition that
// every host backend shares (comm_reduce.h): the threads and the mpi
// backends sum with the very same loops, so they give the same bits.
#include "comm_reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "simd.h"

namespace zf {

Piece piece_of(size_t count, int nranks, int q) {
  const size_t base = count / nranks, extra = count % nranks;
  const size_t uq = size_t(q);
  return {uq * base + std::min(uq, extra), base + (uq < extra ? 1 : 0)};
}

namespace {

// The reduction every collective shares. For each i in [0, n):
//   v = src[0][i] + src[1][i] + ... + src[N-1][i]   summed in exactly this order,
//   v = v / N                                      for avg,
//   dst[d][i] = v                                  for every destination d.
// It works one block at a time in an accumulator that stays in L1: all the
// sources of a block are read before the block is written, so a destination
// may also be a source (in-place all_reduce: rank r's output piece is its own
// input piece), and the finished block is still in cache when it is written
// to several destinations. The loops are plain and restrict-qualified so the
// compiler vectorises them, at the CPU's own width (ZF_VECTOR_CLONES): each
// element is the same sum in any width, so the bits do not change.
constexpr size_t kBlock = 2048;  // elements: 8 KiB of float32 accumulator

void write_block(const std::vector<void*>& dst, size_t byte_offset, const void* block,
                 size_t bytes) {
  for (void* d : dst) std::memcpy(static_cast<char*>(d) + byte_offset, block, bytes);
}

ZF_VECTOR_CLONES
void reduce_f32(const std::vector<const void*>& src, const std::vector<void*>& dst, size_t n,
                ReduceOp op) {
  const int N = int(src.size());
  alignas(64) float acc[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    const float* __restrict s0 = static_cast<const float*>(src[0]) + b;
    if (N == 1) {
      for (size_t i = 0; i < m; i++) acc[i] = s0[i];
    } else {  // the first two sources in one pass: one sweep over acc fewer
      const float* __restrict s1 = static_cast<const float*>(src[1]) + b;
      for (size_t i = 0; i < m; i++) acc[i] = s0[i] + s1[i];
    }
    for (int q = 2; q < N; q++) {
      const float* __restrict s = static_cast<const float*>(src[q]) + b;
      for (size_t i = 0; i < m; i++) acc[i] += s[i];
    }
    // A true division (not a multiplication by 1/N): the correctly rounded mean.
    if (op == ReduceOp::avg)
      for (size_t i = 0; i < m; i++) acc[i] /= float(N);
    write_block(dst, b * sizeof(float), acc, m * sizeof(float));
  }
}

ZF_VECTOR_CLONES
void reduce_bf16(const std::vector<const void*>& src, const std::vector<void*>& dst, size_t n,
                 ReduceOp op) {
  const int N = int(src.size());
  alignas(64) float acc[kBlock];
  alignas(64) bf16 out[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    const bf16* __restrict s0 = static_cast<const bf16*>(src[0]) + b;
    for (size_t i = 0; i < m; i++) acc[i] = bf16_to_float(s0[i]);  // exact
    for (int q = 1; q < N; q++) {
      const bf16* __restrict s = static_cast<const bf16*>(src[q]) + b;
      for (size_t i = 0; i < m; i++) acc[i] += bf16_to_float(s[i]);
    }
    if (op == ReduceOp::avg)
      for (size_t i = 0; i < m; i++) acc[i] /= float(N);
    for (size_t i = 0; i < m; i++) out[i] = float_to_bf16(acc[i]);  // rounded once, here
    write_block(dst, b * sizeof(bf16), out, m * sizeof(bf16));
  }
}

// int64 (and int32) sum exactly in their own type: counters, token counts.
template <class I>
void reduce_int(const std::vector<const void*>& src, const std::vector<void*>& dst, size_t n,
                ReduceOp op) {
  const int N = int(src.size());
  alignas(64) I acc[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    const I* __restrict s0 = static_cast<const I*>(src[0]) + b;
    for (size_t i = 0; i < m; i++) acc[i] = s0[i];
    for (int q = 1; q < N; q++) {
      const I* __restrict s = static_cast<const I*>(src[q]) + b;
      for (size_t i = 0; i < m; i++) acc[i] += s[i];
    }
    if (op == ReduceOp::avg)
      for (size_t i = 0; i < m; i++) acc[i] /= I(N);  // integer mean, rounded toward zero
    write_block(dst, b * sizeof(I), acc, m * sizeof(I));
  }
}

}  // namespace

void reduce_in_rank_order(const std::vector<const void*>& src, const std::vector<void*>& dst,
                          size_t n, DType dt, ReduceOp op) {
  if (n == 0) return;
  switch (dt) {
    case DType::f32: return reduce_f32(src, dst, n, op);
    case DType::bf16: return reduce_bf16(src, dst, n, op);
    case DType::i64: return reduce_int<int64_t>(src, dst, n, op);
    case DType::i32: return reduce_int<int32_t>(src, dst, n, op);
  }
}

}  // namespace zf
