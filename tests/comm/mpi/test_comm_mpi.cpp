// test_comm_mpi.cpp: the `mpi` backend passes the threads backend's collective
// checks, and the one-rank-per-process launch works. Runs under mpirun:
//
//   mpirun --oversubscribe -np 4 build-dir/tests/test_comm_mpi
//
// (meson test runs it with -np 2 and -np 4: suites mpi_comm_np2, mpi_comm_np4.)
// Every process runs every test, as one rank. The checks are comm_checks.h's,
// the same the threads backend passes, so both backends are held to the same
// bits. Only rank 0 prints gtest's report and writes the XML; the other ranks
// print their failures prefixed with their rank, and after each test all
// ranks agree on it: a test that failed on any rank fails on rank 0, naming
// the ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "blas.h"
#include "comm.h"
#include "comm/comm_checks.h"
#include "comm/split_checks.h"
#include "comm_mpi.h"
#include "comm_threads.h"
#include "launch.h"

using namespace zf;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Each test runs its body on this process's rank with a fresh communicator,
// then all ranks agree on the verdict.
class Mpi : public ::testing::Test {
 protected:
  void run(const std::function<void(RankContext&)>& fn) {
    std::unique_ptr<Communicator> comm = make_mpi_communicator();
    MemoryTracker mem(comm->rank());
    std::unique_ptr<Device> dev = make_cpu_device();
    RankContext ctx{comm->rank(), comm->size(), *comm, mem, *dev};
    set_current_rank(ctx.rank);
    fn(ctx);
    set_current_rank(-1);
  }

  void TearDown() override {
    const std::vector<int> failed = mpi_gather_ints(HasFailure() ? 1 : 0);
    std::string ranks;
    for (size_t q = 0; q < failed.size(); q++)
      if (failed[q] && int(q) != mpi_world_rank()) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
    if (!ranks.empty() && !HasFailure())
      ADD_FAILURE() << "failed on rank(s) " << ranks << " (their messages are above, prefixed by rank)";
  }
};

// ------------------------------------------------------------------ the collectives

TEST_F(Mpi, AllReduce) {
  run([](RankContext& ctx) {
    EXPECT_EQ(ctx.comm.size(), mpi_world_size());
    EXPECT_EQ(ctx.comm.rank(), mpi_world_rank());
    EXPECT_STREQ(ctx.comm.backend(), "mpi");
    test::scenario_all_reduce(ctx);
  });
}
TEST_F(Mpi, ReduceScatter) { run(test::scenario_reduce_scatter); }
TEST_F(Mpi, AllGather) { run(test::scenario_all_gather); }
TEST_F(Mpi, Broadcast) { run(test::scenario_broadcast); }
TEST_F(Mpi, ReduceScatterThenAllGatherEqualsAllReduceBitForBit) {
  run(test::scenario_reduce_scatter_then_all_gather_equals_all_reduce_bit_for_bit);
}
TEST_F(Mpi, InPlaceReduceScatterAndAllGather) {
  run(test::scenario_in_place_reduce_scatter_and_all_gather);
}
TEST_F(Mpi, SeveralAsyncInFlightWaitedInOrder) {
  run(test::scenario_several_async_in_flight_waited_in_order);
}
TEST_F(Mpi, ByteCountersFollowTheRingModel) { run(test::scenario_byte_counters_follow_the_ring_model); }
TEST_F(Mpi, ManySmallCollectivesInARow) { run(test::scenario_many_small_collectives_in_a_row); }

