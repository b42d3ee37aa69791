// device_cpu.cpp: the simulated device of a CPU run. Its memory is host
// memory (the MemoryTracker counts it as "device"), its ops the CPU
// reference kernels; every call runs to completion before it returns. With
// compute dtype bf16 it emulates a GPU's bf16 compute (class Arg).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "check.h"
#include "copy_queue.h"
#include "device.h"
#include "kernels.h"

namespace zf {

namespace {

// One argument of an op, as the float32 kernels want it. Compute dtype f32:
// the buffer itself. bf16 (the emulation of a GPU's bf16 compute, see
// device.h): a float32 copy, widened from the buffer if the op reads it
// (in, inout), rounded back into it once when the op is done if the op
// writes it (out, inout). The copies are transient host memory, not counted
// by the tracker (this is a checking mode, not a memory model).
enum class Use { in, out, inout };

class Arg {
 public:
  Arg(DType dtype, const void* p, size_t n, Use use)
      : p_(const_cast<void*>(p)), n_(n), use_(use), bf16_(dtype == DType::bf16 && p != nullptr) {
    if (!bf16_) return;
    copy_.resize(n);
    if (use != Use::out) bf16_to_float(static_cast<const bf16*>(p_), copy_.data(), n);
  }
  ~Arg() {
    if (bf16_ && use_ != Use::in) float_to_bf16(copy_.data(), static_cast<bf16*>(p_), n_);
  }
  Arg(const Arg&) = delete;
  Arg& operator=(const Arg&) = delete;
  operator float*() { return bf16_ ? copy_.data() : static_cast<float*>(p_); }

 private:
  void* p_;
  size_t n_;
  Use use_;
  bool bf16_;
  std::vector<float> copy_;
};

// What the simulated device frees, kept for the next allocation of the same
// size, as a GPU's memory pool keeps it (device_cuda.cpp): a stage frees and
// allocates each unit's gathered parameters and gradient every step, and
// handing those back to the system would make every step fault their pages
// in again. It keeps at most the most the device ever held at once, so the
// process holds at most twice the tracker's device peak.
class BlockCache {
 public:
  BlockCache() = default;
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache() {
    for (auto& [bytes, blocks] : free_)
      for (void* p : blocks) std::free(p);
  }

  // 64-byte aligned (cache lines, AVX-512); the contents are undefined, as
  // cudaMalloc's: the MemoryTracker zeroes what it allocates.
  void* allocate(size_t bytes) {
    const size_t padded = (bytes + 63) / 64 * 64;
    std::lock_guard<std::mutex> lock(mu_);
    void* p = nullptr;
    auto it = free_.find(padded);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_ -= padded;
    } else if ((p = std::aligned_alloc(64, padded == 0 ? 64 : padded)) == nullptr) {
      return nullptr;
    }
    size_[p] = padded;
    live_ += padded;
    peak_ = std::max(peak_, live_);
    return p;
  }

  void release(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = size_.find(p);
    REQUIRE(it != size_.end(), "cpu device: releasing memory it did not allocate");
    const size_t padded = it->second;
    size_.erase(it);
    live_ -= padded;
    if (cached_ + padded > peak_) return std::free(p);
    free_[padded].push_back(p);
    cached_ += padded;
  }

 private:
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // by size
  std::unordered_map<void*, size_t> size_;                // of every live block
  size_t live_ = 0, peak_ = 0, cached_ = 0;
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int optimizer_threads) : optimizer_(optimizer_threads) {}
  std::string name() const override { return "cpu (simulated device)"; }
  bool is_cuda() const override { return false; }

