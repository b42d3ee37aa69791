// offload_options.h: stage 05's own flags (docs/SPEC.md, "Stage-specific
// flags"). The CLI parses them into RunConfig (report/run_config.h); stage 05
// receives them beside its TrainConfig (launch/entry/offload_main.h), and the
// estimator counts what they change (estimate/estimate.h).
#pragma once

#include <string>

namespace zf {

struct OffloadOptions {
  bool offload_params = false;  // the parameter shards live on the host too (ZeRO-Infinity's CPU tier)
  std::string offload_dir;      // the optimizer state in files under this folder (its disk tier)
  int optimizer_threads = 0;    // threads of the CPU AdamW (0: the cores left to this rank)
  bool delay_update = false;    // ZeRO-Offload's delayed parameter update (one step stale)
  bool no_pin = false;          // pageable host buffers instead of page-locked ones
};

}  // namespace zf
