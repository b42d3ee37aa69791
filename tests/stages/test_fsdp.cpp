// test_fsdp.cpp: stage 04 (FSDP) against stage 00 and against the formulas
// of 04_fsdp/README.md, computed here from the unit sizes.
//
//   parity         bit for bit with stage 00 at K = 1 for every knob
//                  (--wrap-blocks, --reshard-after-forward, --prefetch,
//                  --max-gathered), N = 1 .. 8, both recipes; --no-sync at
//                  K = 2 and 4; within the accumulation tolerance without it;
//                  --reduce-dtype fp32 within a bf16 rounding; hybrid sharding
//                  bit for bit with stage 00 adding in its two hops
//   memory         model states 4S + 4S + 8S in both recipes (S: the shard
//                  of the FSDP units); the gathered-parameter peak for each
//                  limit; without resharding, the whole model; --no-sync's
//                  one full gradient; 16P/F; the comm peak for each recipe,
//                  reduce dtype and mode
//   communication  bytes per collective and all-gathers per step, for each mode
//
// test_fsdp_schedule.cpp has the rest of the suite: the schedule, the flags,
// the gradient and the checkpoints.
//
//   meson test -C build fsdp                                # all of them
//   build/tests/test_fsdp --gtest_filter='FsdpMemory.*'    # one group
//
// ZF_TEST_PRINT=1 prints the measured values beside their tolerances.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "data_parallel.h"
#include "fsdp.h"
#include "launch.h"
#include "memory_model.h"
#include "stages/fsdp_test_util.h"
#include "stages/stage_test_util.h"
#include "stages/validation_checks.h"
#include "test_util.h"

namespace zf {
namespace {

using namespace fsdp_test;

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
      TrainConfig base = fsdp_config(odd4(), N, p);
      base.val_every = 1;  // the held-out loss after every step, bit-identical too
      const RunResult ref = run_training(base, train_data_parallel);
      for (const Knob& k : knobs) {
        TrainConfig cfg = base;
        k.set(cfg.fsdp);
        SCOPED_TRACE(describe(cfg));
        const RunResult got = run_training(cfg, train_fsdp);
        test::expect_bit_identical(ref, got, k.what);
        // An evaluation has no backward: the units its forward kept (the
        // head; every unit without resharding) are resharded after it.
        for (const auto& r : got.ranks) EXPECT_EQ(r.memory.cur(Place::device, Category::gathered), 0u) << k.what;
      }
    }
}

// --val-every changes nothing of training and counts its collectives apart
// (stage_test_util.h; the bytes are FSDP's flat units', checked above by value).
TEST(FsdpParity, ValidationIsApart) { test::expect_validation_is_apart(train_fsdp, -1); }

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
// gradient norm by at most 2^-9 = 2e-3 relative (and the parameters differ:
// the rounding really is skipped), and the losses after by AdamW's
// amplification of such differences (tolerance 5e-3, the bf16 loss's own
// resolution near 5.5 being 2^-6). ZF_TEST_PRINT=1 prints the measured values.
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

// Hybrid sharding at N = 4. F = 1 and F = 4 sum in stage 00's order: its
// bits. F = 2: each gradient element is summed within the group, then
// across the two groups: (r0 + r1) + (r2 + r3) where stage 00 sums
// ((r0 + r1) + r2) + r3. Float addition is not associative, so elements can
// differ in their last bit (one bf16 rounding more in bf16): the same order
// of effect as K > 1's regrouping, and stage_test_util.h's tolerances for
// it apply. The first step's loss is the initial model's: identical.
// (HybridShardingIsStage00InTwoHops below is the exact check.)
TEST(FsdpParity, HybridShardingIsClose) {
  for (int F : {1, 2, 4})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      TrainConfig cfg = fsdp_config(odd4(), 4, p, 4);
      const RunResult ref = run_training(cfg, train_data_parallel);
      cfg.fsdp.shard_group = F;
      SCOPED_TRACE(describe(cfg) + ", shard-group " + std::to_string(F));
      const RunResult got = run_training(cfg, train_fsdp);
      // One group of N (full sharding) or N groups of one (every rank a full
      // replica, all-reduced across): the sum is stage 00's, to the bit.
      if (F == 1 || F == 4) {
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
        std::printf("hsdp F=%d N=4 %s: max |loss - dp loss| %.3g\n", F, precision_name(p), worst);
    }
}

