// train.cpp: the `fsdp` executable, stage 04 (FSDP: ZeRO-3's sharding with
// FSDP's units, mixed-precision storage, prefetch and resharding knobs).
//
//   build/04_fsdp/fsdp --ranks 4 --model small --steps 300 --batch 2
//   build/04_fsdp/fsdp --ranks 4 --model small --wrap-blocks 2 --reshard-after-forward false
//
// Flags are docs/SPEC.md's, with stage 04's own (see --help). The loop is in
// fsdp.cpp; the units in flat_units.cpp, the parameters in flat_params.cpp,
// the gradients in flat_grads.cpp; the optimizer is stage 01's.
#include "fsdp.h"

int main(int argc, char** argv) {
  return zf::stage_main(argc, argv, {"fsdp", "stage 04: FSDP", zf::StageFlags::fsdp}, zf::train_fsdp);
}
