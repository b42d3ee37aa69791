// test_recompute.cpp: activation recomputation (--recompute none|full|attn,
// model.h): what it keeps, that it changes no bit of training, that the
// recomputed activations are really this block's (the gradient against the
// double-precision reference), and that a recorded schedule sees the
// recomputation inside each block's backward.
//
//   meson test -C build recompute
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "stages/gradient_check.h"
#include "stages/schedule_util.h"
#include "stages/stage_test_util.h"
#include "test_util.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

constexpr Recompute kModes[] = {Recompute::none, Recompute::full, Recompute::attn};

struct NamedStage {
  const char* name;
  StageFn fn;
};

std::vector<NamedStage> stages() {
  return {{"dp", train_data_parallel}, {"zero1", train_zero1}, {"zero2", train_zero2}, {"zero3", train_zero3}};
}

size_t activation_peak(const RunResult& r) { return r.ranks[0].memory.pk(Place::device, Category::activations); }

// docs/SPEC.md's "Activation recomputation", written out from the shapes:
// the device bytes of category activations a rank holds, with BT = B T
// positions and e the compute dtype's bytes per element (float32 things:
// 4 bytes).
size_t expected_activation_bytes(const ModelConfig& m, size_t B, size_t e, AttentionForm att, Recompute rc) {
  const size_t V = m.V, T = m.T, L = m.L, H = m.H, C = m.C, BT = B * T;
  const bool flash = att == AttentionForm::flash;
  // Kept whatever the mode: x_0 .. x_L (L + 1), ln_f (1), the residual
  // gradient (1), the backward scratch (9C a position); the logits; ln_f's
  // mean and rstd, lse and the losses (4 floats a position); attention's
  // scratch; the tokens and targets (int32).
  const size_t fixed = (L + 12) * BT * C * e + BT * V * e + 4 * 4 * BT + (flash ? 4 * B * H * T : 4 * T * T) +
                       2 * 4 * BT;
  // One block's: ln_1 (C), qkv (3C), atty (C), res2 (C), ln_2 (C), fch (4C),
  // fch_gelu (4C), and the two LayerNorms' mean and rstd.
  const size_t block = 15 * BT * C * e + 4 * 4 * BT;
  // What attention keeps: the probabilities, or one float per row.
  const size_t probs = flash ? 4 * B * H * T : B * H * T * T * e;
  switch (rc) {
    case Recompute::none: return fixed + L * (block + probs);
    case Recompute::full: return fixed + block + probs;
    case Recompute::attn: return flash ? fixed + L * (block + probs) : fixed + L * block + probs;
  }
  return 0;
}

// Exact: every activation is allocated once, when the model is built, so
// the peak is their sum. tiny and the odd model (C = 10, T = 13, H = 2), at
// two batch sizes, both compute dtypes and both attention forms.
TEST(RecomputeMemory, ActivationBytesMatchTheFormula) {
  for (const ModelConfig& m : {model_preset("tiny"), test::odd_model()})
    for (int B : {1, 2})
      for (DType compute : {DType::f32, DType::bf16})
        for (AttentionForm att : {AttentionForm::simple, AttentionForm::flash})
          for (Recompute rc : kModes) {
            TrainConfig cfg = test::config(m, 1, B, 1, compute == DType::bf16 ? Precision::bf16 : Precision::fp32);
            cfg.compute = compute;
            cfg.attention = att;
            cfg.recompute = rc;
            SCOPED_TRACE(m.name + " B=" + std::to_string(B) + " " + dtype_name(compute) + " " +
                         attention_form_name(att) + " recompute " + recompute_name(rc));
            const size_t got = activation_peak(run_training(cfg, train_data_parallel));
            EXPECT_EQ(got, expected_activation_bytes(m, B, dtype_size(compute), att, rc));
            if (test::print_measures())
              std::printf("%-4s B=%d %-4s %-6s %-4s activations %zu B\n", m.name.c_str(), B, dtype_name(compute),
                          attention_form_name(att), recompute_name(rc), got);
          }
}

// The activations are the rank's compute's, not the stage's: the same bytes
// in ZeRO-3 at N = 3, and on every rank.
TEST(RecomputeMemory, SameInEveryStage) {
  const ModelConfig m = model_preset("tiny");
  for (Recompute rc : kModes)
    for (const NamedStage& st : stages()) {
      TrainConfig cfg = test::config(m, 3, 2, 1, Precision::fp32);
      cfg.recompute = rc;
      const RunResult r = run_training(cfg, st.fn);
      for (const RankResult& rank : r.ranks)
        EXPECT_EQ(rank.memory.pk(Place::device, Category::activations),
                  expected_activation_bytes(m, 2, 4, AttentionForm::simple, rc))
            << st.name << " recompute " << recompute_name(rc);
    }
}

