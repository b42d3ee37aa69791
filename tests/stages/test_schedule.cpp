// test_schedule.cpp: every stage overlaps communication with compute the way
// its loop says it does, issues the collectives its design predicts, and
// peaks in communication buffers at the bound its README states.
//
// Bit parity between stages (test_zero.cpp) proves they compute the same
// numbers; it is blind to the schedule: a stage that waits for every
// collective as soon as it issues it, or gathers a unit only when it needs
// it, gives the same bits. Here each stage runs under the schedule recorder
// (common/comm/comm_recording.h, tests/stages/schedule_util.h), which logs per rank,
// in one order, when each collective is issued, waited for and completed, and
// when each unit's forward and backward begin and end. The tests assert that
// order, never times. Half of the cases also hold every collective's
// completion back by a few milliseconds, so a collective really is in flight
// while the next unit computes: the order the stages produce does not
// depend on it, and the results do not change (RecorderChangesNothing).
//
// Sizes come from the model alone, by shard.h's rule (n_u elements in unit
// u, S_u = ceil(n_u / N) per rank, N * S_u padded), not from make_shard_layout.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "comm_recording.h"
#include "comm_threads.h"
#include "data_parallel.h"
#include "gradnorm.h"
#include "schedule_util.h"
#include "test_util.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

using test::Collective;
using test::kNever;
using test::RankSchedule;
using test::RecordedRun;
using test::Window;
using Ev = ScheduleEvent;

enum class StageId { dp, zero1, zero2, zero3 };
const char* stage_name(StageId s) {
  switch (s) {
    case StageId::dp: return "dp";
    case StageId::zero1: return "zero1";
    case StageId::zero2: return "zero2";
    case StageId::zero3: return "zero3";
  }
  return "?";
}
StageFn stage_fn(StageId s) {
  switch (s) {
    case StageId::dp: return train_data_parallel;
    case StageId::zero1: return train_zero1;
    case StageId::zero2: return train_zero2;
    case StageId::zero3: return train_zero3;
  }
  return {};
}
constexpr StageId kStages[] = {StageId::dp, StageId::zero1, StageId::zero2, StageId::zero3};

struct Case {
  int N, K;
  Precision precision;
  int delay_us;  // each collective's completion held back this long (0: as the backend finishes)
  float clip;    // 0: no clipping (the norm is still computed: it is logged)
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  char buf[64];
  std::snprintf(buf, sizeof buf, "n%d_k%d_%s_%s%s", c.N, c.K, precision_name(c.precision),
                c.delay_us ? "delay" : "nodelay", c.clip > 0 ? "" : "_noclip");
  return buf;
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name({c, 0}); }

constexpr int kSteps = 2;

TrainConfig config_of(const Case& c) {
  TrainConfig cfg = test::quiet_config("tiny", c.N, 1, kSteps);
  cfg.grad_accum = c.K;
  cfg.precision = c.precision;
  cfg.clip = c.clip;
  return cfg;
}

// Unit sizes of the model at N ranks, and the bytes of one element of the
// parameters and gradients the collectives move.
struct Units {
  int U = 0;
  std::vector<size_t> n, S, padded;
  size_t b = 4;
  DType dt = DType::f32;
  // padded size of unit u, 0 for a unit that does not exist (u < 0, u >= U)
  size_t pad(int u) const { return u < 0 || u >= U ? 0 : padded[u]; }
};

Units units_of(const TrainConfig& cfg) {
  Units s;
  const ModelLayout layout = build_layout(cfg.model);
  s.U = int(layout.units.size());
  for (const auto& u : layout.units) {
    const size_t S = (u.numel + cfg.ranks - 1) / cfg.ranks;
    s.n.push_back(u.numel);
    s.S.push_back(S);
    s.padded.push_back(S * cfg.ranks);
  }
  s.dt = storage_dtype(cfg.precision);
  s.b = dtype_size(s.dt);
  return s;
}

