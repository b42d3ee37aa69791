// test_zero3.cpp: stage 03 (03_zero3/, `zero3`, ZeRO-3: the optimizer state,
// the gradients and the parameters sharded) is right, measured against
// stage 00 and docs/SPEC.md. Here:
//   - parity: stage 00's losses, gradient norms and final parameters to the
//     bit at K = 1, with padding and clipping; with gradient accumulation
//     (K = 2, a reduce-scatter every micro-step) within float rounding;
//   - memory: the model states e S + e S + o S = 16P/N per rank (plus
//     padding), a peak below ZeRO-2's, gathered units and gradient buffers
//     within their bound, and a device budget it fits where stage 00 does not;
//   - communication: per micro-step a reduce-scatter and two all-gathers of
//     the padded model (1.5 times stage 00's bytes), and the norm's all-reduce;
//   - schedule: each unit gathered one unit ahead in the forward and the
//     backward, the reduce-scatters overlapping the backward, the gathered
//     and comm peaks the README's (Zero3Schedule);
//   - the gradient's value against a double-precision reference;
//   - checkpoints: resume bit for bit, --save-every, saving uncounted.
//
//   meson test -C build zero3                                # every test of stage 03
//   build/tests/test_zero3 --gtest_filter='*Zero3Schedule*'  # one group of them
//   build/tests/test_zero3 --gtest_list_tests                # their names
//
// ZF_TEST_PRINT=1 prints the measured values beside their tolerances.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "comm.h"
#include "stages/schedule_util.h"
#include "stages/gradient_check.h"
#include "stages/stage_test_util.h"
#include "stages/validation_checks.h"
#include "test_util.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

using Ev = ScheduleEvent;

// ------------------------------------------------------------------ parity with stage 00

class Zero3BitParity : public ::testing::TestWithParam<test::ParityCase> {};

// K = 1, both recipes, clip norms 1 and 0.05 (stage_test_util.h says why
// the bits are the same).
TEST_P(Zero3BitParity, BitIdenticalToDataParallel) {
  test::expect_bit_identical_to_dp(GetParam(), train_zero3, "03 zero3");
}

INSTANTIATE_TEST_SUITE_P(Ranks, Zero3BitParity, ::testing::ValuesIn(test::parity_cases()), test::parity_case_name);

TEST(Zero3Parity, ClippingBites) { test::expect_clipping_bites(train_zero3); }

// --val-every changes nothing of training and counts its collectives apart;
// each unit is all-gathered once per held-out batch, as in the forward, and never for a backward.
TEST(Zero3Parity, ValidationIsApart) { test::expect_validation_is_apart(train_zero3, 1); }

TEST(Zero3Parity, RunLogCarriesTheGradNorm) { test::expect_run_log_carries_the_grad_norm(train_zero3); }

// K = 2: ZeRO-3 reduce-scatters every micro-step and accumulates the reduced
// pieces, sum over micro-steps of (sum over ranks): other additions than
// stage 00's, so close to its losses, not equal (stage_test_util.h gives
// the tolerances).
TEST(Zero3Parity, GradAccumulation) { test::expect_accumulation_close_to_dp(train_zero3, "03 zero3"); }

// ------------------------------------------------------------------ memory

TEST(Zero3Memory, ModelStatesMatchSpecFormulas) { test::expect_model_states_match_formulas(Stage::zero3, train_zero3); }

TEST(Zero3Memory, PeakBelowZero2) { test::expect_peak_below(train_zero2, "02 zero2", train_zero3, "03 zero3"); }

// ZeRO-3's temporary buffers, from zero3.cpp, sharded_grads.cpp and
// gathered_params.cpp. G is the largest padded unit (N * S_u elements):
//   - gathered parameters (category gathered): while unit u computes, the
//     next one is prefetched: kZero3MaxGatheredUnits = 2 units, 2G.
//   - gradients (category comm, ShardedGradients as in ZeRO-2): the unit
//     whose backward runs has a full buffer (G); the unit whose backward
//     finished just before is still being reduce-scattered, in place, in its
//     full buffer (G). In reduce_unit(u) two units are in flight for a
//     moment before the older one completes: at most 2G.
size_t zero3_buffers_bound(const test::Sizes& s, Precision p) {
  return (kZero3MaxGatheredUnits * s.max_padded_unit + 2 * s.max_padded_unit) * test::esize(p);
}

