// adamw.cpp: the AdamW update on a flat range (see adamw.h for the formula):
// the scalar form of the kernel, the choice of instruction set, and the
// clipping coefficient. The vector forms are in adamw_simd.cpp, the thread
// pool in adamw_threads.cpp.
#include "adamw.h"

#include <cmath>

#include "adamw_kernel.h"
#include "check.h"

namespace zf {

using adamw_detail::Range;
using adamw_detail::Scalars;

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

Isa isa_from_name(const std::string& name) {
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (name == isa_name(isa)) return isa;
  USAGE_REQUIRE(false, "unknown instruction set \"" << name << "\" for AdamW: use scalar, avx2 or avx512");
  return Isa::scalar;
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    // These also check that the OS saves the wide registers (XCR0).
    case Isa::avx2: return __builtin_cpu_supports("avx2");
    case Isa::avx512: return __builtin_cpu_supports("avx512f");
#else
    case Isa::avx2:
    case Isa::avx512: return false;
#endif
  }
  return false;
}

Isa best_isa() {
  static const Isa best = isa_supported(Isa::avx512) ? Isa::avx512
                          : isa_supported(Isa::avx2) ? Isa::avx2
                                                     : Isa::scalar;
  return best;
}

namespace adamw_detail {

// The checks every entry point makes before any element is touched.
void check_call(const Range& r, Isa isa) {
  USAGE_REQUIRE(isa_supported(isa), "AdamW: this CPU cannot run " << isa_name(isa) << " instructions; use "
                                        << isa_name(best_isa()) << " (best_isa()) or scalar");
  REQUIRE(r.g_dtype == DType::f32 || r.g_dtype == DType::bf16,
          "AdamW: gradients must be f32 or bf16, not " << dtype_name(r.g_dtype));
  REQUIRE(!r.out || r.out_dtype == DType::f32 || r.out_dtype == DType::bf16,
          "AdamW: the parameter copy must be f32 or bf16, not " << dtype_name(r.out_dtype));
}

// One range on the calling thread, already checked.
void run(const Range& r, const Scalars& s, Isa isa) {
  switch (isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case Isa::avx512: update_avx512(r, s); return;
    case Isa::avx2: update_avx2(r, s); return;
#endif
    default:
      for (size_t i = 0; i < r.n; ++i) update_element(r, i, s);
  }
}

}  // namespace adamw_detail

void adamw_fused(float* param, const void* grad, DType g_dtype, float* m, float* v, void* out,
                 DType out_dtype, size_t n, const AdamWConfig& cfg, long step, float grad_scale,
                 bool decay, Isa isa) {
  const Range r{param, grad, g_dtype, m, v, out, out_dtype, n};
  adamw_detail::check_call(r, isa);
  adamw_detail::run(r, adamw_detail::make_scalars(cfg, step, grad_scale, decay), isa);
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                  const AdamWConfig& cfg, long step, float grad_scale, bool decay) {
  adamw_fused(param, grad, DType::f32, m, v, nullptr, DType::f32, n, cfg, step, grad_scale, decay, best_isa());
}

void adamw_update(float* param, const bf16* grad, float* m, float* v, size_t n,
                  const AdamWConfig& cfg, long step, float grad_scale, bool decay) {
  adamw_fused(param, grad, DType::bf16, m, v, nullptr, DType::f32, n, cfg, step, grad_scale, decay, best_isa());
}

float clip_coefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  double coef = double(max_norm) / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

GradClip grad_clip(double norm, float max_norm) { return {float(norm), clip_coefficient(norm, max_norm)}; }

}  // namespace zf
