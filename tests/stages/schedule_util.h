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
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "comm_recording.h"
#include "launch.h"
#include "runner.h"

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
                             StepReporter& reporter) {
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

}  // namespace zf::test
