// fsdp_test_util.h: what the two files of the fsdp suite share
// (test_fsdp.cpp, test_fsdp_schedule.cpp): a four-block model, the FSDP
// units' sizes computed from the model units' alone, a configuration and
// its description.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "comm.h"
#include "config.h"
#include "launch.h"
#include "model.h"
#include "stages/stage_test_util.h"

namespace zf::fsdp_test {

// A model of four blocks, no unit a multiple of 2, 3, 4 or 8 (as odd_model),
// so that --wrap-blocks 2 and 3 make units of two sizes.
inline ModelConfig odd4() { return ModelConfig{"odd4", 256, 13, 4, 2, 10}; }

// The FSDP units' sizes, from the model units' sizes alone: the embedding,
// groups of --wrap-blocks blocks, the head; each group's elements summed, then padded
// to a multiple of N as one buffer.
struct FlatSizes {
  std::vector<size_t> padded;  // N * ceil(n_g / N) per FSDP unit, forward order
  size_t shard = 0;            // sum of ceil(n_g / N)
  size_t total_padded() const {
    size_t t = 0;
    for (size_t p : padded) t += p;
    return t;
  }
  size_t head() const { return padded.back(); }
  size_t largest_shard(int N) const { return *std::max_element(padded.begin(), padded.end()) / size_t(N); }
};

inline FlatSizes flat_sizes(const ModelConfig& m, int N, int K) {
  const ModelLayout layout = build_layout(m);
  std::vector<size_t> n{layout.units.front().numel};
  for (int l0 = 0; l0 < m.L; l0 += K) {
    size_t g = 0;
    for (int l = l0; l < std::min(m.L, l0 + K); ++l) g += layout.units[layout.block_unit(l)].numel;
    n.push_back(g);
  }
  n.push_back(layout.units.back().numel);
  FlatSizes f;
  for (size_t x : n) {
    const size_t S = (x + N - 1) / N;
    f.padded.push_back(N * S);
    f.shard += S;
  }
  return f;
}

// The peak of category comm on the device in one micro-step, from the
// schedule of 04_fsdp/README.md ("Memory of the communication buffers"), with a_g the
// padded units, S_g = a_g / N their shards, G - 1 the head, and sizes past
// either end 0:
//   c  bytes per element of an all-gather's input made for it on the device
//      (the bf16 cast in stage 04's bf16 recipe; the upload of
//      --offload-params in stage 05), from the all-gather's issue to its wait
//   e  bytes per element of a unit's gradient buffer (the recipe's dtype)
//   r  bytes per element it is reduced in (4 under --reduce-dtype fp32)
// A unit's buffer, once reduced, is held (h_g: r a_g; with --no-sync the
// buffer is a kept gradient, counted as grads, and only a float32 copy of it
// is held, 4 a_g under --reduce-dtype fp32, else nothing) while the next
// unit's backward runs; stage 05 (`landing`) holds it one unit longer,
// while my piece goes to the host. The moments of unit g's backward:
//   its prefetch issued   c (S_{g-1} + S_g, but S_g not for the head) + L_g
//   its buffer made       c S_{g-1} + L_g + e a_g     (not with --no-sync)
//   widened               ... + 4 a_g                 (when r != e)
//   reduced, g+1 done     c S_{g-1} + L_g + h_g + 4 S_{g+1} (the float32
//                         piece of g+1 that stage 04 adds, when r = 2)
// with L_g = h_{g+1} (+ h_{g+2} in stage 05); the forward's c (S_g + S_{g+1});
// and the last wait, h_0 + 4 S_0 (stage 04, r = 2). Without resharding the
// backward gathers nothing: no c in it. For --prefetch 1 (the default) and
// a --max-gathered that never holds a prefetch back.
//
// Hybrid sharding: a reduced buffer is freed once my piece (q_g: r S_g) is
// copied out of it, and that piece's all-reduce across the groups stays in
// flight behind the next unit, so L_g = h_{g+1} + q_{g+2} (stage 05 holds
// the landed piece q_{g+3}, not a buffer). Once unit g is reduced:
//   g+1's piece copied    c S_{g-1} + L_g + h_g + q_{g+1}
//   g+2's all-reduce done c S_{g-1} + h_g + q_{g+1} + q_{g+2} + 4 S_{g+2}
//                         (the float32 piece stage 04 adds, when r = 2)
// and at the end the same with g = -1, then q_0 + 4 S_0 (stage 04, r = 2).
struct CommPeakCase {
  size_t c = 0, e = 4, r = 4;
  bool reshard = true, no_sync = false, landing = false, hybrid = false;
};

inline size_t comm_peak(const FlatSizes& f, int N, const CommPeakCase& k) {
  const int G = int(f.padded.size());
  auto a = [&](int g) { return g < 0 || g >= G ? size_t(0) : f.padded[g]; };
  auto S = [&](int g) { return a(g) / size_t(N); };
  auto h = [&](int g) { return k.no_sync ? (k.r != k.e ? 4 * a(g) : 0) : k.r * a(g); };
  auto q = [&](int g) { return k.hybrid ? k.r * S(g) : 0; };
  const bool piece = k.r == 2 && !k.landing;
  const size_t cb = k.reshard ? k.c : 0;  // the backward's all-gather inputs
  size_t peak = piece ? (k.hybrid ? q(0) : h(0)) + 4 * S(0) : 0;
  for (int g = k.hybrid ? -1 : 0; g < G; ++g) {
    const size_t L = h(g + 1) + (k.landing ? (k.hybrid ? q(g + 3) : h(g + 2)) : 0) + q(g + 2);
    const size_t made = k.no_sync ? 0 : k.e * a(g);
    if (k.hybrid)
      peak = std::max({peak, cb * S(g - 1) + L + h(g) + q(g + 1),
                       cb * S(g - 1) + h(g) + q(g + 1) + q(g + 2) + (piece ? 4 * S(g + 2) : 0)});
    if (g < 0) continue;
    peak = std::max({peak, k.c * (S(g) + S(g + 1)), cb * (S(g - 1) + (g < G - 1 ? S(g) : 0)) + L,
                     cb * S(g - 1) + L + made + (k.r != k.e ? 4 * a(g) : 0),
                     cb * S(g - 1) + L + h(g) + (piece && !k.hybrid && g + 1 < G ? 4 * S(g + 1) : 0)});
  }
  return peak;
}

inline TrainConfig fsdp_config(const ModelConfig& m, int N, Precision p, int steps = 3) {
  return test::config(m, N, 1, steps, p);
}

inline std::string describe(const TrainConfig& c) {
  const FsdpOptions& f = c.fsdp;
  return test::describe(c) + ", wrap " + std::to_string(f.wrap_blocks) + ", reshard " +
         (f.reshard_after_forward ? "true" : "false") + ", prefetch " + std::to_string(f.prefetch) +
         ", max-gathered " + std::to_string(f.max_gathered) + (f.no_sync ? ", no-sync" : "") +
         (f.reduce_dtype ? std::string(", reduce ") + dtype_name(*f.reduce_dtype) : "");
}
// The reference for hybrid sharding: stage 00 whose gradient all-reduces add
// in hybrid sharding's two hops, first within groups of F consecutive ranks
// (rank order), then across the groups (group order), each hop a collective
// of its own, rounded to the dtype as hybrid sharding's are. Built from
// splits of the world, not from FsdpComms: strided groups in the stage would
// add in another order, and differ. A one-element all-reduce (the loss) is
// the world's, as in every stage: no unit of a model has one element.
class TwoHopAllReduce final : public Communicator {
 public:
  TwoHopAllReduce(Communicator& world, int F)
      : world_(world), group_(world.split(world.rank() / F, world.rank())),
        across_(world.split(world.rank() % F, world.rank())) {}
  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }
  const char* backend() const override { return world_.backend(); }
  CommHandle all_reduce_async(void* buf, size_t count, DType dt, ReduceOp op) override {
    if (count == 1) return world_.all_reduce_async(buf, count, dt, op);
    group_->all_reduce(buf, count, dt, op);
    across_->all_reduce(buf, count, dt, op);
    return {};
  }
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t n, DType dt, ReduceOp op) override {
    return world_.reduce_scatter_async(send, recv, n, dt, op);
  }
  CommHandle all_gather_async(const void* send, void* recv, size_t n, DType dt) override {
    return world_.all_gather_async(send, recv, n, dt);
  }
  CommHandle broadcast_async(void* buf, size_t count, DType dt, int root) override {
    return world_.broadcast_async(buf, count, dt, root);
  }
  void barrier() override { world_.barrier(); }
  void abort(const std::string& reason) override { world_.abort(reason); }

 private:
  Communicator& world_;
  std::unique_ptr<Communicator> group_, across_;
};

