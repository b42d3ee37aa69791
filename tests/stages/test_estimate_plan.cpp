// test_estimate_plan.cpp: what tools/memory_estimate tells someone planning
// a cluster run: whether each stage's device peak fits the profile's card,
// the largest micro-batch that does, and the --fit family at another
// sequence length. Each expected value comes from estimate_stage here
// (held to measured runs by test_estimate.cpp), never from the tool.
//
//   meson test -C build estimate
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "estimate.h"
#include "hardware.h"
#include "stages/estimate_tool.h"
#include "test_util.h"

namespace zf {
namespace {

using test::estimator;
using test::run_json;

constexpr const char* kPlan = "--model gpt-7b,T=2048 --ranks 64 --precision bf16 --compute bf16 --attention flash";

RunConfig plan_config(int batch) {
  RunConfig cfg;
  cfg.model = parse_model("gpt-7b,T=2048");
  cfg.ranks = 64;
  cfg.precision = Precision::bf16;
  cfg.compute = DType::bf16;
  cfg.attention = AttentionForm::flash;
  cfg.batch = batch;
  return cfg;
}

double device_peak(Stage s, int batch) {
  const RunConfig cfg = plan_config(batch);
  return estimate_stage(s, cfg, cfg.offload).device_total();
}

// The largest B whose peak fits `card`, found by counting up: 0 if not even 1.
int largest_batch(Stage s, double card) {
  int b = 0;
  while (device_peak(s, b + 1) <= card) ++b;
  return b;
}

// A 7B model on 64 H100s, micro-batch 8: each stage's peak against the
// card's memory as the profile says it, and the largest micro-batch that
// fits. Data parallel fits no batch (16 P is above the card), ZeRO-2 fits a
// smaller one than 8, ZeRO-3 a larger one.
TEST(EstimatePlan, EachStageAgainstTheCard) {
  const double card = std::round(load_hardware("h100-sxm").memory_gib * double(1 << 30));  // in whole bytes
  const nlohmann::json j = run_json(std::string(kPlan) + " --batch 8 --hardware h100-sxm --json");
  ASSERT_EQ(j["stages"].size(), 6u);
  std::map<std::string, int> most;
  for (const nlohmann::json& st : j["stages"]) {
    const Stage s = parse_stage(st["stage"], "stage");
    SCOPED_TRACE(stage_name(s));
    EXPECT_EQ(st["card"]["bytes"].get<double>(), card);
    EXPECT_EQ(st["card"]["fits"].get<bool>(), device_peak(s, 8) <= card);
    most[stage_name(s)] = largest_batch(s, card);
    EXPECT_EQ(st["card"]["largest_batch"].get<int>(), most[stage_name(s)]);
  }
  EXPECT_EQ(most["dp"], 0);
  EXPECT_GT(most["zero2"], 0);
  EXPECT_LT(most["zero2"], 8);
  EXPECT_GT(most["zero3"], 8);

  // The table says the same: the stage that does not fit is marked, each
  // row ends with its largest batch ("none" for data parallel).
  const auto r = test::run_command("(" + estimator() + " " + kPlan + " --batch 8 --hardware h100-sxm 2>/dev/null)");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  int rows = 0;
  for (std::string line; std::getline(lines, line);) {
    for (const auto& [name, label] : {std::pair{"dp", "00 data parallel "}, std::pair{"zero2", "02 ZeRO-2 "},
                                      std::pair{"zero3", "03 ZeRO-3 "}}) {
      if (line.rfind(label, 0) != 0 || line.find("MiB") != std::string::npos || line.find("%") == std::string::npos)
        continue;  // the memory table's row, not the time table's
      ++rows;
      SCOPED_TRACE(line);
      const bool fits = device_peak(parse_stage(name, "stage"), 8) <= card;
      EXPECT_EQ(line.find("does not fit") == std::string::npos, fits);
      const std::string end = most[name] > 0 ? std::to_string(most[name]) : "none";
      EXPECT_EQ(line.substr(line.size() - end.size()), end);
    }
  }
  EXPECT_EQ(rows, 3) << r.output;
  EXPECT_NE(r.output.find("ZeRO-1 and -2 all-gather each unit's"), std::string::npos)
      << "why their exposed communication is the largest";
  const auto fsdp = test::run_command("(" + estimator() + " " + kPlan + " --batch 8 --stage fsdp --hardware h100-sxm 2>/dev/null)");
  ASSERT_EQ(fsdp.exit_code, 0) << fsdp.output;
  EXPECT_EQ(fsdp.output.find("ZeRO-1 and -2 all-gather"), std::string::npos) << "said only where they are listed";
}

// --fit with --seq: the family at that sequence length. L fits and L + 1
// does not, counted here with T = 4096; a shape flag beside --seq is refused.
TEST(EstimatePlan, FitAtAnotherSequenceLength) {
  const nlohmann::json j = run_json("--fit 80GB --ranks 8 --stage zero3 --precision bf16 --batch 1 --seq 4096 --json");
  EXPECT_NE(j["family"].get<std::string>().find("T = 4096"), std::string::npos) << j["family"];
  ASSERT_EQ(j["fits"].size(), 1u);
  const int L = j["fits"][0]["layers"];
  ASSERT_GT(L, 1);
  RunConfig cfg;
  cfg.ranks = 8;
  cfg.precision = Precision::bf16;
  cfg.batch = 1;
  auto device = [&](int layers) {
    cfg.model = ModelConfig{"fit", 50304, 4096, layers, layers, 128 * layers};
    return estimate_stage(Stage::zero3, cfg, cfg.offload).device_total();
  };
  EXPECT_LE(device(L), 80e9);
  EXPECT_GT(device(L + 1), 80e9);
  const auto r = test::run_command(estimator() + " --fit 80GB --seq 2048 --layers 4");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--seq alone"), std::string::npos) << r.output;
}

// --no-sync, as a planner weighing it sees it: the formula names the
// unsharded gradient it keeps, e bytes per padded element (the units' pieces
// times N), and the device grads grow by exactly that; the reduce-scatters
// fall from K a step to one.
TEST(EstimatePlan, NoSyncSaysWhatItKeeps) {
  for (const char* precision : {"bf16", "fp32"}) {
    SCOPED_TRACE(precision);
    auto plan = [&](const char* stage, const char* more) {
      return run_json(std::string("--model gpt2 --ranks 8 --grad-accum 4 --stage ") + stage + " --precision " +
                      precision + more + " --json");
    };
    const nlohmann::json sync = plan("fsdp", ""), keep = plan("fsdp", " --no-sync");
    const double e = std::string(precision) == "bf16" ? 2 : 4;
    double padded = 0;
    for (const nlohmann::json& u : keep["units"]) padded += u["piece"].get<double>() * 8;
    const nlohmann::json &a = sync["stages"][0], &b = keep["stages"][0];
    EXPECT_EQ(a["formula"], "16P/N");
    EXPECT_EQ(b["formula"], e == 2 ? "16P/N + 2P (--no-sync)" : "16P/N + 4P (--no-sync)");
    EXPECT_EQ(b["device"]["grads"].get<double>() - a["device"]["grads"].get<double>(), e * padded);
    const double rs = a["comm_bytes_per_step"]["by_collective"]["reduce_scatter"].get<double>();
    EXPECT_EQ(b["comm_bytes_per_step"]["by_collective"]["reduce_scatter"].get<double>(), rs / 4);
    // Stage 05 keeps it on the device too, its float32 shards of the
    // gradient being on the host: the device's gradient is that alone.
    const nlohmann::json o = plan("offload", " --no-sync")["stages"][0];
    EXPECT_NE(o["formula"].get<std::string>().find(e == 2 ? "+ 2P (--no-sync)" : "+ 4P (--no-sync)"), std::string::npos)
        << o["formula"];
    EXPECT_EQ(o["device"]["grads"].get<double>(), e * padded);
  }
}

}  // namespace
}  // namespace zf
