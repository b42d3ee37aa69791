// offload_params.cpp: the host copy, its upload, and the all-gather's input.
#include "offload_params.h"

#include <cstring>

#include "check.h"

namespace zf::extensions {

OffloadParams::OffloadParams(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last,
                             MemoryTracker& mem, Device& dev, Device& host, Communicator& comm, bool offload_params,
                             bool pin, bool delay_update, bool shards_on_disk)
    : layout_(shards), dtype_(gather_dtype), mem_(mem), dev_(dev), host_(host), offload_params_(offload_params),
      shards_on_disk_(shards_on_disk), gathers_(shards, gather_dtype, opt, last, mem, comm) {
  REQUIRE(!shards_on_disk || gather_dtype != DType::f32, "the float32 shards go to disk only when a bf16 copy stays");
  // The float32 shards on the host (pinned in fp32, where the copies read
  // them), or none when they are in files.
  if (!shards_on_disk)
    shards_ = Tensor(mem, Place::host, Category::params, DType::f32, shards.shard_total, pin && gather_dtype == DType::f32);
  if (gather_dtype != DType::f32)
    host_copy_ = Tensor(mem, Place::host, Category::params, gather_dtype, shards.shard_total, pin);
  if (!offload_params)
    device_copy_ = Tensor(mem, Place::device, Category::params, gather_dtype, shards.shard_total);
  else if (delay_update)
    published_ = Tensor(mem, Place::host, Category::params, gather_dtype, shards.shard_total, pin);
}

float* OffloadParams::piece(int g) {
  REQUIRE(!shards_.empty() || layout_.shard_total == 0, "the float32 shards are not kept here");
  return shards_.as<float>() + layout_.units[g].shard_offset;
}

void* OffloadParams::host_copy(int g) {
  if (dtype_ == DType::f32) return piece(g);
  return host_copy_.at(layout_.units[g].shard_offset);
}

void OffloadParams::narrow_host_copy(int g) {
  if (dtype_ != DType::f32 && !shards_on_disk_) host_.narrow(piece(g), static_cast<bf16*>(host_copy(g)), layout_.units[g].shard);
}

Transfer OffloadParams::upload(int g) {
  const UnitShard& us = layout_.units[g];
  if (offload_params_) {
    // Host to host: the link is crossed by each all-gather's input (send_buffer).
    if (!published_.empty()) host_.copy(published_.at(us.shard_offset), host_copy(g), us.shard * dtype_size(dtype_));
    return {};
  }
  return dev_.to_device_async(device_copy_.at(us.shard_offset), host_copy(g), us.shard * dtype_size(dtype_));
}

FlatGathers::Input OffloadParams::input(int g) {
  const UnitShard& us = layout_.units[g];
  if (!offload_params_) return {device_copy_.at(us.shard_offset), Tensor()};
  // The all-gather's input comes from the host now, and is freed once it is read.
  Tensor staged(mem_, Place::device, Category::comm, dtype_, us.shard);
  const void* src = published_.empty() ? host_copy(g) : published_.at(us.shard_offset);
  dev_.to_device_async(staged.data(), src, us.shard * dtype_size(dtype_)).wait();
  return FlatGathers::Input::made_for_it(std::move(staged));
}

}  // namespace zf::extensions
