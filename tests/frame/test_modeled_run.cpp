// Whole runs on the modeled clock (modeled/modeled_clock.h): the same bits as
// the wall clock and the same modeled times every time; what the knobs do to
// the time; a dry run equal to the real run; the trace; the flags.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "estimate.h"
#include "data_parallel.h"
#include "fsdp.h"
#include "extensions/offload.h"
#include "round_profile.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"
#include "test_util.h"

namespace zf {
namespace {

RunConfig modeled(const std::string& model, int N, const std::string& hw) {
  RunConfig cfg = test::quiet_config(model, N, 2, 3);
  cfg.clock = "modeled";
  cfg.hardware = hw;
  return cfg;
}

// The offload runs below: GPT-2's width (C = 768, 12 heads) with two layers,
// T = 256 and an 8192-token vocabulary, 8 ranks of an H100 node, modeled
// and dry. The host's work is charged, not done (a dry run's host computes
// nothing either); the disk tier's files are real.
RunConfig modeled_offload() {
  RunConfig cfg = modeled("tiny", 8, "h100-sxm");
  cfg.model = ModelConfig{"gpt2-width", 8192, 256, 2, 12, 768};
  cfg.dry_run = true;
  cfg.precision = Precision::bf16;
  return cfg;
}

// Runs that write files (--offload-dir, --log-json) write into a fresh folder.
class ModeledFiles : public test::TempDirTest {};

TEST(ModeledRun, SameBitsAsTheWallClockAndTheSameTimesEveryRun) {
  RunConfig cfg = modeled("tiny", 4, "h100-sxm");
  const RunResult a = run_training(cfg, train_fsdp), b = run_training(cfg, train_fsdp);
  cfg.clock = "wall";
  const RunResult wall = run_training(cfg, train_fsdp);
  EXPECT_EQ(a.ranks[0].param_hash, wall.ranks[0].param_hash);
  EXPECT_EQ(a.ranks[0].losses, wall.ranks[0].losses);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(a.ranks[r].step_ms, b.ranks[r].step_ms) << "rank " << r;
    EXPECT_EQ(a.ranks[r].step_ms, a.ranks[0].step_ms) << "rank " << r;  // the step ends together
  }
  // Modeled: a step of tiny on H100s is a couple of milliseconds at most
  // (each of its small products one wave of tiles); the wall's here is not.
  EXPECT_LT(a.ranks[0].step_ms[1], 2.0);
  EXPECT_GT(a.ranks[0].step_ms[1], 0.0);
}

// A failing rank's hooks are the injected fault around its clock: its
// steps before the fault end with the others' (the ranks meet at each
// modeled step's end), and the fault stops the run as on the wall clock.
TEST(ModeledRun, AnInjectedFaultStopsTheRunAsOnTheWallClock) {
  RunConfig cfg = modeled("tiny", 4, "h100-sxm");
  cfg.steps = 4;
  cfg.fault_rank = 1;
  cfg.fault_step = 2;
  cfg.comm_timeout_s = 20;  // a rank the others wait for in vain fails the test, not hangs it
  try {
    run_training(cfg, train_fsdp);
    FAIL() << "the run went on past rank 1's fault";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("injected fault (--inject-fault 1:2)"), std::string::npos) << what;
  }
}

TEST(ModeledRun, PrefetchHidesTheGathersWhereTheLinkIsSlow) {
  RunConfig cfg = modeled("small", 4, "l40s");
  cfg.fsdp.prefetch = 0;
  const double none = run_training(cfg, train_fsdp).ranks[0].step_ms[1];
  cfg.fsdp.prefetch = 1;
  const double one = run_training(cfg, train_fsdp).ranks[0].step_ms[1];
  EXPECT_LT(one, none);
}

TEST(ModeledRun, OffloadPaysForPcieAndTheHostsOptimizer) {
  RunConfig cfg = modeled_offload();
  const double fsdp = run_training(cfg, train_fsdp).ranks[0].step_ms[1];
  const double offload = run_training(cfg, train_offload_extended).ranks[0].step_ms[1];
  EXPECT_GT(offload, fsdp);
  // At least each rank's CPU AdamW: its shard (P/8, padded up) at an eighth
  // of the host's 2e9 parameters/s (hardware/h100-sxm.hw: 8 ranks a host).
  const double shard = double(build_layout(cfg.model).numel) / 8;
  EXPECT_GT(offload - fsdp, shard / (2e9 / 8) * 1e3 * 0.9);
}

