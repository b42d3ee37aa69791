// host_grads.h: the float32 gradient shards on the host (ZeRO-Offload), fed
// by stage 04's reduce-scatters through device->host copies.
//
// Stage 04's FlatReducer reduce-scatters each unit's gradient on the device;
// this class takes my reduced piece from it instead of adding it into a
// device shard, as stage 04's FlatGrads does: it copies the piece device->host
// asynchronously into one of two landing buffers (pinned: the copy engine
// writes them), while the next unit's backward runs, and when the copy has
// landed adds it (widened, under --reduce-dtype bf16) into my float32
// gradient shard on the host, which the CPU AdamW reads. A reduced buffer is
// held until its piece has left it: one unit longer than in stage 04. The
// device keeps no gradient shard at all, and nothing once a step's backward
// is done.
//
// With --delay-update there are two float32 shards (4S more on the host):
// the CPU update of one step reads the gradients it was given while the
// next step's pieces land in the other (flip()).
#pragma once

#include <deque>
#include <vector>

#include "flat_grads.h"

namespace zf::extensions {

class HostGrads {
 public:
  // buffers: 1, or 2 for --delay-update (see above). pin: page-locked
  // landing buffers. host: the CPU, which adds the landed pieces.
  HostGrads(const ShardLayout& shards, DType grad_dtype, DType reduce_dtype, bool no_sync, MemoryTracker& mem,
            Device& dev, Device& host, Communicator& comm, Communicator* replicate, bool pin, int buffers = 1);

  // My accumulated float32 gradient piece of unit g, on the host (S_g
  // elements): in the buffer the pieces land in now, or in `buffer`.
  float* piece(int g) { return piece(g, current_); }
  float* piece(int g, int buffer);
  float* shard(int buffer) { return piece(0, buffer); }  // all my pieces in `buffer` (shard_total)
  void zero() { zero(current_); }  // after the optimizer step
  void zero(int buffer);
  // The next pieces land in the other buffer (zeroed: it was read and
  // zeroed by the update before); returns the buffer just filled.
  int flip();
  int current() const { return current_; }

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
  std::vector<Tensor> shards_;  // shard_total float32 each, 1 or 2 (host, grads)
  int current_ = 0;             // the buffer the pieces land in
  Tensor landing_[2];          // the largest S_g of the reduce dtype each (host, comm)
  int next_ = 0;               // the landing buffer the next piece goes to
  std::deque<Landing> copies_;  // at most one waits here while the next is reduced
};

}  // namespace zf::extensions
