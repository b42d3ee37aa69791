// test_comm_split.cpp: Communicator::split on the `threads` backend, and on
// the schedule recorder: HSDP's two splits at N = 4 and 6 against sums
// computed directly over the member ranks, counters apart, two queues that
// do not wait for each other, aborts across a family, the errors of a bad
// split, and the recorder's queue numbers.
//
//   build-dir/tests/test_comm --gtest_filter='CommSplit*'
//
// The per-rank checks are split_checks.h's, shared with the mpi suite.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "comm_recording.h"
#include "comm_threads.h"
#include "device.h"
#include "launch.h"
#include "memory.h"
#include "split_checks.h"

using namespace zf;

namespace {

// Runs fn on one thread per rank of a fresh threads group of N.
void run_threads(int N, const std::function<void(RankContext&)>& fn) {
  auto comms = make_thread_communicators(N);
  std::vector<std::thread> threads;
  for (int r = 0; r < N; r++)
    threads.emplace_back([&, r] {
      set_current_rank(r);
      MemoryTracker mem(r);
      auto dev = make_cpu_device();
      RankContext ctx{r, N, *comms[r], mem, *dev};
      fn(ctx);
      set_current_rank(-1);
    });
  for (auto& t : threads) t.join();
}

struct Hsdp {
  int N, S;
  bool reverse;
};

class CommSplitHsdp : public ::testing::TestWithParam<Hsdp> {};

TEST_P(CommSplitHsdp, ChildrenSumOverTheirMembersAndTheParentStillWorks) {
  const Hsdp p = GetParam();
  run_threads(p.N, [&](RankContext& ctx) { test::scenario_split_hsdp(ctx, p.S, p.reverse); });
}

INSTANTIATE_TEST_SUITE_P(Groups, CommSplitHsdp,
                         ::testing::Values(Hsdp{2, 2, false}, Hsdp{4, 2, false}, Hsdp{4, 2, true},
                                           Hsdp{6, 2, false}, Hsdp{6, 3, false}, Hsdp{6, 3, true},
                                           Hsdp{6, 1, false}),
                         [](const auto& info) {
                           return "N" + std::to_string(info.param.N) + "_S" +
                                  std::to_string(info.param.S) +
                                  (info.param.reverse ? "_reversed" : "");
                         });

}  // namespace

TEST(CommSplit, StatsAreCountedApart) {
  run_threads(4, test::scenario_split_stats_apart);
  run_threads(6, test::scenario_split_stats_apart);
}

TEST(CommSplit, TwoQueuesAreIndependent) {
  run_threads(2, test::scenario_two_queues_are_independent);
  run_threads(4, test::scenario_two_queues_are_independent);
}

// The same schedule on one queue cannot complete: rank 0's all_gather meets
// the others' reduce_scatter. (What the two-queue test would see if split
// handed back the parent's queue.)
TEST(CommSplit, TheTwoQueueScheduleFailsOnOneQueue) {
  run_threads(2, [](RankContext& ctx) {
    const std::string msg = test::message_of_call([&] {
      test::within_deadline(ctx.comm, std::chrono::seconds(30),
                            [&] { test::two_queue_schedule(ctx.comm, ctx.comm, ctx.rank, ctx.world); });
    });
    EXPECT_NE(msg.find("collectives do not match"), std::string::npos) << msg;
  });
}

// A rank aborting one communicator of a family wakes a peer blocked in
// another: the parent's abort reaches a child's collective, a child's abort
// the parent's, and a grandchild's the parent's.
TEST(CommSplit, AbortReachesEveryCommunicatorOfTheFamily) {
  enum Which { parent, child, grandchild };
  for (auto [aborted, blocked] : {std::pair{parent, child}, std::pair{child, parent},
                                  std::pair{grandchild, parent}}) {
    SCOPED_TRACE("abort " + std::to_string(aborted) + ", blocked in " + std::to_string(blocked));
    std::atomic<bool> raised{false};
    std::string message;
    run_threads(2, [&](RankContext& ctx) {
      std::unique_ptr<Communicator> c = ctx.comm.split(0, ctx.rank);
      std::unique_ptr<Communicator> g = c->split(0, ctx.rank);
      Communicator* by[] = {&ctx.comm, c.get(), g.get()};
      if (ctx.rank == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 1 is waiting by then
        by[aborted]->abort("rank 0 failed");
        return;
      }
      std::vector<float> buf(100, 1.0f);
      try {  // rank 0 never joins; without the family's abort, the deadline's ends it
        test::within_deadline(*by[blocked], std::chrono::seconds(20), [&] {
          by[blocked]->all_reduce(buf.data(), buf.size(), DType::f32);
        });
      } catch (const CommAborted& e) {
        raised = true;
        message = e.what();
      } catch (const std::exception& e) {  // e.g. rank 0 left: not the abort
        message = e.what();
      }
    });
    EXPECT_TRUE(raised);
    EXPECT_NE(message.find("rank 0 failed"), std::string::npos) << message;
  }
}

