// test_checkpoint.cpp: training checkpoints (--save, --save-every, --resume;
// common/io/checkpoint.h). What a user relies on:
// - A run stopped and resumed trains exactly as if it had not stopped: the
//   same losses from the resumed step on and the same final parameters, bit
//   for bit (the checkpoint holds AdamW's float32 state and the step; the
//   batches depend on the step alone), in every stage, both recipes, with
//   padding (N = 3), and with gradient accumulation.
// - The checkpoint is consolidated: saved by one stage at N ranks, it resumes
//   in any stage at any N (the same bits at the same N, since every stage
//   matches stage 00's; at another N, stage 00's own tolerance).
// - --save-every keeps the last due checkpoint when a rank fails later: no
//   lost work beyond save_every steps.
// - Mismatched or unusable files are refused up front with a message that
//   says what to do, and --init accepts a checkpoint as a model.
// - Saving moves data between ranks but is not counted as training's
//   communication.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint.h"
#include "safetensors.h"
#include "test_util.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

using test::quiet_config;

struct StageCase {
  const char* name;
  StageFn fn;
};
const StageCase kStages[] = {{"dp", train_data_parallel},
                             {"zero1", train_zero1},
                             {"zero2", train_zero2},
                             {"zero3", train_zero3}};

class Checkpoint : public test::TempDirTest {};

// The losses of steps [from, end) of a run that started at step 0.
std::vector<float> tail(const RunResult& r, int from) {
  const auto& l = r.ranks[0].losses;
  return std::vector<float>(l.begin() + from, l.end());
}

// Stopped after 3 steps and resumed to 7 = 7 steps in one go, bit for bit:
// every stage, both recipes, N = 2 and 3 (padding), K = 2 once.
TEST_F(Checkpoint, ResumeContinuesBitForBit) {
  for (const StageCase& st : kStages)
    for (Precision prec : {Precision::fp32, Precision::bf16})
      for (int N : {2, 3}) {
        SCOPED_TRACE(std::string(st.name) + " " + precision_name(prec) + " N=" + std::to_string(N));
        TrainConfig cfg = quiet_config("tiny", N, 2, 7);
        cfg.precision = prec;
        cfg.grad_accum = N == 3 ? 2 : 1;
        const RunResult whole = run_training(cfg, st.fn);

        TrainConfig first = cfg;
        first.steps = 3;
        first.save = path("ck.safetensors");
        run_training(first, st.fn);
        EXPECT_EQ(CheckpointReader(first.save, build_layout(cfg.model)).step(), 3);

        TrainConfig second = cfg;
        second.resume = first.save;
        const RunResult resumed = run_training(second, st.fn);
        ASSERT_EQ(resumed.ranks[0].losses.size(), 4u);
        EXPECT_EQ(resumed.ranks[0].first_step, 3);
        EXPECT_EQ(resumed.ranks[0].losses, tail(whole, 3));
        for (const auto& rank : resumed.ranks) EXPECT_EQ(rank.param_hash, whole.ranks[0].param_hash);
      }
}

// One file for every stage and rank count: saved by stage 00 with 2 ranks,
// resumed by ZeRO-3 with 2 ranks (the same bits: stages agree at the same N)
// and by ZeRO-1 with 4 ranks of half the batch (the same global batch, so the
// same data; another N sums in another order: stage 00's tolerance across N,
// 1e-5 on the tiny model's loss, as test_dp.cpp uses).
TEST_F(Checkpoint, ResumesInAnotherStageAndRankCount) {
  TrainConfig cfg = quiet_config("tiny", 2, 4, 6);
  const RunResult whole = run_training(cfg, train_data_parallel);
  TrainConfig first = cfg;
  first.steps = 2;
  first.save = path("dp.safetensors");
  run_training(first, train_data_parallel);

  TrainConfig same_n = cfg;
  same_n.resume = first.save;
  const RunResult z3 = run_training(same_n, train_zero3);
  EXPECT_EQ(z3.ranks[0].losses, tail(whole, 2));
  EXPECT_EQ(z3.ranks[0].param_hash, whole.ranks[0].param_hash);

  TrainConfig four = same_n;
  four.ranks = 4;
  four.batch = 2;
  const RunResult z1 = run_training(four, train_zero1);
  ASSERT_EQ(z1.ranks[0].losses.size(), 4u);
  for (size_t s = 0; s < 4; ++s) EXPECT_NEAR(z1.ranks[0].losses[s], whole.ranks[0].losses[s + 2], 1e-5) << s;
}