// Hybrid sharding, bit for bit: stage 00 whose all-reduce adds in the same
// two hops (fsdp_test_util.h, adding_in_two_hops) gives the same losses,
// norms and final parameters, for groups of 2 and 3, in both recipes.
// Groups of strided ranks would add the same numbers in another order.
TEST(FsdpParity, HybridShardingIsStage00InTwoHops) {
  for (auto [N, F] : {std::pair{4, 2}, std::pair{6, 3}, std::pair{6, 2}})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      TrainConfig cfg = fsdp_config(odd4(), N, p, 3);
      const RunResult ref = run_training(cfg, adding_in_two_hops(train_data_parallel, F));
      if (N == 4 && F == 2 && p == Precision::bf16) {  // the two orders differ here: the reference is not stage 00
        EXPECT_NE(ref.ranks[0].param_hash, run_training(cfg, train_data_parallel).ranks[0].param_hash);
      }
      cfg.fsdp.shard_group = F;
      SCOPED_TRACE(describe(cfg) + ", shard-group " + std::to_string(F));
      test::expect_bit_identical(ref, run_training(cfg, train_fsdp), "fsdp --shard-group");
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

// The peak of category comm, exactly fsdp_test::comm_peak (the README's
// schedule of the communication buffers), for each recipe and reduce dtype,
// with and without resharding, with --no-sync, and within a shard group of
// hybrid sharding (my pieces copied out for the all-reduce). Nothing
// is left in comm after a run, and nothing is on the host.
TEST(FsdpMemory, CommPeakIsTheReadmeSchedule) {
  for (const PeakMode& mode : {PeakMode{"default"}, PeakMode{"no reshard", false}, PeakMode{"no-sync", true, true},
                               PeakMode{"fp32 reduce", true, false, true}, PeakMode{"no-sync, fp32 reduce", true, true, true},
                               PeakMode{"hybrid", true, false, false, 2}})
    for (int N : {2, 3, 4})
      for (int wrap : {1, 2})
        for (Precision p : {Precision::fp32, Precision::bf16}) {
          if (!mode.applies(N, p)) continue;
          const TrainConfig cfg = mode.config(N, p, wrap);
          SCOPED_TRACE(describe(cfg) + ", " + mode.name);
          const int group = mode.group(N);
          const size_t cast = p == Precision::bf16 ? 2 : 0;
          const size_t want = comm_peak(flat_sizes(odd4(), group, wrap), group, mode.peak_case(p, cast, false));
          const RunResult run = run_training(cfg, train_fsdp);
          for (size_t r = 0; r < run.ranks.size(); ++r) {
            const MemoryCounts& m = run.ranks[r].memory;
            EXPECT_EQ(m.pk(Place::device, Category::comm), want) << "rank " << r;
            EXPECT_EQ(m.cur(Place::device, Category::comm), 0u) << "rank " << r;
            EXPECT_EQ(m.pk(Place::host, Category::comm), 0u) << "rank " << r;
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

// Hybrid sharding: model states 16 bytes per element of a shard over F
// ranks, 16P/F, whatever N.
TEST(FsdpMemory, HybridShardingHolds16POverF) {
  for (int F : {1, 2, 3})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      TrainConfig cfg = fsdp_config(odd4(), 6, p, 1);
      cfg.fsdp.shard_group = F;
      SCOPED_TRACE(describe(cfg) + ", shard-group " + std::to_string(F));
      const size_t shard = flat_sizes(odd4(), F, 1).shard;
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

// Hybrid sharding, N ranks in N/F groups of F (R = N/F replicas of each
// shard): all-gathers and reduce-scatters are the formulas above over F
// ranks (f_F = (F - 1)/F, units padded to multiples of F), and each reduced
// piece is all-reduced across the R groups: 2 (R - 1)/R r sum_g ceil(n_g / F)
// per micro-step, counted apart (comm_cross_group) and in the total. The
// norm's accumulator is all-reduced within the group, the loss over all N.
TEST(FsdpComm, HybridShardingSplitsIntraAndInterGroupBytes) {
  const int steps = 2, N = 4;
  for (int F : {1, 2})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      TrainConfig cfg = fsdp_config(odd4(), N, p, steps);
      cfg.fsdp.shard_group = F;
      SCOPED_TRACE(describe(cfg) + ", shard-group " + std::to_string(F));
      const FlatSizes fs = flat_sizes(odd4(), F, 1);
      const double e = double(test::esize(p)), fF = double(F - 1) / F, R = double(N) / F;
      const double sum = double(fs.total_padded());
      const double across = 2 * (R - 1) / R * e * double(fs.shard);
      const RunResult run = run_training(cfg, train_fsdp);
      for (const auto& r : run.ranks) {
        const CommStats& c = r.comm;
        test::expect_bytes(c.bytes[int(CollectiveKind::all_gather)], steps * e * fF * (2 * sum - double(fs.head())),
                           "all_gather");
        test::expect_bytes(c.bytes[int(CollectiveKind::reduce_scatter)], steps * e * fF * sum, "reduce_scatter");
        test::expect_bytes(r.comm_cross_group.bytes[int(CollectiveKind::all_reduce)], steps * across, "across");
        const double scalars = 2 * double(N - 1) / N * 4 + 2 * fF * 8 * 20;  // loss over N, norm within the group
        test::expect_bytes(c.bytes[int(CollectiveKind::all_reduce)], steps * (across + scalars), "all_reduce");
        EXPECT_EQ(r.comm_cross_group.calls[int(CollectiveKind::all_reduce)],
                  uint64_t(F < N ? steps * fs.padded.size() : 0));
      }
    }
}

// Hybrid sharding's placement, pinned: each shard group is F consecutive
// ranks, and the replicas of a shard (the all-reduce across groups) are the
// ranks with the same place in theirs, r % F, r % F + F, ... (HSDP's
// device mesh: groups inside a node). Read back by all-gathering each
// rank's world rank over the two communicators; strided groups would add
// the same numbers in another order and pass every tolerance.
TEST(FsdpComm, HybridGroupsAreConsecutiveRanks) {
  for (auto [N, F] : {std::pair{4, 2}, std::pair{6, 3}, std::pair{6, 2}}) {
    std::vector<std::vector<float>> group(N), across(N);
    LaunchOptions opt;
    opt.ranks = N;
    run_ranks(opt, [&, F = F](RankContext& ctx) {
      FsdpComms comms(ctx.comm, F);
      const float me = float(ctx.rank);
      group[ctx.rank].resize(size_t(comms.group->size()));
      across[ctx.rank].resize(size_t(comms.replicate->size()));
      comms.group->all_gather(&me, group[ctx.rank].data(), 1, DType::f32);
      comms.replicate->all_gather(&me, across[ctx.rank].data(), 1, DType::f32);
    });
    for (int r = 0; r < N; ++r) {
      std::vector<float> g, a;
      for (int j = 0; j < F; ++j) g.push_back(float(r / F * F + j));
      for (int k = 0; k < N / F; ++k) a.push_back(float(r % F + k * F));
      EXPECT_EQ(group[r], g) << "N " << N << ", F " << F << ", rank " << r << "'s shard group";
      EXPECT_EQ(across[r], a) << "N " << N << ", F " << F << ", rank " << r << "'s replicas";
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

}  // namespace
}  // namespace zf
