// test_estimate.cpp: common/estimate/estimate.h and tools/memory_estimate
// against MEASURED runs. Every number the estimator gives for a rank (model
// states per category and place, the activation peak, bytes sent per
// collective per step, the part across shard groups, stage 05's transfers
// per step and its disk bytes) is compared with what run_training counts,
// for every stage and the modes of stages 04 and 05, on tiny and the odd
// model (which pads) at N = 1 .. 4. Then the tool: --json against the
// estimate, --paper's numbers, DeepSpeed's published examples, --fit and
// the usage errors.
//
//   meson test -C build estimate
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data_parallel.h"
#include "stages/estimate_tool.h"
#include "extensions/disk_adamw.h"
#include "estimate.h"
#include "fsdp.h"
#include "extensions/offload.h"
#include "stage_fns.h"
#include "stages/stage_test_util.h"
#include "test_util.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
// The memory model's disk-tier chunk is stage 05's (the estimate suite's
// models have shards under a chunk, so only this sees a drift).
static_assert(zf::extensions::DiskAdamW::kChunkElems == zf::kDiskChunkElems);
static_assert(zf::extensions::DiskTier::kAlignElems == zf::kDiskAlignElems);

namespace {

// The estimate of cfg's run of `stage` and the run itself, every rank:
// model states at the end of the run (the counters' current bytes) exactly,
// the activation, gathered and workspace peaks and the device's peak of all
// categories at once exactly, and bytes per step (the run's total over its
// steps) to double rounding: the estimator multiplies where the run adds.
void expect_estimate_matches_run(Stage stage, const RunConfig& cfg) {
  SCOPED_TRACE(std::string(stage_label(stage)) + ", " + test::describe(cfg));
  const StageEstimate est = estimate_stage(stage, cfg, cfg.offload);
  const RunResult run = run_training(cfg, stage_fn(stage, cfg.offload));
  const double steps = cfg.steps;
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankResult& rank = run.ranks[r];
    const MemoryCounts& m = rank.memory;
    for (Place place : {Place::device, Place::host}) {
      const StateBytes& want = place == Place::device ? est.states.device : est.states.host;
      const char* where = place == Place::device ? "device" : "host";
      EXPECT_EQ(double(m.cur(place, Category::params)), want.params) << where << " params";
      EXPECT_EQ(double(m.cur(place, Category::grads)), want.grads) << where << " grads";
      EXPECT_EQ(double(m.cur(place, Category::optimizer)), want.optimizer) << where << " optimizer";
    }
    ASSERT_TRUE(est.activations.has_value());
    EXPECT_EQ(double(m.pk(Place::device, Category::activations)), *est.activations) << "activations";
    if (est.gathered || (stage != Stage::fsdp && stage != Stage::offload)) {
      EXPECT_EQ(double(m.pk(Place::device, Category::gathered)), est.gathered.value_or(0)) << "gathered";
    }
    EXPECT_EQ(double(m.pk(Place::device, Category::workspace)), est.workspace) << "workspace";
    // The device's peak, all categories at once: what "fits" must hold.
    ASSERT_TRUE(est.transient.has_value());
    EXPECT_EQ(double(m.peak_total[int(Place::device)]), est.device_total()) << "device peak";
    for (int k = 0; k < kNumCollectives; ++k)
      test::expect_bytes(rank.comm.bytes[k] / steps, est.comm[k], collective_name(CollectiveKind(k)));
    test::expect_bytes(rank.comm_cross_group.total_bytes() / steps, est.comm_cross_group, "across groups");
    EXPECT_EQ(double(rank.transfers.to_host_bytes) / steps, est.to_host) << "device->host";
    EXPECT_EQ(double(rank.transfers.to_device_bytes) / steps, est.to_device) << "host->device";
  }
}

// Every stage with its defaults: tiny (pads at N = 3) and the odd model
// (every unit pads at N = 3, 4), N = 1 .. 4, both recipes, K = 2
// micro-steps at N = 3 (the reduce-scatters of stages 02-05 run per
// micro-step, 03-05's all-gathers too).
TEST(EstimateVsRun, EveryStageEveryRecipe) {
  for (Stage s : all_stages())
    for (const ModelConfig& m : {model_preset("tiny"), test::odd_model()})
      for (int N : {1, 2, 3, 4})
        for (Precision p : {Precision::fp32, Precision::bf16}) {
          RunConfig cfg = test::config(m, N, 1, 1, p);
          cfg.grad_accum = N == 3 ? 2 : 1;
          expect_estimate_matches_run(s, cfg);
        }
}

