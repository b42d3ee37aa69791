// test_dp.cpp: stage 00 (00_data_parallel/, `dp`) is right: everything that
// tests stage 00 alone. Data parallelism must give the losses of one rank
// on the same global batch, hold exactly 16P bytes of model states per
// rank, move 2(N-1)/N of the gradient per step, and learn. Here:
//   - training: N ranks of B = one rank of N B, accumulation, clipping, the
//     logged grad_norm, a loss that falls, a device budget, a failing rank;
//   - memory: the model states against docs/SPEC.md's formula (16P);
//   - communication: the ring-model bytes and calls of the all-reduces;
//   - schedule: each unit's all-reduce overlaps the next unit's backward,
//     the collectives of a step, no comm buffers (DataParallelSchedule);
//   - the gradient's value against a double-precision reference;
//   - checkpoints: resume bit for bit, --save-every, saving uncounted.
// The later stages' files (test_zero1.cpp ...) test each against this one.
//
//   meson test -C build dp                                       # every test of stage 00
//   build/tests/test_dp --gtest_filter='*DataParallelSchedule*'  # one group of them
//   build/tests/test_dp --gtest_list_tests                       # their names
//
// ZF_TEST_PRINT=1 prints the measured values beside their tolerances.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>

#include "comm.h"
#include "stages/schedule_util.h"
#include "stages/gradient_check.h"
#include "stages/stage_test_util.h"
#include "stages/validation_checks.h"
#include "test_util.h"

namespace zf {
namespace {

using test::quiet_config;

// Different rank counts sum the same per-sequence gradients in a different
// order (N per-rank partial sums, then the all-reduce), so results agree to
// float32 rounding, not bit for bit. After a few AdamW steps such differences
// stay ~1e-6 relative in the loss; 2e-4 absolute on a loss of ~5 leaves a wide
// margin while a wrong batch (other sequences, other weighting) moves the
// loss by 1e-2 or more.
constexpr double kOrderTol = 2e-4;

void expect_same_losses(const RunResult& a, const RunResult& b, double tol) {
  ASSERT_EQ(a.ranks[0].losses.size(), b.ranks[0].losses.size());
  for (size_t s = 0; s < a.ranks[0].losses.size(); ++s)
    EXPECT_NEAR(a.ranks[0].losses[s], b.ranks[0].losses[s], tol) << "step " << s;
}

TEST(DataParallel, FourRanksOfTwoEqualOneRankOfEight) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    auto c4 = quiet_config("tiny", 4, 2, 5);
    auto c1 = quiet_config("tiny", 1, 8, 5);
    c4.precision = c1.precision = p;
    auto r4 = run_training(c4, train_data_parallel);
    auto r1 = run_training(c1, train_data_parallel);
    // bf16 gradients are rounded to 8 bits of mantissa after different partial
    // sums, so a rounding step can differ by 2^-8 relative in a gradient; the
    // losses of a few steps then differ by ~1e-3 at most.
    expect_same_losses(r4, r1, p == Precision::fp32 ? kOrderTol : 3e-3);
    // Every rank of a run reports the same loss and ends with the same model.
    for (const auto& r : r4.ranks) {
      EXPECT_EQ(r.losses, r4.ranks[0].losses);
      EXPECT_EQ(r.param_hash, r4.ranks[0].param_hash);
    }
  }
}

TEST(DataParallel, AccumulationEqualsMoreRanks) {
  auto a = quiet_config("tiny", 2, 2, 5);
  a.grad_accum = 2;
  auto b = quiet_config("tiny", 4, 2, 5);
  expect_same_losses(run_training(a, train_data_parallel), run_training(b, train_data_parallel), kOrderTol);
}

TEST(DataParallel, ClippingChangesTheUpdate) {
  // With a tiny clip norm the update must differ from the unclipped one.
  auto a = quiet_config("tiny", 2, 2, 4);
  auto b = a;
  a.clip = 0.0f;
  b.clip = 0.01f;
  auto ra = run_training(a, train_data_parallel), rb = run_training(b, train_data_parallel);
  EXPECT_EQ(ra.ranks[0].losses[0], rb.ranks[0].losses[0]);  // same initial model and batch
  EXPECT_NE(ra.ranks[0].param_hash, rb.ranks[0].param_hash);
}

// The clip norms the later stages' parity tests use (1 and 0.05) really
// clip, and the logged norm is the one before clipping (stage_test_util.h).
TEST(DataParallel, ClippingBites) { test::expect_clipping_bites(train_data_parallel); }

// --val-every changes nothing of training and counts its collectives apart:
// the evaluation's only collective is the loss's all-reduce.
TEST(DataParallel, ValidationIsApart) { test::expect_validation_is_apart(train_data_parallel, 0); }

