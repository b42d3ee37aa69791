// checkpoint.cpp: consolidated model checkpoints on top of safetensors.cpp.
#include "checkpoint.h"

#include <set>
#include <vector>

#include "check.h"
#include "safetensors.h"

namespace zf {

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

}  // namespace zf
