// modeled_clock.cpp: the modeled clock's costs, timelines and the two
// decorators that charge them (modeled_clock.h).
#include "modeled_clock.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <tuple>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "device_decorator.h"
#include "internal/comm_state.h"

namespace zf {

// ---- costs

double op_seconds(const Hardware& hw, double flops, double bytes, bool tensor, DType compute) {
  const double peak = (tensor && compute == DType::bf16 ? hw.peak_tflops_bf16 : hw.peak_tflops_f32) * 1e12;
  const double math = flops / (peak * hw.compute_efficiency);
  const double memory = bytes / (hw.hbm_gb_per_s * 1e9 * hw.memory_efficiency);
  return std::max(math, memory) + hw.launch_us * 1e-6;
}

double collective_seconds(const Hardware& hw, CollectiveKind kind, size_t bytes, int n, int nodes, int per_node) {
  if (n <= 1) return 0.0;
  const double intra_lat = hw.intra_node_latency_us * 1e-6, inter_lat = hw.inter_node_latency_us * 1e-6;
  // Across nodes NCCL spreads its rings over the NICs of the group's GPUs
  // in a node, each GPU's own: per_node of them, at most NVLink's rate.
  const double busbw = (nodes > 1 ? std::min(hw.intra_node_busbw_gb_per_s, per_node * hw.inter_node_busbw_gb_per_s)
                                  : hw.intra_node_busbw_gb_per_s) * 1e9;
  const double moved = ring_bytes(kind, bytes, n) / busbw;
  // A ring takes n-1 steps (a reduce-scatter or an all-gather), twice that
  // for an all-reduce (one of each); nodes-1 of each n-1 cross a node.
  const double pass = double(n - nodes) * intra_lat + double(nodes - 1) * inter_lat;
  const double ring = (kind == CollectiveKind::all_reduce ? 2.0 : 1.0) * pass + moved;
  if (kind != CollectiveKind::all_reduce || nodes == 1) return ring;
  // A tree all-reduce: up and down a tree of the nodes, and of a node's GPUs.
  const double tree = 2.0 * (std::ceil(std::log2(double(nodes))) * inter_lat +
                             std::ceil(std::log2(double(n) / nodes)) * intra_lat) + moved;
  return std::min(ring, tree);
}

double copy_seconds(const Hardware& hw, size_t bytes, bool pinned) {
  const double bw = (pinned ? hw.pcie_pinned_gb_per_s : hw.pcie_pageable_gb_per_s) * 1e9;
  return hw.pcie_latency_us * 1e-6 + double(bytes) / bw;
}

std::string modeled_clock_description(const Hardware& hw, int world) {
  const int nodes = (world + hw.gpus_per_node - 1) / hw.gpus_per_node;
  std::string s = "modeled on " + hw.name + " x" + std::to_string(world);
  if (nodes > 1) s += ", " + std::to_string(nodes) + " nodes of " + std::to_string(hw.gpus_per_node);
  return s;
}

std::string modeled_trace_events(int rank, const RankClock& clock) {
  using nlohmann::json;
  int queues = 0;
  bool copies = false, host = false;
  for (const RankClock::Span& sp : clock.spans()) {
    if (sp.track >= RankClock::kCommTrack) queues = std::max(queues, sp.track - RankClock::kCommTrack + 1);
    copies = copies || sp.track == RankClock::kCopyTrack;
    host = host || sp.track == RankClock::kHostTrack;
  }
  // Tids as trace.h's: compute 0, the queues 1.., then copy, then host.
  auto tid = [&](int track) {
    if (track == RankClock::kComputeTrack) return 0;
    if (track >= RankClock::kCommTrack) return 1 + track - RankClock::kCommTrack;
    return track == RankClock::kCopyTrack ? 1 + queues : 2 + queues;
  };
  auto category = [](const RankClock::Span& sp) -> std::string {
    const std::string name = sp.name;
    if (sp.track == RankClock::kCopyTrack) return "copy";
    if (sp.track >= RankClock::kCommTrack) return "comm";
    if (name.find("forward") != std::string::npos) return "forward";
    if (name.find("backward") != std::string::npos) return "backward";
    if (name.find("adamw") != std::string::npos || name.find("sum_squares") != std::string::npos) return "optimizer";
    return "other";
  };
  json events = json::array();
  auto name_track = [&](int t, const std::string& name) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", t}, {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", rank}, {"tid", t},
                      {"args", {{"sort_index", t}}}});
  };
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"tid", 0},
                    {"args", {{"name", "rank " + std::to_string(rank)}}}});
  name_track(0, "compute");
  for (int q = 0; q < queues; ++q) name_track(1 + q, q == 0 ? "comm" : "comm q" + std::to_string(q));
  if (copies) name_track(1 + queues, "copy");
  if (host) name_track(2 + queues, "host");
  for (const RankClock::Span& sp : clock.spans()) {
    // Whole nanoseconds, as trace.h's times.
    const int64_t start_ns = std::llround(sp.start * 1e9), end_ns = std::llround(sp.end * 1e9);
    events.push_back({{"ph", "X"}, {"name", sp.name}, {"cat", category(sp)}, {"pid", rank}, {"tid", tid(sp.track)},
                      {"ts", double(start_ns) / 1000.0}, {"dur", double(end_ns - start_ns) / 1000.0},
                      {"args", {{"step", sp.step}}}});
  }
  return events.dump();
}

