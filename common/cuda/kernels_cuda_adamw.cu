// kernels_cuda_adamw.cu: AdamW on a flat range (the CUDA twin of
// adamw.cpp) and the bf16 <-> float32 casts (the twins of dtype.cpp's), one
// thread per element. API: kernels_cuda.h; shared helpers: kernels_cuda_util.cuh.
//
//   build/tests/test_gpu_kernels --gtest_filter='*AdamW*:*Bf16Casts*'
#include "kernels_cuda.h"

#include <cmath>
#include <cstdint>

#include "kernels_cuda_util.cuh"

namespace zf {

using namespace cuda_impl;

// ---------------------------------------------------------------------------
// AdamW (formula in adamw.h). Reference: adamw_update (adamw.cpp).

namespace {

// float32 -> bf16 bits exactly as dtype.h's float_to_bf16: round to nearest
// even; a NaN keeps its top bits and is made quiet (so it cannot round to inf).
__device__ __forceinline__ __nv_bfloat16 bf16_round(float f) {
  const uint32_t x = __float_as_uint(f);
  __nv_bfloat16_raw r;
  if ((x & 0x7fffffffu) > 0x7f800000u)
    r.x = uint16_t((x >> 16) | 0x40u);
  else
    r.x = uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  return __nv_bfloat16(r);
}

// One thread per element; the step's scalars come from the host, computed
// there in double as adamw.cpp does.
template <class G>
__global__ void adamw_kernel(float* param, const G* grad, float* m, float* v, size_t n, float b1,
                             float b2, float eps, float decay_factor, float bias2_sqrt,
                             float step_size, float grad_scale, __nv_bfloat16* param_bf16) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float g = load(grad, i) * grad_scale;
  const float p = param[i] * decay_factor;
  const float mi = m[i] + (1.0f - b1) * (g - m[i]);
  const float vi = v[i] * b2 + (1.0f - b2) * g * g;
  const float denom = sqrtf(vi) / bias2_sqrt + eps;
  const float p_new = p - step_size * (mi / denom);
  param[i] = p_new;
  m[i] = mi;
  v[i] = vi;
  if (param_bf16) param_bf16[i] = bf16_round(p_new);
}

}  // namespace

template <class G>
void adamw_update_cuda(float* param, const G* grad, float* m, float* v, size_t n,
                       const AdamWConfig& cfg, long step, float grad_scale, bool decay,
                       cudaStream_t stream, __nv_bfloat16* param_bf16) {
  if (n == 0) return;
  const float decay_factor = decay ? 1.0f - cfg.lr * cfg.weight_decay : 1.0f;
  const double bias1 = 1.0 - std::pow(double(cfg.beta1), double(step));
  const float bias2_sqrt = float(std::sqrt(1.0 - std::pow(double(cfg.beta2), double(step))));
  const float step_size = float(double(cfg.lr) / bias1);
  cuda_impl::launch(adamw_kernel<G>, blocks_for(n, kBlock), kBlock, 0, stream, param, grad, m, v, n,
                    cfg.beta1, cfg.beta2, cfg.eps, decay_factor, bias2_sqrt, step_size, grad_scale,
                    param_bf16);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// bf16 <-> float32. Reference: bf16_to_float, float_to_bf16 (dtype.cpp).

namespace {

// One thread per element.
__global__ void bf16_to_float_kernel(const __nv_bfloat16* in, float* out, size_t n) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __bfloat162float(in[i]);  // exact: the bits shifted up
}

__global__ void float_to_bf16_kernel(const float* in, __nv_bfloat16* out, size_t n) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = bf16_round(in[i]);
}

}  // namespace

void bf16_to_float_cuda(const __nv_bfloat16* in, float* out, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  cuda_impl::launch(bf16_to_float_kernel, blocks_for(n, kBlock), kBlock, 0, stream, in, out, n);
  CUDA_CHECK_LAUNCH();
}

void float_to_bf16_cuda(const float* in, __nv_bfloat16* out, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  cuda_impl::launch(float_to_bf16_kernel, blocks_for(n, kBlock), kBlock, 0, stream, in, out, n);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// The instantiations the header promises: G = float and __nv_bfloat16.

#define ZF_INSTANTIATE(F)                                                                  \
  template void adamw_update_cuda<F>(float*, const F*, float*, float*, size_t,            \
                                     const AdamWConfig&, long, float, bool, cudaStream_t, \
                                     __nv_bfloat16*);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)
#undef ZF_INSTANTIATE

}  // namespace zf
