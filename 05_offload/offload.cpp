// offload.cpp: stage 05. Stage 04's step with the optimizer on the host:
//
//   for each micro-step k:
//     forward, backward as in stage 04 (fsdp.h), but each unit's reduced
//     piece goes device->host into my float32 gradient shard on the host
//   clip: the norm over the host's shards
//   for each unit g: CPU AdamW on my float32 piece, rounding it into the
//     bf16 copy in the same pass; copy that host->device (overlapping the
//     next unit's update)
//   wait for the copies: the next step's all-gathers send what they wrote
#include "offload.h"

#include <memory>
#include <vector>

#include "check.h"
#include "fsdp.h"
#include "host_adamw.h"
#include "host_grads.h"
#include "offload_params.h"
#include "precision.h"
#include "shard.h"
#include "shard_pieces.h"
#include "host_clock.h"
#include "training.h"
#include "training_run.h"
#include "wall_phases.h"

namespace zf {

namespace {

// The model states of one rank: stage 04's, on the host, and the device's copy of the parameters.
struct OffloadStates final : ModelStates {
  const FsdpUnits& units;
  const ShardLayout& shards;
  Communicator& comm;  // the shard group
  int replica;         // which copy of the shards (hybrid sharding; else 0)
  Precision precision;
  std::unique_ptr<Device> host;  // the CPU, computing on host memory (AdamW on --optimizer-threads)
  OffloadParams params;  // new: float32 shards on the host; the device's copy    category params (host, device)
  HostGrads grads;       // new: stage 04's reductions, into host float32 shards  category grads (host), comm
  HostAdamW opt;         // new: AdamW's moments on the host, run by the CPU      category optimizer (host)
  Device& comm_dev;

  OffloadStates(const FsdpUnits& units, const ShardLayout& shards, const TrainConfig& cfg, bool pinned,
                RankContext& ctx, FsdpComms& comms, std::unique_ptr<Device> cpu)
      : units(units), shards(shards), comm(*comms.group), replica(comms.replicate ? comms.replicate->rank() : 0),
        precision(cfg.precision), host(std::move(cpu)),
        params(shards, storage_dtype(cfg.precision), cfg.fsdp, units.last(), ctx.mem, ctx.dev, *host, *comms.group,
               pinned),
        grads(shards, storage_dtype(cfg.precision), cfg.fsdp.reduce_dtype.value_or(storage_dtype(cfg.precision)),
              cfg.fsdp.no_sync, ctx.mem, ctx.dev, *host, *comms.reduce_queue, comms.replicate.get(), pinned),
        opt(units.flat, shards, ctx.mem, *host), comm_dev(ctx.dev) {}

  // The CPU as a device, its AdamW on --optimizer-threads threads, or on the
  // cores left to each rank of this host; --clock modeled charges its host.
  static std::unique_ptr<Device> host_device(const OffloadOptions& offload, RankContext& ctx) {
    const int ranks = ctx.host_ranks > 0 ? ctx.host_ranks : ctx.world;  // unknown: all share it
    const int threads = offload.optimizer_threads > 0 ? offload.optimizer_threads : default_optimizer_threads(ranks);
    std::unique_ptr<Device> cpu = make_cpu_device(threads);
    HostClock* clock = host_clock(ctx);
    return clock ? clock->on_host(std::move(cpu)) : std::move(cpu);
  }

  void load(const InitialState& init) override {
    opt.load(init);
    for (int g = 0; g < units.size(); ++g) {
      init.load(g, StateKind::params, shards.units[g].begin, shards.units[g].end, *host, params.piece(g), DType::f32);
      params.narrow_host_copy(g);
      params.upload(g).wait();
    }
  }
  std::vector<float> full(StateKind kind, bool every_rank) override {
    return opt.gather(kind, params.shard(), comm, comm_dev, every_rank);
  }
  // A sharded checkpoint: my pieces from host memory, written by the first shard group alone.
  const ShardLayout* share() const override { return replica == 0 ? &shards : nullptr; }
  void copy_piece(StateKind kind, int g, float* out) override { opt.copy_piece(kind, g, params.shard(), out); }

