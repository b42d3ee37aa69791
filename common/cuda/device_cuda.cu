// device_cuda.cu: a rank's device on a GPU. Memory from the stream-ordered
// allocator (below), ops from
// kernels_cuda_*.cu on the rank's compute stream (CudaContext), in the compute
// dtype of device.h: float32 as on the CPU, or bf16 (what the bf16 recipe
// uses on a GPU by default: bf16 tensors, bf16 tensor-core matrix products,
// float32 accumulation).
//
// The exact gradient norm (gradnorm.h) is summed on the GPU in exponent bins
// (gradnorm_cuda.h); only 4 KiB of bins come back to the host per call.
//
// Memory: cudaMallocFromPoolAsync / cudaFreeAsync on the compute stream, from
// the GPU's default memory pool, which keeps what is freed (release
// threshold: all of it) for the next allocation. ZeRO-2/3 allocate and free a
// unit's buffers every unit of every step; cudaFree would stall the whole
// GPU each time (it waits for every stream, the communication stream's
// collectives included), and cudaMalloc goes to the driver. A free is an
// operation on the stream: the memory is reused only by work ordered after
// it, so the caller must have ordered the compute stream after every other
// stream that still uses the buffer: CommHandle::wait() does that for a
// collective (comm.h). The default pool, not one per rank: the virtual ranks
// that share a GPU (the threads backend) then share what is cached, and the
// threads backend grants the pool to the group's other GPUs where its kernels
// read across GPUs (comm_threads_cuda.cu; pool memory ignores
// cudaDeviceEnablePeerAccess). Out of memory: the allocation fails with
// cudaErrorMemoryAllocation (or cudaErrorInvalidValue: the API lists both
// and does not say which a size too large gets, so that one counts as out
// of memory too when the size is more than the GPU has free); allocate()
// then hands the pool's cached memory back to the driver (after a sync, so
// that this stream's frees count) and tries once more, and returns nullptr
// if that fails too, so the MemoryTracker raises its OutOfMemory
// (memory.h). A request larger than the whole GPU is refused without asking.
// A failed call also leaves its code as the thread's last error, which the
// next CUDA_CHECK(cudaGetLastError()) after a kernel launch would report:
// allocate() clears it.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#include "device.h"
#include "gradnorm_cuda.h"
#include "kernels_cuda.h"
#include "launch.cuh"

namespace zf {

namespace {

__global__ void fold_kernel(__nv_bfloat16* dst, const float* src, size_t n) {
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __float2bfloat16_rn(__bfloat162float(dst[i]) + src[i]);
}

__global__ void accumulate_kernel(float* dst, const __nv_bfloat16* src, size_t n) {
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += __bfloat162float(src[i]);
}

unsigned blocks_for(size_t n, unsigned threads) { return unsigned((n + threads - 1) / threads); }

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ctx_(ordinal), norm_scratch_(ordinal) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    name_ = "cuda:" + std::to_string(ordinal) + " " + prop.name;
    total_bytes_ = prop.totalGlobalMem;
    pool_ = memory_pool(ordinal, name_);
  }
  std::string name() const override { return name_; }
  bool is_cuda() const override { return true; }
  void* native_stream() const override { return ctx_.stream(); }
  void make_current() override { CUDA_CHECK(cudaSetDevice(ctx_.device())); }
  int ordinal() const override { return ctx_.device(); }

