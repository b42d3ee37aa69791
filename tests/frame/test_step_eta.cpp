// test_step_eta.cpp: the step line's time left (frame/report.h's StepEta and
// format_duration): the rate leaves the warm-up step out once later steps
// exist, and durations print the way the step line shows them.
//
//   meson test -C build launch
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "report.h"

namespace zf {
namespace {

TEST(StepEta, FormatsTenthsSecondsMinutesAndHours) {
  EXPECT_EQ(format_duration(0.44), "0.4s");
  EXPECT_EQ(format_duration(9.94), "9.9s");
  EXPECT_EQ(format_duration(-1), "0.0s");
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(7620), "2h07m");
}

TEST(StepEta, FirstStepAloneGivesItsOwnTime) {
  StepEta eta;
  EXPECT_DOUBLE_EQ(eta.after_step(200, 10), 2.0);  // 10 more steps of 200 ms
  EXPECT_DOUBLE_EQ(eta.elapsed_s(), 0.2);
}

// The first step took 10 s (warm-up); the next ones take about 30 ms of wall
// time each, so what is left is priced at tens of milliseconds a step, not
// at the first step's 10 s. The upper bound allows a loaded machine's
// sleeps to run long (up to about 1 s a step) and is still 10 times below a
// rate that counted the first step.
TEST(StepEta, WarmUpStepIsLeftOutOfTheRate) {
  StepEta eta;
  eta.after_step(10000, 6);
  double left = 0;
  for (int remaining = 5; remaining >= 4; --remaining) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    left = eta.after_step(1, remaining);
  }
  EXPECT_GE(left, 4 * 0.030);
  EXPECT_LT(left, 4 * 1.0);
  EXPECT_GE(eta.elapsed_s(), 10.0 + 0.060);  // the first step's 10 s counts in the time taken
}

}  // namespace
}  // namespace zf
