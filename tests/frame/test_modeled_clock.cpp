// The modeled clock (frame/modeled_clock.h) against times computed here by
// hand from a profile with round numbers: one op, one collective on a link
// inside a node and across nodes, overlap (prefetch) against no overlap, a
// late rank, and the same numbers whatever the threads' timing. Then the
// profiles: every shipped one reads, and a wrong one is refused by key.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <nlohmann/json.hpp>
#include <tuple>
#include <sstream>
#include <thread>
#include <vector>

#include "comm_threads.h"
#include "hardware.h"
#include "modeled_clock.h"
#include "test_util.h"

namespace zf {
namespace {

// Round numbers, so that every expected time below is a short sum.
const char* kProfile = R"(# a machine of round numbers
name = Round
gpus_per_node = 4
peak_tflops_bf16 = 100
peak_tflops_f32 = 10
hbm_gb_per_s = 1000
memory_gib = 16
compute_efficiency = 0.5
memory_efficiency = 0.5
launch_us = 2
intra_node_busbw_gb_per_s = 100
intra_node_latency_us = 1
inter_node_busbw_gb_per_s = 10
inter_node_latency_us = 10
pcie_pinned_gb_per_s = 20
pcie_pageable_gb_per_s = 5
pcie_latency_us = 3
host_adamw_params_per_s = 1e9
host_memory_gb_per_s = 50
nvme_gb_per_s = 2
)";

Hardware round_machine() { return parse_hardware(kProfile, "round.hw"); }

// The seconds of a matmul_forward of N x IC x OC in f32 on the round machine:
// 2·N·IC·OC FLOPs at 10 TFLOP/s · 0.5, or its bytes (inputs, weight, output,
// bias, 4 bytes each) at 1000 GB/s · 0.5, whichever is longer, plus 2 µs.
double round_matmul_f32(double N, double IC, double OC) {
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
std::vector<double> run_modeled(const Hardware& hw, int N, const std::function<void(Rank&, int)>& fn,
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
void matmul(Rank& rank, int N, int IC, int OC) {
  std::vector<float> in(size_t(N) * IC, 1.0f), w(size_t(IC) * OC, 0.5f), out(size_t(N) * OC);
  rank.dev->matmul_forward(out.data(), in.data(), w.data(), nullptr, N, IC, OC);
}

TEST(ModeledClock, OneMatmulIsItsRooflineTime) {
  const Hardware hw = round_machine();
  RankClock clock(hw);
  clock.start(0);
  auto dev = make_modeled_device(make_cpu_device(), clock);
  std::vector<float> in(64 * 128, 1.0f), w(128 * 256, 0.5f), out(64 * 256);
  dev->matmul_forward(out.data(), in.data(), w.data(), nullptr, 64, 128, 256);
  StepPhases p;
  // 2·64·128·256 = 4,194,304 FLOPs / 5e12 = 0.839 µs; 230,400 bytes / 500e9 = 0.461 µs: compute-bound.
  EXPECT_DOUBLE_EQ(clock.lap(p), (4194304.0 / 5e12 + 2e-6) * 1e3);
}

TEST(ModeledClock, AnElementwiseOpIsItsBytesTime) {
  const Hardware hw = round_machine();
  RankClock clock(hw);
  clock.start(0);
  auto dev = make_modeled_device(make_cpu_device(), clock);
  const size_t n = 1 << 20;
  std::vector<float> a(n, 1.0f), b(n, 2.0f), out(n);
  dev->residual_forward(out.data(), a.data(), b.data(), n);
  StepPhases p;
  // Two inputs and the output, 4 bytes each, at 500 GB/s; its n additions would take 0.2 µs.
  EXPECT_DOUBLE_EQ(clock.lap(p), (12.0 * n / 500e9 + 2e-6) * 1e3);
  EXPECT_EQ(out[5], 3.0f);
}

TEST(ModeledClock, AllGatherInsideANodeIsTheRingOverNvlink) {
  const Hardware hw = round_machine();
  const int N = 4;
  const size_t send = 1 << 16;  // floats per rank: the full buffer is 4 · 65536 · 4 = 1 MiB
  const double S = double(N) * send * 4;
  const auto ms = run_modeled(hw, N, [&](Rank& rank, int r) {
    std::vector<float> mine(send, float(r)), all(N * send);
    rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32).wait();
    EXPECT_EQ(all[send * 3], 3.0f);  // the collective itself still ran
  });
  // (N-1) steps of 1 µs, and (N-1)/N of the buffer at 100 GB/s.
  const double expected = (3 * 1e-6 + 0.75 * S / 100e9) * 1e3;
  for (double m : ms) EXPECT_DOUBLE_EQ(m, expected);
}

TEST(ModeledClock, PrefetchOverlapsTheGatherWithCompute) {
  const Hardware hw = round_machine();
  const int N = 4;
  const size_t send = 1 << 16;
  const double gather = 3 * 1e-6 + 0.75 * (4.0 * send * 4) / 100e9;
  const double mm = round_matmul_f32(512, 512, 512);
  ASSERT_GT(mm, gather / 2);  // comparable, so that both orders differ
  // Issued before the compute: the step is the longer of the two.
  auto prefetched = run_modeled(hw, N, [&](Rank& rank, int r) {
    std::vector<float> mine(send, float(r)), all(N * send);
    CommHandle h = rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32);
    matmul(rank, 512, 512, 512);
    h.wait();
  });
  // Issued after it: the sum.
  auto serial = run_modeled(hw, N, [&](Rank& rank, int r) {
    std::vector<float> mine(send, float(r)), all(N * send);
    matmul(rank, 512, 512, 512);
    rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32).wait();
  });
  for (int r = 0; r < N; ++r) {
    EXPECT_DOUBLE_EQ(prefetched[r], std::max(gather, mm) * 1e3);
    EXPECT_DOUBLE_EQ(serial[r], (mm + gather) * 1e3);
  }
}

