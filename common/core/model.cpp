// model.cpp: the GPT's layout, its seeded initialisation, and the unit-by-unit
// forward and backward of one rank (llm.c's order of operations, with the
// activations of each block kept in that block's own buffers, or in one
// shared set that the backward refills: --recompute, model.h).
#include "model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "check.h"
#include "device.h"
#include "rng.h"

namespace zf {

// ---------------------------------------------------------------- presets and layout

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = {"tiny",       "wide",    "small",  "gpt2",   "gpt2-medium",
                                                  "gpt2-large", "gpt2-xl", "gpt-7b", "gpt-70b"};
  return names;
}

ModelConfig model_preset(const std::string& name) {
  if (name == "tiny") return {"tiny", 256, 64, 2, 4, 64};
  // Wide and short: its model states outweigh its activations many times
  // over, so what each stage saves shows in a memory picture.
  if (name == "wide") return {"wide", 256, 32, 2, 4, 256};
  if (name == "small") return {"small", 256, 128, 4, 4, 128};
  if (name == "gpt2") return {"gpt2", 50304, 1024, 12, 12, 768};
  // GPT-2's larger sizes (355M, 774M, 1.5B), then two shapes of the size of
  // Llama 2's 7B and 70B (their layers, width and context), in this GPT's
  // form (GELU MLP of 4C, learned positions, full attention): for the
  // modeled clock's dry runs, as few machines hold them.
  if (name == "gpt2-medium") return {"gpt2-medium", 50304, 1024, 24, 16, 1024};
  if (name == "gpt2-large") return {"gpt2-large", 50304, 1024, 36, 20, 1280};
  if (name == "gpt2-xl") return {"gpt2-xl", 50304, 1024, 48, 25, 1600};
  if (name == "gpt-7b") return {"gpt-7b", 50304, 4096, 32, 32, 4096};
  if (name == "gpt-70b") return {"gpt-70b", 50304, 4096, 80, 64, 8192};
  std::string names;
  for (const std::string& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw UsageError("unknown model preset '" + name + "': use one of " + names);
}

ModelConfig parse_model(const std::string& text) {
  const auto comma = text.find_first_of(",=");
  const bool from_preset = comma == std::string::npos || text[comma] == ',';
  if (comma == std::string::npos) return model_preset(text);
  ModelConfig m = from_preset ? model_preset(text.substr(0, comma)) : ModelConfig{};
  const std::string usage = "--model takes a preset, a shape L=12,C=768,H=12,T=1024,V=50304 (blocks, channels, "
                            "heads, sequence, vocabulary), or a preset with some of these changed: gpt-7b,V=32000";
  struct Key {
    char letter;
    int* value;
    long lo, hi;
    bool given;
  } keys[] = {{'L', &m.L, 1, kMostLayers, false},
              {'C', &m.C, 1, kMostChannels, false},
              {'H', &m.H, 1, kMostChannels, false},
              {'T', &m.T, 1, kMostSeq, false},
              {'V', &m.V, 1, kMostVocab, false}};
  size_t at = from_preset ? comma + 1 : 0;
  USAGE_REQUIRE(at < text.size(), "--model '" << text << "' ends in a comma: " << usage);
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    Key* key = nullptr;
    for (Key& k : keys)
      if (item.size() > 2 && item[0] == k.letter && item[1] == '=') key = &k;
    USAGE_REQUIRE(key, "--model '" << text << "': '" << item << "' is not one of L=, C=, H=, T=, V= and a number: "
                                   << usage);
    USAGE_REQUIRE(!key->given, "--model '" << text << "' gives " << key->letter << " twice");
    const std::string number = item.substr(2);
    char* stop = nullptr;
    const long v = std::strtol(number.c_str(), &stop, 10);
    USAGE_REQUIRE(*stop == 0 && std::isdigit(static_cast<unsigned char>(number[0])) && v >= key->lo && v <= key->hi,
                  "--model '" << text << "': " << key->letter << " must be a whole number from " << key->lo
                              << " to " << key->hi << " (got '" << number << "')");
    *key->value = int(v);
    key->given = true;
    at = end + 1;
  }
  for (const Key& k : keys)
    USAGE_REQUIRE(from_preset || k.given, "--model '" << text << "' is a shape without " << k.letter
                                                      << "=: a shape gives all five of L, C, H, T, V");
  USAGE_REQUIRE(m.C % m.H == 0, "--model '" << text << "': the heads H=" << m.H << " must divide the channels C="
                                            << m.C);
  m.name = "L=" + std::to_string(m.L) + ",C=" + std::to_string(m.C) + ",H=" + std::to_string(m.H) +
           ",T=" + std::to_string(m.T) + ",V=" + std::to_string(m.V);
  for (const std::string& n : model_preset_names()) {
    const ModelConfig p = model_preset(n);
    if (p.L == m.L && p.C == m.C && p.H == m.H && p.T == m.T && p.V == m.V) m.name = n;
  }
  return m;
}

