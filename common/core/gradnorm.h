// gradnorm.h: the global gradient norm, the same bits however it is sharded.
//
// Clipping needs ||g|| over the whole model. Data parallel has every gradient
// on every rank; in the ZeRO stages a rank has the summed gradient of its
// own piece of each unit only (shard.h). A float sum depends on the order of
// its terms, so each sharding would clip by a slightly different norm and
// the stages would drift apart bit by bit. SumOfSquares avoids that: each square of a float32 is
// exact in double (24+24 bits < 53), and it is added into an exact
// fixed-point accumulator (limbs of 32 bits covering every exponent a float32
// square can have). Integer addition is associative, so the total is the same
// whatever the order and however the terms are split among ranks; ranks
// combine their partial sums by an i64 all_reduce of the limbs.
//
// On a GPU the squares are binned on the device (gradnorm_cuda.h) and only
// the 256 bins come to the host, through add_bin_halves: the same bits as add.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "check.h"
#include "dtype.h"

namespace zf {

// What every path (CPU, GPU) says when a gradient holds an inf or a NaN. It
// is raised inside the sum, which does not know the run's flags; the harness
// adds what to try (runner.cpp) as the error leaves the ranks.
inline constexpr const char* kNonFiniteGradientMessage = "gradient is not finite (inf or NaN): training diverged";

class SumOfSquares {
 public:
  // Squares of float32 values span 2^-298 .. 2^256 (a bin of 2^15 of them
  // up to 2^271); 20 limbs of 32 bits from 2^-320 cover that, with room for
  // carries at the top.
  static constexpr int kLimbs = 20;
  static constexpr int kLowestExponent = -320;

  void add(const float* x, size_t n);
  void add(const bf16* x, size_t n);
  void add(const SumOfSquares& other);
  // For a sum over ranks (comm/host_collectives.h): the limbs, normalized so
  // that each is below 2^32 and the sum of any number of them cannot
  // overflow; call normalize() once they are summed.
  std::array<int64_t, kLimbs>& limbs_to_sum() { normalize(); return limbs_; }
  void normalize();  // carry so every limb but the top is in [0, 2^32)
  // The sum, rounded to double. Deterministic: a function of the exact sum only.
  double value() const;

  // Internal: adds 256 exponent bins of squares (see gradnorm.cpp) and clears them.
  void flush(uint64_t* bins);

  // Adds bins of squares computed elsewhere (the GPU, gradnorm_cuda.cu), each
  // bin e given as two halves: bin e = lo[e] + hi[e] * 2^32, where bin e sums
  // mant^2 of the elements whose exponent field is e (gradnorm.cpp). Each half
  // must be below 2^63. Bin 255 (inf and NaN) must be empty: otherwise this
  // raises kNonFiniteGradientMessage, as add does.
  void add_bin_halves(const uint64_t* lo, const uint64_t* hi);

  // The normalized limbs (limb i weighs 2^(kLowestExponent + 32 i)): two
  // accumulators hold the same exact sum iff their limbs are equal.
  const std::array<int64_t, kLimbs>& limbs() const { return limbs_; }

 private:
  void add_shifted(uint64_t value, int exponent);
  std::array<int64_t, kLimbs> limbs_{};
};

}  // namespace zf