TEST(ModeledClock, ExposedCommIsTheComputeQueuesWait) {
  const Hardware hw = round_machine();
  const size_t send = 1 << 16;
  const double gather = 1e-6 + 0.5 * (2.0 * send * 4) / 100e9;  // N = 2
  const double mm = round_matmul_f32(64, 128, 256);
  ASSERT_LT(mm, gather);
  std::vector<double> exposed(2);
  run_modeled(hw, 2, [&](Rank& rank, int r) {
    std::vector<float> mine(send, 1.0f), all(2 * send);
    CommHandle h = rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32);
    matmul(rank, 64, 128, 256);
    h.wait();
    exposed[size_t(r)] = rank.phase("exposed comm");
  });
  for (double e : exposed) EXPECT_DOUBLE_EQ(e, (gather - mm) * 1e3);
}

TEST(ModeledClock, HybridGroupsInsideANodeUseNvlinkAcrossNodesTheNetwork) {
  const Hardware hw = round_machine();  // 4 GPUs per node: ranks 0-3 and 4-7
  const int N = 8;
  const size_t send = 1 << 14;
  std::vector<double> inside(N), across(N);
  run_modeled(hw, N, [&](Rank& rank, int r) {
    auto shard = rank.comm->split(r / 4, r);   // {0..3}, {4..7}: one node each
    auto replica = rank.comm->split(r % 4, r);  // {0,4}, {1,5}, ...: two nodes
    rank.lap_ms();
    std::vector<float> mine(send, 1.0f), all(4 * send);
    shard->all_gather_async(mine.data(), all.data(), send, DType::f32).wait();
    inside[size_t(r)] = rank.lap_ms();
    replica->all_gather_async(mine.data(), all.data(), send, DType::f32).wait();
    across[size_t(r)] = rank.lap_ms();
  });
  const double in_node = 3 * 1e-6 + 0.75 * (4.0 * send * 4) / 100e9;
  const double between = 1 * 10e-6 + 0.5 * (2.0 * send * 4) / 10e9;  // one GPU per node: one NIC, 10 GB/s
  for (int r = 0; r < N; ++r) {
    EXPECT_DOUBLE_EQ(inside[r], in_node * 1e3) << "rank " << r;
    EXPECT_DOUBLE_EQ(across[r], between * 1e3) << "rank " << r;
  }
}

