// zero2.cpp: stage 02. The loop of stage 01 with the gradients sharded:
//
//   for each micro-step k:        forward as before;
//                                 backward: each unit's gradient goes into a temporary
//                                 buffer, reduce-scattered at once (every micro-step),
//                                 accumulated into my piece, released   (new)
//   clip, AdamW on my piece,      as in stage 01
//   all_gather the pieces
#include "zero2.h"

#include "precision.h"
#include "rank_compute.h"
#include "shard.h"
#include "sharded_adamw.h"
#include "sharded_grads.h"
#include "training.h"
#include "training_run.h"

namespace zf {

namespace {

// The model states one rank holds under ZeRO-2: whole parameters, each unit
// padded to N pieces (shard.h), and 1/N of the gradients and of AdamW's state.
struct Zero2States final : ModelStates {
  const ModelLayout& layout;
  const ShardLayout& shards;
  Communicator& comm;
  Device& dev;
  DType dt;                // the recipe's dtype of parameters and gradients (fp32 or bf16)
  Tensor params;           // padded_total, dt                        category params
  ShardedGradients grads;  // new: my gradient pieces (and buckets)   category grads (comm)
  ShardedAdamW opt;        // stage 01's                              category optimizer

  Zero2States(const ModelLayout& layout, const ShardLayout& shards, const TrainConfig& cfg, RankContext& ctx)
      : layout(layout), shards(shards), comm(ctx.comm), dev(ctx.dev), dt(storage_dtype(cfg.precision)),
        params(ctx.mem, Place::device, Category::params, dt, shards.padded_total),
        grads(shards, dt, ctx.mem, ctx.dev, ctx.comm),
        opt(layout, shards, cfg.precision, ctx.mem, ctx.dev) {}

  // Unit u's parameters inside the whole (padded) buffer.
  char* unit_params(int u) { return params.at(shards.units[u].padded_offset); }
  // My piece of unit u inside it: the r-th of its N pieces.
  size_t my_offset(int u) const { return size_t(shards.rank) * shards.units[u].shard; }
  char* my_param_piece(int u) { return params.at(shards.units[u].padded_offset + my_offset(u)); }

  // Every rank loads the whole parameters, and the optimizer its pieces only.
  void load(const InitialState& init) override {
    for (int u = 0; u < int(layout.units.size()); ++u)
      init.load(u, StateKind::params, 0, layout.units[u].numel, dev, unit_params(u), dt);
    opt.load(init);
  }
  // The pieces of the updated model and of the moments, gathered.
  std::vector<float> full(StateKind kind, bool every_rank) override {
    return opt.gather(kind, comm, [&](int u) { return my_param_piece(u); }, every_rank);
  }
  // A sharded checkpoint: my pieces, as the optimizer holds them.
  const ShardLayout* share() const override { return &shards; }
  void copy_piece(StateKind kind, int u, float* out) override { opt.copy_piece(kind, u, my_param_piece(u), out); }
};

}  // namespace

RankResult train_zero2(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                       StepLog& log) {
  const ModelLayout layout = build_layout(cfg.model);
  const ShardLayout shards = make_shard_layout(layout, ctx.world, ctx.rank);
  const int K = cfg.grad_accum, U = int(layout.units.size());
  const DType dt = storage_dtype(cfg.precision);

  // Model states first (the largest allocations): over --device-mem, this is
  // where the run stops, before any step.
  Zero2States states(layout, shards, cfg, ctx);
  auto rc = make_rank_compute(cfg, layout, ctx, data);
  TrainingRun run(cfg, layout, ctx, log, states);  // the initial model, or --resume's checkpoint

  std::vector<CommHandle> pending(U);
  // The forward of the micro-batch rc holds, unit by unit (every rank holds
  // every parameter): the step's, and alone the held-out loss's and the
  // text samples' of --val-every and --sample-every.
  const auto forward = [&] {
    float loss = 0.0f;
    for (int u = 0; u < U; ++u) rc->forward(u, states.unit_params(u), &loss);
    return loss;
  };
  run.evaluate(run.first_step(), *rc, forward);
  for (int step = run.first_step(); run.keep_going(step); ++step) {
    Timer timer;
    float loss_sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      rc->load(step, k);
      loss_sum += forward();

      // Backward, last unit first.
      for (int u = U - 1; u >= 0; --u) {
        // New: into a temporary full gradient, reduce-scattered at once.
        rc->backward(u, states.unit_params(u), states.grads.begin_unit(u));
        states.grads.reduce_unit(u);  // new: every micro-step; the full gradient is released
      }
      states.grads.finish();
    }
    const float loss = global_mean_loss(ctx.comm, ctx.dev, loss_sum, K);

    // Clip with the norm of the whole gradient, summed exactly from the pieces.
    const GradClip clip =
        states.opt.clip_scale(ctx.comm, [&](int u) { return states.grads.piece(u); }, cfg.clip);
    const AdamWConfig adam = run.adamw(step);  // this step's learning rate (lr_schedule.h)
    // Each rank updates its piece, then the pieces are all-gathered (in place).
    for (int u = 0; u < U; ++u) {
      states.opt.update(u, states.grads.piece(u), states.my_param_piece(u), adam, step + 1, clip.scale);
      pending[u] = ctx.comm.all_gather_async(states.my_param_piece(u), states.unit_params(u),
                                             shards.units[u].shard, dt);
    }
    for (auto& h : pending) h.wait();
    states.grads.zero();
    run.end_step(step, loss, clip.norm, timer.ms());
    run.evaluate(step + 1, *rc, forward);
  }
  return run.finish();
}

}  // namespace zf
