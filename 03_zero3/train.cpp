// train.cpp: the `zero3` executable, stage 03 (ZeRO-3: optimizer states,
// gradients and parameters sharded).
//
//   build/03_zero3/zero3 --ranks 4 --model small --steps 300 --batch 2
//
// Flags are docs/SPEC.md's (see --help). The loop is in zero3.cpp, the parameter
// gathering in gathered_params.cpp; gradients are stage 02's, the optimizer stage 01's.
#include "zero3.h"

int main(int argc, char** argv) {
  return zf::stage_main(argc, argv, {"zero3", "stage 03: ZeRO-3"}, zf::train_zero3);
}