TEST(ModeledClock, AGroupAcrossNodesUsesTheNicsOfItsGpusInANode) {
  const Hardware hw = round_machine();  // NVLink 100 GB/s, a NIC 10 GB/s, 4 GPUs per node
  const size_t send = 1 << 14;
  // Eight ranks on two nodes, four on each: four NICs a node, 40 GB/s.
  const auto eight = run_modeled(hw, 8, [&](Rank& rank, int) {
    std::vector<float> mine(send, 1.0f), all(8 * send);
    rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32).wait();
  });
  // Of the ring's 7 steps, 6 stay in a node (1 µs) and 1 crosses (10 µs).
  for (double m : eight) EXPECT_DOUBLE_EQ(m, (6 * 1e-6 + 10e-6 + 7.0 / 8 * (8.0 * send * 4) / 40e9) * 1e3);
  // Six ranks: four on the first node, two on the second: the second's two NICs set the pace.
  const auto six = run_modeled(hw, 6, [&](Rank& rank, int) {
    std::vector<float> mine(send, 1.0f), all(6 * send);
    rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32).wait();
  });
  for (double m : six) EXPECT_DOUBLE_EQ(m, (4 * 1e-6 + 10e-6 + 5.0 / 6 * (6.0 * send * 4) / 20e9) * 1e3);
}

