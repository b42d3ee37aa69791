// data_parallel.cpp: stage 00. Read this first: every later stage changes
// one part of this loop (what each rank keeps, and which collective runs).
//
//   for each step:
//     for each micro-step k:        forward unit by unit, then backward in reverse;
//                                   on the last k, all_reduce each unit's gradients
//                                   as soon as its backward is done (overlap)
//     wait for the all-reduces      every rank now has the same gradient: the sum of
//                                   the ranks' own, each already divided by N*K
//     clip by the global norm       computed from the full gradient on each rank
//     AdamW on the whole model      every rank does the same update (redundantly)
#include "data_parallel.h"

#include <cmath>

#include "adamw.h"
#include "gradnorm.h"
#include "precision.h"
#include "rank_compute.h"
#include "training.h"
#include "shard.h"
#include "training_run.h"

namespace zf {

namespace {

// The model states one rank holds under data parallelism: all of them.
struct Replica final : ModelStates {
  const ModelLayout& layout;
  int rank;
  Device& dev;
  DType dt;        // the recipe's dtype of parameters and gradients (fp32 or bf16)
  Tensor params;   // P, dt                                       category params
  Tensor grads;    // P, dt                                       category grads
  Tensor master;   // P float32, bf16 recipe only                 category optimizer
  Tensor m, v;     // P float32 AdamW moments                     category optimizer
  ShardLayout cut;  // what this rank writes of a sharded checkpoint

  Replica(const ModelLayout& layout, Precision prec, RankContext& ctx)
      : layout(layout), rank(ctx.rank), dev(ctx.dev), dt(storage_dtype(prec)),
        cut(make_shard_layout(layout, ctx.world, ctx.rank)) {
    const size_t P = layout.numel;
    params = Tensor(ctx.mem, Place::device, Category::params, dt, P);
    grads = Tensor(ctx.mem, Place::device, Category::grads, dt, P);
    if (prec == Precision::bf16) master = Tensor(ctx.mem, Place::device, Category::optimizer, DType::f32, P);
    m = Tensor(ctx.mem, Place::device, Category::optimizer, DType::f32, P);
    v = Tensor(ctx.mem, Place::device, Category::optimizer, DType::f32, P);
  }

  // Unit u's parameters and gradients: its range of the whole buffers.
  char* unit_params(int u) { return params.at(layout.units[u].offset); }
  char* unit_grads(int u) { return grads.at(layout.units[u].offset); }
  // The float32 copy AdamW updates: the master in bf16, else the parameters.
  float* fp32_params() { return master.empty() ? params.as<float>() : master.as<float>(); }
  Tensor& moment(StateKind kind) { return kind == StateKind::m ? m : v; }

  // The same initial model on every rank: each loads all of it.
  void load(const InitialState& init) override {
    std::vector<float> values;
    for (int u = 0; u < int(layout.units.size()); ++u) {
      const size_t n = layout.units[u].numel, off = layout.units[u].offset;
      values.resize(n);
      init.read(u, StateKind::params, 0, n, values.data());  // once, for the parameters and the master
      store_from_f32(dev, unit_params(u), dt, values.data(), n);
      if (!master.empty()) store_from_f32(dev, master.as<float>() + off, DType::f32, values.data(), n);
      if (init.has_moments())
        for (StateKind kind : {StateKind::m, StateKind::v})
          init.load(u, kind, 0, n, dev, moment(kind).as<float>() + off, DType::f32);
    }
  }
  // Every rank holds everything: a copy back to the host (rank 0's alone
  // when only rank 0 needs it).
  std::vector<float> full(StateKind kind, bool every_rank) override {
    if (!every_rank && rank != 0) return {};
    std::vector<float> out(layout.numel);
    dev.to_host(out.data(), kind == StateKind::params ? fp32_params() : moment(kind).data(),
                out.size() * sizeof(float));
    return out;
  }
  // A sharded checkpoint: every rank writes its 1/N cut of the same values.
  const ShardLayout* share() const override { return &cut; }
  void copy_piece(StateKind kind, int u, float* host) override {
    const float* all = kind == StateKind::params ? fp32_params() : moment(kind).as<float>();
    const UnitShard& us = cut.units[u];
    dev.to_host(host, all + layout.units[u].offset + us.begin, (us.end - us.begin) * sizeof(float));
  }
};

}  // namespace

RankResult train_data_parallel(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                               StepLog& log) {
  const ModelLayout layout = build_layout(cfg.model);
  const int K = cfg.grad_accum, U = int(layout.units.size());
  const DType dt = storage_dtype(cfg.precision);

  // Model states first (the largest allocations): over --device-mem, this is
  // where the run stops, before any step.
  Replica states(layout, cfg.precision, ctx);
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
        rc->backward(u, states.unit_params(u), states.unit_grads(u));
        // This unit's gradient is final for this step: start reducing it now,
        // while the next unit's backward runs (DDP's bucketing, one unit a bucket).
        if (k == K - 1)
          pending[u] = ctx.comm.all_reduce_async(states.unit_grads(u), layout.units[u].numel, dt, ReduceOp::sum);
      }
    }
    for (auto& h : pending) h.wait();
    const float loss = global_mean_loss(ctx.comm, ctx.dev, loss_sum, K);

    // Clip by the global norm. Every rank has the whole averaged gradient.
    SumOfSquares sq;
    ctx.dev.sum_squares(states.grads.data(), dt, layout.numel, sq);
    const GradClip clip = grad_clip(std::sqrt(sq.value()), cfg.clip);

    // AdamW on the whole model, one parameter tensor at a time (decay or not),
    // at this step's learning rate (lr_schedule.h).
    const AdamWConfig adam = run.adamw(step);
    float* p32 = states.fp32_params();
    for (int u = 0; u < U; ++u)
      for (const auto& p : layout.units[u].params) {
        const size_t off = layout.units[u].offset + p.offset;
        ctx.dev.adamw(p32 + off, states.unit_grads(u) + p.offset * dtype_size(dt), dt, states.m.as<float>() + off,
                      states.v.as<float>() + off, p.numel, adam, step + 1, clip.scale, p.decay);
      }
    if (cfg.precision == Precision::bf16) ctx.dev.narrow(p32, states.params.as<bf16>(), layout.numel);
    ctx.dev.zero(states.grads.data(), states.grads.bytes());
    run.end_step(step, loss, clip.norm, timer.ms());
    run.evaluate(step + 1, *rc, forward);
  }
  return run.finish();
}

}  // namespace zf
