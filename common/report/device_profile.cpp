// device_profile.cpp: ProfilingDevice, a Device that times every op of
// another (device_profile.h).
#include "device_profile.h"
#include "device_decorator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace zf {

bool profiling_requested() {
  const char* v = std::getenv("ZF_PROFILE");
  return v && *v && std::string(v) != "0";
}

namespace {

class ProfilingDevice final : public DeviceDecorator {
 public:
  ProfilingDevice(std::unique_ptr<Device> inner, bool print) : DeviceDecorator(std::move(inner)), print_(print) {}
  ~ProfilingDevice() override {
    try {
      collect();
      if (print_) print();
    } catch (...) {  // a failed run's device: no table, and no throw from a destructor
    }
  }

  void zero(void* p, size_t bytes) override { timed("zero", [&] { in_->zero(p, bytes); }); }
  void copy(void* dst, const void* src, size_t bytes) override {
    timed("copy", [&] { in_->copy(dst, src, bytes); });
  }
  // Transfers wait for the device, so the marks issued so far are complete:
  // a good moment to read them.
  void to_device(void* dst, const void* src, size_t bytes) override {
    in_->to_device(dst, src, bytes);
    collect();
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    in_->to_host(dst, src, bytes);
    collect();
  }
  void synchronize() override {
    in_->synchronize();
    collect();
  }

  void widen(const bf16* in, float* out, size_t n) override { timed("widen", [&] { in_->widen(in, out, n); }); }
  void narrow(const float* in, bf16* out, size_t n) override {
    timed("narrow", [&] { in_->narrow(in, out, n); });
  }
  void fold(bf16* dst, const float* src, size_t n) override { timed("fold", [&] { in_->fold(dst, src, n); }); }
  void add(void* dst, const void* src, DType dtype, size_t n) override {
    timed("add", [&] { in_->add(dst, src, dtype, n); });
  }
  void accumulate(float* dst, const bf16* src, size_t n) override {
    timed("accumulate", [&] { in_->accumulate(dst, src, n); });
  }
  void adamw(float* param, const void* grad, DType gdt, float* m, float* v, size_t n, const AdamWConfig& cfg,
             long step, float scale, bool decay) override {
    timed("adamw", [&] { in_->adamw(param, grad, gdt, m, v, n, cfg, step, scale, decay); });
  }
  void adamw_copy(float* param, const void* grad, DType gdt, float* m, float* v, void* out, DType out_dtype, size_t n,
                  const AdamWConfig& cfg, long step, float scale, bool decay) override {
    timed("adamw", [&] { in_->adamw_copy(param, grad, gdt, m, v, out, out_dtype, n, cfg, step, scale, decay); });
  }

  void sum_squares(const void* x, DType dtype, size_t n, SumOfSquares& acc) override {
    timed("sum_squares", [&] { in_->sum_squares(x, dtype, n, acc); });
  }

  void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                       int C) override {
    timed("encoder_forward", [&] { in_->encoder_forward(out, tokens, wte, wpe, B, T, C); });
  }
  void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                        int C) override {
    timed("encoder_backward", [&] { in_->encoder_backward(dwte, dwpe, dout, tokens, B, T, C); });
  }
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                         const void* bias, int N, int C) override {
    timed("layernorm_forward", [&] { in_->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C); });
  }
  void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                          const void* weight, const float* mean, const float* rstd, int N, int C) override {
    timed("layernorm_backward",
          [&] { in_->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C); });
  }
  void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N, int IC,
                      int OC) override {
    timed("matmul_forward", [&] { in_->matmul_forward(out, inp, weight, bias, N, IC, OC); });
  }
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int N, int IC, int OC) override {
    timed("matmul_backward", [&] { in_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC); });
  }
  void attention_forward(void* out, void* saved, float* scratch, const void* qkv, int B, int T, int C,
                         int H) override {
    timed("attention_forward", [&] { in_->attention_forward(out, saved, scratch, qkv, B, T, C, H); });
  }
  void attention_backward(void* dqkv, float* scratch, const void* dout, const void* out, const void* qkv,
                          const void* saved, int B, int T, int C, int H) override {
    timed("attention_backward",
          [&] { in_->attention_backward(dqkv, scratch, dout, out, qkv, saved, B, T, C, H); });
  }
  void gelu_forward(void* out, const void* inp, size_t n) override {
    timed("gelu_forward", [&] { in_->gelu_forward(out, inp, n); });
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
    timed("gelu_backward", [&] { in_->gelu_backward(dinp, inp, dout, n); });
  }
  void residual_forward(void* out, const void* a, const void* b, size_t n) override {
    timed("residual_forward", [&] { in_->residual_forward(out, a, b, n); });
  }
  void softmax_cross_entropy_forward(float* lse, float* losses, const void* logits, const int32_t* targets,
                                     int N, int V) override {
    timed("softmax_cross_entropy_forward",
          [&] { in_->softmax_cross_entropy_forward(lse, losses, logits, targets, N, V); });
  }
  void softmax_cross_entropy_backward(void* dlogits, const void* logits, const float* lse,
                                      const int32_t* targets, float dloss, int N, int V) override {
    timed("softmax_cross_entropy_backward",
          [&] { in_->softmax_cross_entropy_backward(dlogits, logits, lse, targets, dloss, N, V); });
  }

 private:
  struct Pending {
    const char* op;
    size_t from, to;
  };
  struct Total {
    long calls = 0;
    double ms = 0.0;
  };

  template <class Fn>
  void timed(const char* op, Fn&& fn) {
    const size_t from = in_->mark();
    fn();
    pending_.push_back({op, from, in_->mark()});
    // Bound the marks held (events on a GPU) in a run that never syncs.
    if (pending_.size() >= 8192) collect();
  }

  void collect() {
    for (const Pending& p : pending_) {
      Total& t = totals_[p.op];
      t.calls++;
      t.ms += in_->elapsed_ms(p.from, p.to);
    }
    pending_.clear();
    in_->forget_marks();
  }

  void print() const {
    std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double sum = 0.0;
    for (const auto& r : rows) sum += r.second.ms;
    std::printf("\nop profile (ZF_PROFILE), rank 0 on %s, compute %s: device time of each op, all steps\n",
                in_->name().c_str(), dtype_name(compute_));
    std::printf("  %-32s %8s %12s %10s %7s\n", "op", "calls", "total ms", "ms/call", "share");
    for (const auto& [op, t] : rows)
      std::printf("  %-32s %8ld %12.3f %10.4f %6.1f%%\n", op.c_str(), t.calls, t.ms, t.ms / double(t.calls),
                  sum > 0 ? 100.0 * t.ms / sum : 0.0);
    std::printf("  %-32s %8s %12.3f\n", "total", "", sum);
    std::fflush(stdout);
  }

  bool print_;
  std::vector<Pending> pending_;
  std::map<std::string, Total> totals_;
};

}  // namespace

std::unique_ptr<Device> make_profiling_device(std::unique_ptr<Device> inner, bool print) {
  return std::make_unique<ProfilingDevice>(std::move(inner), print);
}

}  // namespace zf
