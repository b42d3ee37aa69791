// trace.h: --trace FILE, a timeline of every rank of a run in Chrome's
// trace-event JSON (the {"traceEvents": [...]} form), which
// ui.perfetto.dev and chrome://tracing open and tools/trace_gantt.py draws.
//
// The timeline is the schedule recorder's log (comm/comm_recording.h) with
// its clock: when --trace is set, run_training wraps each rank's
// communicator in a RecordingCommunicator (no delay) for the stage's
// function, so no stage knows, and renders each rank's log once the stage
// returns. Without --trace no recorder (and no copy observer) exists and
// nothing is recorded. The recorder counts collectives as the backends do,
// so the results and the counters are the same with or without it
// (test_trace.cpp checks).
//
// What the file holds, per rank r (pid r, named "rank r"):
//   tid 0 "compute"     "X" spans: "fwd <unit>" and "bwd <unit>" from the
//                       host's begin to end of each unit's forward and
//                       backward, "clip + optimizer" from the step's last
//                       compute to TrainingRun::end_step (the gradients'
//                       last reductions, the norm, clipping, AdamW); "i"
//                       marks "load" where a micro-step begins
//   tid 1+q "comm", "comm q<q>"   one track per communication queue q: an
//                       "X" span per collective, named by its kind, args
//                       {count, dtype, bytes, id, step, issued_us, queued_us,
//                       waited_us}. A queue runs its collectives in issue
//                       order, so a collective issued while the one before is
//                       in flight waits behind it: its span starts when that
//                       one completed (issued_us is when it was issued,
//                       queued_us how long it waited), so the spans of a
//                       track never overlap, which the format requires
//   tid after the last queue's, "copy"   only where the device copied
//                       asynchronously (offload): an "X" span per copy, "h2d"
//                       or "d2h", args {bytes, id, step, issued_us,
//                       queued_us, waited_us, timed}. Tracing sets an observer
//                       on the rank's device (Device::set_copy_observer),
//                       which reports each copy when it is waited for. The
//                       queue runs its copies in issue order: on the CPU
//                       device its thread times each memcpy (timed: the span
//                       is the copy); a GPU's copy stream is not timed, and
//                       the span runs from the issue (or the copy before) to
//                       the host's wait's return (or a later copy's, if that
//                       came sooner). Copies with step >= 0 are the run's
//                       transfer counters; the load's upload has step -1
//   "device memory"     "C" counter, one series per category (params, grads,
//                       optimizer, activations, comm, workspace, gathered): the device
//                       bytes, sampled at every event, written when they change
// Times are microseconds since the ranks were started, on the steady clock,
// one clock for every rank of the process. On a GPU the compute spans are
// the host's issuing of the kernels, which run later on the stream, and the
// recorder waits for each collective on the host: a stage's wait, a stream
// wait on NCCL, becomes a host wait, so a traced GPU run shows the order of
// the work, not an untraced run's overlap.
//
// Under --clock modeled the file is the modeled clock's timeline instead
// (modeled_clock.h: modeled_trace_events), in the same format: its compute
// track has a span per op, and a "units" track above it each unit's
// forward and backward over its ops.
//
// Ranks as processes (MPI, the env launch): each process records its own
// rank against its own start, then the ranks' events are gathered to every
// process over the communicator (as bytes, after the stage is done, not
// counted) and the printing process writes the one file.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "comm.h"
#include "comm_recording.h"
#include "device.h"
#include "model.h"
#include "rank.h"
#include "run_config.h"

namespace zf {

// One host<->device copy of a rank (a Device's CopyRecord), in
// microseconds since the trace's origin; started_us and completed_us are
// negative where the device did not time the copy (a GPU's).
struct CopyEvent {
  uint64_t id = 0;  // issue order on the rank's device
  bool to_device = false;
  size_t bytes = 0;
  double issued_us = 0, started_us = -1, completed_us = -1, wait_begin_us = 0, wait_end_us = 0;
};
CopyEvent copy_event(const CopyRecord& r, std::chrono::steady_clock::time_point origin);

// One rank's log, and its device's copies, as trace events: a JSON array
// (the elements of "traceEvents" for pid `rank`), as text.
std::string trace_rank_events(int rank, const std::vector<ScheduleEvent>& events, const ModelLayout& layout,
                              const std::vector<CopyEvent>& copies = {});

// Every rank's trace_rank_events on every rank: an all-gather of the texts'
// bytes over `comm` (lengths first). A collective: every rank calls it.
std::vector<std::string> gather_trace_events(Communicator& comm, Device& dev, const std::string& mine);

// The whole file's text from every rank's events, in rank order.
std::string trace_document(const std::vector<std::string>& rank_events, const RunConfig& cfg);
// Writes it to cfg.trace: "" when it did, else why not (log_file.h; the
// path itself was checked before step 0, output_paths.h).
std::string write_trace(const std::vector<std::string>& rank_events, const RunConfig& cfg);

// Runs body(ctx') where ctx' is ctx with its communicator wrapped in a
// recorder whose clock starts at `origin`, and a copy observer on its
// device (removed when body returns), and returns body's result and, in
// *events, the rank's trace_rank_events.
RankResult run_traced_rank(RankContext& ctx, std::chrono::steady_clock::time_point origin,
                           const ModelLayout& layout, const std::function<RankResult(RankContext&)>& body,
                           std::string* events);

}  // namespace zf
