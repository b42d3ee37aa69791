// kernels_cuda.h: the CUDA twins of kernels.h (every op of the model, forward
// and backward), AdamW on device, bf16 <-> float32 casts, and CudaContext, the
// per-rank handle (device, compute stream, cuBLAS) that the matrix products use.
// Implemented one op family a file, kernels_cuda_*.cu (kernels_cuda_util.cuh
// lists them); tested the same way, tests/cuda/test_kernels_cuda_*.cpp.
//
//   build/tests/test_gpu_kernels        (each kernel against its CPU twin; skips without a GPU)
//
// Conventions, as in kernels.h: shapes B, T, C, V, H, N = B*T; row-major,
// contiguous; Linear weights [OC, IC]; every backward ADDS (+=) into its
// gradients. All pointers are device pointers. Each op is enqueued on a
// stream and returns at once (no synchronisation, except when an op first
// needs more of its CudaContext's scratch: CudaContext::scratch); the
// caller's thread must have the op's device current (cudaSetDevice, which
// CudaContext does). Any size may be 0: the op then does nothing (a Linear
// with IC = 0 still sets out = bias, or 0, and adds dout's column sums to
// dbias).
// (The one exception to the +=: the cross-entropy backward WRITES, see there.)
//
// Precision. Each op is a template on F, the type of activations and
// parameters, instantiated for float and __nv_bfloat16 (and nothing else):
// - float: everything float32, like the CPU reference. Matrix products use
//   cuBLAS in plain float32 (TF32 tensor cores only if CudaContext::set_tf32).
// - __nv_bfloat16: tensors stored in bf16; every kernel computes and
//   accumulates in float32 and rounds once when it stores (cuBLAS with
//   CUBLAS_COMPUTE_32F). LayerNorm statistics, losses and the attention
//   scores before softmax stay float32.
// A backward into a bf16 gradient reads it, adds in float32 and rounds once.
//
// Determinism: no kernel uses float atomics, and every reduction has a fixed
// order, so results are the same bits from run to run on a given GPU and
// cuBLAS. (The order is the GPU's own, not the CPU twin's, except where a
// test says so: float32 results agree with the CPU within rounding.)
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "adamw.h"
#include "check.h"
#include "dtype.h"

// CUDA_CHECK(call) / CUBLAS_CHECK(call): throw zf::Error("file:line [rank r]
// CUDA error <name> (<text>) in <call>") when the call does not succeed.
// After a kernel launch, CUDA_CHECK(cudaGetLastError()) catches a bad launch
// configuration; errors inside a kernel surface at the next synchronising call.
#define CUDA_CHECK(call) ::zf::cuda_check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) ::zf::cublas_check((call), #call, __FILE__, __LINE__)

namespace zf {

inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess)
    fail_at(file, line,
            std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                ") in " + call);
}

inline void cublas_check(cublasStatus_t st, const char* call, const char* file, int line) {
  if (st != CUBLAS_STATUS_SUCCESS)
    fail_at(file, line,
            std::string("cuBLAS error ") + cublasGetStatusName(st) + " (" +
                cublasGetStatusString(st) + ") in " + call);
}

// "" when a CUDA device can be used; otherwise why not, in words
// (e.g. "cudaGetDeviceCount: no CUDA-capable device is detected").
std::string cuda_unavailable_reason();