namespace {

void add_param(UnitLayout& u, std::string name, std::vector<int64_t> shape, InitKind init) {
  ParamSpec p;
  p.name = std::move(name);
  p.numel = 1;
  for (int64_t d : shape) p.numel *= size_t(d);
  p.shape = std::move(shape);
  p.offset = u.numel;
  p.init = init;
  p.decay = p.shape.size() >= 2;
  u.numel += p.numel;
  u.params.push_back(std::move(p));
}

}  // namespace

ModelLayout build_layout(const ModelConfig& cfg) {
  REQUIRE(cfg.C % cfg.H == 0, "channels C=" << cfg.C << " not divisible by heads H=" << cfg.H);
  const int64_t V = cfg.V, T = cfg.T, C = cfg.C;
  ModelLayout m;
  m.cfg = cfg;

  UnitLayout emb{UnitKind::embedding, -1, "embedding", {}, 0, 0};
  add_param(emb, "wte.weight", {V, C}, InitKind::normal);
  add_param(emb, "wpe.weight", {T, C}, InitKind::normal);
  m.units.push_back(std::move(emb));

  for (int l = 0; l < cfg.L; ++l) {
    std::string h = "h." + std::to_string(l) + ".";
    UnitLayout b{UnitKind::block, l, "h." + std::to_string(l), {}, 0, 0};
    add_param(b, h + "ln_1.weight", {C}, InitKind::ones);
    add_param(b, h + "ln_1.bias", {C}, InitKind::zeros);
    add_param(b, h + "attn.c_attn.weight", {3 * C, C}, InitKind::normal);
    add_param(b, h + "attn.c_attn.bias", {3 * C}, InitKind::zeros);
    add_param(b, h + "attn.c_proj.weight", {C, C}, InitKind::normal_residual);
    add_param(b, h + "attn.c_proj.bias", {C}, InitKind::zeros);
    add_param(b, h + "ln_2.weight", {C}, InitKind::ones);
    add_param(b, h + "ln_2.bias", {C}, InitKind::zeros);
    add_param(b, h + "mlp.c_fc.weight", {4 * C, C}, InitKind::normal);
    add_param(b, h + "mlp.c_fc.bias", {4 * C}, InitKind::zeros);
    add_param(b, h + "mlp.c_proj.weight", {C, 4 * C}, InitKind::normal_residual);
    add_param(b, h + "mlp.c_proj.bias", {C}, InitKind::zeros);
    m.units.push_back(std::move(b));
  }

  UnitLayout head{UnitKind::head, -1, "head", {}, 0, 0};
  add_param(head, "ln_f.weight", {C}, InitKind::ones);
  add_param(head, "ln_f.bias", {C}, InitKind::zeros);
  add_param(head, "lm_head.weight", {V, C}, InitKind::normal);
  m.units.push_back(std::move(head));

  for (auto& u : m.units) {
    u.offset = m.numel;
    m.numel += u.numel;
  }
  return m;
}

const ParamSpec* find_param(const UnitLayout& unit, const std::string& name) {
  for (const auto& p : unit.params)
    if (p.name == name) return &p;
  return nullptr;
}

void init_unit_range(const UnitLayout& unit, const ModelConfig& cfg, uint64_t seed,
                     size_t begin, size_t end, float* out) {
  REQUIRE(begin <= end && end <= unit.numel, "init range [" << begin << ", " << end
                                                 << ") outside unit " << unit.name);
  const double std_normal = 0.02;
  const double std_residual = 0.02 / std::sqrt(2.0 * cfg.L);
  for (const auto& p : unit.params) {
    size_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    const uint64_t stream = fnv1a64(p.name.data(), p.name.size());
    for (size_t i = lo; i < hi; ++i) {
      float v = 0.0f;
      switch (p.init) {
        case InitKind::zeros: v = 0.0f; break;
        case InitKind::ones: v = 1.0f; break;
        case InitKind::normal: v = float(std_normal * philox_normal(seed, stream, i - p.offset)); break;
        case InitKind::normal_residual:
          v = float(std_residual * philox_normal(seed, stream, i - p.offset));
          break;
      }
      out[i - begin] = v;
    }
  }
}

