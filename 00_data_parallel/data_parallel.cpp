// data_parallel.cpp: stage 00. Read this first: every later stage changes
// one part of this loop (what each rank keeps, and which collective runs).
//
//   for each step:
//     for each micro-step k:        forward unit by unit, then backward in reverse;
//                                   on the last k, all_reduce each unit's gradients
//                                   as soon as its backward is done (overlap)
//     wait for the all-reduces      every rank now has the same averaged gradient
//     clip by the global norm       computed from the full gradient on each rank
//     AdamW on the whole model      every rank does the same update (redundantly)
#include "data_parallel.h"

#include <algorithm>
#include <cstring>

#include "adamw.h"
#include "checkpoint.h"
#include "gradnorm.h"
#include "precision.h"
#include "training.h"

namespace zf {

namespace {

// The model states one rank holds under data parallelism: all of them.
struct Replica {
  Tensor params;   // P, compute dtype (fp32 or bf16)             category params
  Tensor grads;    // P, compute dtype                            category grads
  Tensor master;   // P float32, bf16 recipe only                 category optimizer
  Tensor m, v;     // P float32 AdamW moments                     category optimizer

  Replica(MemoryTracker& mem, size_t P, Precision prec) {
    DType dt = compute_dtype(prec);
    params = Tensor(mem, Place::device, Category::params, dt, P);
    grads = Tensor(mem, Place::device, Category::grads, dt, P);
    if (prec == Precision::bf16) master = Tensor(mem, Place::device, Category::optimizer, DType::f32, P);
    m = Tensor(mem, Place::device, Category::optimizer, DType::f32, P);
    v = Tensor(mem, Place::device, Category::optimizer, DType::f32, P);
  }
  // The float32 copy the optimizer updates: the master in bf16, else the parameters.
  float* fp32_params() { return master.empty() ? params.as<float>() : master.as<float>(); }
  char* param_bytes(size_t offset) { return static_cast<char*>(params.data()) + offset * dtype_size(params.dtype()); }
  char* grad_bytes(size_t offset) { return static_cast<char*>(grads.data()) + offset * dtype_size(grads.dtype()); }
};

}  // namespace

RankResult train_data_parallel(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                               StepReporter& reporter) {
  const ModelLayout layout = build_layout(cfg.model);
  const size_t P = layout.numel;
  const int K = cfg.grad_accum;
  const DType dt = compute_dtype(cfg.precision);

  // Model states first (the largest allocations): over --device-mem, this is
  // where the run stops, before any step.
  Replica rep(ctx.mem, P, cfg.precision);
  RankFailureGuard guard(ctx.comm);  // a failing rank stops the group before freeing rep
  RankCompute rc(cfg, layout, ctx, data);

  const Resume resume = open_resume(cfg, layout, ctx);  // --resume: the checkpoint and its step
  {  // The same initial model on every rank (each computes it; no broadcast needed).
    std::vector<float> full(P);
    initial_model(cfg, layout, full.data());
    store_from_f32(ctx.dev, rep.fp32_params(), DType::f32, full.data(), P);
    if (cfg.precision == Precision::bf16) store_from_f32(ctx.dev, rep.params.data(), dt, full.data(), P);
    if (!cfg.save_init.empty() && ctx.rank == 0) save_model(cfg.save_init, layout, full.data());
    if (!cfg.save_init.empty()) ctx.comm.barrier();  // the file is complete before anyone goes on
    if (resume.checkpoint) {  // AdamW's moments, whole, as saved
      for (StateKind kind : {StateKind::m, StateKind::v}) {
        resume.checkpoint->read_all(kind, full.data());
        ctx.dev.to_device((kind == StateKind::m ? rep.m : rep.v).data(), full.data(), P * sizeof(float));
      }
    }
  }
  // What --save writes: every rank holds everything, so rank 0 just copies it back.
  auto full_state = [&](StateKind kind) {
    std::vector<float> out;
    if (ctx.rank != 0) return out;
    out.resize(P);
    const Tensor* t = kind == StateKind::m ? &rep.m : kind == StateKind::v ? &rep.v : nullptr;
    ctx.dev.to_host(out.data(), t ? t->data() : rep.fp32_params(), P * sizeof(float));
    return out;
  };

  AdamWConfig adam;
  adam.lr = cfg.lr;
  RankResult result;
  result.first_step = resume.first_step;
  std::vector<CommHandle> pending(layout.units.size());

  for (int step = resume.first_step; step < cfg.steps; ++step) {
    Timer timer;
    float loss_sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      rc.load(step, k);
      float loss = 0.0f;
      for (size_t u = 0; u < layout.units.size(); ++u)
        rc.forward(int(u), rep.param_bytes(layout.units[u].offset), &loss);
      loss_sum += loss;

      // Backward, last unit first.
      for (int u = int(layout.units.size()) - 1; u >= 0; --u) {
        const auto& unit = layout.units[u];
        rc.backward(u, rep.param_bytes(unit.offset), rep.grad_bytes(unit.offset));
        // This unit's gradient is final for this step: start reducing it now,
        // while the next unit's backward runs (DDP's bucketing, one unit a bucket).
        if (k == K - 1)
          pending[u] = ctx.comm.all_reduce_async(rep.grad_bytes(unit.offset), unit.numel, dt, ReduceOp::sum);
      }
    }
    for (auto& h : pending) h.wait();
    const float loss = global_mean_loss(ctx.comm, ctx.dev, loss_sum, K);

    // Clip by the global norm. Every rank has the whole averaged gradient.
    SumOfSquares sq;
    ctx.dev.sum_squares(rep.grads.data(), dt, P, sq);
    const GradClip clip = grad_clip(std::sqrt(sq.value()), cfg.clip);

    // AdamW on the whole model, one parameter tensor at a time (decay or not).
    float* p32 = rep.fp32_params();
    for (const auto& unit : layout.units)
      for (const auto& p : unit.params) {
        size_t off = unit.offset + p.offset;
        ctx.dev.adamw(p32 + off, rep.grad_bytes(off), dt, rep.m.as<float>() + off, rep.v.as<float>() + off,
                      p.numel, adam, step + 1, clip.scale, p.decay);
      }
    if (cfg.precision == Precision::bf16) ctx.dev.narrow(p32, rep.params.as<bf16>(), P);
    ctx.dev.zero(rep.grads.data(), rep.grads.bytes());

    record_step(result, reporter, ctx, step, loss, clip.norm, timer.ms());
    maybe_save(cfg, ctx, layout, step + 1, full_state);
  }

  record_counters(result, ctx);
  std::vector<float> final_params(P);
  ctx.dev.to_host(final_params.data(), rep.fp32_params(), P * sizeof(float));
  result.param_hash = hash_params(final_params.data(), P);
  return result;
}

}  // namespace zf
