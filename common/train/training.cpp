// training.cpp: the global loss and the parameter hash.
#include "training.h"

#include "host_collectives.h"
#include "rng.h"

namespace zf {

float global_mean_loss(Communicator& comm, Device& dev, float local_sum, int micro_steps) {
  float v = local_sum;
  all_reduce_host(comm, dev, &v, 1, DType::f32, ReduceOp::sum);
  return v / float(comm.size() * micro_steps);
}

uint64_t hash_params(const float* flat, size_t n) { return fnv1a64(flat, n * sizeof(float)); }

}  // namespace zf
