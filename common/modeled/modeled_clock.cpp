// modeled_clock.cpp: the modeled clock's costs and a rank's timelines
// (modeled_clock.h); its communicator is modeled_comm.cpp, its devices
// modeled_device.cpp.
#include "modeled_clock.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "check.h"
#include "rank_compute.h"

namespace zf {

// ---- costs

double op_seconds(const Hardware& hw, double math, double bytes) {
  const double memory = bytes / (hw.hbm_gb_per_s * 1e9 * hw.memory_efficiency);
  return std::max(math, memory) + hw.launch_us * 1e-6;
}

// The peak's share that `sms` of the SMs have (0: all).
double share(const Hardware& hw, int sms) { return sms > 0 ? double(sms) / hw.sm_count : 1.0; }

double arithmetic_seconds(const Hardware& hw, double flops, bool tensor, DType compute, int sms) {
  const double peak = (tensor && compute == DType::bf16 ? hw.peak_tflops_bf16 : hw.peak_tflops_f32) * 1e12;
  return flops / (peak * hw.gemm_efficiency * share(hw, sms));
}

double gemm_seconds(const Hardware& hw, double M, double N, double K, DType compute, int sms) {
  const double tiles = std::ceil(M / hw.gemm_tile_m) * std::ceil(N / hw.gemm_tile_n);
  const double waves = std::ceil(tiles / (sms > 0 ? sms : hw.sm_count));
  // A wave: every SM one tile, the full K, at its share of the GEMM rate.
  const double wave = arithmetic_seconds(hw, 2.0 * hw.gemm_tile_m * hw.gemm_tile_n * K * hw.sm_count, true, compute);
  return waves * wave;
}

double flash_attention_seconds(const Hardware& hw, double flops, bool backward, DType compute, int sms) {
  if (compute != DType::bf16) return arithmetic_seconds(hw, flops, true, compute, sms);
  return flops / ((backward ? hw.flash_backward_tflops : hw.flash_forward_tflops) * 1e12 * share(hw, sms));
}

double copy_seconds(const Hardware& hw, size_t bytes, bool pinned) {
  const double bw = (pinned ? hw.pcie_pinned_gb_per_s : hw.pcie_pageable_gb_per_s) * 1e9;
  return hw.pcie_latency_us * 1e-6 + double(bytes) / bw;
}

std::string modeled_clock_description(const Hardware& hw, int world) {
  const int nodes = (world + hw.gpus_per_node - 1) / hw.gpus_per_node;
  std::string s = "modeled on " + hw.name + " x" + std::to_string(world);
  if (nodes > 1) s += ", " + std::to_string(nodes) + " nodes of " + std::to_string(hw.gpus_per_node);
  if (nodes > 1 && world % hw.gpus_per_node != 0) s += ", " + std::to_string(world % hw.gpus_per_node) + " on the last";
  return s;
}

std::string modeled_trace_events(int rank, const RankClock& clock) {
  using nlohmann::json;
  int queues = 0;
  bool copies = false, host = false, worker = false, disk = false;
  for (const RankClock::Span& sp : clock.spans()) {
    if (sp.track >= RankClock::kCommTrack) queues = std::max(queues, sp.track - RankClock::kCommTrack + 1);
    copies = copies || sp.track == RankClock::kCopyTrack;
    host = host || sp.track == RankClock::kHostTrack;
    worker = worker || sp.track == RankClock::kWorkerTrack;
    disk = disk || sp.track == RankClock::kDiskTrack;
  }
  // Tids as trace.h's: compute 0, the queues 1.., then copy, host, its worker, the disk.
  auto tid = [&](int track) {
    if (track == RankClock::kComputeTrack) return 0;
    if (track >= RankClock::kCommTrack) return 1 + track - RankClock::kCommTrack;
    return 1 + queues + (track - RankClock::kCopyTrack);
  };
  auto category = [](const RankClock::Span& sp) -> std::string {
    const std::string name = sp.name;
    if (sp.track == RankClock::kCopyTrack || sp.track == RankClock::kDiskTrack) return "copy";
    if (sp.track >= RankClock::kCommTrack) return "comm";
    if (name.find("forward") != std::string::npos) return "forward";
    if (name.find("backward") != std::string::npos) return "backward";
    if (name.find("adamw") != std::string::npos || name.find("sum_squares") != std::string::npos) return "optimizer";
    return "other";
  };
  json events = json::array();
  auto name_track = [&](int t, const std::string& name, int sort_index) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", t}, {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", rank}, {"tid", t},
                      {"args", {{"sort_index", sort_index}}}});
  };
  auto span = [&](const std::string& name, const std::string& cat, int t, double start, double end, int step,
                  const char* algorithm = "", const char* protocol = "") {
    // Whole nanoseconds, as trace.h's times.
    const int64_t start_ns = std::llround(start * 1e9), end_ns = std::llround(end * 1e9);
    json args = {{"step", step}};
    if (*algorithm) args["algorithm"] = algorithm;  // a collective's: how NCCL would run it
    if (*protocol) args["protocol"] = protocol;
    events.push_back({{"ph", "X"}, {"name", name}, {"cat", cat}, {"pid", rank}, {"tid", t},
                      {"ts", double(start_ns) / 1000.0}, {"dur", double(end_ns - start_ns) / 1000.0},
                      {"args", args}});
  };
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"tid", 0},
                    {"args", {{"name", "rank " + std::to_string(rank)}}}});
  name_track(0, "compute", 0);
  for (int q = 0; q < queues; ++q) name_track(1 + q, q == 0 ? "comm" : "comm q" + std::to_string(q), 1 + q);
  if (copies) name_track(1 + queues, "copy", 1 + queues);
  if (host) name_track(2 + queues, "host", 2 + queues);
  if (worker) name_track(3 + queues, "host worker", 3 + queues);
  if (disk) name_track(4 + queues, "disk", 4 + queues);
  // The units' forwards and backwards on a track of their own, drawn above compute.
  const int units_tid = 5 + queues;
  if (!clock.unit_spans().empty()) name_track(units_tid, "units", -1);
  for (const RankClock::UnitSpan& u : clock.unit_spans())
    span((u.forward ? "fwd " : "bwd ") + u.unit, u.forward ? "forward" : "backward", units_tid, u.start, u.end,
         u.step);
  for (const RankClock::Span& sp : clock.spans())
    span(sp.name, category(sp), tid(sp.track), sp.start, sp.end, sp.step, sp.algorithm, sp.protocol);
  return events.dump();
}

