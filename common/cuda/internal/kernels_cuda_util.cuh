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
//   kernels_cuda_encoder.cu      encoder (token + position embedding)
//   kernels_cuda_elementwise.cu  GELU, residual
//   kernels_cuda_layernorm.cu    LayerNorm
//   kernels_cuda_matmul.cu       matmul and attention (the cuBLAS users) + the gemm helper
//   kernels_cuda_flash.cu        flash-style attention (its per-thread work: flash_attention.cuh)
//   kernels_cuda_flash_tc.cu     the same on tensor cores, bf16 (its programs: flash_attention_tc.cuh)
//   kernels_cuda_softmax.cu      softmax + cross-entropy
//   kernels_cuda_adamw.cu        AdamW and the bf16 <-> float32 casts
//   kernels_cuda_context.cu      CudaContext, cuda_unavailable_reason
//
// What to look for when reading them:
// - Everything is plain CUDA C++ (and CUB's radix sort): one thread per
//   element for elementwise ops (GELU and residual: per 16 bytes of elements
//   when aligned), one warp (32 threads) per row for row-wise ops (LayerNorm,
//   causal softmax), one block per row when rows are long (the vocabulary
//   softmax).
// - Matrix products, attention's included, go to cuBLAS (cublasGemmEx and
//   its strided-batched form) with float32 accumulation (kernels_cuda_matmul.cu
//   explains the row-major / column-major bookkeeping).
// - No float atomics anywhere: sums over rows (LayerNorm's weight and bias
//   gradients, a Linear's bias gradient) are split among blocks and threads
//   in a fixed pattern and combined in a fixed order (two passes, below), so
//   every run gives the same bits. The embedding gradient sorts positions by
//   token first (kernels_cuda_encoder.cu).
// - bf16 tensors are read into float32, computed on in float32 and rounded
//   once when stored (load/store below).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "check.h"
#include "kernels_cuda.h"
#include "launch.cuh"

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

// ---------------------------------------------------------------------------
// Column sums over N rows, in two passes (LayerNorm's dweight and dbias, a
// Linear's dbias). One block per group of 32 columns would leave most of a
// GPU idle (24 blocks for C = 768 on 132 SMs, each thread walking N/32 rows
// one dependent load after another), so the rows are also cut into slices:
//
// Pass 1 (each op's own kernel, since its terms differ): grid (column tiles,
//   slices), blocks of kColTile x kColRows threads. Block (x, s) owns columns
//   [32x, 32x + 32) of rows [s R, s R + R) (R = ColumnSlices::rows): thread
//   (tx, ty) sums rows s R + ty, s R + ty + kColRows, ... of column 32x + tx
//   (a warp is one ty: it reads 32 neighbouring columns of one row, so
//   coalesced), column_tree_sum adds the kColRows sums of each column, and
//   the block writes them to partial[s][c], float32, in the caller's scratch.
// Pass 2 (column_sums_finish_kernel): out[c] += the sum of partial[0..S)[c],
//   in the same layout (thread ty takes slices ty, ty + kColRows, ..., then
//   the same tree), one rounding into F.
// Every number above depends only on N and C, so the order of every
// addition is fixed: the same bits on every run (no atomics). The order is
// not the CPU twin's: float32 results agree within the rounding of a sum of
// N terms (the tests' bound).
constexpr int kColTile = 32;          // columns per block (blockDim.x, one warp)
constexpr int kColRows = 8;           // threads per column in a block (blockDim.y)
constexpr int kColMaxSlices = 64;     // the most slices, whatever N
constexpr int kColMinSliceRows = 64;  // a slice has at least this many rows when N allows

// How the rows are cut: `count` slices of `rows` rows (the last may be
// shorter). gpt2 (N = 8192): 64 slices of 128 rows, 16 rows per thread; the
// grid of pass 1 is then 24 x 64 = 1536 blocks for C = 768.
struct ColumnSlices {
  int count;
  int rows;
};
inline ColumnSlices column_slices(int N) {
  const int count = std::clamp((N + kColMinSliceRows - 1) / kColMinSliceRows, 1, kColMaxSlices);
  return {count, (N + count - 1) / count};
}

// Bytes of scratch for `sums` column sums (LayerNorm: 2) of C columns over N rows.
inline size_t column_scratch_bytes(int sums, int N, int C) {
  return size_t(sums) * column_slices(N).count * size_t(C) * sizeof(float);
}

// The kColRows values x of column threadIdx.x (one per threadIdx.y) added by
// a fixed tree (ty + 4 into ty, then + 2, then + 1); every thread of the
// block gets its column's total. Every thread of the block must call it.
__device__ inline float column_tree_sum(float x, float (*shared)[kColTile]) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  __syncthreads();  // shared may still be read by the previous call
  shared[ty][tx] = x;
  __syncthreads();
  for (int s = kColRows / 2; s > 0; s /= 2) {
    if (ty < s) shared[ty][tx] += shared[ty + s][tx];
    __syncthreads();
  }
  return shared[0][tx];
}

// Pass 2: out_k[c] += sum over s of partial[(k S + s) C + c] for the output k
// = blockIdx.y (out0 or out1: LayerNorm finishes dweight and dbias in one
// launch). Grid (column tiles, outputs), blocks of kColTile x kColRows.
template <class F>
__global__ void __launch_bounds__(kColTile * kColRows)
    column_sums_finish_kernel(F* out0, F* out1, const float* __restrict__ partial, int slices,
                              int C) {
  ZF_STATIC_SHARED(float[kColRows][kColTile], shared);
  F* out = blockIdx.y == 0 ? out0 : out1;
  const float* p = partial + size_t(blockIdx.y) * slices * C;
  const int c = blockIdx.x * kColTile + threadIdx.x;
  float acc = 0.0f;
  if (c < C)
    for (int s = threadIdx.y; s < slices; s += kColRows) acc += p[size_t(s) * C + c];
  acc = column_tree_sum(acc, shared);
  if (threadIdx.y == 0 && c < C) store(out, c, load(out, c) + acc);
}

// Launches pass 2 for one or two outputs (out1 may be null: one output).
template <class F>
void column_sums_finish(F* out0, F* out1, const float* partial, int slices, int C,
                        cudaStream_t stream) {
  const dim3 grid(blocks_for(C, kColTile), out1 ? 2 : 1);
  cuda_impl::launch((column_sums_finish_kernel<F>), grid, dim3(kColTile, kColRows), 0, stream, out0, out1,
                    partial, slices, C);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// What the two flash attention files share (kernels_cuda_flash.cu defines it).

}  // namespace zf::cuda_impl

namespace zf::flash {
struct Shape;
}

namespace zf::cuda_impl {

// The shape of one call, after the checks both forms and both directions
// make (head size, grid limits); hs = 0 when there is nothing to do.
flash::Shape flash_shape(int B, int T, int C, int H);

// The backward's first step: D_i = dout_i . out_i for every row of [B, H, T].
template <class F>
void flash_attention_delta_cuda(float* D, const F* out, const F* dout, const flash::Shape& s, int B,
                                cudaStream_t stream);

}  // namespace zf::cuda_impl