TEST(ModeledClock, AllReduceAcrossNodesTakesTheTreeWhenItIsFaster) {
  const Hardware hw = round_machine();
  const int N = 8;  // two nodes
  const size_t n = 16;  // 64 bytes: latency-bound
  const auto ms = run_modeled(hw, N, [&](Rank& rank, int) {
    std::vector<float> x(n, 1.0f);
    rank.comm->all_reduce_async(x.data(), n, DType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(x[0], 8.0f);
  });
  const double moved = 2.0 * 7 / 8 * 64 / 40e9;  // four NICs a node
  // Ring: twice 6 steps in a node and 1 across; tree: up and down 1 level of nodes, 2 in a node.
  const double ring = 2 * (6 * 1e-6 + 10e-6) + moved, tree = 2 * (1 * 10e-6 + 2 * 1e-6) + moved;
  ASSERT_LT(tree, ring);
  for (double m : ms) EXPECT_DOUBLE_EQ(m, tree * 1e3);
}

TEST(ModeledClock, TheLastRankToArriveSetsTheCollectivesStart) {
  const Hardware hw = round_machine();
  const int N = 4;
  const size_t n = 1 << 10;
  // Rank 2 computes a matmul first (a bigger shard, say); the others wait for it.
  const auto ms = run_modeled(hw, N, [&](Rank& rank, int r) {
    if (r == 2) matmul(rank, 256, 256, 256);
    std::vector<float> x(n, 1.0f);
    rank.comm->all_reduce_async(x.data(), n, DType::f32, ReduceOp::sum).wait();
  });
  const double ar = 6 * 1e-6 + 2.0 * 3 / 4 * (n * 4.0) / 100e9;
  for (double m : ms) EXPECT_DOUBLE_EQ(m, (round_matmul_f32(256, 256, 256) + ar) * 1e3);
}

// Holds each collective back a while (a rank-dependent, varying delay) before
// handing it on: the real timing changes, the modeled one must not.
class DelayingCommunicator final : public Communicator {
 public:
  DelayingCommunicator(std::unique_ptr<Communicator> in, int r) : in_(std::move(in)), r_(r) {}
  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  const char* backend() const override { return in_->backend(); }
  CommHandle all_reduce_async(void* b, size_t n, DType dt, ReduceOp op) override {
    nap();
    return in_->all_reduce_async(b, n, dt, op);
  }
  CommHandle reduce_scatter_async(const void* s, void* r, size_t n, DType dt, ReduceOp op) override {
    nap();
    return in_->reduce_scatter_async(s, r, n, dt, op);
  }
  CommHandle all_gather_async(const void* s, void* r, size_t n, DType dt) override {
    nap();
    return in_->all_gather_async(s, r, n, dt);
  }
  CommHandle broadcast_async(void* b, size_t n, DType dt, int root) override {
    nap();
    return in_->broadcast_async(b, n, dt, root);
  }
  void barrier() override {
    nap();
    in_->barrier();
  }
  void abort(const std::string& why) override { in_->abort(why); }

 private:
  void nap() { std::this_thread::sleep_for(std::chrono::milliseconds((r_ * 7 + calls_++ * 3) % 11)); }
  std::unique_ptr<Communicator> in_;
  int r_, calls_ = 0;
};

TEST(ModeledClock, TheSameWhateverTheThreadsTiming) {
  const Hardware hw = round_machine();
  const int N = 4;
  auto schedule = [&](Rank& rank, int r) {
    std::vector<float> mine(4096, float(r)), all(N * 4096), x(256, 1.0f);
    for (int unit = 0; unit < 3; ++unit) {
      CommHandle g = rank.comm->all_gather_async(mine.data(), all.data(), 4096, DType::f32);
      matmul(rank, 128 + 64 * r, 128, 128);  // unequal work per rank
      g.wait();
      CommHandle a = rank.comm->all_reduce_async(x.data(), 256, DType::f32, ReduceOp::sum);
      matmul(rank, 64, 128, 128);
      a.wait();
    }
  };
  const auto plain = run_modeled(hw, N, schedule);
  const auto delayed = run_modeled(hw, N, schedule, [](std::unique_ptr<Communicator> in, int r) {
    return std::unique_ptr<Communicator>(new DelayingCommunicator(std::move(in), r));
  });
  for (int r = 0; r < N; ++r) EXPECT_EQ(plain[r], delayed[r]) << "rank " << r;
}

TEST(ModeledClock, CopiesArePcieTimePinnedOrNot) {
  const Hardware hw = round_machine();
  RankClock clock(hw);
  clock.start(0);
  auto dev = make_modeled_device(make_cpu_device(), clock);
  const size_t bytes = 1 << 20;
  void* d = dev->allocate(bytes);
  std::vector<char> pageable(bytes);
  dev->to_device(d, pageable.data(), bytes);
  StepPhases p;
  EXPECT_DOUBLE_EQ(clock.lap(p), (3e-6 + bytes / 5e9) * 1e3);
  dev->to_host_async(pageable.data(), d, bytes).wait();
  EXPECT_DOUBLE_EQ(clock.lap(p), (3e-6 + bytes / 5e9) * 1e3);
  std::string why;
  void* pinned = dev->allocate_pinned(bytes, &why);
  if (!pinned) {
    dev->release(d);
    GTEST_SKIP() << "the pinned copy needs locked memory, refused here: " << why;
  }
  dev->to_host_async(pinned, d, bytes).wait();
  EXPECT_DOUBLE_EQ(clock.lap(p), (3e-6 + bytes / 20e9) * 1e3);
  dev->release_pinned(pinned, bytes);
  dev->release(d);
}

// A step ends when the ranks meet, whatever a queue still runs: a collective
// not waited for is not in the step, on the world's queue or a split's.
TEST(ModeledClock, ACollectiveNotWaitedForIsNotInTheStep) {
  const Hardware hw = round_machine();
  const size_t send = 1 << 14;
  std::vector<double> world(4), split(4);
  run_modeled(hw, 4, [&](Rank& rank, int r) {
    auto half = rank.comm->split(r / 2, r);
    std::vector<float> mine(send, 1.0f), all(4 * send), two(2 * send);
    CommHandle a = rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32);
    world[size_t(r)] = rank.lap_ms();
    CommHandle b = half->all_gather_async(mine.data(), two.data(), send, DType::f32);
    split[size_t(r)] = rank.lap_ms();
    a.wait();  // each now waits as long as its collective still had to run
    b.wait();
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(world[r], 0.0) << "rank " << r;
    EXPECT_EQ(split[r], 0.0) << "rank " << r;
  }
}

// A dry run has no backend to compare the ranks' collectives: the clock's
// group does, and the run fails with a message naming both.
TEST(ModeledClock, ADryRunRefusesMismatchedCollectives) {
  const Hardware hw = round_machine();
  auto group = make_clock_group(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Rank rank(hw, nullptr, group, r);
      try {
        std::vector<float> x(64 + 16 * r);
        rank.comm->all_reduce_async(x.data(), x.size(), DType::f32, ReduceOp::sum).wait();
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        rank.comm->abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  const std::string both = errors[0] + errors[1];
  EXPECT_NE(both.find("every rank must issue the same collectives"), std::string::npos) << both;
  EXPECT_NE(both.find("256 bytes"), std::string::npos) << both;
  EXPECT_NE(both.find("320 bytes"), std::string::npos) << both;
  EXPECT_FALSE(errors[0].empty() || errors[1].empty()) << "both ranks stop: " << both;
}

TEST(ModeledClock, TheHostsAdamWIsItsRateOnTheHost) {
  const Hardware hw = round_machine();  // 1e9 parameters/s, host memory 50 GB/s
  RankClock clock(hw);
  clock.start(0);
  auto host = clock.on_host(make_cpu_device());
  auto dev = make_modeled_device(make_cpu_device(), clock);
  const size_t n = 1 << 16;
  std::vector<float> p(n, 1.0f), g(n, 0.5f), m(n), v(n);
  host->adamw(p.data(), g.data(), DType::f32, m.data(), v.data(), n, AdamWConfig{}, 1, 1.0f, true);
  StepPhases phases;
  EXPECT_DOUBLE_EQ(clock.lap(phases), n / 1e9 * 1e3);
  EXPECT_NE(p[0], 1.0f);  // it ran
  // The host's norm reads the shard at 50 GB/s; a device op issued after it starts after it.
  SumOfSquares acc;
  host->sum_squares(g.data(), DType::f32, n, acc);
  std::vector<float> out(n);
  dev->residual_forward(out.data(), p.data(), g.data(), n);
  EXPECT_DOUBLE_EQ(clock.lap(phases), (4.0 * n / 50e9 + 12.0 * n / 500e9 + 2e-6) * 1e3);
  // In a run of 8 ranks, 4 to a node, four ranks share a host: a quarter of its rate each.
  RankClock shared(hw, 8);
  shared.start(0);
  auto shared_host = shared.on_host(make_cpu_device());
  shared_host->adamw(p.data(), g.data(), DType::f32, m.data(), v.data(), n, AdamWConfig{}, 2, 1.0f, true);
  EXPECT_DOUBLE_EQ(shared.lap(phases), n / (1e9 / 4) * 1e3);
}

// ---- the profiles

TEST(Hardware, EveryShippedProfileReads) {
  const std::vector<std::string> names = hardware_names();
  for (const char* must : {"a100-sxm", "h100-sxm", "h200", "l40s"})
    EXPECT_NE(std::find(names.begin(), names.end(), must), names.end()) << must;
  for (const std::string& n : names) {
    const Hardware hw = load_hardware(n);
    EXPECT_FALSE(hw.name.empty()) << n;
    EXPECT_GT(hw.gpus_per_node, 0) << n;
  }
}

// The text of kProfile with `key`'s line replaced by `line` ("" drops it).
std::string with_line(const std::string& key, const std::string& line) {
  std::string out, l;
  std::istringstream in(kProfile);
  while (std::getline(in, l)) out += (l.rfind(key + " =", 0) == 0 ? line : l) + "\n";
  return out;
}

std::string error_of(const std::string& text) {
  try {
    parse_hardware(text, "x.hw");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(Hardware, AWrongProfileIsRefusedNamingTheKey) {
  EXPECT_NE(error_of(with_line("hbm_gb_per_s", "")).find("missing key hbm_gb_per_s"), std::string::npos);
  EXPECT_NE(error_of(with_line("launch_us", "launch_us = fast")).find("'launch_us' must be a positive number"),
            std::string::npos);
  EXPECT_NE(error_of(with_line("launch_us", "launch_us = -1")).find("launch_us"), std::string::npos);
  EXPECT_NE(error_of(with_line("memory_efficiency", "memory_efficiency = 1.5")).find("at most 1"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kProfile) + "nvlink_speed = 3\n").find("unknown key 'nvlink_speed'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kProfile) + "launch_us = 3\n").find("'launch_us' is given twice"),
            std::string::npos);
  EXPECT_NE(error_of(with_line("gpus_per_node", "gpus_per_node = 2.5")).find("whole number"), std::string::npos);
  EXPECT_NE(error_of(with_line("name", "name stuff")).find("x.hw:2: expected `key = value`"), std::string::npos);
  EXPECT_EQ(error_of(kProfile), "");
}

TEST(Hardware, AnUnknownNameListsTheProfiles) {
  try {
    load_hardware("h900");
    FAIL() << "h900 was accepted";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--hardware h900"), std::string::npos) << what;
    EXPECT_NE(what.find("h100-sxm"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace zf

// ---- whole runs (stage 04, and every stage at once)
#include "cli.h"
#include "data_parallel.h"
#include "fsdp.h"
#include "offload.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

TrainConfig modeled(const std::string& model, int N, const std::string& hw) {
  TrainConfig cfg = test::quiet_config(model, N, 2, 3);
  cfg.clock = "modeled";
  cfg.hardware = hw;
  return cfg;
}

TEST(ModeledRun, SameBitsAsTheWallClockAndTheSameTimesEveryRun) {
  TrainConfig cfg = modeled("tiny", 4, "h100-sxm");
  const RunResult a = run_training(cfg, train_fsdp), b = run_training(cfg, train_fsdp);
  cfg.clock = "wall";
  const RunResult wall = run_training(cfg, train_fsdp);
  EXPECT_EQ(a.ranks[0].param_hash, wall.ranks[0].param_hash);
  EXPECT_EQ(a.ranks[0].losses, wall.ranks[0].losses);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(a.ranks[r].step_ms, b.ranks[r].step_ms) << "rank " << r;
    EXPECT_EQ(a.ranks[r].step_ms, a.ranks[0].step_ms) << "rank " << r;  // the step ends together
  }
  // Modeled: a step of tiny on H100s is well under a millisecond; the wall's here is not.
  EXPECT_LT(a.ranks[0].step_ms[1], 1.0);
  EXPECT_GT(a.ranks[0].step_ms[1], 0.0);
}

TEST(ModeledRun, PrefetchHidesTheGathersWhereTheLinkIsSlow) {
  TrainConfig cfg = modeled("small", 4, "l40s");
  cfg.fsdp.prefetch = 0;
  const double none = run_training(cfg, train_fsdp).ranks[0].step_ms[1];
  cfg.fsdp.prefetch = 1;
  const double one = run_training(cfg, train_fsdp).ranks[0].step_ms[1];
  EXPECT_LT(one, none);
}

TEST(ModeledRun, OffloadPaysForPcieAndTheHostsOptimizer) {
  TrainConfig cfg = modeled("gpt2", 8, "h100-sxm");
  cfg.dry_run = true;
  cfg.precision = Precision::bf16;
  const double fsdp = run_training(cfg, train_fsdp).ranks[0].step_ms[1];
  const double offload = run_training(cfg, train_offload).ranks[0].step_ms[1];
  EXPECT_GT(offload, fsdp);
  // At least each rank's CPU AdamW: its shard (P/8, padded up) at an eighth
  // of the host's 2e9 parameters/s (hardware/h100-sxm.hw: 8 ranks a host).
  const double shard = double(build_layout(cfg.model).numel) / 8;
  EXPECT_GT(offload - fsdp, shard / (2e9 / 8) * 1e3 * 0.9);
}

TEST(ModeledRun, ZeroThreeCostsMoreThanDataParallelOverPcieThanOverNvlink) {
  // ZeRO-3 sends 1.5x data parallel's bytes: over a slow link that shows in
  // the step; over NVLink much less of it does.
  auto ratio = [](const std::string& hw) {
    const TrainConfig cfg = modeled("small", 8, hw);
    return run_training(cfg, train_zero3).ranks[0].step_ms[1] /
           run_training(cfg, train_data_parallel).ranks[0].step_ms[1];
  };
  EXPECT_GT(ratio("l40s"), ratio("h100-sxm"));
}

// A dry run is the real run without its arithmetic: the same modeled times
// and the same memory peaks, rank by rank, in every stage; at N = 3 the
// shards of tiny are unequal (padding), and the step still ends together.
TEST(ModeledRun, ADryRunGivesTheRealRunsTimesAndMemory) {
  const std::vector<std::tuple<const char*, StageFn, bool>> stages = {
      {"dp", train_data_parallel, false}, {"zero1", train_zero1, false}, {"zero2", train_zero2, false},
      {"zero3", train_zero3, false},      {"fsdp", train_fsdp, false},    {"offload", train_offload, false},
      {"offload --offload-params", train_offload, true}};
  for (const auto& [name, fn, offload_params] : stages)
    for (int N : {2, 3, 4}) {
      TrainConfig cfg = modeled("tiny", N, "a100-sxm");
      cfg.precision = Precision::bf16;
      cfg.steps = 2;
      cfg.offload.offload_params = offload_params;
      const RunResult real = run_training(cfg, fn);
      cfg.dry_run = true;
      const RunResult dry = run_training(cfg, fn);
      for (int r = 0; r < N; ++r) {
        SCOPED_TRACE(std::string(name) + " N=" + std::to_string(N) + " rank " + std::to_string(r));
        EXPECT_EQ(dry.ranks[r].step_ms, real.ranks[r].step_ms);
        EXPECT_EQ(real.ranks[r].step_ms, real.ranks[0].step_ms);
        EXPECT_EQ(dry.ranks[r].memory.peak, real.ranks[r].memory.peak);
        EXPECT_EQ(dry.ranks[r].memory.peak_total, real.ranks[r].memory.peak_total);
        EXPECT_EQ(dry.ranks[r].comm.bytes, real.ranks[r].comm.bytes);
      }
    }
}

// --trace under the modeled clock draws the modeled timelines: each step's
// spans fill its modeled time exactly, and a save between steps is no step's.
TEST(ModeledRun, TheTraceIsTheModeledTimeline) {
  TrainConfig cfg = modeled("tiny", 2, "h100-sxm");
  cfg.steps = 3;
  const std::string dir = test::temp_dir();
  cfg.trace = dir + "/t.json";
  cfg.save = dir + "/ck.st";  // a save between steps: its spans are no step's
  cfg.save_every = 1;
  const RunResult run = run_training(cfg, train_offload);
  std::ifstream f(cfg.trace);
  const nlohmann::json doc = nlohmann::json::parse(f);
  EXPECT_EQ(doc["otherData"]["clock"].get<std::string>().rfind("modeled, not measured", 0), 0u);
  std::vector<double> last_end(3, 0.0), first_start(3, 1e300);
  std::set<std::string> tracks;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] != "X") continue;
    const int step = e["args"]["step"];
    ASSERT_GE(step, -1);
    ASSERT_LT(step, 3);
    if (step < 0) continue;
    last_end[size_t(step)] = std::max(last_end[size_t(step)], e["ts"].get<double>() + e["dur"].get<double>());
    first_start[size_t(step)] = std::min(first_start[size_t(step)], e["ts"].get<double>());
  }
  EXPECT_TRUE(tracks.count("compute") && tracks.count("comm") && tracks.count("copy") && tracks.count("host"))
      << tracks.size();
  for (int s = 0; s < 3; ++s) {
    // A step's spans run from its start (its first op) to its end (the last rank's last work).
    EXPECT_NEAR((last_end[size_t(s)] - first_start[size_t(s)]) / 1e3, run.ranks[0].step_ms[size_t(s)], 1e-6)
        << "step " << s;
    if (s > 0) EXPECT_GE(first_start[size_t(s)], last_end[size_t(s - 1)]) << "step " << s << " after the last";
  }
}

// Shards that do not divide evenly (tiny over 3 ranks is padded) give the
// ranks unequal optimizer work: each rank's own work ends at another time,
// and the step ends with the slowest, on every rank.
TEST(ModeledRun, TheSlowestRankSetsTheStep) {
  TrainConfig cfg = modeled("tiny", 3, "h100-sxm");
  cfg.steps = 2;
  cfg.trace = test::temp_dir() + "/t.json";
  const RunResult run = run_training(cfg, train_zero3);
  std::ifstream f(cfg.trace);
  const nlohmann::json doc = nlohmann::json::parse(f);
  std::vector<double> work_end(3, 0.0);  // where each rank's own work of step 1 ends, in ms
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "X" && e["args"]["step"] == 1 && e["cat"] != "comm") {
      double& end = work_end[e["pid"].get<size_t>()];
      end = std::max(end, (e["ts"].get<double>() + e["dur"].get<double>()) / 1e3);
    }
  const double step_end = run.ranks[0].step_ms[0] + run.ranks[0].step_ms[1];
  const double slowest = *std::max_element(work_end.begin(), work_end.end());
  const double fastest = *std::min_element(work_end.begin(), work_end.end());
  EXPECT_LT(fastest, slowest) << "the shards are unequal, so is the work";
  EXPECT_NEAR(slowest, step_end, 1e-6) << "the step ends with the slowest rank's work";
  for (int r = 0; r < 3; ++r) EXPECT_EQ(run.ranks[r].step_ms, run.ranks[0].step_ms) << "rank " << r;
}

// parse_flags on `args` after the program name; "" when accepted, else the error.
std::string flags_error(std::vector<std::string> args, StageFlags flags = StageFlags::fsdp) {
  args.insert(args.begin(), "fsdp");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  try {
    parse_flags(int(argv.size()), argv.data(), StageInfo{"fsdp", "stage 04: FSDP", flags});
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(ModeledRun, FlagsItRefusesSayWhy) {
  EXPECT_EQ(flags_error({"--clock", "modeled"}), "");
  EXPECT_EQ(flags_error({"--clock", "modeled", "--hardware", "a100-sxm"}), "");
  EXPECT_NE(flags_error({"--clock", "fast"}).find("--clock must be wall or modeled"), std::string::npos);
  EXPECT_NE(flags_error({"--hardware", "h200"}).find("add --clock modeled"), std::string::npos);
  EXPECT_EQ(flags_error({"--clock", "modeled", "--trace", "t.json"}), "");
  EXPECT_EQ(flags_error({"--clock", "modeled"}, StageFlags::offload), "");
  EXPECT_NE(flags_error({"--clock", "modeled", "--delay-update"}, StageFlags::offload).find("--delay-update"),
            std::string::npos);
  EXPECT_NE(flags_error({"--clock", "modeled", "--offload-dir", "d"}, StageFlags::offload).find("--offload-dir"),
            std::string::npos);
  EXPECT_NE(flags_error({"--dry-run"}).find("add --clock modeled"), std::string::npos);
  EXPECT_EQ(flags_error({"--clock", "modeled", "--dry-run", "--ranks", "4096", "--model", "gpt-70b"}), "");
  EXPECT_NE(flags_error({"--clock", "modeled", "--dry-run", "--ranks", "4097"}).find("4096"), std::string::npos);
  EXPECT_NE(flags_error({"--clock", "modeled", "--dry-run", "--save", "x.bin"}).find("--save"), std::string::npos);
}

}  // namespace
}  // namespace zf
