// test_sizes.cpp: sizes that would exhaust the machine or overflow are
// refused before step 0 (exit 2, naming the flags), never found by the
// kernel's out-of-memory killer, a bad_alloc or an abort: the products of
// flags that size buffers and counts (estimate.h's check_run_sizes), and
// the host memory a run's ranks would take (runner.cpp).
//
// The children run under an address-space limit and a timeout, so that a
// regression fails here instead of taking the machine's memory.
#include <gtest/gtest.h>

#include <string>

#include "estimate.h"
#include "test_util.h"

namespace zf {
namespace {

std::string bin(const char* env, const char* fallback) {
  const char* p = std::getenv(env);
  return p ? p : fallback;
}
std::string memory_estimate() { return bin("ZF_MEMORY_ESTIMATE_BIN", "build/tools/memory_estimate"); }

// `command` under 8 GiB of address space and 120 s.
test::ProcessResult limited(const std::string& command) {
  return test::run_command("(" + test::address_space_limit("8388608") + "timeout -s KILL 120 " + command + ")");
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(RunSizes, EachProductOutOfRangeIsRefusedNamingItsFlags) {
  TrainConfig cfg = test::quiet_config("small", 8, 4, 1);
  check_run_sizes(cfg, 8);  // an ordinary run passes
  cfg.batch = 2147483647;
  EXPECT_TRUE(has(test::refusal([&] { check_run_sizes(cfg, 8); }), "--batch 2147483647")) << "B x T";
  cfg.batch = 16777216;  // B x T = 2^31: one past an int
  EXPECT_TRUE(has(test::refusal([&] { check_run_sizes(cfg, 1); }), "--batch"));
  cfg.batch = 16777215;  // B x T = 2^31 - 128
  check_run_sizes(cfg, 1);
  cfg.batch = 100000;
  cfg.grad_accum = 2000000000;  // 8 x 1e5 x 2e9 x 128 = 2e17 tokens a step
  const std::string tokens = test::refusal([&] { check_run_sizes(cfg, 8); });
  EXPECT_TRUE(has(tokens, "--grad-accum 2000000000") && has(tokens, "--ranks 8")) << tokens;
  cfg.grad_accum = 1;
  cfg.val_every = 1;
  cfg.val_batches = 2000000000;
  cfg.batch = 2000000;
  EXPECT_TRUE(has(test::refusal([&] { check_run_sizes(cfg, 4096); }), "--val-batches 2000000000"));
}

// The sizes, through the programs: a dry run's batch whose
// activation bytes overflowed (a crash), and the same in memory_estimate's
// time column; a dry run's token buffers too large for the machine.
TEST(RunSizes, DryRunsAndTheEstimatorRefuseABatchOutOfRange) {
  for (const std::string& exe : {test::dp_binary(), memory_estimate() + " --model small --hardware h100-sxm --stage dp"}) {
    const std::string flags = exe == test::dp_binary() ? " --clock modeled --dry-run --steps 1 --quiet" : "";
    const test::ProcessResult r = limited(exe + flags + " --batch 2147483647");
    EXPECT_EQ(r.exit_code, 2) << exe << "\n" << r.output;
    EXPECT_TRUE(has(r.output, "--batch 2147483647")) << r.output;
  }
  // 8 ranks x 12 bytes x 2e6 x 1024 positions (gpt2, B x T under 2^31): 196 GB of token buffers.
  const test::ProcessResult r =
      limited(test::dp_binary() + " --model gpt2 --ranks 8 --batch 2000000 --clock modeled --dry-run --steps 1 --quiet");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "--dry-run") && has(r.output, "host memory") && has(r.output, "free")) << r.output;
}

// A real run of a model far beyond the machine (gpt-70b: more than a
// terabyte of model states) is refused before it allocates anything,
// naming what it needs and what the machine has.
TEST(RunSizes, ARealRunThatCannotFitTheHostIsRefused) {
  const test::ProcessResult r = limited(test::dp_binary() + " --model gpt-70b --steps 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "host memory") && has(r.output, "this machine has")) << r.output;
  EXPECT_FALSE(has(r.output, "step ")) << "it trained: " << r.output;
}

// A dry run of the same model runs: its states are counted on a device that
// has no memory, and never filled (TrainingRun skips the initial state
// whose 70 billion values would take the machine's memory and minutes).
TEST(RunSizes, ADryRunOfAModelBeyondTheHostNeverFillsItsStates) {
  const test::ProcessResult r =
      limited(test::dp_binary() + " --model gpt-70b --steps 1 --clock modeled --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "dry run (nothing computed)") && has(r.output, "median step")) << r.output;
}

}  // namespace
}  // namespace zf
