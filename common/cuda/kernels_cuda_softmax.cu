// kernels_cuda_softmax.cu: the CUDA twin of kernels_cpu.cpp's fused softmax +
// cross-entropy (the head's last step, llm.c's "fused classifier"), forward
// and backward, one block per row of V logits in both. No [N, V]
// probabilities tensor: the forward keeps lse (one float per row), the
// backward recomputes each probability from its logit and writes the
// gradient, in place over the logits when the caller asks.
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
// (coalesced: a warp reads 32 consecutive elements at a time). The row index
// times V is 64-bit (size_t): gpt2's [B*T, V] passes 2^31 elements.
constexpr int kSoftmaxThreads = 512;

// Forward: one pass over the row ("online" softmax, Milakov & Gimelshein
// 2018). Each thread keeps the max m of the logits it has seen and the sum s
// of exp(x - m); a larger logit rescales s to the new max (one more exp,
// rarely taken after a thread's first few columns). The block then takes the
// max M of the threads' m and sums their s * exp(m - M). All in float32.
template <class F>
__global__ void softmax_cross_entropy_forward_kernel(float* lse, float* losses, const F* logits,
                                                     const int32_t* targets, int V) {
  ZF_STATIC_SHARED(float[kWarp], shared);
  const int n = blockIdx.x;
  const F* x = logits + size_t(n) * V;
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = load(x, j);
    if (v > m) {
      s = s * expf(m - v) + 1.0f;  // first column: 0 * expf(-inf) + 1 = 1
      m = v;
    } else {
      s += expf(v - m);  // a NaN logit lands here and makes s NaN: it shows in the loss
    }
  }
  const float M = block_max(m, shared);
  // A thread with no column (V < blockDim.x) has m = -inf, s = 0: adds 0 * 0.
  const float sum = block_sum(s * expf(m - M), shared);
  if (threadIdx.x == 0) {
    const float log_sum = logf(sum);
    lse[n] = M + log_sum;
    // -log p[t] = log(sum) - (x[t] - max): exact where x[t] and max are
    // close, where lse - x[t] would carry lse's rounding (u |lse|).
    losses[n] = log_sum - (load(x, targets[n]) - M);
  }
}

// Backward: dlogits[n, j] = (exp(x[n, j] - lse[n]) - [j == t]) * dloss,
// WRITTEN. One block per row, as the forward: the row's lse and target are
// read once per thread, and no element needs a 64-bit division to find its
// row. In place (dlogits == logits) is safe: each element is read, then
// written, by the same thread, and no other thread touches it. So neither
// pointer is __restrict__, and logits is not read through the read-only
// (non-coherent) cache path.
template <class F>
__global__ void softmax_cross_entropy_backward_kernel(F* dlogits, const F* logits,
                                                      const float* lse, const int32_t* targets,
                                                      float dloss, int V) {
  const int n = blockIdx.x;
  const size_t row = size_t(n) * V;
  const float l = lse[n];
  const int t = targets[n];
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = expf(load(logits, row + j) - l);
    store(dlogits, row + j, (j == t ? p - 1.0f : p) * dloss);
  }
}

}  // namespace

template <class F>
void softmax_cross_entropy_forward_cuda(float* lse, float* losses, const F* logits,
                                        const int32_t* targets, int N, int V,
                                        cudaStream_t stream) {
  if (N == 0 || V == 0) return;  // V == 0: no row has a target; nothing to do
  cuda_impl::launch(softmax_cross_entropy_forward_kernel<F>, N, kSoftmaxThreads, 0, stream, lse, losses,
                    logits, targets, V);
  CUDA_CHECK_LAUNCH();
}

template <class F>
void softmax_cross_entropy_backward_cuda(F* dlogits, const F* logits, const float* lse,
                                         const int32_t* targets, float dloss, int N, int V,
                                         cudaStream_t stream) {
  if (N == 0 || V == 0) return;
  cuda_impl::launch(softmax_cross_entropy_backward_kernel<F>, N, kSoftmaxThreads, 0, stream, dlogits, logits,
                    lse, targets, dloss, V);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// The instantiations the header promises: F = float and __nv_bfloat16.

#define ZF_INSTANTIATE(F)                                                                      \
  template void softmax_cross_entropy_forward_cuda<F>(float*, float*, const F*, const int32_t*, \
                                                      int, int, cudaStream_t);                 \
  template void softmax_cross_entropy_backward_cuda<F>(F*, const F*, const float*,             \
                                                       const int32_t*, float, int, int,        \
                                                       cudaStream_t);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)
#undef ZF_INSTANTIATE

}  // namespace zf
