// initial_state.h: where a run's first values come from, for every stage
// alike. In order of precedence:
//
//   --resume PATH   a training checkpoint, a file or a sharded folder: the
//                   model, AdamW's moments, and the step to go on from
//                   (io/checkpoint.h, io/sharded_checkpoint.h)
//   --init PATH     a model file, or either kind of checkpoint: the
//                   parameters only
//   neither         docs/SPEC.md's seeded initialisation, drawn from each
//                   parameter's name and element index (core/rng.h), so any
//                   range of any unit is drawn alone and equals the same
//                   range of the whole model
//
// A stage asks only for the ranges it keeps (a sharded stage its pieces) and
// stores them in its own dtype on its device (load). Opening --resume checks
// the file against the model and its step against --steps (UsageError,
// saying what to do); rank 0 notes a global batch or data file other than
// the checkpoint's, since docs/SPEC.md's batches depend on both.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "device.h"
#include "model.h"
#include "rank.h"

namespace zf {

class CheckpointSource;  // io/checkpoint.h

class InitialState {
 public:
  InitialState(const TrainConfig& cfg, const ModelLayout& layout, const RankContext& ctx);
  ~InitialState();

  // The first step this run trains: 0, or the checkpoint's step on --resume.
  int first_step() const { return first_step_; }
  // AdamW's moments come from the checkpoint (else they start at zero).
  bool has_moments() const { return !cfg_.resume.empty(); }

  // Elements [begin, end) of unit u's flat float32 values of `kind` (its
  // parameters, in the unit's order; or a moment, --resume only) into host
  // memory.
  void read(int u, StateKind kind, size_t begin, size_t end, float* host) const;
  // The same range stored on the device at dst as `dtype` (rounded for bf16).
  void load(int u, StateKind kind, size_t begin, size_t end, Device& dev, void* dst, DType dtype) const;

 private:
  const TrainConfig& cfg_;
  const ModelLayout& layout_;
  // --resume, or --init from a sharded checkpoint (its parameters alone):
  // read a range at a time.
  std::unique_ptr<CheckpointSource> checkpoint_;
  std::vector<float> file_model_;  // --init from a file: the whole file, read once
  int first_step_ = 0;
};

}  // namespace zf
