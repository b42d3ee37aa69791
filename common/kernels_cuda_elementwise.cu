// kernels_cuda_elementwise.cu: the CUDA twins of kernels_cpu.cpp's GELU and
// residual add: one thread per element. API and precision rules:
// kernels_cuda.h; shared helpers: kernels_cuda_util.cuh.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Gelu*:*Residual*'
#include "kernels_cuda.h"

#include <cmath>
#include <cstdint>

#include "kernels_cuda_util.cuh"

namespace zf {

using namespace cuda_impl;

// ---------------------------------------------------------------------------
// GELU, tanh approximation, as x * sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715 x^3)
// (0.5 (1 + tanh u) = sigmoid(2u): one exp, and no cancellation in 1 + tanh u
// for negative x). Reference: gelu_forward, gelu_backward.

namespace {

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

// One thread per element.
template <class F>
__global__ void gelu_forward_kernel(F* out, const F* inp, size_t n) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = load(inp, i);
  const float u2 = 2.0f * kGeluS * (x + kGeluA * x * x * x);
  store(out, i, x / (1.0f + expf(-u2)));
}

// d/dx [x s] = s + 2 x s (1 - s) u', s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3a x^2).
template <class F>
__global__ void gelu_backward_kernel(F* dinp, const F* inp, const F* dout, size_t n) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = load(inp, i);
  const float u2 = 2.0f * kGeluS * (x + kGeluA * x * x * x);
  const float s = 1.0f / (1.0f + expf(-u2));
  const float du = kGeluS * (1.0f + 3.0f * kGeluA * x * x);
  store(dinp, i, load(dinp, i) + load(dout, i) * (s + 2.0f * x * s * (1.0f - s) * du));
}

// out = a + b, one thread per element (each reads its a and b before writing,
// so out may alias either).
template <class F>
__global__ void residual_forward_kernel(F* out, const F* a, const F* b, size_t n) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) store(out, i, load(a, i) + load(b, i));
}

}  // namespace

template <class F>
void gelu_forward_cuda(F* out, const F* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(out, inp, n);
  CUDA_CHECK_LAUNCH();
}

template <class F>
void gelu_backward_cuda(F* dinp, const F* inp, const F* dout, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_backward_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, n);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// Residual add. Reference: residual_forward.

template <class F>
void residual_forward_cuda(F* out, const F* a, const F* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  residual_forward_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(out, a, b, n);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// The instantiations the header promises: F = float and __nv_bfloat16.

#define ZF_INSTANTIATE(F)                                                             \
  template void gelu_forward_cuda<F>(F*, const F*, size_t, cudaStream_t);            \
  template void gelu_backward_cuda<F>(F*, const F*, const F*, size_t, cudaStream_t); \
  template void residual_forward_cuda<F>(F*, const F*, const F*, size_t, cudaStream_t);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)

}  // namespace zf
