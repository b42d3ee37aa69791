// device_decorator.h: a Device that hands every call on to another, so that
// a decorator (the op profile, report/device_profile.h; the modeled clock,
// modeled/modeled_clock.h; a stage's phase timers) overrides only the calls
// it watches.
#pragma once

#include <memory>
#include <string>

#include "device.h"

namespace zf {

class DeviceDecorator : public Device {
 public:
  explicit DeviceDecorator(std::unique_ptr<Device> inner) : in_(std::move(inner)) {
    compute_ = in_->compute_dtype();
    attention_ = in_->attention();
  }

  std::string name() const override { return in_->name(); }
  bool is_cuda() const override { return in_->is_cuda(); }
  void* native_stream() const override { return in_->native_stream(); }
  void make_current() override { in_->make_current(); }
  int ordinal() const override { return in_->ordinal(); }
  void set_compute_dtype(DType dtype) override {
    in_->set_compute_dtype(dtype);
    compute_ = dtype;
  }
  void set_attention(AttentionForm form) override {
    in_->set_attention(form);
    attention_ = form;
  }

  void* allocate(size_t bytes) override { return in_->allocate(bytes); }
  void release(void* p) override { in_->release(p); }
  void zero(void* p, size_t bytes) override { in_->zero(p, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { in_->copy(dst, src, bytes); }
  void to_device(void* dst, const void* src, size_t bytes) override { in_->to_device(dst, src, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { in_->to_host(dst, src, bytes); }
  void synchronize() override { in_->synchronize(); }
  // An observer goes to the device that runs the copies, which times them.
  void set_copy_observer(CopyObserver observer) override { in_->set_copy_observer(std::move(observer)); }
  void* allocate_pinned(size_t bytes, std::string* why) override { return in_->allocate_pinned(bytes, why); }
  void release_pinned(void* p, size_t bytes) override { in_->release_pinned(p, bytes); }
  size_t mark() override { return in_->mark(); }
  double elapsed_ms(size_t from, size_t to) override { return in_->elapsed_ms(from, to); }
  void forget_marks() override { in_->forget_marks(); }

  void widen(const bf16* in, float* out, size_t n) override { in_->widen(in, out, n); }
  void narrow(const float* in, bf16* out, size_t n) override { in_->narrow(in, out, n); }
  void fold(bf16* dst, const float* src, size_t n) override { in_->fold(dst, src, n); }
  void add(void* dst, const void* src, DType dtype, size_t n) override { in_->add(dst, src, dtype, n); }
  void accumulate(float* dst, const bf16* src, size_t n) override { in_->accumulate(dst, src, n); }
  void adamw(float* param, const void* grad, DType gdt, float* m, float* v, size_t n, const AdamWConfig& cfg,
             long step, float scale, bool decay) override {
    in_->adamw(param, grad, gdt, m, v, n, cfg, step, scale, decay);
  }
  void adamw_copy(float* param, const void* grad, DType gdt, float* m, float* v, void* out, DType out_dtype, size_t n,
                  const AdamWConfig& cfg, long step, float scale, bool decay) override {
    in_->adamw_copy(param, grad, gdt, m, v, out, out_dtype, n, cfg, step, scale, decay);
  }
  std::string optimizer_description() const override { return in_->optimizer_description(); }
  void sum_squares(const void* x, DType dtype, size_t n, SumOfSquares& acc) override {
    in_->sum_squares(x, dtype, n, acc);
  }

  void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                       int C) override {
    in_->encoder_forward(out, tokens, wte, wpe, B, T, C);
  }
  void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                        int C) override {
    in_->encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                         const void* bias, int N, int C) override {
    in_->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                          const void* weight, const float* mean, const float* rstd, int N, int C) override {
    in_->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                      int OC) override {
    in_->matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int N, int IC, int OC) override {
    in_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
  }
  size_t attention_saved_bytes(int B, int T, int H) const override { return in_->attention_saved_bytes(B, T, H); }
  size_t attention_scratch_floats(int B, int T, int H) const override {
    return in_->attention_scratch_floats(B, T, H);
  }
  void attention_forward(void* out, void* saved, float* scratch, const void* qkv, int B, int T, int C,
                         int H) override {
    in_->attention_forward(out, saved, scratch, qkv, B, T, C, H);
  }
  void attention_backward(void* dqkv, float* scratch, const void* dout, const void* out, const void* qkv,
                          const void* saved, int B, int T, int C, int H) override {
    in_->attention_backward(dqkv, scratch, dout, out, qkv, saved, B, T, C, H);
  }
  void gelu_forward(void* out, const void* inp, size_t n) override { in_->gelu_forward(out, inp, n); }
  void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
    in_->gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(void* out, const void* a, const void* b, size_t n) override {
    in_->residual_forward(out, a, b, n);
  }
  void softmax_cross_entropy_forward(float* lse, float* losses, const void* logits, const int32_t* targets,
                                     int N, int V) override {
    in_->softmax_cross_entropy_forward(lse, losses, logits, targets, N, V);
  }
  void softmax_cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                                      const int32_t* targets, float dloss, int N, int V) override {
    in_->softmax_cross_entropy_backward(dlogits, logits, lse, targets, dloss, N, V);
  }

 protected:
  // The copies go through the inner device's own counting and observer.
  Transfer copy_async(void* dst, const void* src, size_t bytes, bool to_device, CopyRecord*) override {
    return to_device ? in_->to_device_async(dst, src, bytes) : in_->to_host_async(dst, src, bytes);
  }

  std::unique_ptr<Device> in_;
};

}  // namespace zf
