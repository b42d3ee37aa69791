// precision.cpp: widening bf16 parameters and folding float32 gradients back.
#include "precision.h"

#include <cstring>

namespace zf {

UnitCompute::UnitCompute(Precision precision, MemoryTracker& mem, size_t max_unit_numel)
    : precision_(precision) {
  if (precision_ == Precision::bf16) {
    param_ws_ = Tensor(mem, Place::device, Category::workspace, DType::f32, max_unit_numel);
    grad_ws_ = Tensor(mem, Place::device, Category::workspace, DType::f32, max_unit_numel);
  }
}

const float* UnitCompute::params(const void* params, size_t n) {
  if (precision_ == Precision::fp32) return static_cast<const float*>(params);
  REQUIRE(n <= param_ws_.numel(), "unit of " << n << " elements exceeds the workspace");
  bf16_to_float(static_cast<const bf16*>(params), param_ws_.as<float>(), n);
  return param_ws_.as<float>();
}

float* UnitCompute::grads_begin(void* grads, size_t n) {
  if (precision_ == Precision::fp32) return static_cast<float*>(grads);
  REQUIRE(n <= grad_ws_.numel(), "unit of " << n << " elements exceeds the workspace");
  std::memset(grad_ws_.data(), 0, n * sizeof(float));
  return grad_ws_.as<float>();
}

void UnitCompute::grads_end(void* grads, size_t n) {
  if (precision_ == Precision::fp32) return;
  auto* g = static_cast<bf16*>(grads);
  const float* w = grad_ws_.as<float>();
  for (size_t i = 0; i < n; ++i) g[i] = float_to_bf16(bf16_to_float(g[i]) + w[i]);
}

void accumulate(void* dst, const void* src, DType dtype, size_t n) {
  if (dtype == DType::f32) {
    float* d = static_cast<float*>(dst);
    const float* s = static_cast<const float*>(src);
    for (size_t i = 0; i < n; ++i) d[i] += s[i];
  } else {
    bf16* d = static_cast<bf16*>(dst);
    const bf16* s = static_cast<const bf16*>(src);
    for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16(bf16_to_float(d[i]) + bf16_to_float(s[i]));
  }
}

void store_from_f32(void* dst, DType dtype, const float* src, size_t n) {
  if (dtype == DType::f32)
    std::memcpy(dst, src, n * sizeof(float));
  else
    float_to_bf16(src, static_cast<bf16*>(dst), n);
}

}  // namespace zf
