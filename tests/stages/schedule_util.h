// schedule_util.h: running a stage under the schedule recorder
// (common/comm/comm_recording.h) and reading the log it gives back.
//
//   RecordedRun run = run_recorded(cfg, train_zero2, std::chrono::milliseconds(2));
//   RankSchedule s(run.events[r]);
//   Window w = s.micro(step, k);                  // one micro-step's events
//   s.at(ScheduleEvent::backward_begin, u, w);    // seq of that compute event
//   s.issued_in(w)                                // the collectives issued there, in order
//
// The recorder wraps each rank's communicator for the stage's function
// only: run_training, the launcher and the stage are the ones every run uses.
//
// Below RankSchedule, what the stage files' Schedule tests share (each
// stage's own, in test_dp.cpp, test_zero1.cpp, ...): the cases they run
// (ScheduleCase), one recorded run per (stage, case), the model's unit
// sizes, and the checks every stage makes (a consistent log, the collective
// counts of a step, the comm peak, a recorder that changes nothing).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "comm_recording.h"
#include "gradnorm.h"
#include "launch.h"
#include "runner.h"
#include "test_util.h"

namespace zf::test {

struct RecordedRun {
  RunResult run;
  std::vector<std::vector<ScheduleEvent>> events;  // per rank
};

// `stage` with every rank's communicator wrapped in a recorder; rank r's log
// lands in (*out)[r] when its stage function returns.
inline StageFn recorded_stage(const StageFn& stage, std::vector<std::vector<ScheduleEvent>>* out,
                              std::chrono::microseconds delay) {
  return [stage, out, delay](const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                             StepLog& reporter) {
    RecordOptions opt;
    opt.delay = delay;
    opt.mem = &ctx.mem;
    RecordingCommunicator rec(ctx.comm, opt);
    RankContext recorded{ctx.rank, ctx.world, rec, ctx.mem, ctx.dev};
    RankResult result;
    {
      RankFailureGuard guard(rec);  // a failing rank stops the group before rec goes
      result = stage(cfg, recorded, data, reporter);
    }
    (*out)[ctx.rank] = rec.events();
    return result;
  };
}

inline RecordedRun run_recorded(const TrainConfig& cfg, const StageFn& stage, std::chrono::microseconds delay) {
  RecordedRun r;
  r.events.resize(cfg.ranks);
  r.run = run_training(cfg, recorded_stage(stage, &r.events, delay));
  return r;
}

// A range of seqs [begin, end) of one rank's log.
struct Window {
  uint64_t begin = 0, end = 0;
  bool contains(uint64_t seq) const { return seq >= begin && seq < end; }
};

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

// One collective of the log: its call and when each of its events happened.
struct Collective {
  uint64_t id = 0;
  CollectiveKind kind = CollectiveKind::barrier;
  size_t count = 0;
  DType dtype = DType::f32;
  uint64_t issued = kNever, completed = kNever;
  std::vector<uint64_t> waits;  // every wait() / wait_host() on its handle
  uint64_t first_wait() const { return waits.empty() ? kNever : waits.front(); }
  bool is(CollectiveKind k, DType dt, size_t n) const { return kind == k && dtype == dt && count == n; }
};

inline std::string describe(const Collective& c) {
  return std::string(collective_name(c.kind)) + "(count " + std::to_string(c.count) + ", " + dtype_name(c.dtype) +
         ") id " + std::to_string(c.id) + " issued #" + std::to_string(c.issued);
}

class RankSchedule {
 public:
  explicit RankSchedule(std::vector<ScheduleEvent> events) : events_(std::move(events)) {
    for (const ScheduleEvent& e : events_) {
      if (!e.is_collective()) continue;
      if (e.id >= collectives_.size()) collectives_.resize(e.id + 1);
      Collective& c = collectives_[e.id];
      c.id = e.id;
      if (e.kind == ScheduleEvent::issued) {
        c.kind = e.collective;
        c.count = e.count;
        c.dtype = e.dtype;
        c.issued = e.seq;
      } else if (e.kind == ScheduleEvent::completed) {
        c.completed = e.seq;
      } else {
        c.waits.push_back(e.seq);
      }
    }
  }