// Stage 04's and 05's modes, each alone, on the odd model.
TEST(EstimateVsRun, FsdpAndOffloadModes) {
  struct Mode {
    const char* name;
    std::function<void(RunConfig&)> set;
    bool fsdp = true;  // also run in stage 04 (else stage 05 only)
  };
  const std::vector<Mode> modes = {
      {"shard-group 2", [](RunConfig& c) { c.fsdp.shard_group = 2; }},
      {"reshard false", [](RunConfig& c) { c.fsdp.reshard_after_forward = false; }},
      {"wrap-blocks 2", [](RunConfig& c) { c.fsdp.wrap_blocks = 2; }},
      {"no-sync K=3", [](RunConfig& c) { c.grad_accum = 3, c.fsdp.no_sync = true; }},
      {"shard-group 2, no-sync K=2",
       [](RunConfig& c) { c.fsdp.shard_group = 2, c.grad_accum = 2, c.fsdp.no_sync = true; }},
      {"reduce fp32", [](RunConfig& c) { c.fsdp.reduce_dtype = DType::f32; }},
      {"offload-params", [](RunConfig& c) { c.offload.offload_params = true; }, false},
      {"offload-params, reshard false, K=2",
       [](RunConfig& c) { c.offload.offload_params = true, c.fsdp.reshard_after_forward = false, c.grad_accum = 2; },
       false},
      {"delay-update", [](RunConfig& c) { c.offload.delay_update = true; }, false},
      {"delay-update, offload-params", [](RunConfig& c) { c.offload.delay_update = c.offload.offload_params = true; },
       false},
  };
  for (const Mode& mode : modes)
    for (int N : {2, 4})
      for (Precision p : {Precision::fp32, Precision::bf16}) {
        SCOPED_TRACE(mode.name);
        RunConfig cfg = test::config(test::odd_model(), N, 1, 2, p);
        mode.set(cfg);
        if (cfg.fsdp.reduce_dtype && p == Precision::fp32) continue;  // the fp32 recipe reduces in fp32 anyway
        if (mode.fsdp) expect_estimate_matches_run(Stage::fsdp, cfg);
        expect_estimate_matches_run(Stage::offload, cfg);
      }
}

// The gathered peak of stages 04-05 for schedules of --prefetch D and
// --max-gathered M, with one and two blocks per unit, on four blocks (units
// of two sizes with --wrap-blocks 2 and 3).
TEST(EstimateVsRun, GatheredPeakFollowsTheSchedule) {
  const ModelConfig odd4{"odd4", 256, 13, 4, 2, 10};
  struct Schedule {
    int D, M;
  };
  for (Schedule sc : {Schedule{1, 2}, Schedule{1, 1}, Schedule{2, 0}, Schedule{0, 2}, Schedule{2, 3}, Schedule{3, 0},
                      Schedule{2, 2}, Schedule{1, 0}, Schedule{0, 0}, Schedule{3, 2}, Schedule{4, 1}})
    for (int wrap : {1, 2, 3})
      for (Stage s : {Stage::fsdp, Stage::offload}) {
        SCOPED_TRACE("prefetch " + std::to_string(sc.D) + ", max-gathered " + std::to_string(sc.M) + ", wrap " +
                     std::to_string(wrap));
        RunConfig cfg = test::config(odd4, 3, 1, 1, Precision::bf16);
        cfg.fsdp.prefetch = sc.D, cfg.fsdp.max_gathered = sc.M, cfg.fsdp.wrap_blocks = wrap;
        // Every depth, also one past the forward's units (6 units at wrap 1,
        // 4 at wrap 2 and 3).
        EXPECT_TRUE(estimate_stage(s, cfg, cfg.offload).gathered.has_value());
        expect_estimate_matches_run(s, cfg);
      }
}

