// kernels_cuda.cu: the CUDA twins of kernels_cpu.cpp (see kernels_cuda.h for
// the API and the precision rules), in the same order: encoder, layernorm,
// matmul, attention, gelu, residual, softmax + cross-entropy; then AdamW, the
// bf16 casts and CudaContext.
//
//   build/tests/test_gpu_kernels      (every kernel against its CPU twin)
//
// Each op has, in this order (llm.c's layout): a "Reference:" line naming the
// CPU function it must agree with, the kernel(s) with the thread-block layout
// written above each, and the launcher that the header declares.
//
// What to look for when reading:
// - Everything is plain CUDA C++: one thread per element for elementwise ops,
//   one warp (32 threads) per row for row-wise ops (LayerNorm, causal
//   softmax), one block per row when rows are long (the vocabulary softmax).
// - Matrix products, attention's included, go to cuBLAS (cublasGemmEx and
//   its strided-batched form) with float32 accumulation. cuBLAS is
//   column-major and our tensors are row-major: a row-major [R, K] matrix is
//   the column-major [K, R] matrix with the same bytes, i.e. its transpose.
//   So row-major Y = X W^T is computed as column-major Y^T = W X^T, and each
//   call below says which product it computes in row-major terms.
// - No atomics anywhere: sums over rows (weight gradients, bias gradients)
//   are split among threads in a fixed pattern and combined in a fixed
//   order, so every run gives the same bits. That costs some speed in the
//   few kernels that reduce over B*T rows; they are a small share of a step.
// - bf16 tensors are read into float32, computed on in float32 and rounded
//   once when stored (load/store below).
#include "kernels_cuda.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace zf {

namespace {

// ---------------------------------------------------------------------------
// Helpers

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Elementwise kernels: 256 threads a block, one thread per element.
constexpr int kBlock = 256;

// Blocks needed to give each of n items one of per_block threads.
unsigned blocks_for(size_t n, size_t per_block) {
  const size_t blocks = (n + per_block - 1) / per_block;
  REQUIRE(blocks <= 0x7fffffffu, "CUDA grid of " << blocks << " blocks is too large");
  return unsigned(blocks);
}

// Kernel launches report a bad configuration through cudaGetLastError.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

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
__device__ float block_sum(float x, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  x = warp_sum(x);
  __syncthreads();  // shared may still be in use by the previous reduction
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  return warp_sum(lane < int(blockDim.x / kWarp) ? shared[lane] : 0.0f);
}
__device__ float block_max(float x, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  return warp_max(lane < int(blockDim.x / kWarp) ? shared[lane] : -INFINITY);
}

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

// ---------------------------------------------------------------------------
// Encoder: token embedding + position embedding.
// Reference: encoder_forward, encoder_backward (kernels_cpu.cpp).

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

// dwte[v,c] += dout[n,c] for every position n holding token v. Several
// positions may hold the same token, so a thread per position would race.
// Instead the vocabulary is dealt into kEncoderSlices slices (v mod slices):
// block (x, s) owns channels [256x, 256x + 256) of the tokens of slice s and
// walks all N positions in order, adding those whose token is in its slice.
// Every dwte element has exactly one owner thread (no races, no atomics) and
// is updated in position order, as on the CPU. The test `tok % slices == s`
// is the same for the whole block, so threads never diverge.
constexpr int kEncoderSlices = 64;

template <class F>
__global__ void encoder_backward_wte_kernel(F* dwte, const F* dout, const int32_t* tokens, int N,
                                            int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int slice = blockIdx.y;
  if (c >= C) return;
  for (int n = 0; n < N; ++n) {
    const int tok = tokens[n];
    if (tok % kEncoderSlices != slice) continue;
    const size_t i = size_t(tok) * C + c;
    store(dwte, i, load(dwte, i) + load(dout, size_t(n) * C + c));
  }
}

}  // namespace

template <class F>
void encoder_forward_cuda(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T,
                          int C, cudaStream_t stream) {
  const size_t n = size_t(B) * T * C;
  if (n == 0) return;
  encoder_forward_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(out, tokens, wte, wpe,
                                                                      B * T, T, C);
  CUDA_CHECK_LAUNCH();
}

