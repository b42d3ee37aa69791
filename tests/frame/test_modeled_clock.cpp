// The modeled clock (modeled/modeled_clock.h) against times computed here by
// hand from a profile with round numbers: one op, one collective on a link
// inside a node and across nodes, overlap (prefetch) against no overlap, a
// late rank, and the same numbers whatever the threads' timing. The
// profiles: test_hardware.cpp. Whole runs on the clock: test_modeled_run.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>
#include <sstream>
#include <thread>
#include <vector>

#include "comm_threads.h"
#include "fibers.h"
#include "hardware.h"
#include "modeled_clock.h"
#include "round_profile.h"
#include "test_util.h"

namespace zf {
namespace {

Hardware round_machine() { return parse_hardware(test::kRoundProfile, "round.hw"); }

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

// What the run says it models: the GPUs, and the nodes when more than one.
TEST(ModeledClock, TheClockSaysWhatItModels) {
  const Hardware hw = round_machine();  // "Round", 4 GPUs per node
  EXPECT_EQ(modeled_clock_description(hw, 1), "modeled on Round x1");
  EXPECT_EQ(modeled_clock_description(hw, 4), "modeled on Round x4");
  EXPECT_EQ(modeled_clock_description(hw, 16), "modeled on Round x16, 4 nodes of 4");
  EXPECT_EQ(modeled_clock_description(hw, 6), "modeled on Round x6, 2 nodes of 4, 2 on the last");
}

// Each communicator is a queue of its own: the step's phases give each
// queue's busy time ("comm qK", K as the trace's tracks: 0 the world's),
// "comm" their sum, and two queues' collectives run at once.
TEST(ModeledClock, EachQueuesBusyTimeIsItsOwn) {
  const Hardware hw = round_machine();  // 4 GPUs per node: ranks 0-3 and 4-7
  const int N = 8;
  const size_t send = 1 << 14;
  std::vector<StepPhases> phases(N);
  std::vector<double> ms(N);
  run_modeled(hw, N, [&](Rank& rank, int r) {
    auto shard = rank.comm->split(r / 4, r);    // queue 1: one node
    auto replica = rank.comm->split(r % 4, r);  // queue 2: across the two
    rank.lap_ms();
    std::vector<float> mine(send, 1.0f), all(4 * send), all2(2 * send);
    CommHandle a = shard->all_gather_async(mine.data(), all.data(), send, DType::f32);
    CommHandle b = replica->all_gather_async(mine.data(), all2.data(), send, DType::f32);
    a.wait();
    b.wait();
    ms[size_t(r)] = rank.clock.lap(phases[size_t(r)]);
  });
  const double in_node = 3 * 1e-6 + 0.75 * (4.0 * send * 4) / 100e9;
  const double between = 1 * 10e-6 + 0.5 * (2.0 * send * 4) / 10e9;
  for (int r = 0; r < N; ++r) {
    std::map<std::string, double> p(phases[size_t(r)].begin(), phases[size_t(r)].end());
    EXPECT_EQ(p.count("comm q0"), 0u) << "the world's queue ran nothing in the step";
    EXPECT_DOUBLE_EQ(p["comm q1"], in_node * 1e3) << "rank " << r;
    EXPECT_DOUBLE_EQ(p["comm q2"], between * 1e3) << "rank " << r;
    EXPECT_DOUBLE_EQ(p["comm"], (in_node + between) * 1e3) << "rank " << r;
    EXPECT_DOUBLE_EQ(ms[size_t(r)], std::max(in_node, between) * 1e3) << "rank " << r;  // at once
  }
  // One communicator: "comm" alone.
  StepPhases one;
  run_modeled(hw, 2, [&](Rank& rank, int r) {
    std::vector<float> mine(send, 1.0f), all(2 * send);
    rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32).wait();
    StepPhases p;
    rank.clock.lap(p);
    if (r == 0) one = p;
  });
  for (const auto& [name, t] : one) EXPECT_EQ(name.rfind("comm q", 0), std::string::npos) << name;
  // One second queue (FSDP's reduce-scatters beside its all-gathers): each queue's own.
  std::map<std::string, double> two;
  run_modeled(hw, 2, [&](Rank& rank, int r) {
    auto second = rank.comm->split(0, r);
    std::vector<float> mine(send, 1.0f), all(2 * send), all2(2 * send);
    rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32).wait();
    second->all_gather_async(mine.data(), all2.data(), send, DType::f32).wait();
    StepPhases p;
    rank.clock.lap(p);
    if (r == 0) two = std::map<std::string, double>(p.begin(), p.end());
  });
  const double gather = 1e-6 + 0.5 * (2.0 * send * 4) / 100e9;  // in a node: one step of the ring
  EXPECT_DOUBLE_EQ(two["comm q0"], gather * 1e3);
  EXPECT_DOUBLE_EQ(two["comm q1"], gather * 1e3);
  EXPECT_DOUBLE_EQ(two["comm"], 2 * gather * 1e3);
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
  // NICs faster than NVLink (four of 40 GB/s a node): the ring still runs
  // through NVLink inside each node, at most its 100 GB/s.
  Hardware fast_nics = hw;
  fast_nics.inter_node_busbw_gb_per_s = 40;
  const auto capped = run_modeled(fast_nics, 8, [&](Rank& rank, int) {
    std::vector<float> mine(send, 1.0f), all(8 * send);
    rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32).wait();
  });
  for (double m : capped) EXPECT_DOUBLE_EQ(m, (6 * 1e-6 + 10e-6 + 7.0 / 8 * (8.0 * send * 4) / 100e9) * 1e3);
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
  // Ring: twice 6 steps in a node and 1 across; tree (NCCL's): up and down 1 level of nodes,
  // and a chain of a node's 4 GPUs, 3 hops.
  const double ring = 2 * (6 * 1e-6 + 10e-6) + moved, tree = 2 * (1 * 10e-6 + 3 * 1e-6) + moved;
  ASSERT_LT(tree, ring);
  for (double m : ms) EXPECT_DOUBLE_EQ(m, tree * 1e3);
  // Three nodes: NCCL's model counts floor(log2 3) = 1 level of nodes.
  const auto three = run_modeled(hw, 12, [&](Rank& rank, int) {
    std::vector<float> x(n, 1.0f);
    rank.comm->all_reduce_async(x.data(), n, DType::f32, ReduceOp::sum).wait();
  });
  const double moved12 = 2.0 * 11 / 12 * 64 / 40e9;
  const double ring12 = 2 * (9 * 1e-6 + 2 * 10e-6) + moved12, tree12 = 2 * (1 * 10e-6 + 3 * 1e-6) + moved12;
  ASSERT_LT(tree12, ring12);
  for (double m : three) EXPECT_DOUBLE_EQ(m, tree12 * 1e3);
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
  // The rate is the host buffer's, whichever way the copy goes: the source
  // of a copy to the device, the destination of one to the host.
  const double at_pinned_rate = (3e-6 + bytes / 20e9) * 1e3;
  dev->to_host_async(pinned, d, bytes).wait();
  EXPECT_DOUBLE_EQ(clock.lap(p), at_pinned_rate) << "to_host_async";
  dev->to_device_async(d, pinned, bytes).wait();
  EXPECT_DOUBLE_EQ(clock.lap(p), at_pinned_rate) << "to_device_async";
  dev->to_host(pinned, d, bytes);
  EXPECT_DOUBLE_EQ(clock.lap(p), at_pinned_rate) << "to_host";
  dev->to_device(d, pinned, bytes);
  EXPECT_DOUBLE_EQ(clock.lap(p), at_pinned_rate) << "to_device";
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

