// kernels_cuda_elementwise.cu: the CUDA twins of kernels_cpu.cpp's
// encoder (token + position embedding), GELU and residual add: one thread per
// element, except the embedding gradient, a scatter without atomics. API and
// precision rules: kernels_cuda.h; shared helpers: kernels_cuda_util.cuh.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Encoder*:*Gelu*:*Residual*'
#include "kernels_cuda.h"

#include <cmath>
#include <cstdint>

#include "kernels_cuda_util.cuh"

namespace zf {

using namespace cuda_impl;

// ---------------------------------------------------------------------------
// Encoder: token embedding + position embedding.
// Reference: encoder_forward, encoder_backward (kernels_cpu.cpp).

namespace {

// One thread per output element of the flattened [N, C] array (n = b*T + t),
// so neighbouring threads read and write neighbouring channels.
template <class F>
__global__ void encoder_forward_kernel(F* out, const int32_t* tokens, const F* wte, const F* wpe,
                                       int N, int T, int C) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(N) * C) return;
  const int n = int(i / C), c = int(i % C), t = n % T;
  store(out, i, load(wte, size_t(tokens[n]) * C + c) + load(wpe, size_t(t) * C + c));
}

// dwpe[t,c] += sum over b of dout[b,t,c]: one thread per (t, c), adding the
// B rows in order b = 0, 1, ... (the CPU's order, so float32 agrees exactly).
template <class F>
__global__ void encoder_backward_wpe_kernel(F* dwpe, const F* dout, int B, int T, int C) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(T) * C) return;
  float acc = load(dwpe, i);
  for (int b = 0; b < B; ++b) acc += load(dout, size_t(b) * T * C + i);
  store(dwpe, i, acc);
}

// dwte[v,c] += dout[n,c] for every position n holding token v. Several
// positions may hold the same token, so a thread per position would race.
// Instead the vocabulary is dealt into kEncoderSlices slices (v mod slices):
// block (x, s) owns channels [256x, 256x + 256) of the tokens of slice s and
// walks all N positions in order, adding those whose token is in its slice.
// Every dwte element has exactly one owner thread (no races, no atomics) and
// is updated in position order, as on the CPU. The test `tok % slices == s`
// is the same for the whole block, so threads never diverge.
constexpr int kEncoderSlices = 64;

template <class F>
__global__ void encoder_backward_wte_kernel(F* dwte, const F* dout, const int32_t* tokens, int N,
                                            int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int slice = blockIdx.y;
  if (c >= C) return;
  for (int n = 0; n < N; ++n) {
    const int tok = tokens[n];
    if (tok % kEncoderSlices != slice) continue;
    const size_t i = size_t(tok) * C + c;
    store(dwte, i, load(dwte, i) + load(dout, size_t(n) * C + c));
  }
}

}  // namespace

template <class F>
void encoder_forward_cuda(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T,
                          int C, cudaStream_t stream) {
  const size_t n = size_t(B) * T * C;
  if (n == 0) return;
  encoder_forward_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(out, tokens, wte, wpe,
                                                                      B * T, T, C);
  CUDA_CHECK_LAUNCH();
}

template <class F>
void encoder_backward_cuda(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T,
                           int C, cudaStream_t stream) {
  if (size_t(B) * T * C == 0) return;
  encoder_backward_wpe_kernel<<<blocks_for(size_t(T) * C, kBlock), kBlock, 0, stream>>>(
      dwpe, dout, B, T, C);
  CUDA_CHECK_LAUNCH();
  const dim3 grid(blocks_for(C, kBlock), kEncoderSlices);
  encoder_backward_wte_kernel<<<grid, kBlock, 0, stream>>>(dwte, dout, tokens, B * T, C);
  CUDA_CHECK_LAUNCH();
}

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

#define ZF_INSTANTIATE(F)                                                                       \
  template void encoder_forward_cuda<F>(F*, const int32_t*, const F*, const F*, int, int, int, \
                                        cudaStream_t);                                         \
  template void encoder_backward_cuda<F>(F*, F*, const F*, const int32_t*, int, int, int,      \
                                         cudaStream_t);                                        \
  template void gelu_forward_cuda<F>(F*, const F*, size_t, cudaStream_t);                      \
  template void gelu_backward_cuda<F>(F*, const F*, const F*, size_t, cudaStream_t);           \
  template void residual_forward_cuda<F>(F*, const F*, const F*, size_t, cudaStream_t);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)

}  // namespace zf
