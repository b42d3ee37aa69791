// precision.h: the two recipes of SPEC.md, seen from one unit's compute.
//
// fp32: parameters and gradients are float32; the kernels use them directly.
// bf16: parameters and gradients are stored and communicated as bf16 (2 bytes
// each), the optimizer keeps a float32 master copy. The CPU kernels compute
// in float32, so before a unit's forward or backward its bf16 parameters are
// widened into a float32 workspace, and its gradient is computed into a
// zeroed float32 workspace and then added into the bf16 gradient buffer,
// rounding once. (On a GPU the kernels read bf16 directly.)
#pragma once

#include <cstddef>

#include "config.h"
#include "tensor.h"

namespace zf {

class UnitCompute {
 public:
  // max_unit_numel: the largest unit this rank computes (sizes the workspaces).
  UnitCompute(Precision precision, MemoryTracker& mem, size_t max_unit_numel);

  // The unit's parameters as float32 (params has n elements of the compute dtype).
  const float* params(const void* params, size_t n);
  // Where the backward should accumulate this unit's float32 gradient.
  float* grads_begin(void* grads, size_t n);
  // Makes what the backward wrote part of `grads` (bf16: grads += workspace).
  void grads_end(void* grads, size_t n);

 private:
  Precision precision_;
  Tensor param_ws_, grad_ws_;
};

// dst += src, n elements of dtype (bf16: summed in float32, rounded once).
void accumulate(void* dst, const void* src, DType dtype, size_t n);

// Fills dst (n elements of dtype) from float32 src, rounding for bf16.
void store_from_f32(void* dst, DType dtype, const float* src, size_t n);

}  // namespace zf
