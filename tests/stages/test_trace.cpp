// test_trace.cpp: --trace FILE (common/report/trace.h), the timeline of a
// run: a real run's file read back with nlohmann/json and checked against
// what the run itself reports (its counters, its model's units), the results
// unchanged by tracing, the gather that carries every rank's events to the
// process that writes, a hand-made log's events to the nanosecond, and the
// paths refused up front. The copy track: stage 05's host<->device copies,
// against the run's transfer counters, and the device's copy observer.
//
//   meson test -C build trace
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm_threads.h"
#include "data_parallel.h"
#include "device.h"
#include "model.h"
#include "output_paths.h"
#include "runner.h"
#include "test_util.h"
#include "trace.h"
#include "zero1.h"
#include "fsdp.h"
#include "extensions/offload.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

using json = nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);  // throws, failing the test, on anything that is not JSON
}

// The file's times are microseconds on a grid of one nanosecond: read back
// as whole nanoseconds they compare exactly.
int64_t ns(const json& us) { return std::llround(us.get<double>() * 1000.0); }

class TraceTest : public test::TempDirTest {
 protected:
  RunConfig cfg(const std::string& stage) const {
    RunConfig c = test::quiet_config("tiny", 2, 2, 2);
    c.stage = stage;
    return c;
  }
  // `c`: the run, whose stage 05 flags stage 05 receives.
  static StageFn fn(const std::string& stage, const RunConfig& c) {
    if (stage == "dp") return train_data_parallel;
    if (stage == "fsdp") return train_fsdp;
    if (stage == "zero1") return train_zero1;
    if (stage == "zero2") return train_zero2;
    if (stage == "offload") return with_options(train_offload_extended, c.offload);
    return train_zero3;
  }

