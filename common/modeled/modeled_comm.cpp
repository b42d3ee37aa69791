// modeled_comm.cpp: the modeled clock's communicator (modeled_clock.h): the
// queue a communicator's members share, and the decorator that charges it.
#include "modeled_clock.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
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
  double timeout_s = kDefaultCommTimeoutS;  // a thread's wait in the clock, at most (--comm-timeout)
};

// The links a rank's collectives travel: its node's fabric (NVLink, or PCIe
// on a card without) and its NIC. A link carries one collective at a time,
// in the order the rank issued them, whatever their communicators: two
// queues' collectives never both run at a link's full rate (the total is
// what sharing it would give; which ends first differs). This asks every
// rank to issue the collectives of its communicators in one order, as the
// stages do: a program whose ranks interleave two communicators' collectives
// differently waits here until --comm-timeout (a dry run: says it can never
// end).
enum LinkBit { kFabric = 1, kNic = 2 };

// A collective another one starts after: number `seq` of `group` (weak: two
// groups' entries may each wait on the other's, and a collective never
// waited for is never resolved).
struct After {
  std::weak_ptr<ClockGroup> group;
  uint64_t seq = 0;
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

  // The links this group's collectives use (LinkBit): the fabric inside one
  // node; across nodes the NICs, and the fabric too where a node has more
  // than one member. Waits until every member has joined (a split's members
  // join as they return from it).
  int links(const Hardware& hw) {
    await([&] { return std::find(world_ranks_.begin(), world_ranks_.end(), -1) == world_ranks_.end(); },
          "a member to join the communicator");
    std::lock_guard<std::mutex> lock(mu_);
    if (size() <= 1) return 0;
    place_members(hw);
    return nodes_ == 1 ? kFabric : kNic | (most_per_node_ > 1 ? kFabric : 0);
  }

  // A member's collective will start after `seq` of this group: its end if
  // known, else the entry is held until settle() reads it.
  std::optional<double> hold(uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(seq);
    REQUIRE(it != entries_.end(), "modeled clock: collective #" << seq << " held after it was forgotten");
    if (seq < resolved_) return it->second.end;
    ++it->second.refs;
    return std::nullopt;
  }

  // The end of a held collective (hold), once every member has issued it.
  double settle(uint64_t seq, const Hardware& hw) {
    await([&] { return posted_through(seq); }, "the members of another communicator to issue a collective");
    resolve(seq, hw);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(seq);
    const double end = it->second.end;
    --it->second.refs;
    forget(it);
    return end;
  }

  // Member's collective number `seq` on this queue, issued when its compute
  // queue was at `ready`. free: a meeting of the ranks that takes no time
  // (RankClock's lap). It starts no earlier than `after_end` and the ends
  // of `after` (the member's previous collectives on its links).
  void post(uint64_t seq, int member, double ready, CollectiveKind kind, size_t bytes, bool free = false,
            double after_end = 0, std::vector<After> after = {}) {
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
    e.after_end = std::max(e.after_end, after_end);
    for (After& a : after) e.after.push_back(std::move(a));
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
  // each starting when every member has issued it, the one before has
  // ended and so have those it comes after on its members' links. Called
  // once every member has posted it and every earlier one (the backend's
  // collective is done, or wait_posted returned).
  // How a collective ran: its end, its time, and the algorithm and protocol it took.
  struct Ran {
    double end, seconds;
    const char* algorithm;
    const char* protocol;
  };
  Ran end_of(uint64_t seq, const Hardware& hw) {
    resolve(seq, hw);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(seq);
    REQUIRE(it != entries_.end(), "modeled clock: collective #" << seq << " was waited for by more ranks than "
                                                                 << size());
    const Ran r{it->second.end, it->second.seconds, it->second.algorithm, it->second.protocol};
    ++it->second.reads;
    forget(it);
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
    const char* algorithm = "";  // collective_cost's choice
    const char* protocol = "";
    double after_end = 0;      // it starts no earlier (the ends known when it was posted)
    std::vector<After> after;  // nor before these end (held: hold())
    int posted = 0, reads = 0, refs = 0;
    bool free = false, resolving = false;
    std::vector<char> by;  // by member: posted
    CollectiveKind kind = CollectiveKind::barrier;
    size_t bytes = 0;
  };

  // Resolves this queue's collectives in order through `seq`. The ends of
  // those an entry comes after are read without this group's lock (their
  // groups may be resolving this one's); meanwhile the entry is marked, and
  // another member that reaches it waits.
  void resolve(uint64_t seq, const Hardware& hw) {
    const int n = size();
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      if (resolved_ > seq) return;
      const uint64_t at = resolved_;
      auto it = entries_.find(at);
      REQUIRE(it != entries_.end() && it->second.posted == n,
              "modeled clock: collective #" << at << " was not issued by all " << n
                                            << " ranks when a later one completed");
      Entry& e = it->second;
      if (e.resolving) {
        lock.unlock();
        await([&] { return resolved_ > at; }, "another member to resolve a collective");
        continue;
      }
      if (e.free) {  // the ranks meet: when the last is there, whatever the queue still runs
        e.end = e.ready;
        ++resolved_;
        continue;
      }
      place_members(hw);  // the members are placed before any collective
      const std::vector<After> after = std::move(e.after);
      e.after.clear();
      e.resolving = true;
      lock.unlock();
      double start = 0;
      try {
        for (const After& a : after)
          if (std::shared_ptr<ClockGroup> g = a.group.lock()) start = std::max(start, g->settle(a.seq, hw));
      } catch (...) {  // the run fails (an abort or a timeout): the next member to reach it tries again
        lock.lock();
        e.after = after;
        e.resolving = false;
        throw;
      }
      lock.lock();
      const CollectiveCost cost = collective_cost(hw, e.kind, e.bytes, n, nodes_, per_node_);
      e.seconds = cost.seconds;
      e.algorithm = cost.algorithm;
      e.protocol = cost.protocol;
      e.end = std::max({queue_end_, e.ready, e.after_end, start}) + e.seconds;
      queue_end_ = e.end;
      e.resolving = false;
      ++resolved_;
    }
  }

