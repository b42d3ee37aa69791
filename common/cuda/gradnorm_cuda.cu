// gradnorm_cuda.cu: the exact sum of squares on the GPU (gradnorm_cuda.h):
// one kernel that bins the squares by exponent, one 4 KiB copy of the bins to
// the host, SumOfSquares::add_bin_halves to finish.
//
//   build/tests/test_gpu_kernels --gtest_filter='SumSquaresCuda*'   (bit for bit against SumOfSquares::add)
//
// Reference: SumOfSquares::add in gradnorm.cpp. A float32 x (a bf16 is the
// top 16 bits of one) is mant * 2^(e - 150), e its 8-bit exponent field, mant
// its 24-bit integer mantissa (hidden bit included unless e = 0); its square
// is mant^2 * 2^(2e - 300), with mant^2 < 2^48 an exact integer. So the sum
// of squares is sum over e of bin[e] * 2^(2e - 300), bin[e] the integer sum of
// mant^2 over the elements with exponent field e. The host adds bin[e] into
// fixed-point limbs; this file computes bin[] on the device.
//
// Atomics, and why they keep the result exact and deterministic: the rest of
// the CUDA code avoids atomics because float addition depends on its order.
// Here every atomicAdd is on unsigned 64-bit integers, whose addition is
// associative and commutative (and, by the bounds below, never wraps), so
// the bins hold the same integers whatever order the threads and blocks add
// in: the same bits from run to run and the same as the host.
//
// Bounds (why nothing overflows):
// - one block sums at most kChunk = 2^15 elements, so a block's bin is below
//   2^15 * 2^48 = 2^63 (the host flushes its bins every 2^15 elements too);
// - a block adds its bin to global memory split in two: the low 32 bits
//   (< 2^32) into lo[e], the high bits (< 2^31) into hi[e]. With fewer than
//   2^31 blocks (checked; n < 2^46), lo[e] < 2^63 and hi[e] < 2^62: both
//   below the 2^63 that add_bin_halves accepts.
// - within a warp, lanes with the same exponent first sum their squares in
//   two 24-bit halves (32 lanes * 2^24 < 2^29 fits the 32-bit warp reduce).
//
// Non-finite inputs need no flag of their own: an inf or a NaN has e = 255
// and mant >= 2^23, so it leaves bin 255 non-zero (hi[255] >= 2^14), and
// add_bin_halves raises the CPU path's message (kNonFiniteGradientMessage).
#include "gradnorm_cuda.h"

#include <cuda_runtime.h>

#include "check.h"
#include "kernels_cuda.h"
#include "launch.cuh"

namespace zf {

namespace {

constexpr int kBins = SumSquaresScratch::kBins;
constexpr int kThreads = kBins;  // a block: one thread per bin for the zeroing and the flush
constexpr size_t kChunk = size_t(1) << 15;  // elements per block: keeps a block's bin < 2^63

static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "atomicAdd works on unsigned long long");

// bin[e] += sq for one element per lane (all 32 lanes of the warp call it).
__device__ __forceinline__ void add_to_bin(unsigned long long* bins, uint32_t e, unsigned long long sq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // Gradient values cluster in a few binades, so many lanes of a warp often
  // hit the same bin, and atomics on one address serialise. Pre-aggregate:
  // peers = the lanes holding the same exponent; each group sums its squares
  // with the warp reduce (sm_80's redux.sync, 32-bit: hence two 24-bit
  // halves), and only the group's lowest lane touches shared memory. Every
  // lane names exactly its own group in the mask, as cooperative_groups'
  // labeled_partition + reduce do.
  constexpr unsigned kFullMask = 0xffffffffu;  // every lane of the warp is here (see the caller)
  const unsigned peers = __match_any_sync(kFullMask, e);
  const unsigned lo = __reduce_add_sync(peers, unsigned(sq & 0xffffffu));
  const unsigned hi = __reduce_add_sync(peers, unsigned(sq >> 24));
  const int lane = int(threadIdx.x % 32);
  if (lane == __ffs(int(peers)) - 1 && (lo | hi) != 0)
    atomicAdd(&bins[e], (static_cast<unsigned long long>(hi) << 24) + lo);
#else
  // Before sm_80 (no warp reduce): one shared-memory atomic per non-zero square.
  if (sq != 0) atomicAdd(&bins[e], sq);
#endif
}

// Block b bins elements [b * kChunk, min(n, (b + 1) * kChunk)) of x into
// shared memory, then adds its bins into lo[] and hi[] (global, zeroed by the
// caller). Raw is uint32_t for float32 and uint16_t for bf16: only the bits
// matter, and a bf16's bits are the top half of the float32 it stands for.
template <class Raw>
__global__ void __launch_bounds__(kThreads)
    square_bins_kernel(const Raw* __restrict__ x, size_t n, unsigned long long* __restrict__ lo,
                       unsigned long long* __restrict__ hi) {
  constexpr int kShift = sizeof(Raw) == 2 ? 16 : 0;
  ZF_STATIC_SHARED(unsigned long long[kBins], bins);
  bins[threadIdx.x] = 0;
  __syncthreads();

  const size_t begin = size_t(blockIdx.x) * kChunk;
  const size_t end = n - begin < kChunk ? n : begin + kChunk;
  // The trip count is the same for every thread of the block (lanes past the
  // end read a zero), so all 32 lanes of each warp reach add_to_bin together,
  // as its full-mask __match_any_sync requires.
  for (size_t base = begin; base < end; base += kThreads) {
    const size_t i = base + threadIdx.x;
    const uint32_t bits = i < end ? uint32_t(x[i]) << kShift : 0u;
    const uint32_t e = (bits >> 23) & 0xffu;
    const unsigned long long mant = (bits & 0x7fffffu) | (e != 0 ? 0x800000u : 0u);
    add_to_bin(bins, e, mant * mant);
  }
  __syncthreads();  // every warp's additions are in `bins` before the flush

  const unsigned long long v = bins[threadIdx.x];
  if ((v & 0xffffffffull) != 0) atomicAdd(&lo[threadIdx.x], v & 0xffffffffull);
  if ((v >> 32) != 0) atomicAdd(&hi[threadIdx.x], v >> 32);
}

}  // namespace