// Every step of the run log carries the grad_norm the run recorded.
TEST(DataParallel, RunLogCarriesTheGradNorm) { test::expect_run_log_carries_the_grad_norm(train_data_parallel); }

TEST(DataParallel, LossFallsOnBuiltInCorpus) {
  auto cfg = quiet_config("tiny", 2, 4, 60);
  cfg.lr = 3e-3f;
  auto run = run_training(cfg, train_data_parallel);
  const auto& l = run.ranks[0].losses;
  // A byte-level model starts near ln(256) = 5.55; learning the corpus's
  // letter statistics alone brings it well under 3.5 in 60 steps.
  EXPECT_NEAR(l.front(), std::log(256.0), 0.3);
  EXPECT_LT(l.back(), 3.5);
}

TEST(DataParallel, ModelStatesAreExactly16PPerRank) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    auto cfg = quiet_config("tiny", 3, 1, 1);
    cfg.precision = p;
    auto run = run_training(cfg, train_data_parallel);
    const size_t P = run.params;
    const size_t param_bytes = p == Precision::fp32 ? 4 : 2;
    for (const auto& r : run.ranks) {
      const auto& m = r.memory;
      EXPECT_EQ(m.cur(Place::device, Category::params), param_bytes * P);
      EXPECT_EQ(m.cur(Place::device, Category::grads), param_bytes * P);
      EXPECT_EQ(m.cur(Place::device, Category::optimizer), (16 - 2 * param_bytes) * P);
      EXPECT_EQ(m.model_states(Place::device), 16 * P);
      EXPECT_EQ(m.model_states(Place::host), 0u);
      EXPECT_GT(m.pk(Place::device, Category::activations), 0u);
    }
  }
}

// The formula of ModelStatesAreExactly16PPerRank, e P + e P + o P, on the
// cases the ZeRO stages run (with padding there; stage 00 never pads), and
// memory_model.h's and docs/SPEC.md's tables.
TEST(DataParallelMemory, ModelStatesMatchSpecFormulas) {
  test::expect_model_states_match_formulas(Stage::dp, train_data_parallel);
}

TEST(DataParallel, CommunicatesOneAllReducePerStep) {
  const int N = 4, steps = 3;
  auto cfg = quiet_config("tiny", N, 1, steps);
  cfg.grad_accum = 2;  // only the last micro-step communicates
  auto run = run_training(cfg, train_data_parallel);
  const double P = double(run.params);
  for (const auto& r : run.ranks) {
    const auto& s = r.comm;
    // Gradients (P floats) plus the loss (1 float) per step, ring model.
    double want = steps * 2.0 * (N - 1) / N * 4.0 * (P + 1);
    EXPECT_DOUBLE_EQ(s.bytes[int(CollectiveKind::all_reduce)], want);
    EXPECT_EQ(s.bytes[int(CollectiveKind::reduce_scatter)], 0.0);
    EXPECT_EQ(s.bytes[int(CollectiveKind::all_gather)], 0.0);
    // One all-reduce per unit per step plus the loss.
    EXPECT_EQ(s.calls[int(CollectiveKind::all_reduce)], uint64_t(steps * (cfg.model.L + 3)));
  }
}

TEST(DataParallel, DeviceBudgetRefusesBeforeAnyStep) {
  std::string dir = test::temp_dir();
  RunConfig cfg = quiet_config("tiny", 2, 1, 5);
  cfg.log_json = dir + "/log.jsonl";
  const size_t P = build_layout(cfg.model).numel;
  cfg.device_mem = 10 * P;  // less than the 16P of model states
  try {
    run_training(cfg, train_data_parallel);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--device-mem"), std::string::npos) << msg;
    EXPECT_NE(msg.find(format_bytes(10 * P)), std::string::npos) << "budget not named: " << msg;
    bool names_category = msg.find("params") != std::string::npos ||
                          msg.find("grads") != std::string::npos ||
                          msg.find("optimizer") != std::string::npos;
    EXPECT_TRUE(names_category) << msg;
  }
  std::ifstream log(cfg.log_json);
  std::string line;
  EXPECT_FALSE(std::getline(log, line)) << "a step ran: " << line;
  // And with enough budget it trains.
  cfg.device_mem = 64 * P + (64u << 20);
  EXPECT_EQ(run_training(cfg, train_data_parallel).ranks[0].losses.size(), 5u);
}

