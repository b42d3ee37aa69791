// compute_decorators.cpp: the injected fault (or stall), the recorded compute events, the step's times.
#include "compute_decorators.h"

#include <chrono>
#include <string>
#include <thread>

#include "check.h"
#include "comm_recording.h"

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

 private:
  std::unique_ptr<RankCompute> in_;
  int rank_, fault_step_;
  bool stall_;
  int head_;
  int step_ = -1;
};

class RecordedCompute final : public RankCompute {
 public:
  RecordedCompute(std::unique_ptr<RankCompute> inner, RecordingCommunicator& rec)
      : in_(std::move(inner)), rec_(rec) {
    in_->on_recompute([this](int u, bool begin) {
      rec_.compute(begin ? ScheduleEvent::recompute_begin : ScheduleEvent::recompute_end, u);
    });
  }
  void load(int step, int micro) override {
    rec_.loaded(step, micro);
    in_->load(step, micro);
  }
  void load_val(int b) override { in_->load_val(b); }
  void load_context(const std::vector<int32_t>& tokens) override { in_->load_context(tokens); }
  void logits(int t, float* out) override { in_->logits(t, out); }
  void forward(int u, const void* params, float* loss) override {
    rec_.compute(ScheduleEvent::forward_begin, u);
    in_->forward(u, params, loss);
    rec_.compute(ScheduleEvent::forward_end, u);
  }
  void backward(int u, const void* params, void* grads) override {
    rec_.compute(ScheduleEvent::backward_begin, u);
    in_->backward(u, params, grads);
    rec_.compute(ScheduleEvent::backward_end, u);
  }

 private:
  std::unique_ptr<RankCompute> in_;
  RecordingCommunicator& rec_;
};

// Each unit's forward and backward, told to the rank's clock.
class ClockedCompute final : public RankCompute {
 public:
  ClockedCompute(std::unique_ptr<RankCompute> inner, const ModelLayout& layout, StepClock& clock)
      : in_(std::move(inner)), layout_(layout), clock_(clock) {}
  void load(int step, int micro) override { in_->load(step, micro); }
  void load_val(int b) override { in_->load_val(b); }
  void load_context(const std::vector<int32_t>& tokens) override { in_->load_context(tokens); }
  void logits(int t, float* out) override { in_->logits(t, out); }
  void forward(int u, const void* params, float* loss) override {
    clock_.unit(true, true, layout_.units[size_t(u)].name);
    in_->forward(u, params, loss);
    clock_.unit(false, true, layout_.units[size_t(u)].name);
  }
  void backward(int u, const void* params, void* grads) override {
    clock_.unit(true, false, layout_.units[size_t(u)].name);
    in_->backward(u, params, grads);
    clock_.unit(false, false, layout_.units[size_t(u)].name);
  }
  void on_recompute(std::function<void(int unit, bool begin)> hook) override { in_->on_recompute(std::move(hook)); }

 private:
  std::unique_ptr<RankCompute> in_;
  const ModelLayout& layout_;
  StepClock& clock_;
};

// Each forward or backward adds the time since the end of the call before
// it (or the load), so the waits between units count with the units.
class TimedCompute final : public RankCompute {
 public:
  TimedCompute(std::unique_ptr<RankCompute> inner, StepTimes& times) : in_(std::move(inner)), times_(times) {}
  void load(int step, int micro) override {
    in_->load(step, micro);
    training_ = true;
    last_ = Clock::now();
  }
  void load_val(int b) override {
    training_ = false;
    in_->load_val(b);
  }
  void load_context(const std::vector<int32_t>& tokens) override {
    training_ = false;
    in_->load_context(tokens);
  }
  void logits(int t, float* out) override { in_->logits(t, out); }
  void forward(int u, const void* params, float* loss) override {
    in_->forward(u, params, loss);
    lap(times_.forward);
  }
  void backward(int u, const void* params, void* grads) override {
    in_->backward(u, params, grads);
    lap(times_.backward);
  }
  void on_recompute(std::function<void(int unit, bool begin)> hook) override { in_->on_recompute(std::move(hook)); }

 private:
  using Clock = std::chrono::steady_clock;
  void lap(double& into) {
    if (!training_) return;
    const Clock::time_point now = Clock::now();
    into += std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
  }
  std::unique_ptr<RankCompute> in_;
  StepTimes& times_;
  bool training_ = false;  // since a training micro-batch's load
  Clock::time_point last_;
};

}  // namespace

std::unique_ptr<RankCompute> timed(std::unique_ptr<RankCompute> inner, StepTimes& times) {
  return std::make_unique<TimedCompute>(std::move(inner), times);
}

std::unique_ptr<RankCompute> maybe_faulty(std::unique_ptr<RankCompute> inner, const TrainConfig& cfg,
                                          const ModelLayout& layout, int rank) {
  if (rank != cfg.fault_rank || cfg.fault_step < 0) return inner;
  return std::make_unique<FaultyCompute>(std::move(inner), rank, cfg.fault_step, cfg.fault_stall,
                                         layout.head_unit());
}

std::unique_ptr<RankCompute> maybe_clocked(std::unique_ptr<RankCompute> inner, const ModelLayout& layout,
                                           StepClock* clock) {
  if (!clock) return inner;
  return std::make_unique<ClockedCompute>(std::move(inner), layout, *clock);
}

std::unique_ptr<RankCompute> maybe_recorded(std::unique_ptr<RankCompute> inner, Communicator& comm) {
  RecordingCommunicator* rec = find_recorder(comm);
  if (!rec) return inner;
  return std::make_unique<RecordedCompute>(std::move(inner), *rec);
}

}  // namespace zf