  // An entry every member has read and none holds is dropped (one never
  // waited for stays: a few bytes).
  void forget(std::map<uint64_t, Entry>::iterator it) {
    if (it->second.reads == size() && it->second.refs == 0) entries_.erase(it);
  }

  // Waits until ready() holds (under the lock): a dry run's fiber lets the
  // others run; a thread yields, until the run is aborted or the
  // communicators' timeout has passed.
  void await(const std::function<bool()>& ready, const char* what) {
    auto holds = [&] {
      std::lock_guard<std::mutex> lock(mu_);
      return ready();
    };
    if (on_fiber()) {
      const bool met = wait_on_fiber([&] { return !aborted().empty() || holds(); });
      if (!aborted().empty()) throw CommAborted(aborted());
      if (!met) throw CommTimeout(std::string("dry run: waiting for ") + what + " that can never come: every rank waits");
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0; !holds(); ++spins) {
      if (!aborted().empty()) throw CommAborted(aborted());
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > family_->timeout_s)
        throw CommTimeout(std::string("modeled clock: waited ") + std::to_string(int(waited)) + " s for " + what +
                          " (--comm-timeout)");
      // The ranks waited for need the cores: after a few turns, sleep.
      if (spins < 64) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
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
  // Once: the nodes the members are on, and the fewest and the most members on one of them.
  void place_members(const Hardware& hw) {
    if (nodes_ > 0) return;
    std::map<int, int> on;
    for (int r : world_ranks_) on[r / hw.gpus_per_node]++;
    per_node_ = size();
    for (const auto& [node, k] : on) per_node_ = std::min(per_node_, k), most_per_node_ = std::max(most_per_node_, k);
    nodes_ = int(on.size());
  }

  std::mutex mu_;
  std::vector<int> world_ranks_;  // by member
  std::shared_ptr<ClockFamily> family_;
  std::map<uint64_t, Entry> entries_;
  uint64_t resolved_ = 0;
  int nodes_ = 0, per_node_ = 0, most_per_node_ = 0;  // place_members()
  double queue_end_ = 0;
  std::map<std::pair<uint64_t, int>, std::shared_ptr<ClockGroup>> children_;
  std::map<uint64_t, Meeting> meetings_;
};

std::shared_ptr<ClockGroup> make_clock_group(int world, double timeout_s) {
  auto family = std::make_shared<ClockFamily>();
  family->timeout_s = comm_timeout_or_default(timeout_s);
  auto g = std::make_shared<ClockGroup>(world, std::move(family));
  for (int r = 0; r < world; ++r) g->join(r, r);
  return g;
}

namespace {

// ---- the communicator

// The last collective a rank issued on each of its links (ClockGroup::links),
// shared by its communicators (the world's and its splits); the rank's
// thread alone touches it.
struct RankLinks {
  struct Last {
    std::shared_ptr<ClockGroup> group;  // none yet
    uint64_t seq = 0;
    bool ended = false;  // the rank has waited for it: its end is known
    double end = 0;
  };
  Last last[2];  // the fabric's, the NIC's
};

// Without an inner communicator (a dry run) the collectives move nothing:
// the members only meet in their ClockGroup.
class ModeledCommunicator final : public Communicator {
 public:
  // queue: its track in a trace (0: the world's; a split's, its number on the rank).
  ModeledCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<ClockGroup> group, int rank,
                      int world_rank, RankClock& clock, int queue, std::shared_ptr<RankLinks> links)
      : in_(std::move(inner)), group_(std::move(group)), rank_(rank), world_rank_(world_rank), clock_(clock),
        queue_(queue), links_(std::move(links)) {}

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
    group_->abort(reason);  // and every wait of the clock's own
  }

