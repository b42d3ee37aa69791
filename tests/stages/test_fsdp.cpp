// test_fsdp.cpp: stage 04 (FSDP) against stage 00 and against the formulas
// of 04_fsdp/README.md, computed here from the unit sizes.
//
//   parity         bit for bit with stage 00 at K = 1 for every knob
//                  (--wrap-blocks, --reshard-after-forward, --prefetch,
//                  --max-gathered), N = 1 .. 8, both recipes; --no-sync at
//                  K = 2 and 4; within the accumulation tolerance without it;
//                  --reduce-dtype fp32 within a bf16 rounding
//   memory         model states 4S + 4S + 8S in both recipes (S: the shard
//                  of the FSDP units); the gathered-parameter peak for each
//                  limit; without resharding, the whole model; --no-sync's
//                  one full gradient
//   communication  bytes per collective and all-gathers per step, for each mode
//   flags          stage 04's flags refused by the other stages, validated here
//   gradient, checkpoints   as every stage (stage_test_util.h, gradient_check.h)
//
//   meson test -C build fsdp                                # all of them
//   build/tests/test_fsdp --gtest_filter='FsdpMemory.*'    # one group
//
// ZF_TEST_PRINT=1 prints the measured numbers the comments quote.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <cstdio>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "cli.h"
#include "data_parallel.h"
#include "fsdp.h"
#include "stages/gradient_check.h"
#include "stages/schedule_util.h"
#include "stages/stage_test_util.h"
#include "test_util.h"