  // Everything the file must hold for `run`, checked against the run's own
  // counters and its model's units.
  void expect_complete_trace(const json& doc, const RunResult& run) {
    ASSERT_TRUE(doc.contains("traceEvents"));
    const json& events = doc["traceEvents"];
    ASSERT_TRUE(events.is_array());
    const int N = run.cfg.ranks, S = run.cfg.steps, K = run.cfg.grad_accum;
    const ModelLayout layout = build_layout(run.cfg.model);
    const int U = int(layout.units.size());

    std::map<std::pair<int, int>, std::string> track;                   // (pid, tid) -> name
    std::map<int, std::string> process;                                 // pid -> name
    std::map<std::pair<int, int>, std::vector<const json*>> spans;      // (pid, tid) -> its X events
    std::map<int, std::map<std::string, uint64_t>> step_calls;          // pid -> kind -> X events in steps
    std::map<int, std::set<int64_t>> ids;                               // pid -> collective ids
    std::map<int, int> counters, optimizer;
    std::map<int, TransferStats> copied;                                // pid -> the copy spans in steps
    std::map<int, std::set<int>> copy_tids;                             // pid -> the tids copy spans are on
    std::map<int, std::map<std::string, int>> compute;                  // pid -> "fwd h.0" -> count
    for (const json& e : events) {
      const std::string ph = e.at("ph");
      const int pid = e.at("pid"), tid = e.value("tid", 0);
      if (ph == "M" && e["name"] == "process_name") process[pid] = e["args"]["name"];
      if (ph == "M" && e["name"] == "thread_name") track[{pid, tid}] = e["args"]["name"];
      if (ph == "C") {
        EXPECT_EQ(e["name"], "device memory");
        for (int c = 0; c < kNumCategories; c++) EXPECT_TRUE(e["args"].contains(category_name(Category(c))));
        counters[pid]++;
      }
      if (ph != "X") continue;
      EXPECT_GE(ns(e["dur"]), 0) << e.dump();
      spans[{pid, tid}].push_back(&e);
      const std::string cat = e["cat"];
      if (cat == "comm") {
        EXPECT_TRUE(ids[pid].insert(e["args"]["id"].get<int64_t>()).second) << "id twice: " << e.dump();
        if (e["args"]["step"].get<int>() >= 0) step_calls[pid][e["name"]]++;
        EXPECT_EQ(e["args"]["bytes"].get<size_t>(),
                  e["args"]["count"].get<size_t>() * (e["args"]["dtype"] == "f32" ? 4 : e["args"]["dtype"] == "i64" ? 8 : 2))
            << e.dump();
      } else if (cat == "copy") {
        copy_tids[pid].insert(tid);
        const std::string name = e["name"];
        EXPECT_TRUE(name == "h2d" || name == "d2h") << e.dump();
        if (e["args"]["step"].get<int>() < 0) continue;  // the load's upload, before the steps counted
        TransferStats& t = copied[pid];
        (name == "h2d" ? t.to_device_copies : t.to_host_copies)++;
        (name == "h2d" ? t.to_device_bytes : t.to_host_bytes) += e["args"]["bytes"].get<uint64_t>();
      } else if (cat == "optimizer") {
        EXPECT_EQ(e["name"], "clip + optimizer");
        optimizer[pid]++;
      } else {
        compute[pid][e["name"]]++;
      }
    }

    for (int r = 0; r < N; r++) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_EQ(process[r], "rank " + std::to_string(r));
      EXPECT_EQ((track[{r, 0}]), "compute");
      EXPECT_EQ((track[{r, 1}]), "comm");
      EXPECT_GT(counters[r], 0) << "no device memory counter";
      // Every collective the run counted, once, by kind: its own counters are the reference.
      for (int k = 0; k < kNumCollectives; k++) {
        const char* kind = collective_name(CollectiveKind(k));
        EXPECT_EQ(step_calls[r][kind], run.ranks[r].comm.calls[k]) << kind;
      }
      // One forward and one backward of every unit per micro-step, one optimizer per step.
      for (int u = 0; u < U; u++) {
        EXPECT_EQ(compute[r]["fwd " + layout.units[u].name], S * K) << layout.units[u].name;
        EXPECT_EQ(compute[r]["bwd " + layout.units[u].name], S * K) << layout.units[u].name;
      }
      EXPECT_EQ(optimizer[r], S);
      // The copies of the steps, by direction: the run's transfer counters
      // (every stage's; zero, and no copy track, but stage 05's).
      const TransferStats& want = run.ranks[r].transfers;
      EXPECT_EQ(copied[r].to_device_copies, want.to_device_copies);
      EXPECT_EQ(copied[r].to_device_bytes, want.to_device_bytes);
      EXPECT_EQ(copied[r].to_host_copies, want.to_host_copies);
      EXPECT_EQ(copied[r].to_host_bytes, want.to_host_bytes);
      int copy_track = -1, last_comm = -1;
      for (const auto& [key, name] : track) {
        if (key.first != r) continue;
        if (name == "copy") copy_track = key.second;
        if (name.rfind("comm", 0) == 0) last_comm = std::max(last_comm, key.second);
      }
      if (copy_tids[r].empty()) {
        EXPECT_EQ(copy_track, -1) << "a copy track without copies";
      } else {
        EXPECT_EQ(copy_tids[r], std::set<int>{copy_track}) << "copies off the copy track";
        EXPECT_EQ(copy_track, last_comm + 1) << "the copy track follows the comm queues'";
      }
    }
    // No track's spans overlap: the compute track is the host's one thread,
    // a queue's collectives run one after the other.
    for (auto& [key, list] : spans) {
      std::vector<const json*> v = list;
      std::stable_sort(v.begin(), v.end(), [](const json* a, const json* b) { return ns((*a)["ts"]) < ns((*b)["ts"]); });
      for (size_t i = 1; i < v.size(); i++)
        EXPECT_LE(ns((*v[i - 1])["ts"]) + ns((*v[i - 1])["dur"]), ns((*v[i])["ts"]))
            << "pid " << key.first << " tid " << key.second << ": " << v[i - 1]->dump() << " overlaps " << v[i]->dump();
    }
  }
};

