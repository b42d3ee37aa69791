// precision.h: the two recipes of SPEC.md, seen from one unit's compute.
//
// fp32: parameters and gradients are float32; the kernels use them directly.
// bf16: parameters and gradients are stored and communicated as bf16 (2 bytes
// each), the optimizer keeps a float32 master copy. The kernels compute in
// float32, so before a unit's forward or backward its bf16 parameters are
// widened into a float32 workspace, and its gradient is computed into a
// zeroed float32 workspace and then added into the bf16 gradient buffer,
// rounding once. Everything here runs on the rank's Device.
#pragma once

#include <cstddef>

#include "config.h"
#include "device.h"
#include "tensor.h"

namespace zf {

class UnitCompute {
 public:
  // max_unit_numel: the largest unit this rank computes (sizes the workspaces).
  UnitCompute(Precision precision, MemoryTracker& mem, Device& dev, size_t max_unit_numel);

  // The unit's parameters as float32 (params has n elements of the compute dtype).
  const float* params(const void* params, size_t n);
  // Where the backward should accumulate this unit's float32 gradient.
  float* grads_begin(void* grads, size_t n);
  // Makes what the backward wrote part of `grads` (bf16: grads += workspace).
  void grads_end(void* grads, size_t n);

 private:
  Precision precision_;
  Device& dev_;
  Tensor param_ws_, grad_ws_;
};

// Fills device memory dst (n elements of dtype) from float32 host values,
// rounding for bf16.
void store_from_f32(Device& dev, void* dst, DType dtype, const float* host_src, size_t n);

}  // namespace zf
