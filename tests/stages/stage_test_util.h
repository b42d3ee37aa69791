// stage_test_util.h: what the stage suites share (test_dp.cpp, test_zero1.cpp,
// test_zero2.cpp, test_zero3.cpp; test_checkpoint.cpp and test_compute.cpp
// for the configurations). Each stage file holds what is particular to its
// stage (its formulas: bytes, collectives, buffers); the runs, loops and
// comparisons every stage's check repeats are here, once:
//
//   configurations  odd_model(), config(), describe()
//   sizes           Sizes (shard.h's rule from the unit sizes), expected_states()
//   parity          expect_bit_identical(), expect_bit_identical_to_dp(), ...
//   memory          expect_model_states_match_formulas(), expect_peak_below(), ...
//   communication   for_each_ring_case(), expect_bytes()
//   checkpoints     expect_resume_continues_bit_for_bit(), ...
//
// The gradient tests' scaffolding (the double-precision reference, reading
// the gradient back) is in gradient_check.h, the schedule tests' (the
// recorder, the log, the cases) in schedule_util.h, the held-out loss's in
// validation_checks.h. ZF_TEST_PRINT=1 prints
// the measured values beside their tolerances.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "comm.h"
#include "data.h"
#include "dtype.h"
#include "memory_model.h"
#include "safetensors.h"
#include "test_util.h"

namespace zf::test {

inline bool print_measures() { return std::getenv("ZF_TEST_PRINT") != nullptr; }

// ================================================================== configurations

// A model whose units are not multiples of 2, 3, 4 or 8 (tiny's are all
// multiples of 64, so it pads only at N = 3): C = 10, T = 13 give units of
// (256 + 13) * 10 = 2690, 12 * 10^2 + 13 * 10 = 1330 and 10 * (256 + 2) = 2580
// elements. MemoryModel.PaddingReallyOccurs (test_memory_model.cpp) checks
// which N pad.
inline ModelConfig odd_model() { return ModelConfig{"odd", 256, 13, 2, 2, 10}; }

inline ModelConfig model_named(const std::string& name) {
  return name == "odd" ? odd_model() : model_preset(name);
}

inline RunConfig config(const ModelConfig& m, int N, int batch, int steps, Precision p) {
  RunConfig cfg = quiet_config("tiny", N, batch, steps);
  cfg.model = m;
  cfg.precision = p;
  return cfg;
}

inline std::string describe(const TrainConfig& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "model %s, N=%d, B=%d, K=%d, %s, clip %g, lr %s, weight decay %g",
                c.model.name.c_str(), c.ranks, c.batch, c.grad_accum, precision_name(c.precision), double(c.clip),
                c.schedule().describe().c_str(), double(c.weight_decay));
  return buf;
}

// A schedule whose rate changes within a short run (lr_schedule.h): one
// step of warmup (the full rate, doubled), then cosine towards a twentieth
// of it, so that steps 1 and 2 of 3 differ; and another weight decay than
// the default.
inline RunConfig with_schedule(RunConfig cfg) {
  cfg.lr = 2 * cfg.lr;
  cfg.lr_schedule = LrDecay::cosine;
  cfg.warmup = 1;
  cfg.min_lr = cfg.lr / 20;
  cfg.weight_decay = 0.05f;
  return cfg;
}

// ================================================================== sizes

// The per-unit shard arithmetic of shard.h, computed here from the unit
// sizes alone (not with make_shard_layout) so the tests check the stages
// against the rule, not against the code that implements it.
struct Sizes {
  size_t P = 0;        // the model, unpadded
  size_t padded = 0;   // sum over units of N * ceil(n_u / N)
  size_t shard = 0;    // sum over units of ceil(n_u / N)
  size_t max_padded_unit = 0, max_shard = 0;
  size_t units = 0;
  std::vector<size_t> unit_padded;  // N * ceil(n_u / N) per unit
};

