// test_compute.cpp: bf16 compute (--compute bf16, what the bf16 recipe uses
// on a GPU by default), checked on the CPU device's emulation of it
// (device.h: the float32 kernels on widened copies, each output rounded to
// bf16 once). It must keep what the stage tests promise for f32 compute:
// every stage trains to stage 00's bits, it stays close to f32 compute, and
// its activations take half the bytes with no widening workspace.
// Also --attention flash on the CPU device (the CUDA-core flash kernels' code
// run one thread at a time, flash_attention_cpu.cpp): the model's flash path
// (what attention keeps, its scratch, the backward from lse) end to end.
//
//   build/tests/test_compute
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "stages/stage_test_util.h"
#include "test_util.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

using test::quiet_config;

TrainConfig bf16_config(const ModelConfig& m, int N, int steps, DType compute) {
  TrainConfig cfg = test::config(m, N, 1, steps, Precision::bf16);
  cfg.compute = compute;
  return cfg;
}

// K = 1: the stages differ only in where parameters and gradients live and
// how they are summed across ranks (in rank order, bit for bit the same
// sums: comm.h), never in the arithmetic of a rank's forward and backward,
// so with bf16 compute too they must give stage 00's losses and final
// parameters to the bit. The "odd" model pads every unit at N = 3.
TEST(Bf16Compute, EveryStageBitIdenticalToDataParallel) {
  for (const auto& [model, N] : {std::pair{model_preset("tiny"), 2}, std::pair{test::odd_model(), 3}}) {
    const TrainConfig cfg = bf16_config(model, N, 3, DType::bf16);
    SCOPED_TRACE(model.name + ", N=" + std::to_string(N));
    const RunResult ref = run_training(cfg, train_data_parallel);
    for (StageFn fn : {StageFn(train_zero1), StageFn(train_zero2), StageFn(train_zero3)}) {
      const RunResult got = run_training(cfg, fn);
      for (const auto& r : got.ranks) {
        EXPECT_EQ(r.losses, ref.ranks[0].losses);
        EXPECT_EQ(r.param_hash, ref.ranks[0].param_hash);
      }
    }
  }
}

// bf16 compute rounds every activation and every gradient op's output to 8
// significant bits (relative error up to 2^-9 = 2e-3 per rounding), but the
// loss is a mean over B*T*N = 128 positions and the roundings are unbiased,
// so it moves far less: tolerance 3e-3 on
// max |loss(bf16 compute) - loss(f32 compute)| (tiny, N = 2, B = 1,
// 10 steps, lr 3e-4, losses ~5.5). A real error in the plumbing moves it
// much more: training on other batches changes the loss by far more than the
// tolerance (stage_test_util.h, gradient accumulation), a missing gradient
// term stops the loss from falling.
// The losses must also differ (bf16 compute really happened).
TEST(Bf16Compute, CloseToF32Compute) {
  const TrainConfig f32 = bf16_config(model_preset("tiny"), 2, 10, DType::f32);
  const TrainConfig b16 = bf16_config(model_preset("tiny"), 2, 10, DType::bf16);
  const RunResult a = run_training(f32, train_data_parallel);
  const RunResult b = run_training(b16, train_data_parallel);
  ASSERT_EQ(a.ranks[0].losses.size(), b.ranks[0].losses.size());
  double max_diff = 0.0;
  for (size_t s = 0; s < a.ranks[0].losses.size(); ++s)
    max_diff = std::max(max_diff, std::fabs(double(a.ranks[0].losses[s]) - b.ranks[0].losses[s]));
  EXPECT_LT(max_diff, 3e-3);
  EXPECT_GT(max_diff, 0.0) << "bf16 compute gave float32's losses to the bit: was it used?";
  EXPECT_NE(a.ranks[0].param_hash, b.ranks[0].param_hash);
  // And it trains: the loss falls over the 10 steps.
  EXPECT_LT(b.ranks[0].losses.back(), b.ranks[0].losses.front() - 0.1);
}

// Memory: bf16 compute keeps the compute-dtype activations in 2 bytes
// instead of 4 (LayerNorm statistics, losses and the attention scratch stay
// float32) and needs no float32 copy of a unit's parameters and gradient.
TEST(Bf16Compute, HalvesActivationsAndNeedsNoWorkspace) {
  const RunResult a = run_training(bf16_config(model_preset("tiny"), 1, 1, DType::f32), train_data_parallel);
  const RunResult b = run_training(bf16_config(model_preset("tiny"), 1, 1, DType::bf16), train_data_parallel);
  const MemoryCounts& ma = a.ranks[0].memory;
  const MemoryCounts& mb = b.ranks[0].memory;
  const size_t act_a = ma.pk(Place::device, Category::activations);
  const size_t act_b = mb.pk(Place::device, Category::activations);
  // tiny, B = 1: of f32 compute's activation bytes, the float32-only
  // tensors (statistics, losses, attention scratch) are a small part, so bf16
  // compute needs a little over half.
  EXPECT_LT(act_b, act_a * 6 / 10);
  EXPECT_GT(act_b, act_a / 2);
  EXPECT_GT(ma.pk(Place::device, Category::workspace), 0u);
  EXPECT_EQ(mb.pk(Place::device, Category::workspace), 0u);
  // Model states are the recipe's, whatever the compute dtype.
  EXPECT_EQ(ma.model_states(Place::device), mb.model_states(Place::device));
}

// --attention flash trains like the simple form: the same formula summed in
// another order (float32, a few ulps per op), tolerance 1e-5, while an
// update 1% off moves the tiny model's loss by far more than the tolerance.
// The final parameters must differ (the hash), or the flash path did not
// run. Its attention keeps lse [B,H,T] (4 bytes a row) instead of the
// probabilities [B,H,T,T], so the activations shrink.
// Every stage with flash attention keeps stage 00's bits (the same argument
// as above: the stages never change a rank's arithmetic).
TEST(FlashAttentionOnTheCpu, TrainsLikeTheSimpleFormInEveryStage) {
  TrainConfig cfg = quiet_config("tiny", 2, 2, 5);
  const RunResult simple = run_training(cfg, train_data_parallel);
  cfg.attention = AttentionForm::flash;
  const RunResult flash = run_training(cfg, train_data_parallel);
  ASSERT_EQ(flash.ranks[0].losses.size(), 5u);
  for (size_t s = 0; s < 5; ++s) EXPECT_NEAR(flash.ranks[0].losses[s], simple.ranks[0].losses[s], 1e-5) << s;
  EXPECT_NE(flash.ranks[0].param_hash, simple.ranks[0].param_hash) << "the flash path did not run";
  const auto acts = [](const RunResult& r) { return r.ranks[0].memory.pk(Place::device, Category::activations); };
  // tiny (L=2, H=4, T=64), B=2, float32: per layer the probabilities
  // B*H*T*T*4 = 128 KiB against lse B*H*T*4 = 2 KiB; and the one attention
  // scratch, T*T floats (simple) against B*H*T (flash: D).
  const size_t B = 2, H = 4, T = 64;
  EXPECT_EQ(acts(simple) - acts(flash), 2 * (B * H * T * T - B * H * T) * 4 + (T * T - B * H * T) * 4);
  for (StageFn fn : {StageFn(train_zero1), StageFn(train_zero2), StageFn(train_zero3)}) {
    const RunResult got = run_training(cfg, fn);
    EXPECT_EQ(got.ranks[0].losses, flash.ranks[0].losses);
    EXPECT_EQ(got.ranks[0].param_hash, flash.ranks[0].param_hash);
  }
}

}  // namespace
}  // namespace zf
