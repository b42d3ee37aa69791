// zero2.cpp: stage 02. The loop of stage 01 with the gradients sharded:
//
//   for each micro-step k:        forward as before;
//                                 backward: each unit's gradient goes into a temporary
//                                 buffer, reduce-scattered at once (every micro-step),
//                                 accumulated into my piece, released   (new)
//   clip, AdamW on my piece,      as in stage 01
//   all_gather the pieces
#include "zero2.h"

#include "zero1.h"

#include <algorithm>
#include <cstring>

#include "shard.h"
#include "sharded_adamw.h"
#include "sharded_grads.h"
#include "training.h"

namespace zf {

RankResult train_zero2(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                       StepReporter& reporter) {
  const ModelLayout layout = build_layout(cfg.model);
  const ShardLayout shards = make_shard_layout(layout, ctx.world, ctx.rank);
  const int K = cfg.grad_accum, r = ctx.rank, U = int(layout.units.size());
  const DType dt = compute_dtype(cfg.precision);
  const size_t esz = dtype_size(dt);

  Tensor params(ctx.mem, Place::device, Category::params, dt, shards.padded_total);  // full, as in stage 01
  ShardedGradients grads(shards, dt, ctx.mem, ctx.dev, ctx.comm);                              // new: pieces only
  ShardedAdamW opt(layout, shards, cfg.precision, ctx.mem, ctx.dev, cfg.lr);                  // stage 01's
  RankFailureGuard guard(ctx.comm);
  RankCompute rc(cfg, layout, ctx, data);

  auto unit_params = [&](int u) { return static_cast<char*>(params.data()) + shards.units[u].padded_offset * esz; };
  auto my_param_piece = [&](int u) { return unit_params(u) + size_t(r) * shards.units[u].shard * esz; };
  const int first_step = init_padded_params(cfg, layout, shards, ctx, params.data(), opt);
  auto full_state = [&](StateKind kind) {  // what --save writes
    return gather_full_state(ctx.comm, ctx.dev, layout, shards, opt, kind, my_param_piece);
  };

  RankResult result;
  result.first_step = first_step;
  std::vector<CommHandle> pending(U);
  for (int step = first_step; step < cfg.steps; ++step) {
    Timer timer;
    float loss_sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      rc.load(step, k);
      float loss = 0.0f;
      for (int u = 0; u < U; ++u) rc.forward(u, unit_params(u), &loss);
      loss_sum += loss;
      for (int u = U - 1; u >= 0; --u) {
        rc.backward(u, unit_params(u), grads.begin_unit(u));  // new: into a temporary full gradient
        grads.reduce_unit(u);  // new: every micro-step; the full gradient is released
      }
      grads.finish();
    }
    const float loss = global_mean_loss(ctx.comm, ctx.dev, loss_sum, K);

    const GradClip clip = opt.clip_scale(ctx.comm, [&](int u) { return grads.piece(u); }, cfg.clip);
    for (int u = 0; u < U; ++u) {
      opt.update(u, grads.piece(u), my_param_piece(u), step + 1, clip.scale);
      pending[u] = ctx.comm.all_gather_async(my_param_piece(u), unit_params(u), shards.units[u].shard, dt);
    }
    for (auto& h : pending) h.wait();
    grads.zero();
    record_step(result, reporter, ctx, step, loss, clip.norm, timer.ms());
    maybe_save(cfg, ctx, layout, step + 1, full_state);
  }

  record_counters(result, ctx);
  std::vector<float> full = gather_full_model(ctx.comm, ctx.dev, layout, shards,
                                              [&](int u) { return opt.fp32_piece(u, my_param_piece(u)); });
  result.param_hash = hash_params(full.data(), full.size());
  return result;
}

}  // namespace zf
