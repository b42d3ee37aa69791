// test_checkpoint.cpp: training checkpoints (--save, --save-every, --resume;
// common/io/checkpoint.h), what does not belong to one stage. What a user
// relies on:
// - A run stopped and resumed trains exactly as if it had not stopped, bit
//   for bit; --save-every keeps the last due checkpoint when a rank fails
//   later; saving is not counted as training's communication: checked per
//   stage, in each stage's file (test_dp.cpp, test_zero1.cpp, ...: the
//   Checkpoint tests, written once in stage_test_util.h).
// - The checkpoint is consolidated: saved by one stage at N ranks, it resumes
//   in any stage at any N (the same bits at the same N, since every stage
//   matches stage 00's; at another N, stage 00's own tolerance).
// - Mismatched or unusable files are refused up front with a message that
//   says what to do, and --init accepts a checkpoint as a model.
//
//   meson test -C build checkpoint
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint.h"
#include "safetensors.h"
#include "stages/stage_test_util.h"
#include "test_util.h"
#include "zero1.h"
#include "zero3.h"

namespace zf {
namespace {

using test::quiet_config;
using test::tail;

class Checkpoint : public test::TempDirTest {};

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

// The numbers in a checkpoint's metadata are checked where they are read:
// a damaged one (ranks "-7", a batch that is not a number) is refused up
// front naming the file and the key, not printed back as if it were fine.
TEST_F(Checkpoint, DamagedMetadataNumbersAreRefused) {
  const ModelLayout layout = build_layout(model_preset("tiny"));
  const std::vector<float> zeros(layout.numel, 0.0f);
  auto write = [&](const std::string& name, const std::map<std::string, std::string>& meta) {
    const std::string file = path(name);
    save_checkpoint(file, layout, zeros.data(), zeros.data(), zeros.data(), 1, meta);
    return file;
  };
  const std::string good = write("good.safetensors", {{"stage", "dp"}, {"ranks", "2"}, {"global_batch", "4"},
                                                      {"seed", "18446744073709551615"}});
  EXPECT_NO_THROW(CheckpointReader(good, layout));
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"ranks", "-7"}, {"ranks", "0"}, {"ranks", "two"}, {"ranks", "99999999999999999999"},
           {"global_batch", "4x"}, {"global_batch", ""}, {"seed", "-1"}}) {
    const std::string file = write(key + ".safetensors", {{key, value}});
    try {
      CheckpointReader reader(file, layout);
      ADD_FAILURE() << key << "=" << value << " accepted";
    } catch (const UsageError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(file), std::string::npos) << what;
      EXPECT_NE(what.find("'" + key + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("'" + value + "'"), std::string::npos) << what;
    }
  }
  // Through the binary: exit 2 with the message, before any step.
  const std::string bad = write("bad.safetensors", {{"ranks", "-7"}});
  const auto r = test::run_command(test::dp_binary() + " --model tiny --batch 1 --steps 3 --resume " + bad);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'ranks'"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("-7 ranks"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace zf