// --offload-dir: the host keeps a window of the moments (and with
// --offload-params in bf16 drops the float32 shards); the disk holds what
// the host held without the folder.
class EstimateDisk : public test::TempDirTest {};

TEST_F(EstimateDisk, OffloadDirMovesTheMomentsToDisk) {
  for (int N : {1, 3})
    for (Precision p : {Precision::fp32, Precision::bf16})
      for (bool offload_params : {false, true}) {
        RunConfig cfg = test::config(test::odd_model(), N, 1, 1, p);
        cfg.offload.offload_params = offload_params;
        SCOPED_TRACE(test::describe(cfg) + (offload_params ? ", offload-params" : ""));
        const MemoryCounts in_memory = run_training(cfg, train_offload_extended).ranks[0].memory;
        cfg.offload.offload_dir = dir_;
        expect_estimate_matches_run(Stage::offload, cfg);
        const MemoryCounts on_disk = run_training(cfg, train_offload_extended).ranks[0].memory;
        const StageEstimate est = estimate_stage(Stage::offload, cfg, cfg.offload);
        EXPECT_EQ(est.states.disk.optimizer, double(in_memory.cur(Place::host, Category::optimizer)));
        EXPECT_EQ(est.states.disk.params, double(in_memory.cur(Place::host, Category::params)) -
                                       double(on_disk.cur(Place::host, Category::params)));
      }
}

// The activation peak for each recomputation mode, both attention forms,
// both compute dtypes, two batch sizes: exactly the estimate (stage 00, one
// rank; EveryStageEveryRecipe shows every stage holds the same).
TEST(EstimateVsRun, ActivationsEveryModeAndForm) {
  for (const ModelConfig& m : {model_preset("tiny"), test::odd_model()})
    for (int B : {1, 3})
      for (DType compute : {DType::f32, DType::bf16})
        for (AttentionForm att : {AttentionForm::simple, AttentionForm::flash})
          for (Recompute rc : {Recompute::none, Recompute::full, Recompute::attn}) {
            RunConfig cfg = test::config(m, 1, B, 1, compute == DType::bf16 ? Precision::bf16 : Precision::fp32);
            cfg.compute = compute;
            cfg.attention = att;
            cfg.recompute = rc;
            SCOPED_TRACE(m.name + " B=" + std::to_string(B) + " " + dtype_name(compute) + " " +
                         attention_form_name(att) + " " + recompute_name(rc));
            const RunResult run = run_training(cfg, train_data_parallel);
            EXPECT_EQ(double(run.ranks[0].memory.pk(Place::device, Category::activations)),
                      activation_bytes(m, B, compute, att, rc));
          }
}

// ------------------------------------------------------------------ the tool

using test::estimator;
using test::run_json;

