// fsdp.cpp: stage 04. Stage 03's loop over FSDP units, with FSDP's knobs:
//
//   for each micro-step k:
//     forward, g = 0 .. G-1:   unshard(g); prefetch g+1 .. g+D (within --max-gathered);
//                              forward of g's blocks; reshard(g) unless kept
//                              (the head; every unit with --reshard-after-forward false)
//     backward, g = G-1 .. 0:  unshard(g) (kept units: nothing to do); prefetch g-1 .. g-D;
//                              backward of g's blocks into g's full gradient; reshard(g);
//                              reduce-scatter it into my float32 shard
//                              (--no-sync: only on the last micro-step)
//   clip, AdamW on my float32 shard    (no master copy: the shard is float32)
//
// All-gathers and reduce-scatters go through two queues (FSDP2's two
// streams), so a prefetch never waits behind a reduce-scatter. With
// --shard-group F < N (hybrid sharding) both queues are within my group of
// F ranks, and each reduced piece is then all-reduced across the N/F groups.
#include "fsdp.h"

#include <memory>

#include "check.h"
#include "flat_grads.h"
#include "flat_params.h"
#include "flat_units.h"
#include "precision.h"
#include "rank_compute.h"
#include "shard.h"
#include "sharded_adamw.h"
#include "training.h"
#include "training_run.h"

namespace zf {

namespace {

// The model states one rank holds under FSDP: float32 shards of parameters
// and gradients, and AdamW's moments, 1/N of each (1/F with hybrid sharding).
struct FsdpStates final : ModelStates {
  const FsdpUnits& units;
  const ShardLayout& shards;
  Communicator& comm;  // the shard group
  int replica;         // which copy of the shards (hybrid sharding; else 0)
  Device& dev;
  FlatParams params;  // new: float32 shards, gathered in the parameter dtype   category params (gathered)
  FlatGrads grads;    // new: float32 shards, reduced in the reduce dtype       category grads (comm)
  ShardedAdamW opt;   // stage 01's, on float32 pieces in both recipes          category optimizer

  FsdpStates(const FsdpUnits& units, const ShardLayout& shards, const TrainConfig& cfg, RankContext& ctx,
             FsdpComms& comms)
      : units(units), shards(shards), comm(*comms.group), replica(comms.replicate ? comms.replicate->rank() : 0),
        dev(ctx.dev),
        params(shards, storage_dtype(cfg.precision), cfg.fsdp, units.last(), ctx.mem, ctx.dev, *comms.group),
        grads(shards, storage_dtype(cfg.precision), cfg.fsdp.reduce_dtype.value_or(storage_dtype(cfg.precision)),
              cfg.fsdp.no_sync, ctx.mem, ctx.dev, *comms.reduce_queue, comms.replicate.get()),
        // The float32 shard is its own master: AdamW as in the fp32 recipe.
        opt(units.flat, shards, Precision::fp32, ctx.mem, ctx.dev) {}

  void load(const InitialState& init) override {
    for (int g = 0; g < units.size(); ++g)
      init.load(g, StateKind::params, shards.units[g].begin, shards.units[g].end, dev, params.piece(g),
                DType::f32);
    opt.load(init);
  }
  std::vector<float> full(StateKind kind, bool every_rank) override {
    return opt.gather(kind, comm, [&](int g) { return params.piece(g); }, every_rank);
  }
  // A sharded checkpoint: my pieces, written by the first shard group alone.
  const ShardLayout* share() const override { return replica == 0 ? &shards : nullptr; }
  void copy_piece(StateKind kind, int g, float* out) override { opt.copy_piece(kind, g, params.piece(g), out); }
};

}  // namespace

FsdpComms::FsdpComms(Communicator& world, int F) {
  group = &world;
  if (F > 0 && F < world.size()) {  // groups of F consecutive ranks; my shard's replicas: one per group
    group_owned = world.split(world.rank() / F, world.rank());
    replicate = world.split(world.rank() % F, world.rank());
    group = group_owned.get();
  }
  reduce_queue = group->split(0, group->rank());
}

void FsdpComms::count_in(TrainingRun& run) {
  for (Communicator* c : {group_owned.get(), replicate.get(), reduce_queue.get()})
    if (c) run.also_count(*c);
}

RankResult train_fsdp(const TrainConfig& cfg, RankContext& ctx, const TokenData& data, StepLog& log) {
  const ModelLayout layout = build_layout(cfg.model);
  const FsdpUnits units = wrap_blocks(layout, cfg.fsdp.wrap_blocks);
  FsdpComms comms(ctx.comm, cfg.fsdp.shard_group);
  const ShardLayout shards = make_shard_layout(units.flat, comms.group->size(), comms.group->rank());
  const int K = cfg.grad_accum, G = units.size(), D = cfg.fsdp.prefetch;

  FsdpStates states(units, shards, cfg, ctx, comms);
  auto rc = make_rank_compute(cfg, layout, ctx, data);
  TrainingRun run(cfg, units.flat, ctx, log, states);  // the initial model, or --resume's checkpoint
  comms.count_in(run);
  const size_t esize = dtype_size(storage_dtype(cfg.precision));

  // A forward without a backward: the held-out loss and the text samples.
  const auto forward_only = [&] { return fsdp_evaluate(states.params, units, *rc, esize, D); };
  run.evaluate(run.first_step(), *rc, forward_only);
  for (int step = run.first_step(); run.keep_going(step); ++step) {
    Timer timer;
    float loss_sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      rc->load(step, k);
      loss_sum += fsdp_forward(states.params, units, *rc, esize, D);
      fsdp_backward(states.params, states.grads, units, *rc, esize, D, !cfg.fsdp.no_sync || k == K - 1);
    }
    const float loss = global_mean_loss(ctx.comm, ctx.dev, loss_sum, K);

    // The norm over my group's pieces: every group holds the whole (summed) gradient.
    const GradClip clip =
        states.opt.clip_scale(*comms.group, [&](int g) { return states.grads.piece(g); }, cfg.clip);
    const AdamWConfig adam = run.adamw(step);  // this step's learning rate (lr_schedule.h)
    for (int g = 0; g < G; ++g)
      states.opt.update(g, states.grads.piece(g), states.params.piece(g), adam, step + 1, clip.scale);
    states.grads.zero();
    run.end_step(step, loss, clip.norm, timer.ms());
    run.evaluate(step + 1, *rc, forward_only);
  }
  RankResult result = run.finish();
  if (comms.replicate) result.comm_cross_group = comms.replicate->stats();
  return result;
}

}  // namespace zf
