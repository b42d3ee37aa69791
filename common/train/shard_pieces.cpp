// shard_pieces.cpp: the norm over a rank's pieces, and the full model gathered from them.
#include "shard_pieces.h"

#include <cmath>
#include <cstring>

#include "gradnorm.h"
#include "host_collectives.h"

namespace zf {

GradClip clip_scale(const ShardLayout& shards, Device& dev, Device& comm_dev, Communicator& comm,
                    const std::function<const void*(int)>& grad_piece, DType dtype, float clip) {
  SumOfSquares sq;
  for (size_t u = 0; u < shards.units.size(); ++u) {
    const size_t n = shards.units[u].end - shards.units[u].begin;  // padding is zero anyway
    dev.sum_squares(grad_piece(int(u)), dtype, n, sq);
  }
  all_reduce(sq, comm, comm_dev);
  return grad_clip(std::sqrt(sq.value()), clip);
}

std::vector<float> gather_full_model(Communicator& comm, Device& dev, const ModelLayout& layout,
                                     const ShardLayout& shards,
                                     const std::function<void(int, float*)>& copy_piece, bool every_rank) {
  const bool keep = every_rank || comm.rank() == 0;
  std::vector<float> full(keep ? layout.numel : 0);
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitShard& us = shards.units[u];
    // Host buffers: the threads and MPI communicators move host memory here
    // (at the end of a run, outside the tracked device memory).
    std::vector<float> piece(us.shard, 0.0f), gathered(us.padded());
    copy_piece(int(u), piece.data());
    all_gather_host(comm, dev, piece.data(), gathered.data(), us.shard, DType::f32);
    if (keep) std::memcpy(full.data() + layout.units[u].offset, gathered.data(), us.numel * sizeof(float));
  }
  return full;
}

}  // namespace zf