// One recorded run per (stage, case), shared by the tests below.
const RecordedRun& recorded(StageId stage, const Case& c) {
  static std::map<std::string, RecordedRun> runs;
  const std::string key = std::string(stage_name(stage)) + "/" + case_name({c, 0});
  auto it = runs.find(key);
  if (it == runs.end())
    it = runs.emplace(key, test::run_recorded(config_of(c), stage_fn(stage), std::chrono::microseconds(c.delay_us)))
             .first;
  return it->second;
}

// The scalar all-reduces of a step, apart from the model's collectives: the
// loss (global_mean_loss: one float32, every stage) and the gradient norm's
// exact accumulator (all_reduce of a SumOfSquares: kLimbs int64 limbs,
// ZeRO-1/2/3, with or without clipping, since grad_norm is logged; data
// parallel has the whole gradient and reduces nothing).
bool is_loss(const Collective& c) { return c.is(CollectiveKind::all_reduce, DType::f32, 1); }
bool is_norm(const Collective& c) { return c.is(CollectiveKind::all_reduce, DType::i64, SumOfSquares::kLimbs); }

// Prints the events of `w` once, when the test has failed, and says whether it has.
bool failed_dump(const RankSchedule& s, Window w, int rank, int step) {
  if (!::testing::Test::HasFailure()) return false;
  ADD_FAILURE() << "rank " << rank << ", step " << step << ", events [" << w.begin << ", " << w.end << "):\n"
                << s.dump(w);
  return true;
}

// The gradient collectives of one backward, issued in unit order U-1 .. 0:
// each one issued once unit u's backward has ended and before unit u-1's
// begins, and first waited for only after unit u-1's backward has ended, so
// it is in flight during all of it.
void expect_overlaps_backward(const RankSchedule& s, Window w, const std::vector<const Collective*>& grads,
                              const Units& us) {
  for (int u = us.U - 1; u >= 0; --u) {
    const Collective& c = *grads[us.U - 1 - u];
    EXPECT_GT(c.issued, s.at(Ev::backward_end, u, w)) << "unit " << u << ": " << describe(c);
    if (u == 0) continue;
    EXPECT_LT(c.issued, s.at(Ev::backward_begin, u - 1, w))
        << "unit " << u << "'s " << describe(c) << " is issued after unit " << u - 1 << "'s backward begins";
    EXPECT_GT(c.first_wait(), s.at(Ev::backward_end, u - 1, w))
        << "unit " << u << "'s " << describe(c) << " is waited for before unit " << u - 1
        << "'s backward has ended";
  }
}

class Schedule : public ::testing::TestWithParam<Case> {};

// ------------------------------------------------------------------ the log itself

// Whatever the stage: one counter per rank (seq = position), every collective
// issued, completed and waited for, in that causal order, and every rank
// issuing the same collectives in the same order (comm.h's contract).
TEST_P(Schedule, LogIsConsistent) {
  for (StageId stage : kStages) {
    SCOPED_TRACE(stage_name(stage));
    const RecordedRun& run = recorded(stage, GetParam());
    std::vector<std::vector<std::string>> calls(run.events.size());
    for (size_t r = 0; r < run.events.size(); ++r) {
      RankSchedule s(run.events[r]);
      ASSERT_FALSE(s.events().empty()) << "rank " << r;
      for (size_t i = 0; i < s.events().size(); ++i) ASSERT_EQ(s.events()[i].seq, i);
      int open = -1;  // forward/backward of one unit at a time, begin before end
      for (const Ev& e : s.events()) {
        if (e.kind == Ev::forward_begin || e.kind == Ev::backward_begin) {
          EXPECT_EQ(open, -1) << describe(e);
          open = e.unit;
        } else if (e.kind == Ev::forward_end || e.kind == Ev::backward_end) {
          EXPECT_EQ(open, e.unit) << describe(e);
          open = -1;
        }
      }
      for (const Collective& c : s.collectives()) {
        ASSERT_NE(c.issued, kNever) << "collective id " << c.id;
        EXPECT_NE(c.completed, kNever) << describe(c);
        EXPECT_GT(c.completed, c.issued) << describe(c);
        ASSERT_FALSE(c.waits.empty()) << describe(c) << " is never waited for";
        EXPECT_GT(c.first_wait(), c.issued) << describe(c);
        calls[r].push_back(std::string(collective_name(c.kind)) + " " + std::to_string(c.count) + " " +
                           dtype_name(c.dtype));
      }
      // Nothing before the first micro-step: the initial model is computed, not communicated.
      EXPECT_TRUE(s.issued_in(Window{0, s.micro(0, 0).begin}).empty());
    }
    for (size_t r = 1; r < calls.size(); ++r) EXPECT_EQ(calls[r], calls[0]) << "rank " << r;
  }
}