// A dry run of stage 05 holds no host states: they are counted (the memory
// table's) but never written, so a model whose host states are beyond the
// machine (gpt2's 18P, about 2.9 GB here; a 7B model's 120 GB on a laptop)
// is planned in the memory of stage 04's dry run. What it adds to the
// process's resident memory (a child's peak over an idle child's, which
// holds the parent's pages) stays under an eighth of those states: below
// the 4P of any one of them (the float32 gradient shard written by hand).
TEST(ModeledRun, ADryRunOfOffloadHoldsNoHostStates) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory hides what the process itself holds";
#endif
  RunConfig cfg = modeled("gpt2", 8, "h100-sxm");
  cfg.dry_run = true;
  cfg.precision = Precision::bf16;
  cfg.steps = 2;
  const long idle = test::child_peak([] {});
  for (bool pin : {true, false}) {
    SCOPED_TRACE(pin ? "pinned" : "--no-pin");
    cfg.offload.no_pin = !pin;
    const long grown = test::child_peak([&] { run_training(cfg, train_offload_extended); }) - idle;
    const double states = double(estimate_stage(Stage::offload, cfg, cfg.offload).states.host.total()) * 8;
    EXPECT_GT(states, 2e9);
    EXPECT_LT(double(grown), states / 8) << "grew by " << grown << " bytes against " << states << " of host states";
  }
}

// ZeRO-Offload's delayed update: the host's update of step s runs while the
// device computes step s+1, so a step costs about the longer of the two,
// not their sum (at least the shorter less, less the host's own work of
// the step, which takes the CPU from the update), and never less than the
// update the host waits for. The last step waits for its own update too.
// The worker's thread timing changes nothing: the same times every run.
TEST(ModeledRun, TheDelayedUpdateHidesTheHostsOptimizerBehindTheStep) {
  RunConfig cfg = modeled_offload();
  cfg.steps = 5;
  const double fsdp = run_training(cfg, train_fsdp).ranks[0].step_ms[2];
  const double undelayed = run_training(cfg, train_offload_extended).ranks[0].step_ms[2];
  cfg.offload.delay_update = true;
  const std::vector<double> delayed = run_training(cfg, train_offload_extended).ranks[0].step_ms;
  // Each rank's CPU AdamW: its shard at an eighth of the host's 2e9
  // parameters/s (hardware/h100-sxm.hw: 8 ranks a host).
  const double shard = double(build_layout(cfg.model).numel) / 8;
  const double adamw = shard / (2e9 / 8) * 1e3;
  // The host's own work a step: each landed bf16 piece added into the float32
  // shard (10 bytes an element) and the norm (4), at an eighth of 100 GB/s.
  const double own = 14 * shard / (100e9 / 8) * 1e3;
  for (int s : {2, 3}) {
    EXPECT_LT(delayed[s], undelayed) << "step " << s;
    EXPECT_GT(undelayed - delayed[s], 0.9 * std::min(fsdp, adamw) - own) << "step " << s;
    EXPECT_GE(delayed[s], adamw) << "step " << s;
  }
  EXPECT_NEAR(delayed[2], delayed[3], 1e-9 * delayed[2]);  // steady: the same, to the timelines' rounding
  EXPECT_GT(delayed[4], delayed[3] + 0.9 * adamw);  // the last update, waited for within the step
  RunConfig real = modeled("tiny", 4, "h100-sxm");
  real.offload.delay_update = true;
  EXPECT_EQ(run_training(real, train_offload_extended).ranks[0].step_ms, run_training(real, train_offload_extended).ranks[0].step_ms);
}

// The disk tier streams the moments in and out each step (8 bytes a
// parameter each way) at the node's disk bandwidth shared by its ranks
// (hardware/h100-sxm.hw: 6 GB/s, 8 ranks a host); the CPU's AdamW runs
// under the stream, and the step waits for the last write.
TEST_F(ModeledFiles, TheDiskTierIsItsBytesAtTheNodesDiskRate) {
  RunConfig cfg = modeled_offload();
  cfg.log_json = path("log.jsonl");
  const double in_memory = run_training(cfg, train_offload_extended).ranks[0].step_ms[1];
  cfg.offload.offload_dir = path("od");
  std::filesystem::create_directory(cfg.offload.offload_dir);
  const double on_disk = run_training(cfg, train_offload_extended).ranks[0].step_ms[1];
  const double disk = 16.0 * double(build_layout(cfg.model).numel) / 8 / (6e9 / 8) * 1e3;
  std::ifstream in(cfg.log_json);
  double disk_phase = -1;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("step") && j["step"] == 1) disk_phase = j["phases_ms"]["disk"].get<double>();
  }
  EXPECT_NEAR(disk_phase, disk, 0.01 * disk);  // the shard's padding: under 1 %
  EXPECT_GT(on_disk, disk_phase);
  EXPECT_GT(on_disk, in_memory);
  // AdamW (its shard at an eighth of 2e9 parameters/s) runs under the
  // stream, all but its last chunk.
  const double adamw = double(build_layout(cfg.model).numel) / 8 / (2e9 / 8) * 1e3;
  EXPECT_LT(on_disk, in_memory + disk_phase - 0.5 * adamw);
}