// ---- timelines

void RankClock::compute(double s, const char* name) {
  if (!running_) return;
  const double start = std::max(compute_, host_);
  compute_ = start + s;
  compute_busy_ += s;
  span(kComputeTrack, name, start, compute_);
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

void RankClock::collective(int queue, CollectiveKind kind, double seconds, double end) {
  if (!running_) return;
  comm_busy_ += seconds;
  span(kCommTrack + queue, collective_name(kind), end - seconds, end);
}

void RankClock::span(int track, const char* name, double start, double end) {
  if (recording_) spans_.push_back({track, name, start, end, step_});
}

void RankClock::wait_collective(double t) {
  if (!running_) return;
  const double ready = std::max(compute_, host_);
  if (t > ready) exposed_comm_ += t - ready;
  compute_ = std::max(compute_, t);
  host_ = std::max(host_, t);
}

void RankClock::synchronize() { host_ = std::max({host_, compute_, copy_}); }

void RankClock::host_work(double s, const char* name) {
  if (!running_) return;
  host_ += s;
  host_busy_ += s;
  span(kHostTrack, name, host_ - s, host_);
}

void RankClock::idle_until(double t) { host_ = compute_ = copy_ = std::max({host_, compute_, copy_, t}); }

void RankClock::skip() {
  StepPhases ignored;
  lap(ignored);
  --step_;
}

double RankClock::lap(StepPhases& phases) {
  idle_until(0);
  if (align_) align_();  // every rank's step ends when the slowest rank's does
  ++step_;
  const double t = host_;
  const Mark now{t, compute_busy_, comm_busy_, copy_busy_, host_busy_, exposed_comm_};
  phases = {{"compute", (now.compute_busy - last_.compute_busy) * 1e3},
            {"comm", (now.comm_busy - last_.comm_busy) * 1e3},
            {"exposed comm", (now.exposed_comm - last_.exposed_comm) * 1e3}};
  if (now.copy_busy > last_.copy_busy) phases.emplace_back("copy", (now.copy_busy - last_.copy_busy) * 1e3);
  if (now.host_busy > last_.host_busy) phases.emplace_back("host", (now.host_busy - last_.host_busy) * 1e3);
  const double ms = (now.t - last_.t) * 1e3;
  last_ = now;
  return ms;
}

// ---- the group's shared queue

// What every group of a run shares: whether the run was aborted (a dry
// run's members wait for each other here, with no backend to wake them).
struct ClockFamily {
  std::mutex mu;
  std::string aborted;  // the reason; empty while running
  std::vector<std::weak_ptr<ClockGroup>> groups;
  double timeout_s = kDefaultCommTimeoutS;
};

class ClockGroup : public std::enable_shared_from_this<ClockGroup> {
 public:
  ClockGroup(int size, std::shared_ptr<ClockFamily> family)
      : world_ranks_(size_t(size), -1), family_(std::move(family)) {}
  int size() const { return int(world_ranks_.size()); }

  void join(int member, int world_rank) {
    std::lock_guard<std::mutex> lock(mu_);
    world_ranks_[size_t(member)] = world_rank;
  }

  // Member's collective number `seq` on this queue, issued when its compute
  // queue was at `ready`. free: a meeting of the ranks that takes no time
  // (RankClock's lap).
  void post(uint64_t seq, double ready, CollectiveKind kind, size_t bytes, bool free = false) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[seq];
    if (e.posted == 0) {
      e.kind = kind;
      e.bytes = bytes;
      e.free = free;
    }
    // What the backend checks in a real run; a dry run has only this.
    REQUIRE(e.kind == kind && e.bytes == bytes && e.free == free,
            "collective #" << seq << " on this communicator: this rank issued " << collective_name(kind) << " of "
                           << bytes << " bytes, another rank " << collective_name(e.kind) << " of " << e.bytes
                           << " bytes: every rank must issue the same collectives in the same order");
    e.ready = std::max(e.ready, ready);
    if (++e.posted == size()) cv_.notify_all();
  }

  // A dry run's wait: until every member has posted `seq` and every one before it.
  void wait_posted(uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu_);
    const bool met = cv_.wait_for(lock, std::chrono::duration<double>(family_->timeout_s), [&] {
      if (!aborted().empty()) return true;
      for (uint64_t s = resolved_; s <= seq; ++s) {
        auto it = entries_.find(s);
        if (it == entries_.end() || it->second.posted < size()) return false;
      }
      return true;
    });
    if (!aborted().empty()) throw CommAborted(aborted());
    if (!met)
      throw CommTimeout("dry run: collective #" + std::to_string(seq) + " waited " +
                        std::to_string(int(family_->timeout_s)) + " s for the other ranks (raise --comm-timeout)");
  }

  // When `seq` ends and how long it ran: the queue's collectives in order,
  // each starting when every member has issued it and the one before has
  // ended. Called once every member has posted it and every earlier one
  // (the backend's collective is done, or wait_posted returned).
  std::pair<double, double> end_of(uint64_t seq, const Hardware& hw) {
    std::lock_guard<std::mutex> lock(mu_);
    const int n = size();
    for (; resolved_ <= seq; ++resolved_) {
      auto it = entries_.find(resolved_);
      REQUIRE(it != entries_.end() && it->second.posted == n,
              "modeled clock: collective #" << resolved_ << " was not issued by all " << n
                                            << " ranks when a later one completed");
      Entry& e = it->second;
      const auto [nodes, per_node] = placement(hw);
      if (e.free) {  // the ranks meet: when the last is there, whatever the queue still runs
        e.end = e.ready;
        continue;
      }
      e.seconds = collective_seconds(hw, e.kind, e.bytes, n, nodes, per_node);
      e.end = std::max(queue_end_, e.ready) + e.seconds;
      queue_end_ = e.end;
    }
    auto it = entries_.find(seq);
    REQUIRE(it != entries_.end(), "modeled clock: collective #" << seq << " was waited for by more ranks than "
                                                                 << n);
    const std::pair<double, double> r{it->second.end, it->second.seconds};
    if (++it->second.reads == n) entries_.erase(it);  // a collective never waited for stays: a few bytes
    return r;
  }

  // The group of the members that passed `color` to their split number
  // `split_no`, where a backend's split ranked them (rank and size known).
  std::shared_ptr<ClockGroup> child(uint64_t split_no, int color, int size) {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<ClockGroup>& c = children_[{split_no, color}];
    if (!c) c = make_child(size);
    return c;
  }

  // A dry run's split, as MPI_Comm_split ranks it: waits for every member,
  // then the members of each color, by (key, member), are a group.
  struct Split {
    std::shared_ptr<ClockGroup> group;
    int rank = 0;
  };
  Split split(uint64_t split_no, int member, int color, int key) {
    std::unique_lock<std::mutex> lock(mu_);
    Meeting& m = meetings_[split_no];
    m.arrivals.push_back({color, key, member});
    if (int(m.arrivals.size()) == size()) {
      std::sort(m.arrivals.begin(), m.arrivals.end(), [](const Arrival& a, const Arrival& b) {
        return std::tie(a.color, a.key, a.member) < std::tie(b.color, b.key, b.member);
      });
      for (size_t i = 0; i < m.arrivals.size();) {
        size_t j = i;
        while (j < m.arrivals.size() && m.arrivals[j].color == m.arrivals[i].color) ++j;
        if (m.arrivals[i].color >= 0) {
          auto g = make_child(int(j - i));
          for (size_t k = i; k < j; ++k) {
            g->world_ranks_[k - i] = world_ranks_[size_t(m.arrivals[k].member)];
            m.placed[m.arrivals[k].member] = {g, int(k - i)};
          }
        }
        i = j;
      }
      cv_.notify_all();
    }
    const bool met = cv_.wait_for(lock, std::chrono::duration<double>(family_->timeout_s), [&] {
      return !aborted().empty() || int(m.arrivals.size()) == size();
    });
    if (!aborted().empty()) throw CommAborted(aborted());
    if (!met) throw CommTimeout("dry run: a split waited " + std::to_string(int(family_->timeout_s)) +
                                " s for the other ranks");
    REQUIRE(color >= 0, "split: color " << color << " < 0");
    const Split mine = m.placed.at(member);
    if (++m.left == size()) meetings_.erase(split_no);
    return mine;
  }

  // Every wait of every group of the run raises CommAborted(reason).
  void abort(const std::string& reason) {
    std::vector<std::shared_ptr<ClockGroup>> all;
    {
      std::lock_guard<std::mutex> lock(family_->mu);
      if (family_->aborted.empty()) family_->aborted = reason.empty() ? "aborted" : reason;
      for (auto& w : family_->groups)
        if (auto g = w.lock()) all.push_back(g);
    }
    for (auto& g : all) {
      std::lock_guard<std::mutex> lock(g->mu_);
      g->cv_.notify_all();
    }
  }

 private:
  struct Entry {
    double ready = 0, end = 0, seconds = 0;
    int posted = 0, reads = 0;
    bool free = false;
    CollectiveKind kind = CollectiveKind::barrier;
    size_t bytes = 0;
  };
  struct Arrival {
    int color, key, member;
  };
  struct Meeting {
    std::vector<Arrival> arrivals;
    std::map<int, Split> placed;  // member -> its group
    int left = 0;
  };

  std::shared_ptr<ClockGroup> make_child(int size) {
    auto c = std::make_shared<ClockGroup>(size, family_);
    std::lock_guard<std::mutex> lock(family_->mu);
    family_->groups.push_back(c);
    return c;
  }
  std::string aborted() const {
    std::lock_guard<std::mutex> lock(family_->mu);
    return family_->aborted;
  }
  // The nodes the members are on, and the fewest members on one of them.
  std::pair<int, int> placement(const Hardware& hw) const {
    std::map<int, int> on;
    for (int r : world_ranks_) on[r / hw.gpus_per_node]++;
    int fewest = size();
    for (const auto& [node, k] : on) fewest = std::min(fewest, k);
    return {int(on.size()), fewest};
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> world_ranks_;  // by member
  std::shared_ptr<ClockFamily> family_;
  std::map<uint64_t, Entry> entries_;
  uint64_t resolved_ = 0;
  double queue_end_ = 0;
  std::map<std::pair<uint64_t, int>, std::shared_ptr<ClockGroup>> children_;
  std::map<uint64_t, Meeting> meetings_;
};