inline Sizes sizes_of(const ModelConfig& m, int N) {
  Sizes s;
  const ModelLayout layout = build_layout(m);
  s.P = layout.numel;
  s.units = layout.units.size();
  for (const auto& u : layout.units) {
    const size_t S = (u.numel + N - 1) / N;
    s.shard += S;
    s.padded += N * S;
    s.max_padded_unit = std::max(s.max_padded_unit, N * S);
    s.max_shard = std::max(s.max_shard, S);
    s.unit_padded.push_back(N * S);
  }
  return s;
}

inline size_t esize(Precision p) { return p == Precision::fp32 ? 4 : 2; }   // params, grads
inline size_t osize(Precision p) { return p == Precision::fp32 ? 8 : 12; }  // moments (+ master)

// What a rank must hold at the end of a run, from the sizes alone (docs/SPEC.md's
// table with shard padding: Pp = padded, S = shard):
//   00: e P, e P, o P;  01: e Pp, e Pp, o S;  02: e Pp, e S, o S;  03: e S, e S, o S
struct States {
  size_t params, grads, optimizer;
};

inline States expected_states(Stage st, Precision p, const Sizes& s) {
  const size_t e = esize(p), o = osize(p);
  switch (st) {
    case Stage::dp: return {e * s.P, e * s.P, o * s.P};
    case Stage::zero1: return {e * s.padded, e * s.padded, o * s.shard};
    case Stage::zero2: return {e * s.padded, e * s.shard, o * s.shard};
    default: return {e * s.shard, e * s.shard, o * s.shard};
  }
}

// ================================================================== parity with stage 00

// Every rank of a run reports the same losses, gradient norms and
// parameters, and they are `ref`'s to the bit.
inline void expect_bit_identical(const RunResult& ref, const RunResult& got, const char* stage) {
  ASSERT_EQ(ref.ranks[0].grad_norms.size(), ref.ranks[0].losses.size()) << "one norm per step";
  for (size_t r = 0; r < got.ranks.size(); ++r) {
    EXPECT_EQ(got.ranks[r].losses, ref.ranks[0].losses) << stage << ", rank " << r;
    EXPECT_EQ(got.ranks[r].grad_norms, ref.ranks[0].grad_norms) << stage << ", rank " << r;
    EXPECT_EQ(got.ranks[r].param_hash, ref.ranks[0].param_hash) << stage << ", rank " << r;
    EXPECT_EQ(got.ranks[r].val_losses, ref.ranks[0].val_losses) << stage << ", rank " << r;
  }
}

// The (model, N) pairs of the bit-parity tests: tiny at N = 1 .. 4 (it pads
// at N = 3 only) and the odd model at N = 3 and 8 (every unit pads).
struct ParityCase {
  const char* model;  // "tiny" or "odd"
  int N;
};

inline std::vector<ParityCase> parity_cases() {
  return {{"tiny", 1}, {"tiny", 2}, {"tiny", 3}, {"tiny", 4}, {"odd", 3}, {"odd", 8}};
}

inline std::string parity_case_name(const ::testing::TestParamInfo<ParityCase>& info) {
  return std::string(info.param.model) + "_N" + std::to_string(info.param.N);
}

// K = 1: every stage sums the same per-rank gradients in the same rank order
// (reduce_scatter + all_gather is all_reduce bit for bit, comm.h), clips by
// an exact norm (gradnorm.h) and runs the same AdamW on each element, so the
// losses, the gradient norms and the final parameters are stage 00's to the
// bit. Both recipes, with two clip norms that really clip (ClippingBites),
// the second with a learning rate that changes within the run and the
// held-out loss before step 0 and after steps 2 and 3 (--val-every 2).
inline void expect_bit_identical_to_dp(const ParityCase& pc, const StageFn& fn, const char* stage) {
  for (Precision p : {Precision::fp32, Precision::bf16})
    for (float clip : {1.0f, 0.05f}) {
      RunConfig cfg = config(model_named(pc.model), pc.N, 1, 3, p);
      cfg.clip = clip;
      if (clip < 1.0f) {
        cfg = with_schedule(cfg);
        cfg.val_every = 2;
        cfg.val_batches = 2;
      }
      SCOPED_TRACE(describe(cfg));
      const RunResult ref = run_training(cfg, train_data_parallel);
      expect_bit_identical(ref, run_training(cfg, fn), stage);
    }
}

