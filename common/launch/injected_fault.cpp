// injected_fault.cpp: the failing compute of --inject-fault, and the hooks that wrap it around a rank's.
#include "injected_fault.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "rank_compute.h"

namespace zf {

namespace {

class FaultyCompute final : public RankCompute {
 public:
  FaultyCompute(std::unique_ptr<RankCompute> inner, int rank, int step, bool stall, int head_unit)
      : in_(std::move(inner)), rank_(rank), fault_step_(step), stall_(stall), head_(head_unit) {}
  void load(int step, int micro) override {
    step_ = step;
    in_->load(step, micro);
  }
  void load_val(int b) override { in_->load_val(b); }
  void load_context(const std::vector<int32_t>& tokens) override { in_->load_context(tokens); }
  void logits(int t, float* out) override { in_->logits(t, out); }
  void forward(int u, const void* params, float* loss) override { in_->forward(u, params, loss); }
  void backward(int u, const void* params, void* grads) override {
    in_->backward(u, params, grads);
    if (u != head_ || step_ != fault_step_) return;
    // A rank stuck outside any collective (a deadlock, an endless loop): it
    // never comes back, so the others' next collective times out.
    if (stall_)
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    throw Error("injected fault (--inject-fault " + std::to_string(rank_) + ":" + std::to_string(step_) +
                ") in the middle of step " + std::to_string(step_));
  }
  void on_recompute(std::function<void(int unit, bool begin)> hook) override { in_->on_recompute(std::move(hook)); }

 private:
  std::unique_ptr<RankCompute> in_;
  int rank_, fault_step_;
  bool stall_;
  int head_;
  int step_ = -1;
};

// The rank's own hooks (or none), with the failing compute outermost.
class FaultHooks final : public RunHooks {
 public:
  FaultHooks(const RunConfig& cfg, int rank, RunHooks* inner)
      : rank_(rank), step_(cfg.fault_step), stall_(cfg.fault_stall), in_(inner) {}
  std::unique_ptr<RankCompute> wrap(std::unique_ptr<RankCompute> rc, const ModelLayout& layout) override {
    if (in_) rc = in_->wrap(std::move(rc), layout);
    return std::make_unique<FaultyCompute>(std::move(rc), rank_, step_, stall_, layout.head_unit());
  }
  void start(int first_step) override {
    if (in_) in_->start(first_step);
  }
  void end_step(double& ms, StepPhases& phases) override {
    if (in_) in_->end_step(ms, phases);
  }
  void skip() override {
    if (in_) in_->skip();
  }
  void stop() override {
    if (in_) in_->stop();
  }
  HostClock* host_clock() override { return in_ ? in_->host_clock() : nullptr; }
  bool dry() const override { return in_ && in_->dry(); }

 private:
  int rank_, step_;
  bool stall_;
  RunHooks* in_;
};

}  // namespace

std::unique_ptr<RunHooks> maybe_inject_fault(const RunConfig& cfg, const RankContext& ctx) {
  if (ctx.rank != cfg.fault_rank || cfg.fault_step < 0) return nullptr;
  return std::make_unique<FaultHooks>(cfg, ctx.rank, ctx.hooks);
}

}  // namespace zf
