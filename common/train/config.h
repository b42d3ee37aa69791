// config.h: what a training run is asked to do (the flags of docs/SPEC.md, parsed
// by cli.cpp) and what one rank gives back. The harness's own flags (the
// run log, the trace, the clock, a dry run, an injected fault, the
// collectives' timeout) are report/run_config.h's, and so are stage 05's
// (train/offload_options.h), which that stage alone receives.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm.h"
#include "device.h"
#include "lr_schedule.h"
#include "sample.h"
#include "memory.h"
#include "model.h"
#include "precision.h"

namespace zf {


// The FSDP flags (docs/SPEC.md, "Stage-specific
// flags"): parsed for every stage, refused by the stages that lack them.
struct FsdpOptions {
  int wrap_blocks = 1;                // consecutive blocks per FSDP unit
  bool reshard_after_forward = true;  // free a unit's gathered parameters after its forward
  int prefetch = 1;                   // D: units whose all-gathers are issued ahead (0: none)
  int max_gathered = 2;               // M: gathered units alive or in flight (0: no limit)
  std::optional<DType> reduce_dtype;  // the gradients' reduce-scatter dtype (default: the recipe's)
  int shard_group = 0;                // F: shard within groups of F ranks (0: all N)
  bool no_sync = false;               // accumulate unsharded gradients, reduce-scatter once per step
};

struct TrainConfig {
  std::string stage = "dp";       // executable name: dp, zero1, ...
  ModelConfig model = model_preset("small");
  int ranks = 1;
  int steps = 50;
  int batch = 4;                  // micro-batch per rank (B)
  int grad_accum = 1;             // micro-steps per step (K)
  float lr = 3e-4f;               // the peak learning rate, reached after --warmup
  LrDecay lr_schedule = LrDecay::constant;  // --lr-schedule (lr_schedule.h)
  int warmup = 0;                 // --warmup: steps of linear warmup
  float min_lr = 0.0f;            // --min-lr: where cosine and linear decay end
  float weight_decay = 0.1f;      // --weight-decay: AdamW's decoupled decay (matrices only)
  float clip = 1.0f;              // 0: no clipping
  uint64_t seed = 1337;
  bool seed_given = false;        // --seed was on the command line (a resumed run says it is not used)
  Precision precision = Precision::fp32;
  // What the kernels compute in (precision.h, device.h): f32, or bf16 (bf16
  // recipe only). --compute auto picks bf16 for the bf16 recipe on a GPU.
  DType compute = DType::f32;
  AttentionForm attention = AttentionForm::simple;  // --attention (device.h)
  Recompute recompute = Recompute::none;            // --recompute (model.h)
  std::string data;               // empty: the built-in corpus
  std::string val_data;           // --val-data: the validation tokens (empty: the last tenth of the data)
  int val_every = 0;              // --val-every: the held-out loss before the first step, after every this many and after the last (0: never)
  int val_batches = 4;            // --val-batches: batches of N*B held-out sequences per evaluation
  int sample_every = 0;           // --sample-every: a text sample at the same points (0: never)
  SampleConfig sample;            // --sample-prompt, --sample-length, --temperature, --top-k, --sample-seed
  std::string device = "cpu";
  std::optional<size_t> device_mem;
  std::string init;               // a model file or checkpoint (either kind) to start from
  std::string save_init;          // write the initial model here first
  std::string save;               // training checkpoint (checkpoint.h): written at the end...
  int save_every = 0;             // ...and after every this many steps (0: only at the end)
  bool save_sharded = false;      // --save-format sharded: --save is a folder of per-rank files (sharded_checkpoint.h)
  bool save_async = false;        // --save-async: sharded saves written in the background (sharded_saver.h)
  std::string resume;             // training checkpoint to continue from (its step, model, AdamW state)
  bool quiet = false;             // no human log (tests)
  FsdpOptions fsdp;               // the FSDP flags (defaults elsewhere)

  int64_t global_batch() const { return int64_t(ranks) * batch * grad_accum; }  // G = N*B*K
  LrSchedule schedule() const { return {lr, lr_schedule, warmup, min_lr, steps}; }
  std::string data_name() const { return data.empty() ? "(built-in corpus)" : data; }
  // What the states are read from: --resume's checkpoint, else --init's file ("": the seeded model).
  const std::string& start_from() const { return resume.empty() ? init : resume; }
};

// What one rank gives back at the end of a run.
struct RankResult {
  std::vector<float> losses;      // global-batch mean loss per step (same on every rank)
  std::vector<float> grad_norms;  // global gradient norm per step, before clipping (same on every rank)
  std::vector<double> step_ms;    // time per step: the wall's, or the harness's clock's (run_hooks.h)
  std::vector<std::pair<int, float>> val_losses;  // (steps done, held-out loss) of each evaluation (same on every rank)
  CommStats val_comm;             // the evaluations' collectives (not in `comm`)
  std::vector<std::pair<int, std::vector<int32_t>>> samples;  // (steps done, tokens generated) (same on every rank)
  MemoryCounts memory;            // at the end of the run
  CommStats comm;                 // over the whole run, every communicator of the rank
  CommStats comm_cross_group;     // hybrid sharding: the part of comm across the shard groups
  TransferStats transfers;        // host<->device copies of the steps trained (not the initial load, nor evaluations)
  // What the stage says of its run besides these, by name, for the run
  // log's summary and the closing lines ("host_optimizer": "avx2, 2 threads").
  std::map<std::string, std::string> notes;
  uint64_t param_hash = 0;        // final float32 parameters in consolidated order
  int first_step = 0;             // the step this run started at (> 0 after --resume)
  int stop_signal = 0;            // the signal the ranks stopped on (stop_request.h), or 0
  int stopped_after = 0;          // then: the steps done (the checkpoint's step)
};

}  // namespace zf