double flops_per_token(const ModelLayout& layout) {
  const auto& c = layout.cfg;
  // Matrix-product parameters (embedding lookups are not products, lm_head is).
  double matmul_params = double(layout.numel) - double(c.V) * c.C - double(c.T) * c.C;
  return 6.0 * matmul_params + 12.0 * c.L * c.T * c.C;
}

// ---------------------------------------------------------------- activations

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::full: return "full";
    case Recompute::attn: return "attn";
  }
  return "?";
}

struct Gpt::BlockActs {
  Tensor ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
};

Gpt::Gpt(const ModelLayout& layout, MemoryTracker& mem, Device& dev, int B, AttentionForm attention,
         Recompute recompute)
    : layout_(layout), mem_(mem), dev_(dev), B_(B), act_(dev.compute_dtype()), esize_(dtype_size(act_)),
      recompute_(recompute),
      shared_probs_(recompute == Recompute::attn && attention == AttentionForm::simple) {
  dev.set_attention(attention);
  const auto& c = layout.cfg;
  const size_t BT = size_t(B) * c.T, C = c.C;
  // Tensors of the compute dtype, and the float32 ones (statistics, losses).
  auto act = [&](size_t n) { return Tensor(mem, Place::device, Category::activations, act_, n); };
  auto f32 = [&](size_t n) { return Tensor(mem, Place::device, Category::activations, DType::f32, n); };
  for (int l = 0; l <= c.L; ++l) residual_.push_back(act(BT * C));
  // full: one set for every block; attn: the probabilities only in block 0's
  // set, which every block then uses (saved_attention).
  const int sets = recompute == Recompute::full ? 1 : c.L;
  for (int l = 0; l < sets; ++l) {
    auto a = std::make_unique<BlockActs>();
    a->ln1 = act(BT * C);
    a->ln1_mean = f32(BT);
    a->ln1_rstd = f32(BT);
    a->qkv = act(BT * 3 * C);
    // What attention keeps for its backward: the probabilities, or the flash
    // form's row statistics (device.h); bytes, counted as activations.
    if (l == 0 || !shared_probs_) a->att = f32((dev.attention_saved_bytes(B, c.T, c.H) + 3) / 4);
    a->atty = act(BT * C);
    a->res2 = act(BT * C);
    a->ln2 = act(BT * C);
    a->ln2_mean = f32(BT);
    a->ln2_rstd = f32(BT);
    a->fch = act(BT * 4 * C);
    a->fch_gelu = act(BT * 4 * C);
    blocks_.push_back(std::move(a));
  }
  lnf_ = act(BT * C);
  lnf_mean_ = f32(BT);
  lnf_rstd_ = f32(BT);
  // The head keeps its logits and one float per position (lse) for the
  // backward, no probabilities: the fused cross-entropy recomputes them, and
  // writes dlogits over the logits (head_backward).
  logits_ = act(BT * c.V);
  lse_ = f32(BT);
  losses_ = f32(BT);
  dresid_ = act(BT * C);
  // Backward scratch: a block needs 4C + 4C + C elements per position, the
  // head C (dlnf; its dlogits take the logits' buffer).
  dscratch_ = act(BT * 9 * C);
  att_scratch_ = f32(dev.attention_scratch_floats(B, c.T, c.H));
  host_losses_.resize(BT);
}

Gpt::~Gpt() = default;

// ---------------------------------------------------------------- forward

void Gpt::embedding_forward(const void* params, const int32_t* tokens) {
  const auto& c = layout_.cfg;
  const auto& u = layout_.units[0];
  REQUIRE(dev_.compute_dtype() == act_, "the device's compute dtype changed after the model was built");
  tokens_ = tokens;
  dev_.encoder_forward(residual_[0].data(), tokens, at(params, u.params[0].offset),
                       at(params, u.params[1].offset), B_, c.T, c.C);
}

Gpt::BlockActs& Gpt::acts(int layer) { return *blocks_[recompute_ == Recompute::full ? 0 : layer]; }

void* Gpt::saved_attention(int layer) { return (shared_probs_ ? *blocks_[0] : acts(layer)).att.data(); }

void Gpt::block_forward(int layer, const void* params) { block_forward_into(layer, params, false); }