namespace zf {
namespace {

// A model of four blocks, no unit a multiple of 2, 3, 4 or 8 (as odd_model),
// so that --wrap-blocks 2 and 3 make units of two sizes.
ModelConfig odd4() { return ModelConfig{"odd4", 256, 13, 4, 2, 10}; }

// The FSDP units' sizes, from the model units' sizes alone: the embedding,
// groups of K blocks, the head; each group's elements summed, then padded
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
};

FlatSizes flat_sizes(const ModelConfig& m, int N, int K) {
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

TrainConfig fsdp_config(const ModelConfig& m, int N, Precision p, int steps = 3) {
  return test::config(m, N, 1, steps, p);
}

std::string describe(const TrainConfig& c) {
  const FsdpOptions& f = c.fsdp;
  return test::describe(c) + ", wrap " + std::to_string(f.wrap_blocks) + ", reshard " +
         (f.reshard_after_forward ? "true" : "false") + ", prefetch " + std::to_string(f.prefetch) +
         ", max-gathered " + std::to_string(f.max_gathered) + (f.no_sync ? ", no-sync" : "") +
         (f.reduce_dtype ? std::string(", reduce ") + dtype_name(*f.reduce_dtype) : "");
}

// ------------------------------------------------------------------ parity with stage 00

class FsdpBitParity : public ::testing::TestWithParam<test::ParityCase> {};

// K = 1, default knobs, both recipes, clip norms 1 and 0.05. The bf16
// recipe too: stage 00 rounds its float32 master to bf16 parameters; FSDP
// rounds its float32 shard to bf16 before the all-gather, the same rounding
// of the same values; its gradient shard holds the bf16 sums widened
// (exactly), and AdamW widens stage 00's bf16 gradients the same way.
TEST_P(FsdpBitParity, BitIdenticalToDataParallel) {
  test::expect_bit_identical_to_dp(GetParam(), train_fsdp, "04 fsdp");
}

INSTANTIATE_TEST_SUITE_P(Ranks, FsdpBitParity, ::testing::ValuesIn(test::parity_cases()), test::parity_case_name);

TEST(FsdpParity, ClippingBites) { test::expect_clipping_bites(train_fsdp); }

// Each knob changes when parameters are gathered and freed, never what is
// summed: stage 00's bits for every value, at N = 3 and 4 (odd4 pads at
// both), both recipes.
TEST(FsdpParity, EveryKnobIsBitIdentical) {
  struct Knob {
    const char* what;
    void (*set)(FsdpOptions&);
  };
  const Knob knobs[] = {
      {"reshard false", [](FsdpOptions& f) { f.reshard_after_forward = false; }},
      {"prefetch 0", [](FsdpOptions& f) { f.prefetch = 0; }},
      {"prefetch 2", [](FsdpOptions& f) { f.prefetch = 2; }},
      {"max-gathered 1", [](FsdpOptions& f) { f.max_gathered = 1; }},
      {"max-gathered 0", [](FsdpOptions& f) { f.max_gathered = 0; }},
      {"prefetch 2, max-gathered 0", [](FsdpOptions& f) { f.prefetch = 2, f.max_gathered = 0; }},
      {"wrap 2", [](FsdpOptions& f) { f.wrap_blocks = 2; }},
      {"wrap 3", [](FsdpOptions& f) { f.wrap_blocks = 3; }},
      {"wrap 2, reshard false, prefetch 2", [](FsdpOptions& f) {
         f.wrap_blocks = 2, f.reshard_after_forward = false, f.prefetch = 2;
       }},
  };
  for (int N : {3, 4})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      const TrainConfig base = fsdp_config(odd4(), N, p);
      const RunResult ref = run_training(base, train_data_parallel);
      for (const Knob& k : knobs) {
        TrainConfig cfg = base;
        k.set(cfg.fsdp);
        SCOPED_TRACE(describe(cfg));
        test::expect_bit_identical(ref, run_training(cfg, train_fsdp), k.what);
      }
    }
}

// --no-sync: every rank adds each micro-step's gradient into its unsharded
// buffer and the sum over ranks comes once, at the end: stage 00's sum over
// ranks of (sum over micro-steps), so its bits at K = 2 and 4, which a
// per-micro-step reduce-scatter cannot give (below).
TEST(FsdpParity, NoSyncIsBitIdenticalAtAnyK) {
  for (int K : {2, 4})
    for (int N : {2, 3})
      for (Precision p : {Precision::fp32, Precision::bf16}) {
        TrainConfig cfg = fsdp_config(test::odd_model(), N, p);
        cfg.grad_accum = K;
        const RunResult ref = run_training(cfg, train_data_parallel);
        cfg.fsdp.no_sync = true;
        SCOPED_TRACE(describe(cfg));
        test::expect_bit_identical(ref, run_training(cfg, train_fsdp), "04 fsdp --no-sync");
      }
}

// Without --no-sync, K = 2: reduce-scatter every micro-step, as stages 02
// and 03, so close to stage 00, not equal (stage_test_util.h's tolerances).
TEST(FsdpParity, GradAccumulationWithoutNoSyncIsClose) {
  test::expect_accumulation_close_to_dp(train_fsdp, "04 fsdp");
}

// --reduce-dtype fp32 under the bf16 recipe: the bf16 gradients are widened
// and summed in float32 without the final rounding to bf16 (comm.h sums bf16
// in float32 and rounds once): each reduced element differs from the bf16
// reduction by at most that one rounding, 2^-9 relative, so the first step's
// gradient norm by at most 2^-9 = 2e-3 relative (measured 1.1e-4 at N = 2,
// 5.2e-5 at N = 8; not 0: the rounding really is skipped), and the losses
// after by AdamW's amplification of such differences (measured max 3.3e-6
// over 3 steps at N = 2, 0 at N = 8; tolerance 5e-3, the bf16 loss's own
// resolution near 5.5 being 2^-6).
TEST(FsdpParity, ReduceDtypeFp32IsWithinOneBf16Rounding) {
  for (int N : {2, 8}) {
    TrainConfig cfg = fsdp_config(test::odd_model(), N, Precision::bf16);
    const RunResult bf = run_training(cfg, train_fsdp);
    cfg.fsdp.reduce_dtype = DType::f32;
    SCOPED_TRACE(describe(cfg));
    const RunResult f32 = run_training(cfg, train_fsdp);
    const double n0 = bf.ranks[0].grad_norms[0], rel = std::fabs(f32.ranks[0].grad_norms[0] - n0) / n0;
    EXPECT_LE(rel, 1.0 / 512);
    EXPECT_NE(f32.ranks[0].param_hash, bf.ranks[0].param_hash) << "fp32 reduction changed nothing";
    EXPECT_EQ(f32.ranks[0].losses[0], bf.ranks[0].losses[0]);  // the initial model's loss
    double worst = 0;
    for (size_t s = 0; s < bf.ranks[0].losses.size(); ++s) {
      worst = std::max(worst, std::fabs(double(f32.ranks[0].losses[s]) - bf.ranks[0].losses[s]));
      EXPECT_NEAR(f32.ranks[0].losses[s], bf.ranks[0].losses[s], 5e-3) << "step " << s;
    }
    for (const auto& r : f32.ranks) EXPECT_EQ(r.param_hash, f32.ranks[0].param_hash);
    if (test::print_measures())
      std::printf("reduce fp32 vs bf16, N=%d: step-0 norm rel diff %.3g, max loss diff %.3g\n", N, rel, worst);
  }
}

// Hybrid sharding at N = 4. S = 1 and S = 4 sum in stage 00's order: its
// bits. S = 2: each gradient element is summed within
// the group, then across the two groups: (r0 + r1) + (r2 + r3) where stage
// 00 sums ((r0 + r1) + r2) + r3. Float addition is not associative, so
// elements can differ in their last bit (one bf16 rounding more in bf16):
// the same order of effect as K > 1's regrouping, and stage_test_util.h's
// tolerances for it apply (measured max |loss difference| over 4 steps: 0 in
// fp32, 2.4e-6 in bf16; tolerances 1e-5 and 5e-4).
// The first step's loss is the initial model's: identical.
TEST(FsdpParity, HybridShardingIsClose) {
  for (int S : {1, 2, 4})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      TrainConfig cfg = fsdp_config(odd4(), 4, p, 4);
      const RunResult ref = run_training(cfg, train_data_parallel);
      cfg.fsdp.shard_group = S;
      SCOPED_TRACE(describe(cfg) + ", shard-group " + std::to_string(S));
      const RunResult got = run_training(cfg, train_fsdp);
      // One group of N (full sharding) or N groups of one (every rank a full
      // replica, all-reduced across): the sum is stage 00's, to the bit.
      if (S == 1 || S == 4) {
        test::expect_bit_identical(ref, got, "fsdp --shard-group 1 or N");
        continue;
      }
      const double tol = p == Precision::fp32 ? test::kAccumTolFp32 : test::kAccumTolBf16;
      double worst = 0;
      for (size_t s = 0; s < ref.ranks[0].losses.size(); ++s) {
        worst = std::max(worst, std::fabs(double(got.ranks[0].losses[s]) - ref.ranks[0].losses[s]));
        EXPECT_NEAR(got.ranks[0].losses[s], ref.ranks[0].losses[s], tol) << "step " << s;
      }
      EXPECT_EQ(got.ranks[0].losses[0], ref.ranks[0].losses[0]);
      for (const auto& r : got.ranks) EXPECT_EQ(r.param_hash, got.ranks[0].param_hash) << "replicas diverged";
      if (test::print_measures())
        std::printf("hsdp S=%d N=4 %s: max |loss - dp loss| %.3g\n", S, precision_name(p), worst);
    }
}