void expect_same_results(const RunResult& a, const RunResult& b) {
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); r++) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(a.ranks[r].param_hash, b.ranks[r].param_hash);
    EXPECT_EQ(a.ranks[r].losses, b.ranks[r].losses);
    EXPECT_EQ(a.ranks[r].grad_norms, b.ranks[r].grad_norms);
    EXPECT_EQ(a.ranks[r].comm.calls, b.ranks[r].comm.calls);
    EXPECT_EQ(a.ranks[r].comm.bytes, b.ranks[r].comm.bytes);
    EXPECT_EQ(a.ranks[r].memory.current, b.ranks[r].memory.current);
    EXPECT_EQ(a.ranks[r].memory.peak, b.ranks[r].memory.peak);
  }
}

TEST_F(TraceTest, Zero3FileHoldsEveryRankTrackAndCollective) {
  RunConfig c = cfg("zero3");
  c.trace = path("zero3.json");
  const RunResult traced = run_training(c, fn("zero3", c));
  expect_complete_trace(read_json(c.trace), traced);
  c.trace.clear();
  expect_same_results(traced, run_training(c, fn("zero3", c)));
}

TEST_F(TraceTest, DataParallelFileHoldsEveryRankTrackAndCollective) {
  RunConfig c = cfg("dp");
  c.trace = path("dp.json");
  const RunResult traced = run_training(c, fn("dp", c));
  expect_complete_trace(read_json(c.trace), traced);
  c.trace.clear();
  expect_same_results(traced, run_training(c, fn("dp", c)));
}

TEST_F(TraceTest, ZeroOneAndTwoFilesHoldEveryCollective) {
  for (const char* stage : {"zero1", "zero2"}) {
    SCOPED_TRACE(stage);
    RunConfig c = cfg(stage);
    c.grad_accum = 2;  // two micro-steps: a step's spans are not only its first micro-step's
    c.trace = path(std::string(stage) + ".json");
    const RunResult run = run_training(c, fn(stage, c));
    expect_complete_trace(read_json(c.trace), run);
  }
}

// Stage 05: a copy track whose spans in the steps are the run's transfer
// counters (expect_complete_trace), and before them the load's upload of
// the device's parameter copy, one copy per unit. The CPU device's copy
// thread times each memcpy, so every span is the copy as it ran.
TEST_F(TraceTest, OffloadFileHasACopyTrackOfEveryTransfer) {
  // --delay-update too: its last update is uploaded within the last step.
  for (int mode : {0, 1, 2}) {
    const bool offload_params = mode == 1;
    SCOPED_TRACE(mode == 0 ? "the default" : mode == 1 ? "--offload-params" : "--delay-update");
    RunConfig c = cfg("offload");
    c.offload.offload_params = offload_params;
    c.offload.delay_update = mode == 2;
    c.trace = path("offload.json");
    const RunResult run = run_training(c, fn("offload", c));
    const json doc = read_json(c.trace);
    expect_complete_trace(doc, run);
    std::map<int, uint64_t> load_bytes, load_copies, in_steps;
    for (const json& e : doc["traceEvents"]) {
      if (e["ph"] != "X" || e["cat"] != "copy") continue;
      EXPECT_TRUE(e["args"]["timed"].get<bool>()) << e.dump();
      EXPECT_LE(ns(e["args"]["issued_us"]), ns(e["ts"])) << e.dump();  // it ran after it was issued
      EXPECT_EQ(ns(e["args"]["issued_us"]) + ns(e["args"]["queued_us"]), ns(e["ts"])) << e.dump();
      const int pid = e["pid"];
      if (e["args"]["step"].get<int>() >= 0) {
        in_steps[pid]++;
        continue;
      }
      EXPECT_EQ(e["name"], "h2d") << e.dump();
      load_copies[pid]++;
      load_bytes[pid] += e["args"]["bytes"].get<uint64_t>();
    }
    const uint64_t units = uint64_t(build_layout(c.model).units.size());  // tiny: one FSDP unit per layout unit
    for (int r = 0; r < c.ranks; r++) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_GT(in_steps[r], 0u);
      // The upload fills the device's copy of the parameter shard, which is
      // all the device's params (none with --offload-params: no upload).
      EXPECT_EQ(load_copies[r], offload_params ? 0u : units);
      EXPECT_EQ(load_bytes[r], run.ranks[r].memory.cur(Place::device, Category::params));
    }
    c.trace.clear();
    expect_same_results(run, run_training(c, fn("offload", c)));
  }
}