  void* allocate(size_t bytes) override { return blocks_.allocate(bytes); }
  void release(void* p) override { blocks_.release(p); }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}
  void* allocate_pinned(size_t bytes, std::string* why) override { return allocate_locked(bytes, why); }
  void release_pinned(void* p, size_t bytes) override { release_locked(p, bytes); }
  // Every op has finished when it returns: a copy to the host reads what they wrote.
  Transfer copy_async(void* dst, const void* src, size_t bytes, bool, CopyRecord* record) override {
    return copies_.copy(dst, src, bytes, record);
  }

  size_t mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return marks_.size() - 1;
  }
  double elapsed_ms(size_t from, size_t to) override {
    return std::chrono::duration<double, std::milli>(marks_.at(to) - marks_.at(from)).count();
  }
  void forget_marks() override { marks_.clear(); }

  void widen(const bf16* in, float* out, size_t n) override { bf16_to_float(in, out, n); }
  void narrow(const float* in, bf16* out, size_t n) override { float_to_bf16(in, out, n); }
  void fold(bf16* dst, const float* src, size_t n) override {
    for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(bf16_to_float(dst[i]) + src[i]);
  }
  void accumulate(float* dst, const bf16* src, size_t n) override {
    for (size_t i = 0; i < n; ++i) dst[i] += bf16_to_float(src[i]);
  }
  void add(void* dst, const void* src, DType dtype, size_t n) override {
    if (dtype == DType::f32) {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < n; ++i) d[i] += s[i];
    } else {
      REQUIRE(dtype == DType::bf16, "add: unsupported dtype " << dtype_name(dtype));
      bf16* d = static_cast<bf16*>(dst);
      const bf16* s = static_cast<const bf16*>(src);
      for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16(bf16_to_float(d[i]) + bf16_to_float(s[i]));
    }
  }

  void adamw(float* param, const void* grad, DType gdt, float* m, float* v, size_t n, const AdamWConfig& cfg,
             long step, float scale, bool decay) override {
    optimizer_.update(param, grad, gdt, m, v, nullptr, DType::f32, n, cfg, step, scale, decay);
  }
  void adamw_copy(float* param, const void* grad, DType gdt, float* m, float* v, void* out, DType out_dtype, size_t n,
                  const AdamWConfig& cfg, long step, float scale, bool decay) override {
    optimizer_.update(param, grad, gdt, m, v, out, out_dtype, n, cfg, step, scale, decay);
  }
  std::string optimizer_description() const override { return optimizer_.describe(); }

  void sum_squares(const void* x, DType dtype, size_t n, SumOfSquares& acc) override {
    if (dtype == DType::f32) acc.add(static_cast<const float*>(x), n);
    else acc.add(static_cast<const bf16*>(x), n);
  }

  void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                       int C) override {
    const size_t BT = size_t(B) * T;
    Arg o(compute_, out, BT * C, Use::out);
    Arg e(compute_, wte, rows_used(tokens, BT) * C, Use::in), p(compute_, wpe, size_t(T) * C, Use::in);
    zf::encoder_forward(o, tokens, e, p, B, T, C);
  }
  void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                        int C) override {
    const size_t BT = size_t(B) * T;
    Arg de(compute_, dwte, rows_used(tokens, BT) * C, Use::inout), dp(compute_, dwpe, size_t(T) * C, Use::inout);
    Arg d(compute_, dout, BT * C, Use::in);
    zf::encoder_backward(de, dp, d, tokens, B, T, C);
  }
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                         const void* bias, int N, int C) override {
    const size_t NC = size_t(N) * C;
    Arg o(compute_, out, NC, Use::out), x(compute_, inp, NC, Use::in);
    Arg w(compute_, weight, C, Use::in), b(compute_, bias, C, Use::in);
    zf::layernorm_forward(o, mean, rstd, x, w, b, N, C);
  }
  void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                          const void* weight, const float* mean, const float* rstd, int N, int C) override {
    const size_t NC = size_t(N) * C;
    Arg dx(compute_, dinp, NC, Use::inout), dw(compute_, dweight, C, Use::inout), db(compute_, dbias, C, Use::inout);
    Arg d(compute_, dout, NC, Use::in), x(compute_, inp, NC, Use::in), w(compute_, weight, C, Use::in);
    zf::layernorm_backward(dx, dw, db, d, x, w, mean, rstd, N, C);
  }
  void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                      int OC) override {
    Arg o(compute_, out, size_t(N) * OC, Use::out), x(compute_, inp, size_t(N) * IC, Use::in);
    Arg w(compute_, weight, size_t(OC) * IC, Use::in), b(compute_, bias, OC, Use::in);
    zf::matmul_forward(o, x, w, b, N, IC, OC);
  }
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int N, int IC, int OC) override {
    Arg dx(compute_, dinp, size_t(N) * IC, Use::inout), dw(compute_, dweight, size_t(OC) * IC, Use::inout);
    Arg db(compute_, dbias, OC, Use::inout), d(compute_, dout, size_t(N) * OC, Use::in);
    Arg x(compute_, inp, size_t(N) * IC, Use::in), w(compute_, weight, size_t(OC) * IC, Use::in);
    zf::matmul_backward(dx, dw, db, d, x, w, N, IC, OC);
  }
  // Attention: the simple form (kernels_cpu_softmax.cpp, the probabilities
  // kept), or with --attention flash the CUDA-core flash kernels' code run one
  // thread at a time (flash_attention_cpu.cpp: slow; lse kept, float32).
  bool flash() const { return attention_ == AttentionForm::flash; }
  size_t attention_saved_bytes(int B, int T, int H) const override {
    return flash() ? size_t(B) * H * T * sizeof(float)                // lse
                   : size_t(B) * H * T * T * dtype_size(compute_);  // the probabilities
  }
  size_t attention_scratch_floats(int B, int T, int H) const override {
    return flash() ? zf::flash_attention_scratch_floats(B, T, H) : zf::attention_scratch_floats(T);
  }
  void attention_forward(void* out, void* saved, float* /*scratch*/, const void* qkv, int B, int T, int C,
                         int H) override {
    const size_t BT = size_t(B) * T;
    Arg o(compute_, out, BT * C, Use::out), x(compute_, qkv, BT * 3 * C, Use::in);
    if (flash()) {
      zf::flash_attention_forward(o, static_cast<float*>(saved), x, B, T, C, H);
      return;
    }
    Arg a(compute_, saved, BT * H * T, Use::out);
    zf::attention_forward(o, a, x, B, T, C, H);
  }
  void attention_backward(void* dqkv, float* scratch, const void* dout, const void* out, const void* qkv,
                          const void* saved, int B, int T, int C, int H) override {
    const size_t BT = size_t(B) * T;
    Arg dx(compute_, dqkv, BT * 3 * C, Use::inout), d(compute_, dout, BT * C, Use::in);
    Arg x(compute_, qkv, BT * 3 * C, Use::in);
    if (flash()) {
      Arg y(compute_, out, BT * C, Use::in);
      zf::flash_attention_backward(dx, scratch, d, y, x, static_cast<const float*>(saved), B, T, C, H);
      return;
    }
    Arg a(compute_, saved, BT * H * T, Use::in);
    zf::attention_backward(dx, scratch, d, x, a, B, T, C, H);
  }
  void gelu_forward(void* out, const void* inp, size_t n) override {
    Arg o(compute_, out, n, Use::out), x(compute_, inp, n, Use::in);
    zf::gelu_forward(o, x, n);
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
    Arg dx(compute_, dinp, n, Use::inout), x(compute_, inp, n, Use::in), d(compute_, dout, n, Use::in);
    zf::gelu_backward(dx, x, d, n);
  }
  void residual_forward(void* out, const void* a, const void* b, size_t n) override {
    Arg o(compute_, out, n, Use::out), x(compute_, a, n, Use::in), y(compute_, b, n, Use::in);
    zf::residual_forward(o, x, y, n);
  }
  void softmax_cross_entropy_forward(float* lse, float* losses, const void* logits, const int32_t* targets,
                                     int N, int V) override {
    Arg x(compute_, logits, size_t(N) * V, Use::in);
    zf::softmax_cross_entropy_forward(lse, losses, x, targets, N, V);
  }
  void softmax_cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                                      const int32_t* targets, float dloss, int N, int V) override {
    const size_t NV = size_t(N) * V;
    if (dlogits == logits) {
      // In place (the model's call): one float32 copy, widened from the
      // logits once, overwritten by the kernel with their gradient, rounded
      // back once. (Two Args on the one buffer would give the same values,
      // as an `in` copy is never written back, but hold two copies.)
      Arg g(compute_, dlogits, NV, Use::inout);
      zf::softmax_cross_entropy_backward(g, g, lse, targets, dloss, N, V);
    } else {
      Arg dx(compute_, dlogits, NV, Use::out), x(compute_, logits, NV, Use::in);  // written, not added
      zf::softmax_cross_entropy_backward(dx, x, lse, targets, dloss, N, V);
    }
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;

  // Rows of an embedding table that `tokens` can touch: the largest id + 1
  // (the ops take no V; a bf16 emulation widens only those rows).
  static size_t rows_used(const int32_t* tokens, size_t n) {
    int32_t mx = -1;
    for (size_t i = 0; i < n; ++i) mx = std::max(mx, tokens[i]);
    return size_t(mx + 1);
  }

  BlockCache blocks_;   // the device's memory
  CpuAdamW optimizer_;  // one fused pass per element, on the calling thread and optimizer_threads - 1 more
  CopyQueue copies_;  // declared last: destroyed first, after its copies finish
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int optimizer_threads) {
  return std::make_unique<CpuDevice>(optimizer_threads);
}

#ifndef ZF_HAVE_CUDA
std::string cuda_device_unavailable_reason() {
  return "this build has no CUDA support (nvcc was not found when it was configured; "
         "install the CUDA toolkit and reconfigure with -Dcuda=enabled)";
}
std::unique_ptr<Device> make_cuda_device(int) {
  throw UsageError("--device cuda: " + cuda_device_unavailable_reason());
}
int cuda_device_count() { return 0; }
#endif

}  // namespace zf