TEST(Zero3Memory, GatheredAndCommBuffersAreBounded) {
  test::for_each_comm_buffer_case(train_zero3, [](const test::Sizes& s, const TrainConfig& cfg, const RunResult& run) {
    const size_t e = test::esize(cfg.precision), G = s.max_padded_unit;
    for (const auto& r : run.ranks) {
      const size_t gathered = r.memory.pk(Place::device, Category::gathered);
      const size_t comm = r.memory.pk(Place::device, Category::comm);
      EXPECT_LE(gathered, kZero3MaxGatheredUnits * G * e);
      EXPECT_LE(comm, 2 * G * e);
      // And the prefetch really overlaps: units 0 and 1 gathered at once in
      // the forward; in the head's backward, the head and the block before
      // it gathered, and the head's gradient buffer.
      const auto& g = s.unit_padded;
      const size_t U = g.size();
      EXPECT_GE(gathered, std::max(g[0] + g[1], g[U - 1] + g[U - 2]) * e);
      EXPECT_GE(comm, g[U - 1] * e);
      if (test::print_measures())
        std::printf("zero3 buffer peaks %s N=%d %s: gathered %zu, comm %zu bytes; 2G = %zu\n",
                    cfg.model.name.c_str(), cfg.ranks, precision_name(cfg.precision), gathered, comm, 2 * G * e);
    }
  });
}

TEST(Zero3Budget, FitsWhereDataParallelDoesNot) {
  const int N = 4;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    TrainConfig cfg = test::config(model_preset("tiny"), N, 1, 3, p);
    SCOPED_TRACE(test::describe(cfg));
    const test::Sizes s = test::sizes_of(cfg.model, N);
    // A first, unconstrained run measures what is not model state
    // (activations and the bf16 widening workspaces): the same in every stage.
    const RunResult free_run = run_training(cfg, train_data_parallel);
    const MemoryCounts& fm = free_run.ranks[0].memory;
    ASSERT_EQ(fm.pk(Place::device, Category::comm), 0u);  // stage 00 reduces in place
    const size_t other = fm.pk(Place::device, Category::activations) + fm.pk(Place::device, Category::workspace);
    auto states = [&](Stage st) {
      const test::States x = test::expected_states(st, p, s);
      return x.params + x.grads + x.optimizer;
    };
    // Upper bounds of what each stage needs at its peak.
    const size_t need00 = states(Stage::dp) + other;
    const size_t need03 = states(Stage::zero3) + other + zero3_buffers_bound(s, p);
    ASSERT_LT(need03, need00) << "no budget separates the stages on this configuration";
    const size_t budget = (need03 + need00) / 2;
    cfg.device_mem = budget;
    try {
      run_training(cfg, train_data_parallel);
      ADD_FAILURE() << "stage 00 fitted in " << budget << " bytes";
    } catch (const OutOfMemory& e) {
      EXPECT_NE(std::string(e.what()).find("--device-mem"), std::string::npos) << e.what();
    }
    const RunResult r3 = run_training(cfg, train_zero3);
    EXPECT_EQ(r3.ranks[0].losses.size(), size_t(cfg.steps));
    EXPECT_EQ(r3.ranks[0].losses, free_run.ranks[0].losses);  // the budget changes nothing else
    for (const auto& r : r3.ranks) EXPECT_LE(r.memory.peak_total[int(Place::device)], budget);
  }
}

// ------------------------------------------------------------------ communication

// Per micro-step one reduce-scatter and two all-gathers (forward and
// backward; the head is gathered again for the backward); no all-gather
// after the step; the loss and the norm's all-reduce per step. With K = 1,
// docs/SPEC.md's statement: 1.5 times stage 00's volume, up to the padding
// (and the small norm all-reduce).
TEST(Zero3Comm, RingBytesFollowTheSizes) {
  test::for_each_ring_case(train_zero3, [](const test::RingCase& c, const CommStats& got) {
    test::expect_ring_bytes(got, {.all_reduce = c.steps * (c.loss + c.norm),
                                  .reduce_scatter = c.steps * c.K * c.rs,
                                  .all_gather = c.steps * c.K * 2 * c.ag});
    if (c.K == 1)
      test::expect_bytes(got.total_bytes() - c.steps * (c.loss + c.norm), 1.5 * (c.t00 - c.steps * c.loss + c.pad),
                         "vs 1.5 x 00");
  });
}

