// checkpoint.cpp: consolidated model and training checkpoints on top of safetensors.cpp.
#include "checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <sys/stat.h>
#include <tuple>
#include <vector>

#include "adamw.h"
#include "check.h"
#include "checkpoint_checks.h"
#include "sharded_checkpoint.h"

namespace zf {

std::string state_name(StateKind kind, const std::string& param) {
  switch (kind) {
    case StateKind::m: return "optim.m." + param;
    case StateKind::v: return "optim.v." + param;
    default: return param;
  }
}

namespace {

constexpr const char* kStepName = "optim.step";

// refs += every parameter of the model under its name for `kind`, its
// values at flat (consolidated order).
void add_refs(std::vector<TensorRef>& refs, const ModelLayout& layout, StateKind kind, const float* flat) {
  for (const auto& u : layout.units)
    for (const auto& p : u.params)
      refs.push_back({state_name(kind, p.name), DType::f32, p.shape, flat + u.offset + p.offset});
}

// Checks, before anything is read, that `reader` holds every parameter of
// the model under its name for each of `kinds`, in the parameter's shape, and
// no tensor the model does not have (besides `extra` names, and any optim.*
// name when optim_ok: a model-only reader ignores the optimizer state).
void check_tensors(const SafetensorsReader& reader, const ModelLayout& layout,
                   std::initializer_list<StateKind> kinds, std::set<std::string> extra, bool optim_ok) {
  const std::string& path = reader.path();
  for (const auto& u : layout.units)
    for (const auto& p : u.params)
      for (StateKind kind : kinds) {
        const std::string name = state_name(kind, p.name);
        extra.insert(name);
        USAGE_REQUIRE(reader.has(name), "checkpoint " << path << " has no tensor '" << name << "' that the "
                                                       << layout.cfg.name
                                                       << " model needs: was it saved for another model "
                                                          "(--model) or by another program?");
        USAGE_REQUIRE(reader.info(name).shape == p.shape,
                      "tensor '" << name << "' in " << path << " has shape " << shape_str(reader.info(name).shape)
                                 << " but the " << layout.cfg.name << " model's is " << shape_str(p.shape)
                                 << ": the checkpoint was written for a different model (check --model)");
      }
  for (const auto& t : reader.tensors())
    USAGE_REQUIRE(extra.count(t.name) || (optim_ok && t.name.rfind("optim.", 0) == 0),
                  "checkpoint " << path << " has a tensor '" << t.name << "' " << shape_str(t.shape)
                                << " that the " << layout.cfg.name
                                << " model does not have: was it saved for another model (--model)?");
}

// The metadata numbers a training checkpoint is written with
// (training_run.cpp) and read back to tell the user (initial_state.cpp):
// each, when present, must be a whole decimal number in its range, else
// the file is damaged or was written by another program. Absent keys are
// fine: a file from another program may not have them.
void check_metadata_numbers(const std::string& path, const std::map<std::string, std::string>& meta) {
  struct Range {
    const char* key;
    uint64_t lo, hi;
  };
  static const Range ranges[] = {
      {"ranks", 1, uint64_t(INT32_MAX)},         // threads, or a launcher's processes
      {"global_batch", 1, uint64_t(INT64_MAX)},  // N x B x K sequences
      {"seed", 0, UINT64_MAX},                   // --seed
  };
  for (const Range& r : ranges) {
    auto it = meta.find(r.key);
    if (it == meta.end()) continue;
    const std::string& text = it->second;
    bool ok = !text.empty() && text.size() <= 20 && text.find_first_not_of("0123456789") == std::string::npos;
    uint64_t v = 0;
    for (size_t i = 0; ok && i < text.size(); ++i) {
      const uint64_t d = uint64_t(text[i] - '0');
      ok = v <= (UINT64_MAX - d) / 10;
      v = v * 10 + d;
    }
    USAGE_REQUIRE(ok && v >= r.lo && v <= r.hi,
                  "checkpoint " << path << " has the metadata '" << r.key << "' = '" << text
                                << "', not a whole number from " << r.lo << " to " << r.hi
                                << ": the file is damaged or was not written by --save; save it again");
  }
}

// Reads every tensor of `reader` once (SafetensorsReader::verify): its bytes
// must match their checksum where one is recorded, every float finite, and
// AdamW's second moments (optim.v.*), running means of squares, never
// negative. A NaN in a row no batch touches would otherwise be trained on
// and copied into the next checkpoint; one anywhere else ends the first step
// with a non-finite gradient that says nothing of the file.
using FileId = CheckedOnce::FileId;

// The file at `path` as it is now (device, inode, size, modification time), if it exists.
bool file_id(const std::string& path, FileId* id) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  *id = {st.st_dev, st.st_ino, st.st_size, (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec};
  return true;
}

std::mutex checked_mu;
std::map<FileId, int> checked;  // files whose values a live CheckedOnce vouches for

// AdamW's two moments bound each other. After t steps m = sum_i a_i g_i and
// v = sum_i b_i g_i^2, with a_i = (1 - b1) b1^(t-i) and b_i = (1 - b2)
// b2^(t-i); by Cauchy-Schwarz m^2 <= (sum_i a_i^2 / b_i) v, and that sum is
// below (1 - b1)^2 / ((1 - b2) (1 - b1^2 / b2)) at every t when b1^2 < b2.
// A first moment past the bound (its float roundings allowed for) came from
// no run; one far past it would blow up the first step of the resumed run,
// and the run would end as a divergence that says nothing of the file.
void check_moment_pairs(const SafetensorsReader& reader) {
  const AdamWConfig adam;
  const double b1 = adam.beta1, b2 = adam.beta2, q = b1 * b1 / b2;
  if (q >= 1) return;  // no bound for such betas
  const double ratio = std::sqrt((1 - b1) * (1 - b1) / ((1 - b2) * (1 - q))) * (1 + 1e-3);
  const double slack = 1e-18;  // a second moment whose squares fell below float's range
  constexpr size_t kChunk = size_t(1) << 16;
  std::vector<float> m(kChunk), v(kChunk);
  for (const TensorInfo& t : reader.tensors()) {
    if (t.name.rfind("optim.m.", 0) != 0) continue;
    const std::string v_name = "optim.v." + t.name.substr(8);
    if (!reader.has(v_name) || reader.info(v_name).shape != t.shape) continue;  // the layout check names it
    for (size_t first = 0; first < t.numel(); first += kChunk) {
      const size_t n = std::min(kChunk, t.numel() - first);
      reader.read_elements(t.name, t.shape, DType::f32, first, n, m.data());
      reader.read_elements(v_name, t.shape, DType::f32, first, n, v.data());
      for (size_t i = 0; i < n; ++i) {
        if (std::fabs(double(m[i])) <= ratio * std::sqrt(double(v[i])) + slack) continue;
        std::ostringstream msg;
        msg << "checkpoint " << reader.path() << ": tensor '" << t.name << "' holds " << m[i] << " at element "
            << first + i << " where '" << v_name << "' holds " << v[i] << ": AdamW's first moment is at most "
            << ratio << " times the square root of its second (a mean of the gradients against a mean of their "
            << "squares, with its betas " << b1 << " and " << b2 << "), so the file is damaged or was written by an "
            << "optimizer with other betas; resume from an earlier checkpoint, or start from a good model file "
            << "with --init";
        throw UsageError(msg.str());
      }
    }
  }
}

// Returns whether any of AdamW's moments is non-zero (false when a live
// CheckedOnce vouches for the file: it was checked whole already).
bool check_values(const SafetensorsReader& reader) {
  FileId id;
  if (file_id(reader.path(), &id)) {
    std::lock_guard<std::mutex> lock(checked_mu);
    if (checked.count(id)) return false;
  }
  bool moments = false;
  reader.verify([&](const TensorInfo& t, size_t first, const float* x, size_t n) -> std::string {
    const bool second_moment = t.name.rfind("optim.v.", 0) == 0;
    if (t.name.rfind("optim.", 0) == 0)
      for (size_t i = 0; i < n && !moments; ++i) moments = x[i] != 0.0f;
    for (size_t i = 0; i < n; ++i) {
      const bool finite = std::isfinite(x[i]);
      if (finite && !(second_moment && x[i] < 0.0f)) continue;
      std::ostringstream m;
      m << "checkpoint " << reader.path() << ": tensor '" << t.name << "' holds " << x[i] << " at element "
        << first + i << " (of " << t.numel() << "): ";
      if (!finite)
        m << "a model and its optimizer state must be finite, so the file is damaged or was saved by a run "
             "that had diverged";
      else
        m << "AdamW's second moment is a running mean of squares and never negative, so the file is damaged";
      m << "; resume from an earlier checkpoint, or start from a good model file with --init";
      return m.str();
    }
    return {};
  });
  if (moments) check_moment_pairs(reader);
  return moments;
}

// The metadata words a checkpoint is written with, each checked when
// present: anything else was not written by this program.
void check_metadata_words(const std::string& path, const std::map<std::string, std::string>& meta,
                          const ModelLayout& layout) {
  struct Allowed {
    const char* key;
    std::set<std::string> words;
  };
  const Allowed allowed[] = {
      {"format", {"zero-to-fsdp training checkpoint", "zero-to-fsdp consolidated model"}},
      {"model", {layout.cfg.name}},
      {"precision", {"fp32", "bf16"}},
      // The ladder's stages, and the program reading it: a stage of one's
      // own (lab 7's) writes its executable's name, and resumes from it.
      {"stage", {"dp", "zero1", "zero2", "zero3", "fsdp", "offload", program_invocation_short_name}},
  };
  for (const Allowed& a : allowed) {
    auto it = meta.find(a.key);
    if (it == meta.end()) continue;
    std::string list;
    for (const std::string& w : a.words) list += (list.empty() ? "'" : ", '") + w + "'";
    USAGE_REQUIRE(a.words.count(it->second),
                  "checkpoint " << path << " has the metadata '" << a.key << "' = '" << printable(it->second)
                                << "', where this program writes " << list
                                << (std::string(a.key) == "model" ? " for this model (check --model)" : "")
                                << ": the file is damaged or was not written by --save; save it again");
  }
}

}  // namespace

void check_metadata(const std::string& path, const std::map<std::string, std::string>& meta,
                    const ModelLayout& layout) {
  check_metadata_numbers(path, meta);
  check_metadata_words(path, meta, layout);
}

bool check_file_values(const SafetensorsReader& reader) { return check_values(reader); }

void check_step(const std::string& path, int64_t steps, bool moments) {
  USAGE_REQUIRE(steps >= 0, "checkpoint " << path << " says it was saved after " << steps
                                          << " steps: the file is damaged");
  USAGE_REQUIRE(steps > 0 || !moments,
                "checkpoint " << path << " says it was saved after 0 steps, but AdamW's moments in it are not "
                                 "all zero, as they are before the first step: the file is damaged or was edited; "
                                 "use an earlier checkpoint");
}

void save_model(const std::string& path, const ModelLayout& layout, const float* flat,
                const std::map<std::string, std::string>& metadata) {
  std::vector<TensorRef> refs;
  add_refs(refs, layout, StateKind::params, flat);
  auto meta = metadata;
  meta["format"] = "zero-to-fsdp consolidated model";
  meta["model"] = layout.cfg.name;
  write_safetensors(path, refs, meta);
}

CheckedOnce::CheckedOnce(const std::string& path) {
  std::vector<std::string> files{path};
  if (is_sharded_checkpoint_path(path)) files = sharded_checkpoint_files(path);
  std::lock_guard<std::mutex> lock(checked_mu);
  for (const std::string& f : files) {
    FileId id;
    if (!file_id(f, &id)) continue;
    checked[id]++;
    ids_.push_back(id);
  }
}

CheckedOnce::~CheckedOnce() {
  std::lock_guard<std::mutex> lock(checked_mu);
  for (const FileId& id : ids_)
    if (--checked[id] == 0) checked.erase(id);
}

void check_model_file(const std::string& path, const ModelLayout& layout) {
  SafetensorsReader reader(path);
  check_tensors(reader, layout, {StateKind::params}, {}, /*optim_ok=*/true);
  check_metadata(path, reader.metadata(), layout);
  check_values(reader);
}

void load_model(const std::string& path, const ModelLayout& layout, float* flat) {
  check_model_file(path, layout);
  SafetensorsReader reader(path);
  for (const auto& u : layout.units)
    for (const auto& p : u.params) reader.read(p.name, p.shape, DType::f32, flat + u.offset + p.offset);
}

void save_checkpoint(const std::string& path, const ModelLayout& layout, const float* params, const float* m,
                     const float* v, long step, const std::map<std::string, std::string>& metadata) {
  std::vector<TensorRef> refs;
  add_refs(refs, layout, StateKind::params, params);
  add_refs(refs, layout, StateKind::m, m);
  add_refs(refs, layout, StateKind::v, v);
  const int64_t steps = step;
  refs.push_back({kStepName, DType::i64, {1}, &steps});
  auto meta = metadata;
  meta["format"] = "zero-to-fsdp training checkpoint";
  meta["model"] = layout.cfg.name;
  write_safetensors(path, refs, meta);
}

CheckpointReader::CheckpointReader(const std::string& path, const ModelLayout& layout)
    : CheckpointSource(layout), reader_(path) {
  USAGE_REQUIRE(reader_.has(kStepName),
                "checkpoint " << path << " holds a model but no optimizer state (no '" << kStepName
                              << "'): it was written by --save-init or another program. Start from it with "
                                 "--init (a fresh AdamW), or resume from a file written by --save");
  check_tensors(reader_, layout, {StateKind::params, StateKind::m, StateKind::v}, {kStepName},
                /*optim_ok=*/false);
  check_metadata(path, reader_.metadata(), layout);
  const TensorInfo& step_info = reader_.info(kStepName);
  USAGE_REQUIRE(step_info.dtype == DType::i64 && step_info.shape == std::vector<int64_t>{1},
                "checkpoint " << path << " has '" << kStepName << "' as " << dtype_name(step_info.dtype) << " "
                              << shape_str(step_info.shape) << ", where --save writes one I64 number, the steps "
                                 "done: the file is damaged or was not written by --save; use an earlier checkpoint");
  const bool moments = check_values(reader_);
  int64_t steps = 0;
  reader_.read(kStepName, {1}, DType::i64, &steps);
  check_step(path, steps, moments);
  step_ = long(steps);
}

void CheckpointSource::read_unit(int u, StateKind kind, size_t begin, size_t end, float* dst) const {
  const UnitLayout& unit = layout_.units.at(u);
  for (const auto& p : unit.params) {  // the parameters overlapping [begin, end)
    const size_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    read_elements(state_name(kind, p.name), p.shape, lo - p.offset, hi - lo, dst + (lo - begin));
  }
}

void CheckpointSource::read_all(StateKind kind, float* flat) const {
  for (size_t u = 0; u < layout_.units.size(); ++u)
    read_unit(int(u), kind, 0, layout_.units[u].numel, flat + layout_.units[u].offset);
}

std::unique_ptr<CheckpointSource> open_checkpoint(const std::string& path, const ModelLayout& layout) {
  if (is_sharded_checkpoint_path(path)) return std::make_unique<ShardedCheckpointReader>(path, layout);
  return std::make_unique<CheckpointReader>(path, layout);
}

}  // namespace zf
