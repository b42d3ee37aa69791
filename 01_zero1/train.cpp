// train.cpp: the `zero1` executable, stage 01 (ZeRO-1: sharded optimizer states).
//
//   build/01_zero1/zero1 --ranks 4 --model small --steps 300 --batch 2
//
// Flags are docs/SPEC.md's (see --help). The loop is in zero1.cpp, the sharded
// optimizer in sharded_adamw.cpp.
#include "zero1.h"

int main(int argc, char** argv) {
  return zf::stage_main(argc, argv, {"zero1", "stage 01: ZeRO-1"}, zf::train_zero1);
}
