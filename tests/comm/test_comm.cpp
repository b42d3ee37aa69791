// test_comm.cpp: every collective of the `threads` backend against a direct
// computation, for 1 to 8 ranks.
//
//   build-dir/tests/test_comm
//
// The checks themselves are in comm_checks.h, shared with the mpi backend's
// suite (tests/comm/mpi/test_comm_mpi.cpp): inputs seeded by rank and element
// index, expected sums computed in the promised rank order, compared bit for
// bit.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "comm_checks.h"
#include "comm_reduce.h"
#include "comm_threads.h"
#include "comm_threads_impl.h"
#include "device.h"
#include "launch.h"
#include "memory.h"

using namespace zf;

namespace {

void run(int N, const std::function<void(RankContext&)>& fn) {
  LaunchOptions opt;
  opt.ranks = N;
  run_ranks(opt, fn);
}

class CommRanks : public ::testing::TestWithParam<int> {};

// ------------------------------------------------------------------ every collective, N = 1..8

TEST_P(CommRanks, AllReduce) {
  const int N = GetParam();
  run(N, [&](RankContext& ctx) {
    EXPECT_EQ(ctx.comm.size(), N);
    EXPECT_EQ(ctx.comm.rank(), ctx.rank);
    EXPECT_STREQ(ctx.comm.backend(), "threads");
    test::scenario_all_reduce(ctx);
  });
}

TEST_P(CommRanks, ReduceScatter) { run(GetParam(), test::scenario_reduce_scatter); }

TEST_P(CommRanks, AllGather) { run(GetParam(), test::scenario_all_gather); }

TEST_P(CommRanks, Broadcast) { run(GetParam(), test::scenario_broadcast); }

TEST_P(CommRanks, ReduceScatterThenAllGatherEqualsAllReduceBitForBit) { run(GetParam(), test::scenario_reduce_scatter_then_all_gather_equals_all_reduce_bit_for_bit); }

TEST_P(CommRanks, InPlaceReduceScatterAndAllGather) { run(GetParam(), test::scenario_in_place_reduce_scatter_and_all_gather); }

TEST_P(CommRanks, SeveralAsyncInFlightWaitedInOrder) { run(GetParam(), test::scenario_several_async_in_flight_waited_in_order); }

TEST_P(CommRanks, ByteCountersFollowTheRingModel) { run(GetParam(), test::scenario_byte_counters_follow_the_ring_model); }

INSTANTIATE_TEST_SUITE_P(Ranks, CommRanks, ::testing::Range(1, 9), test::rank_count_name);

}  // namespace

// ------------------------------------------------------------------ the pieces on their own

TEST(Comm, RingBytesFormula) {
  using K = CollectiveKind;
  EXPECT_DOUBLE_EQ(ring_bytes(K::all_reduce, 1000, 4), 1500.0);
  EXPECT_DOUBLE_EQ(ring_bytes(K::reduce_scatter, 1000, 4), 750.0);
  EXPECT_DOUBLE_EQ(ring_bytes(K::all_gather, 1000, 4), 750.0);
  EXPECT_DOUBLE_EQ(ring_bytes(K::broadcast, 1000, 4), 1000.0);
  EXPECT_DOUBLE_EQ(ring_bytes(K::barrier, 1000, 4), 0.0);
  EXPECT_DOUBLE_EQ(ring_bytes(K::all_reduce, 1000, 2), 1000.0);
  EXPECT_DOUBLE_EQ(ring_bytes(K::all_reduce, 800, 8), 1400.0);
  for (K k : {K::all_reduce, K::reduce_scatter, K::all_gather, K::broadcast, K::barrier})
    EXPECT_DOUBLE_EQ(ring_bytes(k, 1000, 1), 0.0) << collective_name(k);
}

TEST(Comm, CollectiveNames) {
  EXPECT_STREQ(collective_name(CollectiveKind::all_reduce), "all_reduce");
  EXPECT_STREQ(collective_name(CollectiveKind::reduce_scatter), "reduce_scatter");
  EXPECT_STREQ(collective_name(CollectiveKind::all_gather), "all_gather");
  EXPECT_STREQ(collective_name(CollectiveKind::broadcast), "broadcast");
  EXPECT_STREQ(collective_name(CollectiveKind::barrier), "barrier");
}

TEST(Comm, DefaultHandleIsDone) {
  CommHandle h;
  EXPECT_TRUE(h.done());
  h.wait();
}

// An async collective is not done until every rank has joined it.
TEST(Comm, AsyncCompletesOnlyWhenEveryRankJoined) {
  auto comms = make_thread_communicators(2);
  std::vector<float> a(100, 1.0f), b(100, 2.0f);
  CommHandle h0 = comms[0]->all_reduce_async(a.data(), a.size(), DType::f32, ReduceOp::sum);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(h0.done());
  CommHandle h1 = comms[1]->all_reduce_async(b.data(), b.size(), DType::f32, ReduceOp::sum);
  h0.wait();
  h1.wait();
  EXPECT_TRUE(h0.done());
  for (size_t i = 0; i < a.size(); i++) {
    ASSERT_EQ(a[i], 3.0f);
    ASSERT_EQ(b[i], 3.0f);
  }
}

// Many small collectives back to back: the barrier and queue are reusable
// and never lose a wake-up.
TEST(Comm, ManySmallCollectivesInARow) { run(4, test::scenario_many_small_collectives_in_a_row); }

// ------------------------------------------------------------------ the transport interface
//
// comm_threads.cpp moves bytes only through a ThreadTransport
// (comm_threads_impl.h): the host one above, or the CUDA one
// (comm_threads_cuda.cu), whose copies and kernels only start on a stream
// and are finished by complete(). These check the algorithm's side of that
// contract without a GPU.

