// device.h: the "device" place of a rank, and every operation that touches it.
//
// A rank's model states, activations and communication buffers live on its
// device. On a CPU run the device is simulated: host memory counted apart
// (memory.h), computed on by the CPU kernels (kernels.h). On a GPU it is the
// GPU's memory, computed on by the CUDA kernels (kernels_cuda.h) on the
// rank's compute stream. Code above this line (the model, the precision
// recipes, the stages) never touches device memory directly: it calls these
// methods, so the same stage runs on both.
//
// All pointers are device pointers unless named host_*. Operations are
// ordered on the device in call order; to_host/to_device and synchronize
// wait for everything issued before them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "adamw.h"
#include "check.h"
#include "dtype.h"
#include "gradnorm.h"

namespace zf {

// The two forms of causal attention: simple keeps the probabilities
// [B,H,T,T] for the backward (kernels.h; on a GPU, cuBLAS); flash keeps one
// log-sum-exp per row and recomputes the rest (on a GPU: tensor cores with
// bf16 compute, kernels_cuda_flash_tc.cu, CUDA cores with f32,
// kernels_cuda_flash.cu; on the CPU, the CUDA-core kernels' code run one
// thread at a time, flash_attention_cpu.cpp). --attention picks one.
enum class AttentionForm { simple, flash };
inline const char* attention_form_name(AttentionForm f) { return f == AttentionForm::flash ? "flash" : "simple"; }


// An asynchronous copy between host and device memory (Device::to_host_async,
// to_device_async). wait() returns once the bytes have arrived (and raises
// what the copy raised); a Transfer destroyed while pending waits first, so
// no copy ever writes into, or reads from, memory already freed.
class Transfer {
 public:
  Transfer() = default;  // nothing in flight
  explicit Transfer(std::function<void()> wait) : wait_(std::move(wait)) {}
  Transfer(Transfer&& o) noexcept : wait_(std::move(o.wait_)) { o.wait_ = nullptr; }
  Transfer& operator=(Transfer&& o) noexcept;
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  ~Transfer();
  void wait();
  bool pending() const { return bool(wait_); }

 private:
  std::function<void()> wait_;
};

// The bytes a rank moved between host and device memory, per direction.
struct TransferStats {
  uint64_t to_device_bytes = 0, to_host_bytes = 0;
  uint64_t to_device_copies = 0, to_host_copies = 0;

  // The copies between two readings (a later minus an earlier), and their sum.
  TransferStats operator-(const TransferStats& o) const {
    return {to_device_bytes - o.to_device_bytes, to_host_bytes - o.to_host_bytes,
            to_device_copies - o.to_device_copies, to_host_copies - o.to_host_copies};
  }
  TransferStats& operator+=(const TransferStats& o) {
    to_device_bytes += o.to_device_bytes, to_host_bytes += o.to_host_bytes;
    to_device_copies += o.to_device_copies, to_host_copies += o.to_host_copies;
    return *this;
  }
};

// One asynchronous copy as its device saw it, for a copy observer
// (Device::set_copy_observer; --trace draws them, report/trace.h). Times on
// the steady clock. issued, wait_begin, wait_end are the host's: the call
// of to_*_async, the call of wait() (or the Transfer's destruction) and its
// return. started, completed: when the copy itself ran, where the device
// can time it (the CPU device's copy thread); the clock's epoch where it
// cannot (a GPU's copy stream: the host sees only the issue and the wait).
struct CopyRecord {
  using Time = std::chrono::steady_clock::time_point;
  uint64_t id = 0;  // the copy's number on its device, in issue order
  bool to_device = false;
  size_t bytes = 0;
  Time issued{}, wait_begin{}, wait_end{};
  Time started{}, completed{};
  bool timed() const { return started != Time{} && completed != Time{}; }
};
// Called once per copy, on the thread that waits for it, when wait()
// returns (a copy that failed is not reported).
using CopyObserver = std::function<void(const CopyRecord&)>;

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;  // "cpu (simulated device)", "cuda:0 NVIDIA H200"
  virtual bool is_cuda() const = 0;
  // The CUDA stream the ops run on (a cudaStream_t), nullptr on the CPU.
  virtual void* native_stream() const { return nullptr; }
  // Makes this device current for the calling thread (cudaSetDevice).
  virtual void make_current() {}
  virtual int ordinal() const { return -1; }

