// host_grads.h: the float32 gradient shards on the host (ZeRO-Offload), fed
// by stage 04's reduce-scatters through device->host copies.
//
// Stage 04's FlatReducer reduce-scatters each unit's gradient on the device.
// Where stage 04's FlatGrads adds my piece into a device shard, this class
// copies it device->host into one of two landing buffers (pinned: the copy
// engine writes them) while the next unit's backward runs, and once it has
// landed adds it (widened, under --reduce-dtype bf16) into my float32
// gradient shard on the host, which the CPU AdamW reads. A reduced buffer
// is held one unit longer than in stage 04; the device keeps no gradient
// shard.
#pragma once

#include <deque>

#include "flat_grads.h"

namespace zf {

class HostGrads {
 public:
  // pin: page-locked landing buffers. host: the CPU, which adds the landed pieces.
  HostGrads(const ShardLayout& shards, DType grad_dtype, DType reduce_dtype, bool no_sync, MemoryTracker& mem,
            Device& dev, Device& host, Communicator& comm, Communicator* replicate, bool pin);

  // My accumulated float32 gradient piece of unit g, on the host (S_g elements).
  float* piece(int g) { return shard_.as<float>() + layout_.units[g].shard_offset; }
  float* shard() { return piece(0); }  // all my pieces, unit after unit (shard_total)
  void zero();                         // after the optimizer step

  // Stage 04's backward calls these (fsdp.h's fsdp_backward), as it does FlatGrads's.
  void* begin_unit(int g) { return reducer_.begin_unit(g); }
  void reduce_unit(int g, bool sync);  // reduce-scatter unit g; a completed reduction's copy starts
  void finish();                       // every reduction complete, every piece landed
  uint64_t reduce_scatters() const { return reducer_.reduce_scatters(); }

 private:
  struct Landing {
    FlatReducer::Reduced f;  // its buffer, held until the copy has read it
    int landing;             // the landing buffer it goes to
    Transfer copy;
  };
  void copy_to_host(FlatReducer::Reduced f);
  void land_oldest();

  const ShardLayout& layout_;
  DType reduce_dtype_;
  Device& dev_;
  Device& host_;
  FlatReducer reducer_;
  Tensor shard_;                // shard_total float32 (host, grads)
  Tensor landing_[2];          // the largest S_g of the reduce dtype each (host, comm)
  int next_ = 0;               // the landing buffer the next piece goes to
  std::deque<Landing> copies_;  // at most one waits here while the next is reduced
};

}  // namespace zf
