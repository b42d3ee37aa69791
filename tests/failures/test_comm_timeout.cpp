// test_comm_timeout.cpp: a rank that stalls (stuck outside any collective,
// never failing) ends the run within seconds, non-zero, with one message
// naming the collective and the rank that did not arrive, instead of the
// others waiting forever (comm.h: CommTimeout, --comm-timeout).
//
//   build-dir/tests/test_faults --gtest_filter='CommTimeout*'
//
// Every run of an executable goes through `timeout 40`: without the
// watchdog the stalled run would hang, and exit 124 says so instead of
// hanging the suite. The MPI forms live in frame/test_launch_mpi.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "comm_threads.h"
#include "test_util.h"

namespace zf {
namespace {

using test::run_command;

std::string binary(const char* env, const char* fallback) {
  const char* p = std::getenv(env);
  return p ? p : fallback;
}

struct Timed {
  test::ProcessResult r;
  double seconds;
};

Timed timed(const std::string& command) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_command(command);
  return {r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

void expect_words(const std::string& output, const std::vector<std::string>& words) {
  for (const auto& w : words) EXPECT_NE(output.find(w), std::string::npos) << "'" << w << "' missing:\n" << output;
}

// The stalled run: non-zero (not the harness's 124), quick, and the message
// names the timeout, the stalled rank, a collective and the way out.
void expect_stall_reported(const Timed& t, double timeout_s, const std::string& collective) {
  EXPECT_NE(t.r.exit_code, 124) << "the run hung until `timeout` killed it:\n" << t.r.output;
  EXPECT_EQ(t.r.exit_code, 1) << t.r.output;
  // The timeout, then as long again for the rank threads to return (the
  // stalled one never does), plus start-up on a loaded 2-core machine.
  EXPECT_LT(t.seconds, 2 * timeout_s + 15) << t.r.output;
  std::ostringstream after;
  after << "timed out after " << timeout_s << " s";
  expect_words(t.r.output, {after.str(), "rank 1 has not issued it yet", collective + "(count ",
                            "step 2", "--comm-timeout", "rank 1 has still not returned"});
}

std::string dp_five_steps() { return "timeout 40 " + test::dp_binary() + " --model tiny --steps 5 --batch 1 --quiet"; }

TEST(CommTimeout, StalledThreadRankEndsTheRun) {
  expect_stall_reported(timed(dp_five_steps() + " --ranks 3 --inject-fault 1:2:stall --comm-timeout 2"), 2,
                        "all_reduce");
}

// A sharded stage: stage 03's collectives are all-gathers and reduce-scatters.
TEST(CommTimeout, StalledThreadRankEndsAShardedRun) {
  const std::string zero3 = binary("ZF_ZERO3_BIN", "build/03_zero3/zero3");
  const Timed t = timed("timeout 40 " + zero3 +
                        " --model tiny --steps 5 --batch 1 --quiet --ranks 3 --inject-fault 1:2:stall "
                        "--comm-timeout 2");
  const bool named = t.r.output.find("all_gather(count ") != std::string::npos ||
                     t.r.output.find("reduce_scatter(count ") != std::string::npos;
  EXPECT_TRUE(named) << t.r.output;
  expect_stall_reported(t, 2, "");
}

// A dry run's ranks are fibers on one thread: the watchdog names the stuck
// one and ends the process, with the program's name like every other error.
TEST(CommTimeout, StalledDryRunRankIsNamed) {
  const std::string zero3 = binary("ZF_ZERO3_BIN", "build/03_zero3/zero3");
  const Timed t = timed("timeout 40 " + zero3 +
                        " --model tiny --steps 3 --batch 1 --quiet --ranks 4 --clock modeled --dry-run "
                        "--hardware h100-sxm --inject-fault 1:1:stall --comm-timeout 2");
  EXPECT_EQ(t.r.exit_code, 1) << t.r.output;
  EXPECT_LT(t.seconds, 2 + 15) << t.r.output;
  expect_words(t.r.output, {"zero3: error: rank 1 of the dry run has run 2 s (--comm-timeout)", "stuck"});
}

TEST(CommTimeout, EnvironmentSetsItAndTheFlagWins) {
  expect_stall_reported(timed("ZF_COMM_TIMEOUT_S=1.5 " + dp_five_steps() + " --ranks 3 --inject-fault 1:2:stall"), 1.5,
                        "all_reduce");
  // The flag wins over the environment, even over a value it would refuse.
  expect_stall_reported(
      timed("ZF_COMM_TIMEOUT_S=600 " + dp_five_steps() + " --ranks 3 --inject-fault 1:2:stall --comm-timeout 2"), 2,
      "all_reduce");
  EXPECT_EQ(run_command("ZF_COMM_TIMEOUT_S=soon " + dp_five_steps() + " --ranks 2 --comm-timeout 30").exit_code, 0);
}

// A healthy run with a short timeout is unaffected: waits reset with every
// collective, they do not add up over the run.
TEST(CommTimeout, HealthyRunWithAShortTimeoutSucceeds) {
  const auto r = run_command(dp_five_steps() + " --ranks 3 --steps 20 --comm-timeout 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(CommTimeout, BadValuesAreUsageErrors) {
  for (const std::string v : {"0", "-1", "abc", "''", "2s", "inf", "nan", "1e8"}) {
    const auto r = run_command(dp_five_steps() + " --comm-timeout " + v);
    EXPECT_EQ(r.exit_code, 2) << v << "\n" << r.output;
    expect_words(r.output, {"--comm-timeout", v == "''" ? "the value is empty" : "number of seconds"});
  }
  for (const std::string v : {"0", "x", "-3"}) {
    const auto r = run_command("ZF_COMM_TIMEOUT_S=" + v + " " + dp_five_steps());
    EXPECT_EQ(r.exit_code, 2) << v << "\n" << r.output;
    expect_words(r.output, {"ZF_COMM_TIMEOUT_S", "number of seconds", "'" + v + "'"});
  }
  for (const std::string v : {"1:2:hang", "1:2:", "1:stall"}) {
    const auto r = run_command(dp_five_steps() + " --ranks 2 --inject-fault " + v);
    EXPECT_EQ(r.exit_code, 2) << v << "\n" << r.output;
    expect_words(r.output, {"--inject-fault", "RANK:STEP:stall"});
  }
}

// The backend itself: ranks 0 and 2 all_reduce, rank 1 never does. The one
// that times out first raises CommTimeout naming rank 1 and the collective;
// the other raises it or the CommAborted that carries it.
TEST(CommTimeout, ThreadsBackendNamesTheMissingRank) {
  auto comms = make_thread_communicators(3, 0.3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> ts;
  std::atomic<int> finished{0};
  const auto t0 = std::chrono::steady_clock::now();
  for (int r : {0, 2})
    ts.emplace_back([&, r] {
      std::vector<float> x(10, 1.0f);
      try {
        comms[r]->all_reduce(x.data(), x.size(), DType::f32);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
      finished++;
    });
  // A hang is the bug: abort the test binary rather than wait for ever.
  while (finished.load() < 2) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
      std::fprintf(stderr, "the threads backend's all_reduce hung for 20 s: aborting the test binary\n");
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& t : ts) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(seconds, 0.3);
  EXPECT_LT(seconds, 10.0);
  for (int r : {0, 2})
    expect_words(errors[r], {"all_reduce(count 10, f32, sum)", "collective #0", "timed out after 0.3 s",
                             "rank 1 has not issued it yet", "--comm-timeout"});
}

}  // namespace
}  // namespace zf
