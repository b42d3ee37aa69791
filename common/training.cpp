// training.cpp: initial model, global loss, parameter hash, fault injection.
#include "training.h"

#include "checkpoint.h"
#include "rng.h"

namespace zf {

void initial_model(const TrainConfig& cfg, const ModelLayout& layout, float* flat) {
  if (!cfg.init.empty()) {
    load_model(cfg.init, layout, flat);
    return;
  }
  for (const auto& u : layout.units) init_unit_range(u, cfg.model, cfg.seed, 0, u.numel, flat + u.offset);
}

float global_mean_loss(Communicator& comm, float local_sum, int micro_steps) {
  float v = local_sum;
  comm.all_reduce(&v, 1, DType::f32, ReduceOp::sum);
  return v / float(comm.size() * micro_steps);
}

uint64_t hash_params(const float* flat, size_t n) { return fnv1a64(flat, n * sizeof(float)); }

void maybe_inject_fault(const TrainConfig& cfg, int rank, int step) {
  if (rank == cfg.fault_rank && step == cfg.fault_step)
    throw Error("injected fault (--inject-fault " + std::to_string(rank) + ":" + std::to_string(step) +
                ") in the middle of step " + std::to_string(step));
}

}  // namespace zf
