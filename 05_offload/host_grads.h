// host_grads.h: the float32 gradient shards on the host (ZeRO-Offload), fed
// by stage 04's reduce-scatters through device->host copies.
//
// Stage 04's FlatGrads reduce-scatters each unit's gradient on the device,
// and hands my reduced piece to this sink instead of adding it into a device
// shard: send() copies it device->host asynchronously into one of two
// landing buffers (pinned: the copy engine writes them), while the next
// unit's backward runs; landed() adds it (widened, under --reduce-dtype
// bf16) into my float32 gradient shard on the host, which the CPU AdamW
// reads. The device keeps no gradient shard at all: the full gradient of
// the unit computing and the one being reduced, as in stage 04, and nothing
// once a step's backward is done.
#pragma once

#include <vector>

#include "flat_grads.h"

namespace zf {

class HostGrads final : public GradSink {
 public:
  HostGrads(const ShardLayout& shards, DType reduce_dtype, MemoryTracker& mem, Device& dev, bool pin);

  Transfer send(int g, const void* piece, DType dtype, size_t n) override;
  void landed(int g) override;

  float* shard(int g);  // my accumulated float32 gradient piece of unit g, on the host (S_g elements)
  void zero();          // after the optimizer step

 private:
  const ShardLayout& layout_;
  DType dtype_;
  Device& dev_;
  Tensor shards_;              // shard_total float32 (host, grads)
  Tensor landing_[2];          // the largest S_g of the reduce dtype each (host, comm)
  std::vector<int> slot_of_;   // unit -> the landing buffer its piece is in
  int next_ = 0;
};

}  // namespace zf
