// flat_grads.cpp: reduce-scatter in the reduce dtype, accumulate in float32.
#include "flat_grads.h"

#include "check.h"

namespace zf {

FlatReducer::FlatReducer(const ShardLayout& shards, DType grad_dtype, DType reduce_dtype, bool no_sync,
                         MemoryTracker& mem, Device& dev, Communicator& comm, Communicator* replicate)
    : layout_(shards), grad_dtype_(grad_dtype), reduce_dtype_(reduce_dtype), no_sync_(no_sync), mem_(mem), dev_(dev),
      comm_(comm), replicate_(replicate) {
  if (no_sync_)
    for (const auto& us : shards.units) kept_.emplace_back(mem, Place::device, Category::grads, grad_dtype_, us.padded());
}

void* FlatReducer::my_piece_in(void* full, DType dt, int g) const {
  return static_cast<char*>(full) + size_t(layout_.rank) * layout_.units[g].shard * dtype_size(dt);
}

void* FlatReducer::begin_unit(int g) {
  if (no_sync_) return kept_[g].data();
  REQUIRE(computing_unit_ < 0, "begin_unit(" << g << ") while unit " << computing_unit_ << " is not reduced");
  computing_ = Tensor(mem_, Place::device, Category::comm, grad_dtype_, layout_.units[g].padded());  // zeroed
  computing_unit_ = g;
  return computing_.data();
}

void FlatReducer::reduce_unit(int g, bool sync) {
  Reduced f{g, {}, {}, nullptr, {}, nullptr, {}};
  if (no_sync_) {
    if (!sync) return;  // keep adding into it
    f.reduced = kept_[g].data();
  } else {
    REQUIRE(computing_unit_ == g, "reduce_unit(" << g << ") but the unit computed is " << computing_unit_);
    f.owned = std::move(computing_);
    f.reduced = f.owned.data();
    computing_unit_ = -1;
  }
  const UnitShard& us = layout_.units[g];
  if (reduce_dtype_ != grad_dtype_) {  // bf16 gradients reduced in float32
    f.widened = Tensor(mem_, Place::device, Category::comm, DType::f32, us.padded());
    dev_.widen(static_cast<const bf16*>(f.reduced), f.widened.as<float>(), us.padded());
    f.owned = Tensor();  // the bf16 buffer is read: free it before the next unit's is made
    f.reduced = f.widened.data();
  }
  f.handle = comm_.reduce_scatter_async(f.reduced, my_piece_in(f.reduced, reduce_dtype_, g), us.shard,
                                        reduce_dtype_, ReduceOp::sum);
  ++reduce_scatters_;
  inflight_.push_back(std::move(f));
}

std::optional<FlatReducer::Reduced> FlatReducer::complete(size_t in_flight) {
  // Each collective is waited for, and issued, while its buffer is held in
  // a queue here: a wait that throws leaves the buffer to the destructor,
  // after the group is aborted, never to a collective.
  while (inflight_.size() > in_flight) {
    inflight_.front().handle.wait();
    Reduced f = std::move(inflight_.front());
    inflight_.pop_front();
    f.mine = my_piece_in(f.reduced, reduce_dtype_, f.unit);
    if (!replicate_) return f;
    // Hybrid sharding: my piece is summed over my group; sum it across the
    // groups from a copy, so that the buffer it was reduced in goes now
    // (a --no-sync buffer stays: it is the kept gradient).
    const size_t n = layout_.units[f.unit].shard;
    f.piece = Tensor(mem_, Place::device, Category::comm, reduce_dtype_, n);
    dev_.copy(f.piece.data(), f.mine, n * dtype_size(reduce_dtype_));
    f.owned = Tensor(), f.widened = Tensor();
    f.reduced = nullptr;
    f.mine = f.piece.data();
    Reduced& crossing = crossing_.emplace_back(std::move(f));
    crossing.handle = replicate_->all_reduce_async(crossing.mine, n, reduce_dtype_, ReduceOp::sum);
  }
  if (crossing_.size() <= in_flight) return std::nullopt;
  crossing_.front().handle.wait();
  Reduced f = std::move(crossing_.front());
  crossing_.pop_front();
  return f;
}

void FlatReducer::zero_kept(int g) {
  if (no_sync_) dev_.zero(kept_[g].data(), kept_[g].bytes());
}

FlatGrads::FlatGrads(const ShardLayout& shards, DType grad_dtype, DType reduce_dtype, bool no_sync,
                     MemoryTracker& mem, Device& dev, Communicator& comm, Communicator* replicate)
    : layout_(shards), reduce_dtype_(reduce_dtype), mem_(mem), dev_(dev),
      reducer_(shards, grad_dtype, reduce_dtype, no_sync, mem, dev, comm, replicate),
      shard_(mem, Place::device, Category::grads, DType::f32, shards.shard_total) {}

float* FlatGrads::piece(int g) { return shard_.as<float>() + layout_.units[g].shard_offset; }

void FlatGrads::reduce_unit(int g, bool sync) {
  reducer_.reduce_unit(g, sync);
  while (auto f = reducer_.complete(1)) add(std::move(*f));
}

void FlatGrads::finish() {
  while (auto f = reducer_.complete(0)) add(std::move(*f));
}

void FlatGrads::add(FlatReducer::Reduced f) {
  const UnitShard& us = layout_.units[f.unit];
  if (reduce_dtype_ == DType::f32) {
    dev_.add(piece(f.unit), f.mine, DType::f32, us.shard);
  } else {  // widening is exact, and x + 0 = x: at K = 1 the shard holds the reduced bf16 values exactly
    Tensor widened(mem_, Place::device, Category::comm, DType::f32, us.shard);
    dev_.widen(static_cast<const bf16*>(f.mine), widened.as<float>(), us.shard);
    dev_.add(piece(f.unit), widened.data(), DType::f32, us.shard);
  }
  reducer_.zero_kept(f.unit);
}  // f goes: the full gradient is freed (a kept one was zeroed): the tracker's comm bytes drop here

void FlatGrads::zero() { dev_.zero(shard_.data(), shard_.bytes()); }

}  // namespace zf
