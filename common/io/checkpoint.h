// checkpoint.h: the model, and a whole training state, as one consolidated
// safetensors file.
//
// Tensor names are docs/SPEC.md's (nanoGPT's): "wte.weight", "h.0.attn.c_attn.weight",
// ..., "lm_head.weight", stored as F32 in consolidated order. `--save-init`
// writes one; `--init` reads one back, refusing a file whose names or shapes
// do not match the model with a message that names the tensor and both shapes.
// Both readers also refuse (UsageError, naming the file and the tensor) a
// value that is not finite, a negative second moment, bytes that do not match
// their recorded checksum (safetensors.h) and metadata numbers out of range,
// before the run takes a step.
//
// A training checkpoint (`--save`, `--resume`) adds AdamW's state under the
// names docs/USAGE.md documents: "optim.m.<name>" and "optim.v.<name>" (the two
// moments, F32, the parameter's shape) and "optim.step" (I64, [1]: the
// optimizer steps taken, so the next step is that number). The model part is
// the float32 values AdamW updates (the master copy in the bf16 recipe), so
// any stage, at any number of ranks, in either recipe, resumes from any
// checkpoint, and `--init` reads one as a model.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "adamw.h"
#include "model.h"
#include "safetensors.h"

namespace zf {

// flat: the model's P float32 parameters in consolidated order.
void save_model(const std::string& path, const ModelLayout& layout, const float* flat,
                const std::map<std::string, std::string>& metadata = {});
void load_model(const std::string& path, const ModelLayout& layout, float* flat);
// load_model's checks alone (names, shapes, metadata numbers, values,
// checksums), reading no values into memory: the harness runs them before the
// ranks allocate a model (runner.cpp). Each file's values are read once per
void check_model_file(const std::string& path, const ModelLayout& layout);

// While one lives, the readers above skip the value and checksum checks of
// the file at `path` as it was when it was made (same inode, size and
// modification time): the harness checks a run's --init or --resume once,
// then its ranks, which read the same file, do not read it whole again.
class CheckedOnce {
 public:
  // After the file was checked; a sharded checkpoint's folder: all its files.
  explicit CheckedOnce(const std::string& path);
  ~CheckedOnce();
  CheckedOnce(const CheckedOnce&) = delete;
  CheckedOnce& operator=(const CheckedOnce&) = delete;
  using FileId = std::tuple<dev_t, ino_t, off_t, long long>;

 private:
  std::vector<FileId> ids_;
};

// params, m, v: the whole model's values of each kind in consolidated order;
// step: optimizer steps taken. Written atomically (safetensors.h).
void save_checkpoint(const std::string& path, const ModelLayout& layout, const float* params, const float* m,
                     const float* v, long step, const std::map<std::string, std::string>& metadata = {});

// A training checkpoint opened for reading, whole or a piece at a time (a
// sharded stage reads only its pieces): one consolidated file
// (CheckpointReader) or a sharded folder (sharded_checkpoint.h). Opening
// checks every name and shape against the model, that the optimizer state
// is there, and every value (as check_model_file does), with a message that
// says what is wrong and what to do.
class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  long step() const { return step_; }
  // The metadata it was written with (SPEC §6), less the checksums.
  virtual const std::map<std::string, std::string>& metadata() const = 0;
  // Elements [begin, end) of unit u's flat values of `kind` (its parameters
  // in order, as in the unit's flat buffer), as float32, into dst.
  void read_unit(int u, StateKind kind, size_t begin, size_t end, float* dst) const;
  // The whole model's values of `kind` in consolidated order (layout.numel floats).
  void read_all(StateKind kind, float* flat) const;

 protected:
  explicit CheckpointSource(const ModelLayout& layout) : layout_(layout) {}
  // Elements [first, first + count) of tensor `name` (of shape `shape`) as float32.
  virtual void read_elements(const std::string& name, const std::vector<int64_t>& shape, size_t first,
                             size_t count, float* dst) const = 0;
  const ModelLayout& layout_;
  long step_ = 0;
};

// The consolidated training checkpoint.
class CheckpointReader final : public CheckpointSource {
 public:
  CheckpointReader(const std::string& path, const ModelLayout& layout);
  const std::map<std::string, std::string>& metadata() const override { return reader_.metadata(); }

 private:
  void read_elements(const std::string& name, const std::vector<int64_t>& shape, size_t first, size_t count,
                     float* dst) const override {
    reader_.read_elements(name, shape, DType::f32, first, count, dst);
  }
  SafetensorsReader reader_;
};

// A file is read as a consolidated checkpoint, a folder as a sharded one.
std::unique_ptr<CheckpointSource> open_checkpoint(const std::string& path, const ModelLayout& layout);

// The name of `kind`'s tensor for parameter `param`: "<param>",
// "optim.m.<param>" or "optim.v.<param>".
std::string state_name(StateKind kind, const std::string& param);

}  // namespace zf
