// training.h: small pieces of a training run that every stage uses the same
// way: the initial model, resuming and saving checkpoints, the global loss,
// the final parameter hash, a timer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "comm.h"
#include "config.h"
#include "data.h"
#include "launch.h"
#include "model.h"
#include "precision.h"
#include "report.h"

namespace zf {

// The file the initial model comes from: --resume's checkpoint, else --init's
// model, else none (empty: the seeded model).
const std::string& model_file(const TrainConfig& cfg);

// The whole initial model as float32 in consolidated order: seeded
// (init_unit_range) or read from model_file(cfg). flat holds layout.numel floats.
void initial_model(const TrainConfig& cfg, const ModelLayout& layout, float* flat);

// --resume: the checkpoint (none without the flag) and the step this run
// starts at. Opening it checks the file against the model and the step
// against --steps (UsageError, saying what to do), and rank 0 notes a global
// batch or data file other than the checkpoint's (the batches then differ
// from an uninterrupted run's: SPEC.md's sampler depends on both).
struct Resume {
  std::unique_ptr<CheckpointReader> checkpoint;
  int first_step = 0;
};
Resume open_resume(const TrainConfig& cfg, const ModelLayout& layout, const RankContext& ctx);

// --save: after `steps_done` steps, writes the training checkpoint if it is
// due (every --save-every steps, and after the last step). Every rank calls
// it; full(kind) returns the whole model's float32 values of that kind in
// consolidated order on rank 0 (it may run collectives, as a sharded stage's
// gather does, so every rank calls it; other ranks may return nothing). The
// collectives of saving are not counted as training's communication.
void maybe_save(const TrainConfig& cfg, RankContext& ctx, const ModelLayout& layout, int steps_done,
                const std::function<std::vector<float>(StateKind)>& full);

// Global-batch mean loss: each rank passes the sum of its micro-batch mean
// losses; the sum over ranks (rank order) is divided by N*K.
float global_mean_loss(Communicator& comm, Device& dev, float local_sum, int micro_steps);

// Hash of float32 parameters in consolidated order (FNV-1a over their bytes).
uint64_t hash_params(const float* flat, size_t n);

class Timer {
 public:
  Timer() : t0_(std::chrono::steady_clock::now()) {}
  double ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::chrono::steady_clock::time_point t0_;
};

// Throws the fault injected with --inject-fault when (rank, step) match.
void maybe_inject_fault(const TrainConfig& cfg, int rank, int step);

// What every stage computes with, whatever it shards: this rank's
// micro-batches, the model's unit-by-unit arithmetic and its activations,
// and the precision recipe. A stage only decides where each unit's
// parameters come from and where its gradient goes.
class RankCompute {
 public:
  RankCompute(const TrainConfig& cfg, const ModelLayout& layout, RankContext& ctx, const TokenData& data);

  // Loads this rank's micro-batch `micro` of step `step` (SPEC.md's sampler).
  void load(int step, int micro);
  // Forward of unit u on its parameters (compute dtype); the head sets *loss.
  void forward(int u, const void* params, float* loss);
  // Backward of unit u, accumulating into grads (compute dtype). The
  // objective is the global-batch mean loss: d/d(micro-batch loss) = 1/(N*K).
  void backward(int u, const void* params, void* grads);

 private:
  const TrainConfig& cfg_;
  const ModelLayout& layout_;
  RankContext& ctx_;
  Sampler sampler_;
  UnitCompute unit_;
  Gpt gpt_;
  Tensor inputs_, targets_;                          // on the device
  std::vector<int32_t> host_inputs_, host_targets_;  // where the sampler writes
  int step_ = 0;
};

// Records a finished step (its global-batch mean loss and global gradient
// norm before clipping) in the result, and reports it (rank 0).
void record_step(RankResult& result, StepReporter& reporter, RankContext& ctx, int step, float loss,
                 float grad_norm, double ms);
// Fills in the end-of-run memory and communication counters (call before any
// collective that is not part of training, such as gathering the final model).
void record_counters(RankResult& result, RankContext& ctx);

}  // namespace zf