// ------------------------------------------------------------------ what each stage overlaps

// Stage 00: no collective on the micro-steps before the last (the gradient
// accumulates locally); on the last, unit u's all-reduce is issued as soon as
// its backward ends, before unit u-1's backward starts, and waited for only
// after unit u-1's backward has ended.
TEST_P(Schedule, DpAllReduceOverlapsBackward) {
  const Case& c = GetParam();
  const RecordedRun& run = recorded(StageId::dp, c);
  const Units us = units_of(config_of(c));
  for (int r = 0; r < c.N; ++r) {
    RankSchedule s(run.events[r]);
    for (int step = 0; step < kSteps; ++step) {
      for (int k = 0; k + 1 < c.K; ++k) EXPECT_TRUE(s.issued_in(s.micro(step, k)).empty()) << "micro " << k;
      const Window w = s.micro(step, c.K - 1);
      const auto cs = s.issued_in(w);
      ASSERT_GE(int(cs.size()), us.U + 1);
      for (int u = us.U - 1; u >= 0; --u)
        EXPECT_TRUE(cs[us.U - 1 - u]->is(CollectiveKind::all_reduce, us.dt, us.n[u])) << describe(*cs[us.U - 1 - u]);
      expect_overlaps_backward(s, w, {cs.begin(), cs.begin() + us.U}, us);
      // The loss is reduced once every gradient is waited for.
      EXPECT_TRUE(is_loss(*cs[us.U]));
      for (int i = 0; i < us.U; ++i) EXPECT_LT(cs[i]->first_wait(), cs[us.U]->issued);
      if (failed_dump(s, w, r, step)) return;
    }
  }
}

// After the last micro-step of ZeRO-1 and ZeRO-2: the loss, the norm, then one all-gather per unit of the updated pieces. The
// update needs the clipping coefficient, hence the norm; the gathers come
// after it, and the next step's forward only once every one is waited for.
void expect_gathers_after_update(const RankSchedule& s, const Case& c, const Units& us, int step,
                                 const std::vector<const Collective*>& after) {
  ASSERT_GE(int(after.size()), 2 + us.U);
  EXPECT_TRUE(is_loss(*after[0])) << describe(*after[0]);
  EXPECT_TRUE(is_norm(*after[1])) << describe(*after[1]);
  const Collective& last_scalar = *after[1];
  for (int u = 0; u < us.U; ++u) {
    const Collective& g = *after[2 + u];
    EXPECT_TRUE(g.is(CollectiveKind::all_gather, us.dt, us.S[u])) << describe(g);
    EXPECT_GT(g.issued, last_scalar.first_wait()) << "unit " << u << "'s " << describe(g);
    if (step + 1 < kSteps) {
      EXPECT_LT(g.first_wait(), s.at(Ev::forward_begin, 0, s.micro(step + 1, 0)));
    }
  }
}

