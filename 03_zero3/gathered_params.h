// gathered_params.h: what is new in ZeRO-3, parameters that exist whole only
// while a unit computes.
//
// Each rank keeps its piece of every unit's parameters (its shard, S_u
// elements per unit, category params). In FSDP2's words: unshard(u) starts
// an all_gather of unit u into a temporary buffer (category gathered);
// wait_for_unshard(u) waits for it and returns the unit's full parameters;
// reshard(u) frees the buffer. The stage prefetches: it unshards the next
// unit before computing this one, so at most two units are gathered at any
// moment.
#pragma once

#include <map>

#include "comm.h"
#include "shard.h"
#include "tensor.h"

namespace zf {

class GatheredParams {
 public:
  GatheredParams(const ShardLayout& shards, DType dtype, MemoryTracker& mem, Communicator& comm);

  void unshard(int u);                  // start gathering unit u (no-op if already gathered or in flight)
  const void* wait_for_unshard(int u);  // wait for unit u; its N * S_u elements, the first n_u the unit's
  void reshard(int u);                  // free unit u's buffer
  int gathered() const { return int(buffers_.size()); }

  void* piece(int u);       // my piece of unit u's parameters (S_u elements)

 private:
  struct Gathered {
    Tensor full;
    CommHandle handle;
  };
  const ShardLayout& shards_;
  DType dtype_;
  MemoryTracker& mem_;
  Communicator& comm_;
  Tensor shard_;  // shard_total elements, my pieces: the only persistent parameters
  std::map<int, Gathered> buffers_;
};

}  // namespace zf
