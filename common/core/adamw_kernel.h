// adamw_kernel.h: what adamw.cpp (the scalar form and the dispatch) and
// adamw_simd.cpp (the AVX2 and AVX-512 forms) share: the step's scalars, one
// range of work, and the update of a single element, which is the definition
// every vector form reproduces bit for bit and which they use for the last
// elements that do not fill a vector.
#pragma once

#include <cmath>
#include <cstddef>

#include "adamw.h"
#include "dtype.h"

namespace zf::adamw_detail {

// The step's constants, each rounded to float32 once as the scalar loop
// rounds them.
struct Scalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float decay_factor;  // 1 - lr * wd, or 1 without decay
  float bias2_sqrt;    // sqrt(1 - beta2^t)
  float step_size;     // lr / (1 - beta1^t)
  float grad_scale;
};

// bias1, bias2_sqrt and step_size in double, as PyTorch computes them in
// Python before its loop.
inline Scalars make_scalars(const AdamWConfig& cfg, long step, float grad_scale, bool decay) {
  Scalars s;
  s.beta1 = cfg.beta1;
  s.one_minus_beta1 = 1.0f - cfg.beta1;
  s.beta2 = cfg.beta2;
  s.one_minus_beta2 = 1.0f - cfg.beta2;
  s.eps = cfg.eps;
  s.decay_factor = decay ? 1.0f - cfg.lr * cfg.weight_decay : 1.0f;
  const double bias1 = 1.0 - std::pow(double(cfg.beta1), double(step));
  s.bias2_sqrt = float(std::sqrt(1.0 - std::pow(double(cfg.beta2), double(step))));
  s.step_size = float(double(cfg.lr) / bias1);
  s.grad_scale = grad_scale;
  return s;
}

// Elements [0, n) of one call, the pointers already offset to the range.
struct Range {
  float* p;
  const void* g;
  DType g_dtype;  // f32 or bf16
  float* m;
  float* v;
  void* out;      // null: no copy
  DType out_dtype;  // f32 or bf16
  size_t n;

  // Elements [lo, hi) of this range.
  Range slice(size_t lo, size_t hi) const {
    Range r = *this;
    r.p += lo;
    r.g = static_cast<const char*>(g) + lo * dtype_size(g_dtype);
    r.m += lo;
    r.v += lo;
    if (out) r.out = static_cast<char*>(out) + lo * dtype_size(out_dtype);
    r.n = hi - lo;
    return r;
  }
};

// Element i of r: multiplications and additions in the order of adamw.h,
// each rounded to float32 (no fused multiply-add).
inline void update_element(const Range& r, size_t i, const Scalars& s) {
  const float gi = (r.g_dtype == DType::bf16 ? bf16_to_float(static_cast<const bf16*>(r.g)[i])
                                             : static_cast<const float*>(r.g)[i]) * s.grad_scale;
  const float p = r.p[i] * s.decay_factor;
  const float mi = r.m[i] + s.one_minus_beta1 * (gi - r.m[i]);
  const float vi = r.v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
  const float denom = std::sqrt(vi) / s.bias2_sqrt + s.eps;
  const float p_new = p - s.step_size * (mi / denom);
  r.p[i] = p_new;
  r.m[i] = mi;
  r.v[i] = vi;
  if (r.out) {
    if (r.out_dtype == DType::bf16) static_cast<bf16*>(r.out)[i] = float_to_bf16(p_new);
    else static_cast<float*>(r.out)[i] = p_new;
  }
}

// The vector forms (adamw_simd.cpp); call only when isa_supported says so.
// On other machines than x86-64 they do not exist and are never called.
void update_avx2(const Range& r, const Scalars& s);
void update_avx512(const Range& r, const Scalars& s);

// adamw.cpp: the checks made before any element is touched (a supported isa,
// f32 or bf16 gradients and copy), and one checked range on the calling thread.
void check_call(const Range& r, Isa isa);
void run(const Range& r, const Scalars& s, Isa isa);

// How CpuAdamW cuts [0, n) among at most `threads` threads (adamw_threads.cpp):
// `parts` chunks of `chunk` elements, the last one shorter. chunk is a
// multiple of kAlign elements; below kMinPerThread elements per thread the
// work stays on fewer threads (parts == 1: the calling thread alone).
constexpr size_t kAlign = 16;  // a multiple of every vector width
constexpr size_t kMinPerThread = size_t(1) << 15;  // waking a thread costs more below
struct Split {
  size_t chunk;
  int parts;
};
Split split(size_t n, int threads);

}  // namespace zf::adamw_detail