  const std::vector<ScheduleEvent>& events() const { return events_; }
  const std::vector<Collective>& collectives() const { return collectives_; }
  uint64_t end() const { return events_.size(); }

  // The events of micro-step `micro` of step `step`: from its load to the next load (or the end).
  Window micro(int step, int micro) const {
    Window w;
    w.begin = load_seq(step, micro);
    w.end = next_load_after(w.begin);
    return w;
  }
  // The events of a whole step: from its first load to the next step's first load (or the end).
  Window step(int step) const {
    Window w;
    w.begin = load_seq(step, 0);
    w.end = end();
    for (const ScheduleEvent& e : events_)
      if (e.kind == ScheduleEvent::load && e.step == step + 1 && e.micro == 0) w.end = e.seq;
    return w;
  }

  // The seq of the one compute event `kind` of unit u inside w (kNever, and a
  // test failure, if there is not exactly one).
  uint64_t at(ScheduleEvent::Kind kind, int unit, Window w) const {
    uint64_t found = kNever;
    int n = 0;
    for (uint64_t s = w.begin; s < w.end; ++s)
      if (events_[s].kind == kind && events_[s].unit == unit) {
        found = s;
        ++n;
      }
    EXPECT_EQ(n, 1) << schedule_event_name(kind) << " of unit " << unit << " in events [" << w.begin << ", "
                    << w.end << ")";
    return n == 1 ? found : kNever;
  }

  // The collectives issued inside w, in issue order.
  std::vector<const Collective*> issued_in(Window w) const {
    std::vector<const Collective*> out;
    for (const Collective& c : collectives_)
      if (w.contains(c.issued)) out.push_back(&c);
    return out;
  }

  // Collectives issued before `seq` and not yet waited for at `seq`.
  int in_flight_at(uint64_t seq) const {
    int n = 0;
    for (const Collective& c : collectives_)
      if (c.issued < seq && c.first_wait() > seq) ++n;
    return n;
  }

  // The events of w, one a line, for failure messages.
  std::string dump(Window w) const {
    std::string s;
    for (uint64_t i = w.begin; i < w.end && i < events_.size(); ++i) s += "  " + zf::describe(events_[i]) + "\n";
    return s;
  }

 private:
  uint64_t load_seq(int step, int micro) const {
    for (const ScheduleEvent& e : events_)
      if (e.kind == ScheduleEvent::load && e.step == step && e.micro == micro) return e.seq;
    ADD_FAILURE() << "no load of step " << step << " micro " << micro << " in the log";
    return end();
  }
  uint64_t next_load_after(uint64_t seq) const {
    for (uint64_t s = seq + 1; s < events_.size(); ++s)
      if (events_[s].kind == ScheduleEvent::load) return s;
    return end();
  }