// The same kernels on the same inputs: full and attn must give none's
// losses, gradient norms and final parameters to the bit, in every stage,
// at N = 1, 2, 3 (tiny pads at 3), in both recipes, with K = 2 micro-steps
// (so the shared buffers are refilled across micro-steps too).
TEST(RecomputeParity, EveryStageBitIdenticalToNone) {
  for (Precision p : {Precision::fp32, Precision::bf16})
    for (int N : {1, 2, 3})
      for (const NamedStage& st : stages()) {
        TrainConfig cfg = test::config(model_preset("tiny"), N, 2, 3, p);
        cfg.grad_accum = 2;
        SCOPED_TRACE(std::string(st.name) + " " + test::describe(cfg));
        const RunResult none = run_training(cfg, st.fn);
        for (Recompute rc : {Recompute::full, Recompute::attn}) {
          cfg.recompute = rc;
          test::expect_bit_identical(none, run_training(cfg, st.fn), recompute_name(rc));
        }
      }
}

// The same with bf16 compute (activations stored in bf16) and with flash
// attention (full recomputes the flash forward; attn is none there).
TEST(RecomputeParity, Bf16ComputeAndFlashAttention) {
  for (const NamedStage& st : {NamedStage{"dp", train_data_parallel}, NamedStage{"zero3", train_zero3}})
    for (bool bf16 : {false, true})
      for (AttentionForm att : {AttentionForm::simple, AttentionForm::flash}) {
        TrainConfig cfg = test::config(model_preset("tiny"), 2, 2, 2, bf16 ? Precision::bf16 : Precision::fp32);
        cfg.compute = bf16 ? DType::bf16 : DType::f32;
        cfg.attention = att;
        cfg.grad_accum = 2;
        SCOPED_TRACE(std::string(st.name) + " compute " + dtype_name(cfg.compute) + " " + attention_form_name(att));
        const RunResult none = run_training(cfg, st.fn);
        for (Recompute rc : {Recompute::full, Recompute::attn}) {
          cfg.recompute = rc;
          test::expect_bit_identical(none, run_training(cfg, st.fn), recompute_name(rc));
        }
      }
}

// Bit parity with none compares two runs of this code; the gradient's value
// against the double-precision reference (gradient_check.h, its tolerances)
// checks the recomputed activations independently: a backward that used the
// shared buffers as the last forward left them (block L-1's) would give
// block 0 the wrong gradient.
TEST(RecomputeGradient, FullMatchesReference) {
  test::expect_gradient_matches_reference("dp", train_data_parallel, Recompute::full);
  test::expect_gradient_matches_reference("zero3", train_zero3, Recompute::full);
}

TEST(RecomputeGradient, AttnMatchesReference) {
  test::expect_gradient_matches_reference("dp", train_data_parallel, Recompute::attn);
  test::expect_gradient_matches_reference("zero3", train_zero3, Recompute::attn);
}

// A recorded schedule sees the recomputation of each block inside that
// block's backward, and none for the embedding and the head; without
// recomputation (or with attn on flash attention, which drops nothing) no
// such event.
TEST(RecomputeSchedule, RecomputationInsideEachBlocksBackward) {
  using Ev = ScheduleEvent;
  const ModelLayout layout = build_layout(model_preset("tiny"));
  struct Case {
    Recompute rc;
    AttentionForm att;
    bool events;
  };
  for (Case c : {Case{Recompute::full, AttentionForm::simple, true}, Case{Recompute::attn, AttentionForm::simple, true},
                 Case{Recompute::none, AttentionForm::simple, false},
                 Case{Recompute::attn, AttentionForm::flash, false}}) {
    TrainConfig cfg = test::config(model_preset("tiny"), 2, 2, 1, Precision::fp32);
    cfg.grad_accum = 2;
    cfg.recompute = c.rc;
    cfg.attention = c.att;
    SCOPED_TRACE(std::string("recompute ") + recompute_name(c.rc) + " " + attention_form_name(c.att));
    const test::RecordedRun run = test::run_recorded(cfg, train_zero3, std::chrono::microseconds(0));
    for (int r = 0; r < cfg.ranks; ++r) {
      const test::RankSchedule s(run.events[r]);
      int seen = 0;
      for (const Ev& e : s.events()) seen += e.kind == Ev::recompute_begin || e.kind == Ev::recompute_end;
      EXPECT_EQ(seen, c.events ? 2 * layout.cfg.L * cfg.grad_accum : 0) << "rank " << r;
      if (!c.events) continue;
      for (int k = 0; k < cfg.grad_accum; ++k) {
        const test::Window w = s.micro(0, k);
        for (int l = 0; l < layout.cfg.L; ++l) {
          const int u = layout.block_unit(l);
          const uint64_t bb = s.at(Ev::backward_begin, u, w), rb = s.at(Ev::recompute_begin, u, w);
          const uint64_t re = s.at(Ev::recompute_end, u, w), be = s.at(Ev::backward_end, u, w);
          EXPECT_LT(bb, rb) << "unit " << u;
          EXPECT_LT(rb, re) << "unit " << u;
          EXPECT_LT(re, be) << "unit " << u;
        }
      }
    }
  }
}

}  // namespace
}  // namespace zf