// ------------------------------------------------------------------ memory

// Model states: float32 parameter and gradient shards and AdamW's two
// moments, 4 + 4 + 8 bytes per element of the shard in both recipes (ZeRO-3
// splits the same 16 as 2 + 2 + 12 in bf16), padded per FSDP unit; what
// memory_model.h says for stage 04 with the wrapped units.
TEST(FsdpMemory, ModelStatesAreFloat32Shards) {
  for (int K : {1, 2})
    for (int N : {1, 3, 4, 8})
      for (Precision p : {Precision::fp32, Precision::bf16}) {
        const ModelConfig m = odd4();
        TrainConfig cfg = fsdp_config(m, N, p, 1);
        cfg.fsdp.wrap_blocks = K;
        SCOPED_TRACE(describe(cfg));
        const FlatSizes f = flat_sizes(m, N, K);
        const RunResult run = run_training(cfg, train_fsdp);
        if (K == 1) {
          const ModelStateBytes mm = model_state_bytes(Stage::fsdp, p, padded_sizes(build_layout(m), N));
          EXPECT_EQ(mm.device.total(), double(16 * f.shard));
        }
        for (size_t r = 0; r < run.ranks.size(); ++r) {
          const MemoryCounts& mem = run.ranks[r].memory;
          EXPECT_EQ(mem.cur(Place::device, Category::params), 4 * f.shard) << "rank " << r;
          EXPECT_EQ(mem.cur(Place::device, Category::grads), 4 * f.shard) << "rank " << r;
          EXPECT_EQ(mem.cur(Place::device, Category::optimizer), 8 * f.shard) << "rank " << r;
          EXPECT_EQ(mem.cur(Place::device, Category::comm), 0u) << "rank " << r;
          EXPECT_EQ(mem.cur(Place::device, Category::gathered), 0u) << "rank " << r;
        }
      }
}

// The peak of category gathered (unsharded parameters, e bytes each), from
// the README's schedule, with a_g the padded FSDP units, h the head's:
//   default (D = 1, M = 2): a unit and the one prefetched beside it, the
//     head kept from its forward to its backward: max over g of a_g + a_{g+1}
//   M = 1: no prefetch but the head's (kept, not counted):
//     max(max_g a_g, a_{G-2} + h)
//   M = 0, D = 2: three consecutive units: max over g of a_g + a_{g+1} + a_{g+2}
//   --reshard-after-forward false: every unit, the whole padded model
// and in every case at most M units plus the head.
TEST(FsdpMemory, GatheredPeakFollowsTheLimit) {
  for (int N : {2, 3})
    for (int K : {1, 2})
      for (Precision p : {Precision::fp32, Precision::bf16}) {
        const ModelConfig m = odd4();
        const FlatSizes f = flat_sizes(m, N, K);
        const std::vector<size_t>& a = f.padded;
        const size_t G = a.size(), e = test::esize(p);
        size_t pair = 0, triple = 0, single = 0, largest2 = 0;
        for (size_t g = 0; g + 1 < G; ++g) pair = std::max(pair, a[g] + a[g + 1]);
        for (size_t g = 0; g + 2 < G; ++g) triple = std::max(triple, a[g] + a[g + 1] + a[g + 2]);
        for (size_t g = 0; g < G; ++g) single = std::max(single, a[g]);
        std::vector<size_t> body(a.begin(), a.end() - 1);
        std::sort(body.rbegin(), body.rend());
        largest2 = body[0] + (body.size() > 1 ? body[1] : 0);
        struct Case {
          int D, M;
          bool reshard;
          size_t want;
        };
        for (const Case& c : {Case{1, 2, true, pair}, Case{1, 1, true, std::max(single, a[G - 2] + f.head())},
                              Case{2, 0, true, triple}, Case{1, 2, false, f.total_padded()}}) {
          TrainConfig cfg = fsdp_config(m, N, p, 1);
          cfg.fsdp.wrap_blocks = K, cfg.fsdp.prefetch = c.D, cfg.fsdp.max_gathered = c.M;
          cfg.fsdp.reshard_after_forward = c.reshard;
          SCOPED_TRACE(describe(cfg));
          const RunResult run = run_training(cfg, train_fsdp);
          for (const auto& r : run.ranks) EXPECT_EQ(r.memory.pk(Place::device, Category::gathered), e * c.want);
          if (c.M > 0 && c.reshard) {
            EXPECT_LE(run.ranks[0].memory.pk(Place::device, Category::gathered),
                      e * (c.M == 1 ? single : largest2) + e * f.head());
          }
        }
      }
}

