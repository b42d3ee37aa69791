// kernels_cuda_matmul.cu: the CUDA twins of kernels_cpu.cpp's matmul (a
// Linear layer) and causal self-attention, the two ops that go to cuBLAS,
// with the gemm helper they share. API and precision rules: kernels_cuda.h;
// shared helpers: kernels_cuda_util.cuh.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Matmul*:*Attention*'
//
// cuBLAS is column-major and our tensors are row-major: a row-major [R, K]
// matrix is the column-major [K, R] matrix with the same bytes, i.e. its
// transpose. So row-major Y = X W^T is computed as column-major Y^T = W X^T,
// and each call below says which product it computes in row-major terms.
#include "kernels_cuda.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels_cuda_util.cuh"

namespace zf {

using namespace cuda_impl;

namespace {

// ---------------------------------------------------------------------------
// The gemm helper

// cuBLAS's names for our element types.
template <class F> constexpr cudaDataType_t cuda_type();
template <> constexpr cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }

// Always float32 accumulation; TF32 inputs only for float32 when asked for.
template <class F>
cublasComputeType_t compute_type(const CudaContext& ctx) {
  if (std::is_same_v<F, float> && ctx.tf32()) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;
}

// Column-major C[m,n] = alpha op(A) op(B) + beta C, A and B of type F, C of
// type Out (F, or float32 for attention scores), batch_count products with
// the given strides between consecutive A, B and C matrices.
template <class F, class Out>
void gemm(CudaContext& ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
          float alpha, const F* A, int lda, long long stride_a, const F* B, int ldb,
          long long stride_b, float beta, Out* C, int ldc, long long stride_c,
          int batch_count = 1) {
  if (m == 0 || n == 0 || batch_count == 0) return;
  if (batch_count == 1)
    CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), ta, tb, m, n, k, &alpha, A, cuda_type<F>(), lda, B,
                              cuda_type<F>(), ldb, &beta, C, cuda_type<Out>(), ldc,
                              compute_type<F>(ctx), CUBLAS_GEMM_DEFAULT));
  else
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        ctx.cublas(), ta, tb, m, n, k, &alpha, A, cuda_type<F>(), lda, stride_a, B,
        cuda_type<F>(), ldb, stride_b, &beta, C, cuda_type<Out>(), ldc, stride_c, batch_count,
        compute_type<F>(ctx), CUBLAS_GEMM_DEFAULT));
}

}  // namespace

// ---------------------------------------------------------------------------
// Matmul (a Linear layer): out = inp @ weight^T + bias.
// Reference: matmul_forward, matmul_backward.

namespace {

// out[n, o] = bias[o], one thread per element: the starting value that
// cuBLAS then adds the product to (beta = 1), as the CPU does with sgemm.
template <class F>
__global__ void bias_broadcast_kernel(F* out, const F* bias, int N, int OC) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < size_t(N) * OC) out[i] = bias[i % OC];
}

// dbias[o] += sum over n of dout[n, o]: pass 1 of the two-pass column sums
// of kernels_cuda_util.cuh (as LayerNorm's dbias). Block (x, s) sums
// columns [32x, 32x + 32) over the rows of slice s into partial[s][o].
template <class F>
__global__ void __launch_bounds__(kColTile * kColRows)
    bias_backward_kernel(float* __restrict__ partial, const F* __restrict__ dout, int N, int OC,
                         int slice_rows) {
  ZF_STATIC_SHARED(float[kColRows][kColTile], shared);
  const int o = blockIdx.x * kColTile + threadIdx.x;
  const int row0 = blockIdx.y * slice_rows, row_end = min(N, row0 + slice_rows);
  float db = 0.0f;
  if (o < OC) {
    // Unrolled so that the loads of several rows are in flight together.
#pragma unroll 4
    for (int n = row0 + threadIdx.y; n < row_end; n += kColRows)
      db += load(dout, size_t(n) * OC + o);
  }
  db = column_tree_sum(db, shared);
  if (threadIdx.y == 0 && o < OC) partial[size_t(blockIdx.y) * OC + o] = db;
}

}  // namespace

template <class F>
void matmul_forward_cuda(CudaContext& ctx, F* out, const F* inp, const F* weight, const F* bias,
                         int N, int IC, int OC) {
  if (N == 0 || OC == 0) return;
  if (bias) {
    cuda_impl::launch(bias_broadcast_kernel<F>, blocks_for(size_t(N) * OC, kBlock), kBlock, 0, ctx.stream(),
                      out, bias, N, OC);
    CUDA_CHECK_LAUNCH();
  }
  if (IC == 0) {
    // An empty product: out = bias (just written), or 0. cuBLAS would
    // reject this gemm (its leading dimensions IC must be at least 1).
    if (!bias) CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(N) * OC * sizeof(F), ctx.stream()));
    return;
  }
  // Row-major out[N,OC] = inp[N,IC] weight[OC,IC]^T is column-major
  // out^T[OC,N] = weight[OC,IC] inp^T[IC,N]. Read column-major, the weight
  // buffer is weight^T (hence CUBLAS_OP_T) and the inp buffer is inp^T.
  // With beta = 0 cuBLAS never reads out (no bias: nothing to start from).
  gemm<F, F>(ctx, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, weight, IC, 0, inp, IC, 0,
             bias ? 1.0f : 0.0f, out, OC, 0);
}