// `stage` (stage 00) with every rank's communicator a TwoHopAllReduce.
inline StageFn adding_in_two_hops(const StageFn& stage, int F) {
  return [stage, F](const TrainConfig& cfg, RankContext& ctx, const TokenData& data, StepLog& reporter) {
    TwoHopAllReduce comm(ctx.comm, F);
    RankContext two_hops{ctx.rank, ctx.world, comm, ctx.mem, ctx.dev};
    RankFailureGuard guard(comm);
    return stage(cfg, two_hops, data, reporter);
  };
}

// A mode of the comm-peak tests of stages 04 and 05: a stage's
// configuration at N, and the comm_peak case it makes.
struct PeakMode {
  const char* name;
  bool reshard = true, no_sync = false, fp32_reduce = false;
  int shard_group = 0;                          // 0: none
  bool offload_params = false, delay = false;  // stage 05's

  bool applies(int N, Precision p) const { return !(fp32_reduce && p == Precision::fp32) && (!shard_group || N == 4); }
  int group(int N) const { return shard_group ? shard_group : N; }
  RunConfig config(int N, Precision p, int wrap) const {
    RunConfig cfg = fsdp_config(odd4(), N, p, 2);
    cfg.grad_accum = 2;
    cfg.fsdp.wrap_blocks = wrap;
    cfg.fsdp.reshard_after_forward = reshard;
    cfg.fsdp.no_sync = no_sync;
    cfg.fsdp.shard_group = shard_group;
    if (fp32_reduce) cfg.fsdp.reduce_dtype = DType::f32;
    cfg.offload.offload_params = offload_params;
    cfg.offload.delay_update = delay;
    return cfg;
  }
  // c: the bytes per element of an all-gather input made on the device.
  CommPeakCase peak_case(Precision p, size_t c, bool landing) const {
    const size_t e = test::esize(p);
    return {.c = c, .e = e, .r = fp32_reduce ? 4 : e, .reshard = reshard, .no_sync = no_sync, .landing = landing,
            .hybrid = shard_group > 0};
  }
};

}  // namespace zf::fsdp_test
