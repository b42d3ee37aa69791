// dry_device.cpp: DryDevice (dry_device.h).
#include "dry_device.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "memory.h"

namespace zf {

namespace {

class DryDevice final : public Device {
 public:
  std::string name() const override { return "dry run (no arithmetic)"; }
  bool is_cuda() const override { return false; }

  // Addresses in a range no allocation of this process gets, 256-byte
  // aligned as a GPU's, each distinct, never backed.
  void* allocate(size_t bytes) override {
    const uintptr_t p = next_;
    next_ += (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    return reinterpret_cast<void*>(p);
  }
  void release(void*) override {}
  void zero(void*, size_t) override {}
  void copy(void*, const void*, size_t) override {}
  void to_device(void*, const void*, size_t) override {}
  void to_host(void* host_dst, const void*, size_t bytes) override { std::memset(host_dst, 0, bytes); }
  void synchronize() override {}
  // Host memory a copy would read or write: mapped, zero, and backed only
  // where something writes it (a dry run's host states are never written).
  void* allocate_pinned(size_t bytes, std::string* why) override {
    void* p = map_unbacked(bytes);
    if (!p && why) *why = "the system refused to map it (an address-space limit, ulimit -v, or strict overcommit)";
    return p;
  }
  void release_pinned(void* p, size_t bytes) override { unmap_unbacked(p, bytes); }
  size_t mark() override { return 0; }
  double elapsed_ms(size_t, size_t) override { return 0.0; }
  void forget_marks() override {}

  void widen(const bf16*, float*, size_t) override {}
  void narrow(const float*, bf16*, size_t) override {}
  void fold(bf16*, const float*, size_t) override {}
  void accumulate(float*, const bf16*, size_t) override {}
  void add(void*, const void*, DType, size_t) override {}
  void adamw(float*, const void*, DType, float*, float*, size_t, const AdamWConfig&, long, float, bool) override {}
  void adamw_copy(float*, const void*, DType, float*, float*, void*, DType, size_t, const AdamWConfig&, long, float,
                  bool) override {}
  void sum_squares(const void*, DType, size_t, SumOfSquares&) override {}

  void encoder_forward(void*, const int32_t*, const void*, const void*, int, int, int) override {}
  void encoder_backward(void*, void*, const void*, const int32_t*, int, int, int) override {}
  void layernorm_forward(void*, float*, float*, const void*, const void*, const void*, int, int) override {}
  void layernorm_backward(void*, void*, void*, const void*, const void*, const void*, const float*, const float*,
                          int, int) override {}
  void matmul_forward(void*, const void*, const void*, const void*, int, int, int) override {}
  void matmul_backward(void*, void*, void*, const void*, const void*, const void*, int, int, int) override {}
  // What attention keeps is the CPU device's, so that memory is counted as in a real run.
  size_t attention_saved_bytes(int B, int T, int H) const override { return sizes_->attention_saved_bytes(B, T, H); }
  size_t attention_scratch_floats(int B, int T, int H) const override {
    return sizes_->attention_scratch_floats(B, T, H);
  }
  void set_compute_dtype(DType dtype) override {
    Device::set_compute_dtype(dtype);
    sizes_->set_compute_dtype(dtype);
  }
  void set_attention(AttentionForm form) override {
    Device::set_attention(form);
    sizes_->set_attention(form);
  }
  void attention_forward(void*, void*, float*, const void*, int, int, int, int) override {}
  void attention_backward(void*, float*, const void*, const void*, const void*, const void*, int, int, int,
                          int) override {}
  void gelu_forward(void*, const void*, size_t) override {}
  void gelu_backward(void*, const void*, const void*, size_t) override {}
  void residual_forward(void*, const void*, const void*, size_t) override {}
  void softmax_cross_entropy_forward(float*, float*, const void*, const int32_t*, int, int) override {}
  void softmax_cross_entropy_backward(void*, const void*, const float*, const int32_t*, float, int, int) override {}

 protected:
  Transfer copy_async(void*, const void*, size_t, bool, CopyRecord*) override { return Transfer(); }

 private:
  uintptr_t next_ = uintptr_t(1) << 52;
  std::unique_ptr<Device> sizes_ = make_cpu_device();
};

}  // namespace

std::unique_ptr<Device> make_dry_device() { return std::make_unique<DryDevice>(); }

}  // namespace zf