// --no-sync keeps one full gradient in the recipe's dtype, padded, for the
// whole step: exactly e * sum(a_g) more grads bytes, at its peak.
TEST(FsdpMemory, NoSyncAddsOneFullGradient) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const ModelConfig m = odd4();
    const int N = 3;
    TrainConfig cfg = fsdp_config(m, N, p, 1);
    cfg.grad_accum = 2;
    const MemoryCounts plain = run_training(cfg, train_fsdp).ranks[0].memory;
    cfg.fsdp.no_sync = true;
    SCOPED_TRACE(describe(cfg));
    const MemoryCounts ns = run_training(cfg, train_fsdp).ranks[0].memory;
    const size_t full = test::esize(p) * flat_sizes(m, N, 1).total_padded();
    EXPECT_EQ(ns.pk(Place::device, Category::grads), plain.pk(Place::device, Category::grads) + full);
  }
}

// Hybrid sharding: model states 16 bytes per element of a shard over S
// ranks, 16P/S, whatever N.
TEST(FsdpMemory, HybridShardingHolds16POverS) {
  for (int S : {1, 2, 3})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      TrainConfig cfg = fsdp_config(odd4(), 6, p, 1);
      cfg.fsdp.shard_group = S;
      SCOPED_TRACE(describe(cfg) + ", shard-group " + std::to_string(S));
      const size_t shard = flat_sizes(odd4(), S, 1).shard;
      for (const auto& r : run_training(cfg, train_fsdp).ranks)
        EXPECT_EQ(r.memory.model_states(Place::device), 16 * shard);
    }
}

// ------------------------------------------------------------------ communication

// Per micro-step, with a_g the padded units, e the parameter dtype's bytes,
// r the reduce dtype's, f = (N - 1) / N (ring model, comm.h):
//   all_gather      e f (sum a_g + sum over g != head of a_g)   (reshard: the head is kept)
//                   e f sum a_g                                  (no reshard)
//   reduce_scatter  r f sum a_g                                  (--no-sync: the last micro-step only)
// and per step the loss and the norm's all-reduces, as every stage.
// The number of all-gathers: 2G - 1 per micro-step, or G without resharding.
// The FSDP units: one block each at K = 1, two at K = 2 (--wrap-blocks).
TEST(FsdpComm, BytesAndCallsFollowTheUnits) {
  const int steps = 2;
  for (int N : {2, 4})
    for (int K : {1, 2})
      for (Precision p : {Precision::fp32, Precision::bf16})
        for (bool reshard : {true, false})
          for (bool fp32_reduce : {false, true}) {
            if (fp32_reduce && p == Precision::fp32) continue;
            const ModelConfig m = odd4();
            const int wrap = K;  // one and two blocks per unit, with K = 1 and 2
            TrainConfig cfg = fsdp_config(m, N, p, steps);
            cfg.fsdp.wrap_blocks = wrap;
            cfg.grad_accum = K;
            cfg.fsdp.reshard_after_forward = reshard;
            if (fp32_reduce) cfg.fsdp.reduce_dtype = DType::f32;
            SCOPED_TRACE(describe(cfg));
            const FlatSizes fs = flat_sizes(m, N, wrap);
            const double e = double(test::esize(p)), r = fp32_reduce ? 4.0 : e, f = double(N - 1) / N;
            const double sum = double(fs.total_padded()), G = double(fs.padded.size());
            const double ag_per_micro = e * f * (reshard ? 2 * sum - double(fs.head()) : sum);
            const CommStats c = run_training(cfg, train_fsdp).ranks[0].comm;
            test::expect_bytes(c.bytes[int(CollectiveKind::all_gather)], steps * K * ag_per_micro, "all_gather");
            test::expect_bytes(c.bytes[int(CollectiveKind::reduce_scatter)], steps * K * r * f * sum,
                               "reduce_scatter");
            EXPECT_EQ(c.calls[int(CollectiveKind::all_gather)], uint64_t(steps * K * (reshard ? 2 * G - 1 : G)));
            EXPECT_EQ(c.calls[int(CollectiveKind::reduce_scatter)], uint64_t(steps * K * G));
            test::expect_bytes(c.bytes[int(CollectiveKind::all_reduce)], steps * 2 * f * (4 + 8 * 20), "loss, norm");
          }
}

