// model.h: the GPT of docs/SPEC.md as a list of units with flat parameter buffers.
//
// The model is cut into units: the embeddings, each transformer block, and
// the head (final LayerNorm + lm_head). Each unit's parameters live in one
// flat buffer, laid out in docs/SPEC.md's order, with named views (ParamSpec) into
// it; concatenating the units gives the whole model's flat range in its
// consolidated order. This is the shape every stage shards: data parallel
// all-reduces whole unit buffers, and every ZeRO stage cuts each unit's
// buffer into N pieces, padded to a multiple of N, rank r owning piece r
// (shard.h).
//
// Gpt does the arithmetic of one rank: forward and backward one unit at a
// time, on parameters handed to it (so a stage decides where they come from:
// a replica, or a buffer it just all-gathered). It owns the activations it
// keeps for the backward, allocated per unit through the rank's
// MemoryTracker (category `activations`).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "memory.h"
#include "tensor.h"

namespace zf {


struct ModelConfig {
  std::string name;  // the preset's name, or the shape as parse_model reads it ("L=32,C=4096,H=32,T=4096,V=32000")
  int V = 256, T = 64, L = 2, H = 4, C = 64;
};

// "tiny", "small", "gpt2"; UsageError for anything else.
ModelConfig model_preset(const std::string& name);
const std::vector<std::string>& model_preset_names();
// The largest shape a run takes (--model, memory_estimate's shape flags):
// far above any model's, and small enough that its counts stay in range.
constexpr int kMostLayers = 100000, kMostChannels = 1000000, kMostSeq = 10000000, kMostVocab = 100000000;

// --model: a preset's name, a shape "L=32,C=4096,H=32,T=4096,V=32000" (all
// five), or a preset with some of its shape changed ("gpt-7b,V=32000").
// The config's name reads back to the same model (a checkpoint keeps it).
// UsageError saying what was wrong.
ModelConfig parse_model(const std::string& text);

enum class InitKind { normal, normal_residual, zeros, ones };

struct ParamSpec {
  std::string name;            // "h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // [3C, C]
  size_t offset = 0;           // in the unit's flat buffer
  size_t numel = 0;
  InitKind init = InitKind::zeros;
  bool decay = false;          // AdamW weight decay: tensors of two or more dims
};

enum class UnitKind { embedding, block, head };

struct UnitLayout {
  UnitKind kind;
  int layer = -1;              // block index, -1 otherwise
  std::string name;            // "embedding", "h.3", "head"
  std::vector<ParamSpec> params;
  size_t numel = 0;            // elements of the unit's flat buffer
  size_t offset = 0;           // where the unit starts in the model's flat range
};

struct ModelLayout {
  ModelConfig cfg;
  std::vector<UnitLayout> units;  // embedding, h.0 .. h.L-1, head
  size_t numel = 0;               // P
  int block_unit(int layer) const { return layer + 1; }
  int head_unit() const { return int(units.size()) - 1; }
};

ModelLayout build_layout(const ModelConfig& cfg);

// Writes the seeded initial values of the unit's elements [begin, end) into
// out[0 .. end-begin). Element i of parameter p depends only on (seed, p's
// name, i), never on who draws it (see rng.h).
void init_unit_range(const UnitLayout& unit, const ModelConfig& cfg, uint64_t seed,
                     size_t begin, size_t end, float* out);

// FLOPs of one training step (forward + backward) per token, as nanoGPT's
// MFU estimate counts them: 6 per parameter of a matrix product (all but the
// two embedding tables) plus 12 * L * T * C for attention's q.k and att.v.
double flops_per_token(const ModelLayout& layout);

// What the backward recomputes instead of keeping (the header comment above).
enum class Recompute { none, full, attn };
const char* recompute_name(Recompute r);

// One rank's forward and backward arithmetic, unit by unit, in the device's
// compute dtype (device.h: float32, or bf16 on a GPU), read when the Gpt is
// built. `params` of a unit is its flat buffer of that dtype; grads are
// ACCUMULATED (+=) into `grads` (the unit's flat gradient buffer, same dtype).
class Gpt {
 public:
  // Activations live on the rank's device (dev), counted by mem. attention:
  // the form the device runs (set on it here), which decides what attention
  // keeps for its backward. recompute: what the backward recomputes instead.
  Gpt(const ModelLayout& layout, MemoryTracker& mem, Device& dev, int B,
      AttentionForm attention = AttentionForm::simple, Recompute recompute = Recompute::none);
  ~Gpt();

  // Forward. The residual stream flows embedding -> h.0 -> ... -> head;
  // head_forward returns the mean cross-entropy over the B*T positions.
  void embedding_forward(const void* params, const int32_t* tokens);
  void block_forward(int layer, const void* params);
  float head_forward(const void* params, const int32_t* targets);

  // Backward, in reverse order. dloss is d(objective)/d(mean loss of this micro-batch).
  // head_backward overwrites the logits with their gradient: one backward per forward.
  void head_backward(const void* params, void* grads, float dloss);
  void block_backward(int layer, const void* params, void* grads);
  void embedding_backward(void* grads);

  void forward_unit(int unit, const void* params, const int32_t* tokens, const int32_t* targets,
                    float* loss);
  void backward_unit(int unit, const void* params, void* grads, float dloss);

  // After a forward: the V logits of row `position` of the [B*T] positions
  // (sequence b's position t is b*T + t), as float32, into out (host).
  void logits_at(size_t position, float* out) const;

  const ModelLayout& layout() const { return layout_; }
  int batch() const { return B_; }
  DType compute_dtype() const { return act_; }
  Recompute recompute() const { return recompute_; }

  // Called around the recomputation inside block_backward (true before,
  // false after) with the block's unit: a recorded schedule's events.
  void on_recompute(std::function<void(int unit, bool begin)> hook) { on_recompute_ = std::move(hook); }

 private:
  struct BlockActs;
  // Where block `layer`'s activations are (the shared set under full), and
  // its attention's saved bytes (the shared buffer under attn).
  BlockActs& acts(int layer);
  void* saved_attention(int layer);
  // Block `layer`'s forward into acts(layer): all of it, or (recomputing)
  // up to the GELU, the last matmul's output being x_{layer+1}, kept.
  void block_forward_into(int layer, const void* params, bool recomputing);
  // Element i of a buffer of the compute dtype.
  const void* at(const void* base, size_t i) const { return static_cast<const char*>(base) + i * esize_; }
  void* at(void* base, size_t i) const { return static_cast<char*>(base) + i * esize_; }

  const ModelLayout& layout_;
  MemoryTracker& mem_;
  Device& dev_;
  int B_;
  DType act_;                        // the compute dtype of every activation and parameter
  size_t esize_;                     // its bytes per element
  Recompute recompute_;
  bool shared_probs_;                // attn with the simple form: one probability buffer
  std::function<void(int, bool)> on_recompute_;
  const int32_t* tokens_ = nullptr;  // of the current micro-batch
  const int32_t* targets_ = nullptr;
  std::vector<Tensor> residual_;     // x_0 .. x_L, each [B,T,C]
  std::vector<std::unique_ptr<BlockActs>> blocks_;
  Tensor lnf_, lnf_mean_, lnf_rstd_, logits_, lse_, losses_;  // head (logits_ becomes dlogits)
  Tensor dresid_, dscratch_;         // gradient of the residual stream and per-op scratch
  Tensor att_scratch_;
  std::vector<float> host_losses_;   // the per-position losses, copied back for the mean
};

// Offset helpers: the ParamSpec of `name` in a unit, or nullptr.
const ParamSpec* find_param(const UnitLayout& unit, const std::string& name);

}  // namespace zf
