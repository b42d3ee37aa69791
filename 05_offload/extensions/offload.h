// extensions/offload.h: stage 05 with its extensions, ZeRO-Infinity's
// parameter and disk tiers and ZeRO-Offload's delayed parameter update, each
// a flag over the lesson (../offload.h), which a reader can stop before:
//
// - --offload-params (ZeRO-Infinity's CPU tier, FSDP's
//   CPUOffload(offload_params=True)): the device keeps no parameter shard;
//   each all-gather's input is copied host->device just before it
//   (offload_params.h);
// - --offload-dir (ZeRO-Infinity's NVMe tier): the moments (and, with
//   --offload-params in bf16, the float32 shards) in files, streamed
//   through a window of two chunks (disk_tier.h, disk_adamw.h);
// - --delay-update (ZeRO-Offload's delayed parameter update, DPU): the CPU
//   update of step s runs on a worker thread while the device computes step
//   s+1 with the parameters it has, one update old; the first step is not
//   delayed, and the run waits for the last update (delayed_update.h, and
//   a second gradient buffer in host_grads.h). The indexing, and what a
//   checkpoint holds: README.md, "The delayed parameter update".
//
// Model states per rank, against the lesson's:
//   --offload-params  device 0 params (each all-gather's input is staged,
//                     category comm); with --delay-update host params eS
//                     more (the all-gathers' own copy)
//   --offload-dir     the moments in files (8S; 12S with the float32
//                     shards), the host holding a window of two chunks
//   --delay-update    host grads 8S (two buffers)
// Every flag of the lesson works the same here, and the results are stage
// 04's (and so stage 00's) to the bit, --delay-update's those of a delayed
// data-parallel reference.
#pragma once

#include "offload_main.h"

namespace zf {

// Stage 05 with the flags above, given in `offload` (offload_options.h,
// with the lesson's); the lesson's train_offload (../offload.h) when none of
// the three is given.
RankResult train_offload_extended(const TrainConfig& cfg, const OffloadOptions& offload, RankContext& ctx,
                                  const TokenData& data, StepLog& log);

}  // namespace zf