// The same inputs through both backends: this process also runs the N ranks
// as threads, and the mpi result must equal the threads result bit for bit.
TEST_F(Mpi, SameBitsAsTheThreadsBackend) {
  run([](RankContext& ctx) {
    const int N = ctx.world, r = ctx.rank;
    const size_t count = 10007;  // not a multiple of N
    auto input = [&](int q, std::vector<float>& x, std::vector<bf16>& y) {
      for (size_t i = 0; i < count; i++) {
        x[i] = test::input_f32(900, q, i);
        y[i] = test::input_bf16(901, q, i);
      }
    };
    // The threads backend, N threads in this process.
    std::vector<std::vector<float>> tf(N, std::vector<float>(count));
    std::vector<std::vector<bf16>> tb(N, std::vector<bf16>(count));
    {
      auto comms = make_thread_communicators(N);
      std::vector<std::thread> threads;
      for (int q = 0; q < N; q++)
        threads.emplace_back([&, q] {
          input(q, tf[q], tb[q]);
          comms[q]->all_reduce(tf[q].data(), count, DType::f32, ReduceOp::avg);
          comms[q]->all_reduce(tb[q].data(), count, DType::bf16, ReduceOp::sum);
        });
      for (auto& t : threads) t.join();
    }
    // The mpi backend, one rank per process.
    std::vector<float> mf(count);
    std::vector<bf16> mb(count);
    input(r, mf, mb);
    ctx.comm.all_reduce(mf.data(), count, DType::f32, ReduceOp::avg);
    ctx.comm.all_reduce(mb.data(), count, DType::bf16, ReduceOp::sum);
    EXPECT_EQ(std::memcmp(mf.data(), tf[r].data(), count * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(mb.data(), tb[r].data(), count * sizeof(bf16)), 0);
  });
}

// ------------------------------------------------------------------ errors, not hangs

// Collectives that differ between ranks are the same error on every rank,
// and the group stays usable.
TEST_F(Mpi, MismatchedCollectivesAreAnErrorOnEveryRank) {
  run([](RankContext& ctx) {
    std::vector<float> buf(20, 1.0f);
    const size_t count = ctx.rank == 0 ? 10 : 11;
    const std::string msg =
        message_of([&] { ctx.comm.all_reduce(buf.data(), count, DType::f32); });
    EXPECT_TRUE(contains(msg, "collectives do not match")) << msg;
    EXPECT_TRUE(contains(msg, "rank 0 called all_reduce(count 10")) << msg;
    std::fill(buf.begin(), buf.end(), 1.0f);
    ctx.comm.all_reduce(buf.data(), buf.size(), DType::f32);
    EXPECT_EQ(buf[0], float(ctx.world));
  });
}

// A rank that stops issuing collectives is named by the others, who raise
// instead of waiting forever.
TEST_F(Mpi, RankThatFinishedEarlyIsNamed) {
  const int last = mpi_world_size() - 1;
  run([&](RankContext& ctx) {
    int64_t x = 1;
    ctx.comm.all_reduce(&x, 1, DType::i64);
    if (ctx.rank == last) return;  // leaves: its communicator is destroyed
    const std::string msg = message_of([&] { ctx.comm.all_reduce(&x, 1, DType::i64); });
    EXPECT_TRUE(contains(msg, "rank " + std::to_string(last) + " finished after issuing only 1"))
        << msg;
    // Later collectives fail at once, with the same reason.
    EXPECT_TRUE(contains(message_of([&] { ctx.comm.barrier(); }), "finished after issuing only"));
  });
}

// abort() fails this rank's pending and later collectives at once, and
// returns although the collective in flight can never complete.
TEST_F(Mpi, AbortFailsPendingCollectivesWithoutWaitingForPeers) {
  run([](RankContext& ctx) {
    // The others never join rank 0's collectives: they wait (outside this
    // communicator) until rank 0 is done, then leave.
    if (ctx.rank != 0) {
      mpi_gather_ints(0);
      return;
    }
    std::vector<float> a(1000, 1.0f), b(1000, 1.0f);
    CommHandle h1 = ctx.comm.all_reduce_async(a.data(), a.size(), DType::f32, ReduceOp::sum);
    CommHandle h2 = ctx.comm.all_reduce_async(b.data(), b.size(), DType::f32, ReduceOp::sum);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(h1.done());
    const auto t0 = std::chrono::steady_clock::now();
    ctx.comm.abort("test abort");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
    EXPECT_THROW(h1.wait(), CommAborted);
    EXPECT_THROW(h2.wait(), CommAborted);
    const std::string msg = message_of([&] { ctx.comm.barrier(); });
    EXPECT_TRUE(contains(msg, "aborted: test abort")) << msg;
    mpi_gather_ints(0);
  });
}

// ------------------------------------------------------------------ split

// HSDP's splits in groups of 2 (np 2: one group and singletons; np 4: two of
// each), each child's collectives against sums over its member ranks.
TEST_F(Mpi, SplitChildrenSumOverTheirMembers) {
  run([](RankContext& ctx) { test::scenario_split_hsdp(ctx, 2, false); });
  run([](RankContext& ctx) { test::scenario_split_hsdp(ctx, 2, true); });
  run([](RankContext& ctx) { test::scenario_split_hsdp(ctx, 1, false); });
}
TEST_F(Mpi, SplitStatsAreCountedApart) { run(test::scenario_split_stats_apart); }
TEST_F(Mpi, SplitTwoQueuesAreIndependent) { run(test::scenario_two_queues_are_independent); }
TEST_F(Mpi, SplitNegativeColorIsAnErrorOnEveryRank) {
  run([](RankContext& ctx) {
    test::scenario_split_negative_color_is_an_error_on_every_rank(ctx);
    test::check_parent_all_reduce(ctx.comm, ctx.rank, 700);  // the communicator still works
  });
}
TEST_F(Mpi, SplitMismatchOnAChildIsAnError) { run(test::scenario_split_child_mismatch_is_an_error); }
TEST_F(Mpi, SplitAgainstACollectiveIsAnError) {
  run(test::scenario_split_against_a_collective_is_an_error);
}

// Within a process, aborting the parent fails a child's pending collective
// and aborting a child the parent's (peer processes are the launcher's to
// end: comm_mpi.h). The other ranks never join rank 0's collectives.
TEST_F(Mpi, SplitAbortReachesTheWholeFamily) {
  for (bool by_child : {false, true}) {
    SCOPED_TRACE(by_child ? "abort the child" : "abort the parent");
    run([&](RankContext& ctx) {
      std::unique_ptr<Communicator> child = ctx.comm.split(0, ctx.rank);
      if (ctx.rank != 0) {
        mpi_gather_ints(0);
        return;
      }
      std::vector<float> a(1000, 1.0f), b(1000, 1.0f);
      CommHandle hp = ctx.comm.all_reduce_async(a.data(), a.size(), DType::f32, ReduceOp::sum);
      CommHandle hc = child->all_reduce_async(b.data(), b.size(), DType::f32, ReduceOp::sum);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      EXPECT_FALSE(hp.done());
      EXPECT_FALSE(hc.done());
      (by_child ? *child : ctx.comm).abort("rank 0 failed");
      // Polled, not waited: without the family's abort one would never end.
      auto done_soon = [](const CommHandle& h) {
        for (int i = 0; i < 500 && !h.done(); i++)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return h.done();
      };
      const bool both = done_soon(hp) && done_soon(hc);
      EXPECT_TRUE(both) << "the abort did not reach the other communicator";
      if (!both) {
        ctx.comm.abort("cleanup");
        child->abort("cleanup");
      }
      EXPECT_THROW(hp.wait(), CommAborted);
      EXPECT_THROW(hc.wait(), CommAborted);
      EXPECT_TRUE(contains(message_of([&] { child->barrier(); }), "aborted: rank 0 failed"));
      EXPECT_TRUE(contains(message_of([&] { ctx.comm.barrier(); }), "aborted: rank 0 failed"));
      mpi_gather_ints(0);
    });
  }
}

// ------------------------------------------------------------------ one rank per process

TEST_F(Mpi, LauncherIsDetected) {
  const LauncherInfo l = detect_launcher();
  EXPECT_EQ(l.name, "mpirun");
  EXPECT_EQ(l.size, mpi_world_size());
  EXPECT_EQ(l.rank, mpi_world_rank());
  const World w = resolve_world(1, "cpu");
  EXPECT_TRUE(w.multi_process());
  EXPECT_EQ(w.size, mpi_world_size());
  EXPECT_EQ(w.process_rank, mpi_world_rank());
  EXPECT_EQ(w.prints(), mpi_world_rank() == 0);
}

// run_ranks runs exactly one rank here, this process's, over MPI; the
// results every rank shares reach every rank.
TEST_F(Mpi, RunRanksRunsThisProcessRankAndSharesResults) {
  int calls = 0;
  std::vector<RankResult> results(static_cast<size_t>(mpi_world_size()));
  LaunchOptions opt;
  opt.ranks = mpi_world_size();
  run_ranks(opt, [&](RankContext& ctx) {
    calls++;
    EXPECT_EQ(ctx.rank, mpi_world_rank());
    EXPECT_EQ(ctx.world, mpi_world_size());
    EXPECT_STREQ(ctx.comm.backend(), "mpi");
    EXPECT_EQ(current_rank(), ctx.rank);
    RankResult& mine = results[ctx.rank];
    mine.losses = {1.5f, 2.5f};
    mine.step_ms = {10.0 + ctx.rank, 20.0};
    mine.param_hash = 1000 + uint64_t(ctx.rank);
    mine.memory.current[int(Place::device)][int(Category::params)] = 100 * size_t(ctx.rank + 1);
    mine.memory.peak_total[int(Place::host)] = 7;
    mine.comm.add(CollectiveKind::all_gather, 0.5 * ctx.rank);
    share_rank_results(ctx, results);
  });
  EXPECT_EQ(calls, 1);
  for (int q = 0; q < mpi_world_size(); q++) {
    const RankResult& r = results[size_t(q)];
    EXPECT_EQ(r.losses, (std::vector<float>{1.5f, 2.5f})) << q;
    EXPECT_EQ(r.step_ms, (std::vector<double>{10.0 + q, 20.0})) << q;
    EXPECT_EQ(r.param_hash, 1000u + uint64_t(q));
    EXPECT_EQ(r.memory.cur(Place::device, Category::params), 100 * size_t(q + 1));
    EXPECT_EQ(r.memory.peak_total[int(Place::host)], 7u);
    EXPECT_EQ(r.comm.bytes[int(CollectiveKind::all_gather)], 0.5 * q);
    EXPECT_EQ(r.comm.calls[int(CollectiveKind::all_gather)], 1u);
  }
}

// Rank 0's process prints gtest's report and writes the XML; the others print
// only their failures, with their rank, so a log of N processes stays readable.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  zf::blas_select_kernels(argc, argv);
  zf::mpi_init_once();
  const int rank = zf::mpi_world_rank();
  // Only rank 0 writes the XML report: drop --gtest_output on the others
  // before GoogleTest sees it (it opens the file while initialising, and N
  // processes writing one file corrupt it).
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i)
    if (rank == 0 || std::strncmp(argv[i], "--gtest_output", 14) != 0) args.push_back(argv[i]);
  int nargs = int(args.size());
  args.push_back(nullptr);
  ::testing::InitGoogleTest(&nargs, args.data());
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  return RUN_ALL_TESTS();
}