// --json: one object, every stage's numbers those of estimate_stage (and
// so of the runs above), the keys tools/README.md promises.
TEST(EstimateTool, JsonIsTheEstimate) {
  const std::string flags = "--model tiny --ranks 3 --precision bf16 --batch 2 --grad-accum 2 --recompute attn";
  const nlohmann::json j = run_json(flags + " --json");
  RunConfig cfg = test::config(model_preset("tiny"), 3, 2, 1, Precision::bf16);
  cfg.grad_accum = 2;
  cfg.recompute = Recompute::attn;
  const ModelSizes z = padded_sizes(build_layout(cfg.model), 3);
  EXPECT_EQ(j["params"].get<double>(), z.params);
  EXPECT_EQ(j["padded"].get<double>(), z.padded);
  EXPECT_EQ(j["shard"].get<double>(), z.shard);
  EXPECT_EQ(j["ranks"], 3);
  EXPECT_EQ(j["precision"], "bf16");
  // The cut, unit by unit (SPEC section 1's tiny: V 256, T 64, C 64): n_u and ceil(n_u / 3).
  const std::vector<std::pair<std::string, size_t>> units = {
      {"embedding", 256 * 64 + 64 * 64}, {"h.0", 12 * 64 * 64 + 13 * 64}, {"h.1", 12 * 64 * 64 + 13 * 64},
      {"head", 2 * 64 + 256 * 64}};
  ASSERT_EQ(j["units"].size(), units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    EXPECT_EQ(j["units"][u]["name"], units[u].first);
    EXPECT_EQ(j["units"][u]["numel"].get<size_t>(), units[u].second);
    EXPECT_EQ(j["units"][u]["piece"].get<size_t>(), (units[u].second + 2) / 3) << units[u].first;
  }
  ASSERT_EQ(j["stages"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const Stage s = all_stages()[i];
    const nlohmann::json& o = j["stages"][i];
    const StageEstimate e = estimate_stage(s, cfg, cfg.offload);
    SCOPED_TRACE(stage_label(s));
    EXPECT_EQ(o["stage"], stage_name(s));
    EXPECT_EQ(o["label"], stage_label(s));
    EXPECT_TRUE(o["formula"].is_string());
    EXPECT_TRUE(o["device"]["model_states"].is_number_integer());  // padded: exact integers
    EXPECT_EQ(o["device"]["model_states"].get<double>(), e.states.device.total());
    EXPECT_EQ(o["device"]["params"].get<double>(), e.states.device.params);
    EXPECT_EQ(o["device"]["grads"].get<double>(), e.states.device.grads);
    EXPECT_EQ(o["device"]["optimizer"].get<double>(), e.states.device.optimizer);
    EXPECT_EQ(o["device"]["activations"].get<double>(), *e.activations);
    if (e.gathered) EXPECT_EQ(o["device"]["gathered"].get<double>(), *e.gathered);
    else EXPECT_TRUE(o["device"]["gathered"].is_null());
    EXPECT_EQ(o["device"]["total"].get<double>(), e.device_total());
    EXPECT_EQ(o["host"]["model_states"].get<double>(), e.states.host.total());
    EXPECT_EQ(o["disk"]["optimizer"].get<double>(), 0.0);
    if (s != Stage::fsdp && s != Stage::offload) {  // memory_model.h's table
      EXPECT_EQ(o["device"]["model_states"].get<double>(), model_state_bytes(s, Precision::bf16, z).device.total());
    }
    const nlohmann::json& by = o["comm_bytes_per_step"]["by_collective"];
    for (CollectiveKind k : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter, CollectiveKind::all_gather})
      test::expect_bytes(by[collective_name(k)].get<double>(), e.comm[int(k)], collective_name(k));
    test::expect_bytes(o["comm_bytes_per_step"]["total"].get<double>(), e.comm_total(), "total");
    EXPECT_EQ(o["transfers_per_step"]["to_host"].get<double>(), e.to_host);
    EXPECT_EQ(o["transfers_per_step"]["to_device"].get<double>(), e.to_device);
  }
  // One stage, with the flags a run of it takes (its --steps and --lr too).
  const nlohmann::json f =
      run_json(flags + " --stage offload --offload-params --delay-update --shard-group 3 --steps 7 --lr 1e-3 --json");
  ASSERT_EQ(f["stages"].size(), 1u);
  cfg.offload.offload_params = cfg.offload.delay_update = true;
  cfg.fsdp.shard_group = 3;
  EXPECT_EQ(f["stages"][0]["host"]["model_states"].get<double>(),
            estimate_stage(Stage::offload, cfg, cfg.offload).states.host.total());
  // --params alone: no activations, said as null.
  const nlohmann::json u = run_json("--params 1e9 --ranks 4 --precision bf16 --json");
  EXPECT_TRUE(u["stages"][0]["device"]["activations"].is_null());
  EXPECT_FALSE(u.contains("units")) << "no shape, no units";
  EXPECT_EQ(u["stages"][2]["device"]["model_states"].get<double>(), 5.5e9);
}

// A trainer's command line, given as it is to the tool with --stage: the
// tool's numbers are the run log's (its summary, rank 0).
class EstimateCommandLine : public test::TempDirTest {
 protected:
  struct Case {
    const char* stage;
    const char* env;  // the trainer's path (tests/meson.build)
    const char* flags;
  };
  // Runs the trainer with the case's flags and `more`; its run log's lines.
  std::vector<nlohmann::json> run_trainer(const Case& c, const std::string& more) {
    const char* bin = std::getenv(c.env);
    EXPECT_NE(bin, nullptr) << c.env << " is set by tests/meson.build";
    if (!bin) return {};
    const std::string log = dir_ + "/" + c.stage + ".jsonl";
    const auto trained =
        test::run_command(std::string(bin) + " " + c.flags + " " + more + " --quiet --log-json " + log);
    EXPECT_EQ(trained.exit_code, 0) << trained.output;
    std::vector<nlohmann::json> lines;
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  }
};

