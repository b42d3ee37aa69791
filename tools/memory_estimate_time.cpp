// memory_estimate_time.cpp: --hardware, the time column. Each stage's own
// schedule runs here as a dry run on the modeled clock (docs/SPEC.md section
// 13: nothing computed, every op, collective and copy charged on the
// profile's machine), with the request's flags, so that "what fits" also
// says "how fast". The numbers are the run log's, as the trainer prints them
// for the same flags with `--clock modeled --dry-run`. Every time is modeled,
// not measured.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "check.h"
#include "memory.h"
#include "memory_estimate.h"
#include "run_config.h"
#include "stage_fns.h"

namespace zf::tool {
namespace {

// A folder of its own for the run log, removed with what is in it.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/zf-estimate-XXXXXX";
    REQUIRE(mkdtemp(pattern.data()) != nullptr,
            "memory_estimate: cannot make a scratch folder for the dry run's log at " << pattern
                                                                                     << " (set TMPDIR to a writable folder)");
    path_ = pattern;
  }
  ~ScratchDir() {
    ::unlink(log().c_str());
    ::rmdir(path_.c_str());
  }
  std::string log() const { return path_ + "/run.jsonl"; }

 private:
  std::string path_;
};

}  // namespace

StageTime modeled_time(const Request& q, Stage s, const RunConfig& run) {
  StageTime t;
  if (run.ranks > kMaxDryRanks) {
    t.why_not = "N above " + std::to_string(kMaxDryRanks) + ", a dry run's most";
    return t;
  }
  // Its disk tier makes and reserves real files in the folder, which an
  // estimate must not do: the trainer's own dry run times it.
  if (s == Stage::offload && !run.offload.offload_dir.empty()) {
    t.why_not = "--offload-dir's dry run makes its files there; time it with `offload <these flags> --clock "
                "modeled --hardware " + q.hardware + " --dry-run`";
    return t;
  }
  // The run's own flags, modeled and dry, with no injected fault; what only
  // a real run has (values, files) is left out.
  RunConfig cfg = run;
  cfg.stage = stage_name(s);
  cfg.clock = "modeled";
  cfg.hardware = q.hardware;
  cfg.dry_run = true;
  cfg.quiet = true;
  cfg.device_mem.reset();  // the peak is the tables'; time it whether or not it fits
  cfg.data.clear(), cfg.val_data.clear(), cfg.init.clear(), cfg.save_init.clear(), cfg.save.clear();
  cfg.resume.clear(), cfg.trace.clear();
  cfg.val_every = cfg.sample_every = 0;
  // The step shown: the second, the first to overlap the step before it;
  // with the delayed update the third of four, the first that waits for the
  // update before it.
  const bool delayed = s == Stage::offload && cfg.offload.delay_update;
  cfg.steps = delayed ? 4 : 2;
  const int shown = delayed ? 2 : 1;
  const ScratchDir dir;
  cfg.log_json = dir.log();
  try {
    run_training(cfg, stage_fn(s, cfg.offload));
  } catch (const UsageError& e) {  // a dry run this machine cannot hold (its token buffers are real)
    t.why_not = e.what();
    return t;
  } catch (const OutOfMemory& e) {  // its host states' mappings refused (an address-space limit)
    t.why_not = e.what();
    return t;
  }

  std::ifstream in(cfg.log_json);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("summary")) t.clock = j["summary"].value("clock_detail", "");
    if (!j.contains("step") || j["step"] != shown) continue;
    t.ms = j["ms"];
    t.tokens_per_s = j["tokens_per_s"];
    t.mfu = j["mfu"];
    t.exposed_comm_ms = j["phases_ms"].value("exposed comm", 0.0);
    t.compute_ms = j["phases_ms"].value("compute", 0.0);
    t.comm_ms = j["phases_ms"].value("comm", 0.0);
    t.ranks = cfg.ranks;
    t.ran = true;
  }
  REQUIRE(t.ran, "memory_estimate: the dry run of " << stage_name(s) << " logged no step " << shown);
  return t;
}

}  // namespace zf::tool
