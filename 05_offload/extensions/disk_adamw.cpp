// disk_adamw.cpp: the optimizer step as a stream over chunks of the moments.
#include "disk_adamw.h"

#include <algorithm>

#include "shard_pieces.h"

namespace zf::extensions {

DiskAdamW::DiskAdamW(const ModelLayout& flat, const ShardLayout& shards, const std::string& dir, int rank,
                     MemoryTracker& mem, Device& host, bool master_on_disk, size_t chunk_elems, HostClock* clock)
    : flat_(flat), shards_(shards), host_(host), master_on_disk_(master_on_disk),
      tier_(dir, rank, master_on_disk ? std::vector<std::string>{"m", "v", "master"} : std::vector<std::string>{"m", "v"},
            shards.shard_total, chunk_elems, mem, clock) {}

void DiskAdamW::load(const InitialState& init, bf16* copy) {
  for (size_t u = 0; u < shards_.units.size(); ++u) {
    const UnitShard& us = shards_.units[u];
    std::vector<float> piece(us.end - us.begin);
    if (master_on_disk_) {
      init.read(int(u), StateKind::params, us.begin, us.end, piece.data());
      tier_.write(2, us.shard_offset, piece.size(), piece.data());
      host_.narrow(piece.data(), copy + us.shard_offset, piece.size());
    }
    if (init.has_moments())
      for (int k = 0; k < 2; ++k) {
        init.read(int(u), k == 0 ? StateKind::m : StateKind::v, us.begin, us.end, piece.data());
        tier_.write(k, us.shard_offset, piece.size(), piece.data());
      }
  }
}

void DiskAdamW::update(float* master, const float* grads, bf16* copy, const AdamWConfig& adam, long step,
                       float scale) {
  tier_.for_each_chunk([&](size_t begin, size_t n, float* const* a) {
    for_each_span(flat_, shards_, begin, begin + n, [&](size_t i, size_t len, bool decay) {
      float* p = master_on_disk_ ? a[2] + (i - begin) : master + i;
      host_.adamw_copy(p, grads + i, DType::f32, a[0] + (i - begin), a[1] + (i - begin), copy ? copy + i : nullptr,
                       DType::bf16, len, adam, step, scale, decay);
    });
  });
}

std::vector<float> DiskAdamW::gather(StateKind kind, Communicator& comm, Device& comm_dev, bool every_rank) {
  return gather_full_model(comm, comm_dev, flat_, shards_, [&](int u, float* host) { copy_piece(kind, u, host); },
                           every_rank);
}

void DiskAdamW::copy_piece(StateKind kind, int u, float* host) {
  const UnitShard& us = shards_.units[u];
  REQUIRE(kind != StateKind::params || master_on_disk_, "the parameters are not on disk");
  tier_.read(kind == StateKind::m ? 0 : kind == StateKind::v ? 1 : 2, us.shard_offset, us.end - us.begin, host);
}

}  // namespace zf::extensions
