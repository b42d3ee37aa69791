// sharded_checkpoint.h: a training checkpoint that no rank gathers. Each
// rank writes only the pieces of the model states it holds, in parallel
// with the others, and one index says which file holds which elements of
// every tensor (docs/SPEC.md §6):
//
//   DIR/                                    --save DIR --save-format sharded
//     step-00000100/                        the states after 100 steps
//       rank-00000-of-00004.safetensors     what writer 0 holds: the overlap of
//       ...                                 each of its pieces with each parameter,
//                                           a 1-D F32 tensor under the consolidated
//                                           name, "offset.<name>" its first element
//       index.json                          written last: the commit
//     latest                                "step-00000100", replaced after each commit
//
// A step folder without index.json is a save that did not finish, never a
// checkpoint; `latest` moves only once the new index is on disk, so a run
// killed while it saves leaves the previous checkpoint whole. Reading
// (ShardedCheckpointReader) takes only the byte ranges asked for, so a rank
// of any stage at any N reads its own pieces from whichever files hold them:
// resharding. consolidate_checkpoint and shard_checkpoint convert to and
// from the consolidated file, streaming through a buffer.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "model.h"
#include "safetensors.h"
#include "shard.h"

namespace zf {

// "step-00000100": the folder of the checkpoint taken after `step` steps.
std::string step_folder_name(long step);
// The step of a folder named so ("step-<digits>"), or -1.
long parse_step_folder(const std::string& name);

// Whether `path` names a sharded checkpoint rather than a file: a folder.
bool is_sharded_checkpoint_path(const std::string& path);

// The committed step folder that `path` (DIR, through its `latest`, else
// its newest committed step folder; or a step folder itself) names, and its
// files (every rank's and the index). UsageError, saying why, when it names none.
std::string resolve_sharded_checkpoint(const std::string& path);
std::vector<std::string> sharded_checkpoint_files(const std::string& path);

// The highest step of a committed checkpoint in DIR, or -1 (none, or no DIR).
long last_committed_step(const std::string& dir);
// Why DIR/latest cannot be replaced by a save (it is not the pointer a save
// writes: a link, a folder, another file), or "".
std::string latest_problem(const std::string& dir);

// A folder one run saves into at a time: an exclusive lock on DIR/lock (DIR
// made if missing), held while the object lives. UsageError, naming the
// holder, when another process holds it, or when DIR is itself a step
// folder; `named` is how the message names DIR ("--save DIR"). `checks`
// (what makes DIR unfit, as UsageError) run before anything is made and
// again once the lock is held, before the lock names this process.
class SaveFolderLock {
 public:
  SaveFolderLock(const std::string& dir, const std::string& named, const std::function<void()>& checks);
  ~SaveFolderLock();
  SaveFolderLock(const SaveFolderLock&) = delete;
  SaveFolderLock& operator=(const SaveFolderLock&) = delete;

 private:
  int fd_ = -1;
};

// A fresh id for one save (16 hex digits): written into each of its files
// and its index, and checked on reading, so that a file copied in from
// another save is refused rather than mixed in.
std::string new_save_id();

// Saving, in three moves every rank makes in turn (TrainingRun::save):
//
// 1. rank 0: prepare_step_folder makes DIR (its parent must exist) and
//    DIR/step-S, empties the folder of a save of S that did not finish, and
//    refuses (Error) to touch a committed one, or to follow a link there.
std::string prepare_step_folder(const std::string& dir, long step);
// 2. each of the W writers, w = share.rank, W = share.nranks: its file.
//    copy(kind, u, host) gives the float32 values of `kind` of its piece of
//    unit u, [share.units[u].begin, end). One piece is in memory at a time.
using PieceCopy = std::function<void(StateKind kind, int u, float* host)>;
void write_checkpoint_shard(const std::string& folder, const ModelLayout& layout, const ShardLayout& share,
                            const PieceCopy& copy, long step, const std::string& save_id);
// 3. rank 0, once every file is on disk: the index from the files'
//    headers (the metadata of a consolidated checkpoint), then `latest`.
//    Error, committing nothing, if a file is not this save's.
void commit_sharded_checkpoint(const std::string& dir, long step, int writers, const ModelLayout& layout,
                               const std::map<std::string, std::string>& metadata, const std::string& save_id);

// Removes DIR/step-S (the index first, so that what is left is no
// checkpoint): a run's own earlier checkpoint, once a newer one is committed.
void remove_step_folder(const std::string& dir, long step);

class ShardedCheckpointReader final : public CheckpointSource {
 public:
  // path: DIR or a step folder. Checks as CheckpointReader does (names,
  // shapes, metadata, every value and checksum), plus the index: every
  // tensor's pieces cover it once, and each file holds what the index says.
  ShardedCheckpointReader(const std::string& path, const ModelLayout& layout);
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }
  // Elements [first, first + count) of tensor `name`, in its row-major order.
  void read_tensor(const std::string& name, size_t first, size_t count, float* dst) const {
    read_elements(name, {}, first, count, dst);
  }

 private:
  void open(const ModelLayout& layout);
  struct Piece {
    int file;
    size_t offset, numel;
  };
  void read_elements(const std::string& name, const std::vector<int64_t>& shape, size_t first, size_t count,
                     float* dst) const override;

  std::string folder_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, std::vector<Piece>> pieces_;  // by tensor name, in element order
};

// A sharded checkpoint as the consolidated file --save would have written
// for the same states (the same bytes), or back: the consolidated file cut
// into `writers` files as stage 03 at N = writers would write them. Both
// stream: at most `buffer_floats` floats (or one unit's piece) in memory.
// Return the largest buffer held, in bytes.
size_t consolidate_checkpoint(const std::string& sharded, const std::string& out, size_t buffer_floats);
size_t shard_checkpoint(const std::string& file, const std::string& dir, int writers);

}  // namespace zf
