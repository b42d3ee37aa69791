// The modeled clock's collectives (modeled/modeled_comm.cpp) against times
// computed here by hand from the round profile (modeled_ranks.h): a ring
// inside a node and across nodes, the NICs a group uses, the tree
// all-reduce, each communicator's queue, the last rank to arrive, and the
// same numbers whatever the threads' timing. The ops and the host's work:
// test_modeled_clock.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "modeled_ranks.h"
#include "test_util.h"

namespace zf {
namespace {

using test::matmul;
using test::Rank;
using test::round_machine;
using test::round_matmul_f32;
using test::run_modeled;

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

// Each kind at its own NVLink bus bandwidth (an H100 node's all-reduce is
// NVLink SHARP's, faster than its all-gather and reduce-scatter); across
// nodes each is capped at its own, not at the all-reduce's.
TEST(ModeledClock, EachKindOfCollectiveHasItsOwnBusBandwidth) {
  Hardware hw = round_machine();  // 4 GPUs per node, latency 1 µs inside, 10 µs across
  hw.intra_node_all_reduce_busbw_gb_per_s = 100;
  hw.intra_node_all_gather_busbw_gb_per_s = 50;
  hw.intra_node_reduce_scatter_busbw_gb_per_s = 80;
  hw.inter_node_busbw_gb_per_s = 20;  // four NICs a node: 80 GB/s across
  const size_t piece = 1 << 14, full = 4 * piece;  // floats
  const double S = full * 4.0;  // bytes of the full buffer
  std::map<std::string, std::vector<double>> ms;
  for (int N : {4, 8}) {
    run_modeled(hw, N, [&](Rank& rank, int r) {
      std::vector<float> mine(piece, 1.0f), all(size_t(N) * piece, 1.0f);
      rank.lap_ms();
      rank.comm->all_gather_async(mine.data(), all.data(), piece, DType::f32).wait();
      const double ag = rank.lap_ms();
      rank.comm->reduce_scatter_async(all.data(), mine.data(), piece, DType::f32, ReduceOp::sum).wait();
      const double rs = rank.lap_ms();
      rank.comm->all_reduce_async(all.data(), full, DType::f32, ReduceOp::sum).wait();
      const double ar = rank.lap_ms();
      if (r == 0) ms[std::to_string(N)] = {ag, rs, ar};
    });
  }
  // One node, N = 4: 3 steps of 1 µs (6 for the all-reduce) and the ring bytes at the kind's rate.
  const double ag4 = 3e-6 + 0.75 * S / 50e9, rs4 = 3e-6 + 0.75 * S / 80e9, ar4 = 6e-6 + 1.5 * S / 100e9;
  EXPECT_DOUBLE_EQ(ms["4"][0], ag4 * 1e3);
  EXPECT_DOUBLE_EQ(ms["4"][1], rs4 * 1e3);
  EXPECT_DOUBLE_EQ(ms["4"][2], ar4 * 1e3);
  // Two nodes, N = 8: 6 steps inside and 1 across; four NICs give 80 GB/s, under the
  // all-reduce's 100 but over the all-gather's 50: the all-gather stays at 50. The
  // all-reduce's tree (2 · (1 · 10 + 3 · 1) µs) beats its ring (2 · (6 + 10) µs).
  const double S8 = 2 * S;
  const double ag8 = 6e-6 + 10e-6 + 7.0 / 8 * S8 / 50e9, rs8 = 6e-6 + 10e-6 + 7.0 / 8 * S8 / 80e9;
  const double ar8 = 2 * (10e-6 + 3e-6) + 2 * 7.0 / 8 * S / 80e9;  // the same S floats reduced
  EXPECT_DOUBLE_EQ(ms["8"][0], ag8 * 1e3);
  EXPECT_DOUBLE_EQ(ms["8"][1], rs8 * 1e3);
  EXPECT_DOUBLE_EQ(ms["8"][2], ar8 * 1e3);
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

// Two queues' collectives on one link do not both run at its full rate: a
// link carries one collective at a time, in the order the rank issued them
// (their total is what sharing it would take). FSDP's all-gathers and
// reduce-scatters on their two queues, inside a node: the second ends
// where the two would, 2T. Across nodes a group with four members a node
// uses the NICs and NVLink both, so it waits for an in-node group's
// collective too; a group with one member a node (HSDP's replicate) uses the
// NICs alone, and runs beside it (EachQueuesBusyTimeIsItsOwn).
TEST(ModeledClock, TwoQueuesShareALink) {
  const Hardware hw = round_machine();  // 4 GPUs per node, NVLink 100 GB/s, a NIC 10 GB/s
  const size_t send = 1 << 14;
  std::vector<double> one_node(4), two_nodes(8);
  run_modeled(hw, 4, [&](Rank& rank, int r) {
    auto second = rank.comm->split(0, r);  // the same four ranks: a queue of its own
    rank.lap_ms();
    std::vector<float> mine(send, 1.0f), all(4 * send), all2(4 * send);
    CommHandle a = rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32);
    CommHandle b = second->all_gather_async(mine.data(), all2.data(), send, DType::f32);
    b.wait();  // the later one first: its end waits for the earlier's
    a.wait();
    one_node[size_t(r)] = rank.lap_ms();
  });
  const double T = 3 * 1e-6 + 0.75 * (4.0 * send * 4) / 100e9;
  for (int r = 0; r < 4; ++r) EXPECT_DOUBLE_EQ(one_node[size_t(r)], 2 * T * 1e3) << "rank " << r;

  run_modeled(hw, 8, [&](Rank& rank, int r) {
    auto shard = rank.comm->split(r / 4, r);  // one node: NVLink
    rank.lap_ms();
    std::vector<float> mine(send, 1.0f), all(4 * send), all8(8 * send);
    CommHandle a = shard->all_gather_async(mine.data(), all.data(), send, DType::f32);
    CommHandle b = rank.comm->all_gather_async(mine.data(), all8.data(), send, DType::f32);  // both nodes
    a.wait();
    b.wait();
    two_nodes[size_t(r)] = rank.lap_ms();
  });
  // The world's all-gather: 6 steps inside a node and 1 across; four NICs a node, 40 GB/s.
  const double world = 6 * 1e-6 + 10e-6 + 7.0 / 8 * (8.0 * send * 4) / 40e9;
  for (int r = 0; r < 8; ++r) EXPECT_DOUBLE_EQ(two_nodes[size_t(r)], (T + world) * 1e3) << "rank " << r;
}

// A running collective's kernel holds collective_sms of the SMs: a matrix
// product beside it runs its waves on the others. Four tiles on four SMs
// are one wave; on the three a collective leaves, two (the "tail effect"
// of a GEMM sized to the SMs). The op pays that for the share of its time
// the collective ran, at the collective's wait.
TEST(ModeledClock, AProductBesideACollectiveRunsOnTheSmsItLeaves) {
  Hardware hw = round_machine();  // 1x1 tiles, efficiency 0.5, launch 2 µs; one node of 4
  hw.sm_count = 4;
  hw.peak_tflops_f32 = 1e-6;  // 1 MFLOP/s: a wave of 4 tiles over K = 250 is 2000 FLOPs, 4 ms
  hw.intra_node_all_gather_busbw_gb_per_s = 1e-3;  // 1 MB/s: 2048 ring bytes take 2.048 ms
  const double wave = 2000 / 0.5e6, op = wave + 2e-6, collective = 1e-6 + 2048 / 1e6;
  EXPECT_DOUBLE_EQ(gemm_seconds(hw, 4, 1, 250, DType::f32, 3), 2 * gemm_seconds(hw, 4, 1, 250, DType::f32));
  for (int sms : {0, 1}) {
    hw.collective_sms = sms;
    const auto ms = run_modeled(hw, 2, [&](Rank& rank, int r) {
      std::vector<float> mine(512, float(r)), all(1024);
      rank.lap_ms();
      CommHandle h = rank.comm->all_gather_async(mine.data(), all.data(), 512, DType::f32);
      test::matmul(rank, 4, 250, 1);  // [0, op], beside the collective's [0, collective]
      h.wait();
    });
    // The op's extra wave (4 ms) for the collective's share of its time.
    const double late = sms ? wave * collective / op : 0.0;
    for (double m : ms) EXPECT_NEAR(m, (op + late) * 1e3, 1e-9) << "collective_sms " << sms;
  }
}

// Two collectives at once (HSDP: one inside a node on NVLink, one across
// nodes on the NICs) lend the same SMs: the op's stretch beside both is
// charged once, so the op beside them for its whole time pays one extra wave.
TEST(ModeledClock, TwoCollectivesAtOnceAreChargedOnce) {
  Hardware hw = round_machine();  // as above; 4 GPUs a node, ranks 0-3 and 4-7
  hw.sm_count = 4;
  hw.collective_sms = 1;
  hw.peak_tflops_f32 = 1e-6;
  hw.intra_node_all_gather_busbw_gb_per_s = 1e-3;  // the node's: 6144 ring bytes, 6.147 ms with 3 µs
  hw.inter_node_busbw_gb_per_s = 1e-3;             // across, one GPU a node: 2048 bytes, 2.058 ms with 10 µs
  const double wave = 2000 / 0.5e6, op = wave + 2e-6;
  const auto ms = run_modeled(hw, 8, [&](Rank& rank, int r) {
    auto node = rank.comm->split(r / 4, r), across = rank.comm->split(r % 4, r);
    std::vector<float> mine(512, 1.0f), all4(4 * 512), all2(2 * 512);
    rank.lap_ms();
    CommHandle a = node->all_gather_async(mine.data(), all4.data(), 512, DType::f32);
    CommHandle b = across->all_gather_async(mine.data(), all2.data(), 512, DType::f32);
    test::matmul(rank, 4, 250, 1);
    b.wait();  // covers the op's first 2.058 ms
    a.wait();  // covers all of it: only the rest is new
  });
  for (double m : ms) EXPECT_NEAR(m, (op + wave) * 1e3, 1e-9);
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

}  // namespace
}  // namespace zf
