// gradnorm_cuda.h: the exact gradient sum of squares (gradnorm.h) computed on
// the GPU: the same bits as SumOfSquares::add on the host, without copying
// the gradient off the device.
//
//   build/tests/test_gpu_kernels --gtest_filter='SumSquaresCuda*'   (against SumOfSquares::add, bit for bit; skips without a GPU)
//   build/tests/test_optim --gtest_filter='SumOfSquares*'   (the host half, on any machine)
//
// How: the squares are binned by exponent field on the device exactly as
// gradnorm.cpp bins them on the host (256 bins of integer mant^2), only the
// bins come back (4 KiB), and SumOfSquares::add_bin_halves adds them into
// the limbs. Every sum on the way is an integer sum, so neither the order of
// the threads nor the split into blocks changes a bit. gradnorm_cuda.cu says
// why nothing overflows.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "dtype.h"
#include "gradnorm.h"

namespace zf {

// The buffers sum_squares_cuda needs, allocated once per device (a rank's
// CudaDevice holds one) rather than per call: 2 x 256 uint64 bins on the
// device and their pinned host mirror, 4 KiB each. Like cuBLAS's workspace
// they are not counted by the MemoryTracker: a fixed few KiB, not model
// state. Not for two threads at once: one scratch per rank, used on the
// rank's stream.
class SumSquaresScratch {
 public:
  static constexpr int kBins = 256;  // one per float32 exponent field
  static constexpr size_t kBytes = 2 * kBins * sizeof(uint64_t);

  // Allocates on CUDA device `device` (the current device is restored).
  explicit SumSquaresScratch(int device);
  ~SumSquaresScratch();
  SumSquaresScratch(const SumSquaresScratch&) = delete;
  SumSquaresScratch& operator=(const SumSquaresScratch&) = delete;

  int device() const { return device_; }
  uint64_t* device_bins() const { return device_bins_; }  // lo[256] then hi[256]
  uint64_t* host_bins() const { return host_bins_; }      // pinned, same layout

 private:
  int device_;
  uint64_t* device_bins_ = nullptr;
  uint64_t* host_bins_ = nullptr;
};

// acc += sum of x[i]^2 over the n elements of the device array x (float32 or
// bf16), with the same bits as acc.add on a host copy of x. Enqueued on
// `stream` (whose device must be scratch.device() and current), then waits
// for it: the caller needs the norm on the host at once (the clipping
// coefficient), so it returns when the 4 KiB of bins have arrived. Raises
// kNonFiniteGradientMessage if x holds an inf or a NaN, like acc.add.
void sum_squares_cuda(const void* x, DType dtype, size_t n, SumOfSquares& acc,
                      SumSquaresScratch& scratch, cudaStream_t stream);

}  // namespace zf