  // The ranks meet, at no cost: each waits until the last has got here.
  void align() {
    group_->post(issued_++, rank_, clock_.compute_now(), CollectiveKind::barrier, 0, /*free*/ true);
    meet(issued_ - 1);
    clock_.idle_until(group_->end_of(issued_ - 1, clock_.hardware()).end);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (!in_) {
      ClockGroup::Split mine = group_->split(splits_++, rank_, color, key);
      return std::make_unique<ModeledCommunicator>(nullptr, std::move(mine.group), mine.rank, world_rank_, clock_,
                                                   clock_.new_queue(), links_);
    }
    std::unique_ptr<Communicator> inner = in_->split(color, key);
    std::shared_ptr<ClockGroup> child = group_->child(splits_++, color, inner->size());
    child->join(inner->rank(), world_rank_);
    const int rank = inner->rank();
    return std::make_unique<ModeledCommunicator>(std::move(inner), std::move(child), rank, world_rank_, clock_,
                                                 clock_.new_queue(), links_);
  }

 private:
  uint64_t post(CollectiveKind kind, size_t bytes) {
    if (owner_ == std::thread::id()) owner_ = std::this_thread::get_id();
    {  // counted as the threads backend counts them (comm.h)
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.add(kind, ring_bytes(kind, bytes, size()));
    }
    const bool free = !clock_.running();  // before the steps
    // It starts after this rank's previous collective on each link it uses.
    double after_end = 0;
    std::vector<After> after;
    if (!free && links_used_ < 0) links_used_ = group_->links(clock_.hardware());  // its members never move
    const int links = free ? 0 : links_used_;
    for (int l = 0; l < 2; ++l) {
      const RankLinks::Last& last = links_->last[l];
      if (!(links & (1 << l)) || !last.group || last.group == group_) continue;  // its own queue orders it
      if (last.ended) after_end = std::max(after_end, last.end);
      else if (std::optional<double> end = last.group->hold(last.seq)) after_end = std::max(after_end, *end);
      else after.push_back({last.group, last.seq});
    }
    const double ready = clock_.compute_now();
    group_->post(issued_, rank_, ready, kind, bytes, free, after_end, std::move(after));
    if (!free) {
      ready_[issued_] = ready;
      clock_.collective_issued(ready);
    }
    for (int l = 0; l < 2; ++l)
      if (links & (1 << l)) links_->last[l] = {group_, issued_, false, 0};
    return issued_++;
  }

  // The backend's collective is done: charge its modeled end to the rank.
  void finish(CollectiveKind kind, uint64_t seq) {
    const auto [end, seconds, algorithm, protocol] = group_->end_of(seq, clock_.hardware());
    for (RankLinks::Last& last : links_->last)
      if (last.group == group_ && last.seq == seq) last.ended = true, last.end = end;
    if (auto it = ready_.find(seq); it != ready_.end()) {  // its kernel held SMs while it ran
      clock_.collective_ran(it->second, end - seconds, end);
      ready_.erase(it);
    }
    clock_.wait_collective(end);
    clock_.collective(queue_, kind, seconds, end, algorithm, protocol);
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
  std::shared_ptr<RankLinks> links_;
  int links_used_ = -1;  // ClockGroup::links, once known
  std::thread::id owner_;  // the rank's thread, which alone charges its clock: the one that issues
  uint64_t issued_ = 0, splits_ = 0;
  std::map<uint64_t, double> ready_;  // the collectives issued in the steps, not yet waited for: their ready times
};

}  // namespace

std::unique_ptr<Communicator> make_modeled_communicator(std::unique_ptr<Communicator> inner,
                                                        std::shared_ptr<ClockGroup> group, int world_rank,
                                                        RankClock& clock) {
  auto comm = std::make_unique<ModeledCommunicator>(std::move(inner), std::move(group), world_rank, world_rank, clock,
                                                    0, std::make_shared<RankLinks>());
  clock.set_align([c = comm.get()] { c->align(); });
  return comm;
}

}  // namespace zf