std::shared_ptr<ClockGroup> make_clock_group(int world, double timeout_s) {
  auto family = std::make_shared<ClockFamily>();
  family->timeout_s = comm_timeout_or_default(timeout_s);
  auto g = std::make_shared<ClockGroup>(world, family);
  family->groups.push_back(g);
  for (int r = 0; r < world; ++r) g->join(r, r);
  return g;
}

namespace {

// ---- the communicator

// Without an inner communicator (a dry run) the collectives move nothing:
// the members only meet in their ClockGroup.
class ModeledCommunicator final : public Communicator {
 public:
  // queue: its track in a trace (0: the world's; a split's, its number on the rank).
  ModeledCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<ClockGroup> group, int rank,
                      int world_rank, RankClock& clock, int queue)
      : in_(std::move(inner)), group_(std::move(group)), rank_(rank), world_rank_(world_rank), clock_(clock),
        queue_(queue) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const char* backend() const override { return in_ ? in_->backend() : "dry run"; }

  CommHandle all_reduce_async(void* buf, size_t count, DType dt, ReduceOp op) override {
    const size_t bytes = count * dtype_size(dt);
    const uint64_t seq = post(CollectiveKind::all_reduce, bytes);
    return modeled(CollectiveKind::all_reduce, seq, in_ ? in_->all_reduce_async(buf, count, dt, op) : CommHandle());
  }
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dt,
                                  ReduceOp op) override {
    const size_t bytes = size_t(size()) * recv_count * dtype_size(dt);
    const uint64_t seq = post(CollectiveKind::reduce_scatter, bytes);
    return modeled(CollectiveKind::reduce_scatter, seq,
                   in_ ? in_->reduce_scatter_async(send, recv, recv_count, dt, op) : CommHandle());
  }
  CommHandle all_gather_async(const void* send, void* recv, size_t send_count, DType dt) override {
    const size_t bytes = size_t(size()) * send_count * dtype_size(dt);
    const uint64_t seq = post(CollectiveKind::all_gather, bytes);
    return modeled(CollectiveKind::all_gather, seq,
                   in_ ? in_->all_gather_async(send, recv, send_count, dt) : CommHandle());
  }
  CommHandle broadcast_async(void* buf, size_t count, DType dt, int root) override {
    const size_t bytes = count * dtype_size(dt);
    const uint64_t seq = post(CollectiveKind::broadcast, bytes);
    return modeled(CollectiveKind::broadcast, seq, in_ ? in_->broadcast_async(buf, count, dt, root) : CommHandle());
  }
  void barrier() override {
    const uint64_t seq = post(CollectiveKind::barrier, 0);
    meet(seq);
    finish(CollectiveKind::barrier, seq);
  }
  void abort(const std::string& reason) override {
    if (in_) in_->abort(reason);
    else group_->abort(reason);
  }

  // The ranks meet, at no cost: each waits until the last has got here.
  void align() {
    group_->post(issued_++, clock_.compute_now(), CollectiveKind::barrier, 0, /*free*/ true);
    meet(issued_ - 1);
    clock_.idle_until(group_->end_of(issued_ - 1, clock_.hardware()).first);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (!in_) {
      ClockGroup::Split mine = group_->split(splits_++, rank_, color, key);
      return std::make_unique<ModeledCommunicator>(nullptr, std::move(mine.group), mine.rank, world_rank_, clock_,
                                                   clock_.new_queue());
    }
    std::unique_ptr<Communicator> inner = in_->split(color, key);
    std::shared_ptr<ClockGroup> child = group_->child(splits_++, color, inner->size());
    child->join(inner->rank(), world_rank_);
    const int rank = inner->rank();
    return std::make_unique<ModeledCommunicator>(std::move(inner), std::move(child), rank, world_rank_, clock_,
                                                 clock_.new_queue());
  }

 private:
  uint64_t post(CollectiveKind kind, size_t bytes) {
    if (owner_ == std::thread::id()) owner_ = std::this_thread::get_id();
    {  // counted as the threads backend counts them (comm.h)
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.add(kind, ring_bytes(kind, bytes, size()));
    }
    group_->post(issued_, clock_.compute_now(), kind, bytes, /*free: before the steps*/ !clock_.running());
    return issued_++;
  }

  // The backend's collective is done: charge its modeled end to the rank.
  void finish(CollectiveKind kind, uint64_t seq) {
    const auto [end, seconds] = group_->end_of(seq, clock_.hardware());
    clock_.wait_collective(end);
    clock_.collective(queue_, kind, seconds, end);
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.seconds[int(kind)] += seconds;
  }

  // The backend's collective `seq` is done (a dry run: every member has issued it).
  void meet(uint64_t seq) {
    if (in_) in_->barrier();
    else group_->wait_posted(seq);
  }

  // A handle whose first wait waits for the backend's, then charges the clock.
  CommHandle modeled(CollectiveKind kind, uint64_t seq, CommHandle inner) {
    auto outer = std::make_shared<CommHandle::State>();
    CommHandle::State* self = outer.get();
    outer->on_wait = [this, kind, seq, self, inner]() mutable {
      REQUIRE(std::this_thread::get_id() == owner_,
              "modeled clock: a collective waited for on another thread than its rank's");
      {
        std::lock_guard<std::mutex> lock(self->mu);
        if (self->done) return;
      }
      if (in_) inner.wait_host();
      else group_->wait_posted(seq);
      finish(kind, seq);
      self->finish();
    };
    return CommHandle(outer);
  }

  std::unique_ptr<Communicator> in_;
  std::shared_ptr<ClockGroup> group_;
  int rank_, world_rank_;
  RankClock& clock_;
  int queue_;
  std::thread::id owner_;  // the rank's thread, which alone charges its clock: the one that issues
  uint64_t issued_ = 0, splits_ = 0;
};

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
    op("matmul_forward", 2.0 * N * IC * OC, (double(N) * IC + double(IC) * OC + double(N) * OC + OC) * e(),
       true);
  }
  // dinp and dweight: two products of the forward's size (added into).
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int N, int IC, int OC) override {
    in_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    op("matmul_backward", 4.0 * N * IC * OC,
       (double(N) * OC + 3.0 * N * IC + 3.0 * IC * OC + 2.0 * OC) * e(), true);
  }
  // Q·K^T and P·V over [B,H,T,T]: 4·B·T²·C FLOPs for the whole square (the
  // simple form, whose probabilities are written and kept), half of it for
  // the causal triangle flash computes; its backward recomputes the scores.
  void attention_forward(void* out, void* saved, float* scratch, const void* qkv, int B, int T, int C,
                         int H) override {
    in_->attention_forward(out, saved, scratch, qkv, B, T, C, H);
    const double io = 4.0 * B * T * C * e();
    if (attention_ == AttentionForm::flash)
      op("attention_forward", 2.0 * B * T * double(T) * C, io + 4.0 * B * H * T, true);
    else
      op("attention_forward", 4.0 * B * T * double(T) * C, io + double(B) * H * double(T) * T * e(), true);
  }
  void attention_backward(void* dqkv, float* scratch, const void* dout, const void* out, const void* qkv,
                          const void* saved, int B, int T, int C, int H) override {
    in_->attention_backward(dqkv, scratch, dout, out, qkv, saved, B, T, C, H);
    const double io = 11.0 * B * T * C * e();
    // The simple form reads the probabilities and writes their gradient through the softmax's.
    if (attention_ == AttentionForm::flash)
      op("attention_backward", 5.0 * B * T * double(T) * C, io + 4.0 * B * H * T, true);
    else
      op("attention_backward", 8.0 * B * T * double(T) * C, io + 3.0 * B * H * double(T) * T * e(), true);
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
  void op(const char* name, double flops, double bytes, bool tensor = false) {
    clock_.compute(op_seconds(clock_.hardware(), flops, bytes, tensor, compute_), name);
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
    REQUIRE(std::this_thread::get_id() == owner_,
            "modeled clock: the host's work on a thread of its own (--delay-update) is not modeled");
    clock_.host_work(s, name);
  }

  RankClock& clock_;
  std::thread::id owner_;
};

}  // namespace

std::unique_ptr<Device> RankClock::on_host(std::unique_ptr<Device> cpu) {
  return std::make_unique<ModeledHostDevice>(std::move(cpu), *this);
}

std::unique_ptr<Device> make_modeled_device(std::unique_ptr<Device> inner, RankClock& clock) {
  return std::make_unique<ModeledDevice>(std::move(inner), clock);
}

std::unique_ptr<Communicator> make_modeled_communicator(std::unique_ptr<Communicator> inner,
                                                        std::shared_ptr<ClockGroup> group, int world_rank,
                                                        RankClock& clock) {
  auto comm =
      std::make_unique<ModeledCommunicator>(std::move(inner), std::move(group), world_rank, world_rank, clock, 0);
  clock.set_align([c = comm.get()] { c->align(); });
  return comm;
}

}  // namespace zf