// ------------------------------------------------------------------ schedule

// ZeRO-3 under the schedule recorder (schedule_util.h), on the four
// schedule cases (N, K, recipe, a delay or not, clipping or not).
class Zero3Schedule : public test::StageSchedule {
 protected:
  Zero3Schedule() : StageSchedule("zero3", train_zero3) {}
};

TEST_P(Zero3Schedule, LogIsConsistent) { test::expect_consistent_log(run()); }

// On every micro-step, unit u+1's all-gather is issued before unit u's
// forward begins and waited for only after it has ended; unit u-1's before
// unit u's backward begins, likewise; the gradients go as in stage 02. At
// most two units are gathered at any compute: the gathered bytes at each
// forward are units u and u+1's parameters, at each backward units u-1 and
// u's, and the comm bytes unit u's and u+1's gradient buffers.
TEST_P(Zero3Schedule, PrefetchesOneUnitAhead) {
  const int K = GetParam().K;
  const test::Units us = units();
  const int U = us.U;
  ASSERT_EQ(kZero3MaxGatheredUnits, 2);
  for_each_rank_step([&](const test::RankSchedule& s, int step) {
    for (int k = 0; k < K; ++k) {
      const test::Window w = s.micro(step, k);
      std::vector<const test::Collective*> gathers, grads, rest;
      for (const test::Collective* x : s.issued_in(w)) {
        if (x->kind == CollectiveKind::all_gather && int(gathers.size()) < 2 * U)
          gathers.push_back(x);
        else if (x->kind == CollectiveKind::reduce_scatter)
          grads.push_back(x);
        else
          rest.push_back(x);  // the scalars, and after the last step the final gather
      }
      ASSERT_EQ(int(gathers.size()), 2 * U);
      ASSERT_EQ(int(grads.size()), U);
      // Forward gathers in unit order 0 .. U-1, then the backward's U-1 .. 0.
      auto fwd = [&](int u) -> const test::Collective& { return *gathers[u]; };
      auto bwd = [&](int u) -> const test::Collective& { return *gathers[U + (U - 1 - u)]; };
      for (int u = 0; u < U; ++u) {
        EXPECT_TRUE(fwd(u).is(CollectiveKind::all_gather, us.dt, us.S[u])) << describe(fwd(u));
        EXPECT_TRUE(bwd(u).is(CollectiveKind::all_gather, us.dt, us.S[u])) << describe(bwd(u));
        EXPECT_TRUE(grads[U - 1 - u]->is(CollectiveKind::reduce_scatter, us.dt, us.S[u]))
            << describe(*grads[U - 1 - u]);
      }
      for (int u = 0; u < U; ++u) {
        const uint64_t fb = s.at(Ev::forward_begin, u, w), fe = s.at(Ev::forward_end, u, w);
        EXPECT_LT(fwd(u).first_wait(), fb);
        if (u + 1 < U) {
          EXPECT_LT(fwd(u + 1).issued, fb) << "unit " << u + 1 << " is not gathered before unit " << u
                                           << "'s forward begins";
          EXPECT_GT(fwd(u + 1).first_wait(), fe) << "unit " << u + 1 << "'s gather is waited for during unit "
                                                 << u << "'s forward";
        }
        EXPECT_EQ(s.events()[fb].gathered_bytes(), us.b * (us.pad(u) + us.pad(u + 1))) << "forward of unit " << u;
        EXPECT_EQ(s.events()[fb].comm_bytes(), 0u) << "forward of unit " << u;
      }
      for (int u = U - 1; u >= 0; --u) {
        const uint64_t bb = s.at(Ev::backward_begin, u, w), be = s.at(Ev::backward_end, u, w);
        EXPECT_LT(bwd(u).first_wait(), bb);
        if (u > 0) {
          EXPECT_LT(bwd(u - 1).issued, bb) << "unit " << u - 1 << " is not gathered before unit " << u
                                           << "'s backward begins";
          EXPECT_GT(bwd(u - 1).first_wait(), be) << "unit " << u - 1 << "'s gather is waited for during unit "
                                                 << u << "'s backward";
        }
        EXPECT_EQ(s.events()[bb].gathered_bytes(), us.b * (us.pad(u - 1) + us.pad(u))) << "backward of unit " << u;
        EXPECT_EQ(s.events()[bb].comm_bytes(), us.b * (us.pad(u) + us.pad(u + 1))) << "backward of unit " << u;
      }
      test::expect_overlaps_backward(s, w, grads, us);
      // Nothing is left gathered or being reduced between micro-steps.
      EXPECT_EQ(s.events()[w.begin].comm_bytes(), 0u);
      EXPECT_EQ(s.events()[w.begin].gathered_bytes(), 0u);
      // No all-gather after the update: the loss and the norm only (and,
      // after the last step, the final gather of the model for its hash).
      if (k + 1 == K) {
        const size_t scalars = 2;
        ASSERT_GE(rest.size(), scalars);
        EXPECT_TRUE(test::is_loss(*rest[0]));
        EXPECT_TRUE(test::is_norm(*rest[1]));
        EXPECT_EQ(rest.size(), scalars + (step + 1 == test::kScheduleSteps ? U : 0));
      } else {
        EXPECT_TRUE(rest.empty());
      }
    }
  });
}