  std::vector<ScheduleEvent> events_;
  std::vector<Collective> collectives_;
};


// ================================================================== the stages' schedule tests
//
// Bit parity between stages proves they compute the same numbers; it is
// blind to the schedule: a stage that waits for every collective as soon as
// it issues it, or gathers a unit only when it needs it, gives the same bits.
// So each stage's Schedule tests run it under the recorder, which logs per
// rank, in one order, when each collective is issued, waited for and
// completed, and when each unit's forward and backward begin and end. The
// tests assert that order, never times. Half of the cases also hold every
// collective's completion back by a few milliseconds, so a collective really
// is in flight while the next unit computes: the order the stages produce
// does not depend on it, and the results do not change (the Recorder tests).
//
// Sizes come from the model alone, by shard.h's rule (n_u elements in unit
// u, S_u = ceil(n_u / N) per rank, N * S_u padded), not from make_shard_layout.

struct ScheduleCase {
  int N, K;
  Precision precision;
  int delay_us;  // each collective's completion held back this long (0: as the backend finishes)
  float clip;    // 0: no clipping (the norm is still computed: it is logged)
};

// The four cases every stage's Schedule tests run.
inline std::vector<ScheduleCase> schedule_cases() {
  return {ScheduleCase{2, 1, Precision::fp32, 0, 1.0f}, ScheduleCase{2, 2, Precision::bf16, 2000, 1.0f},
          ScheduleCase{3, 2, Precision::fp32, 2000, 1.0f}, ScheduleCase{3, 1, Precision::bf16, 0, 0.0f}};
}

inline std::string schedule_case_name(const ::testing::TestParamInfo<ScheduleCase>& info) {
  const ScheduleCase& c = info.param;
  char buf[64];
  std::snprintf(buf, sizeof buf, "n%d_k%d_%s_%s%s", c.N, c.K, precision_name(c.precision),
                c.delay_us ? "delay" : "nodelay", c.clip > 0 ? "" : "_noclip");
  return buf;
}

inline void PrintTo(const ScheduleCase& c, std::ostream* os) { *os << schedule_case_name({c, 0}); }

constexpr int kScheduleSteps = 2;

inline TrainConfig schedule_config(const ScheduleCase& c) {
  TrainConfig cfg = quiet_config("tiny", c.N, 1, kScheduleSteps);
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

inline Units units_of(const TrainConfig& cfg) {
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

// One recorded run per (stage, case), shared by the tests of a test program.
inline const RecordedRun& recorded(const char* stage, const StageFn& fn, const ScheduleCase& c) {
  static std::map<std::string, RecordedRun> runs;
  const std::string key = std::string(stage) + "/" + schedule_case_name({c, 0});
  auto it = runs.find(key);
  if (it == runs.end())
    it = runs.emplace(key, run_recorded(schedule_config(c), fn, std::chrono::microseconds(c.delay_us))).first;
  return it->second;
}

// The scalar all-reduces of a step, apart from the model's collectives: the
// loss (global_mean_loss: one float32, every stage) and the gradient norm's
// exact accumulator (all_reduce of a SumOfSquares: kLimbs int64 limbs,
// ZeRO-1/2/3, with or without clipping, since grad_norm is logged; data
// parallel has the whole gradient and reduces nothing).
inline bool is_loss(const Collective& c) { return c.is(CollectiveKind::all_reduce, DType::f32, 1); }
inline bool is_norm(const Collective& c) { return c.is(CollectiveKind::all_reduce, DType::i64, SumOfSquares::kLimbs); }

// Prints the events of `w` once, when the test has failed, and says whether it has.
inline bool failed_dump(const RankSchedule& s, Window w, int rank, int step) {
  if (!::testing::Test::HasFailure()) return false;
  ADD_FAILURE() << "rank " << rank << ", step " << step << ", events [" << w.begin << ", " << w.end << "):\n"
                << s.dump(w);
  return true;
}

// The gradient collectives of one backward, issued in unit order U-1 .. 0:
// each one issued once unit u's backward has ended and before unit u-1's
// begins, and first waited for only after unit u-1's backward has ended, so
// it is in flight during all of it.
inline void expect_overlaps_backward(const RankSchedule& s, Window w, const std::vector<const Collective*>& grads,
                                     const Units& us) {
  using Ev = ScheduleEvent;
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

// The first U collectives issued in w are the gradients' of units U-1 .. 0,
// in the order the backward produces them, each a `kind` of count[u]
// elements, and each overlaps the backward of the unit before
// (expect_overlaps_backward). Returns every collective issued in w, or none
// (and a failure) if there are fewer than U.
inline std::vector<const Collective*> expect_unit_gradients(const RankSchedule& s, Window w, const Units& us,
                                                            CollectiveKind kind, const std::vector<size_t>& count) {
  const std::vector<const Collective*> cs = s.issued_in(w);
  if (int(cs.size()) < us.U) {
    ADD_FAILURE() << cs.size() << " collectives issued in events [" << w.begin << ", " << w.end << "), for "
                  << us.U << " units";
    return {};
  }
  for (int u = us.U - 1; u >= 0; --u) {
    const Collective& c = *cs[us.U - 1 - u];
    EXPECT_TRUE(c.is(kind, us.dt, count[u])) << "unit " << u << ": " << describe(c);
  }
  expect_overlaps_backward(s, w, {cs.begin(), cs.begin() + us.U}, us);
  return cs;
}

// After the last micro-step of ZeRO-1 and ZeRO-2: the loss, the norm, then
// one all-gather per unit of the updated pieces. The update needs the
// clipping coefficient, hence the norm; the gathers come after it, and the
// next step's forward only once every one is waited for.
inline void expect_gathers_after_update(const RankSchedule& s, const Units& us, int step,
                                        const std::vector<const Collective*>& after) {
  ASSERT_GE(int(after.size()), 2 + us.U);
  EXPECT_TRUE(is_loss(*after[0])) << describe(*after[0]);
  EXPECT_TRUE(is_norm(*after[1])) << describe(*after[1]);
  const Collective& last_scalar = *after[1];
  for (int u = 0; u < us.U; ++u) {
    const Collective& g = *after[2 + u];
    EXPECT_TRUE(g.is(CollectiveKind::all_gather, us.dt, us.S[u])) << describe(g);
    EXPECT_GT(g.issued, last_scalar.first_wait()) << "unit " << u << "'s " << describe(g);
    if (step + 1 < kScheduleSteps) {
      EXPECT_LT(g.first_wait(), s.at(ScheduleEvent::forward_begin, 0, s.micro(step + 1, 0)));
    }
  }
}

// Whatever the stage: one counter per rank (seq = position), every collective
// issued, completed and waited for, in that causal order, and every rank
// issuing the same collectives in the same order (comm.h's contract).
inline void expect_consistent_log(const RecordedRun& run) {
  using Ev = ScheduleEvent;
  std::vector<std::vector<std::string>> calls(run.events.size());
  for (size_t r = 0; r < run.events.size(); ++r) {
    RankSchedule s(run.events[r]);
    ASSERT_FALSE(s.events().empty()) << "rank " << r;
    for (size_t i = 0; i < s.events().size(); ++i) ASSERT_EQ(s.events()[i].seq, i);
    int open = -1;  // forward/backward of one unit at a time, begin before end
    for (const Ev& e : s.events()) {
      if (e.kind == Ev::forward_begin || e.kind == Ev::backward_begin) {
        EXPECT_EQ(open, -1) << zf::describe(e);
        open = e.unit;
      } else if (e.kind == Ev::forward_end || e.kind == Ev::backward_end) {
        EXPECT_EQ(open, e.unit) << zf::describe(e);
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

// A step's collectives, per rank, by what they carry: the model's
// all-reduces, reduce-scatters and all-gathers, and the scalar all-reduces
// (the loss; the gradient norm's limbs).
struct CollectiveCounts {
  int model_all_reduce = 0, reduce_scatter = 0, all_gather = 0, loss = 0, norm = 0;
};

// Each step of every rank issues exactly `want`; after the last step a
// stage that keeps a sharded model (`final_gather`: ZeRO-1/2/3) gathers it
// once more (U float32 all-gathers, for the parameter hash), outside the
// run's counters, which say `want` per step too.
inline void expect_collective_counts(const RecordedRun& run, const ScheduleCase& c, const CollectiveCounts& want,
                                     bool final_gather) {
  const int U = units_of(schedule_config(c)).U;
  for (int r = 0; r < c.N; ++r) {
    RankSchedule s(run.events[r]);
    for (int step = 0; step < kScheduleSteps; ++step) {
      CollectiveCounts got;
      int other = 0;
      for (const Collective* x : s.issued_in(s.step(step))) {
        if (is_loss(*x)) got.loss++;
        else if (is_norm(*x)) got.norm++;
        else if (x->kind == CollectiveKind::all_reduce) got.model_all_reduce++;
        else if (x->kind == CollectiveKind::reduce_scatter) got.reduce_scatter++;
        else if (x->kind == CollectiveKind::all_gather) got.all_gather++;
        else other++;
      }
      const int gathered_at_end = final_gather && step + 1 == kScheduleSteps ? U : 0;
      EXPECT_EQ(got.model_all_reduce, want.model_all_reduce) << "rank " << r << " step " << step;
      EXPECT_EQ(got.reduce_scatter, want.reduce_scatter) << "rank " << r << " step " << step;
      EXPECT_EQ(got.all_gather, want.all_gather + gathered_at_end) << "rank " << r << " step " << step;
      EXPECT_EQ(got.loss, want.loss) << "rank " << r << " step " << step;
      EXPECT_EQ(got.norm, want.norm) << "rank " << r << " step " << step;
      EXPECT_EQ(other, 0) << "rank " << r << " step " << step;
    }
    // The run's counters (taken before the final gather) say the same.
    const CommStats& st = run.run.ranks[r].comm;
    EXPECT_EQ(st.calls[int(CollectiveKind::all_reduce)],
              uint64_t(kScheduleSteps * (want.model_all_reduce + want.loss + want.norm)));
    EXPECT_EQ(st.calls[int(CollectiveKind::reduce_scatter)], uint64_t(kScheduleSteps * want.reduce_scatter));
    EXPECT_EQ(st.calls[int(CollectiveKind::all_gather)], uint64_t(kScheduleSteps * want.all_gather));
    EXPECT_EQ(st.calls[int(CollectiveKind::broadcast)] + st.calls[int(CollectiveKind::barrier)], 0u);
  }
}

// The peak of category comm on the device is `bound` exactly, on every rank,
// and nothing is left in it at the end, nor ever on the host.
inline void expect_comm_peak(const RecordedRun& run, size_t bound) {
  for (size_t r = 0; r < run.run.ranks.size(); ++r) {
    const MemoryCounts& m = run.run.ranks[r].memory;
    EXPECT_EQ(m.pk(Place::device, Category::comm), bound) << "rank " << r;
    EXPECT_EQ(m.cur(Place::device, Category::comm), 0u) << "rank " << r;
    EXPECT_EQ(m.pk(Place::host, Category::comm), 0u) << "rank " << r;
  }
}

// Under the recorder, with a delay, the stage gives the same losses,
// parameters, communication counters and memory counts as without it.
inline void expect_recorder_changes_no_result(const StageFn& fn) {
  const ScheduleCase c{2, 2, Precision::bf16, 1000, 1.0f};
  const RunResult plain = run_training(schedule_config(c), fn);
  const RunResult rec = run_recorded(schedule_config(c), fn, std::chrono::microseconds(c.delay_us)).run;
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

// The fixture of a stage's Schedule tests: the stage's recorded run of the
// case, the model's units, and each rank's log step by step.
//
//   class Zero2Schedule : public test::StageSchedule {
//    protected:
//     Zero2Schedule() : StageSchedule("zero2", train_zero2) {}
//   };
class StageSchedule : public ::testing::TestWithParam<ScheduleCase> {
 protected:
  StageSchedule(const char* stage, StageFn fn) : stage_(stage), fn_(std::move(fn)) {}

  const RecordedRun& run() const { return recorded(stage_, fn_, GetParam()); }
  Units units() const { return units_of(schedule_config(GetParam())); }

  // check(s, step) on every rank's log s, for every step; after the first
  // step that fails, prints its events and stops.
  void for_each_rank_step(const std::function<void(const RankSchedule&, int step)>& check) const {
    for (int r = 0; r < GetParam().N; ++r) {
      const RankSchedule s(run().events[r]);
      for (int step = 0; step < kScheduleSteps; ++step) {
        check(s, step);
        if (failed_dump(s, s.step(step), r, step)) return;
      }
    }
  }

 private:
  const char* stage_;
  StageFn fn_;
};

}  // namespace zf::test
