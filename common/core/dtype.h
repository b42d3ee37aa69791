// dtype.h: the element types of this project (float32, bfloat16, int64) and
// the bf16 conversions.
//
// bf16 keeps float32's 8-bit exponent and the top 7 bits of its mantissa, so a
// float becomes bf16 by rounding away the low 16 bits (round to nearest, ties
// to even, NaN kept a NaN) and a bf16 becomes a float exactly by shifting back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace zf {

enum class DType { f32, bf16, i64, i32 };  // i32: token ids (not communicated)

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i64: return 8;
    case DType::i32: return 4;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
    case DType::i32: return "i32";
  }
  return "?";
}

struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 h) {
  uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{uint16_t(u >> 16)};
}

// Bulk conversions (vectorised in dtype.cpp).
void bf16_to_float(const bf16* in, float* out, size_t n);
void float_to_bf16(const float* in, bf16* out, size_t n);

}  // namespace zf