namespace {

// Queues every reduce and copy and runs them only in complete(), as a device
// transport does on its stream: results come out right only if the algorithm
// completes each rank's transfers before the barrier that ends a collective.
// Also checks that every ticket of issued() reaches inputs_ready exactly
// once, in issue order.
class DeferredTransport final : public ThreadTransport {
 public:
  const char* backend() const override { return "threads (deferred)"; }
  void* issued(CollectiveKind, const void*, const void*) override {
    return reinterpret_cast<void*>(++issued_);  // the rank's thread
  }
  void inputs_ready(void* ticket) override {  // the communication thread
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ticket), ++ready_);
    EXPECT_TRUE(pending_.empty());
  }
  void reduce(const std::vector<const void*>& src, const std::vector<void*>& dst, size_t n,
              DType dt, ReduceOp op) override {
    pending_.push_back([=] { reduce_in_rank_order(src, dst, n, dt, op); });
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    pending_.push_back([=] {
      if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
    });
  }
  void complete() override {
    for (auto& f : pending_) f();
    pending_.clear();
  }

 private:
  std::atomic<uintptr_t> issued_{0};
  uintptr_t ready_ = 0;
  std::vector<std::function<void()>> pending_;
};

// Host copies, except that rank `bad`'s reduce raises, as a failed kernel
// launch would.
class FailingTransport final : public ThreadTransport {
 public:
  explicit FailingTransport(bool bad) : bad_(bad) {}
  const char* backend() const override { return "threads (failing)"; }
  void reduce(const std::vector<const void*>& src, const std::vector<void*>& dst, size_t n,
              DType dt, ReduceOp op) override {
    if (bad_) throw Error("injected transport failure");
    reduce_in_rank_order(src, dst, n, dt, op);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
  }
  void drain() noexcept override { drained_ = true; }
  bool drained_ = false;

 private:
  bool bad_;
};

// Runs fn on one thread per rank of `comms`, with a context like run_ranks'.
void run_on(std::vector<std::unique_ptr<Communicator>>& comms,
            const std::function<void(RankContext&)>& fn) {
  const int N = int(comms.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < N; r++)
    threads.emplace_back([&, r] {
      set_current_rank(r);
      MemoryTracker mem(r);
      auto dev = make_cpu_device();
      RankContext ctx{r, N, *comms[r], mem, *dev};
      fn(ctx);
    });
  for (auto& t : threads) t.join();
}

std::vector<std::unique_ptr<Communicator>> deferred_group(int N) {
  std::vector<std::unique_ptr<ThreadTransport>> t;
  for (int r = 0; r < N; r++) t.push_back(std::make_unique<DeferredTransport>());
  return make_thread_communicators_with(std::move(t));
}

class DeferredTransportRanks : public ::testing::TestWithParam<int> {};

TEST_P(DeferredTransportRanks, EveryScenarioGivesTheSameBits) {
  auto comms = deferred_group(GetParam());
  EXPECT_STREQ(comms[0]->backend(), "threads (deferred)");
  EXPECT_NE(thread_transport(*comms[0]), nullptr);
  run_on(comms, [](RankContext& ctx) {
    test::scenario_all_reduce(ctx);
    test::scenario_reduce_scatter(ctx);
    test::scenario_all_gather(ctx);
    test::scenario_broadcast(ctx);
    test::scenario_reduce_scatter_then_all_gather_equals_all_reduce_bit_for_bit(ctx);
    test::scenario_in_place_reduce_scatter_and_all_gather(ctx);
    test::scenario_several_async_in_flight_waited_in_order(ctx);
    test::scenario_byte_counters_follow_the_ring_model(ctx);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeferredTransportRanks, ::testing::Values(1, 2, 3, 4, 9), test::rank_count_name);

}  // namespace

// A rank whose transport fails raises its error; the other ranks raise
// CommAborted naming it instead of waiting for it at the barrier; the group
// stays aborted.
TEST(Comm, TransportFailureFailsTheGroupInsteadOfHanging) {
  const int N = 3;
  std::vector<std::unique_ptr<ThreadTransport>> t;
  std::vector<FailingTransport*> raw;
  for (int r = 0; r < N; r++) {
    t.push_back(std::make_unique<FailingTransport>(r == 1));
    raw.push_back(static_cast<FailingTransport*>(t.back().get()));
  }
  auto comms = make_thread_communicators_with(std::move(t));
  EXPECT_EQ(thread_transport(*comms[1]), raw[1]);
  std::vector<std::string> errors(N);
  std::vector<char> aborted(N, 0);  // not vector<bool>: its elements share words, and each thread writes one
  std::vector<std::thread> threads;
  for (int r = 0; r < N; r++)
    threads.emplace_back([&, r] {
      // Freed as soon as the collective has raised: no peer may still be
      // writing into it then (MALLOC_PERTURB_ and heap checks catch it).
      std::vector<float> buf(1000, float(r));
      try {
        comms[r]->all_reduce(buf.data(), buf.size(), DType::f32);
      } catch (const CommAborted& e) {
        aborted[r] = true;
        errors[r] = e.what();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_FALSE(aborted[1]);
  EXPECT_NE(errors[1].find("injected transport failure"), std::string::npos) << errors[1];
  EXPECT_TRUE(raw[1]->drained_);
  for (int r : {0, 2}) {
    EXPECT_TRUE(aborted[r]) << errors[r];
    EXPECT_NE(errors[r].find("rank 1"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("injected transport failure"), std::string::npos) << errors[r];
  }
  std::vector<float> x(4, 1.0f);
  EXPECT_THROW(comms[0]->all_reduce(x.data(), x.size(), DType::f32), CommAborted);
}
