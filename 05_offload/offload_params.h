// offload_params.h: FSDP's flat parameters with their float32 shards on the
// host (ZeRO-Offload). Stage 04's FlatGathers does the all-gathers and their
// limit; this class keeps what they send: the device's copy of my shard.
//
// My float32 piece of every unit is the host's (category params, place
// host): it is what the CPU AdamW updates, as the device's float32 shard is
// in stage 04. What the device needs is the shard in the gather dtype (bf16
// in the bf16 recipe: FSDP2's cast before the all-gather, done here by the
// optimizer's pass on the host):
//
//   host_copy(g)   my piece of unit g in the gather dtype on the host: a bf16
//                  copy (pinned: the copy engine reads it), or, in fp32, the
//                  float32 shard itself
//   device copy    the same, on the device (category params, 2 or 4 bytes
//                  per shard element): upload(g) copies unit g's piece
//                  host->device after its update, and the all-gathers send it
#pragma once

#include "flat_params.h"

namespace zf {

class OffloadParams {
 public:
  // host: the CPU device that computes on host memory. pin: page-locked host copy.
  OffloadParams(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last, MemoryTracker& mem,
                Device& dev, Device& host, Communicator& comm, bool pin);

  // Stage 04's loops call these (fsdp.h), as they do FlatParams's.
  void unshard(int g) { gathers_.unshard(g, [&] { return input(g); }); }
  bool prefetch(int g) { return gathers_.prefetch(g, [&] { return input(g); }); }
  const void* wait_for_unshard(int g) { return gathers_.wait_for_unshard(g); }
  void reshard(int g) { gathers_.reshard(g); }
  bool kept(int g) const { return gathers_.kept(g); }

  float* piece(int g);  // my float32 piece of unit g, on the host (S_g elements)
  float* shard() { return piece(0); }  // all my pieces, unit after unit (shard_total elements)
  void* host_copy(int g);         // unit g's shard in the gather dtype, on the host (see above)
  void narrow_host_copy(int g);  // rounds unit g's float32 piece into its bf16 host copy (nothing in fp32)
  Transfer upload(int g);        // copies unit g's host copy to the device's

 private:
  // The all-gather's input: the device's copy.
  FlatGathers::Input input(int g) { return {device_copy_.at(layout_.units[g].shard_offset), Tensor()}; }

  const ShardLayout& layout_;
  DType dtype_;
  Device& dev_;
  Device& host_;
  FlatGathers gathers_;
  Tensor shards_;       // shard_total float32 on the host (params)
  Tensor host_copy_;    // bf16 recipe: shard_total bf16 on the host (params)
  Tensor device_copy_;  // shard_total of the gather dtype on the device (params)
};

}  // namespace zf