template <class F>
void matmul_backward_cuda(CudaContext& ctx, F* dinp, F* dweight, F* dbias, const F* dout,
                          const F* inp, const F* weight, int N, int IC, int OC) {
  // IC == 0 still has a dbias to add to (as on the CPU): the two products
  // are then empty (m = IC = 0), and gemm returns before calling cuBLAS.
  if (N == 0 || OC == 0) return;
  // Row-major dinp[N,IC] += dout[N,OC] weight[OC,IC]: column-major
  // dinp^T[IC,N] += weight^T[IC,OC] dout^T[OC,N], both read as stored.
  if (dinp)
    gemm<F, F>(ctx, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, weight, IC, 0, dout, OC, 0, 1.0f,
               dinp, IC, 0);
  // Row-major dweight[OC,IC] += dout^T inp: column-major
  // dweight^T[IC,OC] += inp^T[IC,N] dout[N,OC], where the dout buffer read
  // column-major is dout^T[OC,N] (hence CUBLAS_OP_T).
  gemm<F, F>(ctx, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, 1.0f, inp, IC, 0, dout, OC, 0, 1.0f,
             dweight, IC, 0);
  if (dbias) {
    const ColumnSlices sl = column_slices(N);
    float* partial = static_cast<float*>(ctx.scratch(column_scratch_bytes(1, N, OC)));
    const dim3 grid(blocks_for(OC, kColTile), sl.count);
    cuda_impl::launch(bias_backward_kernel<F>, grid, dim3(kColTile, kColRows), 0, ctx.stream(), partial, dout,
                      N, OC, sl.rows);
    CUDA_CHECK_LAUNCH();
    column_sums_finish<F>(dbias, nullptr, partial, sl.count, OC, ctx.stream());
  }
}

// ---------------------------------------------------------------------------
// Causal self-attention, the simple (not flash) form, as on the CPU: for each
// batch element b, the H heads' T x T score matrices are one strided-batched
// cuBLAS call (head h's Q, K, V are column blocks of qkv at h*hs, C + h*hs,
// 2C + h*hs, read in place with leading dimension 3C; consecutive heads are
// hs columns apart). Scores are computed over the full T x T (cuBLAS has no
// causal product) and the masked half is zeroed by the softmax kernels.
// Reference: attention_forward, attention_backward.
//
// scratch holds, for one batch element at a time:
//   [0, H*T*T) floats        float32 scores (forward) / datt (backward)
//   then H*T*T elements of F  dpre (backward), the softmax gradient
size_t attention_scratch_floats_cuda(int T, int H) { return 2 * size_t(H) * T * T; }

namespace {

// Causal softmax of one batch element's scores [H*T rows, T]: one warp per
// row r = h*T + i (query position i sees keys 0..i), kRowsPerBlock rows a
// block, lane l handling columns l, l + 32, ... Writes every column of att:
// probabilities up to the diagonal, exact zeros after it.
template <class F>
__global__ void causal_softmax_forward_kernel(F* att, const float* preatt, int rows, int T) {
  const int lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int i = r % T;
  const float* x = preatt + size_t(r) * T;
  F* a = att + size_t(r) * T;
  float mx = -INFINITY;
  for (int j = lane; j <= i; j += kWarp) mx = fmaxf(mx, x[j]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int j = lane; j <= i; j += kWarp) sum += expf(x[j] - mx);
  const float inv = 1.0f / warp_sum(sum);
  for (int j = lane; j < T; j += kWarp) store(a, j, j <= i ? expf(x[j] - mx) * inv : 0.0f);
}

// Softmax backward, same layout: dpre = att * (datt - sum_j att * datt) on
// and below the diagonal, 0 above it (where att is 0).
template <class F>
__global__ void causal_softmax_backward_kernel(F* dpre, const F* att, const float* datt, int rows,
                                               int T) {
  const int lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int i = r % T;
  const F* a = att + size_t(r) * T;
  const float* d = datt + size_t(r) * T;
  F* dp = dpre + size_t(r) * T;
  float dot = 0.0f;
  for (int j = lane; j <= i; j += kWarp) dot += load(a, j) * d[j];
  dot = warp_sum(dot);
  for (int j = lane; j < T; j += kWarp) store(dp, j, j <= i ? load(a, j) * (d[j] - dot) : 0.0f);
}

}  // namespace

