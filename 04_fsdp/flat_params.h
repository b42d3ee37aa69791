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

// FlatGathers: the units' gathered buffers, their all-gathers, and the limit
// on how many are gathered at once (unshard, prefetch, wait_for_unshard and
// reshard as above). What an all-gather sends is its owner's to make
// (`input`, called when the all-gather is issued): FlatParams, below, casts
// my float32 shard.
class FlatGathers {
 public:
  // An all-gather's input: my piece of the unit in the gather dtype on the
  // device, and the buffer that holds it when it was made for this
  // all-gather alone (freed once the all-gather has read it; or none).
  struct Input {
    const void* send;
    Tensor made;
    // An input made for this all-gather alone: t's data, freed with it.
    static Input made_for_it(Tensor t) {
      const void* send = t.data();
      return {send, std::move(t)};
    }
  };

  FlatGathers(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last, MemoryTracker& mem,
              Communicator& comm);

  template <class MakeInput>
  void unshard(int g, MakeInput&& input) {
    if (unsharded(g)) return;
    check_limit(g);
    issue(g, input);
  }
  template <class MakeInput>
  bool prefetch(int g, MakeInput&& input) {
    if (g < 0 || g >= int(layout_.units.size()) || unsharded(g)) return true;
    if (max_gathered_ > 0 && !kept(g) && counted() >= max_gathered_) return false;
    issue(g, input);
    return true;
  }
  const void* wait_for_unshard(int g);
  void reshard(int g);

  bool kept(int g) const { return !reshard_after_forward_ || g == last_; }
  bool unsharded(int g) const { return buffers_.count(g) > 0; }  // gathered, or its all-gather in flight
  int counted() const;                  // gathered or in flight, not kept: what --max-gathered bounds

 private:
  struct Gathered {
    Tensor full;  // N * S_g elements of the gather dtype
    Input input;
    CommHandle handle;
  };
  template <class MakeInput>
  void issue(int g, MakeInput& input) {
    Gathered b{Tensor(mem_, Place::device, Category::gathered, dtype_, layout_.units[g].padded()), {}, {}};
    b.input = input();
    start(g, std::move(b));
  }
  void start(int g, Gathered b);
  void check_limit(int g) const;

  const ShardLayout& layout_;
  DType dtype_;
  bool reshard_after_forward_;
  int max_gathered_, last_;
  MemoryTracker& mem_;
  Communicator& comm_;
  std::map<int, Gathered> buffers_;
};

// Stage 04's parameters: my float32 shard on the device, cast to the gather
// dtype for each all-gather.
class FlatParams {
 public:
  // gather_dtype: the recipe's parameter dtype. last: the head's unit.
  FlatParams(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last,
             MemoryTracker& mem, Device& dev, Communicator& comm);

  void unshard(int g) { gathers_.unshard(g, [&] { return input(g); }); }
  bool prefetch(int g) { return gathers_.prefetch(g, [&] { return input(g); }); }
  const void* wait_for_unshard(int g) { return gathers_.wait_for_unshard(g); }
  void reshard(int g) { gathers_.reshard(g); }
  bool kept(int g) const { return gathers_.kept(g); }

  float* piece(int g);                  // my float32 piece of unit g (S_g elements)

 private:
  // My piece of unit g in the gather dtype: the float32 shard itself, or its cast.
  FlatGathers::Input input(int g);

  const ShardLayout& layout_;
  DType dtype_;
  MemoryTracker& mem_;
  Device& dev_;
  FlatGathers gathers_;
  Tensor shard_;  // shard_total float32 elements: the only persistent parameters
};

}  // namespace zf
