// memory_model.cpp: docs/SPEC.md's model-state formulas (see memory_model.h).
#include "memory_model.h"

#include <algorithm>
#include <cmath>

#include "check.h"

namespace zf {

const std::vector<Stage>& all_stages() {
  static const std::vector<Stage> stages{Stage::dp,    Stage::zero1, Stage::zero2,
                                         Stage::zero3, Stage::fsdp,  Stage::offload};
  return stages;
}

const char* stage_label(Stage s) {
  switch (s) {
    case Stage::dp: return "00 data parallel";
    case Stage::zero1: return "01 ZeRO-1";
    case Stage::zero2: return "02 ZeRO-2";
    case Stage::zero3: return "03 ZeRO-3";
    case Stage::fsdp: return "04 FSDP";
    case Stage::offload: return "05 offload";
  }
  return "?";
}

ModelSizes unpadded_sizes(double params, int ranks) {
  REQUIRE(ranks >= 1, "unpadded_sizes: ranks must be >= 1, got " << ranks);
  ModelSizes z;
  z.ranks = ranks;
  z.params = params;
  z.padded = params;
  z.shard = params / ranks;
  return z;
}

ModelSizes padded_sizes(const ModelLayout& layout, int ranks) {
  REQUIRE(ranks >= 1, "padded_sizes: ranks must be >= 1, got " << ranks);
  ModelSizes z;
  z.ranks = ranks;
  size_t padded = 0, shard = 0;
  for (const auto& u : layout.units) {
    const size_t s = (u.numel + size_t(ranks) - 1) / size_t(ranks);  // ceil(n_u / N)
    shard += s;
    padded += s * size_t(ranks);
  }
  z.params = double(layout.numel);
  z.padded = double(padded);
  z.shard = double(shard);
  return z;
}

ModelStateBytes model_state_bytes(Stage stage, Precision precision, const ModelSizes& z, const StateOptions& opt) {
  const double e = precision == Precision::fp32 ? 4 : 2;   // params and grads, compute dtype
  const double o = precision == Precision::fp32 ? 8 : 12;  // float32 moments (+ master in bf16)
  ModelStateBytes b;
  switch (stage) {
    case Stage::dp:
      b.device = {e * z.params, e * z.params, o * z.params};
      break;
    case Stage::zero1:
      b.device = {e * z.padded, e * z.padded, o * z.shard};
      break;
    case Stage::zero2:
      b.device = {e * z.padded, e * z.shard, o * z.shard};
      break;
    case Stage::zero3:
      b.device = {e * z.shard, e * z.shard, o * z.shard};
      break;
    case Stage::fsdp:  // float32 shards of both, in both recipes: the shard is its own master
      b.device = {4 * z.shard, 4 * z.shard, 8 * z.shard};
      break;
    case Stage::offload:
      // Stage 04's float32 shards on the host, plus the gather dtype's copy
      // of the parameters: on the device, and in bf16 on the host as well
      // (in fp32 the float32 shard is that copy).
      b.host = {4 * z.shard + (e == 4 ? 0 : e * z.shard), 4 * z.shard, 8 * z.shard};
      if (!opt.offload_params) b.device = {e * z.shard, 0, 0};
      // The delayed update reads one gradient buffer while the next step
      // fills the other; with the parameters on the host, the all-gathers
      // read a copy of their own while it writes the first.
      if (opt.delay_update) {
        b.host.grads += 4 * z.shard;
        if (opt.offload_params) b.host.params += e * z.shard;
      }
      break;
  }
  // --no-sync keeps every unit's unsharded gradient, padded, in the recipe's
  // dtype, for the whole run (04_fsdp/flat_grads.h).
  const bool fsdp_family = stage == Stage::fsdp || stage == Stage::offload;
  if (fsdp_family && opt.no_sync) b.device.grads += e * z.padded;
  if (stage == Stage::offload && opt.disk_tier) {
    // The moments in files; with --offload-params in bf16 the float32
    // shards too, the host keeping only the bf16 copy (05_offload/offload.cpp).
    // The host streams them through two chunks of each array: a chunk is
    // kDiskChunkElems floats, or the shard rounded up to kDiskAlignElems
    // when it is smaller (05_offload/extensions/disk_tier.h).
    const bool master_on_disk = opt.offload_params && precision == Precision::bf16;
    const double arrays = master_on_disk ? 3 : 2;
    const double chunk = std::min(double(kDiskChunkElems), std::ceil(z.shard / kDiskAlignElems) * kDiskAlignElems);
    b.disk.optimizer = 8 * z.shard;
    b.host.optimizer = 2 * arrays * chunk * 4;
    if (master_on_disk) {
      b.disk.params = 4 * z.shard;
      b.host.params -= 4 * z.shard;
    }
  }
  return b;
}

}  // namespace zf
