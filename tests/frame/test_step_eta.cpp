// test_step_eta.cpp: what report/report.h prints: the step line's time left
// (StepEta and format_duration: the rate leaves the warm-up step out once
// later steps exist, durations print the way the step line shows them) and
// the closing tables, consecutive ranks that read the same on one line.
//
//   meson test -C build launch
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
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

// The closing tables of ranks A, A, B, A, A: rows 0-1, 2, 3-4.
TEST(ClosingTables, RanksThatReadTheSameShareALine) {
  RunResult run;
  run.params = 1000;
  run.ranks.resize(5);
  for (size_t r = 0; r < 5; ++r) {
    RankResult& rank = run.ranks[r];
    rank.losses = {1.0f, 1.0f};
    const size_t grads = r == 2 ? 4096 : 2048;
    rank.memory.current[int(Place::device)][int(Category::grads)] = grads;
    rank.memory.peak[int(Place::device)][int(Category::grads)] = grads;
    rank.memory.peak_total[int(Place::device)] = grads;
    rank.comm.add(CollectiveKind::all_gather, r == 2 ? 200.0 : 100.0);
    rank.transfers.to_device_bytes = r == 2 ? 10 : 20;
    rank.transfers.to_device_copies = 2;
  }
  char* text = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&text, &size);
  ASSERT_NE(out, nullptr);
  print_memory_table(run, out);
  print_comm_table(run, out);
  std::fclose(out);
  const std::string printed(text, size);
  std::free(text);
  auto lines_starting = [&](const std::string& head) {
    int n = 0;
    for (size_t at = 0; (at = printed.find("\n" + head, at)) != std::string::npos; ++at) ++n;
    return n;
  };
  EXPECT_EQ(lines_starting("0-1      "), 2) << printed;  // the memory row, the comm row
  EXPECT_EQ(lines_starting("2        "), 2) << printed;
  EXPECT_EQ(lines_starting("3-4      "), 2) << printed;
  EXPECT_EQ(lines_starting("rank 0-1: host->device 10 B"), 1) << printed;  // 20 bytes over 2 steps
  EXPECT_EQ(lines_starting("rank 2: host->device 5 B"), 1) << printed;
  EXPECT_EQ(lines_starting("rank 3-4: host->device 10 B"), 1) << printed;
  EXPECT_EQ(printed.find("\n0 "), std::string::npos) << printed;
}

}  // namespace
}  // namespace zf
