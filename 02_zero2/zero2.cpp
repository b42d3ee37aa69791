// zero2.cpp: stage 02. The loop of stage 01 with the gradients sharded:
//
//   for each micro-step k:        forward as before;
//                                 backward: each unit's gradient goes into a temporary
//                                 buffer, reduce-scattered at once (every micro-step),
//                                 accumulated into my piece, released   (new)
//   clip, AdamW on my piece,      as in stage 01
//   all_gather the pieces
#include "zero2.h"

#include <algorithm>
#include <cstring>

#include "checkpoint.h"
#include "precision.h"
#include "shard.h"
#include "sharded_adamw.h"
#include "sharded_grads.h"
#include "training.h"

namespace zf {

RankResult train_zero2(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                       StepReporter& reporter) {
  const ModelLayout layout = build_layout(cfg.model);
  const ShardLayout shards = make_shard_layout(layout, ctx.world, ctx.rank);
  const int B = cfg.batch, T = cfg.model.T, K = cfg.grad_accum, N = ctx.world, r = ctx.rank;
  const DType dt = compute_dtype(cfg.precision);
  const size_t esz = dtype_size(dt);
  Sampler sampler(data, T, cfg.model.V);

  Tensor params(ctx.mem, Place::device, Category::params, dt, shards.padded_total);  // full, as in stage 01
  ShardedGradients grads(shards, dt, ctx.mem, ctx.comm);                               // new: pieces only
  ShardedAdamW opt(layout, shards, cfg.precision, ctx.mem, cfg.lr);                   // stage 01's
  RankFailureGuard guard(ctx.comm);
  size_t max_unit = 0;
  for (const auto& u : layout.units) max_unit = std::max(max_unit, u.numel);
  UnitCompute compute(cfg.precision, ctx.mem, max_unit);
  Gpt gpt(layout, ctx.mem, B);
  Tensor inputs(ctx.mem, Place::device, Category::activations, DType::i32, size_t(B) * T);
  Tensor targets(ctx.mem, Place::device, Category::activations, DType::i32, size_t(B) * T);

  auto unit_params = [&](int u) { return static_cast<char*>(params.data()) + shards.units[u].padded_offset * esz; };
  auto my_param_piece = [&](int u) { return unit_params(u) + size_t(r) * shards.units[u].shard * esz; };

  {  // The initial model, the same on every rank, copied into the padded layout.
    std::vector<float> full(layout.numel);
    initial_model(cfg, layout, full.data());
    if (!cfg.save_init.empty() && r == 0) save_model(cfg.save_init, layout, full.data());
    if (!cfg.save_init.empty()) ctx.comm.barrier();
    for (size_t u = 0; u < layout.units.size(); ++u)
      store_from_f32(unit_params(int(u)), dt, full.data() + layout.units[u].offset, layout.units[u].numel);
    opt.init_master([&](int u) { return full.data() + layout.units[u].offset + shards.units[u].begin; });
  }

  RankResult result;
  std::vector<CommHandle> pending(layout.units.size());
  const int U = int(layout.units.size());
  for (int step = 0; step < cfg.steps; ++step) {
    Timer timer;
    float loss_sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      sampler.micro_batch(step, k, r, N, B, K, inputs.as<int32_t>(), targets.as<int32_t>());
      float loss = 0.0f;
      for (int u = 0; u < U; ++u)
        gpt.forward_unit(u, compute.params(unit_params(u), layout.units[u].numel), inputs.as<int32_t>(),
                         targets.as<int32_t>(), &loss);
      loss_sum += loss;
      for (int u = U - 1; u >= 0; --u) {
        const size_t n = layout.units[u].numel;
        void* full_grad = grads.begin_unit(u);
        float* g = compute.grads_begin(full_grad, n);
        gpt.backward_unit(u, compute.params(unit_params(u), n), g, 1.0f / float(N * K));
        compute.grads_end(full_grad, n);
        if (u == U - 1) maybe_inject_fault(cfg, r, step);
        grads.reduce_unit(u);  // new: every micro-step, and the full gradient is released
      }
      grads.finish();
    }
    const float loss = global_mean_loss(ctx.comm, loss_sum, K);

    const float scale = opt.clip_scale(ctx.comm, [&](int u) { return grads.piece(u); }, cfg.clip);
    for (int u = 0; u < U; ++u) {
      opt.update(u, grads.piece(u), my_param_piece(u), step + 1, scale);
      pending[u] = ctx.comm.all_gather_async(my_param_piece(u), unit_params(u), shards.units[u].shard, dt);
    }
    for (auto& h : pending) h.wait();
    grads.zero();

    double ms = timer.ms();
    result.losses.push_back(loss);
    result.step_ms.push_back(ms);
    if (r == 0) reporter.step(step, loss, ms, ctx.mem.counts().model_states(Place::device));
  }

  result.memory = ctx.mem.counts();
  result.comm = ctx.comm.stats();
  std::vector<float> full = gather_full_model(ctx.comm, layout, shards,
                                              [&](int u) { return opt.fp32_piece(u, my_param_piece(u)); });
  result.param_hash = hash_params(full.data(), full.size());
  return result;
}

}  // namespace zf
