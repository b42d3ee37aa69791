// compute_decorators.cpp: the recorded compute events, the step's times.
#include "compute_decorators.h"

#include <chrono>

#include "comm_recording.h"

namespace zf {

namespace {

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

std::unique_ptr<RankCompute> maybe_recorded(std::unique_ptr<RankCompute> inner, Communicator& comm) {
  RecordingCommunicator* rec = find_recorder(comm);
  if (!rec) return inner;
  return std::make_unique<RecordedCompute>(std::move(inner), *rec);
}

}  // namespace zf
