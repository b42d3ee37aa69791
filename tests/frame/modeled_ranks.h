// modeled_ranks.h: modeled ranks by hand for the clock suite's tests
// (test_modeled_clock.cpp, test_modeled_comm.cpp): the round machine, a
// rank's clock, device and communicator, N of them as threads, and a matmul
// with its time by hand.
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm_threads.h"
#include "hardware.h"
#include "modeled_clock.h"
#include "round_profile.h"

namespace zf::test {

inline Hardware round_machine() { return parse_hardware(test::kRoundProfile, "round.hw"); }

// The seconds of a matmul_forward of N x IC x OC in f32 on the round machine:
// 2·N·IC·OC FLOPs at 10 TFLOP/s · 0.5, or its bytes (inputs, weight, output,
// bias, 4 bytes each) at 1000 GB/s · 0.5, whichever is longer, plus 2 µs.
inline double round_matmul_f32(double N, double IC, double OC) {
  const double math = 2 * N * IC * OC / 5e12;
  const double memory = (N * IC + IC * OC + N * OC + OC) * 4 / 500e9;
  return std::max(math, memory) + 2e-6;
}

// One rank of a modeled run by hand: its clock, device and communicator.
struct Rank {
  RankClock clock;
  std::unique_ptr<Device> dev;
  std::unique_ptr<Communicator> comm;
  Rank(const Hardware& hw, std::unique_ptr<Communicator> inner, std::shared_ptr<ClockGroup> group, int r)
      : clock(hw), dev(make_modeled_device(make_cpu_device(), clock)),
        comm(make_modeled_communicator(std::move(inner), std::move(group), r, clock)) {
    clock.start(0);
  }
  double lap_ms() {
    StepPhases p;
    return clock.lap(p);
  }
  double phase(const char* name) {
    StepPhases p;
    clock.lap(p);
    for (const auto& [n, t] : p)
      if (n == name) return t;
    return -1;
  }
};

// Runs fn(rank, r) on N modeled ranks as threads; returns each rank's lap in ms.
inline std::vector<double> run_modeled(const Hardware& hw, int N, const std::function<void(Rank&, int)>& fn,
                                std::function<std::unique_ptr<Communicator>(std::unique_ptr<Communicator>, int)>
                                    wrap = nullptr) {
  auto comms = make_thread_communicators(N);
  auto group = make_clock_group(N);
  std::vector<double> ms(static_cast<size_t>(N), 0.0);
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> inner = std::move(comms[size_t(r)]);
      if (wrap) inner = wrap(std::move(inner), r);
      Rank rank(hw, std::move(inner), group, r);
      fn(rank, r);
      ms[size_t(r)] = rank.lap_ms();
    });
  for (auto& t : threads) t.join();
  return ms;
}

// A matmul on the rank's device (buffers of its own).
inline void matmul(Rank& rank, int N, int IC, int OC) {
  std::vector<float> in(size_t(N) * IC, 1.0f), w(size_t(IC) * OC, 0.5f), out(size_t(N) * OC);
  rank.dev->matmul_forward(out.data(), in.data(), w.data(), nullptr, N, IC, OC);
}

}  // namespace zf::test