TEST(CommSplit, NegativeColorIsAnErrorOnEveryRank) {
  run_threads(4, test::scenario_split_negative_color_is_an_error_on_every_rank);
}

TEST(CommSplit, MismatchOnAChildIsAnError) {
  run_threads(3, test::scenario_split_child_mismatch_is_an_error);
}

TEST(CommSplit, SplitAgainstACollectiveIsAnError) {
  run_threads(2, test::scenario_split_against_a_collective_is_an_error);
}

// The recorder's split logs into the same list: its events carry queue 1,
// one seq order with queue 0's, ids unique across both; a reduce_scatter on
// queue 1 and an all_gather on queue 0 are in flight together.
TEST(CommSplit, RecorderSplitLogsQueueOneInTheSameOrder) {
  run_threads(2, [](RankContext& ctx) {
    RecordOptions opt;
    opt.delay = std::chrono::milliseconds(30);
    RecordingCommunicator rec(ctx.comm, opt);
    std::unique_ptr<Communicator> q1 = rec.split(0, ctx.rank);
    ASSERT_NE(find_recorder(*q1), nullptr);
    EXPECT_EQ(find_recorder(*q1)->queue(), 1);
    EXPECT_EQ(rec.queue(), 0);
    const size_t k = 64;
    std::vector<float> rs_send(2 * k, 1.0f), rs_recv(k), ag_send(k, 2.0f), ag_recv(2 * k);
    CommHandle rs = q1->reduce_scatter_async(rs_send.data(), rs_recv.data(), k, DType::f32, ReduceOp::sum);
    CommHandle ag = rec.all_gather_async(ag_send.data(), ag_recv.data(), k, DType::f32);
    ag.wait_host();
    rs.wait_host();
    EXPECT_EQ(rs_recv[0], 2.0f);
    EXPECT_EQ(ag_recv[k], 2.0f);
    std::unique_ptr<Communicator> q2 = q1->split(0, ctx.rank);  // a split of a split: queue 2
    EXPECT_EQ(find_recorder(*q2)->queue(), 2);
    q2->barrier();

    const std::vector<ScheduleEvent> ev = rec.events();
    ASSERT_EQ(ev.size(), 9u);  // 3 per collective
    for (size_t i = 0; i < ev.size(); i++) EXPECT_EQ(ev[i].seq, i);
    auto find = [&](ScheduleEvent::Kind kind, CollectiveKind c) {
      for (const auto& e : ev)
        if (e.kind == kind && e.collective == c) return e;
      ADD_FAILURE() << "no " << schedule_event_name(kind) << " " << collective_name(c);
      return ScheduleEvent{};
    };
    const auto rs_issued = find(ScheduleEvent::issued, CollectiveKind::reduce_scatter);
    const auto ag_issued = find(ScheduleEvent::issued, CollectiveKind::all_gather);
    const auto rs_done = find(ScheduleEvent::completed, CollectiveKind::reduce_scatter);
    const auto ag_done = find(ScheduleEvent::completed, CollectiveKind::all_gather);
    const auto bar = find(ScheduleEvent::issued, CollectiveKind::barrier);
    EXPECT_EQ(rs_issued.queue, 1);
    EXPECT_EQ(rs_done.queue, 1);
    EXPECT_EQ(ag_issued.queue, 0);
    EXPECT_EQ(ag_done.queue, 0);
    EXPECT_EQ(bar.queue, 2);
    EXPECT_NE(rs_issued.id, ag_issued.id);
    EXPECT_NE(bar.id, rs_issued.id);
    EXPECT_NE(bar.id, ag_issued.id);
    // Both issued before either completed: in flight at the same time.
    EXPECT_LT(ag_issued.seq, rs_done.seq);
    EXPECT_LT(rs_issued.seq, ag_done.seq);
    EXPECT_NE(describe(rs_issued).find("queue 1"), std::string::npos) << describe(rs_issued);
    EXPECT_EQ(describe(ag_issued).find("queue"), std::string::npos) << describe(ag_issued);
  });
}

// A transport that cannot split says so, naming the backend, on the caller's
// thread (every rank of a group has the same transport, so none waits).
TEST(CommSplit, UnsupportedBackendRaisesNamingIt) {
  class NoSplit : public Communicator {
   public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    const char* backend() const override { return "nosplit"; }
    CommHandle all_reduce_async(void*, size_t, DType, ReduceOp) override { return {}; }
    CommHandle reduce_scatter_async(const void*, void*, size_t, DType, ReduceOp) override { return {}; }
    CommHandle all_gather_async(const void*, void*, size_t, DType) override { return {}; }
    CommHandle broadcast_async(void*, size_t, DType, int) override { return {}; }
    void barrier() override {}
    void abort(const std::string&) override {}
  } c;
  const std::string msg = test::message_of_call([&] { c.split(0, 0); });
  EXPECT_EQ(msg.find("split is not supported by nosplit") != std::string::npos, true) << msg;
}