// Stage 04's two queues are two tracks: the all-gathers on "comm", the
// reduce-scatters on "comm q1", every collective of the run once.
TEST_F(TraceTest, FsdpFileHasATrackPerQueue) {
  RunConfig c = cfg("fsdp");
  c.grad_accum = 2;
  c.trace = path("fsdp.json");
  const RunResult run = run_training(c, fn("fsdp", c));
  const json doc = read_json(c.trace);
  expect_complete_trace(doc, run);
  std::map<std::pair<int, int>, std::string> track;  // (pid, tid) -> name
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") track[{e["pid"], e["tid"]}] = e["args"]["name"];
  std::map<std::string, std::set<std::string>> kinds;  // track name -> collective names on it
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "X") {
      const std::string t = track[{e["pid"], e["tid"]}];
      if (t.rfind("comm", 0) == 0) kinds[t].insert(e["name"].get<std::string>());
    }
  EXPECT_EQ(kinds["comm q1"], std::set<std::string>{"reduce_scatter"});
  EXPECT_EQ(kinds["comm"].count("reduce_scatter"), 0u);
  EXPECT_EQ(kinds["comm"].count("all_gather"), 1u);
}

TEST_F(TraceTest, MemoryCounterEndsAtTheRunsModelStates) {
  // The last sample is taken after finish() read the counters: the model
  // states (params, grads, optimizer) are still allocated then, so its
  // series for them must equal the run's current bytes of each.
  RunConfig c = cfg("zero3");
  c.trace = path("mem.json");
  const RunResult run = run_training(c, fn("zero3", c));
  const json doc = read_json(c.trace);
  std::map<int, json> last;
  std::map<int, std::map<std::string, size_t>> most;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "C") continue;
    last[e["pid"]] = e["args"];
    for (auto& [k, v] : e["args"].items()) most[e["pid"]][k] = std::max(most[e["pid"]][k], v.get<size_t>());
  }
  for (int r = 0; r < c.ranks; r++)
    for (Category cat : {Category::params, Category::grads, Category::optimizer, Category::comm}) {
      const char* name = category_name(cat);
      if (cat != Category::comm) {
        EXPECT_EQ(last[r][name].get<size_t>(), run.ranks[r].memory.cur(Place::device, cat)) << name;
      }
      EXPECT_LE(most[r][name], run.ranks[r].memory.pk(Place::device, cat)) << name;  // a sample is below the peak
      EXPECT_GT(most[r][name], 0u) << name;
    }
}

