// flat_params.cpp: cast, all-gather, release; and the limit on what is gathered.
#include "flat_params.h"

#include "check.h"

namespace zf {

FlatParams::FlatParams(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last,
                       MemoryTracker& mem, Device& dev, Communicator& comm)
    : FlatParams(shards, gather_dtype, opt, last, mem, dev, comm,
                 Tensor(mem, Place::device, Category::params, DType::f32, shards.shard_total)) {}

FlatParams::FlatParams(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last,
                       MemoryTracker& mem, Device& dev, Communicator& comm, Tensor float32_shards)
    : layout_(shards), dtype_(gather_dtype), reshard_after_forward_(opt.reshard_after_forward),
      max_gathered_(opt.max_gathered), last_(last), mem_(mem), dev_(dev), comm_(comm),
      shards_(std::move(float32_shards)) {}

float* FlatParams::piece(int g) {
  REQUIRE(!shards_.empty() || layout_.shard_total == 0, "the float32 shards are not kept here");
  return shards_.as<float>() + layout_.units[g].shard_offset;
}

int FlatParams::counted() const {
  int n = 0;
  for (const auto& [g, b] : buffers_) n += kept(g) ? 0 : 1;
  return n;
}

const void* FlatParams::send_buffer(int g, Gathered& b) {
  if (dtype_ == DType::f32) return piece(g);
  // FSDP2's cast before the all-gather: half the bytes on the wire.
  const size_t n = layout_.units[g].shard;
  b.cast = Tensor(mem_, Place::device, Category::comm, dtype_, n);
  dev_.narrow(piece(g), b.cast.as<bf16>(), n);
  return b.cast.data();
}

void FlatParams::issue(int g) {
  const UnitShard& us = layout_.units[g];
  Gathered b{Tensor(mem_, Place::device, Category::gathered, dtype_, us.padded()), {}, {}};
  const void* send = send_buffer(g, b);
  b.handle = comm_.all_gather_async(send, b.full.data(), us.shard, dtype_);
  ++all_gathers_;
  buffers_.emplace(g, std::move(b));
}

void FlatParams::unshard(int g) {
  if (unsharded(g)) return;
  REQUIRE(max_gathered_ == 0 || kept(g) || counted() < max_gathered_,
          "unshard(" << g << ") with " << counted() << " units gathered, the limit " << max_gathered_);
  issue(g);
}

bool FlatParams::prefetch(int g) {
  if (g < 0 || g >= int(layout_.units.size()) || unsharded(g)) return true;
  if (max_gathered_ > 0 && !kept(g) && counted() >= max_gathered_) return false;
  issue(g);
  return true;
}

const void* FlatParams::wait_for_unshard(int g) {
  auto it = buffers_.find(g);
  REQUIRE(it != buffers_.end(), "unit " << g << " was not unsharded");
  it->second.handle.wait();
  it->second.cast = Tensor();  // the all-gather has read it
  return it->second.full.data();
}

void FlatParams::reshard(int g) {
  auto it = buffers_.find(g);
  REQUIRE(it != buffers_.end(), "unit " << g << " was not unsharded");
  it->second.handle.wait();  // never free a buffer a collective may still write
  buffers_.erase(it);        // the tracker's gathered bytes drop here
}

}  // namespace zf