// Stage 01: as stage 00, with reduce-scatters; the all-gathers after the update.
TEST_P(Schedule, Zero1ReduceScatterOverlapsBackward) {
  const Case& c = GetParam();
  const RecordedRun& run = recorded(StageId::zero1, c);
  const Units us = units_of(config_of(c));
  for (int r = 0; r < c.N; ++r) {
    RankSchedule s(run.events[r]);
    for (int step = 0; step < kSteps; ++step) {
      for (int k = 0; k + 1 < c.K; ++k) EXPECT_TRUE(s.issued_in(s.micro(step, k)).empty()) << "micro " << k;
      const Window w = s.micro(step, c.K - 1);
      const auto cs = s.issued_in(w);
      ASSERT_GE(int(cs.size()), us.U);
      for (int u = us.U - 1; u >= 0; --u)
        EXPECT_TRUE(cs[us.U - 1 - u]->is(CollectiveKind::reduce_scatter, us.dt, us.S[u])) << describe(*cs[us.U - 1 - u]);
      expect_overlaps_backward(s, w, {cs.begin(), cs.begin() + us.U}, us);
      expect_gathers_after_update(s, c, us, step, {cs.begin() + us.U, cs.end()});
      if (failed_dump(s, w, r, step)) return;
    }
  }
}

// Stage 02: on every micro-step, unit u's reduce-scatter is in flight (issued,
// not waited for) while unit u-1's backward runs, and exactly one is in
// flight when a backward (but the first) begins: the one of the unit after.
// The micro-step waits for all of them before the next one loads. Its comm
// bytes then: unit u's gradient buffer and unit u+1's, being reduced.
TEST_P(Schedule, Zero2ReduceScatterInFlightEveryMicroStep) {
  const Case& c = GetParam();
  const RecordedRun& run = recorded(StageId::zero2, c);
  const Units us = units_of(config_of(c));
  for (int r = 0; r < c.N; ++r) {
    RankSchedule s(run.events[r]);
    for (int step = 0; step < kSteps; ++step) {
      for (int k = 0; k < c.K; ++k) {
        const Window w = s.micro(step, k);
        const auto cs = s.issued_in(w);
        ASSERT_GE(int(cs.size()), us.U);
        for (int u = us.U - 1; u >= 0; --u)
          EXPECT_TRUE(cs[us.U - 1 - u]->is(CollectiveKind::reduce_scatter, us.dt, us.S[u]))
              << describe(*cs[us.U - 1 - u]);
        expect_overlaps_backward(s, w, {cs.begin(), cs.begin() + us.U}, us);
        for (int u = us.U - 1; u >= 0; --u) {
          const uint64_t begin = s.at(Ev::backward_begin, u, w);
          EXPECT_EQ(s.in_flight_at(begin), u == us.U - 1 ? 0 : 1) << "at unit " << u << "'s backward";
          EXPECT_EQ(s.events()[begin].comm_bytes, us.b * (us.pad(u) + us.pad(u + 1))) << "unit " << u;
          EXPECT_EQ(s.events()[s.at(Ev::forward_begin, u, w)].comm_bytes, 0u) << "unit " << u;
        }
        if (k + 1 == c.K) {
          ASSERT_GT(int(cs.size()), us.U);
        }
        const uint64_t done_by = k + 1 < c.K ? w.end : cs[us.U]->issued;  // next load, or the loss
        for (int i = 0; i < us.U; ++i) EXPECT_LT(cs[i]->first_wait(), done_by) << describe(*cs[i]);
        if (k + 1 == c.K) expect_gathers_after_update(s, c, us, step, {cs.begin() + us.U, cs.end()});
        if (failed_dump(s, w, r, step)) return;
      }
    }
  }
}

