// comm_thread_group.h: the state the N communicators of one `threads` group
// share (private to comm_threads.cpp, which explains the algorithm): what
// each rank posted for a collective, the group barrier, the aborted flag, the
// ranks that left, and the family of groups split from one another (an abort
// or failure of one is an abort of all, so a failing rank stops its peers
// whichever queue they wait on). A barrier that waits longer than the
// family's timeout raises an Error naming the ranks that have not arrived.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "comm.h"
#include "comm_state.h"

namespace zf::threads_detail {

// ------------------------------------------------------------------ what a rank posts

// One rank's call of one collective: what the others check it against, and
// the pointers they read from. `count` is in elements, as in the API:
// all_reduce/broadcast the buffer, reduce_scatter the recv count, all_gather
// the send count.
struct Post {
  uint64_t seq = 0;  // 0 for the first collective of this rank, 1 for the next...
  int step = -1;     // the training step the rank issued it in (current_step), for messages
  CollectiveKind kind = CollectiveKind::barrier;
  size_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  const void* send = nullptr;  // all_reduce and broadcast: the buffer (send == recv)
  void* recv = nullptr;
  // split(color, key): kind is barrier, the colors and keys are compared by
  // every rank, and the communication thread leaves the child's group in *out.
  bool split = false;
  int color = 0, key = 0;
  struct SplitOut* out = nullptr;
};

// The message of a collective's error.
inline std::string describe_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown error";
  }
}

inline std::string describe(const Post& p) {
  std::ostringstream s;
  if (p.split) {
    s << "split(color " << p.color << ", key " << p.key << ")";
    return s.str();
  }
  s << collective_name(p.kind);
  if (p.kind != CollectiveKind::barrier) {
    s << "(count " << p.count << ", " << dtype_name(p.dtype);
    if (p.kind == CollectiveKind::all_reduce || p.kind == CollectiveKind::reduce_scatter)
      s << ", " << (p.op == ReduceOp::sum ? "sum" : "avg");
    if (p.kind == CollectiveKind::broadcast) s << ", root " << p.root;
    s << ")";
  }
  return s.str();
}

inline bool same_call(const Post& a, const Post& b) {
  if (a.split != b.split) return false;
  if (a.split) return true;  // colors and keys differ by design
  if (a.kind != b.kind) return false;
  if (a.kind == CollectiveKind::barrier) return true;
  if (a.count != b.count || a.dtype != b.dtype) return false;
  if ((a.kind == CollectiveKind::all_reduce || a.kind == CollectiveKind::reduce_scatter) &&
      a.op != b.op)
    return false;
  if (a.kind == CollectiveKind::broadcast && a.root != b.root) return false;
  return true;
}

// ------------------------------------------------------------------ the group

// State shared by the N communicators of one group. Everything is guarded by
// mu_; buffers are read by other ranks only between two barriers, and the
// barrier's lock/unlock orders those reads after the owner's writes.
class ThreadGroup;

// The groups split from one another, from one make_thread_communicators_with
// down, at any depth. Lock order: a family's mutex is never held while
// taking a group's (the groups are copied out first), so a communication
// thread inside a collective may fail the family.
class ThreadFamily {
 public:
  // How long a barrier of any group of the family waits (0: the default).
  explicit ThreadFamily(double timeout_s = 0) : timeout_s_(comm_timeout_or_default(timeout_s)) {}
  double timeout_s() const { return timeout_s_; }
  // A new group joins; it starts aborted if the family already is.
  void join(const std::shared_ptr<ThreadGroup>& g);
  // Marks every group failed (the first reason wins in each), waking every rank.
  void fail_all(const std::string& reason);
  // fail_all, then waits until no communication thread of any group is
  // inside a collective.
  void abort_all(const std::string& reason);

 private:
  std::vector<std::shared_ptr<ThreadGroup>> live();
  std::mutex mu_;
  std::vector<std::weak_ptr<ThreadGroup>> groups_;
  bool aborted_ = false;
  std::string reason_;
  const double timeout_s_;
};

// What the communication thread hands back from a split: the child's group
// (shared by the ranks of one color), this rank's place in it, and its
// members as ranks of the parent, in the child's rank order.
struct SplitOut {
  std::shared_ptr<ThreadGroup> group;
  int rank = -1;
  std::vector<int> members;
};

