// test_zero1.cpp: stage 01 (01_zero1/, `zero1`, ZeRO-1: the optimizer state
// sharded) is right, measured against stage 00 and docs/SPEC.md. Here:
//   - parity: stage 00's losses, gradient norms and final parameters to the
//     bit, with padding, clipping and gradient accumulation (K = 2: ZeRO-1
//     still reduces once per step, so still bit for bit);
//   - memory: the model states e Pp + e Pp + o S per rank (fp32 8P + 8P/N,
//     bf16 4P + 12P/N, plus padding), a peak below stage 00's, no comm buffers;
//   - communication: one reduce-scatter and one all-gather of the padded
//     model per step (stage 00's bytes) and the gradient norm's all-reduce;
//   - schedule: each unit's reduce-scatter overlaps the next unit's backward,
//     the all-gathers follow the update (Zero1Schedule);
//   - the gradient's value against a double-precision reference;
//   - checkpoints: resume bit for bit, --save-every, saving uncounted.
//
//   meson test -C build zero1                                # every test of stage 01
//   build/tests/test_zero1 --gtest_filter='*Zero1Schedule*'  # one group of them
//   build/tests/test_zero1 --gtest_list_tests                # their names
//
// ZF_TEST_PRINT=1 prints the measured values beside their tolerances.
#include <gtest/gtest.h>

#include "comm.h"
#include "stages/schedule_util.h"
#include "stages/gradient_check.h"
#include "stages/stage_test_util.h"
#include "stages/validation_checks.h"
#include "test_util.h"
#include "zero1.h"