// ---- timelines

void RankClock::compute(double s, const char* name, double shared) {
  if (!running_) return;
  const double start = std::max(compute_, host_);
  compute_ = start + s;
  compute_busy_ += s;
  span(kComputeTrack, name, start, compute_);
  if (!issued_.empty() && shared > s) beside_.push_back({start, compute_, shared - s, {}});
}

void RankClock::collective_issued(double ready) {
  if (running_) issued_.insert(ready);
}

// The part of [a, b] that none of `covered` covers, which then covers it too.
static double uncovered(double a, double b, std::vector<std::pair<double, double>>& covered) {
  std::vector<std::pair<double, double>> left{{a, b}};
  for (const auto& [c0, c1] : covered) {
    std::vector<std::pair<double, double>> next;
    for (const auto& [l0, l1] : left) {
      if (c0 > l0) next.push_back({l0, std::min(l1, c0)});
      if (c1 < l1) next.push_back({std::max(l0, c1), l1});
    }
    left.clear();
    for (const auto& p : next)
      if (p.second > p.first) left.push_back(p);
  }
  double length = 0;
  for (const auto& p : left) length += p.second - p.first;
  covered.insert(covered.end(), left.begin(), left.end());
  return length;
}

void RankClock::collective_ran(double ready, double start, double end) {
  auto it = issued_.find(ready);
  if (it == issued_.end() || !running_) return;  // issued before the steps, or in a step that has ended
  issued_.erase(it);
  double late = 0;
  for (Beside& op : beside_) {
    const double a = std::max(op.start, start), b = std::min(op.end, end);
    if (b > a) late += op.extra * uncovered(a, b, op.charged) / (op.end - op.start);
  }
  if (late > 0) {
    const double from = compute_;
    compute_ += late;
    compute_busy_ += late;
    span(kComputeTrack, "SMs held by a collective", from, compute_);
  }
  // An op that ended before every collective still running was issued ran beside none.
  while (!beside_.empty() && (issued_.empty() || beside_.front().end <= *issued_.begin())) beside_.pop_front();
}

