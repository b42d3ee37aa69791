// test_sample.cpp: text samples (--sample-every, sample.h). The draw from
// the logits against probabilities computed here; a greedy sample's tokens
// against the double-precision reference's likeliest next token (the prompt
// shorter than T, and longer: the last T tokens); the same text in every
// stage, at every N before training, and from a checkpoint (--steps 0
// --init); and the sampling's collectives apart from training's.
//
//   meson test -C build sample
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "data_parallel.h"
#include "fsdp.h"
#include "extensions/offload.h"
#include "sample.h"
#include "stages/gradient_check.h"
#include "stages/stage_test_util.h"
#include "test_util.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

using test::quiet_config;

// ------------------------------------------------------------------ the draw

TEST(SampleToken, GreedyIsTheLargestLogitTheFirstOfEquals) {
  const float logits[] = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sample_token(logits, 4, 0.0f, 0, 0.99), 1);
  EXPECT_EQ(sample_token(logits, 4, 1.0f, 1, 0.99), 1) << "top-k 1 is greedy whatever u";
}

// Two tokens with logits 0 and ln 3: probabilities 1/4 and 3/4, the likelier
// first in the cumulative order; at temperature 2, 1 : sqrt(3).
TEST(SampleToken, InvertsTheCumulativeDistribution) {
  const float logits[] = {0.0f, float(std::log(3.0))};
  EXPECT_EQ(sample_token(logits, 2, 1.0f, 0, 0.0), 1);
  EXPECT_EQ(sample_token(logits, 2, 1.0f, 0, 0.7499), 1);
  EXPECT_EQ(sample_token(logits, 2, 1.0f, 0, 0.7501), 0);
  const double p1 = std::sqrt(3.0) / (1.0 + std::sqrt(3.0));  // 0.634
  EXPECT_EQ(sample_token(logits, 2, 2.0f, 0, p1 - 1e-4), 1);
  EXPECT_EQ(sample_token(logits, 2, 2.0f, 0, p1 + 1e-4), 0);
}

TEST(SampleToken, TopKDrawsAmongTheKLikeliestOnly) {
  const float logits[] = {5.0f, 1.0f, 4.0f, 0.0f};
  const double p0 = std::exp(5.0) / (std::exp(5.0) + std::exp(4.0));  // 0.731
  EXPECT_EQ(sample_token(logits, 4, 1.0f, 2, p0 - 1e-4), 0);
  EXPECT_EQ(sample_token(logits, 4, 1.0f, 2, p0 + 1e-4), 2);
  EXPECT_EQ(sample_token(logits, 4, 1.0f, 2, 0.99999), 2);
  EXPECT_EQ(sample_token(logits, 4, 1.0f, 0, 0.99999), 3) << "without top-k the least likely can come";
}

