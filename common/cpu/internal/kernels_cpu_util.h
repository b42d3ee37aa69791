// kernels_cpu_util.h: the helpers every CPU kernel inlines (private to
// kernels_cpu*.cpp): row sums and maxima in 16 vector lanes, a branch-free
// select, and a vectorisable exp. Inlined into each kernel, and so into each
// of its ZF_VECTOR_CLONES (simd.h).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

#include "simd.h"

#define ZF_INLINE inline __attribute__((always_inline))

namespace zf {
namespace {


// Row sums and maxima in this many partial lanes, combined pairwise at the end.
constexpr int kLanes = 16;

// sum over j in [0, n) of term(j).
template <class Term>
ZF_INLINE float lane_sum(int n, Term term) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += term(j + k);
  for (int k = 0; j < n; ++j, ++k) acc[k] += term(j);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// n rounded up to a whole number of lanes, at most limit.
ZF_INLINE int lanes_up(int n, int limit) {
  return std::min(limit, (n + kLanes - 1) / kLanes * kLanes);
}

// max over j in [0, n) of x[j], n >= 1.
ZF_INLINE float lane_max(const float* __restrict x, int n) {
  float acc[kLanes];
  for (int k = 0; k < kLanes; ++k) acc[k] = x[0];
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] = x[j + k] > acc[k] ? x[j + k] : acc[k];
  for (int k = 0; j < n; ++j, ++k) acc[k] = x[j] > acc[k] ? x[j] : acc[k];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] = acc[k + w] > acc[k] ? acc[k + w] : acc[k];
  return acc[0];
}

// c ? a : b without a branch. A plain ?: on floats ahead of arithmetic keeps
// GCC from vectorising the loop: it copies the arithmetic into both arms, and
// under IEEE exception rules (-ftrapping-math, the default) it may then not
// run both arms for every lane. Bit logic has no such rule.
ZF_INLINE float select(bool c, float a, float b) {
  const uint32_t m = -uint32_t(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// e^x to about 2 ulp (Cephes' expf polynomial), branch-free so that a loop of
// it vectorises: x = n ln2 + r with |r| <= ln2/2, e^r by a polynomial, 2^n
// written straight into the exponent bits. Below -87 it returns 0 (e^x is then
// under 1.7e-38, subnormal at most) and above 88 +inf (e^x over 1.6e38, near
// float's largest): what softmax and sigmoid need at the extremes.
ZF_INLINE float fast_exp(float x) {
  const float xc = select(x < -87.0f, -87.0f, select(x > 88.0f, 88.0f, x));  // keeps 2^n normal
  const float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (xc * 1.44269504088896341f + round_magic) - round_magic;
  float r = xc - n * 0.693359375f;  // ln2 split in two so that n*ln2 stays exact
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float e = p * std::bit_cast<float>(uint32_t(int32_t(n) + 127) << 23);
  return select(x < -87.0f, 0.0f, select(x > 88.0f, std::numeric_limits<float>::infinity(), e));
}

}  // namespace
}  // namespace zf