// Both clip norms of the parity tests really clip on tiny (its gradient
// norm is above 1 in the first steps): the update differs from no clipping.
// The logged norm is the one before clipping, computed with clipping off
// too: step 0's is the same, and above 1 as said.
inline void expect_clipping_bites(const StageFn& fn) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    RunConfig off = config(model_preset("tiny"), 2, 1, 3, p);
    off.clip = 0.0f;
    const RunResult r0 = run_training(off, fn);
    for (float clip : {1.0f, 0.05f}) {
      RunConfig on = off;
      on.clip = clip;
      const RunResult r1 = run_training(on, fn);
      EXPECT_EQ(r0.ranks[0].losses[0], r1.ranks[0].losses[0]);  // same model, same batch
      EXPECT_EQ(r0.ranks[0].grad_norms[0], r1.ranks[0].grad_norms[0]) << "clip " << clip;
      EXPECT_GT(r0.ranks[0].grad_norms[0], 1.0f);
      EXPECT_NE(r0.ranks[0].losses[2], r1.ranks[0].losses[2]) << "clip " << clip;
      EXPECT_NE(r0.ranks[0].param_hash, r1.ranks[0].param_hash) << "clip " << clip;
    }
  }
}

// The steps of a run log (docs/SPEC.md), checked as they are read: numbered
// 0, 1, ... and each carrying grad_norm. Returns the logged norms.
inline std::vector<float> logged_grad_norms(const std::string& path, int want_steps) {
  std::ifstream in(path);
  std::vector<float> logged;
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("summary")) continue;
    EXPECT_EQ(j["step"].get<int>(), steps++);
    EXPECT_TRUE(j.contains("grad_norm")) << line;
    if (j.contains("grad_norm")) logged.push_back(float(j["grad_norm"].get<double>()));
  }
  EXPECT_EQ(steps, want_steps);
  return logged;
}

// The run log: every step object carries grad_norm, the value the run
// recorded (a float32: the JSON double converts back to it exactly), and it
// is stage 00's, with clipping off too.
inline void expect_run_log_carries_the_grad_norm(const StageFn& fn) {
  const std::string dir = temp_dir();
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    RunConfig cfg = config(model_preset("tiny"), 2, 1, 3, p);
    cfg.clip = 0.0f;  // logged with clipping off too
    SCOPED_TRACE(describe(cfg));
    std::vector<std::vector<float>> logs;  // stage 00's, then the stage's
    for (const StageFn& st : {StageFn(train_data_parallel), fn}) {
      cfg.log_json = dir + "/run.jsonl";
      const RunResult run = run_training(cfg, st);
      const std::vector<float> logged = logged_grad_norms(cfg.log_json, cfg.steps);
      EXPECT_EQ(logged, run.ranks[0].grad_norms);
      for (float g : logged) EXPECT_TRUE(std::isfinite(g) && g > 0.0f) << g;
      logs.push_back(logged);
    }
    EXPECT_EQ(logs[1], logs[0]) << "vs 00 dp";
  }
  std::filesystem::remove_all(dir);
}

// Gradient accumulation, K = 2, tiny, N = 2, 3, 4, both recipes: `check`
// gets each configuration and stage 00's run of it.
inline void for_each_accumulation_case(const std::function<void(const TrainConfig&, const RunResult&)>& check) {
  for (Precision p : {Precision::fp32, Precision::bf16})
    for (int N : {2, 3, 4}) {
      RunConfig cfg = config(model_preset("tiny"), N, 1, 4, p);
      cfg.grad_accum = 2;
      SCOPED_TRACE(describe(cfg));
      check(cfg, run_training(cfg, train_data_parallel));
    }
}