// The delayed update's worker streaming the disk tier, with the I/O thread
// and the rank threads: the same modeled times every run.
TEST_F(ModeledFiles, ADelayedUpdateOnDiskHasTheSameTimesEveryRun) {
  RunConfig cfg = modeled("tiny", 2, "h100-sxm");
  cfg.steps = 4;
  cfg.offload.delay_update = true;
  cfg.offload.offload_dir = dir_;
  const std::vector<double> first = run_training(cfg, train_offload_extended).ranks[0].step_ms;
  EXPECT_EQ(run_training(cfg, train_offload_extended).ranks[0].step_ms, first);
}

// MFU is bench/mfu.py's: tokens per second times a token's training FLOPs
// (6 per parameter of a matrix product, and 12 L T C of attention) over
// the peak of every rank, on a machine of round numbers (10 TFLOP/s in
// float32, the compute of a CPU run).
TEST_F(ModeledFiles, MfuIsTheTokensFlopsOverThePeakOfEveryRank) {
  const std::string hw = path("round.hw");
  { std::ofstream(hw) << test::kRoundProfile; }
  RunConfig cfg = modeled("tiny", 4, hw);
  cfg.log_json = path("log.jsonl");
  run_training(cfg, train_data_parallel);
  const ModelConfig& m = cfg.model;
  const double P = double(build_layout(m).numel);
  const double flops = 6.0 * (P - double(m.V) * m.C - double(m.T) * m.C) + 12.0 * m.L * m.T * m.C;
  const double peak = 4 * 10e12;
  std::ifstream in(cfg.log_json);
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("step")) continue;
    ++steps;
    const double tps = j["tokens_per_s"].get<double>(), want = tps * flops / peak;
    EXPECT_GT(tps, 0);
    EXPECT_NEAR(j["mfu"].get<double>(), want, 1e-12 * want) << "step " << j["step"];
  }
  EXPECT_EQ(steps, cfg.steps);
}

TEST(ModeledRun, ZeroThreeCostsMoreThanDataParallelOverPcieThanOverNvlink) {
  // ZeRO-3 sends 1.5x data parallel's bytes: over a slow link that shows in
  // the step; over NVLink much less of it does.
  auto ratio = [](const std::string& hw) {
    const RunConfig cfg = modeled("small", 8, hw);
    return run_training(cfg, train_zero3).ranks[0].step_ms[1] /
           run_training(cfg, train_data_parallel).ranks[0].step_ms[1];
  };
  EXPECT_GT(ratio("l40s"), ratio("h100-sxm"));
}

// A dry run is the real run without its arithmetic: the same modeled times
// and the same memory peaks, rank by rank, in every stage; at N = 3 the
// shards of tiny are unequal (padding), and the step still ends together.
TEST_F(ModeledFiles, ADryRunGivesTheRealRunsTimesAndMemory) {
  OffloadOptions none, params, delay, disk, both;
  params.offload_params = true;
  delay.delay_update = true;
  disk.offload_dir = dir_;
  both.delay_update = true;
  both.offload_dir = dir_;
  using test::run_of;
  const std::vector<std::tuple<const char*, std::function<RunResult(const RunConfig&)>, OffloadOptions>> stages = {
      {"dp", run_of(train_data_parallel), none}, {"zero1", run_of(train_zero1), none},
      {"zero2", run_of(train_zero2), none},      {"zero3", run_of(train_zero3), none},
      {"fsdp", run_of(train_fsdp), none},        {"offload", run_of(train_offload_extended), none},
      {"offload --offload-params", run_of(train_offload_extended), params},
      {"offload --delay-update", run_of(train_offload_extended), delay},
      {"offload --offload-dir", run_of(train_offload_extended), disk},
      {"offload --offload-dir --delay-update", run_of(train_offload_extended), both}};
  for (const auto& [name, run, offload] : stages)
    for (int N : {2, 3, 4}) {
      RunConfig cfg = modeled("tiny", N, "a100-sxm");
      cfg.precision = Precision::bf16;
      cfg.steps = 3;
      cfg.offload = offload;
      const RunResult real = run(cfg);
      cfg.dry_run = true;
      const RunResult dry = run(cfg);
      for (int r = 0; r < N; ++r) {
        SCOPED_TRACE(std::string(name) + " N=" + std::to_string(N) + " rank " + std::to_string(r));
        EXPECT_EQ(dry.ranks[r].step_ms, real.ranks[r].step_ms);
        EXPECT_EQ(real.ranks[r].step_ms, real.ranks[0].step_ms);
        EXPECT_EQ(dry.ranks[r].memory.peak, real.ranks[r].memory.peak);
        EXPECT_EQ(dry.ranks[r].memory.peak_total, real.ranks[r].memory.peak_total);
        EXPECT_EQ(dry.ranks[r].comm.bytes, real.ranks[r].comm.bytes);
      }
    }
}

