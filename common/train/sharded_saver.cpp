// sharded_saver.cpp: a sharded save, at once or in the background (sharded_saver.h).
#include "sharded_saver.h"

#include <cstdio>
#include <cstring>

#include "check.h"
#include "host_collectives.h"
#include "sharded_checkpoint.h"
#include "training.h"
#include "training_run.h"

namespace zf {

ShardedSaver::ShardedSaver(const std::string& dir, bool async, const ModelLayout& layout, RankContext& ctx,
                           ModelStates& states, StepLog& log)
    : dir_(dir), async_(async), layout_(layout), ctx_(ctx), states_(states), log_(log) {}

ShardedSaver::~ShardedSaver() { join(); }

void ShardedSaver::join() {
  if (writer_.joinable()) writer_.join();
}

void ShardedSaver::save(int steps_done, const std::map<std::string, std::string>& metadata) {
  finish();  // one save in flight at a time: the previous is committed first
  Timer timer;
  const std::string folder = dir_ + "/" + step_folder_name(steps_done);
  // One id for this save's files, rank 0's, given to every rank with the barrier
  // that says the folder is there.
  int64_t id = 0;
  if (ctx_.rank == 0) {
    prepare_step_folder(dir_, steps_done);
    id = int64_t(std::stoull(new_save_id(), nullptr, 16));
  }
  all_reduce_host(ctx_.comm, ctx_.dev, &id, 1, DType::i64, ReduceOp::sum);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)id);
  save_id_ = hex;
  pending_ = steps_done;
  metadata_ = metadata;
  failure_ = nullptr;
  const ShardLayout* share = states_.share();
  if (!async_) {
    if (share) write_checkpoint_shard(folder, layout_, *share, [&](StateKind kind, int u, float* host) {
      states_.copy_piece(kind, u, host);
    }, steps_done, save_id_);
    stall_ms_ = write_ms_ = timer.ms();
    done_ = true;
    finish();
    return;
  }
  // The copies, kind by kind and unit by unit: the only time the steps
  // wait. The buffers stay for the next save (torchtitan keeps its pinned
  // ones too): only the first save pays for their pages.
  if (share) {
    staged_.resize(3 * layout_.units.size());  // by kind (params, m, v), then unit
    for (StateKind kind : kStateKinds)
      for (size_t u = 0; u < layout_.units.size(); ++u) {
        std::vector<float>& piece = staged_[size_t(kind) * layout_.units.size() + u];
        piece.resize(share->units[u].end - share->units[u].begin);
        states_.copy_piece(kind, int(u), piece.data());
      }
  }
  stall_ms_ = timer.ms();
  done_ = false;
  writer_ = std::thread([this, folder, share, steps_done] {
    Timer writing;
    try {
      if (share) write_checkpoint_shard(folder, layout_, *share, [&](StateKind kind, int u, float* host) {
        const std::vector<float>& piece = staged_[size_t(kind) * layout_.units.size() + size_t(u)];
        std::memcpy(host, piece.data(), piece.size() * sizeof(float));
      }, steps_done, save_id_);
    } catch (...) {
      failure_ = std::current_exception();
    }
    write_ms_ = writing.ms();
    done_ = true;
  });
}

bool ShardedSaver::written() {
  if (pending_ < 0) return true;
  if (!done_) return false;
  join();
  if (failure_) std::rethrow_exception(failure_);
  return true;
}

void ShardedSaver::commit() {
  if (pending_ < 0) return;
  join();
  commit_now();
}

void ShardedSaver::finish() {
  if (pending_ < 0) return;
  join();
  if (failure_) std::rethrow_exception(failure_);
  ctx_.comm.barrier();  // every rank's file is on disk
  commit_now();
}

void ShardedSaver::commit_now() {
  if (ctx_.rank == 0) {
    const ShardLayout* share = states_.share();
    REQUIRE(share, "rank 0 writes a sharded checkpoint's first file");
    commit_sharded_checkpoint(dir_, pending_, share->nranks, layout_, metadata_, save_id_);
    if (committed_ >= 0 && committed_ != pending_) remove_step_folder(dir_, committed_);
    log_.saved(pending_, dir_ + "/" + step_folder_name(pending_), stall_ms_, write_ms_);
  }
  committed_ = pending_;
  pending_ = -1;
}

}  // namespace zf
