// test_faults.cpp: a failed rank never leaves the others waiting forever.
//
//   build-dir/tests/test_faults
//
// What it promises (comm.h, launch.h): when one rank throws, the
// group is aborted, every other rank's pending or later collective raises
// CommAborted, and run_ranks throws within seconds one error naming the rank
// that failed and its own message. Collectives that do not match between
// ranks, or a rank that stops issuing them, are a clear error, not a hang. An
// out-of-memory or a usage error keeps its type through run_ranks.
//
// Every scenario runs under a deadline: should a regression hang, the test
// binary aborts with a message instead of waiting for the harness timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "comm_threads.h"
#include "launch.h"
#include "memory.h"
#include "tensor.h"
#include "test_util.h"

using namespace zf;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double kDeadlineSeconds = 10.0;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs run_ranks(opt, fn) and returns the exception it threw (null if none)
// and how long it took. Aborts the whole test binary if it takes more than
// 30 s: a hang is the bug these tests exist to catch.
struct Outcome {
  std::exception_ptr error;
  double seconds;
};
Outcome run_with_deadline(const LaunchOptions& opt, const std::function<void(RankContext&)>& fn) {
  std::promise<std::exception_ptr> promise;
  auto future = promise.get_future();
  const auto t0 = Clock::now();
  std::thread runner([&promise, &opt, &fn] {
    try {
      run_ranks(opt, fn);
      promise.set_value(nullptr);
    } catch (...) {
      promise.set_value(std::current_exception());
    }
  });
  if (future.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    std::fprintf(stderr, "run_ranks hung for 30 s: aborting the test binary\n");
    std::abort();
  }
  runner.join();
  return {future.get(), std::chrono::duration<double>(Clock::now() - t0).count()};
}

std::string message_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
}

LaunchOptions ranks(int n) {
  LaunchOptions opt;
  opt.ranks = n;
  return opt;
}

}  // namespace

// One rank throws in the middle of a loop of collectives.
TEST(Faults, RankThrowingMidLoopAbortsTheOthers) {
  std::atomic<int> aborted{0}, finished{0};
  const Outcome out = run_with_deadline(ranks(4), [&](RankContext& ctx) {
    std::vector<float> grad(100000, 1.0f);
    try {
      for (int step = 0; step < 200; step++) {
        if (ctx.rank == 2 && step == 5) throw Error("boom at step 5");
        ctx.comm.all_reduce(grad.data(), grad.size(), DType::f32);
        std::fill(grad.begin(), grad.end(), 1.0f);
      }
      finished++;
    } catch (const CommAborted& e) {
      aborted++;
      EXPECT_TRUE(contains(e.what(), "rank 2 failed: boom at step 5")) << e.what();
      throw;
    }
  });
  ASSERT_TRUE(out.error) << "run_ranks returned although rank 2 threw";
  const std::string msg = message_of(out.error);
  EXPECT_TRUE(contains(msg, "rank 2 failed")) << msg;
  EXPECT_TRUE(contains(msg, "boom at step 5")) << msg;
  EXPECT_FALSE(contains(msg, "aborted")) << "the message should be rank 2's own: " << msg;
  EXPECT_EQ(aborted.load(), 3);
  EXPECT_EQ(finished.load(), 0);
  EXPECT_LT(out.seconds, kDeadlineSeconds);
}

// Async collectives already queued when the group aborts raise on wait().
TEST(Faults, PendingAsyncCollectivesRaiseCommAborted) {
  std::atomic<int> raised{0};
  const Outcome out = run_with_deadline(ranks(3), [&](RankContext& ctx) {
    std::vector<std::vector<float>> bufs(4, std::vector<float>(1000, 1.0f));
    if (ctx.rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      throw Error("rank zero gives up");
    }
    std::vector<CommHandle> hs;
    for (auto& b : bufs) hs.push_back(ctx.comm.all_reduce_async(b.data(), b.size(), DType::f32, ReduceOp::sum));
    for (auto& h : hs) {
      try {
        h.wait();
        ADD_FAILURE() << "a collective completed without rank 0";
      } catch (const CommAborted&) {
        raised++;
      }
      EXPECT_TRUE(h.done());
    }
    // Later collectives raise at once too.
    EXPECT_THROW(ctx.comm.barrier(), CommAborted);
  });
  ASSERT_TRUE(out.error);
  EXPECT_TRUE(contains(message_of(out.error), "rank 0 failed: rank zero gives up"))
      << message_of(out.error);
  EXPECT_EQ(raised.load(), 2 * 4);
  EXPECT_LT(out.seconds, kDeadlineSeconds);
}

