// rank.h: what one rank of a run has. The launcher (launch/launch.h) makes one
// per rank, whether the ranks are threads of one process or processes, and
// hands it to the stage: the rank's place in the group, its communicator,
// its memory tracker and its Device, the channel on which the ranks agree
// to stop after a signal (stop_request.h), and the hooks the harness adds.
#pragma once

#include "comm.h"
#include "device.h"
#include "memory.h"

namespace zf {

class RunHooks;  // run_hooks.h

struct RankContext {
  int rank;
  int world;
  Communicator& comm;
  MemoryTracker& mem;
  Device& dev;  // where this rank's device place is: the simulated CPU device or a GPU
  // A duplicate of comm's group that the launcher made for the stop vote at
  // the end of every step (training_run.h), so that the vote is neither
  // training's traffic nor in its schedule. Null in a context made by hand
  // (tests): its ranks then never stop early.
  Communicator* control = nullptr;
  // The job's ranks on this host, which share its cores (threads: all of
  // them); 0 where the launcher does not say.
  int host_ranks = 0;
  // What the harness adds around the stage's run (run_hooks.h): TrainingRun
  // and make_rank_compute call it, so that a stage need not (stage 05 asks
  // it for the host's clock, host_clock.h). Null in a context made by hand.
  RunHooks* hooks = nullptr;
};

}  // namespace zf