// Per step: U·K reduce-scatters and 2·U·K all-gathers (before each forward
// and each backward), the loss and the norm; after the last step the model
// is gathered once more, for its hash.
TEST_P(Zero3Schedule, CollectiveCountsPerStep) {
  const int U = units().U, K = GetParam().K;
  test::expect_collective_counts(run(), GetParam(),
                                 {.reduce_scatter = U * K, .all_gather = 2 * U * K, .loss = 1, .norm = 1},
                                 /*final_gather=*/true);
}

// The peaks, exactly the README's: category gathered, the unit computing
// and the one prefetched, max over u of (N·S_u + N·S_{u+1})·b; category
// comm, stage 02's two gradient buffers, the same sum. Nothing is left in
// either after a run.
TEST_P(Zero3Schedule, BufferPeaksAreTheReadmeBounds) {
  const test::Units us = units();
  size_t pair = 0;
  for (int u = 0; u < us.U; ++u) pair = std::max(pair, us.b * (us.pad(u) + us.pad(u + 1)));
  test::expect_comm_peak(run(), pair);
  for (size_t r = 0; r < run().run.ranks.size(); ++r) {
    const MemoryCounts& m = run().run.ranks[r].memory;
    EXPECT_EQ(m.pk(Place::device, Category::gathered), pair) << "rank " << r;
    EXPECT_EQ(m.cur(Place::device, Category::gathered), 0u) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Zero3Schedule, ::testing::ValuesIn(test::schedule_cases()), test::schedule_case_name);

TEST(Zero3Recorder, ChangesNoResult) { test::expect_recorder_changes_no_result(train_zero3); }

// ------------------------------------------------------------------ gradient, checkpoints

TEST(Zero3Gradient, MatchesTheReference) { test::expect_gradient_matches_reference("zero3", train_zero3); }

class Zero3Checkpoint : public test::TempDirTest {};

TEST_F(Zero3Checkpoint, ResumeContinuesBitForBit) { test::expect_resume_continues_bit_for_bit(train_zero3, dir_); }

TEST_F(Zero3Checkpoint, InitStartsFromTheFile) { test::expect_init_starts_from_the_file(train_zero3, dir_); }

TEST_F(Zero3Checkpoint, SaveEveryKeepsWorkWhenARankFails) {
  test::expect_save_every_keeps_work_when_a_rank_fails(train_zero3, dir_);
}

// Saving gathers every moment and parameter (3 more all-gathers of the
// model), none of it counted.
TEST_F(Zero3Checkpoint, SavingIsNotCountedAsTrainingTraffic) {
  test::expect_saving_is_not_counted_as_training_traffic(train_zero3, dir_);
}

}  // namespace
}  // namespace zf
