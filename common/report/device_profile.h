// device_profile.h: where a step's device time goes, op by op.
//
// With ZF_PROFILE=1 in the environment every rank's Device is wrapped in a
// ProfilingDevice: it forwards every call, and brackets each op that runs on
// the device (the model's kernels, casts, AdamW, the norm, zero/copy) with
// two marks on the device's timeline (device.h: CUDA events on a GPU, the
// host clock on the CPU). At the end of the run rank 0 prints a table: per
// op, calls, total device milliseconds and share of the timed total.
//
//   ZF_PROFILE=1 build/00_data_parallel/dp --model small --steps 20
//
// What it measures: the time between the mark before an op and the mark
// after it on the device's stream: the op's kernels, plus any time the GPU
// sat idle waiting for the host to launch them (a launch-bound op shows up
// as such). Transfers to and from the host and collectives are not ops of
// the device and are not in the table (the comm table has the collectives).
// The marks cost a little (two event records per op), so profile apart from
// the runs whose speed you report.
#pragma once

#include <memory>

#include "device.h"

namespace zf {

// True when ZF_PROFILE is set to something other than "" or "0".
bool profiling_requested();

// Wraps `inner`; the table is printed when the returned device is destroyed,
// if `print` (rank 0 of the process that prints).
std::unique_ptr<Device> make_profiling_device(std::unique_ptr<Device> inner, bool print);

}  // namespace zf
