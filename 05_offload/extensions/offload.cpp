// extensions/offload.cpp: stage 05's step (../offload.cpp) with its extensions:
//
//   for each micro-step k:
//     forward, backward as in stage 04 (fsdp.h), but each unit's reduced
//     piece goes device->host into my float32 gradient shard on the host
//   clip: the norm over the host's shards
//   for each unit g: CPU AdamW on its float32 shard, rounding it into the
//     bf16 copy in the same pass; copy that host->device (overlapping the
//     next unit's update). Moments on disk: one stream over the whole
//     shard first, then the copies
//   wait for the copies: the next step's all-gathers send what they wrote
//
// With --delay-update (offload.h), from the second step on, the last three
// lines become: wait for the previous step's update (on the worker thread,
// delayed_update.h), copy its result host->device, and give this step's
// update to the worker; the next step computes meanwhile.
#include "offload.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>

#include "../offload.h"
#include "check.h"
#include "delayed_update.h"
#include "disk_adamw.h"
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
namespace extensions {
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
  // AdamW on the host: its moments in host memory, or in files under
  // --offload-dir.                                                             category optimizer (host)
  std::optional<HostAdamW> opt;
  std::optional<DiskAdamW> disk;
  Device& comm_dev;
  WallPhases& phases;     // where this step's wall time went
  DelayedUpdate pending;  // --delay-update: the update in flight (last: it is joined before the rest goes)

  OffloadStates(const FsdpUnits& units, const ShardLayout& shards, const TrainConfig& cfg,
                const OffloadOptions& offload, RankContext& ctx, FsdpComms& comms, WallPhases& phases)
      : units(units), shards(shards), comm(*comms.group), replica(comms.replicate ? comms.replicate->rank() : 0),
        precision(cfg.precision),
        host(phases.timed_host(host_device(offload, ctx))),
        params(shards, storage_dtype(cfg.precision), cfg.fsdp, units.last(), ctx.mem, ctx.dev, *host, *comms.group,
               offload.offload_params, !offload.no_pin, offload.delay_update, master_on_disk(cfg, offload)),
        grads(shards, storage_dtype(cfg.precision), reduce_dtype(cfg), cfg.fsdp.no_sync, ctx.mem, ctx.dev, *host,
              *comms.reduce_queue, comms.replicate.get(), !offload.no_pin, offload.delay_update ? 2 : 1),
        comm_dev(ctx.dev), phases(phases), pending(host_clock(ctx)) {
    if (offload.offload_dir.empty())
      opt.emplace(units.flat, shards, ctx.mem, *host);
    else
      disk.emplace(units.flat, shards, offload.offload_dir, ctx.rank, ctx.mem, *host, master_on_disk(cfg, offload),
                   DiskAdamW::kChunkElems, host_clock(ctx));
  }

  // --offload-dir with --offload-params in bf16: the float32 shards go to
  // disk too, as only the bf16 copy is read outside the optimizer (in fp32
  // the shards are that copy, and stay).
  static bool master_on_disk(const TrainConfig& cfg, const OffloadOptions& offload) {
    return !offload.offload_dir.empty() && offload.offload_params && cfg.precision == Precision::bf16;
  }

  // Before any file is made: the folders of killed runs go (their space
  // counts), and the folder must hold every rank's moments (and master),
  // checked by every rank before any reserves its own.
  static void prepare_dir(const TrainConfig& cfg, const OffloadOptions& offload, const ShardLayout& shards,
                          RankContext& ctx) {
    if (offload.offload_dir.empty()) return;
    if (ctx.rank == 0)
      for (const std::string& f : OffloadFiles::remove_stale(offload.offload_dir))
        std::fprintf(stderr, "note: removed %s, the offload folder of a run that was killed\n", f.c_str());
    ctx.comm.barrier();
    const size_t arrays = master_on_disk(cfg, offload) ? 3 : 2;
    OffloadFiles::check_dir(offload.offload_dir, size_t(ctx.world) * DiskTier::disk_bytes(arrays, shards.shard_total));
    ctx.comm.barrier();
  }

