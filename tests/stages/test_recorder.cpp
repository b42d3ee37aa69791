// test_recorder.cpp: the schedule recorder itself (common/comm/comm_recording.h,
// read through tests/stages/schedule_util.h), on bare communicators, with no
// stage: every wait is logged, a blocking collective too, the counters are
// the backend's, and a collective held back by the delay cannot be waited
// for sooner; every event's time counts from the origin and follows the
// log, with the device bytes of each category. Each stage's Schedule tests
// (test_dp.cpp, test_zero1.cpp, ...) rely on it, and each checks that it
// changes none of its stage's results (the Recorder tests there).
//
//   meson test -C build recorder
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "comm_recording.h"
#include "comm_threads.h"
#include "stages/schedule_util.h"

namespace zf {
namespace {

using Ev = ScheduleEvent;

TEST(ScheduleRecorder, LogsEveryWaitAndHoldsCompletionBack) {
  constexpr auto kDelay = std::chrono::milliseconds(20);
  auto comms = make_thread_communicators(2);
  std::vector<std::vector<Ev>> logs(2);
  std::vector<double> waited_ms(2);
  std::vector<CommStats> inner(2), outer(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      RecordOptions opt;
      opt.delay = kDelay;
      RecordingCommunicator rec(*comms[r], opt);
      EXPECT_EQ(find_recorder(rec), &rec);
      EXPECT_EQ(find_recorder(*comms[r]), nullptr);
      float x[4] = {1, 2, 3, float(r)};
      const auto t0 = std::chrono::steady_clock::now();
      CommHandle h = rec.all_reduce_async(x, 4, DType::f32, ReduceOp::sum);
      rec.compute(Ev::backward_begin, 7);
      h.wait();
      waited_ms[r] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      h.wait();  // a second wait is logged too
      EXPECT_EQ(x[3], 1.0f);
      rec.all_reduce(x, 1, DType::f32);  // blocking form
      logs[r] = rec.events();
      inner[r] = comms[r]->stats();
      outer[r] = rec.stats();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(waited_ms[r], 20.0);
    EXPECT_EQ(inner[r].bytes, outer[r].bytes);
    EXPECT_EQ(inner[r].calls, outer[r].calls);
    test::RankSchedule s(logs[r]);
    ASSERT_EQ(s.collectives().size(), 2u);
    const test::Collective& a = s.collectives()[0];
    EXPECT_TRUE(a.is(CollectiveKind::all_reduce, DType::f32, 4));
    EXPECT_EQ(a.issued, 0u);
    EXPECT_EQ(s.events()[1].kind, Ev::backward_begin);
    EXPECT_EQ(s.events()[1].unit, 7);
    ASSERT_EQ(a.waits.size(), 2u);
    EXPECT_GT(a.waits[0], 1u);  // after the compute event: logged when wait() is called
    // The first wait returned once the collective was done: the second comes after.
    EXPECT_GT(a.completed, a.issued);
    EXPECT_LT(a.completed, a.waits[1]);
    const test::Collective& b = s.collectives()[1];
    EXPECT_TRUE(b.is(CollectiveKind::all_reduce, DType::f32, 1));
    ASSERT_EQ(b.waits.size(), 1u);  // the blocking form waits on the host, once
    EXPECT_GT(b.first_wait(), b.issued);
    EXPECT_GT(b.completed, a.waits[1]);
  }
}

TEST(ScheduleRecorder, TimesFollowTheLogFromTheOriginAndMemoryIsSampled) {
  // An origin 1 s back: every time is at least 1e6 us, and the 20 ms held
  // back by the delay lie between the issue and the completion.
  constexpr auto kDelay = std::chrono::milliseconds(20);
  auto comms = make_thread_communicators(1);
  MemoryTracker mem;
  RecordOptions opt;
  opt.delay = kDelay;
  opt.mem = &mem;
  opt.origin = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  RecordingCommunicator rec(*comms[0], opt);
  void* p = mem.allocate(Place::device, Category::grads, 4096);
  float x = 1;
  rec.all_reduce(&x, 1, DType::f32);
  mem.release(Place::device, Category::grads, p, 4096);
  rec.step_ended(3);
  const std::vector<Ev> log = rec.events();
  ASSERT_EQ(log.size(), 4u);  // issued, waited, completed, step_end
  EXPECT_GE(log[0].t_us, 1e6);
  for (size_t i = 1; i < log.size(); ++i) EXPECT_GE(log[i].t_us, log[i - 1].t_us) << describe(log[i]);
  EXPECT_GE(log[2].t_us - log[0].t_us, 20e3);
  EXPECT_EQ(log[0].device_bytes[int(Category::grads)], 4096u);
  EXPECT_EQ(log[3].device_bytes[int(Category::grads)], 0u);
  EXPECT_EQ(log[3].kind, Ev::step_end);
  EXPECT_EQ(log[3].step, 3);
  EXPECT_EQ(log[0].queue, 0);
}

}  // namespace
}  // namespace zf
