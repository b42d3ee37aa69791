// test_model.cpp: the GPT's layout, its seeded initialisation (the same for
// any number of ranks and through --save-init / --init), the activations a
// Gpt keeps, the CPU device's bf16 emulation of the in-place cross-entropy,
// and the model's backward against finite differences end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "checkpoint.h"
#include "device.h"
#include "kernels.h"
#include "launch.h"
#include "model.h"
#include "safetensors.h"
#include "test_util.h"
#include "training.h"

namespace zf {
namespace {

size_t expected_params(const ModelConfig& c) {
  size_t C = c.C;
  size_t per_block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  return size_t(c.V) * C + size_t(c.T) * C + c.L * per_block + 2 * C + size_t(c.V) * C;
}

TEST(Layout, ParameterCountAndOrderFollowSpec) {
  for (const auto& name : model_preset_names()) {
    auto cfg = model_preset(name);
    auto layout = build_layout(cfg);
    EXPECT_EQ(layout.numel, expected_params(cfg)) << name;
    // Units are contiguous and in docs/SPEC.md order.
    size_t off = 0;
    std::vector<std::string> names;
    for (const auto& u : layout.units) {
      EXPECT_EQ(u.offset, off);
      off += u.numel;
      for (const auto& p : u.params) names.push_back(p.name);
    }
    EXPECT_EQ(names.front(), "wte.weight");
    EXPECT_EQ(names[1], "wpe.weight");
    EXPECT_EQ(names[2], "h.0.ln_1.weight");
    EXPECT_EQ(names[4], "h.0.attn.c_attn.weight");
    EXPECT_EQ(names.back(), "lm_head.weight");
    EXPECT_EQ(layout.units.size(), size_t(cfg.L + 2));
  }
  // GPT-2 124M's shape with nanoGPT's padded vocabulary (124,475,904 with a
  // tied head) plus the untied 50304 x 768 lm_head: 163,109,376.
  EXPECT_EQ(build_layout(model_preset("gpt2")).numel, size_t(124475904) + size_t(50304) * 768);
}

// --model's shapes: all five letters, or a preset with some changed; the
// name reads back to the same shape, and a shape that is a preset's is
// that preset.
TEST(Layout, AModelIsAPresetOrAShape) {
  const ModelConfig s = parse_model("L=3,C=96,H=6,T=40,V=300");
  EXPECT_EQ(std::vector<int>({s.L, s.C, s.H, s.T, s.V}), std::vector<int>({3, 96, 6, 40, 300}));
  EXPECT_EQ(s.name, "L=3,C=96,H=6,T=40,V=300");
  const ModelConfig o = parse_model("V=300,T=40,H=6,C=96,L=3");  // any order
  EXPECT_EQ(o.name, s.name);
  const ModelConfig l = parse_model("gpt-7b,V=32000,T=2048");  // Llama 2 7B's vocabulary, a shorter context
  EXPECT_EQ(std::vector<int>({l.L, l.C, l.H, l.T, l.V}), std::vector<int>({32, 4096, 32, 2048, 32000}));
  const ModelConfig back = parse_model(l.name);
  EXPECT_EQ(std::vector<int>({back.L, back.C, back.H, back.T, back.V}), std::vector<int>({32, 4096, 32, 2048, 32000}));
  // P = 2VC + TC + L(12C^2 + 13C) + 2C (docs/SPEC.md section 1), by hand for s.
  EXPECT_EQ(build_layout(s).numel, size_t(2 * 300 * 96 + 40 * 96 + 3 * (12 * 96 * 96 + 13 * 96) + 2 * 96));
  EXPECT_EQ(parse_model("L=2,C=64,H=4,T=64,V=256").name, "tiny");
  EXPECT_EQ(parse_model("tiny,T=64").name, "tiny");
  for (const char* bad : {"L=2,C=64,H=4,T=64", "tiny,", "tiny,X=3", "tiny,L=0", "tiny,L=2,L=3", "tiny,C=66",
                          "tiny,T=1e3", "tiny,T=-4", "tiny,T=", "nope,T=3", "L=2,,C=64,H=4,T=64,V=256"})
    EXPECT_THROW(parse_model(bad), UsageError) << bad;
}

TEST(Layout, DecayOnlyOnMatrices) {
  auto layout = build_layout(model_preset("tiny"));
  for (const auto& u : layout.units)
    for (const auto& p : u.params) EXPECT_EQ(p.decay, p.shape.size() >= 2) << p.name;
}

// The whole seeded model, unit by unit (what every stage's load draws in
// ranges), in consolidated order.
void seeded_model(const ModelConfig& m, uint64_t seed, const ModelLayout& layout, float* flat) {
  for (const auto& u : layout.units) init_unit_range(u, m, seed, 0, u.numel, flat + u.offset);
}

TEST(Init, StatisticsFollowSpec) {
  auto cfg = model_preset("small");
  auto layout = build_layout(cfg);
  std::vector<float> flat(layout.numel);
  seeded_model(cfg, TrainConfig{}.seed, layout, flat.data());
  for (const auto& u : layout.units)
    for (const auto& p : u.params) {
      const float* x = flat.data() + u.offset + p.offset;
      double s = 0, s2 = 0;
      for (size_t i = 0; i < p.numel; ++i) s += x[i], s2 += double(x[i]) * x[i];
      double mean = s / p.numel, sd = std::sqrt(s2 / p.numel - mean * mean);
      bool residual = p.name.find("c_proj.weight") != std::string::npos;
      if (p.shape.size() >= 2) {
        double want = residual ? 0.02 / std::sqrt(2.0 * cfg.L) : 0.02;
        // >= 16384 samples: the sample sd is within ~1% of the true one (5 sigma < 4%).
        EXPECT_NEAR(sd, want, 0.04 * want) << p.name;
        EXPECT_NEAR(mean, 0.0, 0.05 * want) << p.name;
      } else if (p.name.find(".weight") != std::string::npos) {
        EXPECT_EQ(mean, 1.0) << p.name;
        EXPECT_EQ(sd, 0.0) << p.name;
      } else {
        EXPECT_EQ(s2, 0.0) << p.name;  // biases are zero
      }
    }
}

TEST(Init, ShardedDrawingEqualsWhole) {
  // Drawing any sub-range gives the same values as drawing the whole unit:
  // what lets a ZeRO-3 rank initialise only its shard.
  auto cfg = model_preset("tiny");
  auto layout = build_layout(cfg);
  for (const auto& u : layout.units) {
    std::vector<float> whole(u.numel), part(u.numel);
    init_unit_range(u, cfg, 7, 0, u.numel, whole.data());
    size_t cut1 = u.numel / 3, cut2 = 2 * u.numel / 3 + 1;
    init_unit_range(u, cfg, 7, 0, cut1, part.data());
    init_unit_range(u, cfg, 7, cut1, cut2, part.data() + cut1);
    init_unit_range(u, cfg, 7, cut2, u.numel, part.data() + cut2);
    EXPECT_EQ(0, std::memcmp(whole.data(), part.data(), u.numel * 4)) << u.name;
  }
  // And the seed matters.
  std::vector<float> a(layout.units[0].numel), b(layout.units[0].numel);
  init_unit_range(layout.units[0], cfg, 1, 0, a.size(), a.data());
  init_unit_range(layout.units[0], cfg, 2, 0, b.size(), b.data());
  EXPECT_NE(0, std::memcmp(a.data(), b.data(), a.size() * 4));
}

TEST(Init, SameForAnyRankCountAndThroughSaveInit) {
  std::string dir = test::temp_dir();
  auto cfg = test::quiet_config("tiny", 1, 1, 0);  // 0 steps: the hash is the initial model's
  cfg.save_init = dir + "/init.safetensors";
  auto one = run_training(cfg, train_data_parallel);
  ASSERT_EQ(one.ranks.size(), 1u);
  for (int n : {2, 3, 4}) {
    auto c = test::quiet_config("tiny", n, 1, 0);
    auto run = run_training(c, train_data_parallel);
    for (const auto& r : run.ranks) EXPECT_EQ(r.param_hash, one.ranks[0].param_hash) << n << " ranks";
  }
  // The file holds exactly the seeded values, as F32 under docs/SPEC.md's names.
  auto layout = build_layout(cfg.model);
  std::vector<float> direct(layout.numel), loaded(layout.numel);
  seeded_model(cfg.model, cfg.seed, layout, direct.data());
  SafetensorsReader reader(cfg.save_init);
  EXPECT_EQ(reader.tensors().size(), size_t(3 + 12 * cfg.model.L + 2));
  load_model(cfg.save_init, layout, loaded.data());
  EXPECT_EQ(0, std::memcmp(direct.data(), loaded.data(), direct.size() * 4));
  EXPECT_EQ(hash_params(direct.data(), direct.size()), one.ranks[0].param_hash);
  // --init reads it back: a different seed is ignored, the model is the file's.
  auto c = test::quiet_config("tiny", 2, 1, 0);
  c.init = cfg.save_init;
  c.seed = 999;
  EXPECT_EQ(run_training(c, train_data_parallel).ranks[0].param_hash, one.ranks[0].param_hash);
}

// What a Gpt keeps (category activations), to the byte, in both compute
// dtypes. The head holds one [B*T, V] tensor, the logits, which the fused
// cross-entropy overwrites with their own gradient, and one float per
// position (lse): no probabilities and no V-sized scratch (an unfused head
// keeps three [B*T, V] tensors: logits, probabilities and a scratch of V + C
// per position). For gpt2 at B = 8 that is 2 x 8192 x 50304 elements less
// (1.6 GB in bf16).
TEST(Gpt, ActivationBytesKeepOneVocabSizedTensor) {
  const ModelConfig cfg{"test", 1000, 16, 2, 2, 8};  // V >> 9C: a V-sized scratch would show
  const auto layout = build_layout(cfg);
  for (DType dt : {DType::f32, DType::bf16}) {
    MemoryTracker mem;
    auto dev = make_cpu_device();
    dev->set_compute_dtype(dt);
    const int B = 3;
    Gpt gpt(layout, mem, *dev, B);
    const size_t BT = size_t(B) * cfg.T, C = cfg.C, V = cfg.V, L = cfg.L, es = dtype_size(dt);
    const size_t per_position = (L + 1) * C   // the residual stream x_0 .. x_L
                                + L * 15 * C  // per block: ln1 qkv(3) atty res2 ln2 fch(4) fch_gelu(4)
                                + C + V       // head: ln_f's output, the logits
                                + C + 9 * C;  // backward: dresid, the blocks' scratch
    const size_t att = L * size_t(B) * cfg.H * cfg.T * cfg.T;  // softmax probabilities of attention
    const size_t f32_per_position = 4 * L + 2 + 2;  // LayerNorm mean/rstd; head: lse, losses
    const size_t want = es * (BT * per_position + att) +
                        4 * (BT * f32_per_position + dev->attention_scratch_floats(B, cfg.T, cfg.H));
    EXPECT_EQ(mem.counts().cur(Place::device, Category::activations), want) << dtype_name(dt);
  }
}

// The CPU device's bf16 emulation of the fused cross-entropy: the backward
// must be the float32 kernel on the widened logits, rounded once to bf16,
// whether it writes into another buffer or in place over the logits (the
// model's call, where dlogits and logits are one pointer).
TEST(CpuDevice, Bf16CrossEntropyBackwardInPlaceRoundsOnce) {
  auto dev = make_cpu_device();
  dev->set_compute_dtype(DType::bf16);
  const int N = 5, V = 37;
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> u(-6.0f, 6.0f);
  std::vector<bf16> logits(size_t(N) * V);
  for (auto& x : logits) x = float_to_bf16(u(rng));
  const std::vector<int32_t> targets = {0, V - 1, 3, 17, 36};
  std::vector<float> lse(N), losses(N);
  dev->softmax_cross_entropy_forward(lse.data(), losses.data(), logits.data(), targets.data(), N, V);

  std::vector<float> wide(logits.size()), grad(logits.size());
  bf16_to_float(logits.data(), wide.data(), wide.size());
  softmax_cross_entropy_backward(grad.data(), wide.data(), lse.data(), targets.data(), 0.1f, N, V);
  std::vector<bf16> want(grad.size());
  float_to_bf16(grad.data(), want.data(), grad.size());

  auto same_bits = [](const std::vector<bf16>& a, const std::vector<bf16>& b) {
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].bits != b[i].bits) return ::testing::AssertionFailure() << "element " << i;
    return ::testing::AssertionSuccess();
  };
  std::vector<bf16> out(logits.size(), bf16{0xffff});  // NaN: an element left unwritten fails
  dev->softmax_cross_entropy_backward(out.data(), logits.data(), lse.data(), targets.data(), 0.1f, N, V);
  EXPECT_TRUE(same_bits(out, want)) << "out of place";
  std::vector<bf16> in_place = logits;
  dev->softmax_cross_entropy_backward(in_place.data(), in_place.data(), lse.data(), targets.data(), 0.1f, N, V);
  EXPECT_TRUE(same_bits(in_place, want)) << "in place";
}