// --trace under the modeled clock draws the modeled timelines: each step's
// spans fill its modeled time exactly, and a save between steps is no step's.
TEST(ModeledRun, TheTraceIsTheModeledTimeline) {
  RunConfig cfg = modeled("tiny", 2, "h100-sxm");
  cfg.steps = 3;
  const std::string dir = test::temp_dir();
  cfg.trace = dir + "/t.json";
  cfg.save = dir + "/ck.st";  // a save between steps: its spans are no step's
  cfg.save_every = 1;
  const RunResult run = run_training(cfg, train_offload_extended);
  std::ifstream f(cfg.trace);
  const nlohmann::json doc = nlohmann::json::parse(f);
  EXPECT_EQ(doc["otherData"]["clock"].get<std::string>().rfind("modeled, not measured", 0), 0u);
  std::vector<double> last_end(3, 0.0), first_start(3, 1e300);
  std::set<std::string> tracks;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] != "X") continue;
    const int step = e["args"]["step"];
    ASSERT_GE(step, -1);
    ASSERT_LT(step, 3);
    if (step < 0) continue;
    // Each collective says how NCCL would run it: tiny's are a few KB over
    // 2 GPUs of a node, where LL's 6.6 + 0.6 µs beat every other way.
    if (e["cat"] == "comm") {
      EXPECT_EQ(e["args"]["algorithm"], "ring") << e.dump();
      EXPECT_EQ(e["args"]["protocol"], "LL") << e.dump();
    }
    last_end[size_t(step)] = std::max(last_end[size_t(step)], e["ts"].get<double>() + e["dur"].get<double>());
    first_start[size_t(step)] = std::min(first_start[size_t(step)], e["ts"].get<double>());
  }
  EXPECT_TRUE(tracks.count("compute") && tracks.count("comm") && tracks.count("copy") && tracks.count("host"))
      << tracks.size();
  for (int s = 0; s < 3; ++s) {
    // A step's spans run from its start (its first op) to its end (the last rank's last work).
    EXPECT_NEAR((last_end[size_t(s)] - first_start[size_t(s)]) / 1e3, run.ranks[0].step_ms[size_t(s)], 1e-6)
        << "step " << s;
    if (s > 0) {
      EXPECT_GE(first_start[size_t(s)], last_end[size_t(s - 1)]) << "step " << s << " after the last";
    }
  }
}

// The trace's units track: per micro-step one forward and one backward of
// every unit (tiny: embedding, h.0, h.1, head), in the model's order, each
// from its first op to its last, so that every forward or backward op of
// the compute track lies inside its unit's span, and no two units overlap.
TEST(ModeledRun, TheTraceDrawsEachUnitOverItsOps) {
  RunConfig cfg = modeled("tiny", 2, "h100-sxm");
  cfg.steps = 2;
  cfg.grad_accum = 2;
  cfg.trace = test::temp_dir() + "/t.json";
  run_training(cfg, train_zero3);
  std::ifstream f(cfg.trace);
  const nlohmann::json doc = nlohmann::json::parse(f);
  std::map<std::pair<int, int>, std::string> track;  // (rank, tid) -> name
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") track[{e["pid"], e["tid"]}] = e["args"]["name"];
  struct Span {
    std::string name;
    double start, end;
  };
  std::map<std::pair<int, int>, std::vector<Span>> units, ops;  // (rank, step)
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X" || e["args"]["step"] < 0) continue;
    const std::string& on = track[{e["pid"], e["tid"]}];
    const Span sp{e["name"], e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    const std::string cat = e["cat"];
    if (on == "units") units[{e["pid"], e["args"]["step"]}].push_back(sp);
    if (on == "compute" && (cat == "forward" || cat == "backward"))
      ops[{e["pid"], e["args"]["step"]}].push_back({cat == "forward" ? "fwd" : "bwd", sp.start, sp.end});
  }
  const std::vector<std::string> micro = {"fwd embedding", "fwd h.0", "fwd h.1", "fwd head",
                                          "bwd head",      "bwd h.1", "bwd h.0", "bwd embedding"};
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < 2; ++s) {
      SCOPED_TRACE("rank " + std::to_string(r) + ", step " + std::to_string(s));
      std::vector<Span>& u = units[{r, s}];
      std::sort(u.begin(), u.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
      ASSERT_EQ(u.size(), 2 * micro.size());
      for (size_t i = 0; i < u.size(); ++i) {
        EXPECT_EQ(u[i].name, micro[i % micro.size()]) << i;
        EXPECT_LT(u[i].start, u[i].end) << i;
        if (i > 0) {
          EXPECT_LE(u[i - 1].end, u[i].start + 1e-6) << i;
        }
      }
      ASSERT_FALSE((ops[{r, s}].empty()));
      for (const Span& op : ops[{r, s}])
        EXPECT_TRUE(std::any_of(u.begin(), u.end(), [&](const Span& x) {
          return x.name.rfind(op.name, 0) == 0 && x.start <= op.start + 1e-6 && op.end <= x.end + 1e-6;  // us
        })) << op.name << " op at " << op.start << " us is in no unit's span";
    }
}

