// runner.h: what stage_main (stage_main.h) runs, and the library entry
// point the tests call: load the data, start the ranks, run the stage's
// training function on each, gather the per-rank results, print and log them.
//
// A stage provides one StageFn (stage 05 an OffloadStageFn, which also
// receives its own flags: offload_main.h); everything around it is shared,
// so a stage folder shows only its strategy.
#pragma once

#include "cli.h"
#include "data.h"
#include "launch.h"
#include "offload_main.h"
#include "report.h"
#include "run_config.h"
#include "stage_main.h"

namespace zf {

// Runs a stage with cfg.ranks ranks. Throws UsageError (bad data file),
// OutOfMemory (over --device-mem) or Error (a rank failed, named). A run
// stopped by a signal (stop_request.h) returns normally, with the signal in
// its ranks' results; an output that could not be written (the run log, the
// trace) is in not_written.
RunResult run_training(const RunConfig& cfg, const StageFn& stage);
// Stage 05's: with cfg.offload, its own flags, which the harness reads too
// (the outputs against --offload-dir, the host's memory). A TrainConfig has
// none: passing one would run stage 05 with none of them.
RunResult run_training(const RunConfig& cfg, const OffloadStageFn& stage);
RunResult run_training(const TrainConfig& cfg, const OffloadStageFn& stage) = delete;

// The exit status of a run that returned (docs/SPEC.md "Exit codes"):
// 128 + the signal it stopped on, else 4 if an output was not written, else 0.
int exit_status(const RunResult& run);

}  // namespace zf
