// modeled_device.cpp: the modeled clock's devices (modeled_clock.h): the
// rank's, each op a roofline time on the compute queue, each copy PCIe; and
// the host's, stage 05's CPU optimizer on the rank's host.
#include "modeled_clock.h"

#include <map>
#include <thread>

#include "device_decorator.h"
#include "dry_device.h"

namespace zf {

namespace {

// ---- the device

// Bytes of an element in the compute dtype.
double esize(DType compute) { return double(dtype_size(compute)); }

class ModeledDevice final : public DeviceDecorator {
 public:
  ModeledDevice(std::unique_ptr<Device> inner, RankClock& clock) : DeviceDecorator(std::move(inner)), clock_(clock) {}

  void* allocate_pinned(size_t bytes, std::string* why) override {
    void* p = in_->allocate_pinned(bytes, why);
    if (p) pinned_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  void release_pinned(void* p, size_t bytes) override {
    pinned_.erase(reinterpret_cast<uintptr_t>(p));
    in_->release_pinned(p, bytes);
  }
  void zero(void* p, size_t bytes) override {
    in_->zero(p, bytes);
    op("zero", 0, double(bytes));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    in_->copy(dst, src, bytes);
    op("copy", 0, 2.0 * double(bytes));
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    in_->to_device(dst, src, bytes);
    clock_.blocking_copy(copy_seconds(clock_.hardware(), bytes, is_pinned(src)), false);
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    in_->to_host(dst, src, bytes);
    clock_.blocking_copy(copy_seconds(clock_.hardware(), bytes, is_pinned(dst)), true);
  }
  void synchronize() override {
    in_->synchronize();
    clock_.synchronize();
  }
  Transfer copy_async(void* dst, const void* src, size_t bytes, bool to_device, CopyRecord*) override {
    const bool pinned = is_pinned(to_device ? src : dst);
    const double end = clock_.async_copy(copy_seconds(clock_.hardware(), bytes, pinned), !to_device);
    auto inner = std::make_shared<Transfer>(to_device ? in_->to_device_async(dst, src, bytes)
                                                      : in_->to_host_async(dst, src, bytes));
    return Transfer([inner, end, &clock = clock_] {
      inner->wait();
      clock.host_waits(end);
    });
  }

  void widen(const bf16* in, float* out, size_t n) override {
    in_->widen(in, out, n);
    op("widen", 0, 6.0 * double(n));
  }
  void narrow(const float* in, bf16* out, size_t n) override {
    in_->narrow(in, out, n);
    op("narrow", 0, 6.0 * double(n));
  }
  void fold(bf16* dst, const float* src, size_t n) override {
    in_->fold(dst, src, n);
    op("fold", double(n), 8.0 * double(n));
  }
  void add(void* dst, const void* src, DType dtype, size_t n) override {
    in_->add(dst, src, dtype, n);
    op("add", double(n), 3.0 * double(n * dtype_size(dtype)));
  }
  void accumulate(float* dst, const bf16* src, size_t n) override {  // reads 4 + 2, writes 4 bytes
    in_->accumulate(dst, src, n);
    op("accumulate", double(n), 10.0 * double(n));
  }
  // Reads the parameter, gradient and moments, writes them back (and the copy).
  void adamw(float* param, const void* grad, DType gdt, float* m, float* v, size_t n, const AdamWConfig& cfg,
             long step, float scale, bool decay) override {
    in_->adamw(param, grad, gdt, m, v, n, cfg, step, scale, decay);
    op("adamw", kAdamWFlops * double(n), double(n) * (24.0 + double(dtype_size(gdt))));
  }
  void adamw_copy(float* param, const void* grad, DType gdt, float* m, float* v, void* out, DType out_dtype, size_t n,
                  const AdamWConfig& cfg, long step, float scale, bool decay) override {
    in_->adamw_copy(param, grad, gdt, m, v, out, out_dtype, n, cfg, step, scale, decay);
    op("adamw_copy", kAdamWFlops * double(n),
       double(n) * (24.0 + double(dtype_size(gdt)) + (out ? double(dtype_size(out_dtype)) : 0.0)));
  }
  void sum_squares(const void* x, DType dtype, size_t n, SumOfSquares& acc) override {
    in_->sum_squares(x, dtype, n, acc);
    op("sum_squares", 2.0 * double(n), double(n * dtype_size(dtype)));
  }

  void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                       int C) override {
    in_->encoder_forward(out, tokens, wte, wpe, B, T, C);
    op("encoder_forward", double(B) * T * C, 3.0 * B * T * C * e() + 4.0 * B * T);
  }
  void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                        int C) override {
    in_->encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    op("encoder_backward", 2.0 * B * T * C, 5.0 * B * T * C * e() + 4.0 * B * T);
  }
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                         const void* bias, int N, int C) override {
    in_->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    op("layernorm_forward", 8.0 * N * C, (2.0 * N * C + 2.0 * C) * e() + 8.0 * N);
  }
  void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                          const void* weight, const float* mean, const float* rstd, int N, int C) override {
    in_->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    op("layernorm_backward", 14.0 * N * C, (4.0 * N * C + 5.0 * C) * e() + 8.0 * N);
  }
  // out[N,OC] = inp[N,IC] · weight[OC,IC]^T + bias: 2·N·IC·OC FLOPs.
  void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                      int OC) override {
    in_->matmul_forward(out, inp, weight, bias, N, IC, OC);
    timed("matmul_forward", [&](int sms) { return gemm_seconds(hw(), N, OC, IC, compute_, sms); },
          (double(N) * IC + double(IC) * OC + double(N) * OC + OC) * e());
  }
  // dinp [N,IC] = dout · weight over OC, and dweight [OC,IC] = dout^T · inp
  // over N: two products of the forward's FLOPs (added into).
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int N, int IC, int OC) override {
    in_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    timed("matmul_backward",
          [&](int sms) { return gemm_seconds(hw(), N, IC, OC, compute_, sms) + gemm_seconds(hw(), OC, IC, N, compute_, sms); },
          (double(N) * OC + 3.0 * N * IC + 3.0 * IC * OC + 2.0 * OC) * e());
  }
  // Q·K^T and P·V over [B,H,T,T]: 4·B·T²·C FLOPs for the whole square (the
  // simple form, whose probabilities are written and kept), half of it for
  // the causal triangle flash computes; its backward recomputes the scores.
  void attention_forward(void* out, void* saved, float* scratch, const void* qkv, int B, int T, int C,
                         int H) override {
    in_->attention_forward(out, saved, scratch, qkv, B, T, C, H);
    const double io = 4.0 * B * T * C * e();
    if (attention_ == AttentionForm::flash)
      timed("attention_forward",
            [&](int sms) { return flash_attention_seconds(hw(), 2.0 * B * T * double(T) * C, false, compute_, sms); },
            io + 4.0 * B * H * T);
    else
      timed("attention_forward",
            [&](int sms) { return arithmetic_seconds(hw(), 4.0 * B * T * double(T) * C, true, compute_, sms); },
            io + double(B) * H * double(T) * T * e());
  }
  void attention_backward(void* dqkv, float* scratch, const void* dout, const void* out, const void* qkv,
                          const void* saved, int B, int T, int C, int H) override {
    in_->attention_backward(dqkv, scratch, dout, out, qkv, saved, B, T, C, H);
    const double io = 11.0 * B * T * C * e();
    // The simple form reads the probabilities and writes their gradient through the softmax's.
    if (attention_ == AttentionForm::flash)
      timed("attention_backward",
            [&](int sms) { return flash_attention_seconds(hw(), 5.0 * B * T * double(T) * C, true, compute_, sms); },
            io + 4.0 * B * H * T);
    else
      timed("attention_backward",
            [&](int sms) { return arithmetic_seconds(hw(), 8.0 * B * T * double(T) * C, true, compute_, sms); },
            io + 3.0 * B * H * double(T) * T * e());
  }
  void gelu_forward(void* out, const void* inp, size_t n) override {
    in_->gelu_forward(out, inp, n);
    op("gelu_forward", 10.0 * double(n), 2.0 * double(n) * e());
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
    in_->gelu_backward(dinp, inp, dout, n);
    op("gelu_backward", 20.0 * double(n), 4.0 * double(n) * e());
  }
  void residual_forward(void* out, const void* a, const void* b, size_t n) override {
    in_->residual_forward(out, a, b, n);
    op("residual_forward", double(n), 3.0 * double(n) * e());
  }
  void softmax_cross_entropy_forward(float* lse, float* losses, const void* logits, const int32_t* targets,
                                     int N, int V) override {
    in_->softmax_cross_entropy_forward(lse, losses, logits, targets, N, V);
    op("softmax_cross_entropy_forward", 4.0 * N * double(V), double(N) * V * e() + 12.0 * N);
  }
  void softmax_cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                                      const int32_t* targets, float dloss, int N, int V) override {
    in_->softmax_cross_entropy_backward(dlogits, logits, lse, targets, dloss, N, V);
    op("softmax_cross_entropy_backward", 4.0 * N * double(V), 2.0 * N * double(V) * e() + 8.0 * N);
  }

 private:
  static constexpr double kAdamWFlops = 12.0;  // per element: moments, bias corrections, the step

  double e() const { return esize(compute_); }
  const Hardware& hw() const { return clock_.hardware(); }
  // An op whose arithmetic takes math(sms) seconds on `sms` of the SMs:
  // charged on all of them, and (should a collective run beside it) on
  // those a collective leaves; its memory traffic is the same either way.
  template <class Math>
  void timed(const char* name, Math math, double bytes) {
    const int all = hw().sm_count, left = all - hw().collective_sms;
    clock_.compute(op_seconds(hw(), math(all), bytes), name, op_seconds(hw(), math(left), bytes));
  }
  // An op of `flops` on the FP32 units (everything but matrix products and attention).
  void op(const char* name, double flops, double bytes) {
    timed(name, [&](int sms) { return arithmetic_seconds(hw(), flops, false, compute_, sms); }, bytes);
  }
  bool is_pinned(const void* host) const {
    const uintptr_t p = reinterpret_cast<uintptr_t>(host);
    auto it = pinned_.upper_bound(p);
    if (it == pinned_.begin()) return false;
    --it;
    return p < it->first + it->second;
  }

  RankClock& clock_;
  std::map<uintptr_t, size_t> pinned_;  // pinned allocations: start -> bytes
};

