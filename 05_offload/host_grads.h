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
//
// With --delay-update there are two float32 shards (4S more on the host):
// the CPU update of one step reads the gradients it was given while the
// next step's pieces land in the other (flip()).
#pragma once

#include <vector>

#include "flat_grads.h"

namespace zf {

class HostGrads final : public GradSink {
 public:
  // buffers: 1, or 2 for --delay-update (see above).
  HostGrads(const ShardLayout& shards, DType reduce_dtype, MemoryTracker& mem, Device& dev, bool pin,
            int buffers = 1);

  Transfer send(int g, const void* piece, DType dtype, size_t n) override;
  void landed(int g) override;

  // My accumulated float32 gradient piece of unit g, on the host (S_g
  // elements): in the buffer the pieces land in now, or in `buffer`.
  float* shard(int g) { return shard(g, current_); }
  float* shard(int g, int buffer);
  void zero() { zero(current_); }  // after the optimizer step
  void zero(int buffer);
  // The next pieces land in the other buffer (zeroed: it was read and
  // zeroed by the update before); returns the buffer just filled.
  int flip();
  int current() const { return current_; }

 private:
  const ShardLayout& layout_;
  DType dtype_;
  Device& dev_;
  std::vector<Tensor> shards_;  // shard_total float32 each, 1 or 2 (host, grads)
  int current_ = 0;             // the buffer the pieces land in
  Tensor landing_[2];          // the largest S_g of the reduce dtype each (host, comm)
  std::vector<int> slot_of_;   // unit -> the landing buffer its piece is in
  int next_ = 0;
};

}  // namespace zf
