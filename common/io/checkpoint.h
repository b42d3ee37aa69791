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
// names README.md documents: "optim.m.<name>" and "optim.v.<name>" (the two
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

#include "adamw.h"
#include "model.h"
#include "safetensors.h"

namespace zf {

// flat: the model's P float32 parameters in consolidated order.
void save_model(const std::string& path, const ModelLayout& layout, const float* flat,
                const std::map<std::string, std::string>& metadata = {});
void load_model(const std::string& path, const ModelLayout& layout, float* flat);
// load_model's checks alone (names, shapes, metadata numbers, values,
// checksums), reading no values into memory: the frame runs them before the
// ranks allocate a model (runner.cpp). Each file's values are read once per
void check_model_file(const std::string& path, const ModelLayout& layout);

// While one lives, the readers above skip the value and checksum checks of
// the file at `path` as it was when it was made (same inode, size and
// modification time): the frame checks a run's --init or --resume once,
// then its ranks, which read the same file, do not read it whole again.
class CheckedOnce {
 public:
  explicit CheckedOnce(const std::string& path);  // after the file was checked
  ~CheckedOnce();
  CheckedOnce(const CheckedOnce&) = delete;
  CheckedOnce& operator=(const CheckedOnce&) = delete;

 private:
  std::unique_ptr<std::tuple<dev_t, ino_t, off_t, long long>> id_;
};

// params, m, v: the whole model's values of each kind in consolidated order;
// step: optimizer steps taken. Written atomically (safetensors.h).
void save_checkpoint(const std::string& path, const ModelLayout& layout, const float* params, const float* m,
                     const float* v, long step, const std::map<std::string, std::string>& metadata = {});

// Reads a training checkpoint back, whole or a piece at a time (a sharded
// stage reads only its pieces). The constructor checks every name and shape
// against the model and that the optimizer state is there, with a message
// that says what is wrong and what to do.
class CheckpointReader {
 public:
  CheckpointReader(const std::string& path, const ModelLayout& layout);
  long step() const { return step_; }
  const std::map<std::string, std::string>& metadata() const { return reader_.metadata(); }
  // Elements [begin, end) of unit u's flat values of `kind` (its parameters
  // in order, as in the unit's flat buffer), as float32, into dst.
  void read_unit(int u, StateKind kind, size_t begin, size_t end, float* dst) const;
  // The whole model's values of `kind` in consolidated order (layout.numel floats).
  void read_all(StateKind kind, float* flat) const;

 private:
  const ModelLayout& layout_;
  SafetensorsReader reader_;
  long step_ = 0;
};

}  // namespace zf
