// kernels_cuda_layernorm.cu: the CUDA twin of kernels_cpu.cpp's LayerNorm,
// forward and backward: one warp per row for the rows, the two-pass column
// sums of kernels_cuda_util.cuh for dweight and dbias. API and precision
// rules: kernels_cuda.h; shared helpers: kernels_cuda_util.cuh.
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

// dweight[c] += sum over n of dout[n,c] xhat[n,c], dbias[c] += sum of dout[n,c]:
// pass 1 of the two-pass column sums of kernels_cuda_util.cuh. Block (x, s)
// sums columns [32x, 32x + 32) over the rows of slice s and writes
// partial[s][c] (dweight's) and partial[S + s][c] (dbias's).
template <class F>
__global__ void __launch_bounds__(kColTile * kColRows)
    layernorm_backward_params_kernel(float* __restrict__ partial, const F* __restrict__ dout,
                                     const F* __restrict__ inp, const float* __restrict__ mean,
                                     const float* __restrict__ rstd, int N, int C,
                                     int slice_rows) {
  ZF_STATIC_SHARED(float[kColRows][kColTile], shared);
  const int c = blockIdx.x * kColTile + threadIdx.x;
  const int row0 = blockIdx.y * slice_rows, row_end = min(N, row0 + slice_rows);
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    // Unrolled so that the loads of several rows are in flight together.
#pragma unroll 4
    for (int n = row0 + threadIdx.y; n < row_end; n += kColRows) {
      const size_t i = size_t(n) * C + c;
      const float d = load(dout, i);
      dw += d * ((load(inp, i) - mean[n]) * rstd[n]);
      db += d;
    }
  }
  dw = column_tree_sum(dw, shared);
  db = column_tree_sum(db, shared);
  if (threadIdx.y == 0 && c < C) {
    partial[size_t(blockIdx.y) * C + c] = dw;
    partial[size_t(gridDim.y + blockIdx.y) * C + c] = db;
  }
}

}  // namespace

template <class F>
void layernorm_forward_cuda(F* out, float* mean, float* rstd, const F* inp, const F* weight,
                            const F* bias, int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  cuda_impl::launch(layernorm_forward_kernel<F>, blocks_for(N, kRowsPerBlock), kBlock, 0, stream, out, mean,
                    rstd, inp, weight, bias, N, C);
  CUDA_CHECK_LAUNCH();
}

template <class F>
void layernorm_backward_cuda(CudaContext& ctx, F* dinp, F* dweight, F* dbias, const F* dout,
                             const F* inp, const F* weight, const float* mean, const float* rstd,
                             int N, int C) {
  // C == 0: nothing to add to, and blocks_for(C, ...) below would be a grid
  // of 0 blocks, which CUDA rejects (cudaErrorInvalidConfiguration).
  if (N == 0 || C == 0) return;
  cudaStream_t stream = ctx.stream();
  cuda_impl::launch(layernorm_backward_input_kernel<F>, blocks_for(N, kRowsPerBlock), kBlock, 0, stream, dinp,
                    dout, inp, weight, mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  const ColumnSlices sl = column_slices(N);
  float* partial = static_cast<float*>(ctx.scratch(column_scratch_bytes(2, N, C)));
  const dim3 grid(blocks_for(C, kColTile), sl.count);
  cuda_impl::launch(layernorm_backward_params_kernel<F>, grid, dim3(kColTile, kColRows), 0, stream, partial,
                    dout, inp, mean, rstd, N, C, sl.rows);
  CUDA_CHECK_LAUNCH();
  column_sums_finish(dweight, dbias, partial, sl.count, C, stream);
}

// ---------------------------------------------------------------------------
// The instantiations the header promises: F = float and __nv_bfloat16.

#define ZF_INSTANTIATE(F)                                                                         \
  template void layernorm_forward_cuda<F>(F*, float*, float*, const F*, const F*, const F*, int, \
                                          int, cudaStream_t);                                    \
  template void layernorm_backward_cuda<F>(CudaContext&, F*, F*, F*, const F*, const F*,         \
                                           const F*, const float*, const float*, int, int);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)
#undef ZF_INSTANTIATE

}  // namespace zf