class ThreadGroup {
 public:
  // A group of n ranks in `family` (a new family, whose barriers time out
  // after timeout_s, when null).
  static std::shared_ptr<ThreadGroup> create(int n, std::shared_ptr<ThreadFamily> family = nullptr,
                                             double timeout_s = 0) {
    auto g = std::shared_ptr<ThreadGroup>(new ThreadGroup(n));
    g->family_ = family ? std::move(family) : std::make_shared<ThreadFamily>(timeout_s);
    g->family_->join(g);
    return g;
  }
  int size() const { return n_; }
  const std::shared_ptr<ThreadFamily>& family() const { return family_; }

  // The child groups a split hands from its leader (the child's rank 0) to
  // the other members, by the leader's rank in this group. Written and read
  // between the split's barriers only.
  void offer_child(int leader, std::shared_ptr<ThreadGroup> g) {
    std::lock_guard<std::mutex> lock(mu_);
    children_[leader] = std::move(g);
  }
  std::shared_ptr<ThreadGroup> child_of(int leader) {
    std::lock_guard<std::mutex> lock(mu_);
    return children_[leader];
  }

  // Phase 1. Posts are double-buffered by the parity of seq: a rank can be at
  // most one collective ahead of the slowest (it cannot pass the next
  // collective's first barrier alone), so its next post never overwrites one
  // that a slower rank is still reading.
  void post(int rank, const Post& p) {
    std::lock_guard<std::mutex> lock(mu_);
    posts_[p.seq % 2][rank] = p;
  }
  // Valid after the phase-1 barrier of collective `seq`, until its last barrier.
  const Post& posted(int rank, uint64_t seq) const { return posts_[seq % 2][rank]; }

  // The rank's thread has issued `count` collectives on this group (read
  // only by a timeout's message).
  void note_issued(int rank, uint64_t count) { issued_[rank].store(count, std::memory_order_relaxed); }

