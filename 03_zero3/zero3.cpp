// zero3.cpp: stage 03. The loop of stage 02 with the parameters sharded:
//
//   for each micro-step k:
//     forward:  gather(u+1) in flight | wait gather(u), forward u, release u     (new)
//     backward: gather(u-1) in flight | wait gather(u), backward u into a
//               temporary gradient, release u; reduce-scatter the gradient
//               into my piece (stage 02's path)
//   clip, AdamW on my piece          the updated piece IS my parameters: no all_gather
#include "zero3.h"

#include <algorithm>
#include <cstring>

#include "checkpoint.h"
#include "gathered_params.h"
#include "precision.h"
#include "shard.h"
#include "sharded_adamw.h"
#include "sharded_grads.h"
#include "training.h"

namespace zf {

RankResult train_zero3(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                       StepReporter& reporter) {
  const ModelLayout layout = build_layout(cfg.model);
  const ShardLayout shards = make_shard_layout(layout, ctx.world, ctx.rank);
  const int K = cfg.grad_accum, r = ctx.rank, U = int(layout.units.size());
  const DType dt = compute_dtype(cfg.precision);

  GatheredParams params(shards, dt, ctx.mem, ctx.comm);              // new: pieces only
  ShardedGradients grads(shards, dt, ctx.mem, ctx.dev, ctx.comm);            // stage 02's
  ShardedAdamW opt(layout, shards, cfg.precision, ctx.mem, ctx.dev, cfg.lr); // stage 01's
  RankFailureGuard guard(ctx.comm);
  RankCompute rc(cfg, layout, ctx, data);

  const Resume resume = open_resume(cfg, layout, ctx);
  {  // Each rank draws only its own pieces of the seeded model (rng.h makes
     // that the same as drawing everything), or reads only its pieces of a
     // --resume checkpoint; --init reads the whole file.
    std::vector<float> full;
    if (!cfg.init.empty()) {
      full.resize(layout.numel);
      initial_model(cfg, layout, full.data());
    }
    std::vector<float> piece;
    std::vector<std::vector<float>> masters(U);
    for (int u = 0; u < U; ++u) {
      const UnitShard& us = shards.units[u];
      piece.assign(us.end - us.begin, 0.0f);
      if (resume.checkpoint)
        resume.checkpoint->read_unit(u, StateKind::params, us.begin, us.end, piece.data());
      else if (full.empty())
        init_unit_range(layout.units[u], cfg.model, cfg.seed, us.begin, us.end, piece.data());
      else
        std::memcpy(piece.data(), full.data() + layout.units[u].offset + us.begin, piece.size() * sizeof(float));
      store_from_f32(ctx.dev, params.piece(u), dt, piece.data(), piece.size());
      masters[u] = piece;
    }
    opt.init_master([&](int u) { return masters[u].data(); });
    if (resume.checkpoint) opt.load_moments(*resume.checkpoint);
    if (!cfg.save_init.empty()) {
      std::vector<float> all = gather_full_model(ctx.comm, ctx.dev, layout, shards, [&](int u) { return opt.fp32_piece(u, params.piece(u)); });
      if (r == 0) save_model(cfg.save_init, layout, all.data());
      ctx.comm.barrier();
      ctx.comm.reset_stats();  // count only the training's communication
    }
  }

  auto full_state = [&](StateKind kind) {  // what --save writes
    return gather_full_state(ctx.comm, ctx.dev, layout, shards, opt, kind, [&](int u) { return params.piece(u); });
  };

  RankResult result;
  result.first_step = resume.first_step;
  for (int step = resume.first_step; step < cfg.steps; ++step) {
    Timer timer;
    float loss_sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      rc.load(step, k);
      float loss = 0.0f;
      params.gather(0);
      for (int u = 0; u < U; ++u) {
        if (u + 1 < U) params.gather(u + 1);  // prefetch the next unit while this one computes
        rc.forward(u, params.get(u), &loss);
        params.release(u);
      }
      loss_sum += loss;

      params.gather(U - 1);
      for (int u = U - 1; u >= 0; --u) {
        if (u > 0) params.gather(u - 1);
        rc.backward(u, params.get(u), grads.begin_unit(u));
        params.release(u);
        grads.reduce_unit(u);
      }
      grads.finish();
    }
    const float loss = global_mean_loss(ctx.comm, ctx.dev, loss_sum, K);

    const GradClip clip = opt.clip_scale(ctx.comm, [&](int u) { return grads.piece(u); }, cfg.clip);
    for (int u = 0; u < U; ++u) opt.update(u, grads.piece(u), params.piece(u), step + 1, clip.scale);
    grads.zero();

    record_step(result, reporter, ctx, step, loss, clip.norm, timer.ms());
    maybe_save(cfg, ctx, layout, step + 1, full_state);
  }

  record_counters(result, ctx);
  std::vector<float> full = gather_full_model(ctx.comm, ctx.dev, layout, shards,
                                              [&](int u) { return opt.fp32_piece(u, params.piece(u)); });
  result.param_hash = hash_params(full.data(), full.size());
  return result;
}

}  // namespace zf
