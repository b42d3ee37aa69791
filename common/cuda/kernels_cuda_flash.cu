// kernels_cuda_flash.cu: flash-style causal self-attention on the GPU: the
// same op as attention_forward_cuda / attention_backward_cuda
// (kernels_cuda_matmul.cu, "the simple form"), without ever writing the
// T x T scores or probabilities. The forward saves lse [B, H, T] (float32)
// instead of att [B, H, T, T]; the backward recomputes the probabilities from
// it. API: kernels_cuda.h.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Flash*'   (against the CPU reference)
//   build/tests/test_flash_attention                        (the same per-thread code, on the CPU)
//
// Reference: attention_forward, attention_backward (kernels_cpu.cpp).
//
// The per-thread work is in flash_attention.cuh (math, tiling, masks: read
// it first); the kernels below only sequence its phases with __syncthreads,
// exactly as the CPU harness of tests/flash/test_flash_attention.cpp does.
// Plain CUDA cores, float32 arithmetic, no tensor cores: one thread per row,
// tiles of the other side in shared memory. Every sum runs in a fixed order
// and there are no atomics, so two runs give the same bits.
#include <cmath>

#include "flash_attention.cuh"
#include "kernels_cuda.h"
#include "kernels_cuda_util.cuh"

namespace zf {

using flash::kRows;
using flash::kTile;
using flash::Shape;

namespace {

// ---------------------------------------------------------------------------
// Kernels. Grid (row blocks, B*H), kRows threads. Causal work is uneven (the
// last query rows see every key, the first key rows are seen by every
// query), so the block index is mapped to start with the longest blocks:
// the last to be scheduled are then the short ones, and the GPU's tail is short.

template <class F, int HS>
__global__ void __launch_bounds__(kRows)
    flash_forward_kernel(F* out, float* lse, const F* qkv, Shape s) {
  ZF_STATIC_SHARED(flash::KVTiles<HS>, tiles);
  const int rt = gridDim.x - 1 - blockIdx.x;  // the last query rows (most keys) first
  const int b = blockIdx.y / s.H, h = blockIdx.y % s.H;
  const int i = rt * kRows + threadIdx.x;
  flash::ForwardRow<HS> row;
  flash::forward_begin(row, s, qkv, b, h, i);
  for (int j0 = 0; j0 < flash::forward_keys(rt, s.T); j0 += kTile) {
    flash::load_kv_tile(tiles, s, qkv, b, h, j0, threadIdx.x);
    __syncthreads();  // the tile is complete
    flash::forward_tile(row, tiles, i, threadIdx.x, j0, s.T);
    __syncthreads();  // everyone is done with it before the next copy overwrites it
  }
  flash::forward_end(row, s, out, lse, b, h, i);
}

template <class F>
__global__ void flash_delta_kernel(float* D, const F* out, const F* dout, Shape s, int rows) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) flash::backward_delta(D, out, dout, s, r);
}

template <class F, int HS>
__global__ void __launch_bounds__(kRows)
    flash_dq_kernel(F* dqkv, const F* dout, const F* qkv, const float* lse, const float* D,
                    Shape s) {
  ZF_STATIC_SHARED(flash::KVTiles<HS>, tiles);
  const int rt = gridDim.x - 1 - blockIdx.x;
  const int b = blockIdx.y / s.H, h = blockIdx.y % s.H;
  const int i = rt * kRows + threadIdx.x;
  flash::DqRow<HS> row;
  flash::dq_begin(row, s, qkv, dout, lse, D, b, h, i);
  for (int j0 = 0; j0 < flash::forward_keys(rt, s.T); j0 += kTile) {
    flash::load_kv_tile(tiles, s, qkv, b, h, j0, threadIdx.x);
    __syncthreads();
    flash::dq_tile(row, tiles, i, j0, s.T);
    __syncthreads();
  }
  flash::dq_end(row, s, dqkv, b, h, i);
}

// dV (Row = flash::DvRow) and dK (flash::DkRow): the same loop over query
// tiles; flash::key_begin / key_tile / key_end are overloaded on the row type.
template <class F, int HS, class Row>
__global__ void __launch_bounds__(kRows)
    flash_key_kernel(F* dqkv, const F* dout, const F* qkv, const float* lse, const float* D,
                     Shape s) {
  ZF_STATIC_SHARED(flash::QTiles<HS>, tiles);
  const int kt = blockIdx.x;  // the first key rows (seen by most queries) first
  const int b = blockIdx.y / s.H, h = blockIdx.y % s.H;
  const int j = kt * kRows + threadIdx.x;
  Row row;
  flash::key_begin(row, s, qkv, b, h, j);
  for (int i0 = flash::key_first_query(kt); i0 < s.T; i0 += kTile) {
    flash::load_q_tile(tiles, s, qkv, dout, lse, D, b, h, i0, threadIdx.x);
    __syncthreads();
    flash::key_tile(row, tiles, j, i0, s.T);
    __syncthreads();
  }
  flash::key_end(row, s, dqkv, b, h, j);
}

