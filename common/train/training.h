// training.h: the small pieces of a step that every stage computes the same
// way: the global-batch loss, the parameter hash, a timer.
#pragma once

#include <chrono>
#include <cstdint>

#include "comm.h"
#include "device.h"

namespace zf {

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

}  // namespace zf
