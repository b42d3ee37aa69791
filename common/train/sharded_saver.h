// sharded_saver.h: --save-format sharded from the ranks' side
// (io/sharded_checkpoint.h has the folder and its files). Every rank writes
// its pieces at the same time; rank 0 makes the step folder before and
// commits the index after. With --save-async (torchtitan's
// async_with_pinned_mem), the training stops only while each rank copies
// its pieces into host buffers: a thread writes them while the next steps
// train, and the ranks commit once all say, in the stop vote at the end of
// a step (training_run.h), that their files are on disk. The next save, a
// stop and the end of the run wait for a write in flight and commit it. A
// failed write fails its rank (and so the run); a kill before the commit
// leaves `latest` on the previous checkpoint, whole.
#pragma once

#include <atomic>
#include <exception>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "model.h"
#include "rank.h"
#include "step_log.h"

namespace zf {

class ModelStates;  // training_run.h

class ShardedSaver {
 public:
  ShardedSaver(const std::string& dir, bool async, const ModelLayout& layout, RankContext& ctx, ModelStates& states,
               StepLog& log);
  ~ShardedSaver();  // waits for a write in flight, which is then never committed
  ShardedSaver(const ShardedSaver&) = delete;
  ShardedSaver& operator=(const ShardedSaver&) = delete;

  // The states after `steps_done` steps, written now, or (async) copied and
  // handed to this rank's writer thread. Every rank calls it.
  void save(int steps_done, const std::map<std::string, std::string>& metadata);
  // Whether this rank has no write in flight left to wait for: none, or its
  // file is on disk. Rethrows the writer's failure.
  bool written();
  // Every rank's file is on disk (they voted so): rank 0 commits. Every rank calls it.
  void commit();
  // Waits for this rank's write in flight and commits it with the others
  // (a barrier). Every rank calls it.
  void finish();

 private:
  void commit_now();
  void join();

  const std::string dir_;
  const bool async_;
  const ModelLayout& layout_;
  RankContext& ctx_;
  ModelStates& states_;
  StepLog& log_;
  long committed_ = -1;  // the step of the checkpoint this run last committed (rank 0 removes it at the next)
  // The save in flight: its step and metadata, the copies the thread writes, its outcome.
  int pending_ = -1;
  std::map<std::string, std::string> metadata_;
  std::string save_id_;
  std::vector<std::vector<float>> staged_;  // by kind x unit: this rank's pieces
  std::thread writer_;
  std::exception_ptr failure_;
  std::atomic<bool> done_{false};
  double stall_ms_ = 0, write_ms_ = 0;
};

}  // namespace zf
