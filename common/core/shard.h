// shard.h: how the ZeRO stages cut the model among N ranks.
//
// Every stage from ZeRO-1 on shards the model the same way, unit by unit:
// unit u's flat buffer (n_u elements) is padded to a multiple of N,
// N * S_u with S_u = ceil(n_u / N), and rank r owns elements
// [r * S_u, (r + 1) * S_u) of it. A rank's shard of the model is the
// concatenation of its pieces of every unit (shard_total elements). The
// padding (at most N - 1 elements per unit, all in the last ranks' pieces)
// is zero, never updated, and never part of the model.
//
// Why per unit and not one cut of the whole flat range: ZeRO-2 reduce-
// scatters each unit's gradient as soon as its backward is done, and ZeRO-3
// all-gathers each unit's parameters before using them; both need every
// unit split evenly among the ranks. Using the same cut in ZeRO-1 keeps the
// three stages' optimizer states identical, so each stage reuses the last.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "model.h"

namespace zf {

struct UnitShard {
  size_t numel = 0;          // n_u, unpadded
  size_t shard = 0;          // S_u = ceil(n_u / N)
  size_t padded_offset = 0;  // where the unit starts in the padded full layout (sum of N * S_v, v < u)
  size_t shard_offset = 0;   // where this rank's piece starts in its shard (sum of S_v, v < u)
  size_t padded() const { return shard * nranks; }
  int nranks = 1;
  // This rank's piece of the unit, in the unit's own element numbering:
  // [begin, end) with end clipped to n_u (the rest of the piece is padding).
  size_t begin = 0, end = 0;
};

struct ShardLayout {
  int nranks = 1, rank = 0;
  std::vector<UnitShard> units;
  size_t padded_total = 0;  // sum of N * S_u: a full model in the padded layout
  size_t shard_total = 0;   // sum of S_u: one rank's shard
};

ShardLayout make_shard_layout(const ModelLayout& layout, int nranks, int rank);

// Calls fn(i, n, decay) for every span of my shard that falls in shard
// elements [lo, hi) and lies in one parameter: i is a shard index, the span
// one ParamSpec's part (padding skipped), decay that parameter's AdamW mask.
// What an optimizer over a whole shard calls AdamW on, one span at a time.
template <class Fn>
void for_each_span(const ModelLayout& layout, const ShardLayout& shards, size_t lo, size_t hi, Fn&& fn) {
  for (size_t u = 0; u < shards.units.size(); ++u) {
    const UnitShard& us = shards.units[u];
    const size_t a = std::max(lo, us.shard_offset), z = std::min(hi, us.shard_offset + us.shard);
    if (a >= z) continue;
    // [a, z) in the unit's own numbering, clipped to its real elements.
    const size_t from = us.begin + (a - us.shard_offset), to = std::min(us.end, us.begin + (z - us.shard_offset));
    for (const auto& p : layout.units[u].params) {
      const size_t b = std::max(from, p.offset), e = std::min(to, p.offset + p.numel);
      if (b < e) fn(us.shard_offset + (b - us.begin), e - b, p.decay);
    }
  }
}

}  // namespace zf
