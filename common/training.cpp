// training.cpp: initial model, global loss, parameter hash, fault injection.
#include "training.h"

#include <algorithm>
#include <cstdio>

#include "checkpoint.h"
#include "host_collectives.h"
#include "rng.h"

namespace zf {

const std::string& model_file(const TrainConfig& cfg) { return cfg.resume.empty() ? cfg.init : cfg.resume; }

void initial_model(const TrainConfig& cfg, const ModelLayout& layout, float* flat) {
  if (!model_file(cfg).empty()) {
    load_model(model_file(cfg), layout, flat);
    return;
  }
  for (const auto& u : layout.units) init_unit_range(u, cfg.model, cfg.seed, 0, u.numel, flat + u.offset);
}

namespace {

std::string data_name(const TrainConfig& cfg) { return cfg.data.empty() ? "(built-in corpus)" : cfg.data; }

}  // namespace

Resume open_resume(const TrainConfig& cfg, const ModelLayout& layout, const RankContext& ctx) {
  Resume r;
  if (cfg.resume.empty()) return r;
  r.checkpoint = std::make_unique<CheckpointReader>(cfg.resume, layout);
  const long step = r.checkpoint->step();
  USAGE_REQUIRE(step < cfg.steps, "--resume " << cfg.resume << ": the checkpoint was saved after " << step
                                              << " steps and --steps is " << cfg.steps
                                              << ", so there is nothing left to train. --steps counts from "
                                                 "step 0: ask for more than "
                                              << step);
  r.first_step = int(step);
  const long long G = (long long)ctx.world * cfg.batch * cfg.grad_accum;  // SPEC.md's global batch
  if (ctx.rank == 0 && !cfg.quiet) {
    const auto& meta = r.checkpoint->metadata();
    auto said = [&](const char* key) { auto it = meta.find(key); return it == meta.end() ? std::string("?") : it->second; };
    std::printf("resuming from %s at step %ld (saved by %s, %s ranks)\n", cfg.resume.c_str(), step,
                said("stage").c_str(), said("ranks").c_str());
    if (said("global_batch") != std::to_string(G) || said("data") != data_name(cfg))
      std::printf("note: the checkpoint was trained with global batch %s on %s; this run uses %lld on %s, so "
                  "its batches differ from an uninterrupted run's\n",
                  said("global_batch").c_str(), said("data").c_str(), G,
                  data_name(cfg).c_str());
    std::fflush(stdout);
  }
  return r;
}

void maybe_save(const TrainConfig& cfg, RankContext& ctx, const ModelLayout& layout, int steps_done,
                const std::function<std::vector<float>(StateKind)>& full) {
  const bool due = steps_done == cfg.steps || (cfg.save_every > 0 && steps_done % cfg.save_every == 0);
  if (cfg.save.empty() || !due) return;
  const CommStats training = ctx.comm.stats();
  const std::vector<float> params = full(StateKind::params), m = full(StateKind::m), v = full(StateKind::v);
  if (ctx.rank == 0)
    save_checkpoint(cfg.save, layout, params.data(), m.data(), v.data(), steps_done,
                    {{"stage", cfg.stage},
                     {"ranks", std::to_string(ctx.world)},
                     {"precision", precision_name(cfg.precision)},
                     {"global_batch", std::to_string((long long)ctx.world * cfg.batch * cfg.grad_accum)},
                     {"data", data_name(cfg)},
                     {"seed", std::to_string(cfg.seed)}});
  ctx.comm.restore_counts(training);
}

float global_mean_loss(Communicator& comm, Device& dev, float local_sum, int micro_steps) {
  float v = local_sum;
  all_reduce_host(comm, dev, &v, 1, DType::f32, ReduceOp::sum);
  return v / float(comm.size() * micro_steps);
}

uint64_t hash_params(const float* flat, size_t n) { return fnv1a64(flat, n * sizeof(float)); }

void maybe_inject_fault(const TrainConfig& cfg, int rank, int step) {
  if (rank == cfg.fault_rank && step == cfg.fault_step)
    throw Error("injected fault (--inject-fault " + std::to_string(rank) + ":" + std::to_string(step) +
                ") in the middle of step " + std::to_string(step));
}

RankCompute::RankCompute(const TrainConfig& cfg, const ModelLayout& layout, RankContext& ctx,
                         const TokenData& data)
    : cfg_(cfg), layout_(layout), ctx_(ctx), sampler_(data, cfg.model.T, cfg.model.V),
      unit_(cfg.precision, cfg.compute, ctx.mem, ctx.dev,
            std::max_element(layout.units.begin(), layout.units.end(),
                             [](const UnitLayout& a, const UnitLayout& b) { return a.numel < b.numel; })
                ->numel),
      gpt_(layout, ctx.mem, ctx.dev, cfg.batch, cfg.attention),
      inputs_(ctx.mem, Place::device, Category::activations, DType::i32, size_t(cfg.batch) * cfg.model.T),
      targets_(ctx.mem, Place::device, Category::activations, DType::i32, size_t(cfg.batch) * cfg.model.T),
      host_inputs_(size_t(cfg.batch) * cfg.model.T), host_targets_(size_t(cfg.batch) * cfg.model.T) {}

void RankCompute::load(int step, int micro) {
  step_ = step;
  // The sampler writes host memory; the tokens then go to the device.
  sampler_.micro_batch(step, micro, ctx_.rank, ctx_.world, cfg_.batch, cfg_.grad_accum, host_inputs_.data(),
                       host_targets_.data());
  ctx_.dev.to_device(inputs_.data(), host_inputs_.data(), inputs_.bytes());
  ctx_.dev.to_device(targets_.data(), host_targets_.data(), targets_.bytes());
}

void RankCompute::forward(int u, const void* params, float* loss) {
  gpt_.forward_unit(u, unit_.params(params, layout_.units[u].numel), inputs_.as<int32_t>(),
                    targets_.as<int32_t>(), loss);
}

void RankCompute::backward(int u, const void* params, void* grads) {
  const size_t n = layout_.units[u].numel;
  void* g = unit_.grads_begin(grads, n);
  gpt_.backward_unit(u, unit_.params(params, n), g, 1.0f / float(ctx_.world * cfg_.grad_accum));
  unit_.grads_end(grads, n);
  if (u == layout_.head_unit()) maybe_inject_fault(cfg_, ctx_.rank, step_);  // mid-backward, for the tests
}

void record_step(RankResult& result, StepReporter& reporter, RankContext& ctx, int step, float loss,
                 float grad_norm, double ms) {
  result.losses.push_back(loss);
  result.grad_norms.push_back(grad_norm);
  result.step_ms.push_back(ms);
  if (ctx.rank == 0) reporter.step(step, loss, grad_norm, ms, ctx.mem.counts().model_states(Place::device));
}

void record_counters(RankResult& result, RankContext& ctx) {
  result.memory = ctx.mem.counts();
  result.comm = ctx.comm.stats();
}

}  // namespace zf