  // Stream-ordered (see the file comment): the buffer may be used by work
  // on the compute stream at once, by another stream only after an event
  // recorded on the compute stream after this call (as the communicators
  // do), and freed only once no other stream still touches it.
  void* allocate(size_t bytes) override {
    if (bytes > total_bytes_) return nullptr;  // can never fit: the tracker says so
    void* p = nullptr;
    cudaError_t err = cudaMallocFromPoolAsync(&p, bytes, pool_, s());
    if (refused_for_size(err, bytes)) {
      // The pool may hold freed blocks that do not fit this request: give
      // them back to the driver (once this stream's frees have completed: a
      // sync) and ask again.
      ctx_.synchronize();
      CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
      err = cudaMallocFromPoolAsync(&p, bytes, pool_, s());
      if (refused_for_size(err, bytes)) return nullptr;  // the tracker raises OutOfMemory
    }
    CUDA_CHECK(err);  // anything else is a real error
    return p;
  }
  // Called from destructors (a Tensor's, a staging buffer's), also while an
  // error unwinds the stack. After a sticky error (a kernel that faulted)
  // every CUDA call fails, cudaFreeAsync included: a throw from here would
  // then leave a destructor during unwinding, i.e. std::terminate, and the
  // error being reported (which op, which rank) would be lost behind this
  // one. So while an exception is in flight a failed free is only noted,
  // once; otherwise it raises as every CUDA call does.
  void release(void* p) override {
    const cudaError_t err = cudaFreeAsync(p, s());
    if (err == cudaSuccess) return;
    if (std::uncaught_exceptions() > 0) {
      (void)cudaGetLastError();
      if (!release_failed_) {
        release_failed_ = true;
        std::fprintf(stderr, "note: %s: cudaFreeAsync failed (%s) while an error is being raised; "
                     "its memory is left to the process's end\n",
                     name_.c_str(), cudaGetErrorName(err));
      }
      return;
    }
    CUDA_CHECK(err);
  }
  void zero(void* p, size_t bytes) override { CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s())); }
  void copy(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s()));
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s()));
    ctx_.synchronize();  // the host buffer may be reused as soon as we return
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s()));
    ctx_.synchronize();
  }
  void synchronize() override { ctx_.synchronize(); }

  void* allocate_pinned(size_t bytes, std::string* why) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      if (why) *why = std::string("cudaHostAlloc failed: ") + cudaGetErrorString(err);
      return nullptr;
    }
    std::memset(p, 0, bytes);
    return p;
  }
  void release_pinned(void* p, size_t) override {
    if (p) cudaFreeHost(p);  // unchecked: called from destructors
  }
  // On the copy stream: it waits for an event recorded on the compute stream
  // (a copy to the host reads what the ops issued before it wrote), and the
  // handle waits for the copy's own event. The copy is not timed (`record`
  // keeps the host's issue and wait only): --trace draws it from its issue
  // to the host's wait.
  Transfer copy_async(void* dst, const void* src, size_t bytes, bool to_device, CopyRecord*) override {
    if (!copy_stream_) CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    cudaEvent_t issued, done;
    CUDA_CHECK(cudaEventCreateWithFlags(&issued, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(issued, s()));
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, issued, 0));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                               copy_stream_));
    CUDA_CHECK(cudaEventRecord(done, copy_stream_));
    CUDA_CHECK(cudaEventDestroy(issued));  // released once the stream has passed it
    const int device = ctx_.device();
    return Transfer([done, device] {
      CUDA_CHECK(cudaSetDevice(device));
      const cudaError_t err = cudaEventSynchronize(done);
      cudaEventDestroy(done);
      CUDA_CHECK(err);
    });
  }

  // Marks are events from a pool that grows to the most marks held at once.
  size_t mark() override {
    if (next_mark_ == marks_.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      marks_.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(marks_[next_mark_], s()));
    return next_mark_++;
  }
  double elapsed_ms(size_t from, size_t to) override {
    REQUIRE(from < next_mark_ && to < next_mark_, "elapsed_ms: no such mark");
    CUDA_CHECK(cudaEventSynchronize(marks_[to]));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[from], marks_[to]));
    return ms;
  }
  void forget_marks() override { next_mark_ = 0; }
  ~CudaDevice() override {
    cudaSetDevice(ctx_.device());  // unchecked: a destructor must not throw
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
  }

  void widen(const bf16* in, float* out, size_t n) override { bf16_to_float_cuda(as_cuda(in), out, n, s()); }
  void narrow(const float* in, bf16* out, size_t n) override { float_to_bf16_cuda(in, as_cuda(out), n, s()); }
  void fold(bf16* dst, const float* src, size_t n) override {
    if (n == 0) return;
    cuda_impl::launch(fold_kernel, blocks_for(n, 256), 256, 0, s(), as_cuda(dst), src, n);
    CUDA_CHECK(cudaGetLastError());
  }
  void accumulate(float* dst, const bf16* src, size_t n) override {
    if (n == 0) return;
    cuda_impl::launch(accumulate_kernel, blocks_for(n, 256), 256, 0, s(), dst, as_cuda(src), n);
    CUDA_CHECK(cudaGetLastError());
  }
  void add(void* dst, const void* src, DType dtype, size_t n) override {
    if (dtype == DType::f32)
      residual_forward_cuda(static_cast<float*>(dst), static_cast<const float*>(dst),
                            static_cast<const float*>(src), n, s());
    else
      residual_forward_cuda(as_cuda(static_cast<bf16*>(dst)), as_cuda(static_cast<const bf16*>(dst)),
                            as_cuda(static_cast<const bf16*>(src)), n, s());
  }

  void adamw(float* param, const void* grad, DType gdt, float* m, float* v, size_t n, const AdamWConfig& cfg,
             long step, float scale, bool decay) override {
    if (gdt == DType::f32)
      adamw_update_cuda(param, static_cast<const float*>(grad), m, v, n, cfg, step, scale, decay, s());
    else
      adamw_update_cuda(param, as_cuda(static_cast<const bf16*>(grad)), m, v, n, cfg, step, scale, decay, s());
  }
  void sum_squares(const void* x, DType dtype, size_t n, SumOfSquares& acc) override {
    sum_squares_cuda(x, dtype, n, acc, norm_scratch_, s());  // the same bits as acc.add on the host
  }

  // Each op runs the kernel of the compute dtype (device.h): float, or
  // __nv_bfloat16 (bf16 storage, float32 arithmetic, cuBLAS on bf16 tensor
  // cores with float32 accumulation).
  void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                       int C) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      encoder_forward_cuda(ptr<F>(out), tokens, ptr<F>(wte), ptr<F>(wpe), B, T, C, s());
    });
  }
  void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                        int C) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      encoder_backward_cuda(ctx_, ptr<F>(dwte), ptr<F>(dwpe), ptr<F>(dout), tokens, B, T, C);
    });
  }
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                         const void* bias, int N, int C) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      layernorm_forward_cuda(ptr<F>(out), mean, rstd, ptr<F>(inp), ptr<F>(weight), ptr<F>(bias), N, C, s());
    });
  }
  void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                          const void* weight, const float* mean, const float* rstd, int N, int C) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      layernorm_backward_cuda(ctx_, ptr<F>(dinp), ptr<F>(dweight), ptr<F>(dbias), ptr<F>(dout),
                              ptr<F>(inp), ptr<F>(weight), mean, rstd, N, C);
    });
  }
  void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                      int OC) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      matmul_forward_cuda(ctx_, ptr<F>(out), ptr<F>(inp), ptr<F>(weight), ptr<F>(bias), N, IC, OC);
    });
  }
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int N, int IC, int OC) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      matmul_backward_cuda(ctx_, ptr<F>(dinp), ptr<F>(dweight), ptr<F>(dbias), ptr<F>(dout), ptr<F>(inp),
                           ptr<F>(weight), N, IC, OC);
    });
  }
  // Attention: the simple form (cuBLAS over the full T x T scores, the
  // probabilities kept) unless --attention flash: only each row's
  // log-sum-exp kept, on tensor cores with bf16 compute
  // (kernels_cuda_flash_tc.cu), on CUDA cores with float32 compute
  // (kernels_cuda_flash.cu: it saves memory, not time; bench/RESULTS.md).
  bool flash() const { return attention_ == AttentionForm::flash; }
  size_t attention_saved_bytes(int B, int T, int H) const override {
    return flash() ? size_t(B) * H * T * sizeof(float) : size_t(B) * H * T * T * dtype_size(compute_);
  }
  size_t attention_scratch_floats(int B, int T, int H) const override {
    return flash() ? flash_attention_scratch_floats(B, T, H) : attention_scratch_floats_cuda(T, H);
  }
  void attention_forward(void* out, void* saved, float* scratch, const void* qkv, int B, int T, int C,
                         int H) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      if (flash() && std::is_same_v<F, __nv_bfloat16>)
        flash_attention_tc_forward_cuda(ptr<__nv_bfloat16>(out), static_cast<float*>(saved),
                                        ptr<__nv_bfloat16>(qkv), B, T, C, H, s());
      else if (flash())
        flash_attention_forward_cuda(ptr<F>(out), static_cast<float*>(saved), ptr<F>(qkv), B, T, C, H, s());
      else
        attention_forward_cuda(ctx_, ptr<F>(out), ptr<F>(saved), scratch, ptr<F>(qkv), B, T, C, H);
    });
  }
  void attention_backward(void* dqkv, float* scratch, const void* dout, const void* out, const void* qkv,
                          const void* saved, int B, int T, int C, int H) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      if (flash() && std::is_same_v<F, __nv_bfloat16>)
        flash_attention_tc_backward_cuda(ptr<__nv_bfloat16>(dqkv), scratch, ptr<__nv_bfloat16>(dout),
                                         ptr<__nv_bfloat16>(out), ptr<__nv_bfloat16>(qkv),
                                         static_cast<const float*>(saved), B, T, C, H, s());
      else if (flash())
        flash_attention_backward_cuda(ptr<F>(dqkv), scratch, ptr<F>(dout), ptr<F>(out), ptr<F>(qkv),
                                      static_cast<const float*>(saved), B, T, C, H, s());
      else
        attention_backward_cuda(ctx_, ptr<F>(dqkv), scratch, ptr<F>(dout), ptr<F>(qkv), ptr<F>(saved), B, T, C,
                                H);
    });
  }
  void gelu_forward(void* out, const void* inp, size_t n) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      gelu_forward_cuda(ptr<F>(out), ptr<F>(inp), n, s());
    });
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      gelu_backward_cuda(ptr<F>(dinp), ptr<F>(inp), ptr<F>(dout), n, s());
    });
  }
  void residual_forward(void* out, const void* a, const void* b, size_t n) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      residual_forward_cuda(ptr<F>(out), ptr<F>(a), ptr<F>(b), n, s());
    });
  }
  void softmax_cross_entropy_forward(float* lse, float* losses, const void* logits, const int32_t* targets,
                                     int N, int V) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      softmax_cross_entropy_forward_cuda(lse, losses, ptr<F>(logits), targets, N, V, s());
    });
  }
  void softmax_cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                                      const int32_t* targets, float dloss, int N, int V) override {
    dispatch([&](auto f) {
      using F = decltype(f);
      softmax_cross_entropy_backward_cuda(ptr<F>(dlogits), ptr<F>(logits), lse, targets, dloss, N, V, s());
    });
  }

 private:
  cudaStream_t s() const { return ctx_.stream(); }

  // Whether a failed allocation of `bytes` was refused for want of memory
  // (see the file comment), after clearing the thread's last error, which
  // the failed call set (out of memory is not an error that corrupts the
  // context: the next calls work once it is cleared).
  static bool refused_for_size(cudaError_t err, size_t bytes) {
    if (err == cudaSuccess) return false;
    (void)cudaGetLastError();
    if (err == cudaErrorMemoryAllocation) return true;
    size_t free_bytes = 0, total_bytes = 0;
    if (err != cudaErrorInvalidValue || cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return bytes > free_bytes;
  }

  // The GPU's default memory pool, told to keep what is freed (shared by
  // every CudaDevice on this GPU: setting it again is harmless).
  static cudaMemPool_t memory_pool(int ordinal, const std::string& name) {
    int supported = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, ordinal));
    REQUIRE(supported, name << " does not support the stream-ordered allocator (cudaMallocAsync: "
                            "CUDA 11.2 or later, and a driver and GPU that have memory pools)");
    cudaMemPool_t pool = nullptr;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ordinal));
    // The attribute is a cuuint64_t: bytes the pool may keep before it hands
    // memory back to the driver at a sync. All: a step reuses what the last
    // one freed, without calling the driver.
    uint64_t keep_all = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
    return pool;
  }

  // Calls fn with a value of the compute dtype's CUDA type (float or
  // __nv_bfloat16), so one body serves both instantiations.
  template <class Fn>
  void dispatch(Fn&& fn) {
    if (compute_ == DType::f32) fn(float{});
    else fn(__nv_bfloat16{});
  }
  template <class F>
  static F* ptr(void* p) { return static_cast<F*>(p); }
  template <class F>
  static const F* ptr(const void* p) { return static_cast<const F*>(p); }
  CudaContext ctx_;
  SumSquaresScratch norm_scratch_;
  cudaMemPool_t pool_ = nullptr;  // the GPU's default pool (not ours to destroy)
  std::vector<cudaEvent_t> marks_;  // the op profile's marks (mark())
  cudaStream_t copy_stream_ = nullptr;  // offload's copies (copy_async), made by the first
  size_t next_mark_ = 0;  // after ctx_: 8 KiB for sum_squares, not tracked (gradnorm_cuda.h)
  std::string name_;
  size_t total_bytes_ = 0;  // the GPU's memory: no allocation can be larger
  bool release_failed_ = false;  // a free failed while unwinding (said once)
};

}  // namespace

std::string cuda_device_unavailable_reason() { return cuda_unavailable_reason(); }

int cuda_device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::unique_ptr<Device> make_cuda_device(int ordinal) {
  std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw UsageError("--device cuda: " + why);
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  return std::make_unique<CudaDevice>(ordinal % count);
}

}  // namespace zf
