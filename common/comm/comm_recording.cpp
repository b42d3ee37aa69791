// comm_recording.cpp: RecordingCommunicator, a Communicator that logs the
// schedule of another (comm_recording.h).
//
// The rank's thread logs `issued` when it issues a collective and `waited`
// when it waits on a handle (through the on_wait hook of the handle the
// recorder returns, comm_state.h). A completion thread takes the inner
// handles in issue order (every backend completes a rank's collectives in
// that order), waits for each on the host, sleeps the delay, logs
// `completed` and only then finishes the handle the stage holds.
#include "comm_recording.h"

#include <sstream>

#include "comm_state.h"

namespace zf {

using Clock = std::chrono::steady_clock;

struct RecordingCommunicator::Log {
  std::mutex mu;
  std::vector<ScheduleEvent> events;
  const MemoryTracker* mem = nullptr;
  Clock::time_point origin;

  void add(ScheduleEvent e) {
    std::lock_guard<std::mutex> lock(mu);
    e.seq = events.size();
    e.t_us = std::chrono::duration<double, std::micro>(Clock::now() - origin).count();
    if (mem) {
      const MemoryCounts c = mem->counts();
      for (int k = 0; k < kNumCategories; k++) e.device_bytes[k] = c.cur(Place::device, Category(k));
    }
    events.push_back(e);
  }
};

struct RecordingCommunicator::Pending {
  ScheduleEvent call;  // kind issued; copied into completed
  CommHandle inner;
  std::shared_ptr<CommHandle::State> outer;
  Clock::time_point issued_at;
};

const char* schedule_event_name(ScheduleEvent::Kind kind) {
  switch (kind) {
    case ScheduleEvent::issued: return "issued";
    case ScheduleEvent::completed: return "completed";
    case ScheduleEvent::waited: return "waited";
    case ScheduleEvent::load: return "load";
    case ScheduleEvent::forward_begin: return "forward_begin";
    case ScheduleEvent::forward_end: return "forward_end";
    case ScheduleEvent::backward_begin: return "backward_begin";
    case ScheduleEvent::backward_end: return "backward_end";
    case ScheduleEvent::recompute_begin: return "recompute_begin";
    case ScheduleEvent::recompute_end: return "recompute_end";
    case ScheduleEvent::step_end: return "step_end";
  }
  return "?";
}

std::string describe(const ScheduleEvent& e) {
  std::ostringstream s;
  s << "#" << e.seq << " " << schedule_event_name(e.kind);
  if (e.is_collective()) {
    s << " " << collective_name(e.collective) << "(count " << e.count << ", " << dtype_name(e.dtype) << ") id "
      << e.id << (e.failed ? " (failed)" : "");
  } else if (e.kind == ScheduleEvent::load) {
    s << " step " << e.step << " micro " << e.micro;
  } else if (e.kind == ScheduleEvent::step_end) {
    s << " step " << e.step;
  } else {
    s << " unit " << e.unit;
  }
  s << ", comm " << e.comm_bytes() << " B";
  return s.str();
}

RecordingCommunicator::RecordingCommunicator(Communicator& inner, RecordOptions opt)
    : in_(inner), opt_(opt), log_(std::make_shared<Log>()) {
  log_->mem = opt.mem;
  log_->origin = opt.origin == Clock::time_point{} ? Clock::now() : opt.origin;
  worker_ = std::thread([this] { completion_loop(); });
}

RecordingCommunicator::~RecordingCommunicator() {
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    stopping_ = true;
  }
  q_cv_.notify_all();
  worker_.join();
}

CommHandle RecordingCommunicator::issue(CollectiveKind kind, size_t count, DType dt, size_t full_bytes,
                                        CommHandle inner) {
  {  // counted as the threads backend counts (comm.h), so stats() are the inner's
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.add(kind, ring_bytes(kind, full_bytes, size()));
  }
  auto p = std::make_unique<Pending>();
  p->call.kind = ScheduleEvent::issued;
  p->call.id = next_id_++;
  p->call.collective = kind;
  p->call.count = count;
  p->call.dtype = dt;
  p->inner = std::move(inner);
  p->outer = std::make_shared<CommHandle::State>();
  p->outer->on_wait = [log = log_, call = p->call] {
    ScheduleEvent e = call;
    e.kind = ScheduleEvent::waited;
    log->add(e);
  };
  p->issued_at = Clock::now();
  CommHandle outer(p->outer);
  log_->add(p->call);  // before the completion thread can log `completed`
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    queue_.push_back(std::move(p));
  }
  q_cv_.notify_all();
  return outer;
}

