// memory_model.h: the model-state bytes per rank that docs/SPEC.md's "Memory
// bookkeeping" table promises, as arithmetic instead of allocations.
//
// Per element of the model, a rank holds (e = 4 bytes in fp32, 2 in bf16;
// o = the optimizer's float32 state: 8 bytes of moments, 12 with the bf16
// recipe's master copy):
//
//   stage            params        grads         optimizer
//   00 dp            e * P         e * P         o * P
//   01 ZeRO-1        e * Pp        e * Pp        o * S
//   02 ZeRO-2        e * Pp        e * S         o * S
//   03 ZeRO-3        e * S         e * S         o * S
//   04 FSDP          4 * S         4 * S         8 * S     (float32 shards, no master)
//   05 offload       device: e * S params (0 with --offload-params);
//                    host: stage 04's 4S + 4S + 8S, and in bf16 2S more
//                    params (the bf16 copy the device receives);
//                    --delay-update: 4S more host grads (two buffers), and
//                    with --offload-params e * S more host params
//
// where P is the model's size, Pp the full model in the padded layout and S
// one rank's shard. Unpadded (only P known): Pp = P, S = P / N. Padded per
// unit (shard.h): Pp = sum N * ceil(n_u / N), S = sum ceil(n_u / N). Stage
// 00 never pads. Stage 04 pads its FSDP units: pass its wrapped layout.
//
// With bf16 this gives 16P, 4P + 12P/N, 2P + 14P/N, 16P/N (the ZeRO paper's
// table with bf16 for fp16); with fp32 16P, 8P + 8P/N, 4P + 12P/N, 16P/N.
// The tests compare the trainers' counted bytes with these numbers, and
// tools/memory_estimate prints them without training.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "config.h"
#include "model.h"

namespace zf {

enum class Stage { dp, zero1, zero2, zero3, fsdp, offload };
const std::vector<Stage>& all_stages();
const char* stage_label(Stage s);  // "00 data parallel", "01 ZeRO-1", ...

// Element counts (doubles: P / N need not be whole when unpadded; with the
// padded sizes of a real model every value is an exact integer).
struct ModelSizes {
  int ranks = 1;
  double params = 0;  // P, unpadded
  double padded = 0;  // Pp: the full model in the padded layout
  double shard = 0;   // S: one rank's shard
};

// Only P known: no padding (Pp = P, S = P / N).
ModelSizes unpadded_sizes(double params, int ranks);
// From the layout's units, each padded to a multiple of N as shard.h does.
ModelSizes padded_sizes(const ModelLayout& layout, int ranks);

struct StateBytes {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};
struct ModelStateBytes {
  StateBytes device, host;
  StateBytes disk;  // --offload-dir: the files' bytes (not in total())
  double total() const { return device.total() + host.total(); }
};

// The flags that change what a rank keeps: no_sync for Stage::fsdp and
// Stage::offload; the rest for Stage::offload only.
struct StateOptions {
  bool offload_params = false;  // --offload-params
  bool delay_update = false;    // --delay-update
  bool no_sync = false;         // --no-sync: + e * Pp device grads (the kept unsharded gradients)
  bool disk_tier = false;       // --offload-dir: the moments (and in bf16 with
                                // --offload-params the float32 shards) in files,
                                // the host holding two chunks of each
};

// The disk tier's chunk: 1 Mi floats, each chunk but the last page-aligned
// (a multiple of 1024 floats); stage 05's DiskAdamW uses the same values.
constexpr size_t kDiskChunkElems = size_t(1) << 20;
constexpr size_t kDiskAlignElems = 1024;

// Bytes per rank of params, grads and optimizer state on each place.
ModelStateBytes model_state_bytes(Stage stage, Precision precision, const ModelSizes& sizes,
                                  const StateOptions& options = {});

}  // namespace zf
