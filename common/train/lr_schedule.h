// lr_schedule.h: the learning rate of each step (--lr, --warmup,
// --lr-schedule, --min-lr): a linear warmup, then constant, or a cosine or
// linear decay to a minimum at the last step, the schedules nanoGPT and
// llm.c train with.
//
// With s the step counted from 0, W the warmup steps, S the run's --steps,
// r = min_lr / lr and p = (s - W) / (S - W) the part of the decay done:
//
//   s < W         lr * (s + 1) / W                       (the first step is not 0)
//   constant      lr
//   cosine        lr * (r + (1 - r) * (1 + cos(pi * p)) / 2)
//   linear        lr * (r + (1 - r) * (1 - p))
//
// Each factor is computed in double and multiplied by lr, then rounded to
// float32 once: what PyTorch's LambdaLR gives with the factor as its lambda.
// --steps counts from step 0 after --resume too, so a resumed run goes on
// with the rates of the uninterrupted run.
#pragma once

#include <string>

namespace zf {

enum class LrDecay { constant, cosine, linear };
const char* lr_decay_name(LrDecay d);  // "constant", "cosine", "linear"

struct LrSchedule {
  float lr = 3e-4f;       // the rate after warmup (the peak)
  LrDecay decay = LrDecay::constant;
  int warmup = 0;         // W
  float min_lr = 0.0f;    // where cosine and linear end (unused by constant)
  int steps = 0;          // S: the run's --steps

  // The rate of step `step` (from 0), as above.
  float at(int step) const;
  // One line for the header and the checkpoint: "cosine from 0.0003 to 3e-05 after 10 warmup steps".
  std::string describe() const;
};

// The schedule of a run of `steps` steps and its weight decay, in words: what a
// checkpoint records, so that a resumed run can say when it goes on otherwise.
std::string lr_schedule_text(const LrSchedule& s, float weight_decay);

}  // namespace zf
