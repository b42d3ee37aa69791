// train.cpp: the `offload` executable, stage 05 (stage 04's FSDP with the
// model states on the host and AdamW on the CPU).
//
//   build/05_offload/offload --ranks 2 --model small --steps 50 --batch 2 --precision bf16
//   build/05_offload/offload --ranks 2 --model small --offload-params --device-mem 8MiB
//
// Flags are docs/SPEC.md's, with stage 04's and stage 05's own (see --help).
// The loop is in offload.cpp; the host's parameters in offload_params.cpp,
// its gradients in host_grads.cpp, the CPU's AdamW in host_adamw.cpp; the
// units and the all-gathers and reduce-scatters are stage 04's.
#include "offload.h"

int main(int argc, char** argv) {
  return zf::stage_main(argc, argv, {"offload", "stage 05: offload", zf::StageFlags::offload}, zf::train_offload);
}