// Stage 00 and ZeRO-1 accumulate each rank's full gradient over the
// micro-steps and reduce once: sum over ranks of (sum over micro-steps). So
// ZeRO-1 stays bit-identical. ZeRO-2 and ZeRO-3 reduce-scatter every
// micro-step and accumulate the reduced pieces: sum over micro-steps of (sum
// over ranks). Float addition is not associative, so a gradient element can
// differ in its last bit (fp32) or, in bf16, by one rounding of 2^-8 relative
// (the bf16 recipe rounds after every addition into a bf16 buffer). AdamW
// divides by sqrt(v), so early steps turn such differences into relative
// update differences of the same order, and a few steps of lr 3e-4 move the
// loss by far less than the tolerances (ZF_TEST_PRINT=1 prints the measured
// values):
//   fp32: tolerance 1e-5 on |loss difference| (4 steps, losses ~5.5, where
//         a float32 ulp is about 4.8e-7).
//   bf16: tolerance 5e-4.
// A wrong gradient moves the losses far more: training on another batch
// (dp, 2 ranks, K = 1 instead of 2, i.e. one micro-step of each pair
// dropped) changes the losses by far more than the tolerances.
// (A wrong constant scale of the gradient would hardly show: AdamW is
// nearly scale-invariant; the bit-identical K = 1 tests cannot catch it
// either, as every stage shares the scale: the Gradient tests check the
// gradient's value against a double-precision reference.)
// The first step's gradient norm differs only by the order in which the
// same micro-step gradients are summed. | |a| - |b| | <= |a - b|, so its
// relative difference is at most the elements' worst relative difference:
// in bf16 a couple of roundings of 2^-8 (3.9e-3 each), in fp32 a few ulps
// unless a sum cancels. Tolerances on the relative difference: 1e-6 fp32 and
// 1e-2 bf16 (above the bf16 bound).
constexpr double kAccumTolFp32 = 1e-5;
constexpr double kAccumTolBf16 = 5e-4;
constexpr double kAccumNormTolFp32 = 1e-6;
constexpr double kAccumNormTolBf16 = 1e-2;

inline void expect_accumulation_close_to_dp(const StageFn& fn, const char* stage) {
  for_each_accumulation_case([&](const TrainConfig& cfg, const RunResult& ref) {
    const Precision p = cfg.precision;
    const double tol = p == Precision::fp32 ? kAccumTolFp32 : kAccumTolBf16;
    const RunResult got = run_training(cfg, fn);
    double worst = 0;
    for (size_t s = 0; s < ref.ranks[0].losses.size(); ++s) {
      const double d = std::fabs(double(got.ranks[0].losses[s]) - double(ref.ranks[0].losses[s]));
      worst = std::max(worst, d);
      EXPECT_NEAR(got.ranks[0].losses[s], ref.ranks[0].losses[s], tol) << "step " << s;
    }
    // The first step's loss comes from the initial model: identical.
    EXPECT_EQ(got.ranks[0].losses[0], ref.ranks[0].losses[0]);
    // Its gradient too, but summed in another order.
    const double n0 = ref.ranks[0].grad_norms[0], rel = std::fabs(got.ranks[0].grad_norms[0] - n0) / n0;
    EXPECT_LE(rel, p == Precision::fp32 ? kAccumNormTolFp32 : kAccumNormTolBf16) << "step 0 grad norm";
    for (const auto& r : got.ranks) {
      EXPECT_EQ(r.losses, got.ranks[0].losses);
      EXPECT_EQ(r.grad_norms, got.ranks[0].grad_norms);
      EXPECT_EQ(r.param_hash, got.ranks[0].param_hash);
    }
    if (print_measures())
      std::printf("K=2 %s %s N=%d: max |loss - dp loss| = %.3g, step 0 grad norm rel diff %.3g\n", stage,
                  precision_name(p), cfg.ranks, worst, rel);
  });
}

// ================================================================== memory

