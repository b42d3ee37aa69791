// cublas_loader.cpp: cuBLAS opened when a GPU run first calls it, not when a
// program starts. Loading libcublas runs libcublasLt's static initializers
// over much of its data, which every CPU run, every `--help` and every
// child process of the tests would pay for; only `--device cuda` needs it.
// So the build links these definitions in place of libcublas (meson.build):
// the code calls cuBLAS through cublas_v2.h as usual
// (kernels_cuda_matmul.cu), and each function here opens libcublas on the
// first call of any of them and forwards to its own, looked up by name.
//
// The emulated GPU (tests/emu) defines the same functions itself, so its
// builds do not compile this file.
//
//   build/tests/test_gpu_kernels --gtest_filter='CublasLoader*'
#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

#include "check.h"  // Error

namespace {

// The same major version as the header compiled against: the library that
// the link would have named (libcublas.so.13 for cuBLAS 13), found where the
// program's other CUDA libraries are (its run path) or by the loader's usual
// search (LD_LIBRARY_PATH, the system's).
void* cublas_library() {
  static void* const lib = [] {
    const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h)
      throw zf::Error("--device cuda needs cuBLAS, and " + name + " could not be loaded (" + dlerror() +
                      "): install the CUDA toolkit's libraries, or add their folder to LD_LIBRARY_PATH");
    return h;
  }();
  return lib;
}

void* cublas_symbol(const char* name) {
  void* f = dlsym(cublas_library(), name);
  if (!f) throw zf::Error(std::string("cuBLAS has no ") + name + ": is the CUDA toolkit older than its headers?");
  return f;
}

// Calls fn as a function of the arguments' own types: each definition below
// passes its parameters, whose types the header checks (a C function
// declared twice with other types is an error).
template <class R, class... A>
R call_as(void* fn, A... args) {
  return reinterpret_cast<R (*)(A...)>(fn)(args...);
}

}  // namespace

// Each looked up once, by its own name, on its first call (a thread-safe
// static).
#define ZF_CUBLAS_FORWARD(R, ...)                       \
  static void* const fn = cublas_symbol(__func__);      \
  return call_as<R>(fn, __VA_ARGS__)

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  ZF_CUBLAS_FORWARD(cublasStatus_t, handle);
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  ZF_CUBLAS_FORWARD(cublasStatus_t, handle);
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  ZF_CUBLAS_FORWARD(cublasStatus_t, handle, stream);
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  ZF_CUBLAS_FORWARD(cublasStatus_t, handle, mode);
}

cublasStatus_t CUBLASWINAPI cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  ZF_CUBLAS_FORWARD(cublasStatus_t, handle, mode);
}

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
  ZF_CUBLAS_FORWARD(const char*, status);
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  ZF_CUBLAS_FORWARD(const char*, status);
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb, const void* beta,
                                         void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t algo) {
  ZF_CUBLAS_FORWARD(cublasStatus_t, handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
                    Ctype, ldc, computeType, algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA, const void* B,
    cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
    long long int strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  ZF_CUBLAS_FORWARD(cublasStatus_t, handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA,
                    B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo);
}

}  // extern "C"
