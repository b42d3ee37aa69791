// comm_recording.h: the schedule of a rank, its collectives and its compute
// in the order they happened, for the tests that check which collective a
// stage overlaps with which compute.
//
// Bit parity between two stages proves they compute the same numbers; it
// cannot see when a collective is issued and when it is waited for. A
// RecordingCommunicator wraps any Communicator (as ProfilingDevice wraps a
// Device, device_profile.h): it forwards every call and logs one ordered list
// of events per rank:
//
//   issued          the stage issued a collective (kind, count, dtype)
//   waited          the stage called wait() or wait_host() on its handle
//                   (every call; comm_state.h's on_wait hook)
//   completed       the collective is done as far as the stage can tell: the
//                   inner handle's wait_host() returned on the recorder's own
//                   completion thread (one at a time, in issue order), after
//                   the delay below
//   load            RankCompute::load(step, micro): a micro-step begins
//   forward_begin, forward_end, backward_begin, backward_end   of unit u, from
//                   the rank's compute (train/compute_decorators.cpp wraps
//                   RankCompute when the communicator is a recorder)
//   step_end        TrainingRun::end_step(step): the step's optimizer is done
//                   (from the last backward_end to here: the gradients'
//                   last reductions, the norm, clipping and AdamW)
//
// Every event takes the next number of one per-rank counter (seq), so the
// list is a total order of what the rank did; tests assert order, never
// clock. The three events of one collective share its id (0 for the first
// the rank issued, then 1, ...).
//
// Queues: split() returns a recorder around the inner communicator's split
// that logs into the same list (the same seq and id counters, one total
// order), with its own completion thread and the same delay. Its events
// carry queue 1 (the next split 2, ...: in creation order, at any depth);
// the recorder the stage was given is queue 0. So a test sees a
// reduce_scatter on queue 1 in flight while an all_gather on queue 0 is. Compute events are the host's order of
// issuing work: on a GPU device the kernels run later, on the stream.
// Every event also carries its time (t_us: microseconds since
// RecordOptions::origin on the steady clock, taken with its seq, so times
// never go back within a rank), which the timeline of --trace draws
// (report/trace.h). With a MemoryTracker (RecordOptions::mem) each event
// also samples the rank's device bytes of every category at that moment
// (comm_bytes(): the gradient buffers of ZeRO-2/3 and FSDP;
// gathered_bytes(): the unsharded units of ZeRO-3 and FSDP).
//
// delay: each collective's completion is held back by this long after the
// backend finished it, one collective after the other like a slow link, so
// that a collective is really still in flight when the stage starts its
// next compute, and a stage that waits too early blocks there. Handles stay
// valid: the stage's wait() returns only once the inner collective is done.
//
// Off by default, at no cost: only a test or --trace FILE builds one. It
// wraps the rank's communicator for the stage's function
// (tests/stages/schedule_util.h, report/trace.cpp:
// RankContext{rank, world, recorder, mem, dev}); make_rank_compute looks
// for a recorder once (find_recorder), and without one adds nothing. The
// counters (stats()) are the recorder's own, counted as the threads backend
// counts them, so a stage's results are the same with or without it.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "memory.h"

namespace zf {

struct ScheduleEvent {
  // recompute_begin, recompute_end: inside backward_begin .. backward_end of
  // the unit, when --recompute refills its activations (model.h).
  enum Kind {
    issued, completed, waited, load, forward_begin, forward_end, backward_begin, backward_end,
    recompute_begin, recompute_end, step_end
  };
  uint64_t seq = 0;  // position in the rank's log
  Kind kind = issued;
  double t_us = 0;   // microseconds since RecordOptions::origin
  // issued, completed, waited
  uint64_t id = 0;  // the collective's number on this rank
  CollectiveKind collective = CollectiveKind::barrier;
  size_t count = 0;  // elements, as the call's count (reduce_scatter: recv, all_gather: send)
  DType dtype = DType::f32;
  int queue = 0;  // the recorder's: 0 the stage's communicator, 1, 2, ... those split from it
  bool failed = false;  // completed with an error
  // forward_*, backward_*: the unit; load: the step and micro-step; step_end: the step
  int unit = -1, step = -1, micro = -1;
  // Device bytes of each Category at the event (all 0 without a tracker).
  std::array<size_t, kNumCategories> device_bytes{};
  size_t comm_bytes() const { return device_bytes[int(Category::comm)]; }
  size_t gathered_bytes() const { return device_bytes[int(Category::gathered)]; }

  bool is_collective() const { return kind == issued || kind == completed || kind == waited; }
};
const char* schedule_event_name(ScheduleEvent::Kind kind);
// "#12 issued reduce_scatter(count 16662, f32) id 5", "#13 backward_begin unit 2".
std::string describe(const ScheduleEvent& e);

struct RecordOptions {
  std::chrono::microseconds delay{0};  // added before each collective completes
  const MemoryTracker* mem = nullptr;  // sample its device bytes at every event
  // Where t_us counts from; the default (the clock's epoch) means the
  // recorder's construction. --trace gives every rank of a process one origin.
  std::chrono::steady_clock::time_point origin{};
};

class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(Communicator& inner, RecordOptions opt = {});
  // Waits until every collective issued through it has completed.
  ~RecordingCommunicator() override;
  RecordingCommunicator(const RecordingCommunicator&) = delete;
  RecordingCommunicator& operator=(const RecordingCommunicator&) = delete;

  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  const char* backend() const override { return in_.backend(); }
  CommHandle all_reduce_async(void* buf, size_t count, DType dt, ReduceOp op) override;
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dt,
                                  ReduceOp op) override;
  CommHandle all_gather_async(const void* send, void* recv, size_t send_count, DType dt) override;
  CommHandle broadcast_async(void* buf, size_t count, DType dt, int root) override;
  void barrier() override;
  void abort(const std::string& reason) override { in_.abort(reason); }
  // A recorder (queue 1, 2, ...) around in_.split(color, key), logging here.
  std::unique_ptr<Communicator> split(int color, int key) override;
  int queue() const { return queue_no_; }

  // Compute events (RankCompute): kind is one of forward_begin ... backward_end.
  void compute(ScheduleEvent::Kind kind, int unit);
  void loaded(int step, int micro);
  void step_ended(int step);

  // The log, once every collective issued so far through this recorder has
  // completed (those of other queues: once their recorders' have).
  std::vector<ScheduleEvent> events();

  struct Log;  // the events, shared with the handles' wait hooks

 private:
  struct Pending;
  RecordingCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<Log> log,
                        RecordOptions opt, int queue);
  CommHandle issue(CollectiveKind kind, size_t count, DType dt, size_t full_bytes, CommHandle inner);
  void completion_loop();

  std::unique_ptr<Communicator> owned_;  // a split's inner communicator; null for queue 0
  Communicator& in_;
  RecordOptions opt_;
  std::shared_ptr<Log> log_;
  int queue_no_ = 0;
  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::deque<std::unique_ptr<Pending>> queue_;
  bool busy_ = false, stopping_ = false;
  std::thread worker_;
};

// The recorder `comm` is, or null (every run but a schedule test's).
RecordingCommunicator* find_recorder(Communicator& comm);

}  // namespace zf
