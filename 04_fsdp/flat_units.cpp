// flat_units.cpp: the wrap policy, as a layout of FSDP units.
#include "flat_units.h"

#include <algorithm>
#include <string>

#include "check.h"

namespace zf {

FsdpUnits wrap_blocks(const ModelLayout& model, int per_unit) {
  REQUIRE(per_unit >= 1, "wrap_blocks: per_unit = " << per_unit);
  FsdpUnits f;
  f.flat.cfg = model.cfg;
  f.flat.numel = model.numel;
  f.unit_of.resize(model.units.size());
  f.member_offset.resize(model.units.size());
  auto open_unit = [&](UnitKind kind, const std::string& name, size_t offset) {
    f.flat.units.push_back(UnitLayout{kind, -1, name, {}, 0, offset});
    f.members.emplace_back();
  };
  auto add_member = [&](int u) {
    const UnitLayout& m = model.units[u];
    UnitLayout& g = f.flat.units.back();
    for (ParamSpec p : m.params) {
      p.offset += g.numel;
      g.params.push_back(std::move(p));
    }
    f.unit_of[u] = f.size() - 1;
    f.member_offset[u] = g.numel;
    g.numel += m.numel;
    f.members.back().push_back(u);
  };
  const int L = model.cfg.L;
  open_unit(UnitKind::embedding, "embedding", model.units[0].offset);
  add_member(0);
  for (int l0 = 0; l0 < L; l0 += per_unit) {
    const int l1 = std::min(L, l0 + per_unit) - 1;
    const int u0 = model.block_unit(l0);
    open_unit(UnitKind::block, l0 == l1 ? model.units[u0].name : "h." + std::to_string(l0) + "-" + std::to_string(l1),
              model.units[u0].offset);
    f.flat.units.back().layer = l0;
    for (int l = l0; l <= l1; ++l) add_member(model.block_unit(l));
  }
  open_unit(UnitKind::head, "head", model.units[model.head_unit()].offset);
  add_member(model.head_unit());
  return f;
}

}  // namespace zf
