// host_adamw.h: AdamW over one rank's shard in host memory, run by the CPU
// (ZeRO-Offload's CPU Adam).
//
// The moments m and v of my shard live on the host (8 bytes per shard
// element, category optimizer); the float32 parameter shard, also on the
// host (offload_params.h), is its own master, as in stage 04. The CPU device
// runs AdamW (CpuAdamW on --optimizer-threads threads) one parameter span at
// a time (shard.h's for_each_span: the decay mask), and in the bf16 recipe
// rounds each updated span into the bf16 copy the device receives, in the
// same pass. The arithmetic is stage 04's AdamW, so the bits are too.
#pragma once

#include <vector>

#include "adamw.h"
#include "comm.h"
#include "device.h"
#include "initial_state.h"
#include "model.h"
#include "shard.h"
#include "tensor.h"

namespace zf {

class HostAdamW {
 public:
  // flat: the FSDP units' layout (its ParamSpecs give the decay mask).
  // host: the CPU device that computes on host memory.
  HostAdamW(const ModelLayout& flat, const ShardLayout& shards, MemoryTracker& mem, Device& host);

  // On --resume, the moments from the checkpoint (a fresh run's are zeros).
  void load(const InitialState& init);
  // AdamW on my piece of unit g, with the step's settings `adam`. master,
  // grads: my float32 shards (shard_total elements, host), master updated in
  // place; copy: the bf16 copy of the same layout that the update rounds
  // into (nullptr in fp32, where the master is what the device receives).
  void update(int g, float* master, const float* grads, bf16* copy, const AdamWConfig& adam, long step, float scale);
  // My piece of unit g of `kind` (the parameters: master's), into host (ModelStates::copy_piece).
  void copy_piece(StateKind kind, int g, const float* master, float* host) const;
  // The whole model's float32 values of `kind`, from every rank's pieces
  // (ModelStates::full); comm_dev: the rank's device, which the collectives stage through.
  std::vector<float> gather(StateKind kind, const float* master, Communicator& comm, Device& comm_dev,
                            bool every_rank) const;

 private:
  const ModelLayout& flat_;
  const ShardLayout& shards_;
  Device& host_;
  Tensor m_, v_;  // shard_total float32 each, on the host
};

}  // namespace zf
