// sharded_adamw.cpp: AdamW on one rank's shard, and gathering a full model back.
#include "sharded_adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gradnorm.h"
#include "host_collectives.h"

namespace zf {

ShardedAdamW::ShardedAdamW(const ModelLayout& layout, const ShardLayout& shards, Precision precision,
                           MemoryTracker& mem, Device& dev, float lr)
    : layout_(layout), shards_(shards), precision_(precision), dev_(dev) {
  adam_.lr = lr;
  const size_t S = shards.shard_total;
  if (precision == Precision::bf16) master_ = Tensor(mem, Place::device, Category::optimizer, DType::f32, S);
  m_ = Tensor(mem, Place::device, Category::optimizer, DType::f32, S);
  v_ = Tensor(mem, Place::device, Category::optimizer, DType::f32, S);
}

void ShardedAdamW::init_master(const std::function<const float*(int)>& piece) {
  if (precision_ != Precision::bf16) return;
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    const UnitShard& us = shards_.units[u];
    dev_.to_device(master_.as<float>() + us.shard_offset, piece(int(u)), (us.end - us.begin) * sizeof(float));
  }
}

GradClip ShardedAdamW::clip_scale(Communicator& comm, const std::function<const void*(int)>& grad_piece,
                                  float clip) const {
  SumOfSquares sq;
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    const size_t n = shards_.units[u].end - shards_.units[u].begin;  // padding is zero anyway
    dev_.sum_squares(grad_piece(int(u)), compute_dtype(precision_), n, sq);
  }
  all_reduce(sq, comm, dev_);
  return grad_clip(std::sqrt(sq.value()), clip);
}

void ShardedAdamW::update(int u, const void* grad_piece, void* param_piece, long step, float scale) {
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
    const DType gdt = compute_dtype(precision_);
    dev_.adamw(w + i, static_cast<const char*>(grad_piece) + i * dtype_size(gdt), gdt, m + i, v + i, hi - lo, adam_,
               step, scale, p.decay);
  }
  if (precision_ == Precision::bf16) dev_.narrow(w, static_cast<bf16*>(param_piece), us.end - us.begin);
}

const float* ShardedAdamW::fp32_piece(int u, const void* param_piece) const {
  if (precision_ == Precision::bf16) return master_.as<float>() + shards_.units[u].shard_offset;
  return static_cast<const float*>(param_piece);
}

void ShardedAdamW::load_moments(const CheckpointReader& checkpoint) {
  std::vector<float> piece;
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    const UnitShard& us = shards_.units[u];
    piece.resize(us.end - us.begin);
    for (StateKind kind : {StateKind::m, StateKind::v}) {
      checkpoint.read_unit(int(u), kind, us.begin, us.end, piece.data());
      float* dst = (kind == StateKind::m ? m_ : v_).as<float>() + us.shard_offset;
      dev_.to_device(dst, piece.data(), piece.size() * sizeof(float));
    }
  }
}

const float* ShardedAdamW::moment_piece(StateKind kind, int u) const {
  REQUIRE(kind == StateKind::m || kind == StateKind::v, "moment_piece: m or v");
  return (kind == StateKind::m ? m_ : v_).as<float>() + shards_.units[u].shard_offset;
}

std::vector<float> gather_full_model(Communicator& comm, Device& dev, const ModelLayout& layout,
                                     const ShardLayout& shards,
                                     const std::function<const float*(int)>& fp32_piece) {
  std::vector<float> full(layout.numel);
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitShard& us = shards.units[u];
    // Host buffers: the threads and MPI communicators move host memory here
    // (at the end of a run, outside the tracked device memory).
    std::vector<float> piece(us.shard, 0.0f), gathered(us.padded());
    dev.to_host(piece.data(), fp32_piece(int(u)), (us.end - us.begin) * sizeof(float));
    all_gather_host(comm, dev, piece.data(), gathered.data(), us.shard, DType::f32);
    std::memcpy(full.data() + layout.units[u].offset, gathered.data(), us.numel * sizeof(float));
  }
  return full;
}

std::vector<float> gather_full_state(Communicator& comm, Device& dev, const ModelLayout& layout,
                                     const ShardLayout& shards, const ShardedAdamW& opt, StateKind kind,
                                     const std::function<const void*(int)>& param_piece) {
  return gather_full_model(comm, dev, layout, shards, [&](int u) {
    return kind == StateKind::params ? opt.fp32_piece(u, param_piece(u)) : opt.moment_piece(kind, u);
  });
}

}  // namespace zf