// Stage 03: on every micro-step, unit u+1's all-gather is issued before unit
// u's forward begins and waited for only after it has ended; unit u-1's
// before unit u's backward begins, likewise; the gradients go as in stage 02.
// At most two units are gathered at any compute: the comm bytes at each
// forward are units u and u+1's parameters, at each backward units u-1 and
// u's parameters plus unit u's and u+1's gradient buffers.
TEST_P(Schedule, Zero3PrefetchesOneUnitAhead) {
  const Case& c = GetParam();
  const RecordedRun& run = recorded(StageId::zero3, c);
  const Units us = units_of(config_of(c));
  const int U = us.U;
  ASSERT_EQ(kZero3MaxGatheredUnits, 2);
  for (int r = 0; r < c.N; ++r) {
    RankSchedule s(run.events[r]);
    for (int step = 0; step < kSteps; ++step) {
      for (int k = 0; k < c.K; ++k) {
        const Window w = s.micro(step, k);
        std::vector<const Collective*> gathers, grads, rest;
        for (const Collective* x : s.issued_in(w)) {
          if (x->kind == CollectiveKind::all_gather && int(gathers.size()) < 2 * U)
            gathers.push_back(x);
          else if (x->kind == CollectiveKind::reduce_scatter)
            grads.push_back(x);
          else
            rest.push_back(x);  // the scalars, and after the last step the final gather
        }
        ASSERT_EQ(int(gathers.size()), 2 * U);
        ASSERT_EQ(int(grads.size()), U);
        // Forward gathers in unit order 0 .. U-1, then the backward's U-1 .. 0.
        auto fwd = [&](int u) -> const Collective& { return *gathers[u]; };
        auto bwd = [&](int u) -> const Collective& { return *gathers[U + (U - 1 - u)]; };
        for (int u = 0; u < U; ++u) {
          EXPECT_TRUE(fwd(u).is(CollectiveKind::all_gather, us.dt, us.S[u])) << describe(fwd(u));
          EXPECT_TRUE(bwd(u).is(CollectiveKind::all_gather, us.dt, us.S[u])) << describe(bwd(u));
          EXPECT_TRUE(grads[U - 1 - u]->is(CollectiveKind::reduce_scatter, us.dt, us.S[u])) << describe(*grads[U - 1 - u]);
        }
        for (int u = 0; u < U; ++u) {
          const uint64_t fb = s.at(Ev::forward_begin, u, w), fe = s.at(Ev::forward_end, u, w);
          EXPECT_LT(fwd(u).first_wait(), fb);
          if (u + 1 < U) {
            EXPECT_LT(fwd(u + 1).issued, fb) << "unit " << u + 1 << " is not gathered before unit " << u
                                             << "'s forward begins";
            EXPECT_GT(fwd(u + 1).first_wait(), fe) << "unit " << u + 1 << "'s gather is waited for during unit "
                                                   << u << "'s forward";
          }
          EXPECT_EQ(s.events()[fb].comm_bytes, us.b * (us.pad(u) + us.pad(u + 1))) << "forward of unit " << u;
        }
        for (int u = U - 1; u >= 0; --u) {
          const uint64_t bb = s.at(Ev::backward_begin, u, w), be = s.at(Ev::backward_end, u, w);
          EXPECT_LT(bwd(u).first_wait(), bb);
          if (u > 0) {
            EXPECT_LT(bwd(u - 1).issued, bb) << "unit " << u - 1 << " is not gathered before unit " << u
                                             << "'s backward begins";
            EXPECT_GT(bwd(u - 1).first_wait(), be) << "unit " << u - 1 << "'s gather is waited for during unit "
                                                   << u << "'s backward";
          }
          EXPECT_EQ(s.events()[bb].comm_bytes, us.b * (us.pad(u - 1) + 2 * us.pad(u) + us.pad(u + 1)))
              << "backward of unit " << u;
        }
        expect_overlaps_backward(s, w, grads, us);
        // Nothing is left gathered or being reduced between micro-steps.
        EXPECT_EQ(s.events()[w.begin].comm_bytes, 0u);
        // No all-gather after the update: the loss and the norm only (and,
        // after the last step, the final gather of the model for its hash).
        if (k + 1 == c.K) {
          const size_t scalars = 2;
          ASSERT_GE(rest.size(), scalars);
          EXPECT_TRUE(is_loss(*rest[0]));
          EXPECT_TRUE(is_norm(*rest[1]));
          EXPECT_EQ(rest.size(), scalars + (step + 1 == kSteps ? U : 0));
        } else {
          EXPECT_TRUE(rest.empty());
        }
        if (failed_dump(s, w, r, step)) return;
      }
    }
  }
}

