// trace.cpp: the --trace timeline (trace.h): a rank's recorded schedule as
// Chrome trace events, the gather of every rank's events, the file.
#include "trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <system_error>
#include <utility>

#include "check.h"
#include "host_collectives.h"
#include "log_file.h"

namespace zf {

using json = nlohmann::json;

namespace {

// Times go to the file in microseconds on a grid of one nanosecond: whole
// nanoseconds, so that a span's end (ts + dur) and the next span's ts
// compare exactly once read back.
int64_t grid_ns(double t_us) { return std::llround(t_us * 1000.0); }
double on_grid(double t_us) { return double(grid_ns(t_us)) / 1000.0; }
double grid_span(double begin_us, double end_us) { return double(grid_ns(end_us) - grid_ns(begin_us)) / 1000.0; }

std::string queue_track_name(int q) { return q == 0 ? "comm" : "comm q" + std::to_string(q); }

json meta(const char* what, int pid, int tid, json args) {
  return json{{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

// One collective, from its three kinds of events.
struct Call {
  ScheduleEvent issue;
  int step = -1;
  double waited = -1, completed = -1;
  bool failed = false;
};

}  // namespace

CopyEvent copy_event(const CopyRecord& r, std::chrono::steady_clock::time_point origin) {
  auto us = [&](CopyRecord::Time t) { return std::chrono::duration<double, std::micro>(t - origin).count(); };
  CopyEvent e;
  e.id = r.id;
  e.to_device = r.to_device;
  e.bytes = r.bytes;
  e.issued_us = us(r.issued);
  e.wait_begin_us = us(r.wait_begin);
  e.wait_end_us = us(r.wait_end);
  if (r.timed()) {
    e.started_us = us(r.started);
    e.completed_us = us(r.completed);
  }
  return e;
}

std::string trace_rank_events(int rank, const std::vector<ScheduleEvent>& events, const ModelLayout& layout,
                              const std::vector<CopyEvent>& copies) {
  json out = json::array();
  out.push_back(meta("process_name", rank, 0, {{"name", "rank " + std::to_string(rank)}}));
  out.push_back(meta("process_sort_index", rank, 0, {{"sort_index", rank}}));
  out.push_back(meta("thread_name", rank, 0, {{"name", "compute"}}));
  out.push_back(meta("thread_sort_index", rank, 0, {{"sort_index", 0}}));
  std::set<int> queues{0};  // the rank's own communicator always has its track
  for (const ScheduleEvent& e : events)
    if (e.is_collective()) queues.insert(e.queue);
  for (int q : queues) {
    out.push_back(meta("thread_name", rank, 1 + q, {{"name", queue_track_name(q)}}));
    out.push_back(meta("thread_sort_index", rank, 1 + q, {{"sort_index", 1 + q}}));
  }
  const int copy_tid = 2 + *queues.rbegin();  // after the last queue's track
  if (!copies.empty()) {
    out.push_back(meta("thread_name", rank, copy_tid, {{"name", "copy"}}));
    out.push_back(meta("thread_sort_index", rank, copy_tid, {{"sort_index", copy_tid}}));
  }

  auto unit_name = [&](int u) {
    return u >= 0 && u < int(layout.units.size()) ? layout.units[size_t(u)].name : "unit " + std::to_string(u);
  };
  auto span = [&](const std::string& name, const char* cat, int tid, double begin, double end, json args) {
    out.push_back(json{{"ph", "X"}, {"name", name}, {"cat", cat}, {"pid", rank}, {"tid", tid},
                       {"ts", on_grid(begin)}, {"dur", grid_span(begin, end)}, {"args", std::move(args)}});
  };

  int step = -1, micro = -1;
  const ScheduleEvent* open = nullptr;  // the forward or backward begun and not yet ended
  double last_end = -1;                 // end of the step's last compute (or its load)
  std::map<uint64_t, Call> calls;       // by id: issue order
  std::array<size_t, kNumCategories> memory{};
  bool sampled = false;
  std::vector<std::pair<double, int>> steps;  // (time, the step from then on; -1: none)
  for (const ScheduleEvent& e : events) {
    if (!sampled || e.device_bytes != memory) {
      memory = e.device_bytes;
      sampled = true;
      json series;
      for (int k = 0; k < kNumCategories; k++) series[category_name(Category(k))] = memory[size_t(k)];
      out.push_back(json{{"ph", "C"}, {"name", "device memory"}, {"pid", rank}, {"tid", 0},
                         {"ts", on_grid(e.t_us)}, {"args", std::move(series)}});
    }
    switch (e.kind) {
      case ScheduleEvent::load:
        step = e.step;
        micro = e.micro;
        last_end = e.t_us;
        steps.emplace_back(e.t_us, step);
        out.push_back(json{{"ph", "i"}, {"s", "t"}, {"name", "load"}, {"cat", "load"}, {"pid", rank}, {"tid", 0},
                           {"ts", on_grid(e.t_us)}, {"args", {{"step", step}, {"micro", micro}}}});
        break;
      case ScheduleEvent::forward_begin:
      case ScheduleEvent::backward_begin: open = &e; break;
      case ScheduleEvent::recompute_begin:  // within its unit's backward span, which shows the time
      case ScheduleEvent::recompute_end: break;
      case ScheduleEvent::forward_end:
      case ScheduleEvent::backward_end: {
        const bool fwd = e.kind == ScheduleEvent::forward_end;
        if (open && open->unit == e.unit)
          span(std::string(fwd ? "fwd " : "bwd ") + unit_name(e.unit), fwd ? "forward" : "backward", 0, open->t_us,
               e.t_us, {{"unit", e.unit}, {"step", step}, {"micro", micro}});
        open = nullptr;
        last_end = e.t_us;
        break;
      }
      case ScheduleEvent::step_end:
        span("clip + optimizer", "optimizer", 0, last_end < 0 ? e.t_us : last_end, e.t_us, {{"step", e.step}});
        step = -1;  // what follows until the next load (a checkpoint, the final hash) is no step's
        micro = -1;
        last_end = -1;
        steps.emplace_back(e.t_us, -1);
        break;
      case ScheduleEvent::issued: {
        Call& c = calls[e.id];
        c.issue = e;
        c.step = step;
        break;
      }
      case ScheduleEvent::waited: {
        Call& c = calls[e.id];
        if (c.waited < 0) c.waited = e.t_us;
        break;
      }
      case ScheduleEvent::completed: {
        Call& c = calls[e.id];
        c.completed = e.t_us;
        c.failed = e.failed;
        break;
      }
    }
  }

  std::map<int, double> queue_free;  // when each queue's last collective completed
  for (const auto& [id, c] : calls) {
    if (c.completed < 0) continue;  // never issued through the recorder, or still in flight
    const ScheduleEvent& e = c.issue;
    const auto free = queue_free.find(e.queue);
    const double begin = free == queue_free.end() ? e.t_us : std::max(e.t_us, free->second);
    queue_free[e.queue] = c.completed;
    json args{{"count", e.count},
              {"dtype", dtype_name(e.dtype)},
              {"bytes", e.count * dtype_size(e.dtype)},
              {"id", id},
              {"step", c.step},
              {"issued_us", on_grid(e.t_us)},
              {"queued_us", grid_span(e.t_us, begin)}};
    if (c.waited >= 0) args["waited_us"] = on_grid(c.waited);
    if (c.failed) args["failed"] = true;
    span(collective_name(e.collective), "comm", 1 + e.queue, begin, c.completed, std::move(args));
  }

  // The copy queue runs its copies in issue order, one at a time. A timed
  // copy is drawn as it ran. An untimed one (a GPU's) ends when the host's
  // wait returned, or when a later copy's did if that was sooner (it was
  // done by then), and starts when it was issued or when the copy before it
  // ended: so the track's spans never overlap either way.
  std::vector<CopyEvent> order = copies;
  std::sort(order.begin(), order.end(), [](const CopyEvent& a, const CopyEvent& b) { return a.id < b.id; });
  std::vector<double> ends(order.size());
  for (size_t i = order.size(); i-- > 0;) {
    const CopyEvent& c = order[i];
    ends[i] = c.completed_us >= 0 ? c.completed_us : c.wait_end_us;
    if (i + 1 < order.size()) ends[i] = std::min(ends[i], ends[i + 1]);
  }
  auto step_at = [&](double t) {
    auto it = std::upper_bound(steps.begin(), steps.end(), t,
                               [](double x, const std::pair<double, int>& s) { return x < s.first; });
    return it == steps.begin() ? -1 : std::prev(it)->second;
  };
  for (size_t i = 0; i < order.size(); i++) {
    const CopyEvent& c = order[i];
    const bool timed = c.started_us >= 0 && c.completed_us >= 0;
    double begin = timed ? c.started_us : c.issued_us;
    if (i > 0) begin = std::max(begin, ends[i - 1]);
    begin = std::min(begin, ends[i]);
    json args{{"bytes", c.bytes},
              {"id", c.id},
              {"step", step_at(c.issued_us)},
              {"issued_us", on_grid(c.issued_us)},
              {"queued_us", grid_span(c.issued_us, std::max(begin, c.issued_us))},
              {"waited_us", on_grid(c.wait_begin_us)},
              {"timed", timed}};
    span(c.to_device ? "h2d" : "d2h", "copy", copy_tid, begin, ends[i], std::move(args));
  }
  return out.dump();
}

std::vector<std::string> gather_trace_events(Communicator& comm, Device& dev, const std::string& mine) {
  const int N = comm.size();
  const int64_t len = int64_t(mine.size());
  std::vector<int64_t> lens(size_t(N), 0);
  all_gather_host(comm, dev, &len, lens.data(), 1, DType::i64);
  const size_t width = (size_t(*std::max_element(lens.begin(), lens.end())) + 7) / 8;  // words, the longest
  std::vector<int64_t> words(std::max<size_t>(width, 1), 0), all(size_t(N) * std::max<size_t>(width, 1));
  std::memcpy(words.data(), mine.data(), mine.size());
  all_gather_host(comm, dev, words.data(), all.data(), words.size(), DType::i64);
  std::vector<std::string> out(static_cast<size_t>(N));
  for (int q = 0; q < N; q++)
    out[size_t(q)].assign(reinterpret_cast<const char*>(all.data() + size_t(q) * words.size()), size_t(lens[q]));
  return out;
}

std::string trace_document(const std::vector<std::string>& rank_events, const RunConfig& cfg) {
  json events = json::array();
  for (const std::string& text : rank_events) {
    if (text.empty()) continue;  // a rank that recorded nothing
    for (auto& e : json::parse(text)) events.push_back(std::move(e));
  }
  json doc{{"traceEvents", std::move(events)},
           {"displayTimeUnit", "ms"},
           {"otherData",
            {{"stage", cfg.stage},
             {"model", cfg.model.name},
             {"ranks", int(rank_events.size())},
             {"steps", cfg.steps},
             {"precision", precision_name(cfg.precision)},
             {"device", cfg.device},
             {"clock", cfg.clock == "modeled"
                           ? "modeled, not measured: microseconds of the modeled clock (docs/SPEC.md section 13) "
                             "on --hardware " + cfg.hardware
                           : "microseconds since the ranks were started (steady clock)"}}}};
  return doc.dump();
}

std::string write_trace(const std::vector<std::string>& rank_events, const RunConfig& cfg) {
  LogFile f;
  f.open(cfg.trace, "the trace --trace");
  f.write(trace_document(rank_events, cfg) + "\n");
  f.close();
  return f.error();
}

RankResult run_traced_rank(RankContext& ctx, std::chrono::steady_clock::time_point origin,
                           const ModelLayout& layout, const std::function<RankResult(RankContext&)>& body,
                           std::string* events) {
  RecordOptions opt;
  opt.mem = &ctx.mem;
  // One clock for the recorder and the copies (the default: from now).
  if (origin == std::chrono::steady_clock::time_point{}) origin = std::chrono::steady_clock::now();
  opt.origin = origin;
  RecordingCommunicator rec(ctx.comm, opt);
  RankContext traced{ctx.rank, ctx.world, rec, ctx.mem, ctx.dev, ctx.control};
  // The device's copies, reported on whichever thread waits for them.
  struct Copies {
    std::mutex mu;
    std::vector<CopyEvent> list;
  };
  auto copies = std::make_shared<Copies>();
  struct ObserverGuard {
    Device& dev;
    ~ObserverGuard() { dev.set_copy_observer({}); }
  };
  RankResult result;
  {
    ctx.dev.set_copy_observer([copies, origin](const CopyRecord& r) {
      const CopyEvent e = copy_event(r, origin);
      std::lock_guard<std::mutex> lock(copies->mu);
      copies->list.push_back(e);
    });
    ObserverGuard unobserve{ctx.dev};
    RankFailureGuard guard(rec);  // a failing rank stops the group before the recorder goes
    result = body(traced);
  }
  std::vector<CopyEvent> copied;
  {
    std::lock_guard<std::mutex> lock(copies->mu);
    copied = copies->list;
  }
  *events = trace_rank_events(ctx.rank, rec.events(), layout, copied);
  return result;
}

}  // namespace zf
