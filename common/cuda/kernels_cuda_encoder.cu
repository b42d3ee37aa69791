// kernels_cuda_encoder.cu: the CUDA twin of kernels_cpu.cpp's encoder
// (token embedding + position embedding), forward and backward. The token
// embedding's gradient is a scatter (several positions may hold the same
// token); without atomics, the backward sorts the positions by token first
// (CUB's radix sort) and then adds each token's positions in increasing
// order, the CPU's order. API and precision rules: kernels_cuda.h; shared
// helpers: kernels_cuda_util.cuh.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Encoder*'
#include "kernels_cuda.h"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
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

// dwte[v,c] += dout[n,c] for every position n holding token v, in two steps.
//
// 1. sort_positions_by_token: the pairs (tokens[n], n) sorted by token with
//    CUB's DeviceRadixSort::SortPairs, which is stable: positions holding the
//    same token stay in increasing order. The sorted positions fall into
//    runs, one per distinct token. (An integer sort: its output does not
//    depend on how the GPU schedules it.)
// 2. encoder_backward_wte_kernel: the block that holds the first index i of
//    a run (sorted_tok[i - 1] != sorted_tok[i]) does the whole run; its
//    thread for channel c reads dwte[v,c] once, adds dout[n,c] for the run's
//    positions n in increasing order in float32 and stores once. Each dwte
//    element thus has one owner thread (no races, no atomics), and its sum
//    has the CPU's order: float32 gives the CPU's bits exactly, bf16 those
//    bits rounded once.
// The cost is set by the longest run (the most frequent token): its
// positions are added one after another, kWteBatch rows loaded at a time so
// that their memory latencies overlap.
constexpr int kWteThreads = 128;     // channels per block (grid.y covers C)
constexpr int kWteRunBlocks = 1024;  // blocks along the sorted positions (grid-stride over them)
constexpr int kWteBatch = 16;        // rows of dout in flight per thread

// positions[n] = n: the values the sort carries along with the tokens.
__global__ void iota_kernel(int32_t* positions, int N) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) positions[i] = i;
}

struct SortedPositions {
  const int32_t* tokens;     // [N] tokens in increasing order
  const int32_t* positions;  // [N] the position each came from
};

// Bytes of N int32 values, rounded up so that every array carved from the
// scratch (CUB's temporary storage included) starts 256-byte aligned, as a
// buffer of its own from cudaMalloc would.
size_t aligned_ints(int N) { return (size_t(N) * sizeof(int32_t) + 255) / 256 * 256; }

SortedPositions sort_positions_by_token(CudaContext& ctx, const int32_t* tokens, int N) {
  // Radix sort over all 32 bits of the (signed) key: CUB orders negative keys
  // first, so any int32 is sorted correctly (the launcher knows no V to
  // bound the bits with). With d_temp_storage null, CUB only writes the
  // temporary storage it needs into temp_bytes.
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens,
                                             static_cast<int32_t*>(nullptr),
                                             static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), N, 0, 32,
                                             ctx.stream()));
  const size_t ints = aligned_ints(N);
  char* base = static_cast<char*>(ctx.scratch(3 * ints + temp_bytes));
  auto* sorted_tok = reinterpret_cast<int32_t*>(base);
  auto* positions = reinterpret_cast<int32_t*>(base + ints);
  auto* sorted_pos = reinterpret_cast<int32_t*>(base + 2 * ints);
  void* temp = base + 3 * ints;
  cuda_impl::launch(iota_kernel, blocks_for(N, kBlock), kBlock, 0, ctx.stream(), positions, N);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, sorted_tok, positions,
                                             sorted_pos, N, 0, 32, ctx.stream()));
  return {sorted_tok, sorted_pos};
}

