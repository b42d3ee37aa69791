// test_zero2.cpp: stage 02 (02_zero2/, `zero2`, ZeRO-2: the optimizer state
// and the gradients sharded) is right, measured against stage 00 and
// docs/SPEC.md. Here:
//   - parity: stage 00's losses, gradient norms and final parameters to the
//     bit at K = 1, with padding and clipping; with gradient accumulation
//     (K = 2, a reduce-scatter every micro-step) within float rounding;
//   - memory: the model states e Pp + e S + o S per rank (fp32 4P + 12P/N,
//     bf16 2P + 14P/N, plus padding), a peak below ZeRO-1's, gradient
//     buffers of at most two units;
//   - communication: a reduce-scatter of the padded model every micro-step,
//     one all-gather per step, and the gradient norm's all-reduce;
//   - schedule: on every micro-step each unit's reduce-scatter is in flight
//     during the next unit's backward, the all-gathers follow the update,
//     the comm peak is the README's (Zero2Schedule);
//   - the gradient's value against a double-precision reference;
//   - checkpoints: resume bit for bit, --save-every, saving uncounted.
//
//   meson test -C build zero2                                # every test of stage 02
//   build/tests/test_zero2 --gtest_filter='*Zero2Schedule*'  # one group of them
//   build/tests/test_zero2 --gtest_list_tests                # their names
//
// ZF_TEST_PRINT=1 prints the measured values beside their tolerances.
#include <gtest/gtest.h>

#include <algorithm>

#include "comm.h"
#include "stages/schedule_util.h"
#include "stages/gradient_check.h"
#include "stages/stage_test_util.h"
#include "stages/validation_checks.h"
#include "test_util.h"
#include "zero1.h"
#include "zero2.h"

