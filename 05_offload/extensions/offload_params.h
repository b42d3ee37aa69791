// offload_params.h: FSDP's flat parameters with their float32 shards on the
// host (ZeRO-Offload), and optionally nothing on the device (--offload-params).
// Stage 04's FlatGathers does the all-gathers and their limit; this class
// says what each one sends.
//
// The float32 shard of every unit is the host's (category params, place
// host): it is what the CPU AdamW updates, as the device's float32 shard is
// in stage 04. What the device needs is the shard in the gather dtype (bf16
// in the bf16 recipe: FSDP2's cast before the all-gather, done here by the
// optimizer's pass on the host):
//
//   host_copy(g)   unit g's shard in the gather dtype on the host: a bf16
//                  copy (pinned: the copy engine reads it), or, in fp32, the
//                  float32 shard itself
//   default        the device keeps that copy (category params, 2 or 4
//                  bytes per shard element); upload(g) copies unit g's piece
//                  host->device after its update, and the all-gathers send it
//   --offload-params  the device keeps nothing: each all-gather's input is
//                  copied host->device just before it (category comm, freed
//                  once the all-gather has read it), so device model states
//                  are 0 besides what is gathered
//   --offload-dir with --offload-params, bf16: the float32 shards are in
//                  files too (disk_adamw.h), and the host keeps only the bf16
//                  copy, which the optimizer's stream writes
//   --delay-update with --offload-params: the CPU update of one step writes
//                  the host copy while the next step's all-gathers read
//                  theirs, so they read a second host copy (eS more on the
//                  host, category params), which upload(g) fills from the
//                  first: the stale parameters stay put until then
#pragma once

#include "flat_params.h"

namespace zf::extensions {

class OffloadParams {
 public:
  // host: the CPU device that computes on host memory. pin: page-locked host copy.
  OffloadParams(const ShardLayout& shards, DType gather_dtype, const FsdpOptions& opt, int last, MemoryTracker& mem,
                Device& dev, Device& host, Communicator& comm, bool offload_params, bool pin,
                bool delay_update = false, bool shards_on_disk = false);

  // Stage 04's loops call these (fsdp.h), as they do FlatParams's.
  void unshard(int g) { gathers_.unshard(g, [&] { return input(g); }); }
  bool prefetch(int g) { return gathers_.prefetch(g, [&] { return input(g); }); }
  const void* wait_for_unshard(int g) { return gathers_.wait_for_unshard(g); }
  void reshard(int g) { gathers_.reshard(g); }
  bool kept(int g) const { return gathers_.kept(g); }

  float* piece(int g);  // my float32 piece of unit g, on the host (S_g elements)
  float* shard() { return piece(0); }  // all my pieces, unit after unit (shard_total elements)
  void* host_copy(int g);  // unit g's shard in the gather dtype, on the host (see above)
  // Rounds unit g's float32 shard into its bf16 host copy (nothing in fp32,
  // or with the shards on disk, where the optimizer's stream does it).
  void narrow_host_copy(int g);
  bool shards_on_disk() const { return shards_on_disk_; }
  // Copies unit g's host copy to the device's (with --offload-params: to the
  // all-gathers' second host copy under --delay-update, else nothing).
  Transfer upload(int g);

 private:
  // Unit g's all-gather input: the device's copy, or (--offload-params) the
  // host's, copied to the device for this all-gather alone.
  FlatGathers::Input input(int g);

  const ShardLayout& layout_;
  DType dtype_;
  MemoryTracker& mem_;
  Device& dev_;
  Device& host_;
  bool offload_params_, shards_on_disk_;
  FlatGathers gathers_;
  Tensor shards_;       // shard_total float32 on the host (params), or none when they are in files
  Tensor host_copy_;    // bf16 recipe: shard_total bf16 on the host (params)
  Tensor device_copy_;  // without --offload-params: shard_total of the gather dtype on the device (params)
  Tensor published_;    // --offload-params --delay-update: what the all-gathers read, on the host (params)
};

}  // namespace zf::extensions