TEST_F(EstimateCommandLine, SameFlagsAsARunSameNumbers) {
  for (Case c : {Case{"dp", "ZF_DP_BIN", "--model tiny --ranks 3 --batch 2 --grad-accum 2 --recompute attn"},
                 Case{"zero3", "ZF_ZERO3_BIN", "--model tiny --ranks 3 --precision bf16 --attention flash"},
                 Case{"fsdp", "ZF_FSDP_BIN",
                      "--model tiny --ranks 4 --precision bf16 --grad-accum 2 --no-sync --shard-group 2 "
                      "--wrap-blocks 2 --reduce-dtype fp32 --recompute full --prefetch 0"},
                 Case{"offload", "ZF_OFFLOAD_BIN",
                      "--model tiny --ranks 3 --precision bf16 --batch 1 --offload-params --delay-update "
                      "--reshard-after-forward false --optimizer-threads 1 --no-pin"}}) {
    SCOPED_TRACE(std::string(c.stage) + " " + c.flags);
    const std::vector<nlohmann::json> log = run_trainer(c, "--steps 3");
    ASSERT_FALSE(log.empty());
    const nlohmann::json summary = log.back()["summary"];
    const nlohmann::json est =
        run_json(std::string("--stage ") + c.stage + " " + c.flags + " --steps 3 --quiet --log-json " + dir_ +
                 "/" + c.stage + ".jsonl --json")["stages"][0];
    const nlohmann::json& mem = summary["memory"][0];
    for (const char* place : {"device", "host"})
      for (const char* cat : {"params", "grads", "optimizer"})
        EXPECT_EQ(mem[place][cat]["current"].get<double>(), est[place][cat].get<double>()) << place << " " << cat;
    EXPECT_EQ(mem["device"]["activations"]["peak"].get<double>(), est["device"]["activations"].get<double>());
    const nlohmann::json& comm = summary["comm"][0];
    test::expect_bytes(comm["bytes_per_step"].get<double>(), est["comm_bytes_per_step"]["total"].get<double>(),
                       "total");
    for (const auto& [name, bytes] : comm["by_collective"].items())
      test::expect_bytes(bytes.get<double>(), est["comm_bytes_per_step"]["by_collective"][name].get<double>(),
                         name.c_str());
    if (comm.contains("transfers_per_step")) {
      EXPECT_EQ(comm["transfers_per_step"]["to_host_bytes"].get<double>(),
                est["transfers_per_step"]["to_host"].get<double>());
      EXPECT_EQ(comm["transfers_per_step"]["to_device_bytes"].get<double>(),
                est["transfers_per_step"]["to_device"].get<double>());
    }
  }
}

