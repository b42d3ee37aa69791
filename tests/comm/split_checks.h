// split_checks.h: the checks of Communicator::split every backend that can
// split must pass, written once per rank (as comm_checks.h's): run by
// tests/comm/test_comm_split.cpp (threads, N = 2, 4, 6 in one process) and
// tests/comm/mpi/test_comm_mpi.cpp (mpi, under mpirun -np 2 and -np 4).
//
// The expected values are computed here from the inputs of the member ranks
// (seeded by parent rank and element index, comm_checks.h), summed in the
// child's rank order, which is the order (key, parent rank): never read from
// the communicator under test. Exact: the backends sum in the child's rank
// order in float32, as this does.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "comm_checks.h"
#include "launch.h"

namespace zf::test {

// The parent ranks of `color`, in the child's rank order: by key, ties by
// parent rank (MPI_Comm_split's order).
inline std::vector<int> members_of(int N, int color, const std::function<int(int)>& color_of,
                                   const std::function<int(int)>& key_of) {
  std::vector<int> m;
  for (int q = 0; q < N; q++)
    if (color_of(q) == color) m.push_back(q);
  std::stable_sort(m.begin(), m.end(), [&](int a, int b) { return key_of(a) < key_of(b); });
  return m;
}

// The sum of element i over `members` in that order, in float32 (f32 inputs
// of test `tag`), divided by the member count for avg.
inline float sum_over(uint64_t tag, const std::vector<int>& members, size_t i, ReduceOp op) {
  float acc = 0;
  for (size_t j = 0; j < members.size(); j++) {
    const float x = input_f32(tag, members[j], i);
    acc = j == 0 ? x : acc + x;
  }
  if (op == ReduceOp::avg) acc /= float(members.size());
  return acc;
}
inline bf16 sum_over_bf16(uint64_t tag, const std::vector<int>& members, size_t i) {
  float acc = 0;
  for (size_t j = 0; j < members.size(); j++) {
    const float x = bf16_to_float(input_bf16(tag, members[j], i));
    acc = j == 0 ? x : acc + x;
  }
  return float_to_bf16(acc);
}

// Counts a mismatch (first few reported).
struct Mismatches {
  std::string what;
  size_t bad = 0;
  template <class T> void check(const T& got, const T& want, size_t i) {
    if (!same_bits(got, want) && bad++ < 3)
      ADD_FAILURE() << what << " i " << i << ": got " << as_double(got) << " want "
                    << as_double(want);
  }
};

// Every collective on `child` (this rank is parent rank `me`; `members` the
// child's ranks as parent ranks, in child order) against the direct sums.
inline void check_child_collectives(Communicator& child, int me, const std::vector<int>& members,
                                    uint64_t tag) {
  const int Nc = int(members.size());
  const int cr = int(std::find(members.begin(), members.end(), me) - members.begin());
  // EXPECT, not ASSERT: a rank that left here would leave its peers waiting
  // in the collectives below.
  EXPECT_EQ(child.size(), Nc);
  EXPECT_EQ(child.rank(), cr);
  const std::string who = "parent rank " + std::to_string(me) + " child rank " +
                          std::to_string(cr) + " of " + std::to_string(Nc) + ": ";
  const size_t n = 3 * 2048 + 5;  // several blocks, not divisible by Nc
  {  // all_reduce, sum and avg
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      std::vector<float> buf(n);
      for (size_t i = 0; i < n; i++) buf[i] = input_f32(tag, me, i);
      child.all_reduce(buf.data(), n, DType::f32, op);
      Mismatches m{who + "all_reduce"};
      for (size_t i = 0; i < n; i++) m.check(buf[i], sum_over(tag, members, i, op), i);
    }
    std::vector<bf16> b(n);
    for (size_t i = 0; i < n; i++) b[i] = input_bf16(tag + 1, me, i);
    child.all_reduce(b.data(), n, DType::bf16);
    Mismatches m{who + "all_reduce bf16"};
    for (size_t i = 0; i < n; i++) m.check(b[i], sum_over_bf16(tag + 1, members, i), i);
  }
  {  // reduce_scatter: recv[i] = sum over members of their send[cr*k + i]
    const size_t k = 1001;
    std::vector<float> send(size_t(Nc) * k), recv(k, -1.0f);
    for (size_t i = 0; i < send.size(); i++) send[i] = input_f32(tag + 2, me, i);
    child.reduce_scatter_async(send.data(), recv.data(), k, DType::f32, ReduceOp::sum).wait_host();
    Mismatches m{who + "reduce_scatter"};
    for (size_t i = 0; i < k; i++)
      m.check(recv[i], sum_over(tag + 2, members, size_t(cr) * k + i, ReduceOp::sum), i);
  }
  {  // all_gather: slot j is member j's send
    const size_t k = 777;
    std::vector<float> send(k), recv(size_t(Nc) * k, -1.0f);
    for (size_t i = 0; i < k; i++) send[i] = input_f32(tag + 3, me, i);
    child.all_gather(send.data(), recv.data(), k, DType::f32);
    Mismatches m{who + "all_gather"};
    for (int j = 0; j < Nc; j++)
      for (size_t i = 0; i < k; i++)
        m.check(recv[size_t(j) * k + i], input_f32(tag + 3, members[size_t(j)], i), i);
  }
  {  // broadcast from the child's last rank
    const int root = Nc - 1;
    std::vector<float> buf(500);
    for (size_t i = 0; i < buf.size(); i++) buf[i] = input_f32(tag + 4, me, i);
    child.broadcast(buf.data(), buf.size(), DType::f32, root);
    Mismatches m{who + "broadcast"};
    for (size_t i = 0; i < buf.size(); i++)
      m.check(buf[i], input_f32(tag + 4, members[size_t(root)], i), i);
  }
  child.barrier();
}

