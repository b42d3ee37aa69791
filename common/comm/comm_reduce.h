// comm_reduce.h: the arithmetic every Communicator backend's reductions share
// (private to the comm backends; stages only see comm.h).
//
// Two things decide the bits a reduction gives: how a buffer is cut into N
// pieces (piece_of: which rank reduces which elements) and the order and
// precision of the sum (reduce_in_rank_order: rank 0 + rank 1 + ... in
// float32, bf16 rounded once at the end). The `threads` backend and the `mpi`
// backend both call these two functions, so a run with --ranks 4 and one under
// `mpirun -np 4` give the same losses bit for bit.
#pragma once

#include <cstddef>
#include <vector>

#include "comm.h"

namespace zf {

// Rank q's piece of a buffer of `count` elements cut into N contiguous,
// near-equal pieces: the first count % N pieces get one element more.
struct Piece {
  size_t begin, size;
};
Piece piece_of(size_t count, int nranks, int q);

// For each i in [0, n):
//   v = src[0][i] + src[1][i] + ... + src[N-1][i]   summed in exactly this order,
//   v = v / N                                      for avg,
//   dst[d][i] = v                                  for every destination d.
// f32 and bf16 sum in float32 (bf16 rounded once, at the end); i64 and i32 sum
// exactly in their own type (avg rounds toward zero). A destination may also
// be a source (every block is read from all sources before it is written).
void reduce_in_rank_order(const std::vector<const void*>& src, const std::vector<void*>& dst,
                          size_t n, DType dt, ReduceOp op);

}  // namespace zf
