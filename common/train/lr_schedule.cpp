// lr_schedule.cpp: the factors of lr_schedule.h.
#include "lr_schedule.h"

#include <cmath>
#include <sstream>

namespace zf {

const char* lr_decay_name(LrDecay d) {
  switch (d) {
    case LrDecay::constant: return "constant";
    case LrDecay::cosine: return "cosine";
    case LrDecay::linear: return "linear";
  }
  return "?";
}

float LrSchedule::at(int step) const {
  double factor = 1.0;
  if (step < warmup) {
    factor = double(step + 1) / warmup;
  } else if (decay != LrDecay::constant && steps > warmup) {
    const double p = double(step - warmup) / (steps - warmup);
    const double r = double(min_lr) / double(lr);
    const double kept = decay == LrDecay::cosine ? (1.0 + std::cos(M_PI * p)) / 2.0 : 1.0 - p;
    factor = r + (1.0 - r) * kept;
  }
  return float(double(lr) * factor);
}

std::string LrSchedule::describe() const {
  std::ostringstream s;
  s << lr_decay_name(decay) << " ";
  if (decay == LrDecay::constant) s << lr;
  else s << "from " << lr << " to " << min_lr;
  if (warmup > 0) s << " after " << warmup << " warmup step" << (warmup == 1 ? "" : "s");
  return s.str();
}

std::string lr_schedule_text(const LrSchedule& s, float weight_decay) {
  std::ostringstream t;
  t << s.describe();
  if (s.decay != LrDecay::constant) t << " over " << s.steps << " steps";  // where the decay ends
  t << ", weight decay " << weight_decay;
  return t.str();
}

}  // namespace zf
