// dtype.cpp: bulk bf16 <-> float32 conversions, the loops behind every bf16
// copy of parameters and gradients (mixed precision, communication buffers).
//
// They compute exactly what the scalar versions in dtype.h compute (round to
// nearest, ties to even, NaN kept a NaN), written without branches so that
// GCC vectorises them; ZF_VECTOR_CLONES builds AVX-512, AVX2 and baseline
// versions and picks one when the program loads (as in kernels_cpu.cpp).
#include "dtype.h"

#include <bit>

#include "simd.h"

namespace zf {

ZF_VECTOR_CLONES
void bf16_to_float(const bf16* __restrict in, float* __restrict out, size_t n) {
  // The same bits, shifted back into the top half of a float32.
  for (size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(uint32_t(in[i].bits) << 16);
}

ZF_VECTOR_CLONES
void float_to_bf16(const float* __restrict in, bf16* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = std::bit_cast<uint32_t>(in[i]);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // nearest, ties to even
    const uint32_t quiet_nan = (x >> 16) | 0x40u;  // a NaN must not round to infinity
    out[i].bits = uint16_t((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

}  // namespace zf
