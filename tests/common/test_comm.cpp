// test_comm.cpp: every collective of the `threads` backend against a direct
// computation, for 1 to 8 ranks.
//
//   build-dir/tests/test_comm
//
// The checks themselves are in comm_checks.h, shared with the mpi backend's
// suite (tests/mpi/test_comm_mpi.cpp): inputs seeded by rank and element
// index, expected sums computed in the promised rank order, compared bit for
// bit.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "comm.h"
#include "comm_checks.h"
#include "comm_threads.h"
#include "launch.h"

using namespace zf;

namespace {

void run(int N, const std::function<void(RankContext&)>& fn) {
  LaunchOptions opt;
  opt.ranks = N;
  run_ranks(opt, fn);
}

class CommRanks : public ::testing::TestWithParam<int> {};

}  // namespace

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

INSTANTIATE_TEST_SUITE_P(Ranks, CommRanks, ::testing::Range(1, 9),
                         [](const auto& info) {
                           std::string name = "N";  // not "N" + ...: GCC 12 -Wrestrict false positive
                           name += std::to_string(info.param);
                           return name;
                         });

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
