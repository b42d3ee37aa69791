// precision.cpp: widening bf16 parameters and folding float32 gradients back.
#include "precision.h"

#include <vector>

namespace zf {

UnitCompute::UnitCompute(Precision precision, DType compute, MemoryTracker& mem, Device& dev,
                         size_t max_unit_numel)
    : precision_(precision), compute_(compute), dev_(dev) {
  REQUIRE(compute == DType::f32 || precision == Precision::bf16,
          "bf16 compute needs the bf16 recipe (--precision bf16): the fp32 recipe is float32 throughout");
  dev.set_compute_dtype(compute);
  if (widens()) {
    param_ws_ = Tensor(mem, Place::device, Category::workspace, DType::f32, max_unit_numel);
    grad_ws_ = Tensor(mem, Place::device, Category::workspace, DType::f32, max_unit_numel);
  }
}

const void* UnitCompute::params(const void* params, size_t n) {
  if (!widens()) return params;
  REQUIRE(n <= param_ws_.numel(), "unit of " << n << " elements exceeds the workspace");
  dev_.widen(static_cast<const bf16*>(params), param_ws_.as<float>(), n);
  return param_ws_.data();
}

void* UnitCompute::grads_begin(void* grads, size_t n) {
  if (!widens()) return grads;
  REQUIRE(n <= grad_ws_.numel(), "unit of " << n << " elements exceeds the workspace");
  dev_.zero(grad_ws_.data(), n * sizeof(float));
  return grad_ws_.data();
}

void UnitCompute::grads_end(void* grads, size_t n) {
  if (!widens()) return;
  dev_.fold(static_cast<bf16*>(grads), grad_ws_.as<float>(), n);
}

void store_from_f32(Device& dev, void* dst, DType dtype, const float* host_src, size_t n) {
  if (dtype == DType::f32) {
    dev.to_device(dst, host_src, n * sizeof(float));
    return;
  }
  std::vector<bf16> rounded(n);
  float_to_bf16(host_src, rounded.data(), n);
  dev.to_device(dst, rounded.data(), n * sizeof(bf16));
}

}  // namespace zf