// Hybrid sharding, N ranks in N/S groups of S (W = N/S replicas of each
// shard): all-gathers and reduce-scatters are the formulas above over S
// ranks (f_S = (S - 1)/S, units padded to multiples of S), and each reduced
// piece is all-reduced across the W groups: 2 (W - 1)/W r sum_g ceil(n_g / S)
// per micro-step, counted apart (comm_cross_group) and in the total. The
// norm's accumulator is all-reduced within the group, the loss over all N.
TEST(FsdpComm, HybridShardingSplitsIntraAndInterGroupBytes) {
  const int steps = 2, N = 4;
  for (int S : {1, 2})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      TrainConfig cfg = fsdp_config(odd4(), N, p, steps);
      cfg.fsdp.shard_group = S;
      SCOPED_TRACE(describe(cfg) + ", shard-group " + std::to_string(S));
      const FlatSizes fs = flat_sizes(odd4(), S, 1);
      const double e = double(test::esize(p)), fS = double(S - 1) / S, W = double(N) / S;
      const double sum = double(fs.total_padded());
      const double across = 2 * (W - 1) / W * e * double(fs.shard);
      const RunResult run = run_training(cfg, train_fsdp);
      for (const auto& r : run.ranks) {
        const CommStats& c = r.comm;
        test::expect_bytes(c.bytes[int(CollectiveKind::all_gather)], steps * e * fS * (2 * sum - double(fs.head())),
                           "all_gather");
        test::expect_bytes(c.bytes[int(CollectiveKind::reduce_scatter)], steps * e * fS * sum, "reduce_scatter");
        test::expect_bytes(r.comm_cross_group.bytes[int(CollectiveKind::all_reduce)], steps * across, "across");
        const double scalars = 2 * double(N - 1) / N * 4 + 2 * fS * 8 * 20;  // loss over N, norm within the group
        test::expect_bytes(c.bytes[int(CollectiveKind::all_reduce)], steps * (across + scalars), "all_reduce");
        EXPECT_EQ(r.comm_cross_group.calls[int(CollectiveKind::all_reduce)],
                  uint64_t(S < N ? steps * fs.padded.size() : 0));
      }
    }
}

// Recomputation needs no parameters but those the backward already has:
// --recompute full and attn issue exactly the all-gathers (and bytes) of
// none (a known FSDP pitfall is a checkpointed block whose recomputed
// forward unshards its parameters again), keep stage 00's bits, and hold
// the activations stage 00 holds in the same mode (test_recompute.cpp checks
// those against the formula).
TEST(FsdpComm, RecomputationAddsNoAllGather) {
  for (bool reshard : {true, false}) {
    TrainConfig cfg = fsdp_config(odd4(), 3, Precision::bf16, 2);
    cfg.fsdp.reshard_after_forward = reshard;
    const RunResult none = run_training(cfg, train_fsdp);
    for (Recompute mode : {Recompute::full, Recompute::attn}) {
      cfg.recompute = mode;
      SCOPED_TRACE(describe(cfg) + ", recompute " + recompute_name(mode));
      const RunResult got = run_training(cfg, train_fsdp), dp = run_training(cfg, train_data_parallel);
      EXPECT_EQ(got.ranks[0].comm.calls, none.ranks[0].comm.calls);
      EXPECT_EQ(got.ranks[0].comm.bytes, none.ranks[0].comm.bytes);
      test::expect_bit_identical(none, got, "recompute");
      EXPECT_EQ(got.ranks[0].memory.pk(Place::device, Category::activations),
                dp.ranks[0].memory.pk(Place::device, Category::activations));
      EXPECT_LT(got.ranks[0].memory.pk(Place::device, Category::activations),
                none.ranks[0].memory.pk(Place::device, Category::activations));
    }
  }
}

// --no-sync: one reduce-scatter of every unit per step, whatever K.
TEST(FsdpComm, NoSyncReducesOncePerStep) {
  const ModelConfig m = odd4();
  const int N = 3, steps = 2;
  for (int K : {2, 4}) {
    TrainConfig cfg = fsdp_config(m, N, Precision::bf16, steps);
    cfg.grad_accum = K;
    cfg.fsdp.no_sync = true;
    SCOPED_TRACE(describe(cfg));
    const FlatSizes fs = flat_sizes(m, N, 1);
    const CommStats c = run_training(cfg, train_fsdp).ranks[0].comm;
    EXPECT_EQ(c.calls[int(CollectiveKind::reduce_scatter)], uint64_t(steps * fs.padded.size()));
    test::expect_bytes(c.bytes[int(CollectiveKind::reduce_scatter)],
                       steps * 2.0 * double(N - 1) / N * double(fs.total_padded()), "reduce_scatter");
  }
}

