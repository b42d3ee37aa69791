// kernels_cuda_context.cu: CudaContext (one rank's device, compute stream,
// cuBLAS handle and kernel scratch) and cuda_unavailable_reason, declared in
// kernels_cuda.h.
//
//   build/tests/test_gpu_kernels --gtest_filter='CudaContext*:CudaCheck*'
#include "kernels_cuda.h"

#include <string>

#include "memory.h"  // OutOfMemory

namespace zf {

// ---------------------------------------------------------------------------
// Devices and CudaContext.

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" +
           cudaGetErrorString(err) + ")";
  }
  if (count == 0) return "cudaGetDeviceCount found 0 devices";
  return "";
}

CudaContext::CudaContext(int device, cudaStream_t stream) : device_(device), stream_(stream) {
  CUDA_CHECK(cudaSetDevice(device));
  // cuBLAS first: opening it (cublas_loader.cpp) may throw, and nothing is
  // held yet that would need releasing.
  CUBLAS_CHECK(cublasCreate(&cublas_));
  // Default math, so float32 products stay float32 (no TF32) unless set_tf32
  // asks, per call, through the compute type; plus
  // CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION. Without it a bf16
  // product may be split along K and its parts added up in bf16, the output
  // type (cublas_api.h: the flag "force[s] any reductions to use the
  // accumulator type and not output type in case of mixed precision routines
  // with lower size output type"; PyTorch's
  // allow_bf16_reduced_precision_reduction is the same switch), rounding
  // several times where kernels_cuda.h promises float32 accumulation and one
  // rounding, and the GPU tests' bf16 bounds assume it.
  cublasStatus_t st = cublasSetMathMode(
      cublas_, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  cudaError_t err = cudaSuccess;
  if (st == CUBLAS_STATUS_SUCCESS && !stream_) {
    // Non-blocking: no implicit ordering with the legacy default stream, so
    // the compute stream and a communication stream only wait where events say.
    err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    owns_stream_ = err == cudaSuccess;
  }
  if (st == CUBLAS_STATUS_SUCCESS && err == cudaSuccess) st = cublasSetStream(cublas_, stream_);
  if (st == CUBLAS_STATUS_SUCCESS && err == cudaSuccess) return;
  if (owns_stream_) cudaStreamDestroy(stream_);
  cublasDestroy(cublas_);
  CUDA_CHECK(err);
  CUBLAS_CHECK(st);
}

CudaContext::~CudaContext() {
  // No throwing from a destructor: errors here would only repeat an earlier
  // one. cudaFree waits for the device if kernels still use the scratch.
  if (scratch_) cudaFree(scratch_);
  if (cublas_) cublasDestroy(cublas_);
  if (owns_stream_ && stream_) cudaStreamDestroy(stream_);
}

void* CudaContext::scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Kernels already enqueued on stream_ may still read or write the old
  // buffer: wait for them before freeing it (cudaFree only promises that it
  // *may* synchronise). Only the ops of this context use the scratch, and
  // all of them run on stream_, so waiting for stream_ is enough.
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (scratch_) CUDA_CHECK(cudaFree(scratch_));
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  // Round up to 64 KiB so that a slightly larger request later does not
  // reallocate again. cudaMalloc's memory is aligned to at least 256 bytes.
  const size_t rounded = (bytes + 65535) / 65536 * 65536;
  cudaError_t err = cudaMalloc(&scratch_, rounded);
  if (err == cudaErrorMemoryAllocation) {
    // The Device's pool keeps what the model freed (device_cuda.cu), which
    // cudaMalloc cannot use: hand the unused part back to the GPU and try
    // once more, as the Device's own allocations do.
    (void)cudaGetLastError();
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess) (void)cudaMemPoolTrimTo(pool, 0);
    (void)cudaGetLastError();
    err = cudaMalloc(&scratch_, rounded);
  }
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // no sticky error for the caller's next call
    scratch_ = nullptr;
    throw OutOfMemory("GPU out of memory: the kernels' scratch buffer of " + std::to_string(rounded) +
                      " bytes (column sums, the embedding's sort) does not fit next to the model on GPU " +
                      std::to_string(device_) + ". Use a smaller --batch, a later ZeRO stage, or more ranks");
  }
  CUDA_CHECK(err);
  scratch_bytes_ = rounded;
  return scratch_;
}

}  // namespace zf