// A rank fails in step 4 of 6 with --save-every 2: the file holds step 4
// (saved after steps 2 and 4 completed, the second replacing the first), and
// resuming from it finishes the run as if nothing had happened.
TEST_F(Checkpoint, SaveEveryKeepsWorkWhenARankFails) {
  for (const StageCase& st : kStages) {
    SCOPED_TRACE(st.name);
    TrainConfig cfg = quiet_config("tiny", 2, 2, 6);
    const RunResult whole = run_training(cfg, st.fn);
    TrainConfig failing = cfg;
    failing.save = path(std::string(st.name) + ".safetensors");
    failing.save_every = 2;
    failing.fault_rank = 1;
    failing.fault_step = 4;
    EXPECT_THROW(run_training(failing, st.fn), Error);
    EXPECT_EQ(CheckpointReader(failing.save, build_layout(cfg.model)).step(), 4);
    TrainConfig resume = cfg;
    resume.resume = failing.save;
    const RunResult rest = run_training(resume, st.fn);
    EXPECT_EQ(rest.ranks[0].losses, tail(whole, 4));
    EXPECT_EQ(rest.ranks[0].param_hash, whole.ranks[0].param_hash);
  }
}

// Saving gathers every moment and parameter (ZeRO-3: 3 more all_gathers of
// the model), but the run's communication is training's alone: the same
// bytes per step with and without --save.
TEST_F(Checkpoint, SavingIsNotCountedAsTrainingTraffic) {
  TrainConfig cfg = quiet_config("tiny", 2, 2, 4);
  const RunResult plain = run_training(cfg, train_zero3);
  cfg.save = path("z3.safetensors");
  cfg.save_every = 1;
  const RunResult saving = run_training(cfg, train_zero3);
  EXPECT_EQ(saving.ranks[0].comm.bytes, plain.ranks[0].comm.bytes);
  EXPECT_EQ(saving.ranks[0].comm.calls, plain.ranks[0].comm.calls);
}

// The file: the model under docs/SPEC.md's names (so --init reads it as a model),
// the moments under optim.m.* / optim.v.*, and optim.step.
TEST_F(Checkpoint, FileLayoutAndInit) {
  TrainConfig cfg = quiet_config("tiny", 1, 2, 2);
  cfg.save = path("ck.safetensors");
  const RunResult r = run_training(cfg, train_data_parallel);
  SafetensorsReader st(cfg.save);
  const ModelLayout layout = build_layout(cfg.model);
  size_t n = 0;
  for (const auto& u : layout.units)
    for (const auto& p : u.params) {
      EXPECT_TRUE(st.has(p.name) && st.has("optim.m." + p.name) && st.has("optim.v." + p.name)) << p.name;
      n += 3;
    }
  EXPECT_TRUE(st.has("optim.step"));
  EXPECT_EQ(st.tensors().size(), n + 1);
  EXPECT_EQ(st.metadata().at("format"), "zero-to-fsdp training checkpoint");

  // --init: the model only, a fresh optimizer at step 0; the model is the
  // saved one (a 0-step run's hash is its initial model's).
  TrainConfig init = quiet_config("tiny", 1, 2, 0);
  init.init = cfg.save;
  EXPECT_EQ(run_training(init, train_data_parallel).ranks[0].param_hash, r.ranks[0].param_hash);
}

// Files --resume must refuse, before any step, saying what to do.
TEST_F(Checkpoint, UnusableFilesAreRefusedWithTheReason) {
  TrainConfig cfg = quiet_config("tiny", 1, 2, 2);
  cfg.save_init = path("model.safetensors");
  cfg.save = path("ck.safetensors");
  run_training(cfg, train_data_parallel);

  auto refusal = [&](TrainConfig c) {
    try {
      run_training(c, train_data_parallel);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  TrainConfig model_only = quiet_config("tiny", 1, 2, 4);
  model_only.resume = cfg.save_init;
  EXPECT_NE(refusal(model_only).find("no optimizer state"), std::string::npos) << refusal(model_only);
  EXPECT_NE(refusal(model_only).find("--init"), std::string::npos);

  TrainConfig done = quiet_config("tiny", 1, 2, 2);  // saved after 2 steps; --steps 2
  done.resume = cfg.save;
  EXPECT_NE(refusal(done).find("nothing left to train"), std::string::npos) << refusal(done);

  TrainConfig other_model = quiet_config("small", 1, 2, 4);
  other_model.resume = cfg.save;
  EXPECT_NE(refusal(other_model).find("--model"), std::string::npos) << refusal(other_model);

  TrainConfig missing = quiet_config("tiny", 1, 2, 4);
  missing.resume = path("absent.safetensors");
  EXPECT_NE(refusal(missing).find("absent.safetensors"), std::string::npos) << refusal(missing);
}

}  // namespace
}  // namespace zf
