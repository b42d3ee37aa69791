// offload.h: stage 05, offload: stage 04's FSDP with the model states moved
// to the host and the optimizer run by the CPU (ZeRO-Offload; FSDP's
// CPUOffload).
//
// Against stage 04:
// - the float32 parameter and gradient shards and AdamW's moments live on
//   the host (offload_params.h, host_grads.h, host_adamw.h), and the CPU
//   runs AdamW on them (CpuAdamW, adamw.h, on --optimizer-threads threads),
//   rounding each updated piece into the bf16 copy in the same pass;
// - the device keeps only the parameter shard in the gather dtype (2 bytes
//   per shard element in bf16, 4 in fp32);
// - each unit's reduced gradient piece is copied device->host as soon as its
//   reduce-scatter is done, while the backward goes on; each unit's updated
//   parameters are copied host->device as soon as its update is done, while
//   the CPU updates the next;
// - the step line and the run log split the step's wall time into phases
//   (wall_phases.h).
//
// Model states per rank (S: my shard of the padded FSDP units):
//   device   e * S params (e = 2 in bf16, 4 in fp32)
//   host     4S params (the float32 shards) + 2S in bf16 (the copy the
//            device receives) + 4S grads + 8S optimizer
// Every stage-04 flag works the same here, and the results are stage 04's
// (and so stage 00's) to the bit.
//
// Its extensions (ZeRO-Infinity's parameter and disk tiers, ZeRO-Offload's
// delayed update) are in extensions/, read after this lesson.
#pragma once

#include "offload_options.h"
#include "stage_main.h"

namespace zf {

// `offload`: stage 05's own flags (offload_options.h). The lesson takes
// --optimizer-threads and --no-pin, and refuses the others (extensions/'s).
RankResult train_offload(const TrainConfig& cfg, const OffloadOptions& offload, RankContext& ctx,
                         const TokenData& data, StepLog& log);

}  // namespace zf
