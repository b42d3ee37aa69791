// precision.h: the two recipes of docs/SPEC.md, seen from one unit's compute.
//
// fp32: parameters and gradients are float32; the kernels use them directly.
// bf16: parameters and gradients are stored and communicated as bf16 (2 bytes
// each), the optimizer keeps a float32 master copy. What the kernels compute
// in is the compute dtype (--compute):
// - f32 (every CPU run by default): before a unit's forward or backward its
//   bf16 parameters are widened into a float32 workspace, and its gradient is
//   computed into a zeroed float32 workspace and then added into the bf16
//   gradient buffer, rounding once.
// - bf16 (the default on a GPU): the kernels read the bf16 parameters as
//   they are and add into the bf16 gradient directly (each op rounds once
//   when it stores), with bf16 activations: no workspace, half the activation
//   memory, tensor cores.
// Everything here runs on the rank's Device.
#pragma once

#include <cstddef>

#include "device.h"
#include "tensor.h"

namespace zf {

enum class Precision { fp32, bf16 };
inline const char* precision_name(Precision p) { return p == Precision::fp32 ? "fp32" : "bf16"; }
// The dtype the recipe stores and communicates parameters and gradients in
// (what the kernels compute in is the Device's compute dtype, --compute).
inline DType storage_dtype(Precision p) { return p == Precision::fp32 ? DType::f32 : DType::bf16; }

class UnitCompute {
 public:
  // compute: f32, or bf16 (only with the bf16 recipe); sets dev's compute
  // dtype. max_unit_numel: the largest unit this rank computes (sizes the
  // workspaces).
  UnitCompute(Precision precision, DType compute, MemoryTracker& mem, Device& dev, size_t max_unit_numel);

  // The unit's parameters in the compute dtype (params: n elements of the
  // recipe's parameter dtype).
  const void* params(const void* params, size_t n);
  // Where the backward should accumulate this unit's gradient (compute dtype).
  void* grads_begin(void* grads, size_t n);
  // Makes what the backward wrote part of `grads` (bf16 recipe, f32 compute:
  // grads += workspace, rounded once).
  void grads_end(void* grads, size_t n);

 private:
  // True when parameters are stored in another dtype than the kernels use.
  bool widens() const { return precision_ == Precision::bf16 && compute_ == DType::f32; }
  Precision precision_;
  DType compute_;
  Device& dev_;
  Tensor param_ws_, grad_ws_;
};

// Fills device memory dst (n elements of dtype) from float32 host values,
// rounding for bf16.
void store_from_f32(Device& dev, void* dst, DType dtype, const float* host_src, size_t n);

}  // namespace zf