void RankClock::blocking_copy(double s, bool to_host) {
  if (!running_) return;
  const double start = std::max({host_, compute_, copy_});
  host_ = compute_ = start + s;
  copy_busy_ += s;
  span(kCopyTrack, to_host ? "d2h" : "h2d", start, host_);
}

double RankClock::async_copy(double s, bool to_host) {
  if (!running_) return 0;
  const double start = std::max({copy_, host_, to_host ? compute_ : 0.0});
  copy_ = start + s;
  copy_busy_ += s;
  span(kCopyTrack, to_host ? "d2h" : "h2d", start, copy_);
  return copy_;
}

void RankClock::collective(int queue, CollectiveKind kind, double seconds, double end, const char* algorithm,
                           const char* protocol) {
  if (!running_) return;
  if (size_t(queue) >= queue_busy_.size()) queue_busy_.resize(queue + 1, 0.0);
  queue_busy_[queue] += seconds;
  span(kCommTrack + queue, collective_name(kind), end - seconds, end, algorithm, protocol);
}

void RankClock::span(int track, const char* name, double start, double end, const char* algorithm,
                     const char* protocol) {
  if (!recording_) return;
  if (on_forked_thread()) worker_.spans.push_back({track, name, start, end, worker_.step});  // kept until the join
  else spans_.push_back({track, name, start, end, between_ ? -1 : step_, algorithm, protocol});
}

namespace {

// Each unit's forward and backward, told to the rank's clock (--trace draws them over their ops).
class ClockedCompute final : public RankCompute {
 public:
  ClockedCompute(std::unique_ptr<RankCompute> inner, const ModelLayout& layout, RankClock& clock)
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
  RankClock& clock_;
};

}  // namespace

std::unique_ptr<RankCompute> RankClock::wrap(std::unique_ptr<RankCompute> rc, const ModelLayout& layout) {
  return std::make_unique<ClockedCompute>(std::move(rc), layout, *this);
}

void RankClock::unit(bool begin, bool forward, const std::string& unit) {
  if (!recording_ || !running_ || on_forked_thread()) return;
  if (begin) {
    unit_ops_ = spans_.size();
    return;
  }
  bool any = false;
  double start = 0, end = 0;
  for (size_t i = unit_ops_; i < spans_.size(); ++i) {
    const Span& op = spans_[i];
    if (op.track != kComputeTrack) continue;
    start = any ? std::min(start, op.start) : op.start;
    end = any ? std::max(end, op.end) : op.end;
    any = true;
  }
  if (any) units_.push_back({unit, forward, start, end, between_ ? -1 : step_});
}

void RankClock::wait_collective(double t) {
  if (!running_) return;
  const double ready = std::max(compute_, host_);
  if (t > ready) exposed_comm_ += t - ready;
  compute_ = std::max(compute_, t);
  host_ = std::max(host_, t);
}

void RankClock::synchronize() { host_ = std::max({host_, compute_, copy_}); }

namespace {
// The clock whose forked work this thread runs, if any.
thread_local RankClock* forked_on_this_thread = nullptr;
}  // namespace

std::function<void()> RankClock::fork(std::function<void()> work) {
  if (!running_) return work;
  worker_ = Worker{true, host_, 0, 0, between_ ? -1 : step_, {}, {}};
  host_cpu_.clear();
  return [this, work = std::move(work)] {
    struct OnThisThread {
      explicit OnThisThread(RankClock* c) { forked_on_this_thread = c; }
      ~OnThisThread() { forked_on_this_thread = nullptr; }
    } on(this);
    work();
  };
}

bool RankClock::on_forked_thread() const { return forked_on_this_thread == this; }