// The model states a stage holds at the end of a run, every rank, both
// recipes, tiny at N = 1 .. 4 and the odd model at N = 3 and 8: exactly
// expected_states(), which memory_model.h computes too, and docs/SPEC.md's
// unpadded formula plus at most the padding.
inline void expect_model_states_match_formulas(Stage stage, const StageFn& fn) {
  for (const ParityCase& c : parity_cases())
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      const ModelConfig m = model_named(c.model);
      const Sizes s = sizes_of(m, c.N);
      const RunConfig cfg = config(m, c.N, 1, 1, p);
      SCOPED_TRACE(describe(cfg));
      const RunResult run = run_training(cfg, fn);
      const States want = expected_states(stage, p, s);
      // memory_model.h says the same (exact integers in double here).
      const ModelStateBytes mm = model_state_bytes(stage, p, padded_sizes(build_layout(m), c.N));
      EXPECT_EQ(mm.device.params, double(want.params));
      EXPECT_EQ(mm.device.grads, double(want.grads));
      EXPECT_EQ(mm.device.optimizer, double(want.optimizer));
      // docs/SPEC.md's unpadded table, 16P ... 16P/N: the stage holds that plus
      // at most the padding (N - 1 elements per unit, at 16 bytes each).
      const double spec = model_state_bytes(stage, p, unpadded_sizes(double(s.P), c.N)).device.total();
      for (size_t r = 0; r < run.ranks.size(); ++r) {
        const MemoryCounts& mem = run.ranks[r].memory;
        EXPECT_EQ(mem.cur(Place::device, Category::params), want.params) << "rank " << r;
        EXPECT_EQ(mem.cur(Place::device, Category::grads), want.grads) << "rank " << r;
        EXPECT_EQ(mem.cur(Place::device, Category::optimizer), want.optimizer) << "rank " << r;
        EXPECT_EQ(mem.model_states(Place::device), want.params + want.grads + want.optimizer);
        EXPECT_EQ(mem.model_states(Place::host), 0u);
        // Temporary buffers (gathered parameters, gradient buckets) are all released.
        EXPECT_EQ(mem.cur(Place::device, Category::comm), 0u) << "rank " << r;
        EXPECT_GE(double(mem.model_states(Place::device)), spec - 1e-6);
        EXPECT_LE(double(mem.model_states(Place::device)), spec + 16.0 * double(s.units * (c.N - 1)) + 1e-6);
      }
    }
}

// The peak device bytes fall stage by stage: `fn`'s is below the stage
// before's, `before`. small preset, 4 ranks, one sequence per rank, so model
// states are most of the peak; activations are the same in every stage (the
// same Gpt, the same batch). ZF_TEST_PRINT=1 prints the peaks.
inline void expect_peak_below(const StageFn& before, const char* before_name, const StageFn& fn,
                              const char* stage) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const RunConfig cfg = config(model_preset("small"), 4, 1, 1, p);
    SCOPED_TRACE(describe(cfg));
    const MemoryCounts prev = run_training(cfg, before).ranks[0].memory;
    const MemoryCounts mem = run_training(cfg, fn).ranks[0].memory;
    if (print_measures())
      for (const auto& [name, m] : {std::pair{before_name, &prev}, std::pair{stage, &mem}})
        std::printf("small N=4 B=1 %s %s: peak device %zu bytes (activations %zu)\n", precision_name(p), name,
                    m->peak_total[int(Place::device)], m->pk(Place::device, Category::activations));
    EXPECT_LT(mem.peak_total[int(Place::device)], prev.peak_total[int(Place::device)])
        << stage << " vs " << before_name;
    EXPECT_EQ(mem.pk(Place::device, Category::activations), prev.pk(Place::device, Category::activations))
        << stage << " vs " << before_name;
  }
}

// The configurations of the communication-buffer tests (category comm):
// tiny at N = 1 and 3, small at N = 4, the odd model at N = 8, both recipes,
// K = 2, two steps. `check` gets the sizes, the configuration and `fn`'s run.
inline void for_each_comm_buffer_case(
    const StageFn& fn, const std::function<void(const Sizes&, const TrainConfig&, const RunResult&)>& check) {
  struct Case {
    const char* model;
    int N;
  };
  for (Case c : {Case{"tiny", 1}, Case{"tiny", 3}, Case{"small", 4}, Case{"odd", 8}})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      const ModelConfig m = model_named(c.model);
      RunConfig cfg = config(m, c.N, 1, 2, p);
      cfg.grad_accum = 2;
      SCOPED_TRACE(describe(cfg));
      check(sizes_of(m, c.N), cfg, run_training(cfg, fn));
    }
}

// ================================================================== communication