// A rank's log made by hand, with round times, and the events it must become.
TEST(TraceEvents, TracksSpansAndQueueOrderFromAHandMadeLog) {
  using Ev = ScheduleEvent;
  std::vector<Ev> log;
  std::array<size_t, kNumCategories> bytes{};
  bytes[int(Category::params)] = 100;
  auto add = [&](Ev::Kind kind, double t) -> Ev& {
    Ev e;
    e.seq = log.size();
    e.kind = kind;
    e.t_us = t;
    e.device_bytes = bytes;
    log.push_back(e);
    return log.back();
  };
  auto coll = [&](Ev::Kind kind, double t, uint64_t id, CollectiveKind c, size_t n, DType dt, int queue) {
    Ev& e = add(kind, t);
    e.id = id, e.collective = c, e.count = n, e.dtype = dt, e.queue = queue;
  };
  add(Ev::load, 10).step = 0;
  log.back().micro = 0;
  coll(Ev::issued, 11, 0, CollectiveKind::all_gather, 4, DType::f32, 0);
  coll(Ev::issued, 12, 1, CollectiveKind::reduce_scatter, 2, DType::bf16, 0);
  coll(Ev::issued, 13, 2, CollectiveKind::all_reduce, 1, DType::i64, 2);
  add(Ev::forward_begin, 14).unit = 0;
  coll(Ev::completed, 15, 2, CollectiveKind::all_reduce, 1, DType::i64, 2);
  bytes[int(Category::comm)] = 7;  // the one change of the memory counter
  add(Ev::forward_end, 20).unit = 0;
  coll(Ev::completed, 30, 0, CollectiveKind::all_gather, 4, DType::f32, 0);
  coll(Ev::waited, 31, 1, CollectiveKind::reduce_scatter, 2, DType::bf16, 0);
  coll(Ev::completed, 40, 1, CollectiveKind::reduce_scatter, 2, DType::bf16, 0);
  add(Ev::backward_begin, 41).unit = 3;
  add(Ev::backward_end, 50).unit = 3;
  add(Ev::step_end, 70).step = 0;
  coll(Ev::issued, 80, 3, CollectiveKind::all_gather, 4, DType::f32, 0);
  coll(Ev::completed, 90, 3, CollectiveKind::all_gather, 4, DType::f32, 0);

  const json events = json::parse(trace_rank_events(5, log, build_layout(model_preset("tiny"))));
  std::map<int, std::string> tracks;
  std::map<std::string, json> spans;  // by name, or by "collective id"
  std::vector<json> memory;
  for (const json& e : events) {
    EXPECT_EQ(e["pid"], 5);
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "C") memory.push_back(e);
    if (e["ph"] == "X") spans[e["cat"] == "comm" ? "id " + std::to_string(e["args"]["id"].get<int>()) : e["name"].get<std::string>()] = e;
  }
  EXPECT_EQ(tracks, (std::map<int, std::string>{{0, "compute"}, {1, "comm"}, {3, "comm q2"}}));
  auto expect_span = [&](const std::string& key, int tid, int64_t ts, int64_t dur) {
    ASSERT_TRUE(spans.count(key)) << key;
    EXPECT_EQ(spans[key]["tid"], tid) << key;
    EXPECT_EQ(ns(spans[key]["ts"]), ts * 1000) << key;
    EXPECT_EQ(ns(spans[key]["dur"]), dur * 1000) << key;
  };
  expect_span("fwd embedding", 0, 14, 6);
  expect_span("bwd head", 0, 41, 9);
  expect_span("clip + optimizer", 0, 50, 20);  // from the last backward to step_end
  expect_span("id 0", 1, 11, 19);
  expect_span("id 1", 1, 30, 10);  // issued at 12, behind id 0 on queue 0 until 30
  expect_span("id 2", 3, 13, 2);   // queue 2 waits for no one
  expect_span("id 3", 1, 80, 10);
  EXPECT_EQ(spans["id 1"]["name"], "reduce_scatter");
  EXPECT_EQ(spans["id 1"]["args"]["bytes"], 4);  // 2 bf16
  EXPECT_EQ(spans["id 1"]["args"]["dtype"], "bf16");
  EXPECT_EQ(ns(spans["id 1"]["args"]["issued_us"]), 12000);
  EXPECT_EQ(ns(spans["id 1"]["args"]["queued_us"]), 18000);
  EXPECT_EQ(ns(spans["id 1"]["args"]["waited_us"]), 31000);
  EXPECT_EQ(spans["id 2"]["args"]["bytes"], 8);  // 1 i64
  EXPECT_EQ(spans["id 0"]["args"]["step"], 0);
  EXPECT_EQ(spans["id 3"]["args"]["step"], -1);  // after the step's end
  ASSERT_EQ(memory.size(), 2u);                  // the first sample, then the change
  EXPECT_EQ(ns(memory[1]["ts"]), 20000);
  EXPECT_EQ(memory[0]["args"]["params"], 100);
  EXPECT_EQ(memory[0]["args"]["comm"], 0);
  EXPECT_EQ(memory[1]["args"]["comm"], 7);
}