// Runs fn(rank, r) on N ranks of a dry run (fibers, no backend); each
// rank's error, aborting the others, or "".
std::vector<std::string> dry_run_errors(int N, const std::function<void(Rank&, int)>& fn) {
  const Hardware hw = round_machine();
  auto group = make_clock_group(N);
  std::vector<std::string> errors(static_cast<size_t>(N));
  run_fibers(N, [&](int r) {
    Rank rank(hw, nullptr, group, r);
    try {
      fn(rank, r);
    } catch (const std::exception& e) {
      errors[size_t(r)] = e.what();
      rank.comm->abort(e.what());
    }
  });
  return errors;
}

// A dry run has no backend to compare the ranks' collectives: the clock's
// group does, and the run fails with a message naming both.
TEST(ModeledClock, ADryRunRefusesMismatchedCollectives) {
  const auto errors = dry_run_errors(2, [](Rank& rank, int r) {
    std::vector<float> x(64 + 16 * r);
    rank.comm->all_reduce_async(x.data(), x.size(), DType::f32, ReduceOp::sum).wait();
  });
  const std::string both = errors[0] + errors[1];
  EXPECT_NE(both.find("every rank must issue the same collectives"), std::string::npos) << both;
  EXPECT_NE(both.find("256 bytes"), std::string::npos) << both;
  EXPECT_NE(both.find("320 bytes"), std::string::npos) << both;
  EXPECT_FALSE(errors[0].empty() || errors[1].empty()) << "both ranks stop: " << both;
}

