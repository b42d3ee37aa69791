// kernels_cuda_context.cu: CudaContext (one rank's device, compute stream
// and cuBLAS handle) and cuda_unavailable_reason, declared in kernels_cuda.h.
//
//   build/tests/test_gpu_kernels --gtest_filter='CudaContext*:CudaCheck*'
#include "kernels_cuda.h"

#include <string>

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
  if (!stream_) {
    // Non-blocking: no implicit ordering with the legacy default stream, so
    // the compute stream and a communication stream only wait where events say.
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    owns_stream_ = true;
  }
  const cublasStatus_t st = cublasCreate(&cublas_);
  if (st == CUBLAS_STATUS_SUCCESS) {
    // Default math mode: float32 products stay float32 (no TF32) unless
    // set_tf32 asks, per call, through the compute type.
    const cublasStatus_t st2 = cublasSetStream(cublas_, stream_);
    if (st2 == CUBLAS_STATUS_SUCCESS) return;
    cublasDestroy(cublas_);
    if (owns_stream_) cudaStreamDestroy(stream_);
    CUBLAS_CHECK(st2);
  }
  if (owns_stream_) cudaStreamDestroy(stream_);
  CUBLAS_CHECK(st);
}

CudaContext::~CudaContext() {
  // No throwing from a destructor: errors here would only repeat an earlier one.
  if (cublas_) cublasDestroy(cublas_);
  if (owns_stream_ && stream_) cudaStreamDestroy(stream_);
}

}  // namespace zf