TEST(DataParallel, FailingRankStopsTheRunAndIsNamed) {
  RunConfig cfg = quiet_config("tiny", 4, 1, 5);
  cfg.fault_rank = 2;
  cfg.fault_step = 1;
  auto t0 = std::chrono::steady_clock::now();
  try {
    run_training(cfg, train_data_parallel);
    FAIL() << "expected the run to fail";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("rank 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("injected fault"), std::string::npos) << msg;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0) << "the other ranks took too long to stop";
}

// Ring-model bytes (comm.h): one all-reduce of the P gradients (2(N-1)/N of
// them) and of the loss (1 float) per step, whatever K (only the last
// micro-step communicates), clipping or not: stage 00 has the whole gradient
// and reduces no norm. The later stages compare their totals with this one.
TEST(DataParallelComm, RingBytesFollowTheSizes) {
  test::for_each_ring_case(train_data_parallel, [](const test::RingCase& c, const CommStats& got) {
    test::expect_ring_bytes(got, {.all_reduce = c.steps * (c.ar00 + c.loss)});
    test::expect_bytes(got.total_bytes(), c.t00, "total");
  });
}

// ------------------------------------------------------------------ schedule

// Stage 00 under the schedule recorder (schedule_util.h), on the four
// schedule cases (N, K, recipe, a delay or not, clipping or not).
class DataParallelSchedule : public test::StageSchedule {
 protected:
  DataParallelSchedule() : StageSchedule("dp", train_data_parallel) {}
};

TEST_P(DataParallelSchedule, LogIsConsistent) { test::expect_consistent_log(run()); }

// No collective on the micro-steps before the last (the gradient accumulates
// locally); on the last, unit u's all-reduce is issued as soon as its
// backward ends, before unit u-1's backward starts, and waited for only
// after unit u-1's backward has ended.
TEST_P(DataParallelSchedule, AllReduceOverlapsBackward) {
  const int K = GetParam().K;
  const test::Units us = units();
  for_each_rank_step([&](const test::RankSchedule& s, int step) {
    for (int k = 0; k + 1 < K; ++k) EXPECT_TRUE(s.issued_in(s.micro(step, k)).empty()) << "micro " << k;
    // Unit u's all-reduce carries its n_u gradients, unpadded.
    const auto cs = test::expect_unit_gradients(s, s.micro(step, K - 1), us, CollectiveKind::all_reduce, us.n);
    ASSERT_GE(int(cs.size()), us.U + 1);
    // The loss is reduced once every gradient is waited for.
    EXPECT_TRUE(test::is_loss(*cs[us.U]));
    for (int i = 0; i < us.U; ++i) EXPECT_LT(cs[i]->first_wait(), cs[us.U]->issued);
  });
}

// Per step: U all-reduces of the model (on the last micro-step) and the
// loss; no gradient norm to reduce (every rank has the whole gradient), no
// final gather (every rank has the whole model).
TEST_P(DataParallelSchedule, CollectiveCountsPerStep) {
  const int U = units().U;
  test::expect_collective_counts(run(), GetParam(), {.model_all_reduce = U, .loss = 1}, /*final_gather=*/false);
}

// The gradients are all-reduced in their own buffers: no comm bytes at all.
TEST_P(DataParallelSchedule, CommPeakIsTheReadmeBound) { test::expect_comm_peak(run(), 0); }

INSTANTIATE_TEST_SUITE_P(Cases, DataParallelSchedule, ::testing::ValuesIn(test::schedule_cases()),
                         test::schedule_case_name);

TEST(DataParallelRecorder, ChangesNoResult) { test::expect_recorder_changes_no_result(train_data_parallel); }

// ------------------------------------------------------------------ gradient, checkpoints

// The gradient of step 0 against gpt_reference.h's, N = 1, 2, 4, K = 1, 2,
// both recipes (stage_test_util.h says how it is read and the tolerances).
TEST(DataParallelGradient, MatchesTheReference) { test::expect_gradient_matches_reference("dp", train_data_parallel); }

class DataParallelCheckpoint : public test::TempDirTest {};

TEST_F(DataParallelCheckpoint, ResumeContinuesBitForBit) {
  test::expect_resume_continues_bit_for_bit(train_data_parallel, dir_);
}

TEST_F(DataParallelCheckpoint, InitStartsFromTheFile) { test::expect_init_starts_from_the_file(train_data_parallel, dir_); }

TEST_F(DataParallelCheckpoint, SaveEveryKeepsWorkWhenARankFails) {
  test::expect_save_every_keeps_work_when_a_rank_fails(train_data_parallel, dir_);
}

// The schedule reaches AdamW: a run with warmup and cosine decay equals,
// bit for bit, a chain of one-step runs resumed from each other, each at a
// constant --lr, the rate the test computes for that step from the formula
// (docs/SPEC.md §3) in double. Both decays, with a weight decay of its own.
TEST_F(DataParallelCheckpoint, EachStepTrainsAtItsScheduledRate) {
  const int S = 5, W = 2;
  for (LrDecay decay : {LrDecay::cosine, LrDecay::linear}) {
    SCOPED_TRACE(lr_decay_name(decay));
    RunConfig cfg = quiet_config("tiny", 2, 2, S);
    cfg.lr = 2e-3f;
    cfg.lr_schedule = decay;
    cfg.warmup = W;
    cfg.min_lr = 1e-4f;
    cfg.weight_decay = 0.2f;
    const RunResult whole = run_training(cfg, train_data_parallel);
    const double r = double(cfg.min_lr) / double(cfg.lr);
    std::vector<float> losses;
    uint64_t hash = 0;
    for (int s = 0; s < S; ++s) {
      const double p = double(s - W) / (S - W);
      const double f = s < W ? (s + 1.0) / W
                             : r + (1 - r) * (decay == LrDecay::cosine ? 0.5 * (1 + std::cos(M_PI * p)) : 1 - p);
      RunConfig one = cfg;
      one.lr_schedule = LrDecay::constant;
      one.warmup = 0;
      one.min_lr = 0;
      one.lr = float(double(cfg.lr) * f);
      one.steps = s + 1;
      one.resume = s == 0 ? "" : dir_ + "/ck" + std::to_string(s - 1) + ".safetensors";
      one.save = dir_ + "/ck" + std::to_string(s) + ".safetensors";
      const RunResult part = run_training(one, train_data_parallel);
      losses.push_back(part.ranks[0].losses.at(0));
      hash = part.ranks[0].param_hash;
    }
    EXPECT_EQ(losses, whole.ranks[0].losses);
    EXPECT_EQ(hash, whole.ranks[0].param_hash);
  }
}

// The held-out loss is the mean loss of the held-out batches: after 3 steps
// it equals the mean of the first two training losses of a run that starts
// from the model of step 3 (--init), trains on the held-out tokens alone
// (the built-in corpus's last tenth, cut here) and never moves (a learning
// rate of 0): held-out batch b and training step b are the same sequences
// (docs/SPEC.md §5), and the training path computes their losses. Two
// batches, so that a sum not divided by their number, or batch 0 read
// twice, is seen.
TEST_F(DataParallelCheckpoint, ValidationLossIsTheLossOfTheHeldOutSequences) {
  RunConfig a = quiet_config("tiny", 2, 2, 3);
  a.val_every = 3;
  a.val_batches = 2;
  a.save = dir_ + "/ck.safetensors";
  const RunResult ra = run_training(a, train_data_parallel);
  ASSERT_EQ(ra.ranks[0].val_losses.size(), 2u);  // before step 0, after step 2
  ASSERT_EQ(ra.ranks[0].val_losses[1].first, 3);
  const TokenData corpus = builtin_corpus();
  const size_t tenth = corpus.tokens.size() / 10;
  const std::string held = dir_ + "/held.bin";
  write_llmc_token_file(held, std::vector<int32_t>(corpus.tokens.end() - long(tenth), corpus.tokens.end()));
  RunConfig b = quiet_config("tiny", 2, 2, 2);
  b.data = held;
  b.val_data = held;  // validation tokens of its own: none of --data is held out
  b.init = a.save;
  b.lr = 0.0f;  // both steps' losses are the loaded model's (the flag refuses 0; a test may ask it)
  const RunResult rb = run_training(b, train_data_parallel);
  const std::vector<float>& l = rb.ranks[0].losses;
  ASSERT_EQ(l.size(), 2u);
  ASSERT_NE(l[0], l[1]) << "two batches with different losses, or batch 0 twice would pass";
  const double mean = (double(l[0]) + double(l[1])) / 2;
  EXPECT_NEAR(ra.ranks[0].val_losses[1].second, mean, 1e-6 * mean);  // summed in another order
  EXPECT_NE(ra.ranks[0].losses.back(), ra.ranks[0].val_losses[1].second) << "not the training batch's loss";
}

// --weight-decay reaches AdamW: 0 and the default 0.1 train differently
// (the stages' parity tests then run another value against this stage).
TEST(DataParallel, WeightDecayIsTheFlags) {
  RunConfig cfg = quiet_config("tiny", 1, 2, 2);
  const uint64_t dflt = run_training(cfg, train_data_parallel).ranks[0].param_hash;
  cfg.weight_decay = 0.1f;
  EXPECT_EQ(run_training(cfg, train_data_parallel).ranks[0].param_hash, dflt) << "0.1 is the default";
  cfg.weight_decay = 0.0f;
  EXPECT_NE(run_training(cfg, train_data_parallel).ranks[0].param_hash, dflt);
}

TEST_F(DataParallelCheckpoint, SavingIsNotCountedAsTrainingTraffic) {
  test::expect_saving_is_not_counted_as_training_traffic(train_data_parallel, dir_);
}

}  // namespace
}  // namespace zf