// Shards that do not divide evenly (tiny over 3 ranks is padded) give the
// ranks unequal optimizer work: each rank's own work ends at another time,
// and the step ends with the slowest, on every rank.
TEST(ModeledRun, TheSlowestRankSetsTheStep) {
  RunConfig cfg = modeled("tiny", 3, "h100-sxm");
  cfg.steps = 2;
  cfg.trace = test::temp_dir() + "/t.json";
  const RunResult run = run_training(cfg, train_zero3);
  std::ifstream f(cfg.trace);
  const nlohmann::json doc = nlohmann::json::parse(f);
  std::vector<double> work_end(3, 0.0);  // where each rank's own work of step 1 ends, in ms
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "X" && e["args"]["step"] == 1 && e["cat"] != "comm") {
      double& end = work_end[e["pid"].get<size_t>()];
      end = std::max(end, (e["ts"].get<double>() + e["dur"].get<double>()) / 1e3);
    }
  const double step_end = run.ranks[0].step_ms[0] + run.ranks[0].step_ms[1];
  const double slowest = *std::max_element(work_end.begin(), work_end.end());
  const double fastest = *std::min_element(work_end.begin(), work_end.end());
  EXPECT_LT(fastest, slowest) << "the shards are unequal, so is the work";
  EXPECT_NEAR(slowest, step_end, 1e-6) << "the step ends with the slowest rank's work";
  for (int r = 0; r < 3; ++r) EXPECT_EQ(run.ranks[r].step_ms, run.ranks[0].step_ms) << "rank " << r;
}

// parse_flags on `args` after the program name; "" when accepted, else the error.
std::string flags_error(std::vector<std::string> args, StageFlags flags = StageFlags::fsdp) {
  args.insert(args.begin(), "fsdp");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  try {
    parse_flags(int(argv.size()), argv.data(), StageInfo{"fsdp", "stage 04: FSDP", flags});
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(ModeledRun, FlagsItRefusesSayWhy) {
  EXPECT_EQ(flags_error({"--clock", "modeled"}), "");
  EXPECT_EQ(flags_error({"--clock", "modeled", "--hardware", "a100-sxm"}), "");
  EXPECT_NE(flags_error({"--clock", "fast"}).find("--clock must be wall or modeled"), std::string::npos);
  EXPECT_NE(flags_error({"--hardware", "h200"}).find("add --clock modeled"), std::string::npos);
  EXPECT_EQ(flags_error({"--clock", "modeled", "--trace", "t.json"}), "");
  EXPECT_EQ(flags_error({"--clock", "modeled"}, StageFlags::offload), "");
  EXPECT_EQ(flags_error({"--clock", "modeled", "--delay-update"}, StageFlags::offload), "");
  EXPECT_EQ(flags_error({"--clock", "modeled", "--offload-dir", "d"}, StageFlags::offload), "");
  EXPECT_NE(flags_error({"--dry-run"}).find("add --clock modeled"), std::string::npos);
  EXPECT_EQ(flags_error({"--clock", "modeled", "--dry-run", "--ranks", "4096", "--model", "gpt-70b"}), "");
  EXPECT_NE(flags_error({"--clock", "modeled", "--dry-run", "--ranks", "4097"}).find("4096"), std::string::npos);
  EXPECT_NE(flags_error({"--clock", "modeled", "--dry-run", "--save", "x.bin"}).find("--save"), std::string::npos);
}

}  // namespace
}  // namespace zf
