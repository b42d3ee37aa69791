// adamw.h: AdamW on a flat range, with PyTorch's torch.optim.AdamW semantics.
//
// For each element, with t the step counted from 1 and g the gradient times
// grad_scale (the clipping coefficient):
//   p <- p * (1 - lr * wd)                     (decoupled decay; only if `decay`)
//   m <- m + (1 - beta1) * (g - m)
//   v <- beta2 * v + (1 - beta2) * g * g
//   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// A stage calls it on whatever range it owns: the whole model (data
// parallel), or its shard (ZeRO), one ParamSpec piece at a time so that
// decay applies to matrices and not to biases or LayerNorm.
#pragma once

#include <cstddef>

#include "dtype.h"

namespace zf {

struct AdamWConfig {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                  const AdamWConfig& cfg, long step, float grad_scale, bool decay);
void adamw_update(float* param, const bf16* grad, float* m, float* v, size_t n,
                  const AdamWConfig& cfg, long step, float grad_scale, bool decay);

// PyTorch's clip_grad_norm_ coefficient: min(1, max_norm / (norm + 1e-6));
// 1 when clipping is off (max_norm == 0).
float clip_coefficient(double norm, float max_norm);

// A step's global gradient norm and the clipping coefficient taken from it.
// The norm is computed whether or not clipping is on (the run log's
// grad_norm); the coefficient comes from the norm in double, as above.
struct GradClip {
  float norm = 0.0f;   // ||g||, rounded to float32 (clip_grad_norm_'s return value)
  float scale = 1.0f;  // clip_coefficient(norm, max_norm)
};
GradClip grad_clip(double norm, float max_norm);

}  // namespace zf