// --hardware: the time of each stage is its trainer's dry run with the same
// flags: the step the tool reports (the second; with the delayed update the
// third of four) is the trainer's run log's, every number equal.
TEST_F(EstimateCommandLine, TheTimeIsTheTrainersDryRun) {
  for (Case c : {Case{"dp", "ZF_DP_BIN", "--model small --ranks 3 --batch 2 --grad-accum 2 --recompute attn"},
                 Case{"zero3", "ZF_ZERO3_BIN", "--model gpt2 --ranks 16 --precision bf16 --compute bf16 --attention flash"},
                 Case{"fsdp", "ZF_FSDP_BIN",
                      "--model gpt2 --ranks 16 --precision bf16 --grad-accum 2 --no-sync --shard-group 8 "
                      "--wrap-blocks 2 --reduce-dtype fp32 --recompute full --prefetch 2"},
                 Case{"offload", "ZF_OFFLOAD_BIN",
                      "--model small --ranks 3 --precision bf16 --batch 1 --offload-params --delay-update "
                      "--reshard-after-forward false --no-pin"}}) {
    SCOPED_TRACE(std::string(c.stage) + " " + c.flags);
    const bool delayed = std::string(c.flags).find("--delay-update") != std::string::npos;
    const std::string hw = " --hardware h200";
    nlohmann::json step, summary;
    for (const nlohmann::json& j : run_trainer(c, hw + " --clock modeled --dry-run --steps " + (delayed ? "4" : "2"))) {
      if (j.contains("step") && j["step"] == (delayed ? 2 : 1)) step = j;
      if (j.contains("summary")) summary = j["summary"];
    }
    ASSERT_TRUE(step.is_object()) << "the trainer logged no such step";
    const nlohmann::json t = run_json(std::string("--stage ") + c.stage + " " + c.flags + hw + " --json")["stages"][0]["time"];
    ASSERT_TRUE(t["modeled"].get<bool>()) << t.dump();
    EXPECT_EQ(t["clock"], summary["clock_detail"]);
    EXPECT_EQ(t["ms_per_step"].get<double>(), step["ms"].get<double>());
    EXPECT_EQ(t["tokens_per_s"].get<double>(), step["tokens_per_s"].get<double>());
    EXPECT_EQ(t["mfu"].get<double>(), step["mfu"].get<double>());
    EXPECT_EQ(t["exposed_comm_ms"].get<double>(), step["phases_ms"]["exposed comm"].get<double>());
    EXPECT_EQ(t["compute_ms"].get<double>(), step["phases_ms"]["compute"].get<double>());
    EXPECT_EQ(t["comm_ms"].get<double>(), step["phases_ms"]["comm"].get<double>());
    EXPECT_EQ(t["tokens_per_s_per_gpu"].get<double>(), step["tokens_per_s"].get<double>() / summary["ranks"].get<int>());
  }
  // Beyond a dry run's ranks: no time, and why.
  const nlohmann::json far = run_json("--model tiny --stage dp --ranks 5000 --hardware h100-sxm --json");
  EXPECT_FALSE(far["stages"][0]["time"]["modeled"].get<bool>());
  EXPECT_NE(far["stages"][0]["time"]["why_not"].get<std::string>().find("4096"), std::string::npos);
  // An offload folder: no time, and nothing made in it (its dry run would make its files there).
  const nlohmann::json od =
      run_json("--model tiny --stage offload --ranks 2 --offload-dir " + dir_ + " --hardware h100-sxm --json");
  EXPECT_FALSE(od["stages"][0]["time"]["modeled"].get<bool>());
  EXPECT_NE(od["stages"][0]["time"]["why_not"].get<std::string>().find("--offload-dir"), std::string::npos);
  size_t made = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) made += e.path().extension() != ".jsonl";
  EXPECT_EQ(made, 0u) << "the estimate made files in --offload-dir";
  // Without --hardware (or --clock modeled), no time is said.
  EXPECT_FALSE(run_json("--model tiny --stage dp --json")["stages"][0].contains("time"));
}

// --fit with --hardware: each fitting model's time is that of the stage's
// own dry run of that shape (run here, in the test), its second step.
TEST(EstimateTool, FitSaysHowFast) {
  const nlohmann::json j = run_json("--fit 40GB --ranks 2,16 --stage zero3 --precision bf16 --compute bf16 --batch 1 "
                                    "--recompute full --hardware a100-sxm --json");
  ASSERT_EQ(j["fits"].size(), 2u);
  for (const nlohmann::json& f : j["fits"]) {
    const int L = f["layers"], N = f["ranks"];
    SCOPED_TRACE("N=" + std::to_string(N) + " L=" + std::to_string(L));
    ASSERT_TRUE(f["time"]["modeled"].get<bool>()) << f.dump();
    RunConfig cfg = test::config(ModelConfig{"fit", 50304, 1024, L, L, 128 * L}, N, 1, 2, Precision::bf16);
    cfg.compute = DType::bf16;
    cfg.recompute = Recompute::full;
    cfg.clock = "modeled";
    cfg.hardware = "a100-sxm";
    cfg.dry_run = true;
    EXPECT_EQ(f["time"]["ms_per_step"].get<double>(), run_training(cfg, train_zero3).ranks[0].step_ms[1]);
  }
}

