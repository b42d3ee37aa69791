// wall_phases.cpp: the host's AdamW timed, and a step's phases from the decorators' sums.
#include "wall_phases.h"

#include <chrono>

#include "device_decorator.h"

namespace zf {

namespace {

class TimedHost final : public DeviceDecorator {
 public:
  TimedHost(std::unique_ptr<Device> inner, std::atomic<int64_t>& ns) : DeviceDecorator(std::move(inner)), ns_(ns) {}
  void adamw(float* param, const void* grad, DType gdt, float* m, float* v, size_t n, const AdamWConfig& cfg,
             long step, float scale, bool decay) override {
    const auto start = Clock::now();
    in_->adamw(param, grad, gdt, m, v, n, cfg, step, scale, decay);
    add(start);
  }
  void adamw_copy(float* param, const void* grad, DType gdt, float* m, float* v, void* out, DType out_dtype, size_t n,
                  const AdamWConfig& cfg, long step, float scale, bool decay) override {
    const auto start = Clock::now();
    in_->adamw_copy(param, grad, gdt, m, v, out, out_dtype, n, cfg, step, scale, decay);
    add(start);
  }

 private:
  using Clock = std::chrono::steady_clock;
  void add(Clock::time_point start) {
    ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  }
  std::atomic<int64_t>& ns_;
};

}  // namespace

std::unique_ptr<Device> WallPhases::timed_host(std::unique_ptr<Device> host) {
  return std::make_unique<TimedHost>(std::move(host), adamw_ns_);
}

StepPhases WallPhases::lap(double step_ms) {
  const double adamw_ms = double(adamw_ns_.exchange(0)) * 1e-6;
  const double optimizer = off_path_ ? off_path_->worker_ms : adamw_ms;
  const double path = compute_.forward + compute_.backward + (off_path_ ? off_path_->wait_ms : adamw_ms);
  StepPhases p = {{"fwd", compute_.forward}, {"bwd", compute_.backward}, {"cpu adamw", optimizer}};
  if (off_path_) p.emplace_back("adamw wait", off_path_->wait_ms);
  p.emplace_back("wait", step_ms > path ? step_ms - path : 0.0);
  compute_ = StepTimes();
  off_path_.reset();
  return p;
}

}  // namespace zf