// The host's CPU as a device (stage 05's optimizer): every call runs, and
// the rank's host is busy for it: AdamW at the profile's rate, the rest at
// the host's memory bandwidth, each the rank's share of its node's host.
// The rank's thread alone calls it.
class ModeledHostDevice final : public DeviceDecorator {
 public:
  ModeledHostDevice(std::unique_ptr<Device> inner, RankClock& clock)
      : DeviceDecorator(std::move(inner)), clock_(clock), owner_(std::this_thread::get_id()) {}

  void zero(void* p, size_t bytes) override {
    in_->zero(p, bytes);
    memory("host zero", double(bytes));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    in_->copy(dst, src, bytes);
    memory("host copy", 2.0 * double(bytes));
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    in_->to_device(dst, src, bytes);
    memory("host to_device", 2.0 * double(bytes));
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    in_->to_host(dst, src, bytes);
    memory("host to_host", 2.0 * double(bytes));
  }
  void widen(const bf16* in, float* out, size_t n) override {
    in_->widen(in, out, n);
    memory("host widen", 6.0 * double(n));
  }
  void narrow(const float* in, bf16* out, size_t n) override {
    in_->narrow(in, out, n);
    memory("host narrow", 6.0 * double(n));
  }
  void fold(bf16* dst, const float* src, size_t n) override {
    in_->fold(dst, src, n);
    memory("host fold", 8.0 * double(n));
  }
  void add(void* dst, const void* src, DType dtype, size_t n) override {
    in_->add(dst, src, dtype, n);
    memory("host add", 3.0 * double(n * dtype_size(dtype)));
  }
  void accumulate(float* dst, const bf16* src, size_t n) override {
    in_->accumulate(dst, src, n);
    memory("host accumulate", 10.0 * double(n));
  }
  void sum_squares(const void* x, DType dtype, size_t n, SumOfSquares& acc) override {
    in_->sum_squares(x, dtype, n, acc);
    memory("host sum_squares", double(n * dtype_size(dtype)));
  }
  void adamw(float* param, const void* grad, DType gdt, float* m, float* v, size_t n, const AdamWConfig& cfg,
             long step, float scale, bool decay) override {
    in_->adamw(param, grad, gdt, m, v, n, cfg, step, scale, decay);
    work("cpu adamw", double(n) / (clock_.hardware().host_adamw_params_per_s * clock_.host_share()));
  }
  void adamw_copy(float* param, const void* grad, DType gdt, float* m, float* v, void* out, DType out_dtype, size_t n,
                  const AdamWConfig& cfg, long step, float scale, bool decay) override {
    in_->adamw_copy(param, grad, gdt, m, v, out, out_dtype, n, cfg, step, scale, decay);
    work("cpu adamw_copy", double(n) / (clock_.hardware().host_adamw_params_per_s * clock_.host_share()));
  }

 private:
  void memory(const char* name, double bytes) {
    work(name, bytes / (clock_.hardware().host_memory_gb_per_s * 1e9 * clock_.host_share()));
  }
  void work(const char* name, double s) {
    REQUIRE(std::this_thread::get_id() == owner_ || clock_.on_forked_thread(),
            "modeled clock: host work on a thread the clock was not told of (RankClock::fork)");
    clock_.host_work(s, name);
  }

  RankClock& clock_;
  std::thread::id owner_;
};

}  // namespace

std::unique_ptr<Device> RankClock::on_host(std::unique_ptr<Device> cpu) {
  // A dry run's host computes nothing either: its work is only charged, and
  // host states nothing writes need no memory behind them (a 7B model's
  // optimizer on a laptop).
  if (dry_) cpu = make_dry_device();
  return std::make_unique<ModeledHostDevice>(std::move(cpu), *this);
}

std::unique_ptr<Device> make_modeled_device(std::unique_ptr<Device> inner, RankClock& clock) {
  return std::make_unique<ModeledDevice>(std::move(inner), clock);
}

}  // namespace zf