void RecordingCommunicator::completion_loop() {
  set_current_rank(in_.rank());
  for (;;) {
    std::unique_ptr<Pending> p;
    {
      std::unique_lock<std::mutex> lock(q_mu_);
      q_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      p = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    std::exception_ptr error;
    try {
      p->inner.wait_host();
    } catch (...) {
      error = std::current_exception();
    }
    if (!error && opt_.delay.count() > 0) std::this_thread::sleep_for(opt_.delay);
    ScheduleEvent e = p->call;
    e.kind = ScheduleEvent::completed;
    e.failed = error != nullptr;
    log_->add(e);
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.seconds[int(e.collective)] += std::chrono::duration<double>(Clock::now() - p->issued_at).count();
    }
    p->outer->finish(error);
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      busy_ = false;
    }
    q_cv_.notify_all();
  }
}

CommHandle RecordingCommunicator::all_reduce_async(void* buf, size_t count, DType dt, ReduceOp op) {
  return issue(CollectiveKind::all_reduce, count, dt, count * dtype_size(dt), in_.all_reduce_async(buf, count, dt, op));
}

CommHandle RecordingCommunicator::reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType dt,
                                                       ReduceOp op) {
  return issue(CollectiveKind::reduce_scatter, recv_count, dt, size_t(size()) * recv_count * dtype_size(dt),
               in_.reduce_scatter_async(send, recv, recv_count, dt, op));
}

CommHandle RecordingCommunicator::all_gather_async(const void* send, void* recv, size_t send_count, DType dt) {
  return issue(CollectiveKind::all_gather, send_count, dt, size_t(size()) * send_count * dtype_size(dt),
               in_.all_gather_async(send, recv, send_count, dt));
}

CommHandle RecordingCommunicator::broadcast_async(void* buf, size_t count, DType dt, int root) {
  return issue(CollectiveKind::broadcast, count, dt, count * dtype_size(dt), in_.broadcast_async(buf, count, dt, root));
}

void RecordingCommunicator::barrier() {
  // Blocking in every backend: issued, waited at once, completed on return.
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.add(CollectiveKind::barrier, 0.0);
  }
  ScheduleEvent e;
  e.id = next_id_++;
  e.collective = CollectiveKind::barrier;
  e.kind = ScheduleEvent::issued;
  log_->add(e);
  e.kind = ScheduleEvent::waited;
  log_->add(e);
  try {
    in_.barrier();
  } catch (...) {
    e.kind = ScheduleEvent::completed;
    e.failed = true;
    log_->add(e);
    throw;
  }
  if (opt_.delay.count() > 0) std::this_thread::sleep_for(opt_.delay);
  e.kind = ScheduleEvent::completed;
  log_->add(e);
}

void RecordingCommunicator::compute(ScheduleEvent::Kind kind, int unit) {
  ScheduleEvent e;
  e.kind = kind;
  e.unit = unit;
  log_->add(e);
}

void RecordingCommunicator::loaded(int step, int micro) {
  ScheduleEvent e;
  e.kind = ScheduleEvent::load;
  e.step = step;
  e.micro = micro;
  log_->add(e);
}

void RecordingCommunicator::step_ended(int step) {
  ScheduleEvent e;
  e.kind = ScheduleEvent::step_end;
  e.step = step;
  log_->add(e);
}

std::vector<ScheduleEvent> RecordingCommunicator::events() {
  {
    std::unique_lock<std::mutex> lock(q_mu_);
    q_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }
  std::lock_guard<std::mutex> lock(log_->mu);
  return log_->events;
}

RecordingCommunicator* find_recorder(Communicator& comm) { return dynamic_cast<RecordingCommunicator*>(&comm); }

}  // namespace zf