// ---------------------------------------------------------------------------
// Launchers

dim3 flash_grid(const Shape& s, int B) { return dim3(flash::row_blocks(s.T), B * s.H); }

}  // namespace

namespace cuda_impl {

Shape flash_shape(int B, int T, int C, int H) {
  REQUIRE(H > 0 && C % H == 0, "flash attention: C = " << C << " is not a multiple of H = " << H);
  const int hs = C / H;
  if (B == 0 || T == 0 || C == 0) return Shape{T, C, H, 0, 0.0f};
  REQUIRE(flash::padded_head_size(hs) != 0,
          "flash attention: head size C/H = " << C << "/" << H << " = " << hs
                                              << " is over the kernels' maximum of "
                                              << flash::kMaxHeadSize
                                              << " (--attention simple has no such limit)");
  REQUIRE(size_t(B) * H <= 65535,
          "flash attention: B*H = " << size_t(B) * H << " is over CUDA's grid limit of 65535 (y)");
  return Shape{T, C, H, hs, 1.0f / std::sqrt(float(hs))};
}

template <class F>
void flash_attention_delta_cuda(float* D, const F* out, const F* dout, const Shape& s, int B,
                                cudaStream_t stream) {
  REQUIRE(size_t(B) * s.H * s.T <= 0x7fffffffu, "flash attention: B*H*T is over 2^31 - 1 rows");
  const int rows = B * s.H * s.T;
  cuda_impl::launch((flash_delta_kernel<F>), blocks_for(size_t(rows), kBlock), kBlock, 0, stream, D, out,
                    dout, s, rows);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cuda_impl

template <class F>
void flash_attention_forward_cuda(F* out, float* lse, const F* qkv, int B, int T, int C, int H,
                                  cudaStream_t stream) {
  const Shape s = cuda_impl::flash_shape(B, T, C, H);
  if (s.hs == 0) return;
  flash::with_head_size(s, [&](auto hs) {
    constexpr int HS = decltype(hs)::value;
    cuda_impl::launch((flash_forward_kernel<F, HS>), flash_grid(s, B), kRows, 0, stream, out, lse, qkv, s);
  });
  CUDA_CHECK_LAUNCH();
}

template <class F>
void flash_attention_backward_cuda(F* dqkv, float* scratch, const F* dout, const F* out,
                                   const F* qkv, const float* lse, int B, int T, int C, int H,
                                   cudaStream_t stream) {
  const Shape s = cuda_impl::flash_shape(B, T, C, H);
  if (s.hs == 0) return;
  float* D = scratch;
  cuda_impl::flash_attention_delta_cuda(D, out, dout, s, B, stream);
  // dQ, dV and dK write disjoint parts of dqkv (q, v, k) and only read D.
  flash::with_head_size(s, [&](auto hs) {
    constexpr int HS = decltype(hs)::value;
    const dim3 grid = flash_grid(s, B);
    cuda_impl::launch((flash_dq_kernel<F, HS>), grid, kRows, 0, stream, dqkv, dout, qkv, lse, D, s);
    CUDA_CHECK_LAUNCH();
    cuda_impl::launch((flash_key_kernel<F, HS, flash::DvRow<HS>>), grid, kRows, 0, stream, dqkv, dout, qkv,
                      lse, D, s);
    CUDA_CHECK_LAUNCH();
    cuda_impl::launch((flash_key_kernel<F, HS, flash::DkRow<HS>>), grid, kRows, 0, stream, dqkv, dout, qkv,
                      lse, D, s);
    CUDA_CHECK_LAUNCH();
  });
}

// ---------------------------------------------------------------------------
// The instantiations the header promises: F = float and __nv_bfloat16.

#define ZF_INSTANTIATE(F)                                                                       \
  template void cuda_impl::flash_attention_delta_cuda<F>(float*, const F*, const F*, const Shape&,  \
                                                         int, cudaStream_t);                     \
  template void flash_attention_forward_cuda<F>(F*, float*, const F*, int, int, int, int,      \
                                                cudaStream_t);                                  \
  template void flash_attention_backward_cuda<F>(F*, float*, const F*, const F*, const F*,     \
                                                 const float*, int, int, int, int, cudaStream_t);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)
#undef ZF_INSTANTIATE

}  // namespace zf