// Ring-model bytes (comm.h): all_reduce 2(N-1)/N of the buffer, reduce_scatter
// and all_gather (N-1)/N of the full buffer. One configuration of the
// ring-byte tests, and the bytes its collectives move:
struct RingCase {
  RunConfig cfg;
  Sizes s;
  int steps = 0, K = 1;
  double loss = 0;  // the loss all-reduce (1 float32), per step
  double norm = 0;  // the gradient norm's exact accumulator (20 int64 limbs, gradnorm.h), per step
  double ar00 = 0;  // stage 00's all-reduce of the P unpadded gradients
  double rs = 0;    // a reduce-scatter of the padded model
  double ag = 0;    // an all-gather of the padded model
  double pad = 0;   // over the run: what an all-reduce of the padded model moves beyond one of P
  double t00 = 0;   // stage 00's whole run: steps * (ar00 + loss), as test_dp.cpp checks
};

// Runs `fn` on tiny at N = 2, 3, 4, both recipes, clipping on and off, K = 1
// and 2, two steps; every rank must move the same bytes, and `check` gets
// the case and rank 0's counters.
inline void for_each_ring_case(const StageFn& fn, const std::function<void(const RingCase&, const CommStats&)>& check) {
  const int steps = 2;
  for (int N : {2, 3, 4})
    for (Precision p : {Precision::fp32, Precision::bf16})
      for (float clip : {1.0f, 0.0f})
        for (int K : {1, 2}) {
          RingCase c;
          c.s = sizes_of(model_preset("tiny"), N);
          c.cfg = config(model_preset("tiny"), N, 1, steps, p);
          c.cfg.clip = clip;
          c.cfg.grad_accum = K;
          SCOPED_TRACE(describe(c.cfg));
          const double e = double(esize(p)), f = double(N - 1) / N;
          c.steps = steps;
          c.K = K;
          c.loss = 2 * f * 4;
          c.norm = 2 * f * 8 * 20;
          c.ar00 = 2 * f * e * double(c.s.P);
          c.rs = c.ag = f * e * double(c.s.padded);
          c.pad = steps * 2 * f * e * double(c.s.padded - c.s.P);
          c.t00 = steps * (c.ar00 + c.loss);
          EXPECT_LE(double(c.s.padded - c.s.P), double(c.s.units * (N - 1)));  // at most N - 1 per unit
          const RunResult run = run_training(c.cfg, fn);
          for (const auto& r : run.ranks) EXPECT_EQ(r.comm.bytes, run.ranks[0].comm.bytes);
          check(c, run.ranks[0].comm);
        }
}

inline void expect_bytes(double got, double want, const char* what) {
  EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, want)) << what;
}

// The bytes a run moves per kind of collective (0 for a kind it never issues).
struct RingBytes {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0;
};

inline void expect_ring_bytes(const CommStats& got, const RingBytes& want) {
  expect_bytes(got.bytes[int(CollectiveKind::all_reduce)], want.all_reduce, "all_reduce");
  expect_bytes(got.bytes[int(CollectiveKind::reduce_scatter)], want.reduce_scatter, "reduce_scatter");
  expect_bytes(got.bytes[int(CollectiveKind::all_gather)], want.all_gather, "all_gather");
}

// ================================================================== checkpoints

// The losses of steps [from, end) of a run that started at step 0.
inline std::vector<float> tail(const RunResult& r, int from) {
  const auto& l = r.ranks[0].losses;
  return std::vector<float>(l.begin() + from, l.end());
}

// A run stopped after 3 steps and resumed to 7 trains as 7 steps in one go,
// bit for bit (the checkpoint holds AdamW's float32 state and the step; the
// batches depend on the step alone): both recipes, N = 2 and 3 (padding),
// K = 2 at N = 3. Files go to `dir`.
inline void expect_resume_continues_bit_for_bit(const StageFn& fn, const std::string& dir) {
  for (Precision prec : {Precision::fp32, Precision::bf16})
    for (int N : {2, 3}) {
      SCOPED_TRACE(std::string(precision_name(prec)) + " N=" + std::to_string(N));
      RunConfig cfg = quiet_config("tiny", N, 2, 7);
      cfg.precision = prec;
      cfg.grad_accum = N == 3 ? 2 : 1;
      const RunResult whole = run_training(cfg, fn);

      RunConfig first = cfg;
      first.steps = 3;
      first.save = dir + "/ck.safetensors";
      run_training(first, fn);
      EXPECT_EQ(CheckpointReader(first.save, build_layout(cfg.model)).step(), 3);

      RunConfig second = cfg;
      second.resume = first.save;
      const RunResult resumed = run_training(second, fn);
      ASSERT_EQ(resumed.ranks[0].losses.size(), 4u);
      EXPECT_EQ(resumed.ranks[0].first_step, 3);
      EXPECT_EQ(resumed.ranks[0].losses, tail(whole, 3));
      for (const auto& rank : resumed.ranks) EXPECT_EQ(rank.param_hash, whole.ranks[0].param_hash);
    }
}

