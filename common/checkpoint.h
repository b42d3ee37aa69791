// checkpoint.h: the model as one consolidated safetensors file.
//
// Tensor names are SPEC.md's (nanoGPT's): "wte.weight", "h.0.attn.c_attn.weight",
// ..., "lm_head.weight", stored as F32 in consolidated order. `--save-init`
// writes one; `--init` reads one back, refusing a file whose names or shapes
// do not match the model with a message that names the tensor and both shapes.
#pragma once

#include <map>
#include <string>

#include "model.h"

namespace zf {

// flat: the model's P float32 parameters in consolidated order.
void save_model(const std::string& path, const ModelLayout& layout, const float* flat,
                const std::map<std::string, std::string>& metadata = {});
void load_model(const std::string& path, const ModelLayout& layout, float* flat);

}  // namespace zf
