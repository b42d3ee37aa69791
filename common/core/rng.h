// rng.h: Philox4x32-10, a counter-based random generator, for initialisation.
//
// A counter-based generator computes the n-th random number directly from
// (key, n), with no state carried from one draw to the next. That is what
// makes the initial model the same for any number of ranks and any stage:
// element i of parameter "h.3.mlp.c_fc.weight" is always drawn from
// key = (seed, hash of the name), counter = i, whoever draws it and in
// whatever order. (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11.)
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace zf {

inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(M0) * ctr[0];
    uint64_t p1 = uint64_t(M1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1],
           uint32_t(p0)};
    key[0] += W0;
    key[1] += W1;
  }
  return ctr;
}

// FNV-1a, 64-bit: names and parameter bytes to a stable hash (and a
// checkpoint's per-tensor checksums, safetensors.h). A hash of bytes in
// pieces continues from the previous piece's h, starting at the basis.
inline constexpr uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnv1aBasis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// A standard normal value for (seed, stream, index): Box-Muller on two
// 32-bit draws of Philox at counter `index`, computed in double.
inline double philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  std::array<uint32_t, 4> ctr = {uint32_t(index), uint32_t(index >> 32), uint32_t(stream),
                                 uint32_t(stream >> 32)};
  std::array<uint32_t, 2> key = {uint32_t(seed), uint32_t(seed >> 32)};
  auto r = philox4x32(ctr, key);
  // u1 in (0, 1] so the log is finite; u2 in [0, 1).
  double u1 = (double(r[0]) + 1.0) / 4294967296.0;
  double u2 = double(r[1]) / 4294967296.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace zf
