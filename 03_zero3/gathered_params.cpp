// gathered_params.cpp: unshard (all-gather) on demand, reshard (free) after use.
#include "gathered_params.h"

#include "check.h"

namespace zf {

GatheredParams::GatheredParams(const ShardLayout& shards, DType dtype, MemoryTracker& mem, Communicator& comm)
    : shards_(shards), dtype_(dtype), mem_(mem), comm_(comm),
      shard_(mem, Place::device, Category::params, dtype, shards.shard_total) {}

void* GatheredParams::piece(int u) {
  return static_cast<char*>(shard_.data()) + shards_.units[u].shard_offset * dtype_size(dtype_);
}

void GatheredParams::unshard(int u) {
  if (buffers_.count(u)) return;
  const UnitShard& us = shards_.units[u];
  Gathered g{Tensor(mem_, Place::device, Category::gathered, dtype_, us.padded()), {}};
  g.handle = comm_.all_gather_async(piece(u), g.full.data(), us.shard, dtype_);
  buffers_.emplace(u, std::move(g));
}

const void* GatheredParams::wait_for_unshard(int u) {
  auto it = buffers_.find(u);
  REQUIRE(it != buffers_.end(), "unit " << u << " was not unsharded");
  it->second.handle.wait();
  return it->second.full.data();
}

void GatheredParams::reshard(int u) {
  auto it = buffers_.find(u);
  REQUIRE(it != buffers_.end(), "unit " << u << " was not unsharded");
  it->second.handle.wait();  // never free a buffer a collective may still write
  buffers_.erase(it);        // the tracker's gathered bytes drop here
}

}  // namespace zf