// The whole model's backward against central differences of its loss.
TEST(Gpt, BackwardMatchesFiniteDifferences) {
  ModelConfig cfg{"test", 11, 6, 2, 2, 8};
  auto layout = build_layout(cfg);
  MemoryTracker mem;
  auto dev = make_cpu_device();
  const int B = 2;
  Gpt gpt(layout, mem, *dev, B);
  std::vector<float> params(layout.numel), grads(layout.numel, 0.0f);
  for (const auto& u : layout.units) init_unit_range(u, cfg, 3, 0, u.numel, params.data() + u.offset);
  // Larger weights than the 0.02 init, so every path carries a visible
  // gradient, but not so large that attention saturates and the loss bends
  // sharply within one finite-difference step.
  for (auto& p : params) p *= 3.0f;
  std::vector<int32_t> in(B * cfg.T), tg(B * cfg.T);
  for (size_t i = 0; i < in.size(); ++i) in[i] = int32_t((i * 7 + 3) % cfg.V), tg[i] = int32_t((i * 5 + 1) % cfg.V);

  auto loss_at = [&]() {
    float loss = 0;
    for (size_t u = 0; u < layout.units.size(); ++u)
      gpt.forward_unit(int(u), params.data() + layout.units[u].offset, in.data(), tg.data(), &loss);
    return double(loss);
  };
  loss_at();
  for (int u = int(layout.units.size()) - 1; u >= 0; --u)
    gpt.backward_unit(u, params.data() + layout.units[u].offset, grads.data() + layout.units[u].offset, 1.0f);

  // Check every 7th parameter. The loss is float32 (~1e-7 relative of ~2.5),
  // so with h = 2e-3 the difference quotient carries ~1e-4 of rounding noise
  // plus O(h^2) truncation; 2e-3 absolute + 3% relative covers both with margin
  // while a wrong wiring (a missing term, a transposed weight) is off by far more.
  int checked = 0;
  for (size_t i = 0; i < layout.numel; i += 7) {
    float saved = params[i];
    const float h = 2e-3f;
    params[i] = saved + h;
    double up = loss_at();
    params[i] = saved - h;
    double down = loss_at();
    params[i] = saved;
    double fd = (up - down) / (2.0 * h);
    EXPECT_NEAR(grads[i], fd, 2e-3 + 0.03 * std::fabs(fd)) << "parameter element " << i;
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace zf