// A rank throws before its first collective while the others wait in a barrier.
TEST(Faults, RankThrowingBeforeFirstCollectiveWakesTheBarrier) {
  std::atomic<int> aborted{0};
  const Outcome out = run_with_deadline(ranks(4), [&](RankContext& ctx) {
    if (ctx.rank == 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the others are waiting
      throw std::runtime_error("cannot open data file");
    }
    try {
      ctx.comm.barrier();
    } catch (const CommAborted&) {
      aborted++;
      throw;
    }
  });
  ASSERT_TRUE(out.error);
  const std::string msg = message_of(out.error);
  EXPECT_TRUE(contains(msg, "rank 3 failed: cannot open data file")) << msg;
  EXPECT_EQ(aborted.load(), 3);
  EXPECT_LT(out.seconds, kDeadlineSeconds);
}

// Ranks that issue different collectives get a clear error, not a hang.
TEST(Faults, MismatchedCollectiveKindsAreAnError) {
  const Outcome out = run_with_deadline(ranks(3), [&](RankContext& ctx) {
    std::vector<float> a(300), b(300);
    if (ctx.rank == 1)
      ctx.comm.all_gather(a.data(), b.data(), 100, DType::f32);
    else
      ctx.comm.all_reduce(a.data(), 100, DType::f32);
  });
  ASSERT_TRUE(out.error);
  const std::string msg = message_of(out.error);
  EXPECT_TRUE(contains(msg, "do not match")) << msg;
  EXPECT_TRUE(contains(msg, "all_reduce")) << msg;
  EXPECT_TRUE(contains(msg, "all_gather")) << msg;
  EXPECT_TRUE(contains(msg, "rank 1")) << msg;
  EXPECT_LT(out.seconds, kDeadlineSeconds);
}

TEST(Faults, MismatchedCountsOrDtypesAreAnError) {
  {
    const Outcome out = run_with_deadline(ranks(2), [&](RankContext& ctx) {
      std::vector<float> a(200);
      ctx.comm.all_reduce(a.data(), ctx.rank == 0 ? 200 : 150, DType::f32);
    });
    ASSERT_TRUE(out.error);
    const std::string msg = message_of(out.error);
    EXPECT_TRUE(contains(msg, "count 200")) << msg;
    EXPECT_TRUE(contains(msg, "count 150")) << msg;
  }
  {
    const Outcome out = run_with_deadline(ranks(2), [&](RankContext& ctx) {
      std::vector<float> a(200);
      ctx.comm.all_reduce(a.data(), 100, ctx.rank == 0 ? DType::f32 : DType::bf16);
    });
    ASSERT_TRUE(out.error);
    const std::string msg = message_of(out.error);
    EXPECT_TRUE(contains(msg, "f32")) << msg;
    EXPECT_TRUE(contains(msg, "bf16")) << msg;
  }
  {
    const Outcome out = run_with_deadline(ranks(2), [&](RankContext& ctx) {
      std::vector<float> a(200);
      ctx.comm.broadcast(a.data(), 100, DType::f32, ctx.rank);  // each rank its own root
    });
    ASSERT_TRUE(out.error);
    EXPECT_TRUE(contains(message_of(out.error), "root")) << message_of(out.error);
  }
}

// A rank that returns after fewer collectives than the others: the ones
// still waiting for it fail with a message naming it.
TEST(Faults, RankLeavingEarlyIsAnErrorNotAHang) {
  const Outcome out = run_with_deadline(ranks(3), [&](RankContext& ctx) {
    std::vector<float> a(100, 1.0f);
    const int steps = ctx.rank == 0 ? 2 : 3;
    for (int s = 0; s < steps; s++) ctx.comm.all_reduce(a.data(), a.size(), DType::f32);
  });
  ASSERT_TRUE(out.error);
  const std::string msg = message_of(out.error);
  EXPECT_TRUE(contains(msg, "rank 0 finished after issuing only 2 collectives")) << msg;
  EXPECT_LT(out.seconds, kDeadlineSeconds);
}

// An out-of-memory on one rank comes out of run_ranks as OutOfMemory.
TEST(Faults, OutOfMemoryKeepsItsType) {
  LaunchOptions opt = ranks(4);
  opt.device_budget = 1 << 20;  // 1 MiB per rank
  const Outcome out = run_with_deadline(opt, [&](RankContext& ctx) {
    ASSERT_EQ(ctx.mem.device_budget(), std::optional<size_t>(1 << 20));
    ASSERT_EQ(ctx.mem.rank(), ctx.rank);
    Tensor params(ctx.mem, Place::device, Category::params, DType::f32, 1000);
    // Rank 1 holds more than the others, so only it runs out.
    const size_t n = ctx.rank == 1 ? (size_t(2) << 20) / 4 : 1000;
    Tensor grads(ctx.mem, Place::device, Category::grads, DType::f32, n);
    ctx.comm.all_reduce(params.data(), params.numel(), DType::f32);
  });
  ASSERT_TRUE(out.error);
  try {
    std::rethrow_exception(out.error);
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "rank 1")) << msg;
    EXPECT_TRUE(contains(msg, "grads")) << msg;
    EXPECT_TRUE(contains(msg, "--device-mem")) << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected OutOfMemory, got: " << e.what();
  }
  EXPECT_LT(out.seconds, kDeadlineSeconds);
}