// ------------------------------------------------------------------ how many collectives

// Per step, per rank, each stage's collectives against its formula, with U
// units and K micro-steps:
//   stage     all_reduce (model)  reduce_scatter   all_gather
//   00 dp     U                   0                0             (on the last micro-step)
//   01 zero1  0                   U                U             (after the update)
//   02 zero2  0                   U·K              U
//   03 zero3  0                   U·K              2·U·K         (before each forward and backward)
// plus the scalar all-reduces: one for the loss (every stage), one for the
// gradient norm's limbs (ZeRO-1/2/3, clipping or not; 0 in dp, which has the
// whole gradient). After the last step the ZeRO stages gather the model once
// more (U float32 all-gathers, for the parameter hash), outside the counters.
TEST_P(Schedule, CollectiveCountsPerStep) {
  const Case& c = GetParam();
  const Units us = units_of(config_of(c));
  const int U = us.U, K = c.K;
  const int norm = 1;  // with or without clipping: grad_norm is logged
  struct Expect {
    int model_all_reduce, reduce_scatter, all_gather, loss, norm;
  };
  for (StageId stage : kStages) {
    SCOPED_TRACE(stage_name(stage));
    Expect e{};
    switch (stage) {
      case StageId::dp: e = {U, 0, 0, 1, 0}; break;
      case StageId::zero1: e = {0, U, U, 1, norm}; break;
      case StageId::zero2: e = {0, U * K, U, 1, norm}; break;
      case StageId::zero3: e = {0, U * K, 2 * U * K, 1, norm}; break;
    }
    const RecordedRun& run = recorded(stage, c);
    for (int r = 0; r < c.N; ++r) {
      RankSchedule s(run.events[r]);
      for (int step = 0; step < kSteps; ++step) {
        Expect got{};
        int other = 0;
        for (const Collective* x : s.issued_in(s.step(step))) {
          if (is_loss(*x)) got.loss++;
          else if (is_norm(*x)) got.norm++;
          else if (x->kind == CollectiveKind::all_reduce) got.model_all_reduce++;
          else if (x->kind == CollectiveKind::reduce_scatter) got.reduce_scatter++;
          else if (x->kind == CollectiveKind::all_gather) got.all_gather++;
          else other++;
        }
        const int final_gather = stage != StageId::dp && step + 1 == kSteps ? U : 0;
        EXPECT_EQ(got.model_all_reduce, e.model_all_reduce) << "rank " << r << " step " << step;
        EXPECT_EQ(got.reduce_scatter, e.reduce_scatter) << "rank " << r << " step " << step;
        EXPECT_EQ(got.all_gather, e.all_gather + final_gather) << "rank " << r << " step " << step;
        EXPECT_EQ(got.loss, e.loss) << "rank " << r << " step " << step;
        EXPECT_EQ(got.norm, e.norm) << "rank " << r << " step " << step;
        EXPECT_EQ(other, 0) << "rank " << r << " step " << step;
      }
      // The run's counters (taken before the final gather) say the same.
      const CommStats& st = run.run.ranks[r].comm;
      EXPECT_EQ(st.calls[int(CollectiveKind::all_reduce)], uint64_t(kSteps * (e.model_all_reduce + e.loss + e.norm)));
      EXPECT_EQ(st.calls[int(CollectiveKind::reduce_scatter)], uint64_t(kSteps * e.reduce_scatter));
      EXPECT_EQ(st.calls[int(CollectiveKind::all_gather)], uint64_t(kSteps * e.all_gather));
      EXPECT_EQ(st.calls[int(CollectiveKind::broadcast)] + st.calls[int(CollectiveKind::barrier)], 0u);
    }
  }
}

