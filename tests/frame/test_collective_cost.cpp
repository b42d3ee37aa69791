// A collective's time on a GPU profile (modeled/collective_cost.cpp): the
// algorithm and protocol NCCL's tuning model picks, and its time, against
// sums done here from NCCL's tables (src/graph/tuning.cc, NCCL 2.30; the
// ring's and the tree's latencies are in hardware/README.md). The ring
// profile's collectives: test_modeled_comm.cpp.
#include <gtest/gtest.h>

#include <string>

#include "hardware.h"
#include "modeled_clock.h"

namespace zf {
namespace {

constexpr double us = 1e-6, GB = 1e9;

// 8 GPUs a node, the bus bandwidths of hardware/h100-sxm.hw and
// a100-sxm.hw, a 45 GB/s (H100) or 22.5 GB/s (A100) NIC each.
Hardware h100() { return load_hardware("h100-sxm"); }
Hardware a100() { return load_hardware("a100-sxm"); }

void expect_way(const CollectiveCost& c, const char* algorithm, const char* protocol, double seconds) {
  EXPECT_STREQ(c.algorithm, algorithm);
  EXPECT_STREQ(c.protocol, protocol);
  EXPECT_NEAR(c.seconds, seconds, seconds * 1e-12);
}

// A small collective is all latency: LL's few µs a step win, at half the
// bus bandwidth capped at 141 GB/s in a Hopper node.
TEST(CollectiveCost, ASmallAllGatherInANodeTakesLL) {
  const double bytes = 8192, moved = bytes * 7 / 8;
  const CollectiveCost c = collective_cost(h100(), CollectiveKind::all_gather, size_t(bytes), 8, 1, 8);
  expect_way(c, "ring", "LL", (6.6 + 7 * 0.6) * us + moved / (141 * GB));
  const double simple = (8.4 + 7 * 3.4) * us + moved / (350 * GB);
  EXPECT_LT(c.seconds, simple / 2);
}

// A large one is all bandwidth: Simple, at the profile's measured rate.
TEST(CollectiveCost, ALargeAllGatherInANodeTakesSimple) {
  const double bytes = double(1 << 30), moved = bytes * 7 / 8;
  const CollectiveCost c = collective_cost(h100(), CollectiveKind::all_gather, size_t(bytes), 8, 1, 8);
  expect_way(c, "ring", "Simple", (8.4 + 7 * 3.4) * us + moved / (350 * GB));
  const CollectiveCost rs = collective_cost(h100(), CollectiveKind::reduce_scatter, size_t(bytes), 8, 1, 8);
  expect_way(rs, "ring", "Simple", (8.4 + 7 * 3.4) * us + moved / (360 * GB));
}

// An H100 node reduces in its NVSwitch (NVLS): 25 µs and the all-reduce's
// own 460 GB/s. An A100 node has no NVLS: the ring at its 235 GB/s.
TEST(CollectiveCost, AnAllReduceInAHopperNodeTakesNvls) {
  const double bytes = double(1 << 30), moved = 2 * bytes * 7 / 8;
  expect_way(collective_cost(h100(), CollectiveKind::all_reduce, size_t(bytes), 8, 1, 8), "NVLS", "Simple",
             25 * us + moved / (460 * GB));
  expect_way(collective_cost(a100(), CollectiveKind::all_reduce, size_t(bytes), 8, 1, 8), "ring", "Simple",
             (8.4 + 14 * 3.4) * us + moved / (235 * GB));
}

// Over 4,096 GPUs (512 nodes of 8) a ring all-gather takes 4,095 steps,
// 511 of them across nodes: LL128's smaller steps beat Simple's by half;
// LL is capped at 20.4 GB/s over more than two nodes. A step inside a node
// costs at least NCCL's network overhead (1 µs, 3 with Simple).
TEST(CollectiveCost, ARingOverThousandsOfGpusPaysItsStepsLatency) {
  const double bytes = 400e6, moved = bytes * 4095 / 4096, bw = 8 * 45;  // 8 NICs a node, over NVLink's 350
  const CollectiveCost c = collective_cost(h100(), CollectiveKind::all_gather, size_t(bytes), 4096, 512, 8);
  const double ll128 = (14 + 3584 * 1.9 + 511 * 4.0) * us + moved / (0.92 * 350 * GB);
  expect_way(c, "ring", "LL128", ll128);
  EXPECT_NEAR(c.seconds * 1e3, 10.11, 0.01);  // ms: latency 8.87, bytes 1.24
  const double simple = (8.4 + 3584 * 3.4 + 511 * 14) * us + moved / (std::min(350.0, bw) * GB);
  const double ll = (6.6 + 3584 * 1.0 + 511 * 2.7) * us + moved / (20.4 * GB);
  EXPECT_LT(c.seconds, simple);
  EXPECT_LT(c.seconds, ll);
}

// An all-reduce across 64 A100 nodes takes the tree (log2 of the nodes,
// not their number): LL128 at 4 MiB, whose bandwidth NCCL corrects by 0.8
// at that size (64 B · 2^16; 0.6 and 0.9 beside it).
TEST(CollectiveCost, AnAllReduceAcrossNodesTakesTheTree) {
  const double bytes = double(4 << 20);
  const double bw = 0.92 * std::min(235.0, 8 * 22.5) * 120 / 128 * 0.8;
  const CollectiveCost c = collective_cost(a100(), CollectiveKind::all_reduce, size_t(bytes), 512, 64, 8);
  expect_way(c, "tree", "LL128", (14 + 2 * (7 * 1.25 + 6 * 8.5)) * us + 2 * bytes / (bw * GB));
  const double ring_ll128 = (14 + (1022 - 126) * 1.9 + 126 * 4.0) * us;  // its latency alone
  EXPECT_LT(c.seconds, ring_ll128);
}

// Among one GPU a node (HSDP's groups across nodes) a small all-gather
// takes PAT: log2 of the nodes plus 2.8 µs a rank, at 0.75 of the NIC.
TEST(CollectiveCost, AmongOneGpuANodeASmallAllGatherTakesPat) {
  const double bytes = 65536;
  const CollectiveCost c = collective_cost(h100(), CollectiveKind::all_gather, size_t(bytes), 256, 256, 1);
  expect_way(c, "PAT", "Simple", (8 + 8 * 14 / 3.5 + 256 * 2.8) * us + bytes / (0.75 * 45 * GB));
  const double ring_ll = (6.6 + 255 * 5.0) * us;  // the tree's network latency with one GPU a node
  EXPECT_LT(c.seconds, ring_ll);
}

// Over PCIe (L40S) NCCL has no LL128; a large all-gather across two nodes
// of 8 rings at the 20 GB/s of the node's PCIe, eight NICs' 11 GB/s each
// being 88 GB/s across.
TEST(CollectiveCost, OverPcieThereIsNoLL128) {
  const Hardware l40s = load_hardware("l40s");
  for (double bytes : {4096.0, 1e6, 1e9}) {
    const CollectiveCost c = collective_cost(l40s, CollectiveKind::all_gather, size_t(bytes), 16, 2, 8);
    EXPECT_STRNE(c.protocol, "LL128") << bytes;
  }
  const double bytes = 1e9, moved = bytes * 15 / 16;
  expect_way(collective_cost(l40s, CollectiveKind::all_gather, size_t(bytes), 16, 2, 8), "ring", "Simple",
             (8.4 + 14 * std::max(5.7, 3.0) + 1 * 14) * us + moved / (20 * GB));
}

// Across two nodes a step inside a node costs at least NCCL's network
// overhead (1 µs with LL, not NVLink's 0.6), and LL is capped at 39 GB/s.
TEST(CollectiveCost, AcrossNodesAStepCostsAtLeastTheNetworksOverhead) {
  const double bytes = 8192, moved = bytes * 15 / 16;
  expect_way(collective_cost(h100(), CollectiveKind::all_gather, size_t(bytes), 16, 2, 8), "ring", "LL",
             (6.6 + 14 * 1.0 + 1 * 2.7) * us + moved / (39 * GB));
}

// Across two Hopper nodes an all-reduce takes the NVLS tree: NVLS in each
// node, and the two nodes' NICs in pairs, twice one node's (16 x 45 GB/s,
// above NVLS's 460).
TEST(CollectiveCost, AnAllReduceAcrossTwoHopperNodesTakesTheNvlsTree) {
  const double bytes = double(1 << 30), moved = 2 * bytes * 15 / 16;
  expect_way(collective_cost(h100(), CollectiveKind::all_reduce, size_t(bytes), 16, 2, 8), "NVLS tree", "Simple",
             (25 + 2 * 1 * 20.9) * us + moved / (460 * GB));
}

}  // namespace
}  // namespace zf
