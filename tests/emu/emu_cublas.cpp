// emu_cublas.cpp: the cuBLAS calls of cublas_v2.h on the emulated GPU.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "emu_runtime.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

using zf::emu::TsanQuiet;

float read(const void* p, cudaDataType_t t, size_t i) {
  if (t == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
void write(void* p, cudaDataType_t t, size_t i, float x) {
  if (t == CUDA_R_16BF) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  else static_cast<float*>(p)[i] = x;
}
// TF32: 10 mantissa bits, rounded to nearest (ties away, as cvt.rna.tf32.f32).
float tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}

bool type_ok(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

// s[i] += a[i] * x for i < m, four at a time: each s[i] is one multiply
// and one add, rounded each (the build contracts no multiply-add), as in a
// plain loop, which the compiler at -O2 would leave one element at a time.
void axpy(float* s, const float* a, float x, int m) {
  using V = float __attribute__((vector_size(16)));
  int i = 0;
  for (; i + 4 <= m; i += 4) {
    V av, sv;
    std::memcpy(&av, a + i, sizeof av);
    std::memcpy(&sv, s + i, sizeof sv);
    sv += av * x;
    std::memcpy(s + i, &sv, sizeof sv);
  }
  for (; i < m; ++i) s[i] += a[i] * x;
}

// One product, column-major: C[i + j ldc] = alpha sum_k op(A)[i,k] op(B)[k,j] + beta C.
// Each C element sums its k products in order from k = 0; op(A) is first
// copied as floats by columns, so that the sums of a column of C run side
// by side over contiguous memory.
void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void* A,
          cudaDataType_t at, int lda, const void* B, cudaDataType_t bt, int ldb, float beta, void* C,
          cudaDataType_t ct, int ldc, bool use_tf32) {
  // For real types, CUBLAS_OP_C is CUBLAS_OP_T.
  auto op_a = [&](int i, int kk) {
    const float v = ta == CUBLAS_OP_N ? read(A, at, size_t(i) + size_t(kk) * lda) : read(A, at, size_t(kk) + size_t(i) * lda);
    return use_tf32 ? tf32(v) : v;
  };
  auto op_b = [&](int kk, int j) {
    const float v = tb == CUBLAS_OP_N ? read(B, bt, size_t(kk) + size_t(j) * ldb) : read(B, bt, size_t(j) + size_t(kk) * ldb);
    return use_tf32 ? tf32(v) : v;
  };
  std::vector<float> a(size_t(m) * size_t(k)), s(static_cast<size_t>(m));
  for (int kk = 0; kk < k; ++kk)
    for (int i = 0; i < m; ++i) a[size_t(kk) * m + i] = op_a(i, kk);
  for (int j = 0; j < n; ++j) {
    std::fill(s.begin(), s.end(), 0.0f);
    for (int kk = 0; kk < k; ++kk) axpy(s.data(), a.data() + size_t(kk) * m, op_b(kk, j), m);
    for (int i = 0; i < m; ++i) {
      const size_t c = size_t(i) + size_t(j) * ldc;
      write(C, ct, c, beta == 0.0f ? alpha * s[size_t(i)] : alpha * s[size_t(i)] + beta * read(C, ct, c));
    }
  }
}

cublasStatus_t check(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                     const void* alpha, cudaDataType_t at, int lda, cudaDataType_t bt, int ldb, const void* beta,
                     cudaDataType_t ct, int ldc, cublasComputeType_t compute, int batch) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  if (ta > CUBLAS_OP_C || tb > CUBLAS_OP_C) return CUBLAS_STATUS_INVALID_VALUE;
  const int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
  if (lda < std::max(1, arows) || ldb < std::max(1, brows) || ldc < std::max(1, m)) return CUBLAS_STATUS_INVALID_VALUE;
  if (!type_ok(at) || !type_ok(bt) || !type_ok(ct) || at != bt) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (compute == CUBLAS_COMPUTE_32F_FAST_TF32 && at != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (zf::emu::stream_error(h->stream) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasGetStatusString(cublasStatus_t s) { return cublasGetStatusName(s); }

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType_t at, int lda, const void* B,
                            cudaDataType_t bt, int ldb, const void* beta, void* C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                                    compute, CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void* alpha, const void* A, cudaDataType_t at, int lda,
                                          long long sa, const void* B, cudaDataType_t bt, int ldb, long long sb,
                                          const void* beta, void* C, cudaDataType_t ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (const cublasStatus_t st = check(h, ta, tb, m, n, k, alpha, at, lda, bt, ldb, beta, ct, ldc, compute, batch))
    return st;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  // Scalars are host memory (the default pointer mode): read them now.
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const size_t ea = at == CUDA_R_16BF ? 2 : 4, ec = ct == CUDA_R_16BF ? 2 : 4;
  const bool use_tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  // Every operand must lie in device memory, as far as the product reads
  // and writes it: on the GPU a shorter buffer is an illegal address.
  auto extent = [&](int rows, int cols, int ld, long long stride, size_t elem) {
    return (size_t(cols - 1) * size_t(ld) + size_t(rows) + size_t(batch - 1) * size_t(stride)) * elem;
  };
  const int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
  const int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
  const bool inside = (k == 0 || (zf::emu::device_range(A, extent(ar, ac, lda, sa, ea)) &&
                                  zf::emu::device_range(B, extent(br, bc, ldb, sb, ea)))) &&
                      zf::emu::device_range(C, extent(m, n, ldc, sc, ec));
  zf::emu::enqueue_on(h->stream, [=] {
    if (!inside) zf::emu::fault(cudaErrorIllegalAddress, "a cuBLAS product reaches past its operands' device memory");
    for (int i = 0; i < batch; ++i)
      gemm(ta, tb, m, n, k, al, static_cast<const char*>(A) + i * sa * ea, at, lda,
           static_cast<const char*>(B) + i * sb * ea, bt, ldb, be, static_cast<char*>(C) + i * sc * ec, ct, ldc,
           use_tf32);
  });
  return CUBLAS_STATUS_SUCCESS;
}
