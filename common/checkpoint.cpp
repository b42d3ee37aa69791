// checkpoint.cpp: consolidated model and training checkpoints on top of safetensors.cpp.
#include "checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "check.h"

namespace zf {

namespace {

std::string state_name(StateKind kind, const std::string& param) {
  switch (kind) {
    case StateKind::m: return "optim.m." + param;
    case StateKind::v: return "optim.v." + param;
    default: return param;
  }
}

constexpr const char* kStepName = "optim.step";

}  // namespace

void save_model(const std::string& path, const ModelLayout& layout, const float* flat,
                const std::map<std::string, std::string>& metadata) {
  std::vector<TensorRef> refs;
  for (const auto& u : layout.units)
    for (const auto& p : u.params) refs.push_back({p.name, DType::f32, p.shape, flat + u.offset + p.offset});
  auto meta = metadata;
  meta["format"] = "zero-to-fsdp consolidated model";
  meta["model"] = layout.cfg.name;
  write_safetensors(path, refs, meta);
}

void load_model(const std::string& path, const ModelLayout& layout, float* flat) {
  SafetensorsReader reader(path);
  std::set<std::string> expected;
  for (const auto& u : layout.units)
    for (const auto& p : u.params) {
      expected.insert(p.name);
      USAGE_REQUIRE(reader.has(p.name),
                    "checkpoint " << path << " has no tensor '" << p.name << "' that the "
                                  << layout.cfg.name << " model needs: was it saved for another model "
                                                        "(--model) or by another program?");
      reader.read(p.name, p.shape, DType::f32, flat + u.offset + p.offset);
    }
  for (const auto& t : reader.tensors()) {
    bool optimizer_state = t.name.rfind("optim.", 0) == 0;
    USAGE_REQUIRE(expected.count(t.name) || optimizer_state,
                  "checkpoint " << path << " has a tensor '" << t.name << "' " << shape_str(t.shape)
                                << " that the " << layout.cfg.name
                                << " model does not have: was it saved for another model (--model)?");
  }
}

void save_checkpoint(const std::string& path, const ModelLayout& layout, const float* params, const float* m,
                     const float* v, long step, const std::map<std::string, std::string>& metadata) {
  std::vector<TensorRef> refs;
  for (StateKind kind : {StateKind::params, StateKind::m, StateKind::v}) {
    const float* flat = kind == StateKind::params ? params : kind == StateKind::m ? m : v;
    for (const auto& u : layout.units)
      for (const auto& p : u.params)
        refs.push_back({state_name(kind, p.name), DType::f32, p.shape, flat + u.offset + p.offset});
  }
  const int64_t steps = step;
  refs.push_back({kStepName, DType::i64, {1}, &steps});
  auto meta = metadata;
  meta["format"] = "zero-to-fsdp training checkpoint";
  meta["model"] = layout.cfg.name;
  write_safetensors(path, refs, meta);
}

CheckpointReader::CheckpointReader(const std::string& path, const ModelLayout& layout)
    : layout_(layout), reader_(path) {
  USAGE_REQUIRE(reader_.has(kStepName),
                "checkpoint " << path << " holds a model but no optimizer state (no '" << kStepName
                              << "'): it was written by --save-init or another program. Start from it with "
                                 "--init (a fresh AdamW), or resume from a file written by --save");
  // Every name and shape, before anything is read: the model's (load_model's
  // checks and messages), then the two moments.
  std::set<std::string> expected = {kStepName};
  for (const auto& u : layout.units)
    for (const auto& p : u.params)
      for (StateKind kind : {StateKind::params, StateKind::m, StateKind::v}) {
        const std::string name = state_name(kind, p.name);
        expected.insert(name);
        USAGE_REQUIRE(reader_.has(name), "checkpoint " << path << " has no tensor '" << name << "' that the "
                                                        << layout.cfg.name
                                                        << " model needs: was it saved for another model (--model)?");
        USAGE_REQUIRE(reader_.info(name).shape == p.shape,
                      "tensor '" << name << "' in " << path << " has shape " << shape_str(reader_.info(name).shape)
                                 << " but the " << layout.cfg.name << " model's is " << shape_str(p.shape)
                                 << ": the checkpoint was written for a different model (check --model)");
      }
  for (const auto& t : reader_.tensors())
    USAGE_REQUIRE(expected.count(t.name), "checkpoint " << path << " has a tensor '" << t.name << "' "
                                                         << shape_str(t.shape) << " that the " << layout.cfg.name
                                                         << " model does not have: was it saved for another model "
                                                            "(--model)?");
  int64_t steps = 0;
  reader_.read(kStepName, {1}, DType::i64, &steps);
  USAGE_REQUIRE(steps >= 0, "checkpoint " << path << " says it was saved after " << steps
                                          << " steps: the file is damaged");
  step_ = long(steps);
}

void CheckpointReader::read_unit(int u, StateKind kind, size_t begin, size_t end, float* dst) const {
  const UnitLayout& unit = layout_.units.at(u);
  for (const auto& p : unit.params) {  // the parameters overlapping [begin, end)
    const size_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    reader_.read_elements(state_name(kind, p.name), p.shape, DType::f32, lo - p.offset, hi - lo, dst + (lo - begin));
  }
}

void CheckpointReader::read_all(StateKind kind, float* flat) const {
  for (size_t u = 0; u < layout_.units.size(); ++u)
    read_unit(int(u), kind, 0, layout_.units[u].numel, flat + layout_.units[u].offset);
}

}  // namespace zf
