// modeled_comm.cpp: the modeled clock's communicator (modeled_clock.h): the
// queue a communicator's members share, and the decorator that charges it.
#include "modeled_clock.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "fibers.h"
#include "internal/comm_state.h"

namespace zf {

// ---- the group's shared queue

// What every group of a run shares: whether the run was aborted (a dry
// run's members wait for each other in their groups, with no backend to
// wake them).
struct ClockFamily {
  std::mutex mu;
  std::string aborted;  // the reason; empty while running
};

class ClockGroup {
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
  void post(uint64_t seq, int member, double ready, CollectiveKind kind, size_t bytes, bool free = false) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[seq];
    if (e.posted == 0) {
      e.kind = kind;
      e.bytes = bytes;
      e.free = free;
      e.by.assign(size_t(size()), 0);
    }
    e.by[size_t(member)] = 1;
    // What the backend checks in a real run; a dry run has only this.
    REQUIRE(e.kind == kind && e.bytes == bytes && e.free == free,
            "collective #" << seq << " on this communicator: this rank issued " << collective_name(kind) << " of "
                           << bytes << " bytes, another rank " << collective_name(e.kind) << " of " << e.bytes
                           << " bytes: every rank must issue the same collectives in the same order");
    e.ready = std::max(e.ready, ready);
    ++e.posted;
  }

  // A dry run's wait (its ranks are fibers, fibers.h): until every member
  // has posted `seq` and every one before it.
  void wait_posted(uint64_t seq) {
    const bool met = wait_on_fiber([&] {
      std::lock_guard<std::mutex> lock(mu_);
      return !aborted().empty() || posted_through(seq);
    });
    if (!aborted().empty()) throw CommAborted(aborted());
    if (!met)
      throw CommTimeout("dry run: collective #" + std::to_string(seq) + " can never complete: every rank waits, and " +
                        missing(seq) + " (each returned, or waits on another collective)");
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
      if (nodes_ == 0) std::tie(nodes_, per_node_) = placement(hw);  // the members are placed before any collective
      const int nodes = nodes_, per_node = per_node_;
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
    {
      std::lock_guard<std::mutex> lock(mu_);
      Meeting& m = meetings_[split_no];
      m.arrivals.push_back({color, key, member});
      if (int(m.arrivals.size()) == size()) place(m);
    }
    const bool met = wait_on_fiber([&] {
      std::lock_guard<std::mutex> lock(mu_);
      return !aborted().empty() || int(meetings_.at(split_no).arrivals.size()) == size();
    });
    if (!aborted().empty()) throw CommAborted(aborted());
    if (!met) throw CommTimeout("dry run: split #" + std::to_string(split_no) +
                                " can never complete: every rank waits, and not every member of the group called it");
    REQUIRE(color >= 0, "split: color " << color << " < 0");
    std::lock_guard<std::mutex> lock(mu_);
    Meeting& m = meetings_.at(split_no);
    const Split mine = m.placed.at(member);
    if (++m.left == size()) meetings_.erase(split_no);
    return mine;
  }

  // Every wait of every group of the run raises CommAborted(reason).
  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(family_->mu);
    if (family_->aborted.empty()) family_->aborted = reason.empty() ? "aborted" : reason;
  }

 private:
  struct Entry {
    double ready = 0, end = 0, seconds = 0;
    int posted = 0, reads = 0;
    bool free = false;
    std::vector<char> by;  // by member: posted
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

  std::shared_ptr<ClockGroup> make_child(int size) { return std::make_shared<ClockGroup>(size, family_); }

  // Who never issued the first collective up to `seq` that not every member
  // issued: "rank 3 never issued collective #5" (world ranks).
  std::string missing(uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t s = resolved_; s <= seq; ++s) {
      auto it = entries_.find(s);
      std::vector<int> absent;
      for (int m = 0; m < size(); ++m)
        if (it == entries_.end() || !it->second.by[size_t(m)]) absent.push_back(world_ranks_[size_t(m)]);
      if (absent.empty()) continue;
      std::string who = absent.size() == 1 ? "rank " : "ranks ";
      for (size_t i = 0; i < absent.size() && i < 8; ++i) who += (i ? ", " : "") + std::to_string(absent[i]);
      if (absent.size() > 8) who += " and " + std::to_string(absent.size() - 8) + " more";
      return who + " never issued collective #" + std::to_string(s) + " of this group";
    }
    return "not every member of its group issued it";
  }

  bool posted_through(uint64_t seq) const {
    for (uint64_t s = resolved_; s <= seq; ++s) {
      auto it = entries_.find(s);
      if (it == entries_.end() || it->second.posted < size()) return false;
    }
    return true;
  }

  // Every member has arrived: the members of each color, by (key, member), are a group.
  void place(Meeting& m) {
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
  std::vector<int> world_ranks_;  // by member
  std::shared_ptr<ClockFamily> family_;
  std::map<uint64_t, Entry> entries_;
  uint64_t resolved_ = 0;
  int nodes_ = 0, per_node_ = 0;  // placement(), once
  double queue_end_ = 0;
  std::map<std::pair<uint64_t, int>, std::shared_ptr<ClockGroup>> children_;
  std::map<uint64_t, Meeting> meetings_;
};

std::shared_ptr<ClockGroup> make_clock_group(int world) {
  auto g = std::make_shared<ClockGroup>(world, std::make_shared<ClockFamily>());
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
    group_->post(issued_++, rank_, clock_.compute_now(), CollectiveKind::barrier, 0, /*free*/ true);
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
    group_->post(issued_, rank_, clock_.compute_now(), kind, bytes, /*free: before the steps*/ !clock_.running());
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

}  // namespace

std::unique_ptr<Communicator> make_modeled_communicator(std::unique_ptr<Communicator> inner,
                                                        std::shared_ptr<ClockGroup> group, int world_rank,
                                                        RankClock& clock) {
  auto comm =
      std::make_unique<ModeledCommunicator>(std::move(inner), std::move(group), world_rank, world_rank, clock, 0);
  clock.set_align([c = comm.get()] { c->align(); });
  return comm;
}

}  // namespace zf
