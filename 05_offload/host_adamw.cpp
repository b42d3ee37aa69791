// host_adamw.cpp: AdamW on the host's float32 shard, one parameter span at a time.
#include "host_adamw.h"

#include "shard_pieces.h"

namespace zf {

HostAdamW::HostAdamW(const ModelLayout& flat, const ShardLayout& shards, MemoryTracker& mem, Device& host)
    : flat_(flat), shards_(shards), host_(host),
      m_(mem, Place::host, Category::optimizer, DType::f32, shards.shard_total),
      v_(mem, Place::host, Category::optimizer, DType::f32, shards.shard_total) {}

void HostAdamW::load(const InitialState& init) {
  if (!init.has_moments()) return;
  for (size_t u = 0; u < shards_.units.size(); ++u) {
    const UnitShard& us = shards_.units[u];
    for (StateKind kind : {StateKind::m, StateKind::v})
      init.load(int(u), kind, us.begin, us.end, host_, (kind == StateKind::m ? m_ : v_).as<float>() + us.shard_offset,
                DType::f32);
  }
}

void HostAdamW::update(int g, float* master, const float* grads, bf16* copy, const AdamWConfig& adam, long step,
                       float scale) {
  const UnitShard& us = shards_.units[g];
  float *m = m_.as<float>(), *v = v_.as<float>();
  for_each_span(flat_, shards_, us.shard_offset, us.shard_offset + us.shard, [&](size_t i, size_t n, bool decay) {
    host_.adamw_copy(master + i, grads + i, DType::f32, m + i, v + i, copy ? copy + i : nullptr, DType::bf16, n,
                     adam, step, scale, decay);
  });
}

void HostAdamW::copy_piece(StateKind kind, int g, const float* master, float* host) const {
  const UnitShard& us = shards_.units[g];
  const float* from = kind == StateKind::params ? master : (kind == StateKind::m ? m_ : v_).as<float>();
  host_.to_host(host, from + us.shard_offset, (us.end - us.begin) * sizeof(float));
}

std::vector<float> HostAdamW::gather(StateKind kind, const float* master, Communicator& comm, Device& comm_dev,
                                     bool every_rank) const {
  return gather_full_model(comm, comm_dev, flat_, shards_,
                           [&](int g, float* host) { copy_piece(kind, g, master, host); }, every_rank);
}

}  // namespace zf