namespace zf {
namespace {

// ------------------------------------------------------------------ parity with stage 00

class Zero1BitParity : public ::testing::TestWithParam<test::ParityCase> {};

// K = 1, both recipes, clip norms 1 and 0.05 (stage_test_util.h says why
// the bits are the same).
TEST_P(Zero1BitParity, BitIdenticalToDataParallel) {
  test::expect_bit_identical_to_dp(GetParam(), train_zero1, "01 zero1");
}

INSTANTIATE_TEST_SUITE_P(Ranks, Zero1BitParity, ::testing::ValuesIn(test::parity_cases()), test::parity_case_name);

TEST(Zero1Parity, ClippingBites) { test::expect_clipping_bites(train_zero1); }

// --val-every changes nothing of training and counts its collectives apart;
// every rank holds every parameter: the evaluation's only collective is the loss's all-reduce.
TEST(Zero1Parity, ValidationIsApart) { test::expect_validation_is_apart(train_zero1, 0); }

TEST(Zero1Parity, RunLogCarriesTheGradNorm) { test::expect_run_log_carries_the_grad_norm(train_zero1); }

// K = 2: stage 00 and ZeRO-1 both accumulate each rank's full gradient over
// the micro-steps and reduce once, sum over ranks of (sum over micro-steps):
// the same additions in the same order, so the same bits.
TEST(Zero1Parity, GradAccumulation) {
  test::for_each_accumulation_case([](const TrainConfig& cfg, const RunResult& ref) {
    test::expect_bit_identical(ref, run_training(cfg, train_zero1), "01 zero1");
  });
}

// ------------------------------------------------------------------ memory

TEST(Zero1Memory, ModelStatesMatchSpecFormulas) { test::expect_model_states_match_formulas(Stage::zero1, train_zero1); }

TEST(Zero1Memory, PeakBelowDataParallel) {
  test::expect_peak_below(train_data_parallel, "00 dp", train_zero1, "01 zero1");
}

// ZeRO-1 reduces in place, like stage 00: no temporary buffers at all.
TEST(Zero1Memory, CommBuffersAreBounded) {
  test::for_each_comm_buffer_case(train_zero1, [](const test::Sizes&, const TrainConfig&, const RunResult& run) {
    for (const auto& r : run.ranks) EXPECT_EQ(r.memory.pk(Place::device, Category::comm), 0u);
  });
}

// ------------------------------------------------------------------ communication

// Per step: a reduce-scatter and an all-gather of the padded model (together
// one all-reduce of it), whatever K (the full gradients accumulate locally),
// plus the loss and the gradient norm's exact accumulator (20 int64 limbs,
// gradnorm.h), clipping or not (the norm is logged every step). With K = 1,
// docs/SPEC.md's statement: stage 00's volume, up to the padding and the norm.
TEST(Zero1Comm, RingBytesFollowTheSizes) {
  test::for_each_ring_case(train_zero1, [](const test::RingCase& c, const CommStats& got) {
    test::expect_ring_bytes(got, {.all_reduce = c.steps * (c.loss + c.norm),
                                  .reduce_scatter = c.steps * c.rs,
                                  .all_gather = c.steps * c.ag});
    if (c.K == 1) test::expect_bytes(got.total_bytes(), c.t00 + c.pad + c.steps * c.norm, "vs 00");
  });
}

// ------------------------------------------------------------------ schedule

// ZeRO-1 under the schedule recorder (schedule_util.h), on the four
// schedule cases (N, K, recipe, a delay or not, clipping or not).
class Zero1Schedule : public test::StageSchedule {
 protected:
  Zero1Schedule() : StageSchedule("zero1", train_zero1) {}
};

TEST_P(Zero1Schedule, LogIsConsistent) { test::expect_consistent_log(run()); }

// As stage 00, with reduce-scatters: nothing on the micro-steps before the
// last; on the last, unit u's reduce-scatter overlaps unit u-1's backward;
// then the loss, the norm and the all-gathers of the updated pieces.
TEST_P(Zero1Schedule, ReduceScatterOverlapsBackward) {
  const int K = GetParam().K;
  const test::Units us = units();
  for_each_rank_step([&](const test::RankSchedule& s, int step) {
    for (int k = 0; k + 1 < K; ++k) EXPECT_TRUE(s.issued_in(s.micro(step, k)).empty()) << "micro " << k;
    // Unit u's reduce-scatter leaves each rank its S_u summed gradients.
    const auto cs = test::expect_unit_gradients(s, s.micro(step, K - 1), us, CollectiveKind::reduce_scatter, us.S);
    ASSERT_GE(int(cs.size()), us.U);
    test::expect_gathers_after_update(s, us, step, {cs.begin() + us.U, cs.end()});
  });
}

// Per step: U reduce-scatters (on the last micro-step), U all-gathers (after
// the update), the loss and the norm; after the last step the model is
// gathered once more, for its hash.
TEST_P(Zero1Schedule, CollectiveCountsPerStep) {
  const int U = units().U;
  test::expect_collective_counts(run(), GetParam(), {.reduce_scatter = U, .all_gather = U, .loss = 1, .norm = 1},
                                 /*final_gather=*/true);
}

// The gradients are reduce-scattered in their own buffers: no comm bytes.
TEST_P(Zero1Schedule, CommPeakIsTheReadmeBound) { test::expect_comm_peak(run(), 0); }

INSTANTIATE_TEST_SUITE_P(Cases, Zero1Schedule, ::testing::ValuesIn(test::schedule_cases()), test::schedule_case_name);

TEST(Zero1Recorder, ChangesNoResult) { test::expect_recorder_changes_no_result(train_zero1); }

// ------------------------------------------------------------------ gradient, checkpoints

TEST(Zero1Gradient, MatchesTheReference) { test::expect_gradient_matches_reference("zero1", train_zero1); }

class Zero1Checkpoint : public test::TempDirTest {};

TEST_F(Zero1Checkpoint, ResumeContinuesBitForBit) { test::expect_resume_continues_bit_for_bit(train_zero1, dir_); }

TEST_F(Zero1Checkpoint, InitStartsFromTheFile) { test::expect_init_starts_from_the_file(train_zero1, dir_); }

TEST_F(Zero1Checkpoint, SaveEveryKeepsWorkWhenARankFails) {
  test::expect_save_every_keeps_work_when_a_rank_fails(train_zero1, dir_);
}

TEST_F(Zero1Checkpoint, SavingIsNotCountedAsTrainingTraffic) {
  test::expect_saving_is_not_counted_as_training_traffic(train_zero1, dir_);
}

}  // namespace
}  // namespace zf
