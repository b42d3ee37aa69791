// host_grads.cpp: two landing buffers, and the float32 accumulation on the host.
#include "host_grads.h"

#include <algorithm>

namespace zf {

HostGrads::HostGrads(const ShardLayout& shards, DType grad_dtype, DType reduce_dtype, bool no_sync,
                     MemoryTracker& mem, Device& dev, Device& host, Communicator& comm, Communicator* replicate,
                     bool pin)
    : layout_(shards), reduce_dtype_(reduce_dtype), dev_(dev), host_(host),
      reducer_(shards, grad_dtype, reduce_dtype, no_sync, mem, dev, comm, replicate),
      shard_(mem, Place::host, Category::grads, DType::f32, shards.shard_total) {
  const auto by_size = [](const UnitShard& a, const UnitShard& b) { return a.shard < b.shard; };
  const size_t largest = std::max_element(shards.units.begin(), shards.units.end(), by_size)->shard;
  for (Tensor& t : landing_) t = Tensor(mem, Place::host, Category::comm, reduce_dtype, largest, pin);
}

void HostGrads::reduce_unit(int g, bool sync) {
  reducer_.reduce_unit(g, sync);
  while (auto f = reducer_.complete(1)) copy_to_host(std::move(*f));
}

void HostGrads::finish() {
  while (auto f = reducer_.complete(0)) copy_to_host(std::move(*f));
  while (!copies_.empty()) land_oldest();
}

void HostGrads::copy_to_host(FlatReducer::Reduced f) {
  // A piece lands before the second after it is sent: two buffers suffice.
  const int landing = next_;
  next_ = 1 - next_;
  const size_t n = layout_.units[f.unit].shard;
  Transfer copy = dev_.to_host_async(landing_[landing].data(), f.mine, n * dtype_size(reduce_dtype_));
  copies_.push_back(Landing{std::move(f), landing, std::move(copy)});
  while (copies_.size() > 1) land_oldest();
}

void HostGrads::land_oldest() {
  Landing& l = copies_.front();
  l.copy.wait();
  const int g = l.f.unit;
  float* dst = piece(g);
  const size_t n = layout_.units[g].shard;
  // The arithmetic of stage 04's device shard, on the host: x + widen(piece).
  if (reduce_dtype_ == DType::f32) host_.add(dst, landing_[l.landing].data(), DType::f32, n);
  else host_.accumulate(dst, landing_[l.landing].as<bf16>(), n);
  reducer_.zero_kept(g);
  copies_.pop_front();  // the reduced buffer (hybrid sharding: my piece's copy) is freed here
}

// On the host CPU, as the sums: its time is the host's (--clock modeled).
void HostGrads::zero() { host_.zero(shard_.data(), shard_.numel() * sizeof(float)); }

}  // namespace zf