// Step 2 above. Grid (min(N, kWteRunBlocks), C / kWteThreads), kWteThreads
// threads; block x looks at sorted indices x, x + gridDim.x, ... and does
// the runs that start there.
template <class F>
__global__ void __launch_bounds__(kWteThreads)
    encoder_backward_wte_kernel(F* dwte, const F* __restrict__ dout,
                                const int32_t* __restrict__ sorted_tok,
                                const int32_t* __restrict__ sorted_pos, int N, int C) {
  const int c = blockIdx.y * kWteThreads + threadIdx.x;
  if (c >= C) return;  // no block-wide synchronisation below: a thread may leave alone
  for (int i = blockIdx.x; i < N; i += gridDim.x) {
    const int32_t tok = sorted_tok[i];
    // Inside a run: the block holding its first index does it.
    if (i > 0 && sorted_tok[i - 1] == tok) continue;
    const size_t w = size_t(tok) * C + c;
    float acc = load(dwte, w);
    // The run is [i, the first j with another token). The tokens are sorted,
    // so within a batch the run's rows come first: in[k] is true for a prefix.
    // Two rounds of loads, those of a round independent of one another so
    // that they are in flight together: the batch's tokens and positions (the
    // same addresses for the whole block: cached), then its rows of dout.
    for (int j = i;; j += kWteBatch) {
      int32_t tk[kWteBatch], pos[kWteBatch];
      bool in[kWteBatch];
      float v[kWteBatch];
#pragma unroll
      for (int k = 0; k < kWteBatch; ++k) {
        const int jk = min(j + k, N - 1);  // in range; past N, in[k] is false below
        tk[k] = sorted_tok[jk];
        pos[k] = sorted_pos[jk];
      }
#pragma unroll
      for (int k = 0; k < kWteBatch; ++k) {
        in[k] = j + k < N && tk[k] == tok;
        v[k] = in[k] ? load(dout, size_t(pos[k]) * C + c) : 0.0f;
      }
      // The additions in position order (the loads above may complete in any order).
#pragma unroll
      for (int k = 0; k < kWteBatch; ++k)
        if (in[k]) acc += v[k];
      if (!in[kWteBatch - 1]) break;
    }
    store(dwte, w, acc);
  }
}

}  // namespace

template <class F>
void encoder_forward_cuda(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T,
                          int C, cudaStream_t stream) {
  const size_t n = size_t(B) * T * C;
  if (n == 0) return;
  cuda_impl::launch(encoder_forward_kernel<F>, blocks_for(n, kBlock), kBlock, 0, stream, out, tokens, wte,
                    wpe, B * T, T, C);
  CUDA_CHECK_LAUNCH();
}

template <class F>
void encoder_backward_cuda(CudaContext& ctx, F* dwte, F* dwpe, const F* dout,
                           const int32_t* tokens, int B, int T, int C) {
  if (size_t(B) * T * C == 0) return;
  const int N = B * T;
  const unsigned channel_blocks = blocks_for(C, kWteThreads);
  REQUIRE(channel_blocks <= 65535, "encoder_backward: C = "
                                       << C << " needs " << channel_blocks
                                       << " blocks of channels, over CUDA's 65535 in grid.y");
  cuda_impl::launch(encoder_backward_wpe_kernel<F>, blocks_for(size_t(T) * C, kBlock), kBlock, 0,
                    ctx.stream(), dwpe, dout, B, T, C);
  CUDA_CHECK_LAUNCH();
  const SortedPositions sorted = sort_positions_by_token(ctx, tokens, N);
  const dim3 grid(unsigned(std::min(N, kWteRunBlocks)), channel_blocks);
  cuda_impl::launch(encoder_backward_wte_kernel<F>, grid, kWteThreads, 0, ctx.stream(), dwte, dout,
                    sorted.tokens, sorted.positions, N, C);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// The instantiations the header promises: F = float and __nv_bfloat16.

#define ZF_INSTANTIATE(F)                                                                       \
  template void encoder_forward_cuda<F>(F*, const int32_t*, const F*, const F*, int, int, int, \
                                        cudaStream_t);                                         \
  template void encoder_backward_cuda<F>(CudaContext&, F*, F*, const F*, const int32_t*, int,  \
                                         int, int);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)
#undef ZF_INSTANTIATE

}  // namespace zf