  // The CPU as a device, its AdamW on --optimizer-threads threads, or on the
  // cores left to each rank of this host; --clock modeled charges its host.
  static std::unique_ptr<Device> host_device(const OffloadOptions& offload, RankContext& ctx) {
    const int ranks = ctx.host_ranks > 0 ? ctx.host_ranks : ctx.world;  // unknown: all share it
    const int threads = offload.optimizer_threads > 0 ? offload.optimizer_threads : default_optimizer_threads(ranks);
    std::unique_ptr<Device> cpu = make_cpu_device(threads);
    HostClock* clock = host_clock(ctx);
    return clock ? clock->on_host(std::move(cpu)) : std::move(cpu);
  }

  static DType reduce_dtype(const TrainConfig& cfg) {
    return cfg.fsdp.reduce_dtype.value_or(storage_dtype(cfg.precision));
  }

  void load(const InitialState& init) override {
    if (!params.shards_on_disk())
      for (int g = 0; g < units.size(); ++g)
        init.load(g, StateKind::params, shards.units[g].begin, shards.units[g].end, *host, params.piece(g),
                  DType::f32);
    if (opt) opt->load(init);
    else disk->load(init, params.shards_on_disk() ? bf16_copy() : nullptr);
    for (int g = 0; g < units.size(); ++g) {
      params.narrow_host_copy(g);
      params.upload(g).wait();
    }
  }
  std::vector<float> full(StateKind kind, bool every_rank) override {
    pending.finish();  // a checkpoint and the final hash hold every step's update
    if (opt) return opt->gather(kind, params.shard(), comm, comm_dev, every_rank);
    if (kind != StateKind::params || params.shards_on_disk()) return disk->gather(kind, comm, comm_dev, every_rank);
    return gather_full_model(comm, comm_dev, units.flat, shards, [&](int g, float* out) { copy_piece(kind, g, out); },
                             every_rank);
  }
  // A sharded checkpoint: my pieces from where they live (host memory, or
  // the disk tier), written by the first shard group alone.
  const ShardLayout* share() const override { return replica == 0 ? &shards : nullptr; }
  void copy_piece(StateKind kind, int g, float* host) override {
    pending.finish();
    if (opt) return opt->copy_piece(kind, g, params.shard(), host);
    if (kind != StateKind::params || params.shards_on_disk()) return disk->copy_piece(kind, g, host);
    std::copy_n(static_cast<const float*>(params.piece(g)), shards.units[g].end - shards.units[g].begin, host);
  }

  // The norm of the step's gradient over my group's pieces, on the host.
  GradClip clip(float max_norm) {
    return clip_scale(shards, *host, comm_dev, comm, [&](int g) { return grads.piece(g); }, DType::f32,
                      max_norm);
  }
  // CPU AdamW on unit g's float32 shard with the gradients of `buffer`, and
  // its rounding into the bf16 copy the device receives (moments in memory),
  // with the settings of step t (its learning rate).
  void update(int g, int buffer, const AdamWConfig& adam, long t, float scale) {
    opt->update(g, params.shard(), grads.shard(buffer), bf16_copy(), adam, t, scale);
  }
  // Every unit: unit by unit, or one stream over the shard when the
  // moments are on disk. With --delay-update this runs on the worker: it
  // touches only the host's float32 shards, moments, bf16 copy and that
  // buffer; the rank's thread meanwhile reads the device's copy (or the
  // all-gathers' second host copy) and fills the other buffer.
  void update_all(int buffer, const AdamWConfig& adam, long t, float scale) {
    if (opt) {
      for (int g = 0; g < units.size(); ++g) update(g, buffer, adam, t, scale);
      return;
    }
    disk->update(params.shards_on_disk() ? nullptr : params.shard(), grads.shard(buffer), bf16_copy(), adam,
                 t, scale);
  }
  // Where the update rounds my shard to: the bf16 copy, all my pieces (nullptr
  // in fp32, where the float32 shard is the copy).
  bf16* bf16_copy() { return precision == Precision::bf16 ? static_cast<bf16*>(params.host_copy(0)) : nullptr; }

