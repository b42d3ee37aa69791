// sharded_adamw.cpp: AdamW on one rank's shard, and gathering a full model back.
#include "sharded_adamw.h"

#include <algorithm>

namespace zf {

ShardedAdamW::ShardedAdamW(const ModelLayout& layout, const ShardLayout& shards, Precision precision,
                           MemoryTracker& mem, Device& dev)
    : layout_(layout), shards_(shards), precision_(precision), dev_(dev),
      m_(mem, Place::device, Category::optimizer, DType::f32, shards.shard_total),
      v_(mem, Place::device, Category::optimizer, DType::f32, shards.shard_total),
      master_(precision == Precision::bf16
                  ? Tensor(mem, Place::device, Category::optimizer, DType::f32, shards.shard_total)
                  : Tensor()) {}

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

GradClip ShardedAdamW::clip_scale(Communicator& comm, const std::function<const void*(int)>& grad_piece,
                                  float clip) const {
  return zf::clip_scale(shards_, dev_, dev_, comm, grad_piece, storage_dtype(precision_), clip);
}

void ShardedAdamW::update(int u, const void* grad_piece, void* param_piece, const AdamWConfig& adam, long step,
                          float scale) {
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
    dev_.adamw(w + i, static_cast<const char*>(grad_piece) + i * dtype_size(gdt), gdt, m + i, v + i, hi - lo, adam,
               step, scale, p.decay);
  }
  if (precision_ == Precision::bf16) dev_.narrow(w, static_cast<bf16*>(param_piece), us.end - us.begin);
}

const float* ShardedAdamW::state_piece(StateKind kind, int u, const void* param_piece) const {
  const size_t at = shards_.units[u].shard_offset;
  if (kind != StateKind::params) return (kind == StateKind::m ? m_ : v_).as<float>() + at;
  return precision_ == Precision::bf16 ? master_.as<float>() + at : static_cast<const float*>(param_piece);
}

std::vector<float> ShardedAdamW::gather(StateKind kind, Communicator& comm,
                                        const std::function<const void*(int)>& param_piece, bool every_rank) const {
  return gather_full_model(comm, dev_, layout_, shards_, [&](int u, float* out) {
    copy_piece(kind, u, param_piece(u), out);
  }, every_rank);
}

void ShardedAdamW::copy_piece(StateKind kind, int u, const void* param_piece, float* out) const {
  const UnitShard& us = shards_.units[u];
  dev_.to_host(out, state_piece(kind, u, param_piece), (us.end - us.begin) * sizeof(float));
}

}  // namespace zf