// ------------------------------------------------------------------ schedule

using Ev = ScheduleEvent;

// FSDP under the schedule recorder (schedule_util.h), default knobs, on the
// four schedule cases; with --wrap-blocks 1 its units are the model's.
class FsdpSchedule : public test::StageSchedule {
 protected:
  FsdpSchedule() : StageSchedule("fsdp", train_fsdp) {}
};

TEST_P(FsdpSchedule, LogIsConsistent) { test::expect_consistent_log(run()); }

// Overlap by order, not by clock: on every micro-step, unit u+1's all-gather
// is issued before unit u's forward begins and waited for only after it has
// ended (with the delay cases, it is really in flight then); in backward,
// unit u-1's before unit u's backward begins, likewise, in reverse order;
// the head is gathered once, in forward, and its backward uses it as it is.
TEST_P(FsdpSchedule, PrefetchesAheadAndKeepsTheHead) {
  const int K = GetParam().K;
  const test::Units us = units();
  const int U = us.U, G = 2 * U - 1;
  for_each_rank_step([&](const test::RankSchedule& s, int step) {
    for (int k = 0; k < K; ++k) {
      const test::Window w = s.micro(step, k);
      std::vector<const test::Collective*> gathers, grads;
      for (const test::Collective* x : s.issued_in(w)) {
        if (x->kind == CollectiveKind::all_gather && int(gathers.size()) < G) gathers.push_back(x);
        if (x->kind == CollectiveKind::reduce_scatter) grads.push_back(x);
      }
      ASSERT_EQ(int(gathers.size()), G) << "2U - 1 all-gathers: the head's backward needs none";
      ASSERT_EQ(int(grads.size()), U);
      auto fwd = [&](int u) -> const test::Collective& { return *gathers[u]; };
      auto bwd = [&](int u) -> const test::Collective& { return *gathers[U + (U - 2 - u)]; };  // u < U - 1
      for (int u = 0; u < U; ++u) {
        EXPECT_TRUE(fwd(u).is(CollectiveKind::all_gather, us.dt, us.S[u])) << describe(fwd(u));
        if (u < U - 1) EXPECT_TRUE(bwd(u).is(CollectiveKind::all_gather, us.dt, us.S[u])) << describe(bwd(u));
        EXPECT_TRUE(grads[U - 1 - u]->is(CollectiveKind::reduce_scatter, us.dt, us.S[u]));
      }
      for (int u = 0; u + 1 < U; ++u) {
        const uint64_t fb = s.at(Ev::forward_begin, u, w), fe = s.at(Ev::forward_end, u, w);
        EXPECT_LT(fwd(u + 1).issued, fb) << "unit " << u + 1 << " not issued before unit " << u << "'s forward";
        EXPECT_GT(fwd(u + 1).first_wait(), fe) << "unit " << u + 1 << " waited for during unit " << u
                                               << "'s forward";
      }
      // The head's backward begins with nothing gathered for it.
      const uint64_t hb = s.at(Ev::backward_begin, U - 1, w);
      EXPECT_LT(bwd(U - 2).issued, hb) << "unit " << U - 2 << " not prefetched before the head's backward";
      for (int u = U - 1; u >= 1; --u) {
        const uint64_t bb = s.at(Ev::backward_begin, u, w), be = s.at(Ev::backward_end, u, w);
        EXPECT_LT(bwd(u - 1).issued, bb) << "unit " << u - 1 << " not issued before unit " << u << "'s backward";
        EXPECT_GT(bwd(u - 1).first_wait(), be) << "unit " << u - 1 << " waited for during unit " << u
                                               << "'s backward";
        if (u < U - 1) EXPECT_GT(bwd(u - 1).issued, bwd(u).issued) << "backward prefetch in reverse order";
      }
      test::expect_overlaps_backward(s, w, grads, us);
    }
  });
}

// Per step: U·K reduce-scatters, (2U - 1)·K all-gathers, the loss and the norm.
// The two queues: the all-gathers go through the stage's communicator
// (queue 0), the reduce-scatters through the one split from it (queue 1),
// and with the delay cases an all-gather (a prefetch) is issued on queue 0
// while a reduce-scatter is in flight on queue 1: both in flight at once.
TEST_P(FsdpSchedule, AllGathersAndReduceScattersTravelOnTwoQueues) {
  for (int r = 0; r < GetParam().N; ++r) {
    std::vector<const ScheduleEvent*> issued;
    std::map<uint64_t, uint64_t> completed;  // id -> seq
    for (const ScheduleEvent& e : run().events[r]) {
      if (e.kind == Ev::completed) completed[e.id] = e.seq;
      if (e.kind != Ev::issued) continue;
      if (e.collective == CollectiveKind::all_gather) issued.push_back(&e);
      if (e.collective == CollectiveKind::reduce_scatter) {
        EXPECT_EQ(e.queue, 1) << describe(e);
        issued.push_back(&e);
      }
    }
    bool overtaken = false;
    for (const ScheduleEvent* rs : issued) {
      if (rs->collective != CollectiveKind::reduce_scatter) continue;
      for (const ScheduleEvent* ag : issued)
        if (ag->collective == CollectiveKind::all_gather && ag->queue == 0 && ag->seq > rs->seq &&
            ag->seq < completed[rs->id])
          overtaken = true;
    }
    if (GetParam().delay_us > 0)
      EXPECT_TRUE(overtaken) << "rank " << r << ": no all-gather issued while a reduce-scatter was in flight";
  }
}

