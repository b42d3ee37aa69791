// test_memory_model.cpp: the arithmetic the stages' memory tests measure
// against, checked on its own, with no training: shard.h's padding rule
// (the stage tests' cases really pad, and make_shard_layout agrees with the
// rule), the formulas of common/estimate/memory_model.h (docs/SPEC.md's table),
// and the memory_estimate tool that prints them (test_estimate.cpp holds
// the tool's other numbers to measured runs). Each stage's own model
// states against these formulas are in its file (test_dp.cpp,
// test_zero1.cpp, ...: ModelStatesMatchSpecFormulas).
//
//   meson test -C build memory_model
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "memory_model.h"
#include "shard.h"
#include "stages/stage_test_util.h"
#include "test_util.h"

namespace zf {
namespace {

using test::odd_model;
using test::Sizes;
using test::sizes_of;

TEST(MemoryModel, PaddingReallyOccurs) {
  // The stages' parity and memory tests run these (model, N) pairs because
  // they pad: the padded layout is strictly larger than the model.
  EXPECT_GT(sizes_of(model_preset("tiny"), 3).padded, sizes_of(model_preset("tiny"), 3).P);
  for (int N : {3, 4, 8}) {
    const Sizes s = sizes_of(odd_model(), N);
    EXPECT_GT(s.padded, s.P) << "N=" << N;
    EXPECT_LE(s.padded - s.P, s.units * (N - 1)) << "N=" << N;  // at most N-1 per unit
  }
  // And these do not (so 00 and 01-03 have the same sizes there).
  for (int N : {1, 2, 4, 8}) EXPECT_EQ(sizes_of(model_preset("tiny"), N).padded, sizes_of(model_preset("tiny"), N).P);
  // The shard layout of the code agrees with the rule.
  for (int N : {3, 8}) {
    const ModelLayout layout = build_layout(odd_model());
    const Sizes s = sizes_of(odd_model(), N);
    for (int r = 0; r < N; ++r) {
      const ShardLayout sh = make_shard_layout(layout, N, r);
      EXPECT_EQ(sh.padded_total, s.padded);
      EXPECT_EQ(sh.shard_total, s.shard);
    }
  }
}

TEST(MemoryModel, SpecTableUnpadded) {
  // docs/SPEC.md's table at P = 1e9, N = 4.
  const ModelSizes z = unpadded_sizes(1e9, 4);
  auto dev = [&](Stage s, Precision p) { return model_state_bytes(s, p, z).device.total(); };
  EXPECT_EQ(dev(Stage::dp, Precision::bf16), 16e9);
  EXPECT_EQ(dev(Stage::zero1, Precision::bf16), 7e9);    // 4P + 12P/N
  EXPECT_EQ(dev(Stage::zero2, Precision::bf16), 5.5e9);  // 2P + 14P/N
  EXPECT_EQ(dev(Stage::zero3, Precision::bf16), 4e9);    // 16P/N
  EXPECT_EQ(dev(Stage::fsdp, Precision::bf16), 4e9);
  EXPECT_EQ(dev(Stage::dp, Precision::fp32), 16e9);
  EXPECT_EQ(dev(Stage::zero1, Precision::fp32), 10e9);   // 8P + 8P/N
  EXPECT_EQ(dev(Stage::zero2, Precision::fp32), 7e9);    // 4P + 12P/N
  EXPECT_EQ(dev(Stage::zero3, Precision::fp32), 4e9);
  // 05 offload: the bf16 copy, 2P/N, on the device; stage 04's 16P/N and
  // the bf16 copy on the host (18P/N); nothing on the device with parameter
  // offload. fp32: the float32 shard is the copy (device 4P/N, host 16P/N).
  const ModelStateBytes off = model_state_bytes(Stage::offload, Precision::bf16, z);
  EXPECT_EQ(off.device.total(), 0.5e9);
  EXPECT_EQ(off.host.total(), 4.5e9);
  const ModelStateBytes offp = model_state_bytes(Stage::offload, Precision::bf16, z, {.offload_params = true});
  EXPECT_EQ(offp.device.total(), 0.0);
  EXPECT_EQ(offp.host.total(), 4.5e9);
  EXPECT_EQ(model_state_bytes(Stage::offload, Precision::fp32, z).device.total(), 1e9);  // 4P/N
  EXPECT_EQ(model_state_bytes(Stage::offload, Precision::fp32, z).host.total(), 4e9);    // 16P/N
}

std::string estimator_binary() {
  const char* p = std::getenv("ZF_MEMORY_ESTIMATE_BIN");
  return p ? p : "build/tools/memory_estimate";
}

TEST(MemoryEstimate, WorkedExample) {
  auto r = test::run_command(estimator_binary() + " --params 1e9 --ranks 4 --precision bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Rows 00 .. 05 in order, decimal GB with GiB alongside.
  size_t at = 0;
  for (const char* want : {"00 data parallel", "16 GB (14.901 GiB)", "01 ZeRO-1", "7 GB (6.519 GiB)", "02 ZeRO-2",
                           "5.5 GB (5.122 GiB)", "03 ZeRO-3", "4 GB (3.725 GiB)", "04 FSDP", "4 GB (3.725 GiB)",
                           "05 offload", "500 MB"}) {
    size_t pos = r.output.find(want, at);
    ASSERT_NE(pos, std::string::npos) << "missing or out of order: '" << want << "' in\n" << r.output;
    at = pos;
  }
  // The same P written other ways.
  auto r2 = test::run_command(estimator_binary() + " --params 1000000000 --ranks 4 --precision bf16");
  EXPECT_EQ(r2.output, r.output);
  // A preset: padded per unit, still close to the formula.
  auto r3 = test::run_command(estimator_binary() + " --model gpt2 --ranks 8 --precision fp32");
  EXPECT_EQ(r3.exit_code, 0) << r3.output;
  EXPECT_NE(r3.output.find("padded"), std::string::npos) << r3.output;
}

TEST(MemoryEstimate, BadFlagsAreUsageErrors) {
  struct Case {
    const char* args;
    const char* says;
  };
  for (Case c : {Case{"", "--params"}, Case{"--params abc", "--params"}, Case{"--params 1e9x", "--params"},
                 Case{"--params 0", "--params"}, Case{"--params 1.5", "whole"}, Case{"--params -5", "--params"},
                 Case{"--params 1e9 --ranks 0", "--ranks"}, Case{"--params 1e9 --precision fp16", "--precision"},
                 Case{"--params 1e9 --model tiny", "only one of"}, Case{"--model huge", "huge"},
                 Case{"--params 1e9 --bogus", "bogus"}}) {
    auto r = test::run_command(estimator_binary() + " " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("memory_estimate: error:"), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
  }
  EXPECT_EQ(test::run_command(estimator_binary() + " --help").exit_code, 0);
}

}  // namespace
}  // namespace zf
