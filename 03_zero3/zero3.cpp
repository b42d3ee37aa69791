// zero3.cpp: stage 03. The loop of stage 02 with the parameters sharded:
//
//   for each micro-step k:
//     forward:  unshard(u+1) in flight | wait for unshard(u), forward u, reshard(u)   (new)
//     backward: unshard(u-1) in flight | wait for unshard(u), backward u into a
//               temporary gradient, reshard(u); reduce-scatter the gradient
//               into my piece (stage 02's path)
//   clip, AdamW on my piece          the updated piece IS my parameters: no all_gather
#include "zero3.h"

#include "gathered_params.h"
#include "precision.h"
#include "rank_compute.h"
#include "shard.h"
#include "sharded_adamw.h"
#include "sharded_grads.h"
#include "training.h"
#include "training_run.h"

namespace zf {

namespace {

// The model states one rank holds under ZeRO-3: 1/N of everything.
struct Zero3States final : ModelStates {
  const ModelLayout& layout;
  const ShardLayout& shards;
  Communicator& comm;
  Device& dev;
  DType dt;                // the recipe's dtype of parameters and gradients (fp32 or bf16)
  GatheredParams params;   // new: my parameter pieces (and gathered units)  category params (gathered)
  ShardedGradients grads;  // stage 02's                                     category grads (comm)
  ShardedAdamW opt;        // stage 01's                                     category optimizer

  Zero3States(const ModelLayout& layout, const ShardLayout& shards, const TrainConfig& cfg, RankContext& ctx)
      : layout(layout), shards(shards), comm(ctx.comm), dev(ctx.dev), dt(storage_dtype(cfg.precision)),
        params(shards, dt, ctx.mem, ctx.comm),
        grads(shards, dt, ctx.mem, ctx.dev, ctx.comm),
        opt(layout, shards, cfg.precision, ctx.mem, ctx.dev) {}

  // New: each rank loads only its pieces of the parameters (drawing a piece
  // of the seeded model alone gives the same values as drawing it whole).
  void load(const InitialState& init) override {
    for (int u = 0; u < int(layout.units.size()); ++u)
      init.load(u, StateKind::params, shards.units[u].begin, shards.units[u].end, dev, params.piece(u), dt);
    opt.load(init);
  }
  // The pieces of the model and of the moments, gathered.
  std::vector<float> full(StateKind kind, bool every_rank) override {
    return opt.gather(kind, comm, [&](int u) { return params.piece(u); }, every_rank);
  }
  // A sharded checkpoint: my pieces, as the optimizer holds them.
  const ShardLayout* share() const override { return &shards; }
  void copy_piece(StateKind kind, int u, float* out) override { opt.copy_piece(kind, u, params.piece(u), out); }
};

// One micro-batch's forward, unit by unit, each unit's parameters gathered
// just before it computes and freed just after; returns the loss.
float forward(Zero3States& states, RankCompute& rc, int U) {
  float loss = 0.0f;
  states.params.unshard(0);
  for (int u = 0; u < U; ++u) {
    if (u + 1 < U) states.params.unshard(u + 1);  // new: prefetch the next unit while this one computes
    rc.forward(u, states.params.wait_for_unshard(u), &loss);
    states.params.reshard(u);
  }
  return loss;
}

}  // namespace

RankResult train_zero3(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                       StepLog& log) {
  const ModelLayout layout = build_layout(cfg.model);
  const ShardLayout shards = make_shard_layout(layout, ctx.world, ctx.rank);
  const int K = cfg.grad_accum, U = int(layout.units.size());

  // Model states first (the largest allocations): over --device-mem, this is
  // where the run stops, before any step.
  Zero3States states(layout, shards, cfg, ctx);
  auto rc = make_rank_compute(cfg, layout, ctx, data);
  TrainingRun run(cfg, layout, ctx, log, states);  // the initial model, or --resume's checkpoint

  // A forward without a backward, gathering each unit as the step's does:
  // the held-out loss and the text samples of --val-every and --sample-every.
  const auto forward_only = [&] { return forward(states, *rc, U); };
  run.evaluate(run.first_step(), *rc, forward_only);
  for (int step = run.first_step(); run.keep_going(step); ++step) {
    Timer timer;
    float loss_sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      rc->load(step, k);
      loss_sum += forward(states, *rc, U);

      // Backward, last unit first.
      states.params.unshard(U - 1);
      for (int u = U - 1; u >= 0; --u) {
        if (u > 0) states.params.unshard(u - 1);  // new: prefetch, backwards
        rc->backward(u, states.params.wait_for_unshard(u), states.grads.begin_unit(u));
        states.params.reshard(u);
        states.grads.reduce_unit(u);
      }
      states.grads.finish();
    }
    const float loss = global_mean_loss(ctx.comm, ctx.dev, loss_sum, K);

    // Clip with the norm of the whole gradient, summed exactly from the pieces.
    const GradClip clip =
        states.opt.clip_scale(ctx.comm, [&](int u) { return states.grads.piece(u); }, cfg.clip);
    const AdamWConfig adam = run.adamw(step);  // this step's learning rate (lr_schedule.h)
    // Each rank updates its piece, which is all it keeps of the parameters: no all-gather.
    for (int u = 0; u < U; ++u)
      states.opt.update(u, states.grads.piece(u), states.params.piece(u), adam, step + 1, clip.scale);
    states.grads.zero();
    run.end_step(step, loss, clip.norm, timer.ms());
    run.evaluate(step + 1, *rc, forward_only);
  }
  return run.finish();
}

}  // namespace zf