template <class F>
void encoder_backward_cuda(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T,
                           int C, cudaStream_t stream) {
  if (size_t(B) * T * C == 0) return;
  encoder_backward_wpe_kernel<<<blocks_for(size_t(T) * C, kBlock), kBlock, 0, stream>>>(
      dwpe, dout, B, T, C);
  CUDA_CHECK_LAUNCH();
  const dim3 grid(blocks_for(C, kBlock), kEncoderSlices);
  encoder_backward_wte_kernel<<<grid, kBlock, 0, stream>>>(dwte, dout, tokens, B * T, C);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// LayerNorm: out = (x - mean) * rstd * weight + bias, row by row.
// Reference: layernorm_forward, layernorm_backward.

namespace {

// Row kernels: one warp per row, kRowsPerBlock rows a block; lane l handles
// channels l, l + 32, ... so a warp reads 32 consecutive values at a time.
constexpr int kRowsPerBlock = kBlock / kWarp;

template <class F>
__global__ void layernorm_forward_kernel(F* out, float* mean, float* rstd, const F* inp,
                                         const F* weight, const F* bias, int N, int C) {
  const int lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (n >= N) return;  // the whole warp leaves together: n is the warp's row
  const F* x = inp + size_t(n) * C;
  F* o = out + size_t(n) * C;
  // Two passes (mean, then squared deviations), as on the CPU: no
  // cancellation as with E[x^2] - mean^2.
  float s = 0.0f;
  for (int c = lane; c < C; c += kWarp) s += load(x, c);
  const float m = warp_sum(s) / float(C);
  float v = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float d = load(x, c) - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / float(C) + 1e-5f);
  for (int c = lane; c < C; c += kWarp)
    store(o, c, (load(x, c) - m) * r * load(weight, c) + load(bias, c));
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

// dinp, one warp per row. With xhat = (x - mean) * rstd and g = dout * weight:
//   dx += rstd * (g - mean(g) - xhat * mean(g * xhat)).
template <class F>
__global__ void layernorm_backward_input_kernel(F* dinp, const F* dout, const F* inp,
                                                const F* weight, const float* mean,
                                                const float* rstd, int N, int C) {
  const int lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (n >= N) return;
  const F* x = inp + size_t(n) * C;
  const F* d = dout + size_t(n) * C;
  F* dx = dinp + size_t(n) * C;
  const float m = mean[n], r = rstd[n];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float g = load(d, c) * load(weight, c);
    g_sum += g;
    gx_sum += g * ((load(x, c) - m) * r);
  }
  const float g_mean = warp_sum(g_sum) / float(C);
  const float gx_mean = warp_sum(gx_sum) / float(C);
  for (int c = lane; c < C; c += kWarp) {
    const float xhat = (load(x, c) - m) * r;
    const float g = load(d, c) * load(weight, c);
    store(dx, c, load(dx, c) + r * (g - g_mean - xhat * gx_mean));
  }
}

// Sums over the N rows, for each column c (dweight, dbias). A block of
// 32 x 32 threads owns 32 columns: thread (x, y) sums column 32*blockIdx.x + x
// over rows y, y + 32, y + 64, ... (each row read 32 columns at a time, so
// coalesced), then the 32 partial sums of each column are added in shared
// memory by a fixed tree (y with y + 16, then y + 8, ...).
constexpr int kColTile = 32;

template <class F>
__global__ void layernorm_backward_params_kernel(F* dweight, F* dbias, const F* dout, const F* inp,
                                                 const float* mean, const float* rstd, int N,
                                                 int C) {
  __shared__ float sw[kColTile][kColTile], sb[kColTile][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kColTile + tx;
  float dw = 0.0f, db = 0.0f;
  if (c < C)
    for (int n = ty; n < N; n += kColTile) {
      const size_t i = size_t(n) * C + c;
      const float d = load(dout, i);
      dw += d * ((load(inp, i) - mean[n]) * rstd[n]);
      db += d;
    }
  sw[ty][tx] = dw;
  sb[ty][tx] = db;
  __syncthreads();
  for (int s = kColTile / 2; s > 0; s /= 2) {
    if (ty < s) {
      sw[ty][tx] += sw[ty + s][tx];
      sb[ty][tx] += sb[ty + s][tx];
    }
    __syncthreads();
  }
  if (ty == 0 && c < C) {
    store(dweight, c, load(dweight, c) + sw[0][tx]);
    store(dbias, c, load(dbias, c) + sb[0][tx]);
  }
}

}  // namespace

template <class F>
void layernorm_forward_cuda(F* out, float* mean, float* rstd, const F* inp, const F* weight,
                            const F* bias, int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  layernorm_forward_kernel<<<blocks_for(N, kRowsPerBlock), kBlock, 0, stream>>>(
      out, mean, rstd, inp, weight, bias, N, C);
  CUDA_CHECK_LAUNCH();
}

template <class F>
void layernorm_backward_cuda(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp,
                             const F* weight, const float* mean, const float* rstd, int N, int C,
                             cudaStream_t stream) {
  if (N == 0) return;
  layernorm_backward_input_kernel<<<blocks_for(N, kRowsPerBlock), kBlock, 0, stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  layernorm_backward_params_kernel<<<blocks_for(C, kColTile), dim3(kColTile, kColTile), 0,
                                     stream>>>(dweight, dbias, dout, inp, mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
}

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

// dbias[o] += sum over n of dout[n, o]: the column sums of
// layernorm_backward_params_kernel (same 32 x 32 block layout).
template <class F>
__global__ void bias_backward_kernel(F* dbias, const F* dout, int N, int OC) {
  __shared__ float sb[kColTile][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int o = blockIdx.x * kColTile + tx;
  float db = 0.0f;
  if (o < OC)
    for (int n = ty; n < N; n += kColTile) db += load(dout, size_t(n) * OC + o);
  sb[ty][tx] = db;
  __syncthreads();
  for (int s = kColTile / 2; s > 0; s /= 2) {
    if (ty < s) sb[ty][tx] += sb[ty + s][tx];
    __syncthreads();
  }
  if (ty == 0 && o < OC) store(dbias, o, load(dbias, o) + sb[0][tx]);
}

}  // namespace

template <class F>
void matmul_forward_cuda(CudaContext& ctx, F* out, const F* inp, const F* weight, const F* bias,
                         int N, int IC, int OC) {
  if (N == 0 || OC == 0) return;
  if (bias) {
    bias_broadcast_kernel<<<blocks_for(size_t(N) * OC, kBlock), kBlock, 0, ctx.stream()>>>(
        out, bias, N, OC);
    CUDA_CHECK_LAUNCH();
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
  if (N == 0 || OC == 0 || IC == 0) return;
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
    bias_backward_kernel<<<blocks_for(OC, kColTile), dim3(kColTile, kColTile), 0,
                           ctx.stream()>>>(dbias, dout, N, OC);
    CUDA_CHECK_LAUNCH();
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
    causal_softmax_forward_kernel<<<blocks_for(size_t(H) * T, kRowsPerBlock), kBlock, 0,
                                    ctx.stream()>>>(a, preatt, H * T, T);
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
    causal_softmax_backward_kernel<<<blocks_for(size_t(H) * T, kRowsPerBlock), kBlock, 0,
                                     ctx.stream()>>>(dpre, a, datt, H * T, T);
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
// GELU, tanh approximation, as x * sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715 x^3)
// (0.5 (1 + tanh u) = sigmoid(2u): one exp, and no cancellation in 1 + tanh u
// for negative x). Reference: gelu_forward, gelu_backward.

namespace {

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

// One thread per element.
template <class F>
__global__ void gelu_forward_kernel(F* out, const F* inp, size_t n) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = load(inp, i);
  const float u2 = 2.0f * kGeluS * (x + kGeluA * x * x * x);
  store(out, i, x / (1.0f + expf(-u2)));
}

// d/dx [x s] = s + 2 x s (1 - s) u', s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3a x^2).
template <class F>
__global__ void gelu_backward_kernel(F* dinp, const F* inp, const F* dout, size_t n) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = load(inp, i);
  const float u2 = 2.0f * kGeluS * (x + kGeluA * x * x * x);
  const float s = 1.0f / (1.0f + expf(-u2));
  const float du = kGeluS * (1.0f + 3.0f * kGeluA * x * x);
  store(dinp, i, load(dinp, i) + load(dout, i) * (s + 2.0f * x * s * (1.0f - s) * du));
}

// out = a + b, one thread per element (each reads its a and b before writing,
// so out may alias either).
template <class F>
__global__ void residual_forward_kernel(F* out, const F* a, const F* b, size_t n) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) store(out, i, load(a, i) + load(b, i));
}

}  // namespace

