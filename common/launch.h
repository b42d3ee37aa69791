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
#include <optional>

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

}  // namespace zf