void RankClock::join() {
  if (!worker_.forked) return;
  worker_.forked = false;
  // One CPU for the two, the host's own work first: each of the worker's
  // pieces of work runs, from where it began (or the previous piece ended,
  // if later), only where the host's did not (both lists are in time order,
  // each without overlaps). The worker's waits stay where they were.
  double end = 0;
  size_t j = 0;
  std::vector<std::pair<double, double>> moved;  // each piece's first and last moment, replayed
  for (const auto& [a0, a1] : worker_.cpu) {
    double t = std::max(a0, end), left = a1 - a0, first = -1;
    while (left > 0) {
      while (j < host_cpu_.size() && host_cpu_[j].second <= t) ++j;
      if (j < host_cpu_.size() && host_cpu_[j].first <= t) {  // the host works: the worker waits
        t = host_cpu_[j].second;
        continue;
      }
      const double run = std::min(left, j < host_cpu_.size() ? host_cpu_[j].first - t : left);
      if (first < 0) first = t;
      t += run;
      left -= run;
    }
    moved.emplace_back(first < 0 ? t : first, t);
    end = t;
  }
  host_cpu_.clear();
  // --trace: the worker's spans where its work ran (one a piece, in order).
  size_t k = 0;
  for (Span& sp : worker_.spans)
    if (sp.track == kWorkerTrack && k < moved.size()) std::tie(sp.start, sp.end) = moved[k++];
  worker_.t = std::max(worker_.t, end);
  host_ = std::max(host_, worker_.t);
  host_busy_ += worker_.busy;
  disk_busy_ += worker_.disk_busy;
  spans_.insert(spans_.end(), worker_.spans.begin(), worker_.spans.end());
}

double RankClock::disk(size_t bytes) {
  const bool worker = on_forked_thread();
  if (!worker && !running_) return 0;
  REQUIRE(worker || !worker_.forked, "modeled clock: the host used the disk while a forked work may (join it first)");
  const double s = double(bytes) / (hw_.nvme_gb_per_s * 1e9 * host_share_);
  const double start = std::max(disk_, worker ? worker_.t : host_);
  disk_ = start + s;
  (worker ? worker_.disk_busy : disk_busy_) += s;
  span(kDiskTrack, "disk", start, disk_);
  return disk_;
}

void RankClock::wait_until(double t) {
  if (on_forked_thread()) worker_.t = std::max(worker_.t, t);
  else if (running_) host_ = std::max(host_, t);
}

void RankClock::host_work(double s, const char* name) {
  if (on_forked_thread()) {
    worker_.t += s;
    worker_.busy += s;
    worker_.cpu.emplace_back(worker_.t - s, worker_.t);
    span(kWorkerTrack, name, worker_.t - s, worker_.t);
    return;
  }
  if (!running_) return;
  host_ += s;
  host_busy_ += s;
  if (worker_.forked) host_cpu_.emplace_back(host_ - s, host_);
  span(kHostTrack, name, host_ - s, host_);
}

void RankClock::idle_until(double t) { host_ = compute_ = copy_ = std::max({host_, compute_, copy_, t}); }

void RankClock::skip() {
  StepPhases ignored;
  lap(ignored);
  --step_;
  between_ = false;
}

double RankClock::lap(StepPhases& phases) {
  idle_until(0);
  // A collective not waited for in its step lends its SMs to no later op.
  issued_.clear();
  beside_.clear();
  if (align_) align_();  // every rank's step ends when the slowest rank's does
  ++step_;
  between_ = true;  // until skip(): the stop vote, a save
  const double t = host_;
  const double comm_busy = std::accumulate(queue_busy_.begin(), queue_busy_.end(), 0.0);
  const Mark now{t, compute_busy_, comm_busy, copy_busy_, host_busy_, exposed_comm_, disk_busy_};
  phases = {{"compute", (now.compute_busy - last_.compute_busy) * 1e3},
            {"comm", (now.comm_busy - last_.comm_busy) * 1e3},
            {"exposed comm", (now.exposed_comm - last_.exposed_comm) * 1e3}};
  if (now.copy_busy > last_.copy_busy) phases.emplace_back("copy", (now.copy_busy - last_.copy_busy) * 1e3);
  if (now.host_busy > last_.host_busy) phases.emplace_back("host", (now.host_busy - last_.host_busy) * 1e3);
  if (now.disk_busy > last_.disk_busy) phases.emplace_back("disk", (now.disk_busy - last_.disk_busy) * 1e3);
  // With more than one communicator, each queue's own busy time: "comm" is
  // their sum, and queues run at once (hybrid sharding's two groups).
  last_queue_busy_.resize(queue_busy_.size(), 0.0);
  if (queues_ > 0)
    for (size_t q = 0; q < queue_busy_.size(); ++q)
      if (queue_busy_[q] > last_queue_busy_[q])
        phases.emplace_back("comm q" + std::to_string(q), (queue_busy_[q] - last_queue_busy_[q]) * 1e3);
  last_queue_busy_ = queue_busy_;
  const double ms = (now.t - last_.t) * 1e3;
  last_ = now;
  return ms;
}


}  // namespace zf
