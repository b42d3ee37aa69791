// fsdp.h: stage 04, FSDP: ZeRO-3 with FSDP's units, storage and knobs.
//
// Against stage 03:
// - units: --wrap-blocks consecutive blocks share one flat, padded, sharded parameter
//   (flat_units.h); the head, the last unit of forward, stays gathered into
//   its backward (stage 03 frees it and gathers it again at once);
// - storage: float32 parameter and gradient shards in both recipes, cast to
//   bf16 before the all-gather under --precision bf16, and reduce-scattered
//   in --reduce-dtype (FSDP2's mixed-precision policy; flat_params.h,
//   flat_grads.h);
// - --reshard-after-forward false keeps every unit gathered from its forward
//   to its backward: no backward all-gathers;
// - --prefetch D units ahead, at most --max-gathered M units gathered;
// - --no-sync: gradients accumulated unsharded over the micro-steps and
//   reduce-scattered once;
// - two queues: reduce-scatters on a communicator split from the rank's, so
//   an all-gather never waits behind one;
// - --shard-group F: shard within groups of F ranks, all-reduce the reduced
//   pieces across the N/F groups (hybrid sharding).
//
// Memory per rank: 16P/N in both recipes (4 + 4 + 8 bytes per element of
// the shard; 16P/F with --shard-group F), plus padding; gathered parameters (category gathered) at most
// M units plus the head, or the whole model without resharding.
#pragma once

#include <memory>

#include "flat_grads.h"
#include "flat_params.h"
#include "flat_units.h"
#include "rank_compute.h"
#include "stage_main.h"
#include "training_run.h"

namespace zf {

// The communicators of one rank: its shard group (all N ranks, or the F of
// its group under hybrid sharding), the group's second queue for the
// reduce-scatters, and the replicas of its shard in the other groups.
struct FsdpComms {
  std::unique_ptr<Communicator> group_owned, replicate, reduce_queue;
  Communicator* group = nullptr;

  FsdpComms(Communicator& world, int F);  // F: --shard-group's ranks (0: all of world)
  void count_in(TrainingRun& run);  // the split communicators' counters are the run's too
};

// Where member unit u's parameters (or gradients) start in its FSDP unit's full buffer.
inline const char* fsdp_member(const void* full, const FsdpUnits& units, int u, size_t esize) {
  return static_cast<const char*>(full) + units.member_offset[u] * esize;
}

// The loops below take stage 04's FlatParams and FlatGrads, or any classes
// with their methods (unshard, prefetch, wait_for_unshard, reshard, kept;
// begin_unit, reduce_unit, finish): where the shards live is the classes'.

// One micro-step's forward over the FSDP units, first to last: unshard,
// prefetch D ahead, compute, reshard unless kept. Returns the loss summed.
// esize: bytes per element of the gathered parameters and full gradients.
template <class Params>
float fsdp_forward(Params& params, const FsdpUnits& units, RankCompute& rc, size_t esize, int D) {
  float loss = 0.0f;
  for (int g = 0; g < units.size(); ++g) {
    params.unshard(g);
    for (int d = 1; d <= D && g + d < units.size(); ++d) params.prefetch(g + d);  // before this unit computes
    const void* full = params.wait_for_unshard(g);
    for (int u : units.members[g]) rc.forward(u, fsdp_member(full, units, u, esize), &loss);
    if (!params.kept(g)) params.reshard(g);
  }
  return loss;
}

// The forward of an evaluation (--val-every): fsdp_forward, then the units
// it kept for a backward resharded, as no backward follows.
template <class Params>
float fsdp_evaluate(Params& params, const FsdpUnits& units, RankCompute& rc, size_t esize, int D) {
  const float loss = fsdp_forward(params, units, rc, esize, D);
  for (int g = 0; g < units.size(); ++g)  // no backward will use the units the forward kept
    if (params.kept(g)) params.reshard(g);
  return loss;
}

// Its backward, last unit first: unshard, prefetch D behind, compute into
// the unit's full gradient, reshard, reduce-scatter (when sync) and, at the
// end, wait for every reduction still in flight.
template <class Params, class Grads>
void fsdp_backward(Params& params, Grads& grads, const FsdpUnits& units, RankCompute& rc, size_t esize, int D,
                   bool sync) {
  // Last unit first; the head (and, without resharding, every unit) is still gathered.
  for (int g = units.size() - 1; g >= 0; --g) {
    params.unshard(g);
    for (int d = 1; d <= D && g - d >= 0; ++d) params.prefetch(g - d);  // FSDP's BACKWARD_PRE, reverse order
    const void* full = params.wait_for_unshard(g);
    char* grad = static_cast<char*>(grads.begin_unit(g));
    const auto& m = units.members[g];
    for (auto it = m.rbegin(); it != m.rend(); ++it)
      rc.backward(*it, fsdp_member(full, units, *it, esize), grad + units.member_offset[*it] * esize);
    params.reshard(g);
    grads.reduce_unit(g, sync);
  }
  grads.finish();
}

RankResult train_fsdp(const TrainConfig& cfg, RankContext& ctx, const TokenData& data, StepLog& log);

}  // namespace zf
