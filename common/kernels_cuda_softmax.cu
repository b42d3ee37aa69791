// kernels_cuda_softmax.cu: the CUDA twin of kernels_cpu.cpp's softmax +
// cross-entropy (the head's last step), forward and backward: one block per
// row of V logits for the forward, one thread per element for the backward.
// API and precision rules: kernels_cuda.h; shared helpers: kernels_cuda_util.cuh.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Softmax*'
#include "kernels_cuda.h"

#include <cmath>
#include <cstdint>

#include "kernels_cuda_util.cuh"

namespace zf {

using namespace cuda_impl;

// ---------------------------------------------------------------------------
// Softmax and cross-entropy, fused (the head's last step).
// Reference: softmax_cross_entropy_forward, softmax_cross_entropy_backward.

namespace {

// One block of kSoftmaxThreads threads per row n (a row is V long: 50304 for
// gpt2, so a warp alone would be slow): thread j reads columns j, j + 512, ...
// (coalesced). Three passes over the row: max, sum of exps, write.
constexpr int kSoftmaxThreads = 512;

template <class F>
__global__ void softmax_cross_entropy_forward_kernel(F* probs, float* losses, const F* logits,
                                                     const int32_t* targets, int V) {
  __shared__ float shared[kWarp];
  const int n = blockIdx.x;
  const F* x = logits + size_t(n) * V;
  F* p = probs + size_t(n) * V;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, load(x, j));
  mx = block_max(mx, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(load(x, j) - mx);
  sum = block_sum(sum, shared);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < V; j += blockDim.x) store(p, j, expf(load(x, j) - mx) * inv);
  // -log p[t] = log(sum) - (x[t] - max): finite even when p[t] underflows to 0.
  if (threadIdx.x == 0) losses[n] = logf(sum) - (load(x, targets[n]) - mx);
}

// One thread per element of [N, V]: dlogits += (probs - [j == target]) * dloss.
template <class F>
__global__ void softmax_cross_entropy_backward_kernel(F* dlogits, const F* probs,
                                                      const int32_t* targets, float dloss, int N,
                                                      int V) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(N) * V) return;
  const int n = int(i / V), j = int(i % V);
  const float p = load(probs, i);
  const float g = (j == targets[n] ? p - 1.0f : p) * dloss;
  store(dlogits, i, load(dlogits, i) + g);
}

}  // namespace

template <class F>
void softmax_cross_entropy_forward_cuda(F* probs, float* losses, const F* logits,
                                        const int32_t* targets, int N, int V,
                                        cudaStream_t stream) {
  if (N == 0) return;
  softmax_cross_entropy_forward_kernel<<<N, kSoftmaxThreads, 0, stream>>>(probs, losses, logits,
                                                                          targets, V);
  CUDA_CHECK_LAUNCH();
}

template <class F>
void softmax_cross_entropy_backward_cuda(F* dlogits, const F* probs, const int32_t* targets,
                                         float dloss, int N, int V, cudaStream_t stream) {
  const size_t n = size_t(N) * V;
  if (n == 0) return;
  softmax_cross_entropy_backward_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(
      dlogits, probs, targets, dloss, N, V);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// The instantiations the header promises: F = float and __nv_bfloat16.

#define ZF_INSTANTIATE(F)                                                                         \
  template void softmax_cross_entropy_forward_cuda<F>(F*, float*, const F*, const int32_t*, int, \
                                                      int, cudaStream_t);                        \
  template void softmax_cross_entropy_backward_cuda<F>(F*, const F*, const int32_t*, float, int, \
                                                       int, cudaStream_t);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)

}  // namespace zf
