// zero1.cpp: stage 01. The loop of stage 00 with the optimizer sharded:
//
//   for each micro-step k:        forward, backward (full gradients, as in stage 00);
//                                 on the last k, reduce_scatter each unit's gradient
//                                 as soon as its backward is done
//   wait                          each rank holds the summed gradient of its piece
//   clip                          norm from the pieces (exact, the same as stage 00)
//   AdamW on my piece only        (new: 1/N of the optimizer state)
//   all_gather the pieces         (new: every rank gets the updated parameters)
#include "zero1.h"

#include <algorithm>
#include <cstring>

#include "checkpoint.h"
#include "precision.h"
#include "shard.h"
#include "sharded_adamw.h"
#include "training.h"

namespace zf {

int init_padded_params(const TrainConfig& cfg, const ModelLayout& layout, const ShardLayout& shards,
                       RankContext& ctx, void* params, ShardedAdamW& opt) {
  const Resume resume = open_resume(cfg, layout, ctx);
  const DType dt = compute_dtype(cfg.precision);
  std::vector<float> full(layout.numel);
  initial_model(cfg, layout, full.data());
  if (!cfg.save_init.empty() && ctx.rank == 0) save_model(cfg.save_init, layout, full.data());
  if (!cfg.save_init.empty()) ctx.comm.barrier();  // the file is complete before anyone goes on
  for (size_t u = 0; u < layout.units.size(); ++u)
    store_from_f32(ctx.dev, static_cast<char*>(params) + shards.units[u].padded_offset * dtype_size(dt), dt,
                   full.data() + layout.units[u].offset, layout.units[u].numel);
  opt.init_master([&](int u) { return full.data() + layout.units[u].offset + shards.units[u].begin; });
  if (resume.checkpoint) opt.load_moments(*resume.checkpoint);
  return resume.first_step;
}

RankResult train_zero1(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                       StepReporter& reporter) {
  const ModelLayout layout = build_layout(cfg.model);
  const ShardLayout shards = make_shard_layout(layout, ctx.world, ctx.rank);
  const int K = cfg.grad_accum, r = ctx.rank, U = int(layout.units.size());
  const DType dt = compute_dtype(cfg.precision);
  const size_t esz = dtype_size(dt);

  // Full parameters and gradients, in the padded layout (each unit padded to N pieces).
  Tensor params(ctx.mem, Place::device, Category::params, dt, shards.padded_total);
  Tensor grads(ctx.mem, Place::device, Category::grads, dt, shards.padded_total);
  ShardedAdamW opt(layout, shards, cfg.precision, ctx.mem, ctx.dev, cfg.lr);  // new: 1/N of the optimizer state
  RankFailureGuard guard(ctx.comm);
  RankCompute rc(cfg, layout, ctx, data);

  auto unit_params = [&](int u) { return static_cast<char*>(params.data()) + shards.units[u].padded_offset * esz; };
  auto unit_grads = [&](int u) { return static_cast<char*>(grads.data()) + shards.units[u].padded_offset * esz; };
  // My piece of unit u inside the full buffers: slot r of the unit's N slots.
  auto my_param_piece = [&](int u) { return unit_params(u) + size_t(r) * shards.units[u].shard * esz; };
  auto my_grad_piece = [&](int u) { return unit_grads(u) + size_t(r) * shards.units[u].shard * esz; };
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
        rc.backward(u, unit_params(u), unit_grads(u));
        // New: reduce-scatter instead of all-reduce. In place: my piece of the
        // summed gradient lands in slot r of my own unit buffer.
        if (k == K - 1)
          pending[u] = ctx.comm.reduce_scatter_async(unit_grads(u), my_grad_piece(u), shards.units[u].shard, dt,
                                                     ReduceOp::sum);
      }
    }
    for (auto& h : pending) h.wait();
    const float loss = global_mean_loss(ctx.comm, ctx.dev, loss_sum, K);

    // Clip with the norm of the whole gradient, summed exactly from the pieces.
    const GradClip clip = opt.clip_scale(ctx.comm, [&](int u) { return my_grad_piece(u); }, cfg.clip);
    // New: each rank updates its piece, then the pieces are all-gathered (in place).
    for (int u = 0; u < U; ++u) {
      opt.update(u, my_grad_piece(u), my_param_piece(u), step + 1, clip.scale);
      pending[u] = ctx.comm.all_gather_async(my_param_piece(u), unit_params(u), shards.units[u].shard, dt);
    }
    for (auto& h : pending) h.wait();
    ctx.dev.zero(grads.data(), grads.bytes());
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
