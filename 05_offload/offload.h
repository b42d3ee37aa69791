// offload.h: stage 05, offload: stage 04's FSDP with the model states moved
// to the host and the optimizer run by the CPU (ZeRO-Offload; with
// --offload-params, ZeRO-Infinity's CPU tier and FSDP's CPUOffload; with
// --offload-dir, its disk tier).
//
// Against stage 04:
// - the float32 parameter and gradient shards and AdamW's moments live on
//   the host (offload_params.h, host_grads.h; the optimizer is host_adamw.h on
//   host memory, or disk_adamw.h's with --offload-dir), and the CPU runs
//   AdamW on them;
// - the device keeps only the parameter shard in the gather dtype (2 bytes
//   per shard element in bf16, 4 in fp32), or nothing with --offload-params;
// - each unit's reduced gradient piece is copied device->host as soon as its
//   reduce-scatter is done, while the backward goes on; each unit's updated
//   parameters are copied host->device as soon as its update is done, while
//   the CPU updates the next;
// - the CPU AdamW is CpuAdamW (adamw.h) on --optimizer-threads threads, and
//   rounds each updated piece into the bf16 copy in the same pass;
// - --offload-dir: the moments (and, with --offload-params in bf16, the
//   float32 shards) in files, streamed through a window of two chunks
//   (disk_tier.h, disk_adamw.h);
// - the step line and the run log split the step into phases: forward,
//   backward (both timed by a decorator of the rank's compute), the CPU
//   optimizer, the wait for a delayed update, host->device, and the rest
//   (waiting: the last copies to the host among it).
//
// Model states per rank (S: my shard of the padded FSDP units):
//   device   e * S params (e = 2 in bf16, 4 in fp32; 0 with --offload-params)
//   host     4S params (the float32 shards) + 2S in bf16 (the copy the
//            device receives) + 4S grads + 8S optimizer
//   --delay-update: host grads 8S (two buffers), and with --offload-params
//            host params eS more (the all-gathers' own copy)
// Every stage-04 flag works the same here, and the results are stage 04's
// (and so stage 00's) to the bit.
//
// --delay-update (ZeRO-Offload's delayed parameter update): the CPU update
// of step s runs on a worker thread while the device computes step s+1 with
// the parameters it has, one update old; the first step is not delayed, and
// the run waits for the last update. The indexing, and what a checkpoint
// holds: 05_offload/README.md, "The delayed parameter update".
#pragma once

#include "stage_main.h"

namespace zf {

RankResult train_offload(const TrainConfig& cfg, RankContext& ctx, const TokenData& data, StepLog& log);

}  // namespace zf