// The parent's all_reduce over all N ranks, against the direct sum.
inline void check_parent_all_reduce(Communicator& parent, int me, uint64_t tag) {
  std::vector<int> all(size_t(parent.size()));
  for (int q = 0; q < parent.size(); q++) all[size_t(q)] = q;
  std::vector<float> buf(1000);
  for (size_t i = 0; i < buf.size(); i++) buf[i] = input_f32(tag, me, i);
  parent.all_reduce(buf.data(), buf.size(), DType::f32);
  Mismatches m{"parent all_reduce, rank " + std::to_string(me)};
  for (size_t i = 0; i < buf.size(); i++) m.check(buf[i], sum_over(tag, all, i, ReduceOp::sum), i);
}

// HSDP's two splits with groups of F consecutive ranks: color rank / F (the
// shard group) and rank % F (across groups); `reverse` ranks each child by
// key -rank, so child rank 0 is its highest parent rank. The parent is used
// between and after, interleaved with the children.
inline void scenario_split_hsdp(RankContext& ctx, int F, bool reverse) {
  const int N = ctx.world, me = ctx.rank;
  ASSERT_EQ(N % F, 0);
  auto key_of = [&](int q) { return reverse ? -q : q; };
  auto intra_color = [&](int q) { return q / F; };
  auto inter_color = [&](int q) { return q % F; };
  std::unique_ptr<Communicator> intra = ctx.comm.split(intra_color(me), key_of(me));
  check_parent_all_reduce(ctx.comm, me, 500);
  std::unique_ptr<Communicator> inter = ctx.comm.split(inter_color(me), key_of(me));
  const auto intra_m = members_of(N, intra_color(me), intra_color, key_of);
  const auto inter_m = members_of(N, inter_color(me), inter_color, key_of);
  check_child_collectives(*intra, me, intra_m, 510);
  check_parent_all_reduce(ctx.comm, me, 520);
  check_child_collectives(*inter, me, inter_m, 530);
  // Async on all three at once, waited in the opposite order.
  std::vector<float> a(300), b(300), c(300);
  for (size_t i = 0; i < a.size(); i++) {
    a[i] = input_f32(540, me, i);
    b[i] = input_f32(541, me, i);
    c[i] = input_f32(542, me, i);
  }
  CommHandle ha = intra->all_reduce_async(a.data(), a.size(), DType::f32, ReduceOp::sum);
  CommHandle hb = ctx.comm.all_reduce_async(b.data(), b.size(), DType::f32, ReduceOp::sum);
  CommHandle hc = inter->all_reduce_async(c.data(), c.size(), DType::f32, ReduceOp::sum);
  hc.wait_host();
  hb.wait_host();
  ha.wait_host();
  std::vector<int> all;
  for (int q = 0; q < N; q++) all.push_back(q);
  Mismatches m{"interleaved async, rank " + std::to_string(me)};
  for (size_t i = 0; i < a.size(); i++) {
    m.check(a[i], sum_over(540, intra_m, i, ReduceOp::sum), i);
    m.check(b[i], sum_over(541, all, i, ReduceOp::sum), i);
    m.check(c[i], sum_over(542, inter_m, i, ReduceOp::sum), i);
  }
  // A split of a split: the duplicate of the shard group.
  std::unique_ptr<Communicator> dup = intra->split(0, intra->rank());
  check_child_collectives(*dup, me, intra_m, 550);
  check_parent_all_reduce(ctx.comm, me, 560);
}