template <class F>
void gelu_forward_cuda(F* out, const F* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(out, inp, n);
  CUDA_CHECK_LAUNCH();
}

template <class F>
void gelu_backward_cuda(F* dinp, const F* inp, const F* dout, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_backward_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, n);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// Residual add. Reference: residual_forward.

template <class F>
void residual_forward_cuda(F* out, const F* a, const F* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  residual_forward_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(out, a, b, n);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// Softmax and cross-entropy, fused (the head's last step).
// Reference: softmax_cross_entropy_forward, softmax_cross_entropy_backward.

namespace {

// One block of kSoftmaxThreads threads per row n (a row is V long: 50304 for
// gpt2, so a warp alone would be slow): thread j reads columns j, j + 512, ...
// (coalesced). Three passes over the row: max, sum of exps, write.
constexpr int kSoftmaxThreads = 512;

template <class F>
__global__ void softmax_cross_entropy_forward_kernel(F* probs, float* losses, const F* logits,
                                                     const int32_t* targets, int V) {
  __shared__ float shared[kWarp];
  const int n = blockIdx.x;
  const F* x = logits + size_t(n) * V;
  F* p = probs + size_t(n) * V;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, load(x, j));
  mx = block_max(mx, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(load(x, j) - mx);
  sum = block_sum(sum, shared);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < V; j += blockDim.x) store(p, j, expf(load(x, j) - mx) * inv);
  // -log p[t] = log(sum) - (x[t] - max): finite even when p[t] underflows to 0.
  if (threadIdx.x == 0) losses[n] = logf(sum) - (load(x, targets[n]) - mx);
}

// One thread per element of [N, V]: dlogits += (probs - [j == target]) * dloss.
template <class F>
__global__ void softmax_cross_entropy_backward_kernel(F* dlogits, const F* probs,
                                                      const int32_t* targets, float dloss, int N,
                                                      int V) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(N) * V) return;
  const int n = int(i / V), j = int(i % V);
  const float p = load(probs, i);
  const float g = (j == targets[n] ? p - 1.0f : p) * dloss;
  store(dlogits, i, load(dlogits, i) + g);
}

}  // namespace

