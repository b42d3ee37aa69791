// train.cpp: the `offload` executable, stage 05 (stage 04's FSDP with the
// model states on the host and AdamW on the CPU).
//
//   build/05_offload/offload --ranks 2 --model small --steps 50 --batch 2 --precision bf16
//   build/05_offload/offload --ranks 2 --model small --batch 1 --precision bf16 --recompute full --device-mem 8MiB
//
// Flags are docs/SPEC.md's, with stage 04's and stage 05's own (see --help).
// The lesson's loop is in offload.cpp; with --offload-params, --offload-dir
// or --delay-update, extensions/offload.cpp's (the lesson with those three).
#include "extensions/offload.h"

int main(int argc, char** argv) {
  // offload_main.h's stage_main: it hands the stage its own flags too.
  return zf::stage_main(argc, argv, {"offload", "stage 05: offload", zf::StageFlags::offload},
                        zf::train_offload_extended);
}