// Copies made by hand: the track after the last queue's, the step each was
// issued in, and the spans of untimed copies (a GPU's) kept in issue order.
TEST(TraceEvents, CopyTrackFromHandMadeCopies) {
  using Ev = ScheduleEvent;
  std::vector<Ev> log(3);
  log[0].kind = Ev::load, log[0].t_us = 10, log[0].step = 4, log[0].micro = 0;
  log[1].kind = Ev::issued, log[1].t_us = 11, log[1].collective = CollectiveKind::all_gather, log[1].queue = 1;
  log[2].kind = Ev::step_end, log[2].t_us = 70, log[2].step = 4;
  for (size_t i = 0; i < log.size(); i++) log[i].seq = i;
  auto copy = [](uint64_t id, bool to_device, size_t bytes, double issued, double wait_begin, double wait_end) {
    CopyEvent c;
    c.id = id, c.to_device = to_device, c.bytes = bytes;
    c.issued_us = issued, c.wait_begin_us = wait_begin, c.wait_end_us = wait_end;
    return c;
  };
  // Reported in wait order, not issue order. Copy 1's wait returned at 30,
  // so copy 0, before it on the queue, was done by then though its own wait
  // returned at 60; copy 2 waits behind copy 1, which waited behind copy 0.
  std::vector<CopyEvent> copies = {copy(1, false, 8, 12, 25, 30), copy(0, true, 100, 5, 50, 60),
                                   copy(2, true, 4, 20, 45, 48), copy(3, false, 2, 80, 85, 90)};
  const json events = json::parse(trace_rank_events(1, log, build_layout(model_preset("tiny")), copies));
  std::map<int, std::string> tracks;
  std::map<int64_t, json> spans;  // by copy id
  for (const json& e : events) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "X" && e["cat"] == "copy") spans[e["args"]["id"].get<int64_t>()] = e;
  }
  EXPECT_EQ(tracks, (std::map<int, std::string>{{0, "compute"}, {1, "comm"}, {2, "comm q1"}, {3, "copy"}}));
  ASSERT_EQ(spans.size(), 4u);
  auto expect_span = [&](int64_t id, const char* name, int64_t ts, int64_t dur, int step, int64_t queued) {
    SCOPED_TRACE("copy " + std::to_string(id));
    EXPECT_EQ(spans[id]["name"], name);
    EXPECT_EQ(spans[id]["tid"], 3);
    EXPECT_EQ(ns(spans[id]["ts"]), ts * 1000);
    EXPECT_EQ(ns(spans[id]["dur"]), dur * 1000);
    EXPECT_EQ(spans[id]["args"]["step"], step);
    EXPECT_EQ(ns(spans[id]["args"]["queued_us"]), queued * 1000);
    EXPECT_FALSE(spans[id]["args"]["timed"].get<bool>());
  };
  expect_span(0, "h2d", 5, 25, -1, 0);   // issued before the step's load
  expect_span(1, "d2h", 30, 0, 4, 18);   // done when its wait returned, after copy 0
  expect_span(2, "h2d", 30, 18, 4, 10);  // behind copy 1
  expect_span(3, "d2h", 80, 10, -1, 0);  // after the step's end
  EXPECT_EQ(spans[0]["args"]["bytes"], 100);
  EXPECT_EQ(ns(spans[1]["args"]["waited_us"]), 25000);

  // Timed copies are drawn as they ran.
  copies = {copy(0, true, 16, 2, 9, 10)};
  copies[0].started_us = 5, copies[0].completed_us = 8;
  const json timed = json::parse(trace_rank_events(1, log, build_layout(model_preset("tiny")), copies));
  int found = 0;
  for (const json& e : timed)
    if (e["ph"] == "X" && e["cat"] == "copy") {
      found++;
      EXPECT_EQ(ns(e["ts"]), 5000);
      EXPECT_EQ(ns(e["dur"]), 3000);
      EXPECT_EQ(ns(e["args"]["queued_us"]), 3000);
      EXPECT_TRUE(e["args"]["timed"].get<bool>());
    }
  EXPECT_EQ(found, 1);
  // No copies, no copy track.
  for (const json& e : json::parse(trace_rank_events(1, log, build_layout(model_preset("tiny")))))
    EXPECT_FALSE(e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "copy") << e.dump();
}

