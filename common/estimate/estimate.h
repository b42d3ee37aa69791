// estimate.h: what one rank of a stage holds and moves, from a run's flags
// alone, without training: model states per category and place (with shard
// padding as the stage pads), activations (docs/SPEC.md's F/K/A formula,
// section 7), bytes sent per collective per step (section 8) and stage 05's
// host<->device transfers. tools/memory_estimate prints it; the estimate
// suite holds it to measured runs of every stage.
//
// The stage's options are read from the TrainConfig and the OffloadOptions
// the trainers parse their flags into (cli.h, the two halves of a
// RunConfig), so an estimate of a run is made from that run's flags: ranks,
// precision, compute, attention, recompute, batch, grad_accum, stage 04's
// (wrap_blocks, reshard_after_forward, reduce_dtype, shard_group, no_sync)
// and stage 05's (offload_params, offload_dir, delay_update), with prefetch
// and max_gathered for the peak of the units stage 04 gathers.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "comm.h"
#include "config.h"
#include "memory_model.h"
#include "offload_options.h"

namespace zf {

// The stage's executable name (dp, zero1, zero2, zero3, fsdp, offload),
// and back; UsageError naming `flag` and the names for anything else.
const char* stage_name(Stage s);
Stage parse_stage(const std::string& name, const char* flag);

// What a rank holds and moves in one stage.
struct StageEstimate {
  Stage stage = Stage::dp;
  ModelSizes sizes;         // the elements this stage pads and shards (its FSDP units, its shard group)
  ModelStateBytes states;   // params, grads, optimizer on the device, the host and (--offload-dir) disk
  std::optional<double> activations;  // device bytes of category activations; none without a shape
  // Stages 03-05: the peak of category gathered (units all-gathered whole),
  // from the same replay as `transient`: the schedule of --prefetch,
  // --max-gathered and resharding (stage 03: two units, the one computing
  // and the next); none in stages 00-02 or without a shape.
  std::optional<double> gathered;
  // Category workspace: the bf16 recipe's two float32 buffers of the largest
  // unit, where compute widens (f32 compute); 0 otherwise.
  double workspace = 0;
  // The most bytes of the step's transient buffers at once: the gathered
  // units and the communication buffers (gradients waiting for or in their
  // reduce-scatter, bf16 casts, float32 widenings), replayed from the
  // stage's order of allocations and frees; none without a shape, and 0 in
  // stages 00-01. With the model states, the activations and the workspace,
  // all held through the step, it is the device's peak: device_total().
  std::optional<double> transient;
  double device_total() const {
    return states.device.total() + activations.value_or(0) + workspace + transient.value_or(0);
  }
  std::array<double, kNumCollectives> comm{};  // ring-model bytes sent per optimizer step, by collective
  double comm_cross_group = 0;  // the part of comm's all_reduce across shard groups (--shard-group)
  double to_host = 0, to_device = 0;  // stage 05: host<->device bytes per step
  double comm_total() const {
    double t = 0;
    for (double b : comm) t += b;
    return t;
  }
};

// The products of a run's flags that size its buffers and counts, each
// refused (UsageError naming the flags) beyond the range it is counted in:
// the positions of a micro-batch (--batch x the model's T: the kernels'
// rows, an int), and the tokens of an optimizer step (--ranks x --batch x
// --grad-accum x T) and the sequences of an evaluation (--val-batches x
// --ranks x --batch), counted exactly in int64 and in doubles: 2^53 at most.
void check_run_sizes(const TrainConfig& cfg, int ranks);

// From cfg.model's layout: units padded as the stage pads them. `off`:
// stage 05's flags (read for Stage::offload alone).
StageEstimate estimate_stage(Stage stage, const TrainConfig& cfg, const OffloadOptions& off);
// Only the model's size P known: no padding, no activations, and stage 04's
// kept head counted as 0 (its all-gather bytes are then an upper bound).
StageEstimate estimate_stage_unpadded(Stage stage, const TrainConfig& cfg, const OffloadOptions& off, double params);

// docs/SPEC.md's activation bytes of a rank (section 7, "Activation
// recomputation"): by mode fixed + L (block + att), fixed + block + att,
// fixed + L block + att.
double activation_bytes(const ModelConfig& m, int batch, DType compute, AttentionForm attention, Recompute recompute);

// Stage 04's FSDP units (--wrap-blocks): the embedding, groups of that many
// consecutive blocks, the head; as a layout whose units hold those sizes.
ModelLayout fsdp_units_layout(const ModelLayout& model, int wrap_blocks);

// The largest module's own parameters, as DeepSpeed's estimator counts a
// "layer" (a module's parameters, not its children's): the token embedding,
// the head's matrix, or a block's c_fc / c_proj.
double largest_layer_params(const ModelConfig& m);

// DeepSpeed's published estimator (deepspeed.runtime.zero.stage2 and stage3,
// estimate_zero{2,3}_model_states_mem_needs_all_cold), its formulas as its
// documentation gives them: per GPU and per CPU bytes, one row per option.
struct DeepSpeedRow {
  std::string options;  // "offload_optimizer=cpu", ...
  double per_gpu = 0, per_cpu = 0;
};
std::vector<DeepSpeedRow> deepspeed_zero2_estimate(double params, int gpus_per_node, int nodes);
std::vector<DeepSpeedRow> deepspeed_zero3_estimate(double params, double largest_layer, int gpus_per_node, int nodes);

}  // namespace zf