  // ---- memory (MemoryTracker calls these for Place::device)
  virtual void* allocate(size_t bytes) = 0;  // nullptr when the device is out of memory
  virtual void release(void* p) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // device to device
  virtual void to_device(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // ---- offload: copies that overlap compute, and pinned host memory.
  // The async copies run on the device's copy queue (on a GPU a copy stream,
  // so the copy engine works while kernels run; on the CPU device a copy
  // thread), in issue order. A copy to the host starts after everything
  // issued before it on the compute queue (it copies what the ops wrote); a
  // copy to the device must be waited for before an op reads its bytes.
  // Neither buffer may be touched until wait() returns. Counted per direction.
  Transfer to_host_async(void* host_dst, const void* src, size_t bytes);
  Transfer to_device_async(void* dst, const void* host_src, size_t bytes);
  const TransferStats& transfers() const { return transfers_; }
  // Reports every async copy issued from now on to `observer` (none: an
  // empty function). Only --trace sets one; without it a copy costs one
  // test of the empty function more. A wrapping device hands it on to the
  // device that runs the copies.
  virtual void set_copy_observer(CopyObserver observer) { copy_observer_ = std::move(observer); }
  // Page-locked host memory (cudaHostAlloc on a GPU, which the copy engine
  // reads without a staging copy; mlock on the CPU device, whose limit is
  // the same one a host's locked memory has). nullptr when refused, with the
  // system's reason in *why. Zero-filled.
  virtual void* allocate_pinned(size_t bytes, std::string* why) = 0;
  virtual void release_pinned(void* p, size_t bytes) = 0;

  // ---- timing, for the op profile (device_profile.h): mark() is a point on
  // this device's timeline after everything issued so far (a CUDA event
  // recorded on the stream; the host clock on the CPU, where ops finish
  // before they return); elapsed_ms waits for the later mark and gives the
  // device time between two; forget_marks() lets their ids be reused.
  virtual size_t mark() = 0;
  virtual double elapsed_ms(size_t from, size_t to) = 0;
  virtual void forget_marks() = 0;

  // ---- the precision recipes (precision.h)
  virtual void widen(const bf16* in, float* out, size_t n) = 0;    // bf16 -> f32
  virtual void narrow(const float* in, bf16* out, size_t n) = 0;   // f32 -> bf16, round to nearest even
  virtual void fold(bf16* dst, const float* src, size_t n) = 0;    // dst = bf16(f32(dst) + src)
  virtual void add(void* dst, const void* src, DType dtype, size_t n) = 0;  // dst += src, same dtype
  virtual void accumulate(float* dst, const bf16* src, size_t n) = 0;       // dst += f32(src)

  // ---- the optimizer
  virtual void adamw(float* param, const void* grad, DType grad_dtype, float* m, float* v, size_t n,
                     const AdamWConfig& cfg, long step, float grad_scale, bool decay) = 0;
  // adamw, and out[i] = the updated param[i] in out_dtype (bf16, rounded to
  // nearest even; or f32): the copy a device receives from a host optimizer.
  // out == nullptr: adamw alone. One pass on the CPU device.
  virtual void adamw_copy(float* param, const void* grad, DType grad_dtype, float* m, float* v, void* out,
                          DType out_dtype, size_t n, const AdamWConfig& cfg, long step, float grad_scale,
                          bool decay) {
    adamw(param, grad, grad_dtype, m, v, n, cfg, step, grad_scale, decay);
    if (out && out_dtype == DType::bf16) narrow(param, static_cast<bf16*>(out), n);
    else if (out) copy(out, param, n * sizeof(float));
  }
  // What runs adamw, for the run log ("avx2, 2 threads"); "" when nothing to say.
  virtual std::string optimizer_description() const { return ""; }
  // acc += sum of x[i]^2, exactly (gradnorm.h); x has n elements of dtype.
  virtual void sum_squares(const void* x, DType dtype, size_t n, SumOfSquares& acc) = 0;

  // ---- the model's ops: kernels.h's shapes and conventions (every backward
  // adds into its gradients, but the cross-entropy's). Activations,
  // parameters and gradients passed as void* are of the device's compute
  // dtype (below); LayerNorm statistics, losses, lse and the attention
  // scratch are always float32.
  //
  // Compute dtype f32: the kernels of kernels.h, float32 throughout.
  // Compute dtype bf16: every tensor above is stored in bf16, and each op
  // reads it, computes and accumulates in float32, and rounds once when it
  // stores (on a GPU: bf16 tensor-core matrix products with float32
  // accumulation, like PyTorch's autocast). The CPU device emulates this
  // with the float32 kernels (widen the inputs, compute, round the outputs):
  // slow, and meant for tests and for comparing with a GPU run.
  virtual void set_compute_dtype(DType dtype) {
    REQUIRE(dtype == DType::f32 || dtype == DType::bf16,
            "compute dtype must be f32 or bf16 (got " << dtype_name(dtype) << ")");
    compute_ = dtype;
  }
  DType compute_dtype() const { return compute_; }
  // Which form attention_* run (set before sizing what attention keeps).
  virtual void set_attention(AttentionForm form) { attention_ = form; }
  AttentionForm attention() const { return attention_; }

  virtual void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe,
                               int B, int T, int C) = 0;
  virtual void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                                int B, int T, int C) = 0;
  virtual void layernorm_forward(void* out, float* mean, float* rstd, const void* inp,
                                 const void* weight, const void* bias, int N, int C) = 0;
  virtual void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                                  const void* inp, const void* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;
  virtual void matmul_forward(void* out, const void* inp, const void* weight, const void* bias,
                              int N, int IC, int OC) = 0;
  virtual void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                               const void* inp, const void* weight, int N, int IC, int OC) = 0;
  // Attention keeps `saved` from its forward for its backward: the
  // probabilities [B,H,T,T] in the compute dtype (the simple form), or the
  // float32 log-sum-exp of each row, [B,H,T] (the flash form, --attention
  // flash); the model allocates the bytes the device asks for.
  // scratch: float32, overwritten by both directions.
  virtual size_t attention_saved_bytes(int B, int T, int H) const = 0;
  virtual size_t attention_scratch_floats(int B, int T, int H) const = 0;
  virtual void attention_forward(void* out, void* saved, float* scratch, const void* qkv, int B, int T,
                                 int C, int H) = 0;
  virtual void attention_backward(void* dqkv, float* scratch, const void* dout, const void* out,
                                  const void* qkv, const void* saved, int B, int T, int C, int H) = 0;
  virtual void gelu_forward(void* out, const void* inp, size_t n) = 0;
  virtual void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) = 0;
  virtual void residual_forward(void* out, const void* a, const void* b, size_t n) = 0;
  // Fused softmax + cross-entropy (kernels.h): lse[N] and losses[N] float32,
  // no probabilities kept. The backward WRITES dlogits (=, the one op that
  // does not add), and dlogits may be logits itself (in place).
  virtual void softmax_cross_entropy_forward(float* lse, float* losses, const void* logits,
                                             const int32_t* targets, int N, int V) = 0;
  virtual void softmax_cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                                              const int32_t* targets, float dloss, int N, int V) = 0;

 protected:
  // The copy itself, after to_host_async / to_device_async counted it.
  // `record`, when not null (an observer is set), takes the copy's started
  // and completed times if the device can measure them; it stays valid
  // until the returned Transfer's wait() has returned.
  virtual Transfer copy_async(void* dst, const void* src, size_t bytes, bool to_device, CopyRecord* record) = 0;

  DType compute_ = DType::f32;
  TransferStats transfers_;
  CopyObserver copy_observer_;
  AttentionForm attention_ = AttentionForm::simple;

 private:
  Transfer observed_copy(uint64_t id, void* dst, const void* src, size_t bytes, bool to_device);
};

// The simulated device of a CPU run: host memory, the CPU kernels. Its
// AdamW runs on optimizer_threads threads (CpuAdamW, adamw.h): 1 for a
// rank's own device, more for a host optimizer (offload).
std::unique_ptr<Device> make_cpu_device(int optimizer_threads = 1);

// "" when `--device cuda` can run in this build on this machine, else why not.
std::string cuda_device_unavailable_reason();
// GPU `ordinal` modulo the GPUs visible (only when cuda_device_unavailable_reason() is empty).
std::unique_ptr<Device> make_cuda_device(int ordinal);
// GPUs visible to this process (0 without CUDA).
int cuda_device_count();

}  // namespace zf