void Gpt::block_forward_into(int layer, const void* params, bool recomputing) {
  const auto& c = layout_.cfg;
  const auto& P = layout_.units[layout_.block_unit(layer)].params;
  const int N = B_ * c.T, C = c.C;
  auto w = [&](int i) { return at(params, P[i].offset); };
  BlockActs& a = acts(layer);
  const void* x = residual_[layer].data();
  void* out = residual_[layer + 1].data();

  dev_.layernorm_forward(a.ln1.data(), a.ln1_mean.as<float>(), a.ln1_rstd.as<float>(), x, w(0), w(1), N, C);
  dev_.matmul_forward(a.qkv.data(), a.ln1.data(), w(2), w(3), N, C, 3 * C);
  dev_.attention_forward(a.atty.data(), saved_attention(layer), att_scratch_.as<float>(), a.qkv.data(), B_, c.T,
                         C, c.H);
  dev_.matmul_forward(a.res2.data(), a.atty.data(), w(4), w(5), N, C, C);
  dev_.residual_forward(a.res2.data(), a.res2.data(), x, size_t(N) * C);
  dev_.layernorm_forward(a.ln2.data(), a.ln2_mean.as<float>(), a.ln2_rstd.as<float>(), a.res2.data(), w(6),
                         w(7), N, C);
  dev_.matmul_forward(a.fch.data(), a.ln2.data(), w(8), w(9), N, C, 4 * C);
  dev_.gelu_forward(a.fch_gelu.data(), a.fch.data(), size_t(N) * 4 * C);
  if (recomputing) return;
  dev_.matmul_forward(out, a.fch_gelu.data(), w(10), w(11), N, 4 * C, C);
  dev_.residual_forward(out, out, a.res2.data(), size_t(N) * C);
}

float Gpt::head_forward(const void* params, const int32_t* targets) {
  const auto& c = layout_.cfg;
  const auto& P = layout_.units[layout_.head_unit()].params;
  const int N = B_ * c.T;
  targets_ = targets;
  dev_.layernorm_forward(lnf_.data(), lnf_mean_.as<float>(), lnf_rstd_.as<float>(), residual_[c.L].data(),
                         at(params, P[0].offset), at(params, P[1].offset), N, c.C);
  dev_.matmul_forward(logits_.data(), lnf_.data(), at(params, P[2].offset), nullptr, N, c.C, c.V);
  dev_.softmax_cross_entropy_forward(lse_.as<float>(), losses_.as<float>(), logits_.data(), targets, N, c.V);
  dev_.to_host(host_losses_.data(), losses_.data(), losses_.bytes());
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += host_losses_[i];
  return float(sum / N);
}

void Gpt::logits_at(size_t position, float* out) const {
  const size_t V = size_t(layout_.cfg.V);
  const void* row = static_cast<const char*>(logits_.data()) + position * V * esize_;
  if (act_ == DType::f32) {
    dev_.to_host(out, row, V * sizeof(float));
    return;
  }
  std::vector<bf16> raw(V);
  dev_.to_host(raw.data(), row, V * sizeof(bf16));
  bf16_to_float(raw.data(), out, V);
}

// ---------------------------------------------------------------- backward

void Gpt::head_backward(const void* params, void* grads, float dloss) {
  const auto& c = layout_.cfg;
  const auto& P = layout_.units[layout_.head_unit()].params;
  const int N = B_ * c.T;
  // dlogits IN PLACE over the logits, and WRITTEN (=), not added: the only
  // backward op that does not accumulate. The logits have no reader after
  // this point (the loss is already computed), so their buffer takes their
  // gradient: no [N, V] scratch, and nothing to zero first. One backward per
  // forward, then: a second head_backward would read gradients as logits.
  void* dlogits = logits_.data();
  void* dlnf = dscratch_.data();
  dev_.zero(dlnf, esize_ * size_t(N) * c.C);
  dev_.zero(dresid_.data(), dresid_.bytes());
  dev_.softmax_cross_entropy_backward(dlogits, logits_.data(), lse_.as<float>(), targets_, dloss / float(N),
                                      N, c.V);
  dev_.matmul_backward(dlnf, at(grads, P[2].offset), nullptr, dlogits, lnf_.data(), at(params, P[2].offset), N,
                       c.C, c.V);
  dev_.layernorm_backward(dresid_.data(), at(grads, P[0].offset), at(grads, P[1].offset), dlnf,
                          residual_[c.L].data(), at(params, P[0].offset), lnf_mean_.as<float>(),
                          lnf_rstd_.as<float>(), N, c.C);
}