template <class F>
void softmax_cross_entropy_forward_cuda(F* probs, float* losses, const F* logits,
                                        const int32_t* targets, int N, int V,
                                        cudaStream_t stream) {
  if (N == 0) return;
  softmax_cross_entropy_forward_kernel<<<N, kSoftmaxThreads, 0, stream>>>(probs, losses, logits,
                                                                          targets, V);
  CUDA_CHECK_LAUNCH();
}

template <class F>
void softmax_cross_entropy_backward_cuda(F* dlogits, const F* probs, const int32_t* targets,
                                         float dloss, int N, int V, cudaStream_t stream) {
  const size_t n = size_t(N) * V;
  if (n == 0) return;
  softmax_cross_entropy_backward_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(
      dlogits, probs, targets, dloss, N, V);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// AdamW (formula in adamw.h). Reference: adamw_update (adamw.cpp).

namespace {

// float32 -> bf16 bits exactly as dtype.h's float_to_bf16: round to nearest
// even; a NaN keeps its top bits and is made quiet (so it cannot round to inf).
__device__ __forceinline__ __nv_bfloat16 bf16_round(float f) {
  const uint32_t x = __float_as_uint(f);
  __nv_bfloat16_raw r;
  if ((x & 0x7fffffffu) > 0x7f800000u)
    r.x = uint16_t((x >> 16) | 0x40u);
  else
    r.x = uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  return __nv_bfloat16(r);
}

// One thread per element; the step's scalars come from the host, computed
// there in double as adamw.cpp does.
template <class G>
__global__ void adamw_kernel(float* param, const G* grad, float* m, float* v, size_t n, float b1,
                             float b2, float eps, float decay_factor, float bias2_sqrt,
                             float step_size, float grad_scale, __nv_bfloat16* param_bf16) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float g = load(grad, i) * grad_scale;
  const float p = param[i] * decay_factor;
  const float mi = m[i] + (1.0f - b1) * (g - m[i]);
  const float vi = v[i] * b2 + (1.0f - b2) * g * g;
  const float denom = sqrtf(vi) / bias2_sqrt + eps;
  const float p_new = p - step_size * (mi / denom);
  param[i] = p_new;
  m[i] = mi;
  v[i] = vi;
  if (param_bf16) param_bf16[i] = bf16_round(p_new);
}

}  // namespace