// Each communicator counts its own collectives only, in the ring model over
// its own size; split itself counts on none.
inline void scenario_split_stats_apart(RankContext& ctx) {
  const int N = ctx.world, me = ctx.rank;
  const int F = N % 2 == 0 ? 2 : 1;
  ctx.comm.reset_stats();
  std::unique_ptr<Communicator> intra = ctx.comm.split(me / F, me);
  std::unique_ptr<Communicator> dup = ctx.comm.split(0, me);
  EXPECT_EQ(ctx.comm.stats().total_bytes(), 0.0);
  uint64_t parent_calls = 0;
  for (uint64_t c : ctx.comm.stats().calls) parent_calls += c;
  EXPECT_EQ(parent_calls, 0u) << "split counted as a collective of the parent";
  EXPECT_EQ(intra->stats().total_bytes(), 0.0);

  const size_t n = 4096;
  std::vector<float> buf(n, 1.0f), big(size_t(N) * n, 1.0f), small(n);
  intra->all_reduce(buf.data(), n, DType::f32);
  intra->all_gather(buf.data(), big.data(), n, DType::f32);  // recv holds F*n <= N*n
  dup->reduce_scatter(big.data(), small.data(), n, DType::f32);
  const CommStats si = intra->stats(), sd = dup->stats(), sp = ctx.comm.stats();
  const double ar = ring_bytes(CollectiveKind::all_reduce, n * 4, F);
  const double ag = ring_bytes(CollectiveKind::all_gather, size_t(F) * n * 4, F);
  EXPECT_EQ(si.bytes[int(CollectiveKind::all_reduce)], ar);
  EXPECT_EQ(si.bytes[int(CollectiveKind::all_gather)], ag);
  EXPECT_EQ(si.total_bytes(), ar + ag);
  EXPECT_EQ(si.calls[int(CollectiveKind::all_reduce)], 1u);
  EXPECT_EQ(sd.total_bytes(), ring_bytes(CollectiveKind::reduce_scatter, size_t(N) * n * 4, N));
  EXPECT_EQ(sd.calls[int(CollectiveKind::reduce_scatter)], 1u);
  EXPECT_EQ(sp.total_bytes(), 0.0) << "a child's bytes were counted on the parent";
  ctx.comm.all_reduce(buf.data(), n, DType::f32);
  EXPECT_EQ(ctx.comm.stats().total_bytes(), ring_bytes(CollectiveKind::all_reduce, n * 4, N));
  EXPECT_EQ(intra->stats().total_bytes(), ar + ag) << "the parent's bytes were counted on a child";
  EXPECT_EQ(dup->stats().total_bytes(), sd.total_bytes());
}

// Runs f; if it has not returned after `limit`, aborts `comm` (and so its
// whole family: every wait on any queue raises), so that a schedule that
// deadlocks fails the test instead of hanging it. Returns whether the
// deadline passed.
inline bool within_deadline(Communicator& comm, std::chrono::seconds limit,
                            const std::function<void()>& f) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false, expired = false;
  std::thread guard([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, limit, [&] { return done; })) {
      expired = true;
      lock.unlock();
      comm.abort("the test's deadline passed: the schedule deadlocked");
    }
  });
  try {
    f();
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_all();
    guard.join();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  guard.join();
  return expired;
}

