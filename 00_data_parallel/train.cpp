// train.cpp: the `dp` executable, stage 00 (data parallel).
//
//   build/00_data_parallel/dp --ranks 4 --model small --steps 300 --batch 2
//
// Flags are docs/SPEC.md's (see --help). The loop itself is in data_parallel.cpp.
#include "data_parallel.h"

int main(int argc, char** argv) {
  return zf::stage_main(argc, argv, {"dp", "stage 00: data parallel"}, zf::train_data_parallel);
}
