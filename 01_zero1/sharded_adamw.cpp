// sharded_adamw.cpp: AdamW on one rank's shard, and gathering a full model back.
#include "sharded_adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gradnorm.h"
#include "host_collectives.h"

namespace zf {

ShardedAdamW::ShardedAdamW(const ModelLayout& layout, const ShardLayout& shards, Precision precision,
                           MemoryTracker& mem, Device& dev)
    : ShardedAdamW(layout, shards, precision,
                   Tensor(mem, Place::device, Category::optimizer, DType::f32, shards.shard_total),
                   Tensor(mem, Place::device, Category::optimizer, DType::f32, shards.shard_total),
                   precision == Precision::bf16
                       ? Tensor(mem, Place::device, Category::optimizer, DType::f32, shards.shard_total)
                       : Tensor(),
                   dev, dev) {}

ShardedAdamW::ShardedAdamW(const ModelLayout& layout, const ShardLayout& shards, Precision precision, Tensor m,
                           Tensor v, Tensor master, Device& dev, Device& comm_dev)
    : layout_(layout), shards_(shards), precision_(precision), dev_(dev), comm_dev_(comm_dev),
      m_(std::move(m)), v_(std::move(v)), master_(std::move(master)) {}

void ShardedAdamW::load(const InitialState& init) {
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    const UnitShard& us = shards_.units[u];
    if (precision_ == Precision::bf16)
      init.load(int(u), StateKind::params, us.begin, us.end, dev_, master_.as<float>() + us.shard_offset, DType::f32);
    if (init.has_moments())
      for (StateKind kind : {StateKind::m, StateKind::v})
        init.load(int(u), kind, us.begin, us.end, dev_, (kind == StateKind::m ? m_ : v_).as<float>() + us.shard_offset,
                  DType::f32);
  }
}

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

GradClip ShardedAdamW::clip_scale(Communicator& comm, const std::function<const void*(int)>& grad_piece,
                                  float clip) const {
  return zf::clip_scale(shards_, dev_, comm_dev_, comm, grad_piece, storage_dtype(precision_), clip);
}

void ShardedAdamW::update(int u, const void* grad_piece, void* param_piece, const AdamWConfig& adam, long step,
                          float scale, bf16* rounded) {
  const UnitShard& us = shards_.units[u];
  float* m = m_.as<float>() + us.shard_offset;
  float* v = v_.as<float>() + us.shard_offset;
  float* w = precision_ == Precision::bf16 ? master_.as<float>() + us.shard_offset
                                           : static_cast<float*>(param_piece);
  // One call per parameter tensor overlapping the piece: decay or not.
  for (const auto& p : layout_.units[u].params) {
    size_t lo = std::max(us.begin, p.offset), hi = std::min(us.end, p.offset + p.numel);
    if (lo >= hi) continue;
    size_t i = lo - us.begin;  // index within the piece
    const DType gdt = storage_dtype(precision_);
    dev_.adamw_copy(w + i, static_cast<const char*>(grad_piece) + i * dtype_size(gdt), gdt, m + i, v + i,
                    rounded ? rounded + i : nullptr, DType::bf16, hi - lo, adam, step, scale, p.decay);
  }
  if (precision_ == Precision::bf16) dev_.narrow(w, static_cast<bf16*>(param_piece), us.end - us.begin);
}

const float* ShardedAdamW::fp32_piece(int u, const void* param_piece) const {
  if (precision_ == Precision::bf16) return master_.as<float>() + shards_.units[u].shard_offset;
  return static_cast<const float*>(param_piece);
}

std::vector<float> gather_full_model(Communicator& comm, Device& dev, const ModelLayout& layout,
                                     const ShardLayout& shards,
                                     const std::function<const float*(int)>& fp32_piece, Device* piece_dev,
                                     bool every_rank) {
  const bool keep = every_rank || comm.rank() == 0;
  std::vector<float> full(keep ? layout.numel : 0);
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitShard& us = shards.units[u];
    // Host buffers: the threads and MPI communicators move host memory here
    // (at the end of a run, outside the tracked device memory).
    std::vector<float> piece(us.shard, 0.0f), gathered(us.padded());
    (piece_dev ? *piece_dev : dev).to_host(piece.data(), fp32_piece(int(u)), (us.end - us.begin) * sizeof(float));
    all_gather_host(comm, dev, piece.data(), gathered.data(), us.shard, DType::f32);
    if (keep) std::memcpy(full.data() + layout.units[u].offset, gathered.data(), us.numel * sizeof(float));
  }
  return full;
}

const float* ShardedAdamW::state_piece(StateKind kind, int u, const void* param_piece) const {
  if (kind == StateKind::params) return fp32_piece(u, param_piece);
  return (kind == StateKind::m ? m_ : v_).as<float>() + shards_.units[u].shard_offset;
}

std::vector<float> ShardedAdamW::gather(StateKind kind, Communicator& comm,
                                        const std::function<const void*(int)>& param_piece, bool every_rank) const {
  return gather_full_model(comm, comm_dev_, layout_, shards_, [&](int u) {
    return state_piece(kind, u, param_piece(u));
  }, &dev_, every_rank);
}

void ShardedAdamW::copy_piece(StateKind kind, int u, const void* param_piece, float* host) const {
  const UnitShard& us = shards_.units[u];
  dev_.to_host(host, state_piece(kind, u, param_piece), (us.end - us.begin) * sizeof(float));
}

}  // namespace zf
