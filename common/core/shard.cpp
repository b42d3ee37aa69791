// shard.cpp: the per-unit sharding arithmetic of shard.h.
#include "shard.h"

#include <algorithm>

namespace zf {

ShardLayout make_shard_layout(const ModelLayout& layout, int nranks, int rank) {
  ShardLayout s;
  s.nranks = nranks;
  s.rank = rank;
  for (const auto& u : layout.units) {
    UnitShard us;
    us.nranks = nranks;
    us.numel = u.numel;
    us.shard = (u.numel + nranks - 1) / nranks;
    us.padded_offset = s.padded_total;
    us.shard_offset = s.shard_total;
    us.begin = std::min(u.numel, size_t(rank) * us.shard);
    us.end = std::min(u.numel, size_t(rank + 1) * us.shard);
    s.padded_total += us.padded();
    s.shard_total += us.shard;
    s.units.push_back(us);
  }
  return s;
}

}  // namespace zf
