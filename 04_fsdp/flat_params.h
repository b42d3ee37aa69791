// flat_params.h: FSDP's sharded flat parameters, unsharded on demand.
//
// Each rank keeps its shard of every FSDP unit's flat parameter as float32
// (category params), in both recipes: it is what AdamW updates, so the bf16
// recipe needs no master copy (FSDP2's storage). To unshard unit g, the
// shard is cast to the parameter dtype (bf16 in the bf16 recipe: FSDP2's
// MixedPrecisionPolicy casts before the all-gather, so it moves half the
// bytes) and all-gathered into a buffer of N * S_g elements (category
// gathered); reshard(g) frees it.
//
//   unshard(g)   unit g is needed now: issue its all-gather unless it is
//                gathered or in flight. It never exceeds the limit, because
//                the stage calls it after resharding what it computed, and a
//                prefetch refused for g holds back every unit after g
//                (checked)
//   prefetch(g)  unit g will be needed soon: issue its all-gather if the
//                limit allows (--max-gathered M: at most M units gathered or
//                in flight, those kept for the backward not counted; 0: no
//                limit). A refused prefetch is simply asked again before the
//                next unit computes, so it goes out as soon as a unit is
//                released (FSDP1's limit_all_gathers, without blocking: one
//                thread issues and computes here). So --prefetch D reaches
//                at most M - 1 units ahead: raise M (or 0) for a deeper one
//   wait_for_unshard(g)  waits for unit g's all-gather; its full parameters
//   reshard(g)   frees unit g's gathered buffer
//
// Units kept for the backward (`kept`: the head always, as FSDP2 keeps the
// last module of forward; every unit with --reshard-after-forward false) are
// not resharded after their forward, and not counted by the limit.
#pragma once

#include <map>

#include "comm.h"
#include "config.h"
#include "device.h"
#include "shard.h"
#include "tensor.h"

namespace zf {

class FlatParams {
 public:
  // gather_dtype: the recipe's parameter dtype. last: the head's unit. The
  // float32 shards are on the device.
  FlatParams(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last,
             MemoryTracker& mem, Device& dev, Communicator& comm);
  virtual ~FlatParams() = default;

  void unshard(int g);
  bool prefetch(int g);
  const void* wait_for_unshard(int g);
  void reshard(int g);

  bool kept(int g) const { return !reshard_after_forward_ || g == last_; }
  bool unsharded(int g) const { return buffers_.count(g) > 0; }  // gathered, or its all-gather in flight
  int counted() const;                  // gathered or in flight, not kept: what --max-gathered bounds
  uint64_t all_gathers() const { return all_gathers_; }

  float* piece(int g);                  // my float32 piece of unit g (S_g elements)
  Tensor& shards() { return shards_; }

 protected:
  struct Gathered {
    Tensor full;    // N * S_g elements of the gather dtype
    Tensor cast;    // bf16: my piece cast, the all-gather's input, freed once it is done
    CommHandle handle;
  };
  // The float32 shards given (shard_total elements wherever they live, or
  // none): for a subclass that keeps them somewhere other than the device,
  // and so makes the all-gather's input another way (send_buffer).
  FlatParams(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last,
             MemoryTracker& mem, Device& dev, Communicator& comm, Tensor float32_shards);

  // My piece of unit g in the gather dtype, on the device: the all-gather's
  // input (here: the float32 shard itself, or its cast into b.cast).
  virtual const void* send_buffer(int g, Gathered& b);

  const ShardLayout& layout_;
  DType dtype_;
  bool reshard_after_forward_;
  int max_gathered_, last_;
  MemoryTracker& mem_;
  Device& dev_;
  Communicator& comm_;

 private:
  void issue(int g);

  Tensor shards_;  // shard_total float32 elements: the only persistent parameters
  std::map<int, Gathered> buffers_;
  uint64_t all_gathers_ = 0;
};

}  // namespace zf
