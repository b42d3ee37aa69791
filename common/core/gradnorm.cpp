// gradnorm.cpp: the exact, order-independent sum of squares behind clipping.
#include "gradnorm.h"

#include <cmath>
#include <cstring>

#include "check.h"

namespace zf {

namespace {

// A float32 x is mant * 2^(e - 150), with mant the 24-bit integer mantissa and
// e its biased exponent field (subnormals: e = 1, no hidden bit). Its square
// is mant^2 * 2^(2e - 300), mant^2 < 2^48 exact in a uint64. Squares with the
// same exponent field are summed in a bin first (2^15 of them fit in 63
// bits), then each bin is added into the limbs once: fast and still exact.
constexpr size_t kFlushEvery = size_t(1) << 15;

struct Bins {
  uint64_t sum[256] = {};
  template <class Get>
  void add(size_t n, Get get_bits, SumOfSquares& acc, void (*flush)(SumOfSquares&, Bins&)) {
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits = get_bits(i);
      uint32_t e = (bits >> 23) & 0xffu;
      uint64_t mant = (bits & 0x7fffffu) | (e ? 0x800000u : 0u);
      REQUIRE(e != 0xffu, kNonFiniteGradientMessage);
      sum[e] += mant * mant;
      if ((i + 1) % kFlushEvery == 0) flush(acc, *this);
    }
    flush(acc, *this);
  }
};

}  // namespace

void SumOfSquares::add_shifted(uint64_t value, int exponent) {
  // Adds value * 2^exponent (value < 2^63) into the limbs.
  int pos = exponent - kLowestExponent;
  REQUIRE(pos >= 0, "square below the accumulator's range");
  int limb = pos / 32, shift = pos % 32;
  unsigned __int128 v = static_cast<unsigned __int128>(value) << shift;  // < 2^95: three limbs
  limbs_[limb] += int64_t(uint64_t(v) & 0xffffffffu);
  limbs_[limb + 1] += int64_t(uint64_t(v >> 32) & 0xffffffffu);
  limbs_[limb + 2] += int64_t(uint64_t(v >> 64));
}

static void flush_bins(SumOfSquares& acc, Bins& bins) { acc.flush(bins.sum); }

// The power of two that bin e's mant^2 are multiplied by: 2^(2e - 300)
// (subnormals, e = 0, have the exponent of e = 1).
static int bin_exponent(int e) { return 2 * (e == 0 ? 1 : e) - 300; }

void SumOfSquares::flush(uint64_t* bins) {
  for (int e = 0; e < 255; ++e) {
    if (bins[e] == 0) continue;
    add_shifted(bins[e], bin_exponent(e));
    bins[e] = 0;
  }
  normalize();
}

void SumOfSquares::add_bin_halves(const uint64_t* lo, const uint64_t* hi) {
  REQUIRE(lo[255] == 0 && hi[255] == 0, kNonFiniteGradientMessage);
  for (int e = 0; e < 255; ++e) {
    REQUIRE(lo[e] < (uint64_t(1) << 63) && hi[e] < (uint64_t(1) << 63),
            "exponent bin " << e << " half over 2^63 (lo " << lo[e] << ", hi " << hi[e]
                            << "): the caller summed too many squares into one bin");
    // Each add_shifted touches three limbs with less than 2^32 each, so 510
    // of them cannot overflow an int64 limb before normalize().
    if (lo[e]) add_shifted(lo[e], bin_exponent(e));
    if (hi[e]) add_shifted(hi[e], bin_exponent(e) + 32);
  }
  normalize();
}

void SumOfSquares::add(const float* x, size_t n) {
  Bins bins;
  bins.add(n, [x](size_t i) { uint32_t b; std::memcpy(&b, x + i, 4); return b; }, *this, flush_bins);
}

void SumOfSquares::add(const bf16* x, size_t n) {
  Bins bins;
  bins.add(n, [x](size_t i) { return uint32_t(x[i].bits) << 16; }, *this, flush_bins);
}

void SumOfSquares::add(const SumOfSquares& other) {
  for (int i = 0; i < kLimbs; ++i) limbs_[i] += other.limbs_[i];
  normalize();
}

void SumOfSquares::normalize() {
  for (int i = 0; i + 1 < kLimbs; ++i) {
    int64_t carry = limbs_[i] >> 32;  // arithmetic shift: floor division by 2^32
    limbs_[i] -= carry << 32;
    limbs_[i + 1] += carry;
  }
}

double SumOfSquares::value() const {
  // Limbs are normalized, so summing from the top limb down in double gives
  // a result that depends only on the exact total.
  double s = 0.0;
  for (int i = kLimbs - 1; i >= 0; --i)
    s += std::ldexp(double(limbs_[i]), kLowestExponent + 32 * i);
  return s;
}

}  // namespace zf