// A rank fails in step 5 of 6 with --save-every 2: the file holds step 4
// (saved after steps 2 and 4 completed, the second replacing the first; a
// save after every step would have left 5), and resuming from it finishes
// the run as if nothing had happened, its learning-rate schedule included.
inline void expect_save_every_keeps_work_when_a_rank_fails(const StageFn& fn, const std::string& dir) {
  RunConfig cfg = with_schedule(quiet_config("tiny", 2, 2, 6));
  const RunResult whole = run_training(cfg, fn);
  RunConfig failing = cfg;
  failing.save = dir + "/ck.safetensors";
  failing.save_every = 2;
  failing.fault_rank = 1;
  failing.fault_step = 5;
  EXPECT_THROW(run_training(failing, fn), Error);
  EXPECT_EQ(CheckpointReader(failing.save, build_layout(cfg.model)).step(), 4);
  RunConfig resume = cfg;
  resume.resume = failing.save;
  const RunResult rest = run_training(resume, fn);
  EXPECT_EQ(rest.ranks[0].losses, tail(whole, 4));
  EXPECT_EQ(rest.ranks[0].param_hash, whole.ranks[0].param_hash);
}

// Saving may move data between ranks (the ZeRO stages gather every sharded
// moment and parameter to write the consolidated file; every stage waits at
// a barrier for --save-init's file), but the run's communication is
// training's alone: the same bytes and calls with and without --save-init
// and --save, saving after every step.
inline void expect_saving_is_not_counted_as_training_traffic(const StageFn& fn, const std::string& dir) {
  RunConfig cfg = quiet_config("tiny", 2, 2, 4);
  const RunResult plain = run_training(cfg, fn);
  cfg.save = dir + "/ck.safetensors";
  cfg.save_every = 1;
  cfg.save_init = dir + "/init.safetensors";
  const RunResult saving = run_training(cfg, fn);
  EXPECT_EQ(saving.ranks[0].comm.bytes, plain.ranks[0].comm.bytes);
  EXPECT_EQ(saving.ranks[0].comm.calls, plain.ranks[0].comm.calls);
}

// --init FILE starts a stage from the model in the file: the same losses and
// final hash as stage 00 trained from the same initial model without the
// file (the file is stage 00's --save-init of another seed, at another
// number of ranks). At N = 3 on the odd model every unit is padded, so a
// stage that loads its pieces of the file from the wrong place (its master
// in the bf16 recipe, its parameters in ZeRO-3) is seen.
inline void expect_init_starts_from_the_file(const StageFn& fn, const std::string& dir) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    RunConfig writer = config(odd_model(), 2, 2, 1, p);
    writer.seed = 7;
    writer.save_init = dir + "/init.safetensors";
    run_training(writer, train_data_parallel);
    RunConfig seeded = config(odd_model(), 3, 2, 3, p);
    seeded.seed = 7;
    const RunResult want = run_training(seeded, train_data_parallel);
    RunConfig cfg = config(odd_model(), 3, 2, 3, p);  // the default seed: only the file gives seed 7's model
    cfg.init = writer.save_init;
    const RunResult got = run_training(cfg, fn);
    EXPECT_EQ(got.ranks[0].losses, want.ranks[0].losses) << precision_name(p);
    for (const auto& rank : got.ranks) EXPECT_EQ(rank.param_hash, want.ranks[0].param_hash) << precision_name(p);
  }
}

}  // namespace zf::test
