// kernels_cuda_layernorm.cu: the CUDA twin of kernels_cpu.cpp's LayerNorm,
// forward and backward: one warp per row for the rows, 32 x 32 blocks for the
// column sums of dweight and dbias. API and precision rules: kernels_cuda.h;
// shared helpers: kernels_cuda_util.cuh.
//
//   build/tests/test_gpu_kernels --gtest_filter='*LayerNorm*'
#include "kernels_cuda.h"

#include <cmath>
#include <cstdint>

#include "kernels_cuda_util.cuh"

namespace zf {

using namespace cuda_impl;

// ---------------------------------------------------------------------------
// LayerNorm: out = (x - mean) * rstd * weight + bias, row by row.
// Reference: layernorm_forward, layernorm_backward.

namespace {

// One warp per row, kRowsPerBlock rows a block (kernels_cuda_util.cuh).
template <class F>
__global__ void layernorm_forward_kernel(F* out, float* mean, float* rstd, const F* inp,
                                         const F* weight, const F* bias, int N, int C) {
  const int lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (n >= N) return;  // the whole warp leaves together: n is the warp's row
  const F* x = inp + size_t(n) * C;
  F* o = out + size_t(n) * C;
  // Two passes (mean, then squared deviations), as on the CPU: no
  // cancellation as with E[x^2] - mean^2.
  float s = 0.0f;
  for (int c = lane; c < C; c += kWarp) s += load(x, c);
  const float m = warp_sum(s) / float(C);
  float v = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float d = load(x, c) - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / float(C) + 1e-5f);
  for (int c = lane; c < C; c += kWarp)
    store(o, c, (load(x, c) - m) * r * load(weight, c) + load(bias, c));
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

// dinp, one warp per row. With xhat = (x - mean) * rstd and g = dout * weight:
//   dx += rstd * (g - mean(g) - xhat * mean(g * xhat)).
template <class F>
__global__ void layernorm_backward_input_kernel(F* dinp, const F* dout, const F* inp,
                                                const F* weight, const float* mean,
                                                const float* rstd, int N, int C) {
  const int lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (n >= N) return;
  const F* x = inp + size_t(n) * C;
  const F* d = dout + size_t(n) * C;
  F* dx = dinp + size_t(n) * C;
  const float m = mean[n], r = rstd[n];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float g = load(d, c) * load(weight, c);
    g_sum += g;
    gx_sum += g * ((load(x, c) - m) * r);
  }
  const float g_mean = warp_sum(g_sum) / float(C);
  const float gx_mean = warp_sum(gx_sum) / float(C);
  for (int c = lane; c < C; c += kWarp) {
    const float xhat = (load(x, c) - m) * r;
    const float g = load(d, c) * load(weight, c);
    store(dx, c, load(dx, c) + r * (g - g_mean - xhat * gx_mean));
  }
}

// Sums over the N rows, for each column c (dweight, dbias). A block of
// 32 x 32 threads owns 32 columns: thread (x, y) sums column 32*blockIdx.x + x
// over rows y, y + 32, y + 64, ... (each row read 32 columns at a time, so
// coalesced), then the 32 partial sums of each column are added in shared
// memory by a fixed tree (y with y + 16, then y + 8, ...). kColTile = 32.

// __launch_bounds__: a block of 1024 threads only launches if each thread
// needs at most 64 registers (65536 per block); this holds the compiler to it.
template <class F>
__global__ void __launch_bounds__(kColTile * kColTile)
    layernorm_backward_params_kernel(F* dweight, F* dbias, const F* dout, const F* inp,
                                     const float* mean, const float* rstd, int N, int C) {
  __shared__ float sw[kColTile][kColTile], sb[kColTile][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kColTile + tx;
  float dw = 0.0f, db = 0.0f;
  if (c < C)
    for (int n = ty; n < N; n += kColTile) {
      const size_t i = size_t(n) * C + c;
      const float d = load(dout, i);
      dw += d * ((load(inp, i) - mean[n]) * rstd[n]);
      db += d;
    }
  sw[ty][tx] = dw;
  sb[ty][tx] = db;
  __syncthreads();
  for (int s = kColTile / 2; s > 0; s /= 2) {
    if (ty < s) {
      sw[ty][tx] += sw[ty + s][tx];
      sb[ty][tx] += sb[ty + s][tx];
    }
    __syncthreads();
  }
  if (ty == 0 && c < C) {
    store(dweight, c, load(dweight, c) + sw[0][tx]);
    store(dbias, c, load(dbias, c) + sb[0][tx]);
  }
}

}  // namespace

template <class F>
void layernorm_forward_cuda(F* out, float* mean, float* rstd, const F* inp, const F* weight,
                            const F* bias, int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  layernorm_forward_kernel<<<blocks_for(N, kRowsPerBlock), kBlock, 0, stream>>>(
      out, mean, rstd, inp, weight, bias, N, C);
  CUDA_CHECK_LAUNCH();
}

template <class F>
void layernorm_backward_cuda(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp,
                             const F* weight, const float* mean, const float* rstd, int N, int C,
                             cudaStream_t stream) {
  // C == 0: nothing to add to, and blocks_for(C, ...) below would be a grid
  // of 0 blocks, which CUDA rejects (cudaErrorInvalidConfiguration).
  if (N == 0 || C == 0) return;
  layernorm_backward_input_kernel<<<blocks_for(N, kRowsPerBlock), kBlock, 0, stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  layernorm_backward_params_kernel<<<blocks_for(C, kColTile), dim3(kColTile, kColTile), 0,
                                     stream>>>(dweight, dbias, dout, inp, mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// The instantiations the header promises: F = float and __nv_bfloat16.

#define ZF_INSTANTIATE(F)                                                                         \
  template void layernorm_forward_cuda<F>(F*, float*, float*, const F*, const F*, const F*, int, \
                                          int, cudaStream_t);                                    \
  template void layernorm_backward_cuda<F>(F*, F*, F*, const F*, const F*, const F*,             \
                                           const float*, const float*, int, int, cudaStream_t);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)

}  // namespace zf
