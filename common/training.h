// training.h: small pieces of a training run that every stage uses the same
// way: the initial model, the global loss, the final parameter hash, a timer.
#pragma once

#include <chrono>
#include <cstdint>

#include "comm.h"
#include "config.h"
#include "model.h"

namespace zf {

// The whole initial model as float32 in consolidated order: seeded
// (init_unit_range) or read from cfg.init. flat holds layout.numel floats.
void initial_model(const TrainConfig& cfg, const ModelLayout& layout, float* flat);

// Global-batch mean loss: each rank passes the sum of its micro-batch mean
// losses; the sum over ranks (rank order) is divided by N*K.
float global_mean_loss(Communicator& comm, float local_sum, int micro_steps);

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

}  // namespace zf