void Gpt::block_backward(int layer, const void* params, void* grads) {
  const auto& c = layout_.cfg;
  const auto& P = layout_.units[layout_.block_unit(layer)].params;
  const int N = B_ * c.T, C = c.C;
  const size_t NC = size_t(N) * C;
  auto w = [&](int i) { return at(params, P[i].offset); };
  auto g = [&](int i) { return at(grads, P[i].offset); };
  BlockActs& a = acts(layer);
  void* dx = dresid_.data();  // d(out) on entry; d(res2), then d(x) in place
  void* s4a = dscratch_.data();
  void* s4b = at(s4a, 4 * NC);
  void* s1 = at(s4b, 4 * NC);

  // Recomputation first: the shared buffers hold the last block forwarded
  // (or recomputed), not this one. The same kernels on the same inputs
  // (x_l, this block's parameters; its kept qkv) give the forward's bits.
  if (recompute_ == Recompute::full || shared_probs_) {
    const int unit = layout_.block_unit(layer);
    if (on_recompute_) on_recompute_(unit, true);
    if (recompute_ == Recompute::full) {
      block_forward_into(layer, params, true);
    } else {
      // Only the probabilities: attention's output goes to scratch (free
      // until the zeroing below), leaving the kept atty untouched.
      dev_.attention_forward(s4a, saved_attention(layer), att_scratch_.as<float>(), a.qkv.data(), B_, c.T, C,
                             c.H);
    }
    if (on_recompute_) on_recompute_(unit, false);
  }

  // MLP: out = res2 + c_proj(gelu(c_fc(ln_2(res2))))
  void* dfch_gelu = s4a;
  void* dfch = s4b;
  void* dln2 = s1;
  dev_.zero(s4a, esize_ * 9 * NC);  // the backward kernels accumulate
  dev_.matmul_backward(dfch_gelu, g(10), g(11), dx, a.fch_gelu.data(), w(10), N, 4 * C, C);
  dev_.gelu_backward(dfch, a.fch.data(), dfch_gelu, 4 * NC);
  dev_.matmul_backward(dln2, g(8), g(9), dfch, a.ln2.data(), w(8), N, C, 4 * C);
  dev_.layernorm_backward(dx, g(6), g(7), dln2, a.res2.data(), w(6), a.ln2_mean.as<float>(),
                          a.ln2_rstd.as<float>(), N, C);

  // Attention: res2 = x + c_proj(attn(c_attn(ln_1(x))))
  void* datty = s4a;
  void* dqkv = s4b;
  void* dln1 = s1;
  dev_.zero(datty, esize_ * NC);
  dev_.zero(dqkv, esize_ * 3 * NC);
  dev_.zero(dln1, esize_ * NC);
  dev_.matmul_backward(datty, g(4), g(5), dx, a.atty.data(), w(4), N, C, C);
  dev_.attention_backward(dqkv, att_scratch_.as<float>(), datty, a.atty.data(), a.qkv.data(),
                          saved_attention(layer), B_, c.T, C, c.H);
  dev_.matmul_backward(dln1, g(2), g(3), dqkv, a.ln1.data(), w(2), N, C, 3 * C);
  dev_.layernorm_backward(dx, g(0), g(1), dln1, residual_[layer].data(), w(0), a.ln1_mean.as<float>(),
                          a.ln1_rstd.as<float>(), N, C);
}

void Gpt::embedding_backward(void* grads) {
  const auto& c = layout_.cfg;
  const auto& P = layout_.units[0].params;
  dev_.encoder_backward(at(grads, P[0].offset), at(grads, P[1].offset), dresid_.data(), tokens_, B_, c.T, c.C);
}

void Gpt::forward_unit(int unit, const void* params, const int32_t* tokens, const int32_t* targets,
                       float* loss) {
  const auto& u = layout_.units[unit];
  switch (u.kind) {
    case UnitKind::embedding: embedding_forward(params, tokens); break;
    case UnitKind::block: block_forward(u.layer, params); break;
    case UnitKind::head: *loss = head_forward(params, targets); break;
  }
}

void Gpt::backward_unit(int unit, const void* params, void* grads, float dloss) {
  const auto& u = layout_.units[unit];
  switch (u.kind) {
    case UnitKind::embedding: embedding_backward(grads); break;
    case UnitKind::block: block_backward(u.layer, params, grads); break;
    case UnitKind::head: head_backward(params, grads, dloss); break;
  }
}

}  // namespace zf