TEST_P(FsdpSchedule, CollectiveCountsPerStep) {
  const int U = units().U, K = GetParam().K;
  test::expect_collective_counts(run(), GetParam(),
                                 {.reduce_scatter = U * K, .all_gather = (2 * U - 1) * K, .loss = 1, .norm = 1},
                                 /*final_gather=*/true);
}

INSTANTIATE_TEST_SUITE_P(Cases, FsdpSchedule, ::testing::ValuesIn(test::schedule_cases()), test::schedule_case_name);

TEST(FsdpRecorder, ChangesNoResult) { test::expect_recorder_changes_no_result(train_fsdp); }

// ------------------------------------------------------------------ flags

TrainConfig parse(std::vector<std::string> args, StageFlags flags = StageFlags::fsdp) {
  args.insert(args.begin(), "fsdp");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return *parse_flags(int(argv.size()), argv.data(), {"fsdp", "stage 04: FSDP", flags});
}

std::string usage_error(std::vector<std::string> args, StageFlags flags = StageFlags::fsdp) {
  try {
    parse(std::move(args), flags);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FsdpFlags, ParsedWithTheirDefaults) {
  const TrainConfig d = parse({});
  EXPECT_EQ(d.fsdp.wrap_blocks, 1);
  EXPECT_TRUE(d.fsdp.reshard_after_forward);
  EXPECT_EQ(d.fsdp.prefetch, 1);
  EXPECT_EQ(d.fsdp.max_gathered, 2);
  EXPECT_FALSE(d.fsdp.reduce_dtype.has_value());
  EXPECT_FALSE(d.fsdp.no_sync);
  const TrainConfig c = parse({"--model", "tiny", "--wrap-blocks", "2", "--reshard-after-forward", "false",
                               "--prefetch", "0", "--max-gathered", "0", "--precision", "bf16", "--reduce-dtype",
                               "fp32", "--grad-accum", "2", "--no-sync", "--shard-group", "2"});
  EXPECT_EQ(c.fsdp.wrap_blocks, 2);
  EXPECT_FALSE(c.fsdp.reshard_after_forward);
  EXPECT_EQ(c.fsdp.prefetch, 0);
  EXPECT_EQ(c.fsdp.max_gathered, 0);
  EXPECT_EQ(c.fsdp.reduce_dtype, DType::f32);
  EXPECT_TRUE(c.fsdp.no_sync);
  EXPECT_EQ(c.fsdp.shard_group, 2);
}

TEST(FsdpFlags, OtherStagesRefuseThemNamingStage04) {
  for (std::vector<std::string> a : {std::vector<std::string>{"--wrap-blocks", "2"}, {"--no-sync"},
                                     {"--reshard-after-forward", "false"}, {"--prefetch", "0"},
                                     {"--max-gathered", "1"}, {"--reduce-dtype", "fp32"}, {"--shard-group", "2"}}) {
    const std::string msg = usage_error(a, StageFlags::none);
    EXPECT_NE(msg.find(a[0] + " is a flag of stage 04"), std::string::npos) << msg;
    EXPECT_NE(msg.find("build/04_fsdp/fsdp"), std::string::npos) << msg;
  }
}

TEST(FsdpFlags, BadValuesSayWhatIsAccepted) {
  auto has = [](const std::string& msg, const char* what) { return msg.find(what) != std::string::npos; };
  EXPECT_TRUE(has(usage_error({"--model", "tiny", "--wrap-blocks", "3"}), "between 1 and the model's 2 blocks"));
  EXPECT_TRUE(has(usage_error({"--wrap-blocks", "0"}), "--wrap-blocks must be between 1"));
  EXPECT_TRUE(has(usage_error({"--reshard-after-forward", "yes"}), "must be true or false (got 'yes')"));
  EXPECT_TRUE(has(usage_error({"--prefetch", "-1"}), "--prefetch must be 0"));
  EXPECT_TRUE(has(usage_error({"--max-gathered", "-2"}), "--max-gathered must be 0"));
  EXPECT_TRUE(has(usage_error({"--reduce-dtype", "fp16"}), "bf16 or fp32 (got 'fp16')"));
  EXPECT_TRUE(has(usage_error({"--reduce-dtype", "bf16"}), "needs --precision bf16"));
  EXPECT_TRUE(has(usage_error({"--no-sync"}), "--grad-accum is 1"));
  EXPECT_TRUE(has(usage_error({"--shard-group", "-1"}), "--shard-group must be a number of ranks"));
}

// S must divide N, which is known only once the launcher has said how many
// ranks there are: checked before any rank starts, naming the divisors.
TEST(FsdpFlags, ShardGroupMustDivideTheRanks) {
  TrainConfig cfg = parse({"--shard-group", "3"});
  try {
    validate_for_world(cfg, 4);
    ADD_FAILURE() << "--shard-group 3 at N = 4 accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("must divide the 4 ranks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("use one of 1, 2, 4"), std::string::npos) << e.what();
  }
  cfg.fsdp.shard_group = 2;
  EXPECT_NO_THROW(validate_for_world(cfg, 4));
  cfg.fsdp.shard_group = 0;
  EXPECT_NO_THROW(validate_for_world(cfg, 3));
}

