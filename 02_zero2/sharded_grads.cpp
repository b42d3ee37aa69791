// sharded_grads.cpp: the reduce-scatter-as-you-go gradient path of ZeRO-2.
#include "sharded_grads.h"

#include <cstring>

#include "check.h"

namespace zf {

ShardedGradients::ShardedGradients(const ShardLayout& shards, DType dtype, MemoryTracker& mem, Device& dev,
                                   Communicator& comm)
    : shards_(shards), dtype_(dtype), mem_(mem), dev_(dev), comm_(comm),
      shard_(mem, Place::device, Category::grads, dtype, shards.shard_total) {}

void* ShardedGradients::begin_unit(int u) {
  REQUIRE(computing_unit_ < 0, "begin_unit(" << u << ") while unit " << computing_unit_ << " is not reduced");
  computing_ = Tensor(mem_, Place::device, Category::comm, dtype_, shards_.units[u].padded());  // zero-filled
  computing_unit_ = u;
  return computing_.data();
}

void ShardedGradients::reduce_unit(int u) {
  REQUIRE(computing_unit_ == u, "reduce_unit(" << u << ") but the unit being computed is " << computing_unit_);
  const UnitShard& us = shards_.units[u];
  InFlight f{u, std::move(computing_), {}};
  f.handle = comm_.reduce_scatter_async(f.full.data(), my_piece_in(f), us.shard, dtype_, ReduceOp::sum);
  computing_unit_ = -1;
  inflight_.push_back(std::move(f));
  // Keep one reduction in flight behind the next unit's backward, no more.
  while (inflight_.size() > 1) complete_oldest();
}

void ShardedGradients::complete_oldest() {
  InFlight& f = inflight_.front();
  f.handle.wait();
  dev_.add(piece(f.unit), my_piece_in(f), dtype_, shards_.units[f.unit].shard);
  inflight_.pop_front();  // releases the full gradient: the tracker's comm bytes drop here
}

void* ShardedGradients::my_piece_in(InFlight& f) {
  return static_cast<char*>(f.full.data()) +
         size_t(shards_.rank) * shards_.units[f.unit].shard * dtype_size(dtype_);
}

void ShardedGradients::finish() {
  while (!inflight_.empty()) complete_oldest();
}

void* ShardedGradients::piece(int u) {
  return static_cast<char*>(shard_.data()) + shards_.units[u].shard_offset * dtype_size(dtype_);
}

void ShardedGradients::zero() { dev_.zero(shard_.data(), shard_.bytes()); }

}  // namespace zf