SumSquaresScratch::SumSquaresScratch(int device) : device_(device) {
  DeviceGuard guard(device);
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_bins_), kBytes));
  // Pinned, so the copy of the bins is a plain DMA that cudaStreamSynchronize
  // waits for (pageable memory would be staged through a driver buffer).
  const cudaError_t err = cudaMallocHost(reinterpret_cast<void**>(&host_bins_), kBytes);
  if (err != cudaSuccess) {
    (void)cudaFree(device_bins_);
    CUDA_CHECK(err);
  }
}

SumSquaresScratch::~SumSquaresScratch() {
  // No throwing here: at exit the CUDA context may already be gone, and a
  // failed free of 8 KiB is not worth terminating for.
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  (void)cudaSetDevice(device_);
  (void)cudaFree(device_bins_);
  (void)cudaFreeHost(host_bins_);
  if (prev >= 0) (void)cudaSetDevice(prev);
  (void)cudaGetLastError();
}

void sum_squares_cuda(const void* x, DType dtype, size_t n, SumOfSquares& acc,
                      SumSquaresScratch& scratch, cudaStream_t stream) {
  REQUIRE(dtype == DType::f32 || dtype == DType::bf16,
          "sum_squares_cuda: gradients are f32 or bf16, not " << dtype_name(dtype));
  if (n == 0) return;
  const size_t blocks = (n + kChunk - 1) / kChunk;
  REQUIRE(blocks < (size_t(1) << 31), "sum_squares_cuda: " << n << " elements in one call, over the "
                                          "2^31 - 1 blocks of 2^15 it can bin; sum the gradient in pieces");
  DeviceGuard guard(scratch.device());

  auto* lo = reinterpret_cast<unsigned long long*>(scratch.device_bins());
  auto* hi = lo + kBins;
  CUDA_CHECK(cudaMemsetAsync(lo, 0, SumSquaresScratch::kBytes, stream));
  if (dtype == DType::f32)
    cuda_impl::launch(square_bins_kernel<uint32_t>, unsigned(blocks), kThreads, 0, stream,
                      static_cast<const uint32_t*>(x), n, lo, hi);
  else
    cuda_impl::launch(square_bins_kernel<uint16_t>, unsigned(blocks), kThreads, 0, stream,
                      static_cast<const uint16_t*>(x), n, lo, hi);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaMemcpyAsync(scratch.host_bins(), lo, SumSquaresScratch::kBytes, cudaMemcpyDeviceToHost,
                             stream));
  // The caller needs the value on the host now (the clipping coefficient):
  // wait for the kernel and the 4 KiB copy, nothing more.
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const uint64_t* host = scratch.host_bins();
  acc.add_bin_halves(host, host + kBins);
}

}  // namespace zf
