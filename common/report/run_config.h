// run_config.h: a run as the harness sees it: the training's flags
// (TrainConfig, train/config.h), which the stage reads, and the harness's
// own, which it never does: the run log, the trace, the clock the steps are
// timed on, a dry run, an injected fault, the collectives' timeout. Stage
// 05's own flags are here too, beside the TrainConfig: that stage receives
// them as an argument (launch/entry/offload_main.h), every other stage never
// sees them. All parsed by launch/cli.cpp (docs/SPEC.md). And what the whole
// run gives back (what the tests compare across stages).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "config.h"
#include "offload_options.h"

namespace zf {

struct RunConfig : TrainConfig {
  RunConfig() = default;
  // Implicit: a TrainConfig alone is a run with the harness's defaults and
  // none of stage 05's flags.
  RunConfig(const TrainConfig& train) : TrainConfig(train) {}

  std::string log_json;           // --log-json: the run log, one JSON object a line (report/report.h)
  int log_every = 10;             // --log-every: the human log's step line every this many steps
  std::string trace;              // --trace: the run's timeline, Chrome trace-event JSON (report/trace.h)
  // --comm-timeout, else ZF_COMM_TIMEOUT_S: how long a rank waits for the
  // others in a collective before the job is aborted (0: neither given, the
  // backend's default, kDefaultCommTimeoutS; NCCL's ZF_NCCL_TIMEOUT_S).
  double comm_timeout_s = 0;
  // --clock modeled: steps timed on a modeled machine, --hardware's profile
  // (modeled/modeled_clock.h); "wall": the wall clock.
  std::string clock = "wall";
  std::string hardware;
  // --dry-run: the modeled clock's step with no arithmetic and no data moved
  // (memory counted, states never filled, no final hash): a model or a
  // --ranks far beyond this machine, in seconds.
  bool dry_run = false;
  // --inject-fault, for tests and demos: rank `fault_rank` throws in the
  // middle of step `fault_step` (after its first unit's backward), or, with
  // fault_stall, stops there for good (the others' collectives time out;
  // launch/injected_fault.h).
  int fault_rank = -1;
  int fault_step = -1;
  bool fault_stall = false;
  // Stage 05's flags: what its stage function receives beside the
  // TrainConfig (launch/entry/offload_main.h); refused by the other stages.
  OffloadOptions offload;
};

struct RunResult {
  RunConfig cfg;
  size_t params = 0;              // P, unpadded
  std::string blas;
  std::vector<RankResult> ranks;
  std::vector<std::string> not_written;  // outputs that could not be written, and why (exit 4)
};

}  // namespace zf