// ------------------------------------------------------------------ gradient, checkpoints

TEST(FsdpGradient, MatchesTheReference) { test::expect_gradient_matches_reference("fsdp", train_fsdp); }

// --reduce-dtype fp32 is closer to the exact gradient: at N = 8 (bf16
// recipe, tiny, one step, G = 16 sequences), the gradient read back from
// AdamW's first moment (gradient_check.h says how) against the
// double-precision reference of the same initial model and batch. Both
// runs round each rank's gradient to bf16 alike; the bf16 reduction also
// rounds each sum to bf16, which the fp32 reduction does not, so its error
// (the L2 norm of got - reference over the whole model) is smaller:
// measured 1.95e-3 against 5.16e-3.
TEST(FsdpGradient, Fp32ReductionIsCloserToTheReference) {
  const test::GradientShared& shared = test::gradient_shared();
  const test::Reference& R = test::gradient_references().bf16;
  const double one_minus_beta1 = double(1.0f - 0.9f);
  const int N = 8, G = N * test::kGradBatch;
  auto error = [&](std::optional<DType> reduce) {
    TrainConfig cfg = test::quiet_config("tiny", N, test::kGradBatch, 1);
    cfg.clip = 0.0f;
    cfg.precision = Precision::bf16;
    cfg.fsdp.reduce_dtype = reduce;
    cfg.save = shared.dir + "/fsdp_reduce.safetensors";
    run_training(cfg, train_fsdp);
    const ref::Params m = test::read_params(cfg.save, "optim.m.");
    double sq = 0.0;
    for (const auto& [name, shape] : ref::parameter_shapes(test::tiny_shape())) {
      const std::vector<double>& want = R.grad.at(G).at(name);
      for (size_t i = 0; i < want.size(); ++i) {
        const double d = m.at(name)[i] / one_minus_beta1 - want[i];
        sq += d * d;
      }
    }
    return std::sqrt(sq);
  };
  const double bf16_err = error(std::nullopt), fp32_err = error(DType::f32);
  EXPECT_LT(fp32_err, bf16_err);
  if (test::print_measures())
    std::printf("N=8 gradient error against the reference: bf16 reduction %.4g, fp32 reduction %.4g\n", bf16_err,
                fp32_err);
}

class FsdpCheckpoint : public test::TempDirTest {};

TEST_F(FsdpCheckpoint, ResumeContinuesBitForBit) { test::expect_resume_continues_bit_for_bit(train_fsdp, dir_); }

TEST_F(FsdpCheckpoint, InitStartsFromTheFile) { test::expect_init_starts_from_the_file(train_fsdp, dir_); }

TEST_F(FsdpCheckpoint, SaveEveryKeepsWorkWhenARankFails) {
  test::expect_save_every_keeps_work_when_a_rank_fails(train_fsdp, dir_);
}

TEST_F(FsdpCheckpoint, SavingIsNotCountedAsTrainingTraffic) {
  test::expect_saving_is_not_counted_as_training_traffic(train_fsdp, dir_);
}

// A checkpoint written with three blocks per unit holds stage 00's values
// under stage 00's names: the flat units are written by their parameters.
TEST_F(FsdpCheckpoint, WrappedUnitsSaveWhatDataParallelSaves) {
  const ModelLayout layout = build_layout(odd4());
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    TrainConfig cfg = fsdp_config(odd4(), 3, p, 2);
    cfg.save = dir_ + "/dp.safetensors";
    run_training(cfg, train_data_parallel);
    cfg.save = dir_ + "/fsdp.safetensors";
    cfg.fsdp.wrap_blocks = 3;
    run_training(cfg, train_fsdp);
    const CheckpointReader dp(dir_ + "/dp.safetensors", layout), fsdp(dir_ + "/fsdp.safetensors", layout);
    EXPECT_EQ(fsdp.step(), 2);
    for (StateKind kind : {StateKind::params, StateKind::m, StateKind::v}) {
      std::vector<float> a(layout.numel), b(layout.numel);
      dp.read_all(kind, a.data());
      fsdp.read_all(kind, b.data());
      EXPECT_EQ(a, b) << precision_name(p) << ", state " << int(kind);
    }
  }
}

}  // namespace
}  // namespace zf
