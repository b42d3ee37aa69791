// kernels_cuda_util.cuh: what every kernels_cuda_*.cu file shares, and
// nothing else includes (private to the CUDA kernels; kernels_cuda.h is the
// public header): launch constants, blocks_for, load/store of float32 and
// bf16, warp and block reductions.
//
//   build/tests/test_gpu_kernels      (every kernel against its CPU twin)
//
// The kernels live one op family a file, each in llm.c's order (a
// "Reference:" line naming the CPU twin, the kernels with their thread-block
// layout, the launchers), each file ending with its explicit instantiations:
//   kernels_cuda_elementwise.cu  encoder, GELU, residual
//   kernels_cuda_layernorm.cu    LayerNorm
//   kernels_cuda_matmul.cu       matmul and attention (the cuBLAS users) + the gemm helper
//   kernels_cuda_flash.cu        flash-style attention (its per-thread work: flash_attention.cuh)
//   kernels_cuda_softmax.cu      softmax + cross-entropy
//   kernels_cuda_adamw.cu        AdamW and the bf16 <-> float32 casts
//   kernels_cuda_context.cu      CudaContext, cuda_unavailable_reason
//
// What to look for when reading them:
// - Everything is plain CUDA C++: one thread per element for elementwise ops,
//   one warp (32 threads) per row for row-wise ops (LayerNorm, causal
//   softmax), one block per row when rows are long (the vocabulary softmax).
// - Matrix products, attention's included, go to cuBLAS (cublasGemmEx and
//   its strided-batched form) with float32 accumulation (kernels_cuda_matmul.cu
//   explains the row-major / column-major bookkeeping).
// - No atomics anywhere: sums over rows (weight gradients, bias gradients)
//   are split among threads in a fixed pattern and combined in a fixed
//   order, so every run gives the same bits. That costs some speed in the
//   few kernels that reduce over B*T rows; they are a small share of a step.
// - bf16 tensors are read into float32, computed on in float32 and rounded
//   once when stored (load/store below).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "check.h"
#include "kernels_cuda.h"

// Kernel launches report a bad configuration through cudaGetLastError.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace zf::cuda_impl {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Elementwise kernels: 256 threads a block, one thread per element.
constexpr int kBlock = 256;

// Row kernels: one warp per row, kRowsPerBlock rows a block; lane l handles
// channels l, l + 32, ... so a warp reads 32 consecutive values at a time.
// The kernels rely on blockDim.x == kBlock: a warp's row is then the same
// for its 32 lanes, so a warp past the last row leaves whole and the
// full-mask shuffles of the others never wait on an exited lane.
constexpr int kRowsPerBlock = kBlock / kWarp;

// Column sums over N rows (LayerNorm's dweight/dbias, a Linear's dbias):
// blocks of kColTile x kColTile threads, each block owning kColTile columns.
constexpr int kColTile = 32;

// Blocks needed to give each of n items one of per_block threads.
inline unsigned blocks_for(size_t n, size_t per_block) {
  const size_t blocks = (n + per_block - 1) / per_block;
  REQUIRE(blocks <= 0x7fffffffu, "CUDA grid of " << blocks << " blocks of " << per_block
                                  << " items is over the limit of 2^31 - 1 blocks: "
                                     "split the op into smaller calls");
  return unsigned(blocks);
}

// float32 in registers, F in memory.
__device__ __forceinline__ float load(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, size_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float* p, size_t i, float x) { p[i] = x; }
__device__ __forceinline__ void store(__nv_bfloat16* p, size_t i, float x) {
  p[i] = __float2bfloat16_rn(x);  // round to nearest even, as float_to_bf16 in dtype.h
}

// Sum / max over the 32 lanes of a warp, by a butterfly of shuffles: after
// step o every lane holds the combination of its group of 2o lanes. Every
// lane ends with the same value, and the order of additions is fixed.
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// Sum / max over a whole block (blockDim.x a multiple of 32): each warp
// reduces its lanes, warp results meet in shared[0..31], and every warp then
// reduces those. Every thread gets the result.
__device__ inline float block_sum(float x, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  x = warp_sum(x);
  __syncthreads();  // shared may still be in use by the previous reduction
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  return warp_sum(lane < int(blockDim.x / kWarp) ? shared[lane] : 0.0f);
}
__device__ inline float block_max(float x, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  return warp_max(lane < int(blockDim.x / kWarp) ? shared[lane] : -INFINITY);
}

}  // namespace zf::cuda_impl
