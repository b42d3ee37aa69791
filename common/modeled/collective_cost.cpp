// collective_cost.cpp: the time of one collective on a modeled machine
// (modeled_clock.h: collective_cost). A profile's `collectives` says what
// runs them:
//   ring   each collective a ring of steps at the profile's latencies (the
//          threads backend, whose profile calibrate_machine measures).
//   nccl-  NCCL, which picks for every call the algorithm (ring, tree,
//          NVLS, PAT) and the protocol (LL, LL128, Simple) its own tuning
//          model says is fastest: a latency, which grows with the steps,
//          plus bytes over a bandwidth. That model is followed here, its
//          latencies and bandwidth factors as NCCL 2.30 has them
//          (src/graph/tuning.cc); the bandwidths it scales are the
//          profile's measured bus bandwidths.
// What NCCL's model has and this one leaves out: the caps per channel (the
// channel counts come from NCCL's topology search), a NIC's own latency
// (InfiniBand's plugin reports none), the 1.4x "plateau" of a cross-node
// ring all-reduce, NVLS for all-gathers and reduce-scatters (the profiles'
// rates are measured whatever NCCL chose), CollNet (needs SHARP switches).
// Taken as given: the host is an Intel x86 (NCCL's network overhead and LL
// caps across nodes); the GPU inside a node is a Hopper on an NVLS profile,
// else counted as an Ampere (LL's cap there); a broadcast's channels are
// the same at every rank (its latency one step's).
#include <algorithm>
#include <cmath>
#include <vector>

#include "modeled_clock.h"

namespace zf {

namespace {

enum Protocol { LL, LL128, Simple };
constexpr const char* kProtocolNames[] = {"LL", "LL128", "Simple"};

// NCCL's latencies in µs: a call's base, and a step's over NVLink, PCIe and
// the network (tuning.cc: baseLatencies, hwLatencies).
struct Latencies {
  double base, nvlink, pcie, net;
};
constexpr Latencies kRing[3] = {{6.6, 0.6, 1.0, 2.7}, {14.0, 1.9, 2.5, 4.0}, {8.4, 3.4, 5.7, 14.0}};
constexpr Latencies kTree[3] = {{6.8, 0.6, 1.0, 5.0}, {14.0, 1.25, 1.9, 8.5}, {8.4, 4.0, 4.0, 14.0}};
constexpr Latencies kNvls = {0, 25.0, 0, 18.0};  // Simple only, as the two below
constexpr Latencies kNvlsTree = {0, 25.0, 0, 20.9};
constexpr Latencies kPat = {8.0, 4.0, 4.0, 14.0};

// A tree all-reduce's bandwidth is off NCCL's model at middle sizes: its
// correction by protocol, for 64 B · 2^i, i = 0..22 (treeCorrectionFactor).
constexpr double kTreeCorrection[3][23] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}};

// floor(log2(x)), -1 for 0 (NCCL's log2i).
int log2_down(double x) { return x < 1 ? -1 : int(std::floor(std::log2(x))); }

// One way to run the collective: a latency (µs) and `moved` bytes at a bus
// bandwidth (GB/s).
struct Way {
  const char* algorithm;
  Protocol protocol;
  double latency_us, moved, busbw;
  double seconds() const { return latency_us * 1e-6 + moved / (busbw * 1e9); }
};

// The profile's bus bandwidth of `kind` inside a node (a broadcast's and
// a barrier's: the all-gather's).
double node_busbw(const Hardware& hw, CollectiveKind kind) {
  return kind == CollectiveKind::all_reduce       ? hw.intra_node_all_reduce_busbw_gb_per_s
         : kind == CollectiveKind::reduce_scatter ? hw.intra_node_reduce_scatter_busbw_gb_per_s
                                                  : hw.intra_node_all_gather_busbw_gb_per_s;
}

