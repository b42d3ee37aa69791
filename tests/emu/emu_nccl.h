// emu_nccl.h: what the emulated NCCL's two files share: emu_nccl.cpp (the
// API, the cliques of ranks and their waits) and emu_nccl_reduce.cpp (the
// element types and the arithmetic of a collective).
#pragma once

#include <nccl.h>

#include <cstddef>
#include <string>
#include <vector>

namespace zf::emu::nccl {

enum class Kind { all_reduce, reduce_scatter, all_gather, broadcast };
const char* kind_name(Kind k);

// One rank's call of one collective.
struct Call {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;  // NCCL's count: per rank for reduce_scatter (recv) and all_gather (send)
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  std::string describe() const;
  bool same_as(const Call& o) const {
    return kind == o.kind && count == o.count && type == o.type && op == o.op && root == o.root;
  }
};

// Bytes of one element of t; 0 for the types the emulation does not have
// (fp16, fp8).
size_t type_size(ncclDataType_t t);

// Every rank's output from every rank's input: calls[r] is rank r's call,
// and the calls agree (same_as).
//   - Floats are summed in a ring's order: chunk c (kChunk elements) from
//     rank c mod n, rounded to the type at each step (bf16 as NCCL adds it,
//     in float32 then rounded); avg multiplies each input by 1/n, rounded
//     to the type, before the sum (ncclAvg's form for floats).
//   - Integers wrap at their width, as NCCL's do; avg divides the sum by n.
//   - Every rank's all_reduce output has the same bits.
constexpr size_t kChunk = 1024;
void compute(const std::vector<Call>& calls);

}  // namespace zf::emu::nccl
