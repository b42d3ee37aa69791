// disk_adamw.h: AdamW over one rank's shard with its moments in files
// (--offload-dir; 05_offload/extensions/README.md, "The disk tier").
//
// The moments m and v live in two files (disk_tier.h); the float32 shards,
// the gradient shards and the bf16 copy stay in host memory, since every
// step reads them outside the optimizer too (the norm, the all-gathers).
// With --offload-params in the bf16 recipe the float32 shards go to a third
// file, and the stream writes the bf16 copy as it updates each chunk.
// Each element takes the same AdamW as in host memory (one span of a
// parameter at a time, for the decay mask), so the results are the
// in-memory optimizer's to the bit, whatever the chunk boundaries.
#pragma once

#include <string>
#include <vector>

#include "adamw.h"
#include "comm.h"
#include "device.h"
#include "disk_tier.h"
#include "initial_state.h"
#include "model.h"
#include "shard.h"

namespace zf::extensions {

class DiskAdamW {
 public:
  // 1 Mi floats (4 MiB) per moment per chunk: large sequential transfers,
  // and a 16 MiB window.
  static constexpr size_t kChunkElems = size_t(1) << 20;

  // flat: the FSDP units' layout (its ParamSpecs give the decay mask).
  // host: the CPU device that computes on host memory.
  // master_on_disk: the float32 shards in a file too (see above).
  // clock: the modeled clock, which the tier's transfers are charged to (null on the wall clock).
  DiskAdamW(const ModelLayout& flat, const ShardLayout& shards, const std::string& dir, int rank, MemoryTracker& mem,
            Device& host, bool master_on_disk = false, size_t chunk_elems = kChunkElems, HostClock* clock = nullptr);

  // On --resume, the moments from the checkpoint into the files (a fresh
  // run's files are zeros); with the master on disk, the parameters too,
  // and their rounding into `copy` (shard_total bf16, host).
  void load(const InitialState& init, bf16* copy = nullptr);
  // AdamW on every element of my shard with grads (shard_total float32,
  // host): master (the same layout, host) updated in place, or the file's
  // streamed (master_on_disk); each updated piece rounded into `copy` (the
  // bf16 recipe's host copy; nullptr in fp32) in the same pass, with the
  // step's settings `adam`.
  void update(float* master, const float* grads, bf16* copy, const AdamWConfig& adam, long step, float scale);
  // The whole model's float32 values of `kind` (m, v; params with the
  // master on disk), from every rank's files (ModelStates::full).
  std::vector<float> gather(StateKind kind, Communicator& comm, Device& comm_dev, bool every_rank = true);
  // My piece of unit u of the same, from the files, into host (ModelStates::copy_piece).
  void copy_piece(StateKind kind, int u, float* host);

  DiskTier& tier() { return tier_; }

 private:
  const ModelLayout& flat_;
  const ShardLayout& shards_;
  Device& host_;
  bool master_on_disk_;
  DiskTier tier_;  // arrays 0: m, 1: v, 2: the master (master_on_disk)
};

}  // namespace zf::extensions