  // The norm of the step's gradient over my group's pieces, on the host.
  GradClip clip(float max_norm) {
    return clip_scale(shards, *host, comm_dev, comm, [&](int g) { return grads.piece(g); }, DType::f32, max_norm);
  }
  // CPU AdamW on unit g's float32 piece, rounded into the bf16 copy the
  // device receives (in fp32 the float32 shard is that copy). The update
  // takes whole shards and finds unit g's piece in each.
  void update(int g, const AdamWConfig& adam, long t, float scale) {
    bf16* copy = precision == Precision::bf16 ? static_cast<bf16*>(params.host_copy(0)) : nullptr;
    opt.update(g, params.shard(), grads.shard(), copy, adam, t, scale);
  }
};

}  // namespace

RankResult train_offload(const TrainConfig& cfg, const OffloadOptions& offload, RankContext& ctx,
                         const TokenData& data, StepLog& log) {
  REQUIRE(!offload.offload_params && offload.offload_dir.empty() && !offload.delay_update,
          "--offload-params, --offload-dir and --delay-update are extensions/'s (train_offload_extended)");
  const ModelLayout layout = build_layout(cfg.model);
  const FsdpUnits units = wrap_blocks(layout, cfg.fsdp.wrap_blocks);
  FsdpComms comms(ctx.comm, cfg.fsdp.shard_group);
  const ShardLayout shards = make_shard_layout(units.flat, comms.group->size(), comms.group->rank());
  const int G = units.size(), K = cfg.grad_accum, D = cfg.fsdp.prefetch;

  WallPhases phases;  // the step's phases, timed by decorators
  OffloadStates states(units, shards, cfg, !offload.no_pin, ctx, comms,
                       phases.timed_host(OffloadStates::host_device(offload, ctx)));
  auto rc = phases.timed_compute(make_rank_compute(cfg, layout, ctx, data));
  TrainingRun run(cfg, units.flat, ctx, log, states);  // the initial model, or --resume's checkpoint
  comms.count_in(run);
  const size_t esize = dtype_size(storage_dtype(cfg.precision));

  const auto forward_only = [&] { return fsdp_evaluate(states.params, units, *rc, esize, D); };
  run.evaluate(run.first_step(), *rc, forward_only);
  for (int step = run.first_step(); run.keep_going(step); ++step) {
    Timer timer;
    float loss_sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      rc->load(step, k);
      loss_sum += fsdp_forward(states.params, units, *rc, esize, D);
      // Stage 04's backward; each reduced piece goes device->host (HostGrads).
      fsdp_backward(states.params, states.grads, units, *rc, esize, D, !cfg.fsdp.no_sync || k == K - 1);
    }
    const float loss = global_mean_loss(ctx.comm, ctx.dev, loss_sum, K);

    const GradClip clip = states.clip(cfg.clip);
    const AdamWConfig adam = run.adamw(step);  // this step's learning rate (lr_schedule.h)
    std::vector<Transfer> uploads(G);
    for (int g = 0; g < G; ++g) {
      states.update(g, adam, step + 1, clip.scale);  // on the CPU
      uploads[g] = states.params.upload(g);          // host->device, while the CPU updates unit g+1
    }
    for (Transfer& u : uploads) u.wait();  // the next step's all-gathers send what they wrote
    states.grads.zero();
    const double ms = timer.ms();
    run.end_step(step, loss, clip.norm, ms, phases.lap(ms));
    run.evaluate(step + 1, *rc, forward_only);
  }
  RankResult result = run.finish();
  if (comms.replicate) result.comm_cross_group = comms.replicate->stats();  // stage 04's split, as its run log shows it
  result.notes["host_optimizer"] = states.host->optimizer_description();  // what ran AdamW
  return result;
}

}  // namespace zf
