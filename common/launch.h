// launch.h: start N ranks and give each its context.
//
// `--ranks N` runs N ranks as threads of this process, each with its own
// MemoryTracker and its own Communicator over a shared ThreadGroup. If any
// rank throws, the group is aborted (every other rank's collectives raise
// CommAborted instead of waiting forever) and run_ranks throws one Error
// naming the rank that failed first and its message.
#pragma once

#include <cstddef>
#include <functional>
#include <exception>
#include <optional>
#include <string>

#include "comm.h"
#include "memory.h"

namespace zf {

struct RankContext {
  int rank;
  int world;
  Communicator& comm;
  MemoryTracker& mem;
};

struct LaunchOptions {
  int ranks = 1;
  std::optional<size_t> device_budget;  // bytes per rank on the device place
};

void run_ranks(const LaunchOptions& opt, const std::function<void(RankContext&)>& fn);

// Declare one in a stage right after the buffers its collectives use (so it
// is destroyed before them). If the rank is leaving by an exception, it
// aborts the group and waits until no collective touches any buffer, so the
// buffers this rank is about to free cannot be written by another rank's
// collective still in flight.
class RankFailureGuard {
 public:
  explicit RankFailureGuard(Communicator& comm)
      : comm_(comm), uncaught_(std::uncaught_exceptions()) {}
  ~RankFailureGuard() {
    if (std::uncaught_exceptions() > uncaught_)
      comm_.abort("rank " + std::to_string(comm_.rank()) + " failed (its error is reported by the launcher)");
  }
  RankFailureGuard(const RankFailureGuard&) = delete;
  RankFailureGuard& operator=(const RankFailureGuard&) = delete;

 private:
  Communicator& comm_;
  int uncaught_;
};

}  // namespace zf