// ------------------------------------------------------------------ communication buffers

// The peak of category comm on the device, exactly the READMEs' bounds:
//   00, 01  nothing: the gradients are reduced in their own buffers.
//   02      the gradient buffer of the unit whose backward runs, and the one
//           of the unit after it, being reduced: max over u of
//           (N·S_u + N·S_{u+1})·b.
//   03      two gathered units (the one computing and the one prefetched)
//           and stage 02's two gradient buffers, at a backward: unit u-1's
//           and u's parameters, u's and u+1's gradients, max over u of
//           (N·S_{u-1} + 2·N·S_u + N·S_{u+1})·b. Four times the largest unit
//           only when that unit has as large neighbours on both sides (small:
//           h.1, h.2); tiny's two blocks sit beside the embedding and the head.
TEST_P(Schedule, CommPeakIsTheReadmeBound) {
  const Case& c = GetParam();
  const Units us = units_of(config_of(c));
  size_t zero2 = 0, zero3 = 0;
  for (int u = 0; u < us.U; ++u) {
    zero2 = std::max(zero2, us.b * (us.pad(u) + us.pad(u + 1)));
    zero3 = std::max(zero3, us.b * (us.pad(u - 1) + 2 * us.pad(u) + us.pad(u + 1)));
  }
  const std::map<StageId, size_t> bound{{StageId::dp, 0}, {StageId::zero1, 0}, {StageId::zero2, zero2},
                                        {StageId::zero3, zero3}};
  for (StageId stage : kStages) {
    const RecordedRun& run = recorded(stage, c);
    for (int r = 0; r < c.N; ++r) {
      const MemoryCounts& m = run.run.ranks[r].memory;
      EXPECT_EQ(m.pk(Place::device, Category::comm), bound.at(stage)) << stage_name(stage) << ", rank " << r;
      EXPECT_EQ(m.cur(Place::device, Category::comm), 0u) << stage_name(stage) << ", rank " << r;
      EXPECT_EQ(m.pk(Place::host, Category::comm), 0u) << stage_name(stage) << ", rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, Schedule,
                         ::testing::Values(Case{2, 1, Precision::fp32, 0, 1.0f},
                                           Case{2, 2, Precision::bf16, 2000, 1.0f},
                                           Case{3, 2, Precision::fp32, 2000, 1.0f},
                                           Case{3, 1, Precision::bf16, 0, 0.0f}),
                         case_name);

// ------------------------------------------------------------------ the recorder

// Under the recorder, with a delay, every stage gives the same losses,
// parameters, communication counters and memory counts as without it.
TEST(ScheduleRecorder, ChangesNoResult) {
  for (StageId stage : kStages) {
    SCOPED_TRACE(stage_name(stage));
    const Case c{2, 2, Precision::bf16, 1000, 1.0f};
    const RunResult plain = run_training(config_of(c), stage_fn(stage));
    const RunResult rec = test::run_recorded(config_of(c), stage_fn(stage), std::chrono::microseconds(c.delay_us)).run;
    for (int r = 0; r < c.N; ++r) {
      const RankResult &a = plain.ranks[r], &b = rec.ranks[r];
      EXPECT_EQ(a.losses, b.losses) << "rank " << r;
      EXPECT_EQ(a.param_hash, b.param_hash) << "rank " << r;
      EXPECT_EQ(a.comm.bytes, b.comm.bytes) << "rank " << r;
      EXPECT_EQ(a.comm.calls, b.comm.calls) << "rank " << r;
      EXPECT_EQ(a.memory.current, b.memory.current) << "rank " << r;
      EXPECT_EQ(a.memory.peak, b.memory.peak) << "rank " << r;
      EXPECT_EQ(a.memory.peak_total, b.memory.peak_total) << "rank " << r;
    }
  }
}

// The recorder on bare communicators: every wait is logged, a blocking
// collective too, the counters are the backend's, and a collective held back
// by the delay cannot be waited for sooner.
TEST(ScheduleRecorder, LogsEveryWaitAndHoldsCompletionBack) {
  constexpr auto kDelay = std::chrono::milliseconds(20);
  auto comms = make_thread_communicators(2);
  std::vector<std::vector<Ev>> logs(2);
  std::vector<double> waited_ms(2);
  std::vector<CommStats> inner(2), outer(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      RecordOptions opt;
      opt.delay = kDelay;
      RecordingCommunicator rec(*comms[r], opt);
      EXPECT_EQ(find_recorder(rec), &rec);
      EXPECT_EQ(find_recorder(*comms[r]), nullptr);
      float x[4] = {1, 2, 3, float(r)};
      const auto t0 = std::chrono::steady_clock::now();
      CommHandle h = rec.all_reduce_async(x, 4, DType::f32, ReduceOp::sum);
      rec.compute(Ev::backward_begin, 7);
      h.wait();
      waited_ms[r] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      h.wait();  // a second wait is logged too
      EXPECT_EQ(x[3], 1.0f);
      rec.all_reduce(x, 1, DType::f32);  // blocking form
      logs[r] = rec.events();
      inner[r] = comms[r]->stats();
      outer[r] = rec.stats();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(waited_ms[r], 20.0);
    EXPECT_EQ(inner[r].bytes, outer[r].bytes);
    EXPECT_EQ(inner[r].calls, outer[r].calls);
    RankSchedule s(logs[r]);
    ASSERT_EQ(s.collectives().size(), 2u);
    const Collective& a = s.collectives()[0];
    EXPECT_TRUE(a.is(CollectiveKind::all_reduce, DType::f32, 4));
    EXPECT_EQ(a.issued, 0u);
    EXPECT_EQ(s.events()[1].kind, Ev::backward_begin);
    EXPECT_EQ(s.events()[1].unit, 7);
    ASSERT_EQ(a.waits.size(), 2u);
    EXPECT_GT(a.waits[0], 1u);  // after the compute event: logged when wait() is called
    // The first wait returned once the collective was done: the second comes after.
    EXPECT_GT(a.completed, a.issued);
    EXPECT_LT(a.completed, a.waits[1]);
    const Collective& b = s.collectives()[1];
    EXPECT_TRUE(b.is(CollectiveKind::all_reduce, DType::f32, 1));
    ASSERT_EQ(b.waits.size(), 1u);  // the blocking form waits on the host, once
    EXPECT_GT(b.first_wait(), b.issued);
    EXPECT_GT(b.completed, a.waits[1]);
  }
}

// With a delay, collectives really are in flight while the next unit's
// backward runs: some reduce-scatter of ZeRO-2 completes only after the
// backward that follows its issue has begun (a timing fact, so it is
// asserted for one at least, not for each).
TEST(ScheduleRecorder, DelayKeepsCollectivesInFlightDuringCompute) {
  const Case c{2, 2, Precision::bf16, 2000, 1.0f};
  const RecordedRun& run = recorded(StageId::zero2, c);
  for (int r = 0; r < c.N; ++r) {
    RankSchedule s(run.events[r]);
    int overlapped = 0;
    for (const Collective& x : s.collectives()) {
      if (x.kind != CollectiveKind::reduce_scatter) continue;
      for (uint64_t i = x.issued + 1; i < s.end(); ++i)
        if (s.events()[i].kind == Ev::backward_begin) {
          overlapped += x.completed > i;
          break;
        }
    }
    EXPECT_GT(overlapped, 0) << "rank " << r;
  }
}

}  // namespace
}  // namespace zf