// zf::bf16 (dtype.h, the host type) and __nv_bfloat16 have the same 16 bits.
static_assert(sizeof(bf16) == sizeof(__nv_bfloat16));
inline __nv_bfloat16* as_cuda(bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
inline const __nv_bfloat16* as_cuda(const bf16* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}

// Makes `device` current for the calling thread while in scope, then puts
// the previous one back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device_) CUDA_CHECK(cudaSetDevice(device_));
  }
  ~DeviceGuard() {
    if (prev_ >= 0 && prev_ != device_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int prev_ = -1;
};

// ---------------------------------------------------------------------------
// CudaContext: one rank's device, the compute stream its kernels run on, a
// cuBLAS handle bound to that stream, and a scratch buffer for the kernels
// that reduce in two passes. One per rank (per thread driving a GPU); not
// shared between threads. Neither cuBLAS's workspace (inside the handle) nor
// the scratch is counted by the memory tracker.
class CudaContext {
 public:
  // Makes `device` current for the calling thread. With stream == nullptr the
  // context creates (and later destroys) its own non-blocking stream;
  // otherwise it borrows `stream`.
  explicit CudaContext(int device = 0, cudaStream_t stream = nullptr);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }

  // float32 matrix products on TF32 tensor cores (10-bit mantissa inputs,
  // float32 accumulation): much faster, ~1e-3 relative error. Off by default.
  void set_tf32(bool on) { tf32_ = on; }
  bool tf32() const { return tf32_; }

  void synchronize() const { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // Device memory of at least `bytes` (256-byte aligned) for an op that runs
  // on stream(): the partial sums between the two passes of a column sum,
  // the embedding gradient's sorted positions. Ops on stream() run one after
  // the other, so each may reuse it; its contents mean nothing between ops.
  // Grown on demand, never shrunk: growing waits for stream() (a kernel
  // still running may use the old buffer) and reallocates, so it happens in
  // the first step, which meets every shape; later steps only reuse it. Its
  // size: the largest request, 768 KiB for gpt2 (64 slices x 3072 columns x
  // 4 bytes for c_fc's bias gradient; kernels_cuda_util.cuh).
  void* scratch(size_t bytes);
  size_t scratch_bytes() const { return scratch_bytes_; }

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = false;
  cublasHandle_t cublas_ = nullptr;
  bool tf32_ = false;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

// ---------------------------------------------------------------------------
// The ops, in kernels.h's order. F is float or __nv_bfloat16.

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
template <class F>
void encoder_forward_cuda(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T,
                          int C, cudaStream_t stream);
// Runs on ctx.stream() and uses ctx.scratch() (it sorts the positions by token).
template <class F>
void encoder_backward_cuda(CudaContext& ctx, F* dwte, F* dwpe, const F* dout,
                           const int32_t* tokens, int B, int T, int C);

// LayerNorm over the last dimension, eps 1e-5; mean[N], rstd[N] in float32.
template <class F>
void layernorm_forward_cuda(F* out, float* mean, float* rstd, const F* inp, const F* weight,
                            const F* bias, int N, int C, cudaStream_t stream);
// Runs on ctx.stream() and uses ctx.scratch() (dweight and dbias sum in two passes).
template <class F>
void layernorm_backward_cuda(CudaContext& ctx, F* dinp, F* dweight, F* dbias, const F* dout,
                             const F* inp, const F* weight, const float* mean, const float* rstd,
                             int N, int C);

// out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC]; bias may be null.
// Runs on ctx.stream().
template <class F>
void matmul_forward_cuda(CudaContext& ctx, F* out, const F* inp, const F* weight, const F* bias,
                         int N, int IC, int OC);
// dinp += dout @ weight; dweight += dout^T @ inp; dbias += column sums of dout.
// dinp and dbias may be null. Runs on ctx.stream(); dbias uses ctx.scratch().
template <class F>
void matmul_backward_cuda(CudaContext& ctx, F* dinp, F* dweight, F* dbias, const F* dout,
                          const F* inp, const F* weight, int N, int IC, int OC);

// Causal self-attention as in kernels.h: qkv[B,T,3C], out[B,T,C],
// att[B,H,T,T] the probabilities (0 above the diagonal). scratch: device
// memory of attention_scratch_floats_cuda(T, H) floats, overwritten by both
// forward and backward. Runs on ctx.stream().
size_t attention_scratch_floats_cuda(int T, int H);
template <class F>
void attention_forward_cuda(CudaContext& ctx, F* out, F* att, float* scratch, const F* qkv, int B,
                            int T, int C, int H);
template <class F>
void attention_backward_cuda(CudaContext& ctx, F* dqkv, float* scratch, const F* dout,
                             const F* qkv, const F* att, int B, int T, int C, int H);

// Flash-style causal self-attention (kernels_cuda_flash.cu): the same op,
// never storing a T x T matrix. The forward writes out[B,T,C] and lse[B,H,T]
// (float32: the log of each softmax's denominator, scores included scale);
// the backward needs the forward's out and lse, and scratch of
// flash_attention_scratch_floats(B, T, H) floats (overwritten), and adds into
// dqkv. Head size C/H at most 128 (a clear error otherwise); B*H <= 65535.
size_t flash_attention_scratch_floats(int B, int T, int H);  // (defined in flash_attention_cpu.cpp, both forms')
template <class F>
void flash_attention_forward_cuda(F* out, float* lse, const F* qkv, int B, int T, int C, int H,
                                  cudaStream_t stream);
template <class F>
void flash_attention_backward_cuda(F* dqkv, float* scratch, const F* dout, const F* out,
                                   const F* qkv, const float* lse, int B, int T, int C, int H,
                                   cudaStream_t stream);

// The same flash attention on tensor cores (kernels_cuda_flash_tc.cu), bf16
// only: the same arguments, outputs and scratch, with each tile's products in
// WMMA (bf16 inputs, float32 accumulation; the probabilities and their
// gradients rounded to bf16 before the products that take them, as in
// FlashAttention-2). Needs sm_80 or newer and, for head sizes over 64, more
// shared memory than some GPUs have: a clear error names the limit.
void flash_attention_tc_forward_cuda(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B,
                                     int T, int C, int H, cudaStream_t stream);
void flash_attention_tc_backward_cuda(__nv_bfloat16* dqkv, float* scratch, const __nv_bfloat16* dout,
                                      const __nv_bfloat16* out, const __nv_bfloat16* qkv,
                                      const float* lse, int B, int T, int C, int H,
                                      cudaStream_t stream);

// GELU, tanh approximation.
template <class F>
void gelu_forward_cuda(F* out, const F* inp, size_t n, cudaStream_t stream);
template <class F>
void gelu_backward_cuda(F* dinp, const F* inp, const F* dout, size_t n, cudaStream_t stream);

// out = a + b (out may alias a or b). Also the device-side reduction of
// gradient buffers (dst = dst + src).
template <class F>
void residual_forward_cuda(F* out, const F* a, const F* b, size_t n, cudaStream_t stream);

// Softmax + cross-entropy, fused, as in kernels.h: no probabilities stored.
// lse[N] and losses[N] are float32; targets in [0, V), not checked.
template <class F>
void softmax_cross_entropy_forward_cuda(float* lse, float* losses, const F* logits,
                                        const int32_t* targets, int N, int V, cudaStream_t stream);
// !!! WRITES (=), does not add: dlogits = (exp(logits - lse) - onehot(targets)) * dloss.
// dlogits may be logits itself (in place); otherwise they must not overlap.
template <class F>
void softmax_cross_entropy_backward_cuda(F* dlogits, const F* logits, const float* lse,
                                         const int32_t* targets, float dloss, int N, int V,
                                         cudaStream_t stream);

// ---------------------------------------------------------------------------
// AdamW on a flat range, the formula of adamw.h: float32 parameters (the
// master copy in the bf16 recipe) and moments, float32 or bf16 gradients (G
// is float or __nv_bfloat16). If param_bf16 is not null, the updated
// parameters are also written there rounded to bf16 (the compute copy).
template <class G>
void adamw_update_cuda(float* param, const G* grad, float* m, float* v, size_t n,
                       const AdamWConfig& cfg, long step, float grad_scale, bool decay,
                       cudaStream_t stream, __nv_bfloat16* param_bf16 = nullptr);

// bf16 <-> float32, the same bits as dtype.h's host conversions (round to
// nearest even; a NaN stays a NaN, with the same payload rule).
void bf16_to_float_cuda(const __nv_bfloat16* in, float* out, size_t n, cudaStream_t stream);
void float_to_bf16_cuda(const float* in, __nv_bfloat16* out, size_t n, cudaStream_t stream);

}  // namespace zf