template <class F>
void attention_forward_cuda(CudaContext& ctx, F* out, F* att, float* scratch, const F* qkv, int B,
                            int T, int C, int H) {
  REQUIRE(H > 0 && C % H == 0, "attention: C = " << C << " is not a multiple of H = " << H);
  if (B == 0 || T == 0) return;
  const int hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  const long long TT = (long long)T * T;
  float* preatt = scratch;
  for (int b = 0; b < B; ++b) {
    const F* q = qkv + size_t(b) * T * C3;
    const F* k = q + C;
    const F* v = q + 2 * C;
    F* a = att + size_t(b) * H * TT;
    F* o = out + size_t(b) * T * C;
    // preatt_h[T,T] = scale Q_h K_h^T (row-major), i.e. column-major
    // preatt_h^T = scale K_h Q_h^T: A = K_h transposed, B = Q_h, float32 out.
    gemm<F, float>(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, k, C3, hs, q, C3, hs, 0.0f,
                   preatt, T, TT, H);
    cuda_impl::launch(causal_softmax_forward_kernel<F>, blocks_for(size_t(H) * T, kRowsPerBlock), kBlock, 0,
                      ctx.stream(), a, preatt, H * T, T);
    CUDA_CHECK_LAUNCH();
    // out_h[T,hs] = att_h V_h, written in place into out's columns h*hs..:
    // column-major out_h^T = V_h^T att_h^T, both read as stored.
    gemm<F, F>(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, C3, hs, a, T, TT, 0.0f, o, C, hs,
               H);
  }
}

// Backward of out = softmax(scale Q K^T) V, per batch element, all heads at once:
//   datt = dout V^T                 dV += att^T dout
//   dpre = att * (datt - rowsum(att * datt))
//   dQ += scale dpre K              dK += scale dpre^T Q
template <class F>
void attention_backward_cuda(CudaContext& ctx, F* dqkv, float* scratch, const F* dout,
                             const F* qkv, const F* att, int B, int T, int C, int H) {
  REQUIRE(H > 0 && C % H == 0, "attention: C = " << C << " is not a multiple of H = " << H);
  if (B == 0 || T == 0) return;
  const int hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  const long long TT = (long long)T * T;
  float* datt = scratch;
  F* dpre = reinterpret_cast<F*>(scratch + size_t(H) * TT);
  for (int b = 0; b < B; ++b) {
    const F* q = qkv + size_t(b) * T * C3;
    const F* k = q + C;
    const F* v = q + 2 * C;
    F* dq = dqkv + size_t(b) * T * C3;
    F* dk = dq + C;
    F* dv = dq + 2 * C;
    const F* a = att + size_t(b) * H * TT;
    const F* dy = dout + size_t(b) * T * C;
    // datt_h[T,T] = dout_h V_h^T: column-major datt^T = V_h dout_h^T, float32 out.
    gemm<F, float>(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, C3, hs, dy, C, hs, 0.0f,
                   datt, T, TT, H);
    // dV_h[T,hs] += att_h^T dout_h: column-major dV^T += dout_h^T att_h.
    gemm<F, F>(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dy, C, hs, a, T, TT, 1.0f, dv, C3,
               hs, H);
    cuda_impl::launch(causal_softmax_backward_kernel<F>, blocks_for(size_t(H) * T, kRowsPerBlock), kBlock, 0,
                      ctx.stream(), dpre, a, datt, H * T, T);
    CUDA_CHECK_LAUNCH();
    // dQ_h += scale dpre_h K_h: column-major dQ^T += scale K_h^T dpre_h^T.
    gemm<F, F>(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, k, C3, hs, dpre, T, TT, 1.0f, dq,
               C3, hs, H);
    // dK_h += scale dpre_h^T Q_h: column-major dK^T += scale Q_h^T dpre_h.
    gemm<F, F>(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, q, C3, hs, dpre, T, TT, 1.0f, dk,
               C3, hs, H);
  }
}

// ---------------------------------------------------------------------------
// The instantiations the header promises: F = float and __nv_bfloat16.

#define ZF_INSTANTIATE(F)                                                                         \
  template void matmul_forward_cuda<F>(CudaContext&, F*, const F*, const F*, const F*, int, int, \
                                       int);                                                     \
  template void matmul_backward_cuda<F>(CudaContext&, F*, F*, F*, const F*, const F*, const F*,  \
                                        int, int, int);                                          \
  template void attention_forward_cuda<F>(CudaContext&, F*, F*, float*, const F*, int, int, int, \
                                          int);                                                  \
  template void attention_backward_cuda<F>(CudaContext&, F*, float*, const F*, const F*,         \
                                           const F*, int, int, int, int);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)
#undef ZF_INSTANTIATE

}  // namespace zf
