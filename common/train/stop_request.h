// stop_request.h: stopping a run cleanly at a step boundary on a signal.
//
// A long run stopped with Ctrl-C (SIGINT), by a scheduler (SIGTERM, often
// before a SIGKILL), by a closed terminal (SIGHUP), or through mpirun, which
// forwards SIGUSR1 to every process of the job, should lose at most the step
// it was in. So the first such signal only records its number here; every
// rank then finishes the step it is in, and at the end of each step the ranks
// vote (TrainingRun::end_step, training_run.h) on whether any of them has
// seen one: ranks that stopped at different steps would wait forever for
// each other's collectives, so they stop together, after the same step, and
// --save's checkpoint and the run log's summary are written. A second signal
// means "now": the process exits at once (the last checkpoint on disk is
// whole, since saves are atomic; a save that was under way leaves a
// temporary the next save removes), removing first what remove_on_stop
// lists.
//
// Before the run's states are loaded, though, there is nothing trained to
// lose and no step boundary near (a large checkpoint's load, a model's
// initialization): the first signal then ends the process at once too,
// saying that nothing was saved, until the run calls
// stop_at_step_boundaries(). Between two steps, an evaluation or a sample
// (--val-every, --sample-every) can take as long as many steps, so the ranks
// also vote before each of its batches and tokens.
//
// Exit status after a stop: 128 + the signal's number, as a shell reports a
// process killed by it (130 SIGINT, 143 SIGTERM, 129 SIGHUP, 138 SIGUSR1).
#pragma once

#include <string>

namespace zf {

// Installs the handlers of SIGINT, SIGTERM, SIGHUP and SIGUSR1 for this
// process, each ending it at once until stop_at_step_boundaries() is
// called. `program` prefixes the one line a signal prints (to stderr, from
// the handler: what happens next), unless `announce` is false (the other
// processes of a launched run: rank 0's says it for all); `save` is
// --save's file, or "". `killed_note`, if any, is a second line for SIGINT
// and SIGTERM (a launcher that follows them with SIGKILL).
void install_stop_handlers(const std::string& program, const std::string& save, bool announce = true,
                           const std::string& killed_note = "");

// From now on the first signal waits for the ranks' vote (the run's states
// are loaded: a stop saves them); before, it ends the process at once.
void stop_at_step_boundaries();

// The first stop signal this process received, or 0.
int stop_signal_received();

// Records `signal` as received, as the handler does (tests; 0 clears it).
void set_stop_signal(int signal);

// "SIGINT", "SIGTERM", ... for a stop signal's number.
std::string signal_name(int signal);

// What a run stopped before its first step says (without the program's
// name): where it stopped, and that `save` (--save, or "") was not written.
std::string stopped_before_training(int signal, const std::string& save);

// A second signal ends the process at once, without unwinding, so what a
// run made for itself alone (an --offload-dir folder) would stay. Such a
// file or folder is registered here: `name` in the folder open as `dir`
// (a descriptor, so a rename of the folder does not matter), removed by the
// handler before it exits, files before folders. Returns a handle for
// forget_on_stop, to be called before `dir` is closed; -1 when every slot is
// taken (the thing is then left, as an unregistered one would be).
int remove_on_stop(int dir, const std::string& name, bool folder);
void forget_on_stop(int handle);

}  // namespace zf