// A dry run's rank that stops issuing collectives (it returned) leaves the
// others' waits with no end: they fail at once, saying so, and never hang.
TEST(ModeledClock, ADryRunsWaitThatCanNeverEndFails) {
  const auto errors = dry_run_errors(3, [](Rank& rank, int r) {
    std::vector<float> x(64);
    for (int k = 0; k < (r == 2 ? 1 : 2); ++k)
      rank.comm->all_reduce_async(x.data(), x.size(), DType::f32, ReduceOp::sum).wait();
  });
  EXPECT_TRUE(errors[2].empty()) << errors[2];
  EXPECT_NE(errors[0].find("collective #1 can never complete"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 2 never issued collective #1"), std::string::npos) << errors[0];
  EXPECT_FALSE(errors[1].empty()) << "the other waiting rank stops too";
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
  // A landed bf16 piece added into a float32 shard: 4 + 2 bytes read, 4 written, at 50 GB/s.
  std::vector<bf16> piece(n);
  host->accumulate(g.data(), piece.data(), n);
  EXPECT_DOUBLE_EQ(clock.lap(phases), 10.0 * n / 50e9 * 1e3);
  // In a run of 8 ranks, 4 to a node, four ranks share a host: a quarter of its rate each.
  RankClock shared(hw, 8);
  shared.start(0);
  auto shared_host = shared.on_host(make_cpu_device());
  shared_host->adamw(p.data(), g.data(), DType::f32, m.data(), v.data(), n, AdamWConfig{}, 2, 1.0f, true);
  EXPECT_DOUBLE_EQ(shared.lap(phases), n / (1e9 / 4) * 1e3);
}

// A forked work (stage 05's delayed update) runs on a timeline of its own
// from where the host is at the fork: the device's op issued meanwhile
// overlaps it, and the host waits for it at the join. Unforked, the op
// waits for the host's work: the step is the sum.
TEST(ModeledClock, AForkedWorkOverlapsTheDeviceUntilTheJoin) {
  const Hardware hw = round_machine();  // 1e9 parameters/s, host memory 50 GB/s, HBM 1000 GB/s at 0.5
  const size_t n = 1 << 16;
  std::vector<float> p(n, 1.0f), g(n, 0.5f), mom(n), v(n);
  const double norm = 4.0 * n / 50e9, adamw = n / 1e9;
  // An op longer than the update, and one shorter.
  for (const size_t m : {size_t(1) << 22, size_t(1) << 16})
    for (bool forked : {true, false}) {
      SCOPED_TRACE(std::string(forked ? "forked" : "on the host's thread") + ", op of " + std::to_string(m));
      std::vector<float> a(m, 1.0f), b(m, 2.0f), out(m);
      const double op = 12.0 * double(m) / 500e9 + 2e-6;
      RankClock clock(hw);
      clock.start(0);
      auto host = clock.on_host(make_cpu_device());
      auto dev = make_modeled_device(make_cpu_device(), clock);
      SumOfSquares acc;
      host->sum_squares(g.data(), DType::f32, n, acc);  // the host is at `norm`
      auto update = [&] {
        host->adamw(p.data(), g.data(), DType::f32, mom.data(), v.data(), n, AdamWConfig{}, 1, 1.0f, true);
      };
      if (forked) {  // the device's op issued while the worker runs
        std::thread worker(clock.fork(update));
        dev->residual_forward(out.data(), a.data(), b.data(), m);
        worker.join();
      } else {
        update();
        dev->residual_forward(out.data(), a.data(), b.data(), m);
      }
      clock.join();
      StepPhases phases;
      EXPECT_DOUBLE_EQ(clock.lap(phases), (forked ? norm + std::max(adamw, op) : norm + adamw + op) * 1e3);
      double host_ms = -1;
      for (const auto& [name, ms] : phases)
        if (name == "host") host_ms = ms;
      EXPECT_DOUBLE_EQ(host_ms, (norm + adamw) * 1e3);  // the worker's work is the host's
    }
  // Host work on a thread the clock was not told of is refused.
  RankClock clock(hw);
  clock.start(0);
  auto host = clock.on_host(make_cpu_device());
  std::string error;
  std::thread stray([&] {
    try {
      host->adamw(p.data(), g.data(), DType::f32, mom.data(), v.data(), n, AdamWConfig{}, 1, 1.0f, true);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  stray.join();
  EXPECT_NE(error.find("not told of"), std::string::npos) << error;
}

// The disk is one queue, in the order issued, at 2 GB/s: two transfers
// issued at once end one after the other, and the host waits where it
// waits for them, its own work under the second. A forked work's
// transfers start where it is, and count once it is joined.
TEST(ModeledClock, TheDiskIsOneQueueAtItsBandwidth) {
  const Hardware hw = round_machine();  // nvme 2 GB/s, host memory 50 GB/s, 1e9 parameters/s
  const size_t n = 1 << 16, b = 1 << 20;
  std::vector<float> p(n, 1.0f), g(n, 0.5f), m(n), v(n);
  const double norm = 4.0 * n / 50e9, adamw = n / 1e9, io = b / 2e9;
  auto disk_ms = [](const StepPhases& phases) {
    for (const auto& [name, ms] : phases)
      if (name == "disk") return ms;
    return -1.0;
  };
  RankClock clock(hw);
  clock.start(0);
  auto host = clock.on_host(make_cpu_device());
  SumOfSquares acc;
  host->sum_squares(g.data(), DType::f32, n, acc);  // the host is at `norm`
  const double first = clock.disk(b), second = clock.disk(b);
  EXPECT_DOUBLE_EQ(first, norm + io);
  EXPECT_DOUBLE_EQ(second, norm + 2 * io);
  clock.wait_until(first);
  host->adamw(p.data(), g.data(), DType::f32, m.data(), v.data(), n, AdamWConfig{}, 1, 1.0f, true);
  clock.wait_until(second);
  StepPhases phases;
  EXPECT_DOUBLE_EQ(clock.lap(phases), (norm + std::max(io + adamw, 2 * io)) * 1e3);
  EXPECT_DOUBLE_EQ(disk_ms(phases), 2 * io * 1e3);
  // Forked: the worker's transfers queue behind the host's still on the
  // disk, and count once it is joined; the step it ran in does not wait.
  clock.disk(b);  // the host's, not waited for: the disk is busy until io from here
  std::thread worker(clock.fork([&] {
    host->adamw(p.data(), g.data(), DType::f32, m.data(), v.data(), n, AdamWConfig{}, 2, 1.0f, true);
    clock.wait_until(clock.disk(b));  // after the host's transfer: at 2 io, not adamw + io
  }));
  worker.join();
  EXPECT_DOUBLE_EQ(clock.lap(phases), 0.0);  // the host waited for nothing
  EXPECT_DOUBLE_EQ(disk_ms(phases), io * 1e3);  // the host's transfer
  clock.join();
  EXPECT_DOUBLE_EQ(clock.lap(phases), 2 * io * 1e3);
  EXPECT_DOUBLE_EQ(disk_ms(phases), io * 1e3);  // the worker's
  // The host may not use the disk while a forked work may.
  std::thread idle(clock.fork([] {}));
  EXPECT_THROW(clock.disk(b), Error);
  idle.join();
  clock.join();
}

}  // namespace
}  // namespace zf
