// rank.h: what one rank of a run has. The launcher (frame/launch.h) makes one
// per rank, whether the ranks are threads of one process or processes, and
// hands it to the stage: the rank's place in the group, its communicator,
// its memory tracker and its Device.
#pragma once

#include "comm.h"
#include "device.h"
#include "memory.h"

namespace zf {

struct RankContext {
  int rank;
  int world;
  Communicator& comm;
  MemoryTracker& mem;
  Device& dev;  // where this rank's device place is: the simulated CPU device or a GPU
};

}  // namespace zf