// The CPU device reports each async copy to its observer once, when it is
// waited for (or dropped), with the memcpy's times from the copy thread;
// without an observer it reports nothing.
TEST(TraceCopies, CpuDeviceReportsEveryCopyTimed) {
  auto dev = make_cpu_device();
  std::vector<CopyRecord> seen;  // the observer runs on the thread that waits: this one
  dev->set_copy_observer([&](const CopyRecord& r) { seen.push_back(r); });
  std::vector<float> host(1000, 1.0f), back(1000, 0.0f), device(1000, 0.0f);
  dev->to_device_async(device.data(), host.data(), 4000).wait();
  { Transfer dropped = dev->to_host_async(back.data(), device.data(), 4000); }
  EXPECT_EQ(back[999], 1.0f);
  dev->set_copy_observer({});
  dev->to_device_async(device.data(), host.data(), 4000).wait();
  ASSERT_EQ(seen.size(), 2u);
  for (size_t i = 0; i < seen.size(); i++) {
    const CopyRecord& r = seen[i];
    SCOPED_TRACE("copy " + std::to_string(i));
    EXPECT_EQ(r.id, i);
    EXPECT_EQ(r.to_device, i == 0);
    EXPECT_EQ(r.bytes, 4000u);
    ASSERT_TRUE(r.timed());
    EXPECT_LE(r.issued, r.started);
    EXPECT_LE(r.started, r.completed);
    EXPECT_LE(r.completed, r.wait_end);
    EXPECT_LE(r.wait_begin, r.wait_end);
  }
  EXPECT_LE(seen[0].completed, seen[1].started);  // one queue, in issue order
  EXPECT_EQ(dev->transfers().to_device_copies, 2u);  // counted with or without an observer
}

TEST(TraceGather, EveryRankGetsEveryRanksBytes) {
  // The path ranks as processes take, run here on the threads backend:
  // texts of different lengths (one empty, one not a multiple of 8 bytes).
  const std::vector<std::string> mine = {"[{\"a\":1}]", "", std::string(1001, 'x') + "\"\\"};
  const int N = int(mine.size());
  auto comms = make_thread_communicators(N);
  std::vector<std::vector<std::string>> got(N);
  std::vector<std::thread> threads;
  for (int r = 0; r < N; r++)
    threads.emplace_back([&, r] {
      auto dev = make_cpu_device();
      got[r] = gather_trace_events(*comms[r], *dev, mine[r]);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < N; r++) EXPECT_EQ(got[r], mine) << "rank " << r;
}

TEST_F(TraceTest, RefusesAnInputOrAnUncreatableFile) {
  RunConfig c = cfg("dp");
  const std::string data = path("tokens.bin");
  std::ofstream(data) << std::string(4096, 'a');
  for (auto [flag, field] : {std::pair{"--data", &RunConfig::data}, std::pair{"--init", &RunConfig::init},
                             std::pair{"--resume", &RunConfig::resume}}) {
    RunConfig bad = c;
    bad.*field = data;
    bad.trace = dir_ + "/./tokens.bin";  // another name for the same file
    try {
      run_training(bad, fn("dp", bad));
      ADD_FAILURE() << flag << ": not refused";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--trace"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  }
  RunConfig bad = c;
  bad.trace = path("no/such/dir/t.json");
  EXPECT_THROW(run_training(bad, fn("dp", bad)), UsageError);
  bad.trace = dir_;
  EXPECT_THROW(run_training(bad, fn("dp", bad)), UsageError);
  // A good path is checked without leaving a file behind when the check alone runs.
  bad.trace = path("fresh.json");
  EXPECT_NO_THROW(check_output_paths(bad, true));
  EXPECT_FALSE(std::filesystem::exists(bad.trace));
}

TEST_F(TraceTest, CommandLineWritesTheFile) {
  const std::string out = path("cli.json");
  auto r = test::run_command(test::dp_binary() + " --ranks 2 --model tiny --steps 1 --batch 1 --quiet --trace " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(read_json(out)["traceEvents"].empty());
  r = test::run_command(test::dp_binary() + " --model tiny --steps 1 --quiet --trace " + path("none/x.json"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--trace"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace zf