  void upload_all() {
    std::vector<Transfer> uploads(units.size());
    for (int g = 0; g < units.size(); ++g) uploads[g] = params.upload(g);
    for (Transfer& u : uploads) u.wait();
  }

  // This step's update, now: CPU AdamW unit by unit, each unit's upload
  // overlapping the next one's update (moments on disk: one stream over the
  // shard first, then the uploads); the step waits for the uploads.
  void update_now(const AdamWConfig& adam, long t, float scale) {
    const int G = units.size(), b = grads.current();
    std::vector<Transfer> uploads(G);
    if (disk) update_all(b, adam, t, scale);
    for (int g = 0; g < G; ++g) {
      if (!disk) update(g, b, adam, t, scale);
      uploads[g] = params.upload(g);
    }
    for (Transfer& u : uploads) u.wait();
    grads.zero();
  }

  // --delay-update, from the second step on: the previous step's update is
  // this step's parameters; this one's runs on the worker meanwhile. The
  // last step's update is waited for within it, so the run ends with it.
  // adam and t are the update's step's (its learning rate, one step stale).
  void update_delayed(const AdamWConfig& adam, long t, float scale, bool last) {
    Timer wait;
    pending.finish();
    const double waited = wait.ms();
    double worker_ms = 0;
    if (pending.take(&worker_ms)) upload_all();
    phases.off_path(worker_ms, waited);
    const int filled = grads.flip();
    pending.launch([this, filled, adam, t, scale] {
      update_all(filled, adam, t, scale);
      grads.zero(filled);  // for the step after next
    });
    if (last) {
      pending.finish();
      if (pending.take(nullptr)) upload_all();
    }
  }
};

}  // namespace
}  // namespace extensions

RankResult train_offload_extended(const TrainConfig& cfg, const OffloadOptions& offload, RankContext& ctx,
                                  const TokenData& data, StepLog& log) {
  if (!offload.offload_params && offload.offload_dir.empty() && !offload.delay_update)
    return train_offload(cfg, offload, ctx, data, log);
  const ModelLayout layout = build_layout(cfg.model);
  const FsdpUnits units = wrap_blocks(layout, cfg.fsdp.wrap_blocks);
  FsdpComms comms(ctx.comm, cfg.fsdp.shard_group);
  const ShardLayout shards = make_shard_layout(units.flat, comms.group->size(), comms.group->rank());
  const int K = cfg.grad_accum, D = cfg.fsdp.prefetch;

  using extensions::OffloadStates;
  OffloadStates::prepare_dir(cfg, offload, shards, ctx);
  WallPhases phases;  // the step's phases, timed by decorators
  OffloadStates states(units, shards, cfg, offload, ctx, comms, phases);
  auto rc = phases.timed_compute(make_rank_compute(cfg, layout, ctx, data));
  TrainingRun run(cfg, units.flat, ctx, log, states);  // the initial model, or --resume's checkpoint
  comms.count_in(run);
  const size_t esize = dtype_size(storage_dtype(cfg.precision));

  // A forward without a backward, on the parameters the device has (with
  // --delay-update one update behind: those the next step computes with).
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
    if (!offload.delay_update || step == run.first_step())
      states.update_now(adam, step + 1, clip.scale);
    else
      states.update_delayed(adam, step + 1, clip.scale, step + 1 == cfg.steps);
    const double ms = timer.ms();
    run.end_step(step, loss, clip.norm, ms, phases.lap(ms));  // a checkpoint waits for the update
    run.evaluate(step + 1, *rc, forward_only);
  }
  RankResult result = run.finish();
  if (comms.replicate) result.comm_cross_group = comms.replicate->stats();  // stage 04's split, as its run log shows it
  result.notes["host_optimizer"] = states.host->optimizer_description();  // what ran AdamW
  return result;
}

}  // namespace zf
