// flat_params.cpp: cast, all-gather, release; and the limit on what is gathered.
#include "flat_params.h"

#include "check.h"

namespace zf {

FlatGathers::FlatGathers(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last,
                         MemoryTracker& mem, Communicator& comm)
    : layout_(shards), dtype_(gather_dtype), reshard_after_forward_(opt.reshard_after_forward),
      max_gathered_(opt.max_gathered), last_(last), mem_(mem), comm_(comm) {}

int FlatGathers::counted() const {
  int n = 0;
  for (const auto& [g, b] : buffers_) n += kept(g) ? 0 : 1;
  return n;
}

void FlatGathers::check_limit(int g) const {
  REQUIRE(max_gathered_ == 0 || kept(g) || counted() < max_gathered_,
          "unshard(" << g << ") with " << counted() << " units gathered, the limit " << max_gathered_);
}

void FlatGathers::start(int g, Gathered b) {
  b.handle = comm_.all_gather_async(b.input.send, b.full.data(), layout_.units[g].shard, dtype_);
  buffers_.emplace(g, std::move(b));
}

const void* FlatGathers::wait_for_unshard(int g) {
  auto it = buffers_.find(g);
  REQUIRE(it != buffers_.end(), "unit " << g << " was not unsharded");
  it->second.handle.wait();
  it->second.input.made = Tensor();  // the all-gather has read it
  return it->second.full.data();
}

void FlatGathers::reshard(int g) {
  auto it = buffers_.find(g);
  REQUIRE(it != buffers_.end(), "unit " << g << " was not unsharded");
  it->second.handle.wait();  // never free a buffer a collective may still write
  buffers_.erase(it);        // the tracker's gathered bytes drop here
}

FlatParams::FlatParams(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last,
                       MemoryTracker& mem, Device& dev, Communicator& comm)
    : layout_(shards), dtype_(gather_dtype), mem_(mem), dev_(dev), gathers_(shards, gather_dtype, opt, last, mem, comm),
      shard_(mem, Place::device, Category::params, DType::f32, shards.shard_total) {}

float* FlatParams::piece(int g) { return shard_.as<float>() + layout_.units[g].shard_offset; }

FlatGathers::Input FlatParams::input(int g) {
  if (dtype_ == DType::f32) return {piece(g), Tensor()};
  // FSDP2's cast before the all-gather: half the bytes on the wire.
  const size_t n = layout_.units[g].shard;
  Tensor cast(mem_, Place::device, Category::comm, dtype_, n);
  dev_.narrow(piece(g), cast.as<bf16>(), n);
  return FlatGathers::Input::made_for_it(std::move(cast));
}

}  // namespace zf
