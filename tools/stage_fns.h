// stage_fns.h: each stage's training function by its Stage (memory_model.h),
// for what runs the stages in its own process: memory_estimate's time
// column and the estimate suite.
#pragma once

#include "data_parallel.h"
#include "fsdp.h"
#include "memory_model.h"
#include "extensions/offload.h"
#include "runner.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {

// `off`: stage 05's flags, which its function receives.
inline StageFn stage_fn(Stage s, const OffloadOptions& off) {
  switch (s) {
    case Stage::dp: return train_data_parallel;
    case Stage::zero1: return train_zero1;
    case Stage::zero2: return train_zero2;
    case Stage::zero3: return train_zero3;
    case Stage::fsdp: return train_fsdp;
    case Stage::offload: return with_options(train_offload_extended, off);  // the lesson when no extension is asked for
  }
  return nullptr;
}

}  // namespace zf
