// flat_units.h: FSDP's units and their flat parameters (FSDP1's FlatParameter).
//
// The wrap policy groups the model's units (common/core/model.h: embedding,
// h.0 .. h.L-1, head) into FSDP units: the embeddings alone, --wrap-blocks
// consecutive blocks each (the last group may hold fewer), the final
// LayerNorm with the head alone, as torchtitan wraps a GPT. Each FSDP unit's
// parameters are its model units' flat buffers concatenated, in
// consolidated order: one flat buffer that is padded to a multiple of N and
// sharded as a whole (common/core/shard.h), so a unit is one all-gather and
// one reduce-scatter however many blocks it holds.
//
// The FSDP units are written as a ModelLayout of their own (`flat`): each
// UnitLayout is an FSDP unit whose ParamSpecs are its members', offsets
// shifted. Everything that works by unit and element range (the shard
// layout, the seeded init, checkpoints, AdamW's decay mask) works on it
// unchanged; only the compute, which runs one model unit at a time, needs
// `members` and `member_offset` to find a model unit inside its FSDP unit.
#pragma once

#include <vector>

#include "model.h"

namespace zf {

struct FsdpUnits {
  ModelLayout flat;                        // one unit per FSDP unit, in forward order
  std::vector<std::vector<int>> members;   // the model units of each FSDP unit, in forward order
  std::vector<int> unit_of;                // the FSDP unit of each model unit
  std::vector<size_t> member_offset;       // where each model unit starts in its FSDP unit's buffer
  int size() const { return int(members.size()); }
  int last() const { return size() - 1; }  // the head: the last unit of forward, the first of backward
};

// Embedding | ceil(L / per_unit) groups of per_unit blocks | head. per_unit = 1
// gives stage 03's units.
FsdpUnits wrap_blocks(const ModelLayout& model, int per_unit);

}  // namespace zf
