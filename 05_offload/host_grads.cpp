// host_grads.cpp: two landing buffers, and the float32 accumulation on the host.
#include "host_grads.h"

#include <algorithm>

#include "check.h"

namespace zf {

namespace {
size_t largest_shard(const ShardLayout& shards) {
  size_t n = 0;
  for (const auto& us : shards.units) n = std::max(n, us.shard);
  return n;
}
}  // namespace

HostGrads::HostGrads(const ShardLayout& shards, DType reduce_dtype, MemoryTracker& mem, Device& dev, bool pin,
                     int buffers)
    : layout_(shards), dtype_(reduce_dtype), dev_(dev), slot_of_(shards.units.size(), -1) {
  REQUIRE(buffers == 1 || buffers == 2, "HostGrads keeps 1 or 2 gradient buffers, not " << buffers);
  for (int b = 0; b < buffers; ++b)
    shards_.emplace_back(mem, Place::host, Category::grads, DType::f32, shards.shard_total);
  for (Tensor& t : landing_) t = Tensor(mem, Place::host, Category::comm, reduce_dtype, largest_shard(shards), pin);
}

float* HostGrads::shard(int g, int buffer) {
  return shards_.at(buffer).as<float>() + layout_.units[g].shard_offset;
}

int HostGrads::flip() {
  const int filled = current_;
  current_ = (current_ + 1) % int(shards_.size());
  return filled;
}

Transfer HostGrads::send(int g, const void* piece, DType dtype, size_t n) {
  REQUIRE(dtype == dtype_ && n == layout_.units[g].shard, "unit " << g << "'s piece is not what HostGrads expects");
  // FlatGrads lands a piece before it sends the second after it: two buffers suffice.
  const int slot = next_;
  next_ = 1 - next_;
  slot_of_[g] = slot;
  return dev_.to_host_async(landing_[slot].data(), piece, n * dtype_size(dtype));
}

void HostGrads::landed(int g) {
  const int slot = slot_of_[g];
  REQUIRE(slot >= 0, "unit " << g << " landed without being sent");
  slot_of_[g] = -1;
  float* dst = shard(g);
  const size_t n = layout_.units[g].shard;
  // The arithmetic of stage 04's device shard, on the host: x + widen(piece).
  if (dtype_ == DType::f32) {
    const float* src = landing_[slot].as<float>();
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  } else {
    const bf16* src = landing_[slot].as<bf16>();
    for (size_t i = 0; i < n; ++i) dst[i] += bf16_to_float(src[i]);
  }
}

void HostGrads::zero(int buffer) {
  Tensor& t = shards_.at(buffer);
  std::fill_n(t.as<float>(), t.numel(), 0.0f);
}

}  // namespace zf