TEST(SampleToken, UniformIsAFunctionOfSeedAndPosition) {
  EXPECT_EQ(sample_uniform(7, 3), sample_uniform(7, 3));
  EXPECT_NE(sample_uniform(7, 3), sample_uniform(7, 4));
  EXPECT_NE(sample_uniform(7, 3), sample_uniform(8, 3));
  for (uint64_t i = 0; i < 1000; ++i) {
    const double u = sample_uniform(1337, i);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

TEST(SampleToken, TextShowsBytesAndLargerIds) {
  EXPECT_EQ(tokens_to_text({'a', 'b', '\n', 1, 300, 255}), "ab\n\\x01<300>\\xff");
}

// ------------------------------------------------------------------ whole runs

TrainConfig sampling(int N, int steps, float temperature) {
  TrainConfig cfg = quiet_config("tiny", N, 2, steps);
  cfg.lr = 3e-3f;
  cfg.sample_every = 2;
  cfg.sample.length = 12;
  cfg.sample.temperature = temperature;
  cfg.sample.top_k = temperature > 0 ? 40 : 0;
  return cfg;
}

// Greedy: each token is the reference's likeliest after the context (the
// prompt, then the last T tokens of it), computed here in double from the
// initial model (--save-init). The reference scores a candidate next token
// by the loss of a sequence whose target at that position is the
// candidate: only that position's term changes. Ties within float32's
// rounding would make either token right: the chosen one must be within
// 1e-4 nats of the likeliest.
class SampleRun : public test::TempDirTest {};

TEST_F(SampleRun, GreedySamplesFollowTheReference) {
  const ref::Shape s = test::tiny_shape();
  for (size_t prompt_len : {size_t(5), size_t(s.T + 7)}) {
    std::string prompt;
    for (size_t i = 0; i < prompt_len; ++i) prompt += char('a' + (i * 7) % 26);
    TrainConfig cfg = sampling(2, 0, 0.0f);
    cfg.sample.prompt = prompt;
    cfg.sample.length = 2;
    cfg.save_init = dir_ + "/init.safetensors";
    const RunResult run = run_training(cfg, train_zero3);
    ASSERT_EQ(run.ranks[0].samples.size(), 1u);
    const std::vector<int32_t> made = run.ranks[0].samples[0].second;
    ASSERT_EQ(made.size(), 2u);
    const ref::Params p = test::read_params(cfg.save_init);
    std::vector<int32_t> context(prompt.begin(), prompt.end());
    for (int32_t next : made) {
      const size_t start = context.size() > size_t(s.T) ? context.size() - s.T : 0;
      std::vector<int32_t> in(size_t(s.T), 0), tgt(size_t(s.T), 0);
      std::copy(context.begin() + long(start), context.end(), in.begin());
      const int pos = int(context.size() - start) - 1;
      std::vector<double> nll(size_t(s.V));
      for (int t = 0; t < s.V; ++t) {
        tgt[size_t(pos)] = t;
        nll[size_t(t)] = ref::sequence_loss(s, p, in.data(), tgt.data()) * s.T;  // only position pos varies
      }
      const double best = *std::min_element(nll.begin(), nll.end());
      EXPECT_LE(nll[size_t(next)] - best, 1e-4) << "prompt of " << prompt_len << " chars, token " << next;
      context.push_back(next);
    }
  }
}

// Every stage writes the same text where it trains the same model; before
// training (the sample after 0 steps) at every N too.
TEST(Sample, SameTextInEveryStageAndAtEveryN) {
  const StageFn stages[] = {train_data_parallel, train_zero1, train_zero2, train_zero3, train_fsdp,
                            with_options(train_offload_extended, {})};
  std::vector<int32_t> first;
  for (int N : {1, 2, 3}) {
    const TrainConfig cfg = sampling(N, 4, 0.8f);
    const RunResult dp = run_training(cfg, train_data_parallel);
    ASSERT_EQ(dp.ranks[0].samples.size(), 3u);  // after 0, 2 and 4 steps
    EXPECT_EQ(dp.ranks[0].samples[0].first, 0);
    EXPECT_EQ(dp.ranks[0].samples[2].first, 4);
    EXPECT_NE(dp.ranks[0].samples[0].second, dp.ranks[0].samples[2].second) << "training changes it";
    if (first.empty()) first = dp.ranks[0].samples[0].second;
    EXPECT_EQ(dp.ranks[0].samples[0].second, first) << "N = " << N;
    for (const StageFn& fn : stages) {
      const RunResult got = run_training(cfg, fn);
      for (const auto& r : got.ranks) EXPECT_EQ(r.samples, dp.ranks[0].samples) << "N = " << N;
    }
  }
}

// --steps 0 --init FILE generates from a saved model: the text a run wrote
// after its last step, from its checkpoint, in another stage and N; and
// sampling changes nothing of training (its collectives are counted apart).
TEST_F(SampleRun, GeneratesFromACheckpoint) {
  TrainConfig cfg = sampling(2, 4, 0.8f);
  cfg.save = dir_ + "/ck.safetensors";
  const RunResult trained = run_training(cfg, train_data_parallel);
  TrainConfig plain = cfg;
  plain.sample_every = 0;
  plain.save.clear();
  const RunResult without = run_training(plain, train_data_parallel);
  EXPECT_EQ(trained.ranks[0].comm.bytes, without.ranks[0].comm.bytes);
  EXPECT_EQ(trained.ranks[0].param_hash, without.ranks[0].param_hash);

  TrainConfig gen = sampling(3, 0, 0.8f);
  gen.init = cfg.save;
  const RunResult made = run_training(gen, train_fsdp);
  ASSERT_EQ(made.ranks[0].samples.size(), 1u);
  EXPECT_EQ(made.ranks[0].samples[0].second, trained.ranks[0].samples.back().second);
}

// The draws are --sample-seed's alone: from one model, another --seed
// (which draws the initial model and nothing else here) writes the same
// text, and another --sample-seed other text.
TEST_F(SampleRun, TheSampleSeedAloneDrawsTheTokens) {
  TrainConfig cfg = sampling(2, 0, 1.0f);
  cfg.sample.length = 24;
  cfg.save_init = dir_ + "/init.safetensors";
  run_training(cfg, train_data_parallel);
  cfg.save_init.clear();
  cfg.init = dir_ + "/init.safetensors";
  auto text = [&](uint64_t seed, uint64_t sample_seed) {
    TrainConfig c = cfg;
    c.seed = seed;
    c.sample.seed = sample_seed;
    const RunResult run = run_training(c, train_data_parallel);
    EXPECT_EQ(run.ranks[0].samples.size(), 1u);
    return run.ranks[0].samples.empty() ? std::vector<int32_t>{} : run.ranks[0].samples[0].second;
  };
  const std::vector<int32_t> first = text(11, 5);
  EXPECT_EQ(text(12, 5), first);
  EXPECT_NE(text(11, 6), first);
}

}  // namespace
}  // namespace zf
