// offload_params.cpp: the host's shards, their copy in the gather dtype, its upload.
#include "offload_params.h"

namespace zf {

OffloadParams::OffloadParams(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last,
                             MemoryTracker& mem, Device& dev, Device& host, Communicator& comm, bool pin)
    : layout_(shards), dtype_(gather_dtype), dev_(dev), host_(host),
      gathers_(shards, gather_dtype, opt, last, mem, comm),
      // pinned in fp32, where the copies read the float32 shards themselves
      shards_(mem, Place::host, Category::params, DType::f32, shards.shard_total, pin && gather_dtype == DType::f32),
      device_copy_(mem, Place::device, Category::params, gather_dtype, shards.shard_total) {
  if (gather_dtype != DType::f32)
    host_copy_ = Tensor(mem, Place::host, Category::params, gather_dtype, shards.shard_total, pin);
}

float* OffloadParams::piece(int g) { return shards_.as<float>() + layout_.units[g].shard_offset; }

void* OffloadParams::host_copy(int g) {
  if (dtype_ == DType::f32) return piece(g);
  return host_copy_.at(layout_.units[g].shard_offset);
}

void OffloadParams::narrow_host_copy(int g) {
  if (dtype_ != DType::f32) host_.narrow(piece(g), static_cast<bf16*>(host_copy(g)), layout_.units[g].shard);
}

Transfer OffloadParams::upload(int g) {
  const UnitShard& us = layout_.units[g];
  return dev_.to_device_async(device_copy_.at(us.shard_offset), host_copy(g), us.shard * dtype_size(dtype_));
}

}  // namespace zf
