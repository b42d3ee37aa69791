// cuda_bf16.h of the emulated GPU (zf_emu.h): __nv_bfloat16 and the
// conversions the project uses, rounding as the hardware's cvt.rn.bf16.f32
// does (to nearest even; any NaN becomes the canonical 0x7fff).
#pragma once

#include <cstdint>
#include <cstring>

#include "zf_emu.h"

struct __nv_bfloat16_raw {
  unsigned short x;
};

inline unsigned short zf_emu_float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float zf_emu_bf16_bits_to_float(unsigned short b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct alignas(2) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(zf_emu_float_to_bf16_bits(f)) {}
  __nv_bfloat16(double f) : __x(zf_emu_float_to_bf16_bits(float(f))) {}
  operator float() const { return zf_emu_bf16_bits_to_float(__x); }
  operator __nv_bfloat16_raw() const { return {__x}; }
};
using nv_bfloat16 = __nv_bfloat16;

inline float __bfloat162float(__nv_bfloat16 h) { return zf_emu_bf16_bits_to_float(h.__x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16_raw{zf_emu_float_to_bf16_bits(f)}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