// A group's bus bandwidth, `node_bw` inside one node: across nodes the rings
// spread over the NICs of the group's GPUs in a node, each GPU's own
// (per_node of them, times `nics` where a pair of nodes share the work), at
// most the node's own rate.
double group_busbw(const Hardware& hw, double node_bw, int nodes, int per_node, double nics = 1) {
  return nodes > 1 ? std::min(node_bw, nics * per_node * hw.inter_node_busbw_gb_per_s) : node_bw;
}

CollectiveCost nccl_cost(const Hardware& hw, CollectiveKind kind, size_t size, int n, int nodes, int per_node) {
  using C = Hardware::Collectives;
  if (kind == CollectiveKind::barrier) kind = CollectiveKind::all_reduce;  // of nothing
  const bool nvls = hw.collectives == C::nccl_nvls, nvlink = nvls || hw.collectives == C::nccl_nvlink;
  const bool all_reduce = kind == CollectiveKind::all_reduce;
  const double bytes = double(size);
  const int ppn = n / nodes;  // NCCL's ranks per node
  const bool one_per_node = n == nodes;
  auto hop = [&](const Latencies& l) { return nvlink ? l.nvlink : l.pcie; };

  // The bus bandwidth: on an NVLS node the all-reduce's is NVLS's, and a
  // ring or tree all-reduce is a reduce-scatter and an all-gather.
  const double intra = all_reduce && nvls ? std::min(node_busbw(hw, CollectiveKind::all_gather),
                                                     node_busbw(hw, CollectiveKind::reduce_scatter))
                                          : node_busbw(hw, kind);
  const double bw = group_busbw(hw, intra, nodes, per_node);
  // LL's bandwidth at most (llMaxBws: by GPU inside a node, by CPU across).
  const double ll_most = nodes == 1 ? (nvls ? 141.0 : 87.7) : nodes == 2 ? 39.0 : 20.4;
  // Posting to the network costs the GPU's steps at least this (getNetOverhead).
  const double net_overhead = nodes > 1 ? 1.0 : 0.0;

  std::vector<Way> ways;
  for (Protocol p : {LL, LL128, Simple}) {
    // NCCL enables LL128 on NVLink only (with one GPU a node, no link inside it).
    if (p == LL128 && !nvlink && !one_per_node) continue;
    // The ring: n-1 steps (twice for an all-reduce), of which nodes-1 (twice)
    // cross. With one GPU a node every step crosses, and NCCL charges them
    // the tree's network latency: no step inside a node hides theirs.
    const double inter = one_per_node ? kTree[p].net : kRing[p].net;
    double latency = kRing[p].base;
    if (kind == CollectiveKind::broadcast) {
      latency += nodes > 1 ? kRing[p].net : hop(kRing[p]);  // pipelined: one step's latency
    } else {
      const double steps = (all_reduce ? 2.0 : 1.0) * (n - 1), crossing = (all_reduce ? 2.0 : 1.0) * (nodes - 1);
      const double overhead = p == Simple ? 3 * net_overhead : net_overhead;
      latency += (steps - crossing) * std::max(hop(kRing[p]), overhead) + crossing * inter;
    }
    const double ring_bw = p == LL ? std::min(ll_most, 0.5 * bw) : p == LL128 ? 0.92 * bw : bw;
    ways.push_back({"ring", p, latency, ring_bytes(kind, size, n), ring_bw});
    if (!all_reduce) continue;
    // The tree: up and down a chain of each node's GPUs and a binary tree
    // of the nodes; the whole buffer twice, at a corrected bandwidth.
    const double tree_latency =
        kTree[p].base + 2.0 * ((ppn - 1) * hop(kTree[p]) + std::max(0, log2_down(nodes)) * kTree[p].net);
    double tree_bw = 0.92 * bw;
    if (p == LL) tree_bw = std::min(tree_bw / 3.8, ll_most);
    if (p == LL128) tree_bw *= nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0;
    const int at = log2_down(std::floor(bytes / 64));
    if (at >= 0 && at < 23) tree_bw *= kTreeCorrection[p][at];
    ways.push_back({"tree", p, tree_latency, 2.0 * bytes, tree_bw});
  }
  // NVLS: the all-reduce in the NVSwitch; across nodes NVLS inside each
  // and a tree between them (over two nodes, both NICs of a pair carry it).
  // A node needs two of the group's GPUs.
  if (nvls && all_reduce && per_node > 1) {
    const double nvls_bw = hw.intra_node_all_reduce_busbw_gb_per_s;
    if (nodes == 1) ways.push_back({"NVLS", Simple, kNvls.nvlink, ring_bytes(kind, size, n), nvls_bw});
    else
      ways.push_back({"NVLS tree", Simple, kNvlsTree.nvlink + 2.0 * log2_down(nodes) * kNvlsTree.net,
                      ring_bytes(kind, size, n), group_busbw(hw, nvls_bw, nodes, per_node, nodes == 2 ? 2 : 1)});
  }
  // PAT: an all-gather or reduce-scatter among one GPU a node, in log
  // steps (and still a part that grows with the ranks).
  const bool gather_or_scatter = kind == CollectiveKind::all_gather || kind == CollectiveKind::reduce_scatter;
  if (gather_or_scatter && one_per_node && nodes > 1)
    ways.push_back({"PAT", Simple, kPat.base + log2_down(nodes) * (kTree[Simple].net / 3.5) + n * 2.8, bytes,
                    0.75 * bw});

  const Way& best = *std::min_element(ways.begin(), ways.end(),
                                      [](const Way& a, const Way& b) { return a.seconds() < b.seconds(); });
  return {best.seconds(), best.algorithm, kProtocolNames[best.protocol]};
}