namespace zf {
namespace {

using Ev = ScheduleEvent;

// ------------------------------------------------------------------ parity with stage 00

class Zero2BitParity : public ::testing::TestWithParam<test::ParityCase> {};

// K = 1, both recipes, clip norms 1 and 0.05 (stage_test_util.h says why
// the bits are the same).
TEST_P(Zero2BitParity, BitIdenticalToDataParallel) {
  test::expect_bit_identical_to_dp(GetParam(), train_zero2, "02 zero2");
}

INSTANTIATE_TEST_SUITE_P(Ranks, Zero2BitParity, ::testing::ValuesIn(test::parity_cases()), test::parity_case_name);

TEST(Zero2Parity, ClippingBites) { test::expect_clipping_bites(train_zero2); }

// --val-every changes nothing of training and counts its collectives apart;
// every rank holds every parameter: the evaluation's only collective is the loss's all-reduce.
TEST(Zero2Parity, ValidationIsApart) { test::expect_validation_is_apart(train_zero2, 0); }

TEST(Zero2Parity, RunLogCarriesTheGradNorm) { test::expect_run_log_carries_the_grad_norm(train_zero2); }

// K = 2: ZeRO-2 reduce-scatters every micro-step and accumulates the reduced
// pieces, sum over micro-steps of (sum over ranks): other additions than
// stage 00's, so close to its losses, not equal (stage_test_util.h gives
// the tolerances).
TEST(Zero2Parity, GradAccumulation) { test::expect_accumulation_close_to_dp(train_zero2, "02 zero2"); }

// ------------------------------------------------------------------ memory

TEST(Zero2Memory, ModelStatesMatchSpecFormulas) { test::expect_model_states_match_formulas(Stage::zero2, train_zero2); }

TEST(Zero2Memory, PeakBelowZero1) { test::expect_peak_below(train_zero1, "01 zero1", train_zero2, "02 zero2"); }

// ZeRO-2's temporary buffers (category comm), from zero2.cpp and
// sharded_grads.cpp, with G the largest padded unit (N * S_u elements): the
// unit whose backward runs has a full gradient buffer (G); the unit whose
// backward finished just before is still being reduce-scattered, in place,
// in its full buffer (G). In reduce_unit(u) two units are in flight for a
// moment before the older one completes: at most 2G, at least G.
TEST(Zero2Memory, CommBuffersAreBounded) {
  test::for_each_comm_buffer_case(train_zero2, [](const test::Sizes& s, const TrainConfig& cfg, const RunResult& run) {
    const size_t e = test::esize(cfg.precision);
    for (const auto& r : run.ranks) {
      const size_t peak = r.memory.pk(Place::device, Category::comm);
      EXPECT_LE(peak, 2 * s.max_padded_unit * e);
      EXPECT_GE(peak, s.max_padded_unit * e);
    }
  });
}

// ------------------------------------------------------------------ communication

// As ZeRO-1, but the reduce-scatter runs every micro-step: ZeRO-2's trade,
// no full gradient buffer survives a micro-step, so each micro-step's
// gradient is reduce-scattered at once, K times the reduce-scatter bytes of
// stages 00/01 when accumulating. With K = 1, docs/SPEC.md's statement:
// stage 00's volume, up to the padding and the norm's small all-reduce.
TEST(Zero2Comm, RingBytesFollowTheSizes) {
  test::for_each_ring_case(train_zero2, [](const test::RingCase& c, const CommStats& got) {
    test::expect_ring_bytes(got, {.all_reduce = c.steps * (c.loss + c.norm),
                                  .reduce_scatter = c.steps * c.K * c.rs,
                                  .all_gather = c.steps * c.ag});
    if (c.K == 1) test::expect_bytes(got.total_bytes(), c.t00 + c.pad + c.steps * c.norm, "vs 00");
  });
}

// ------------------------------------------------------------------ schedule

// ZeRO-2 under the schedule recorder (schedule_util.h), on the four
// schedule cases (N, K, recipe, a delay or not, clipping or not).
class Zero2Schedule : public test::StageSchedule {
 protected:
  Zero2Schedule() : StageSchedule("zero2", train_zero2) {}
};

TEST_P(Zero2Schedule, LogIsConsistent) { test::expect_consistent_log(run()); }

// On every micro-step, unit u's reduce-scatter is in flight (issued, not
// waited for) while unit u-1's backward runs, and exactly one is in flight
// when a backward (but the first) begins: the one of the unit after. The
// micro-step waits for all of them before the next one loads. Its comm
// bytes then: unit u's gradient buffer and unit u+1's, being reduced.
TEST_P(Zero2Schedule, ReduceScatterInFlightEveryMicroStep) {
  const int K = GetParam().K;
  const test::Units us = units();
  for_each_rank_step([&](const test::RankSchedule& s, int step) {
    for (int k = 0; k < K; ++k) {
      const test::Window w = s.micro(step, k);
      const auto cs = test::expect_unit_gradients(s, w, us, CollectiveKind::reduce_scatter, us.S);
      ASSERT_GE(int(cs.size()), us.U);
      for (int u = us.U - 1; u >= 0; --u) {
        const uint64_t begin = s.at(Ev::backward_begin, u, w);
        EXPECT_EQ(s.in_flight_at(begin), u == us.U - 1 ? 0 : 1) << "at unit " << u << "'s backward";
        EXPECT_EQ(s.events()[begin].comm_bytes(), us.b * (us.pad(u) + us.pad(u + 1))) << "unit " << u;
        EXPECT_EQ(s.events()[s.at(Ev::forward_begin, u, w)].comm_bytes(), 0u) << "unit " << u;
      }
      if (k + 1 == K) {
        ASSERT_GT(int(cs.size()), us.U);
      }
      const uint64_t done_by = k + 1 < K ? w.end : cs[us.U]->issued;  // next load, or the loss
      for (int i = 0; i < us.U; ++i) EXPECT_LT(cs[i]->first_wait(), done_by) << describe(*cs[i]);
      if (k + 1 == K) test::expect_gathers_after_update(s, us, step, {cs.begin() + us.U, cs.end()});
    }
  });
}

// Per step: U·K reduce-scatters (every micro-step), U all-gathers (after the
// update), the loss and the norm; after the last step the model is gathered
// once more, for its hash.
TEST_P(Zero2Schedule, CollectiveCountsPerStep) {
  const int U = units().U, K = GetParam().K;
  test::expect_collective_counts(run(), GetParam(),
                                 {.reduce_scatter = U * K, .all_gather = U, .loss = 1, .norm = 1},
                                 /*final_gather=*/true);
}

// The peak of category comm, exactly the README's bound: the gradient buffer
// of the unit whose backward runs, and the one of the unit after it, being
// reduced: max over u of (N·S_u + N·S_{u+1})·b.
TEST_P(Zero2Schedule, CommPeakIsTheReadmeBound) {
  const test::Units us = units();
  size_t bound = 0;
  for (int u = 0; u < us.U; ++u) bound = std::max(bound, us.b * (us.pad(u) + us.pad(u + 1)));
  test::expect_comm_peak(run(), bound);
}

INSTANTIATE_TEST_SUITE_P(Cases, Zero2Schedule, ::testing::ValuesIn(test::schedule_cases()), test::schedule_case_name);

TEST(Zero2Recorder, ChangesNoResult) { test::expect_recorder_changes_no_result(train_zero2); }

// With a delay, collectives really are in flight while the next unit's
// backward runs: some reduce-scatter completes only after the backward that
// follows its issue has begun (a timing fact, so it is asserted for one at
// least, not for each).
TEST(Zero2Recorder, DelayKeepsCollectivesInFlightDuringCompute) {
  const test::ScheduleCase c{2, 2, Precision::bf16, 2000, 1.0f};
  const test::RecordedRun& run = test::recorded("zero2", train_zero2, c);
  for (int r = 0; r < c.N; ++r) {
    test::RankSchedule s(run.events[r]);
    int overlapped = 0;
    for (const test::Collective& x : s.collectives()) {
      if (x.kind != CollectiveKind::reduce_scatter) continue;
      for (uint64_t i = x.issued + 1; i < s.end(); ++i)
        if (s.events()[i].kind == Ev::backward_begin) {
          overlapped += x.completed > i;
          break;
        }
    }
    EXPECT_GT(overlapped, 0) << "rank " << r;
  }
}

// ------------------------------------------------------------------ gradient, checkpoints

TEST(Zero2Gradient, MatchesTheReference) { test::expect_gradient_matches_reference("zero2", train_zero2); }

class Zero2Checkpoint : public test::TempDirTest {};

TEST_F(Zero2Checkpoint, ResumeContinuesBitForBit) { test::expect_resume_continues_bit_for_bit(train_zero2, dir_); }

TEST_F(Zero2Checkpoint, InitStartsFromTheFile) { test::expect_init_starts_from_the_file(train_zero2, dir_); }

TEST_F(Zero2Checkpoint, SaveEveryKeepsWorkWhenARankFails) {
  test::expect_save_every_keeps_work_when_a_rank_fails(train_zero2, dir_);
}

TEST_F(Zero2Checkpoint, SavingIsNotCountedAsTrainingTraffic) {
  test::expect_saving_is_not_counted_as_training_traffic(train_zero2, dir_);
}

}  // namespace
}  // namespace zf
