// train.cpp: the `zero2` executable, stage 02 (ZeRO-2: sharded optimizer states and gradients).
//
//   build/02_zero2/zero2 --ranks 4 --model small --steps 300 --batch 2
//
// Flags are docs/SPEC.md's (see --help). The loop is in zero2.cpp, the gradient
// path in sharded_grads.cpp; the optimizer is stage 01's.
#include "zero2.h"

int main(int argc, char** argv) {
  return zf::stage_main(argc, argv, {"zero2", "stage 02: ZeRO-2"}, zf::train_zero2);
}