// The threads backend: a ring at the profile's step latencies; an
// all-reduce across nodes the faster of that and a tree.
CollectiveCost ring_cost(const Hardware& hw, CollectiveKind kind, size_t bytes, int n, int nodes, int per_node) {
  const double intra_lat = hw.intra_node_latency_us * 1e-6, inter_lat = hw.inter_node_latency_us * 1e-6;
  const double busbw = group_busbw(hw, node_busbw(hw, kind), nodes, per_node) * 1e9;
  const double moved = ring_bytes(kind, bytes, n) / busbw;
  // A ring takes n-1 steps (a reduce-scatter or an all-gather), twice that
  // for an all-reduce (one of each); nodes-1 of each n-1 cross a node.
  const double pass = double(n - nodes) * intra_lat + double(nodes - 1) * inter_lat;
  const double ring = (kind == CollectiveKind::all_reduce ? 2.0 : 1.0) * pass + moved;
  if (kind != CollectiveKind::all_reduce || nodes == 1) return {ring, "ring", ""};
  // A tree all-reduce: up and down a binary tree of the nodes, and a chain
  // of each node's GPUs.
  const double tree = 2.0 * (std::floor(std::log2(double(nodes))) * inter_lat + double(n / nodes - 1) * intra_lat) +
                      moved;
  return tree < ring ? CollectiveCost{tree, "tree", ""} : CollectiveCost{ring, "ring", ""};
}

}  // namespace

CollectiveCost collective_cost(const Hardware& hw, CollectiveKind kind, size_t bytes, int n, int nodes, int per_node) {
  if (n <= 1) return {0.0, "", ""};  // nothing to run
  if (hw.collectives == Hardware::Collectives::ring) return ring_cost(hw, kind, bytes, n, nodes, per_node);
  return nccl_cost(hw, kind, bytes, n, nodes, per_node);
}

double collective_seconds(const Hardware& hw, CollectiveKind kind, size_t bytes, int n, int nodes, int per_node) {
  return collective_cost(hw, kind, bytes, n, nodes, per_node).seconds;
}

}  // namespace zf