// The ZeRO paper's Figure 1 (Rajbhandari et al. 2020): Psi = 7.5B, K = 12,
// Nd = 64 gives 120, 31.4, 16.6 and 1.9 GB; and 1e9 at N = 4 gives 16, 7,
// 5.5 and 4 GB.
TEST(EstimateTool, PaperExample) {
  const auto r = test::run_command(estimator() + " --paper");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t at = 0;
  for (const char* want : {"baseline", "120 GB", "120 GB", "P_os", "31.406 GB", "31.4 GB", "P_os+g", "16.641 GB",
                           "16.6 GB", "P_os+g+p", "1.875 GB", "1.9 GB", "16 GB", "7 GB", "5.5 GB", "4 GB"}) {
    const size_t pos = r.output.find(want, at);
    ASSERT_NE(pos, std::string::npos) << "missing or out of order: '" << want << "' in\n" << r.output;
    at = pos + 1;
  }
}

// DeepSpeed's documentation ("Memory Requirements",
// docs/code-docs/source/memory.rst of microsoft/DeepSpeed; printed at
// deepspeed.readthedocs.io/en/latest/memory.html) runs the "cold"
// estimators for t5-3b, 2851e6 params, 32e6 largest layer params, one node
// of 8 GPUs, and prints (GB = 2^30 bytes, two decimals):
//   ZeRO-2: 127.45GB | 5.31GB cpu_offload=1;  127.45GB | 15.93GB cpu_offload=0
//   ZeRO-3: 71.69 | 0.12 (offload both, zero_init=1); 127.45 | 0.12 (zero_init=0);
//           63.72 | 0.78 (optimizer only, zero_init=1); 127.45 | 0.78;
//           1.43 | 6.09 (no offload, zero_init=1); 127.45 | 6.09
TEST(EstimateTool, DeepSpeedPublishedExamples) {
  auto gib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", b / double(1 << 30));
    return std::string(buf);
  };
  const std::vector<DeepSpeedRow> z2 = deepspeed_zero2_estimate(2851e6, 8, 1);
  ASSERT_EQ(z2.size(), 2u);
  EXPECT_EQ(gib(z2[0].per_cpu) + " " + gib(z2[0].per_gpu), "127.45 5.31");
  EXPECT_EQ(gib(z2[1].per_cpu) + " " + gib(z2[1].per_gpu), "127.45 15.93");
  const std::vector<DeepSpeedRow> z3 = deepspeed_zero3_estimate(2851e6, 32e6, 8, 1);
  const char* want3[] = {"71.69 0.12", "127.45 0.12", "63.72 0.78", "127.45 0.78", "1.43 6.09", "127.45 6.09"};
  ASSERT_EQ(z3.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(gib(z3[i].per_cpu) + " " + gib(z3[i].per_gpu), want3[i]) << z3[i].options;
  // The tool prints them, beside ours.
  const auto r = test::run_command(estimator() + " --deepspeed --params 2851e6 --ranks 8 --largest-layer 32e6");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* want : {"127.45GB |    5.31GB", "127.45GB |   15.93GB", "71.69GB |    0.12GB", "63.72GB |    0.78GB",
                           "1.43GB |    6.09GB", "02 ZeRO-2"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << " in\n" << r.output;
}

// --fit: for each stage and N, the largest L of the family whose device
// bytes are within the budget: L fits and L + 1 does not; more ranks never
// fit less in the sharding stages; stage 00 fits the same at every N.
TEST(EstimateTool, FitIsTheLargestThatFits) {
  const nlohmann::json j = run_json("--fit 80GB --ranks 1,8,64 --precision bf16 --batch 1 --recompute full --json");
  EXPECT_EQ(j["device_mem"].get<double>(), 80e9);
  EXPECT_TRUE(j["family"].is_string());
  ASSERT_EQ(j["fits"].size(), 6u * 3);
  RunConfig cfg;
  cfg.precision = Precision::bf16;
  cfg.batch = 1;
  cfg.recompute = Recompute::full;
  std::map<std::string, std::vector<double>> by_stage;
  for (const nlohmann::json& f : j["fits"]) {
    const Stage s = parse_stage(f["stage"], "stage");
    const int L = f["layers"];
    cfg.ranks = f["ranks"];
    SCOPED_TRACE(std::string(stage_name(s)) + " N=" + std::to_string(cfg.ranks));
    ASSERT_GT(L, 0);
    EXPECT_EQ(f["channels"], 128 * L);
    auto device = [&](int layers) {
      cfg.model = ModelConfig{"fit", 50304, 1024, layers, layers, 128 * layers};
      const StageEstimate e = estimate_stage(s, cfg, cfg.offload);
      EXPECT_EQ(e.gathered.has_value(), s == Stage::zero3 || s == Stage::fsdp || s == Stage::offload);
      EXPECT_EQ(*e.transient > 0, s != Stage::dp && s != Stage::zero1);
      return e.device_total();  // the device's peak, held to runs by EstimateVsRun
    };
    EXPECT_LE(device(L), 80e9);
    EXPECT_GT(device(L + 1), 80e9);
    EXPECT_EQ(f["params"].get<double>(), double(build_layout(cfg.model = ModelConfig{"fit", 50304, 1024, L, L, 128 * L}).numel));
    by_stage[f["stage"]].push_back(f["params"].get<double>());
  }
  EXPECT_EQ(by_stage["dp"][0], by_stage["dp"][2]);
  for (const char* s : {"zero1", "zero2", "zero3", "fsdp"}) {
    EXPECT_LT(by_stage[s][0], by_stage[s][1]) << s;
    EXPECT_LT(by_stage[s][1], by_stage[s][2]) << s;
  }
}

TEST(EstimateTool, BadFlagsAreUsageErrorsNamingTheFlag) {
  struct Case {
    const char* args;
    const char* says;
  };
  for (Case c : {Case{"--layers 2 --channels 64 --vocab 256 --seq 64", "--heads"},
                 Case{"--layers 2 --channels 64 --vocab 256 --heads 4", "--seq"},
                 Case{"--layers 2 --channels 64 --vocab 256 --seq 64 --heads 5", "--heads"},
                 Case{"--layers 0 --channels 64 --vocab 256 --seq 64 --heads 4", "--layers"},
                 Case{"--params 1e9 --model tiny", "only one of"},
                 Case{"--params 1e9 --layers 2 --channels 64 --vocab 256 --seq 64 --heads 4", "only one of"},
                 Case{"--fit 80XB --ranks 1,2", "--fit"}, Case{"--fit 0 --ranks 1", "--fit"},
                 Case{"--fit 80GB --model tiny", "--fit"}, Case{"--params 1e9 --ranks 1,2", "--ranks"},
                 Case{"--model tiny --stage zero4", "--stage"}, Case{"--model tiny --stage dp --no-sync", "--no-sync"},
                 Case{"--model tiny --stage fsdp --offload-params", "--offload-params"},
                 Case{"--model tiny --ranks 4 --shard-group 3", "--shard-group"},
                 Case{"--model tiny --grad-accum 1 --no-sync", "--no-sync"},
                 Case{"--model tiny --wrap-blocks 3", "--wrap-blocks"},
                 Case{"--params 1e9 --wrap-blocks 2", "--wrap-blocks"},
                 Case{"--model tiny --reduce-dtype bf16", "--reduce-dtype"},
                 Case{"--model tiny --compute bf16", "--compute"}, Case{"--model tiny --recompute some", "--recompute"},
                 Case{"--params 1e9 --deepspeed", "--largest-layer"},
                 Case{"--params 1e9 --ranks 8 --deepspeed --largest-layer 1e6 --gpus-per-node 3", "--gpus-per-node"},
                 Case{"--paper --json", "--json"}, Case{"--paper --fit 80GB", "one of"},
                 Case{"--paper --precision fp32 --ranks 2", "takes no other flag"},
                 Case{"--params 1e9 --hardware h100-sxm", "--hardware times"},
                 Case{"--model tiny --hardware nope", "--hardware nope"},
                 Case{"--model tiny --clock wall --hardware h200", "drop --clock wall"},
                 Case{"--model tiny --clock sundial", "--clock"},
                 Case{"--params 1e9 --deepspeed --largest-layer 1e6 --clock modeled", "--deepspeed"}}) {
    const auto r = test::run_command(estimator() + " " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("memory_estimate: error:"), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace zf