// FSDP2's two queues: rank 0 issues an all_gather on queue A, then a
// reduce_scatter on queue B and waits on B first; every other rank issues
// the reduce_scatter on B first, waits for it, and only then the
// all_gather on A. On one queue rank 0's all_gather would meet the others'
// reduce_scatter; on two each meets its own. Bounded by a deadline.
inline void two_queue_schedule(Communicator& A, Communicator& B, int me, int N) {
  const size_t k = 1500;
  std::vector<float> ag_send(k), ag_recv(size_t(N) * k), rs_send(size_t(N) * k), rs_recv(k);
  for (size_t i = 0; i < k; i++) ag_send[i] = input_f32(600, me, i);
  for (size_t i = 0; i < rs_send.size(); i++) rs_send[i] = input_f32(601, me, i);
  if (me == 0) {
    CommHandle ag = A.all_gather_async(ag_send.data(), ag_recv.data(), k, DType::f32);
    CommHandle rs = B.reduce_scatter_async(rs_send.data(), rs_recv.data(), k, DType::f32, ReduceOp::sum);
    rs.wait_host();
    ag.wait_host();
  } else {
    B.reduce_scatter_async(rs_send.data(), rs_recv.data(), k, DType::f32, ReduceOp::sum).wait_host();
    A.all_gather_async(ag_send.data(), ag_recv.data(), k, DType::f32).wait_host();
  }
  std::vector<int> all;
  for (int q = 0; q < N; q++) all.push_back(q);
  Mismatches m{"two queues, rank " + std::to_string(me)};
  for (size_t i = 0; i < k; i++) m.check(rs_recv[i], sum_over(601, all, size_t(me) * k + i, ReduceOp::sum), i);
  for (int q = 0; q < N; q++)
    for (size_t i = 0; i < k; i++) m.check(ag_recv[size_t(q) * k + i], input_f32(600, q, i), i);
}

inline void scenario_two_queues_are_independent(RankContext& ctx) {
  std::unique_ptr<Communicator> second = ctx.comm.split(0, ctx.rank);
  EXPECT_EQ(second->size(), ctx.world);
  EXPECT_EQ(second->rank(), ctx.rank);
  const bool expired = within_deadline(ctx.comm, std::chrono::seconds(30), [&] {
    two_queue_schedule(ctx.comm, *second, ctx.rank, ctx.world);
  });
  EXPECT_FALSE(expired) << "the all_gather on one queue waited behind the reduce_scatter on the other";
  // And the queues still work after.
  check_parent_all_reduce(*second, ctx.rank, 610);
  check_parent_all_reduce(ctx.comm, ctx.rank, 611);
}

// Split and the usual mismatches: the message every rank must raise.
inline std::string message_of_call(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The last rank passes color -1: every rank raises the same Error naming it.
inline void scenario_split_negative_color_is_an_error_on_every_rank(RankContext& ctx) {
  const int last = ctx.world - 1;
  const std::string msg = message_of_call([&] { ctx.comm.split(ctx.rank == last ? -1 : 0, 0); });
  EXPECT_NE(msg.find("rank " + std::to_string(last) + " passed color -1"), std::string::npos) << msg;
}

// On a child, rank 0 calls all_reduce where the others call all_gather: the
// collectives-do-not-match error, on every rank of the child.
inline void scenario_split_child_mismatch_is_an_error(RankContext& ctx) {
  std::unique_ptr<Communicator> child = ctx.comm.split(0, ctx.rank);
  std::vector<float> buf(size_t(ctx.world) * 10, 1.0f);
  const std::string msg = message_of_call([&] {
    if (child->rank() == 0) child->all_reduce(buf.data(), 10, DType::f32);
    else child->all_gather(buf.data(), buf.data(), 10, DType::f32);
  });
  EXPECT_NE(msg.find("collectives do not match"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 called all_reduce(count 10"), std::string::npos) << msg;
}

// A split where another rank issued an all_reduce: the same error, naming the split.
inline void scenario_split_against_a_collective_is_an_error(RankContext& ctx) {
  std::vector<float> buf(10, 1.0f);
  const std::string msg = message_of_call([&] {
    if (ctx.rank == 0) ctx.comm.split(0, 0);
    else ctx.comm.all_reduce(buf.data(), 10, DType::f32);
  });
  EXPECT_NE(msg.find("collectives do not match"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 called split(color 0, key 0)"), std::string::npos) << msg;
}

}  // namespace zf::test
