// adamw_simd.cpp: the AVX2 and AVX-512 forms of the AdamW kernel
// (adamw_kernel.h). The build passes no -march, so each form is compiled for
// its instruction set with a target attribute and called only after
// isa_supported() has checked the CPU: the binary still runs on any x86-64.
//
// Bit-exact with the scalar form: no fused multiply-add (the target
// attributes do not enable FMA, and the project is compiled with
// -ffp-contract=off), and the vector square root and division are the
// correctly rounded IEEE operations, like their scalar counterparts.
#include "adamw_kernel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#include <cstdint>

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers start some intrinsics from a register initialised
// with itself (_mm512_undefined_ps), which -Wmaybe-uninitialized reports.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace zf::adamw_detail {

// ---------------------------------------------------------------------------
// AVX2: 8 lanes.
namespace avx2 {

#define ZF_ISA_TARGET __attribute__((target("avx2")))
#define ZF_ISA_INLINE __attribute__((target("avx2"), always_inline)) inline

struct V {
  using F = __m256;
  static constexpr size_t W = 8;
  static ZF_ISA_INLINE F set1(float x) { return _mm256_set1_ps(x); }
  static ZF_ISA_INLINE F load(const float* x) { return _mm256_loadu_ps(x); }
  // bf16 -> float32: the 16 bits moved to the top of a 32-bit lane (exact).
  static ZF_ISA_INLINE F load(const bf16* x) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
  static ZF_ISA_INLINE void store(float* x, F a) { _mm256_storeu_ps(x, a); }
  // float32 -> bf16 as float_to_bf16: round to nearest even, a NaN made quiet.
  static ZF_ISA_INLINE void store(bf16* x, F a) {
    const __m256i u = _mm256_castps_si256(a);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                         _mm256_and_si256(hi, _mm256_set1_epi32(1))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i bits = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    // Every lane is below 2^16, so packing with unsigned saturation keeps it;
    // the pack works per 128-bit half, the permute joins the two halves.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(x), _mm256_castsi256_si128(packed));
  }
  static ZF_ISA_INLINE F add(F a, F b) { return _mm256_add_ps(a, b); }
  static ZF_ISA_INLINE F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static ZF_ISA_INLINE F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static ZF_ISA_INLINE F div(F a, F b) { return _mm256_div_ps(a, b); }
  static ZF_ISA_INLINE F sqrt(F a) { return _mm256_sqrt_ps(a); }
};

#include "adamw_simd_body.inc"

#undef ZF_ISA_TARGET
#undef ZF_ISA_INLINE

}  // namespace avx2

// ---------------------------------------------------------------------------
// AVX-512F: 16 lanes (AVX-512F alone: no BW or VL instruction is used).
namespace avx512 {

#define ZF_ISA_TARGET __attribute__((target("avx512f")))
#define ZF_ISA_INLINE __attribute__((target("avx512f"), always_inline)) inline

struct V {
  using F = __m512;
  static constexpr size_t W = 16;
  static ZF_ISA_INLINE F set1(float x) { return _mm512_set1_ps(x); }
  static ZF_ISA_INLINE F load(const float* x) { return _mm512_loadu_ps(x); }
  static ZF_ISA_INLINE F load(const bf16* x) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
  static ZF_ISA_INLINE void store(float* x, F a) { _mm512_storeu_ps(x, a); }
  static ZF_ISA_INLINE void store(bf16* x, F a) {
    const __m512i u = _mm512_castps_si512(a);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                         _mm512_and_si512(hi, _mm512_set1_epi32(1))), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i bits = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    // Every lane is below 2^16: keeping the low 16 bits of each is exact.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), _mm512_cvtepi32_epi16(bits));
  }
  static ZF_ISA_INLINE F add(F a, F b) { return _mm512_add_ps(a, b); }
  static ZF_ISA_INLINE F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static ZF_ISA_INLINE F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static ZF_ISA_INLINE F div(F a, F b) { return _mm512_div_ps(a, b); }
  static ZF_ISA_INLINE F sqrt(F a) { return _mm512_sqrt_ps(a); }
};

#include "adamw_simd_body.inc"

#undef ZF_ISA_TARGET
#undef ZF_ISA_INLINE

}  // namespace avx512

void update_avx2(const Range& r, const Scalars& s) { avx2::update_range(r, s); }
void update_avx512(const Range& r, const Scalars& s) { avx512::update_range(r, s); }

}  // namespace zf::adamw_detail

#endif  // x86-64