TEST(Faults, UsageErrorKeepsItsType) {
  const Outcome out = run_with_deadline(ranks(2), [&](RankContext& ctx) {
    if (ctx.rank == 0) parse_size("12XB");
    ctx.comm.barrier();
  });
  ASSERT_TRUE(out.error);
  EXPECT_THROW(std::rethrow_exception(out.error), UsageError);
  EXPECT_TRUE(contains(message_of(out.error), "12XB")) << message_of(out.error);
}

// Errors raised inside a rank carry the rank in their location tag.
TEST(Faults, RequireNamesTheRank) {
  const Outcome out = run_with_deadline(ranks(3), [&](RankContext& ctx) {
    EXPECT_EQ(current_rank(), ctx.rank);
    REQUIRE(ctx.rank != 2, "shape mismatch " << 3 << " vs " << 4);
  });
  ASSERT_TRUE(out.error);
  const std::string msg = message_of(out.error);
  EXPECT_TRUE(contains(msg, "rank 2 failed")) << msg;
  EXPECT_TRUE(contains(msg, "[rank 2] shape mismatch 3 vs 4")) << msg;
}

TEST(Faults, CleanRunThrowsNothing) {
  const Outcome out = run_with_deadline(ranks(4), [&](RankContext& ctx) {
    std::vector<float> a(10, 1.0f);
    ctx.comm.all_reduce(a.data(), a.size(), DType::f32);
    EXPECT_EQ(a[0], 4.0f);
  });
  EXPECT_FALSE(out.error) << message_of(out.error);
}

// abort() from outside the ranks (a watchdog, a signal handler's thread)
// wakes a rank blocked in a collective and fails every later one.
TEST(Faults, AbortFromAnotherThreadWakesAWaitingRank) {
  auto comms = make_thread_communicators(2);
  std::vector<float> a(100, 1.0f);
  CommHandle h = comms[0]->all_reduce_async(a.data(), a.size(), DType::f32, ReduceOp::sum);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(h.done());  // rank 1 never joins
  comms[1]->abort("watchdog: step took too long");
  try {
    h.wait();
    ADD_FAILURE() << "wait() returned on an aborted group";
  } catch (const CommAborted& e) {
    EXPECT_TRUE(contains(e.what(), "watchdog: step took too long")) << e.what();
    EXPECT_TRUE(contains(e.what(), "all_reduce")) << e.what();
  }
  EXPECT_THROW(comms[0]->barrier(), CommAborted);
  EXPECT_THROW(comms[1]->all_reduce(a.data(), a.size(), DType::f32), CommAborted);
  // Communicators of an aborted group are destroyed without hanging.
  comms.clear();
}

// Rank threads that cannot all be made are a clear error naming how many
// were asked for and how many started, with the system's reason, and the
// started ones, waiting to begin with the others, are released and joined
// without running (had they run, their BLAS buffers would compete for the
// exhausted address space, and OpenBLAS retries a failed allocation for
// ever): exit 1 within seconds, never std::terminate's abort (134) or a
// hang. The limits make the address space, not memory for the model, run
// out: 128 MiB stacks (2 malloc arenas) in 42 GB hold the 256 communicator
// threads (two per rank, the training's and the stop vote's: 32 GiB of
// stacks, made first) and a few dozen rank threads. Without the release
// their wait never ends: `timeout -s KILL 60` turns it into exit 137.
// ZF_OVERSUBSCRIBE=1 lifts the cap of 4 ranks per core.
TEST(Faults, RankThreadsThatCannotStartAreAnErrorNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "built with a sanitizer (scripts/sanitize.sh): its shadow memory reserves terabytes of "
                  "address space at start-up, which this test's `ulimit -v` forbids";
#endif
  const auto r = test::run_command("ulimit -s 131072; ulimit -v 41000000; MALLOC_ARENA_MAX=2 ZF_OVERSUBSCRIBE=1 "
                                   "timeout -s KILL 60 " + test::dp_binary() +
                                   " --model tiny --steps 2 --batch 1 --ranks 128");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const size_t at = r.output.find(" of the 128 rank threads started");
  ASSERT_NE(at, std::string::npos) << r.output;
  // Some started (so some had to be released), not all.
  const size_t only = r.output.rfind("only ", at);
  ASSERT_NE(only, std::string::npos) << r.output;
  const int started = std::atoi(r.output.c_str() + only + 5);
  EXPECT_GT(started, 0) << r.output;
  EXPECT_LT(started, 128) << r.output;
  EXPECT_TRUE(contains(r.output, "Resource temporarily unavailable")) << r.output;
  EXPECT_FALSE(contains(r.output, "terminate called")) << r.output;
}