template <class G>
void adamw_update_cuda(float* param, const G* grad, float* m, float* v, size_t n,
                       const AdamWConfig& cfg, long step, float grad_scale, bool decay,
                       cudaStream_t stream, __nv_bfloat16* param_bf16) {
  if (n == 0) return;
  const float decay_factor = decay ? 1.0f - cfg.lr * cfg.weight_decay : 1.0f;
  const double bias1 = 1.0 - std::pow(double(cfg.beta1), double(step));
  const float bias2_sqrt = float(std::sqrt(1.0 - std::pow(double(cfg.beta2), double(step))));
  const float step_size = float(double(cfg.lr) / bias1);
  adamw_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(
      param, grad, m, v, n, cfg.beta1, cfg.beta2, cfg.eps, decay_factor, bias2_sqrt, step_size,
      grad_scale, param_bf16);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------
// bf16 <-> float32. Reference: bf16_to_float, float_to_bf16 (dtype.cpp).

namespace {

// One thread per element.
__global__ void bf16_to_float_kernel(const __nv_bfloat16* in, float* out, size_t n) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __bfloat162float(in[i]);  // exact: the bits shifted up
}

__global__ void float_to_bf16_kernel(const float* in, __nv_bfloat16* out, size_t n) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = bf16_round(in[i]);
}

}  // namespace

void bf16_to_float_cuda(const __nv_bfloat16* in, float* out, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  bf16_to_float_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(in, out, n);
  CUDA_CHECK_LAUNCH();
}

void float_to_bf16_cuda(const float* in, __nv_bfloat16* out, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  float_to_bf16_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(in, out, n);
  CUDA_CHECK_LAUNCH();
}

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

// ---------------------------------------------------------------------------
// The instantiations the header promises: F = float and __nv_bfloat16.

#define ZF_INSTANTIATE(F)                                                                         \
  template void encoder_forward_cuda<F>(F*, const int32_t*, const F*, const F*, int, int, int,   \
                                        cudaStream_t);                                           \
  template void encoder_backward_cuda<F>(F*, F*, const F*, const int32_t*, int, int, int,        \
                                         cudaStream_t);                                          \
  template void layernorm_forward_cuda<F>(F*, float*, float*, const F*, const F*, const F*, int, \
                                          int, cudaStream_t);                                    \
  template void layernorm_backward_cuda<F>(F*, F*, F*, const F*, const F*, const F*,             \
                                           const float*, const float*, int, int, cudaStream_t);  \
  template void matmul_forward_cuda<F>(CudaContext&, F*, const F*, const F*, const F*, int, int, \
                                       int);                                                     \
  template void matmul_backward_cuda<F>(CudaContext&, F*, F*, F*, const F*, const F*, const F*,  \
                                        int, int, int);                                          \
  template void attention_forward_cuda<F>(CudaContext&, F*, F*, float*, const F*, int, int, int, \
                                          int);                                                  \
  template void attention_backward_cuda<F>(CudaContext&, F*, float*, const F*, const F*,         \
                                           const F*, int, int, int, int);                        \
  template void gelu_forward_cuda<F>(F*, const F*, size_t, cudaStream_t);                        \
  template void gelu_backward_cuda<F>(F*, const F*, const F*, size_t, cudaStream_t);             \
  template void residual_forward_cuda<F>(F*, const F*, const F*, size_t, cudaStream_t);          \
  template void softmax_cross_entropy_forward_cuda<F>(F*, float*, const F*, const int32_t*, int, \
                                                      int, cudaStream_t);                        \
  template void softmax_cross_entropy_backward_cuda<F>(F*, const F*, const int32_t*, float, int, \
                                                       int, cudaStream_t);                       \
  template void adamw_update_cuda<F>(float*, const F*, float*, float*, size_t,                   \
                                     const AdamWConfig&, long, float, bool, cudaStream_t,        \
                                     __nv_bfloat16*);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)

}  // namespace zf
