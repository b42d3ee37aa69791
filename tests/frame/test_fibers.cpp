// Tests of the fibers a dry run's ranks run on (common/modeled/fibers.h):
// every body runs to its end, a wait gives the others turns until it can go
// on, a wait that never can returns false, and each fiber keeps its own
// rank and step tags (check.h) across switches.
// Run: build/tests/test_clock --gtest_filter='Fibers.*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "check.h"
#include "fibers.h"

using namespace zf;

// A barrier of n fibers: the order of arrivals and departures shows that
// every fiber reached it before any left it, three times over.
TEST(Fibers, AWaitLetsTheOthersRunUntilItCanGoOn) {
  const int n = 50;
  std::vector<int> arrived(3, 0);
  std::vector<std::string> events;
  EXPECT_FALSE(on_fiber());
  run_fibers(n, [&](int i) {
    EXPECT_TRUE(on_fiber());
    for (int round = 0; round < 3; ++round) {
      ++arrived[size_t(round)];
      events.push_back("a" + std::to_string(round));
      EXPECT_TRUE(wait_on_fiber([&] { return arrived[size_t(round)] == n; })) << i;
      events.push_back("d" + std::to_string(round));
    }
  });
  EXPECT_FALSE(on_fiber());
  ASSERT_EQ(events.size(), size_t(6 * n));
  for (int round = 0; round < 3; ++round) {
    const std::string a = "a" + std::to_string(round), d = "d" + std::to_string(round);
    size_t last_arrival = 0, first_departure = events.size();
    for (size_t k = 0; k < events.size(); ++k) {
      if (events[k] == a) last_arrival = k;
      if (events[k] == d) first_departure = std::min(first_departure, k);
    }
    EXPECT_LT(last_arrival, first_departure) << "round " << round << ": every fiber arrives before any leaves";
  }
}

// Fiber 1 waits for what only fiber 0 could do, and fiber 0 returned
// without doing it: the wait ends, false, and the run returns.
TEST(Fibers, AWaitThatCanNeverEndReturnsFalse) {
  std::vector<int> verdict(3, -1);
  bool done = false;
  run_fibers(3, [&](int i) {
    if (i == 0) return;
    if (i == 1) verdict[1] = wait_on_fiber([&] { return done; });
    if (i == 2) verdict[2] = wait_on_fiber([&] { return done || verdict[1] == 0; });
  });
  EXPECT_EQ(verdict[1], 0) << "nothing could make it ready";
  EXPECT_EQ(verdict[2], 1) << "ready once fiber 1's wait failed";
}

TEST(Fibers, EachKeepsItsOwnRankAndStepTags) {
  const int n = 8;
  set_current_rank(-1);
  int turn = 0;
  std::vector<int> seen_rank(n), seen_step(n);
  run_fibers(n, [&](int i) {
    set_current_rank(i);
    set_current_step(100 + i);
    ++turn;
    wait_on_fiber([&] { return turn == n; });
    seen_rank[size_t(i)] = current_rank();
    seen_step[size_t(i)] = current_step();
  });
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(seen_rank[size_t(i)], i);
    EXPECT_EQ(seen_step[size_t(i)], 100 + i);
  }
  EXPECT_EQ(current_rank(), -1) << "the thread's own tag is back";
}

TEST(Fibers, AnEscapingExceptionIsRethrownOnceAllReturned) {
  int returned = 0;
  EXPECT_THROW(run_fibers(4,
                          [&](int i) {
                            if (i == 1) throw std::runtime_error("fiber 1");
                            ++returned;
                          }),
               std::runtime_error);
  EXPECT_EQ(returned, 3);
  EXPECT_THROW(wait_on_fiber([] { return true; }), Error) << "off the fibers";
}

// What a wait's ready() throws (it runs on the scheduler's stack) comes out
// of that wait, on the fiber, which can then unwind and return.
TEST(Fibers, WhatReadyThrowsComesOutOfTheWait) {
  int turns = 0;
  std::string caught;
  run_fibers(2, [&](int i) {
    if (i == 1) {
      ++turns;
      return;
    }
    try {
      wait_on_fiber([&] {
        if (turns > 0) throw std::runtime_error("ready threw");
        return false;
      });
    } catch (const std::runtime_error& e) {
      caught = e.what();
    }
  });
  EXPECT_EQ(caught, "ready threw");
}

// A fiber that never waits nor returns holds the thread; the watchdog names
// it (the launcher's on_stall ends the process, as here).
TEST(FibersDeathTest, AStuckFiberIsNamedByTheWatchdog) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Without the watchdog the child would spin for ever: the alarm kills it,
  // and the test fails on its signal.
  EXPECT_EXIT((alarm(10), run_fibers(
                  3,
                  [](int i) {
                    if (i != 1) return;
                    volatile bool forever = true;
                    while (forever) {
                    }
                  },
                  0.3,
                  [](int r) {
                    std::fprintf(stderr, "fiber %d is stuck\n", r);
                    std::_Exit(3);
                  })),
              ::testing::ExitedWithCode(3), "fiber 1 is stuck");
}

// Fibers that wait and return in time never wake it.
TEST(Fibers, TheWatchdogLeavesFibersThatWaitAlone) {
  int turn = 0;
  run_fibers(
      4,
      [&](int) {
        ++turn;
        wait_on_fiber([&] { return turn == 4; });
      },
      0.05, [](int) { std::_Exit(4); });
  EXPECT_EQ(turn, 4);
}
