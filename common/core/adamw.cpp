// adamw.cpp: the AdamW update on a flat range (see adamw.h for the formula).
// Written as one pass over memory in the order PyTorch's single-tensor
// implementation applies its operations, so results match it to rounding.
#include "adamw.h"

#include <cmath>

#include "simd.h"

namespace zf {

namespace {

inline float load(const float* g, size_t i) { return g[i]; }
inline float load(const bf16* g, size_t i) { return bf16_to_float(g[i]); }

template <class G>
ZF_VECTOR_CLONES
void adamw_impl(float* __restrict param, const G* __restrict grad, float* __restrict m,
                float* __restrict v, size_t n, const AdamWConfig& cfg, long step, float grad_scale,
                bool decay) {
  const float b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps;
  const float decay_factor = decay ? 1.0f - cfg.lr * cfg.weight_decay : 1.0f;
  // Scalars in double, as PyTorch computes them in Python before the loop.
  const double bias1 = 1.0 - std::pow(double(b1), double(step));
  const float bias2_sqrt = float(std::sqrt(1.0 - std::pow(double(b2), double(step))));
  const float step_size = float(double(cfg.lr) / bias1);
  for (size_t i = 0; i < n; ++i) {
    float g = load(grad, i) * grad_scale;
    float p = param[i] * decay_factor;
    float mi = m[i] + (1.0f - b1) * (g - m[i]);
    float vi = v[i] * b2 + (1.0f - b2) * g * g;
    float denom = std::sqrt(vi) / bias2_sqrt + eps;
    param[i] = p - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                  const AdamWConfig& cfg, long step, float grad_scale, bool decay) {
  adamw_impl(param, grad, m, v, n, cfg, step, grad_scale, decay);
}

void adamw_update(float* param, const bf16* grad, float* m, float* v, size_t n,
                  const AdamWConfig& cfg, long step, float grad_scale, bool decay) {
  adamw_impl(param, grad, m, v, n, cfg, step, grad_scale, decay);
}

float clip_coefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  double coef = double(max_norm) / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

GradClip grad_clip(double norm, float max_norm) { return {float(norm), clip_coefficient(norm, max_norm)}; }

}  // namespace zf