  // Waits until all N ranks have arrived. Raises CommAborted if the group is
  // (or becomes) aborted, Error if a rank that can never arrive has left, or
  // if the others have not all arrived within the family's timeout (the
  // caller then fails the group, as for any error of a collective).
  void barrier(int rank, const Post& me) {
    std::unique_lock<std::mutex> lock(mu_);
    throw_if_broken(rank, me);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {  // the last to arrive opens the barrier
      arrived_ = 0;
      std::fill(here_.begin(), here_.end(), char(0));
      ++generation_;
      cv_.notify_all();
      return;
    }
    here_[rank] = 1;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(family_->timeout_s()));
    const bool woken = wait_for_peer(
        lock, cv_, deadline, [&] { return generation_ != gen || aborted_ || any_departed_; });
    if (generation_ != gen) return;  // opened: later failures are for later barriers
    throw_if_broken(rank, me);
    if (!woken) throw CommTimeout(timeout_message(rank, me));
  }

  // Marks the group failed and wakes every waiting rank (the first reason
  // wins), then waits until no communication thread is inside a collective:
  // after abort() returns nobody reads or writes any rank's buffers, so a
  // failing rank may free its memory. Never called by a communication thread.
  // The whole family is aborted with it (ThreadFamily::abort_all).
  void abort(const std::string& reason) { family_->abort_all(reason); }

  // Waits until no communication thread is inside a collective. A rank whose
  // collective failed calls it before it raises: other ranks' threads may
  // still be moving bytes into its buffers (a peer reduces its piece into
  // every rank's output), and the caller frees them once it has the error.
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return active_ == 0; });
  }

  // The first half of abort(), for a communication thread whose own data
  // movement failed: marks the group failed and wakes every rank, without
  // waiting (the caller is itself inside a collective).
  // Fails the whole family (ThreadFamily::fail_all).
  void fail(const std::string& reason) { family_->fail_all(reason); }

  // One group's part of a family's failure. Called with no group's mutex held.
  void mark_aborted(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    mark_aborted_locked(reason);
  }

  // A communication thread starts / ends running one collective. After an
  // abort no collective starts, so the count only falls.
  void enter(int rank, const Post& me) {
    std::lock_guard<std::mutex> lock(mu_);
    throw_if_broken(rank, me);
    ++active_;
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0) cv_.notify_all();
  }

  // Rank `rank` will issue no more collectives (it issued `issued` in all).
  // A rank leaves only after its last barrier has opened, so any barrier that
  // still waits for it can never open.
  void depart(int rank, uint64_t issued) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      any_departed_ = true;
      if (first_departed_ < 0) {
        first_departed_ = rank;
        first_departed_issued_ = issued;
      }
    }
    cv_.notify_all();
  }

 private:
  explicit ThreadGroup(int n)
      : n_(n), here_(size_t(n), 0), issued_(new std::atomic<uint64_t>[size_t(n)]),
        children_(size_t(n)) {
    for (auto& slot : posts_) slot.resize(n);
    for (int q = 0; q < n; q++) issued_[q].store(0, std::memory_order_relaxed);
  }

  // A barrier of collective `me` timed out: which ranks are missing, and
  // whether they have issued it at all. Called with mu_ held.
  std::string timeout_message(int rank, const Post& me) const {
    std::vector<int> missing, not_issued;
    for (int q = 0; q < n_; q++)
      if (!here_[size_t(q)]) {
        missing.push_back(q);
        if (issued_[q].load(std::memory_order_relaxed) <= me.seq) not_issued.push_back(q);
      }
    const char* has = missing.size() == 1 ? " has" : " have";
    std::string who;
    if (not_issued.size() == missing.size())
      who = rank_names(missing) + has + " not issued it yet (stuck, or far behind, before it)";
    else if (!not_issued.empty())
      who = rank_names(missing) + has + " not reached it (" + rank_names(not_issued) +
            " not issued it yet)";
    else
      who = rank_names(missing) + has + " issued it but not reached it (stuck moving data?)";
    return comm_timeout_message(rank, describe(me), me.seq, me.step, family_->timeout_s(), who);
  }

  // Called with mu_ held. The first reason wins.
  void mark_aborted_locked(const std::string& reason) {
    if (aborted_) return;
    aborted_ = true;
    reason_ = reason;
    cv_.notify_all();
  }

  // Called with mu_ held.
  void throw_if_broken(int rank, const Post& me) const {
    if (aborted_)
      throw CommAborted("[rank " + std::to_string(rank) + "] " + describe(me) +
                        " (collective #" + std::to_string(me.seq) + " of this rank) aborted: " +
                        reason_);
    if (any_departed_)
      throw Error("[rank " + std::to_string(rank) + "] " + describe(me) + " (collective #" +
                  std::to_string(me.seq) + " of this rank) cannot complete: rank " +
                  std::to_string(first_departed_) + " finished after issuing only " +
                  std::to_string(first_departed_issued_) +
                  " collectives. Every rank must issue the same collectives in the same "
                  "order.");
  }

  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Post> posts_[2];
  int arrived_ = 0;
  std::vector<char> here_;  // who has arrived at the open barrier
  std::unique_ptr<std::atomic<uint64_t>[]> issued_;  // note_issued
  uint64_t generation_ = 0;
  bool aborted_ = false;
  int active_ = 0;  // communication threads inside a collective
  std::string reason_;
  bool any_departed_ = false;
  int first_departed_ = -1;
  uint64_t first_departed_issued_ = 0;
  std::vector<std::shared_ptr<ThreadGroup>> children_;  // offer_child
  std::shared_ptr<ThreadFamily> family_;
};

inline std::vector<std::shared_ptr<ThreadGroup>> ThreadFamily::live() {
  std::vector<std::shared_ptr<ThreadGroup>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : groups_)
    if (auto g = w.lock()) out.push_back(std::move(g));
  return out;
}

inline void ThreadFamily::join(const std::shared_ptr<ThreadGroup>& g) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups_.erase(std::remove_if(groups_.begin(), groups_.end(),
                                 [](const std::weak_ptr<ThreadGroup>& w) { return w.expired(); }),
                  groups_.end());
    groups_.push_back(g);
    if (!aborted_) return;
    reason = reason_;
  }
  g->mark_aborted(reason);
}

inline void ThreadFamily::fail_all(const std::string& reason) {
  std::string first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_) {
      aborted_ = true;
      reason_ = reason;
    }
    first = reason_;
  }
  for (const auto& g : live()) g->mark_aborted(first);
}

inline void ThreadFamily::abort_all(const std::string& reason) {
  fail_all(reason);
  for (const auto& g : live()) g->wait_idle();
}

}  // namespace zf::threads_detail
