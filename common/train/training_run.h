// training_run.h: what every stage's run does the same way around its step
// loop, so that a stage's train_* function is its loop:
//
//   Zero1States states(...);                  the stage's model states (a ModelStates)
//   TrainingRun run(cfg, layout, ctx, log, states);   load them, --save-init; a
//                                             failing rank from here on stops the group (comm.h)
//   run.evaluate(run.first_step(), rc, forward);   --val-every, --sample-every
//   for (int step = run.first_step(); run.keep_going(step); ++step) {
//     ...                                     the stage's step
//     run.end_step(step, loss, grad_norm, ms);  record, report, --save when due
//     run.evaluate(step + 1, rc, forward);  and again when due
//   }
//   return run.finish();                      counters, final parameter hash
//
// A stage's states differ in what each rank keeps (whole or a piece, which
// dtype); two things every stage does with them alike are the ModelStates
// interface: fill them from the initial state (initial_state.h), and give
// back the whole model for --save and the hash, or each rank's piece for a
// sharded --save.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "adamw.h"
#include "config.h"
#include "initial_state.h"
#include "model.h"
#include "rank.h"
#include "shard.h"
#include "sharded_saver.h"
#include "step_log.h"


namespace zf {

class RankCompute;

class ModelStates {
 public:
  virtual ~ModelStates() = default;
  // Fills this rank's states from `init`: the parameters (the master too,
  // in the bf16 recipe) and, when init.has_moments(), AdamW's moments.
  virtual void load(const InitialState& init) = 0;
  // The whole model's float32 values of `kind` (params: what AdamW updates,
  // the master in the bf16 recipe) in consolidated order: on every rank, or
  // on rank 0 at least when every_rank is false (a checkpoint's write; other
  // ranks may then return nothing). Every rank calls it: a sharded stage
  // gathers the pieces.
  virtual std::vector<float> full(StateKind kind, bool every_rank) = 0;
  // What this rank writes of a sharded checkpoint (io/sharded_checkpoint.h):
  // its piece of every unit as this cut gives them (shard.h), or nullptr
  // when another rank writes the same values (a replica of its shard group
  // under hybrid sharding). A stage that keeps whole copies cuts them among
  // its N ranks, so each writes 1/N all the same.
  virtual const ShardLayout* share() const = 0;
  // The float32 values of `kind` (as full() gives them) of this rank's
  // piece of unit u in share()'s cut, into host.
  virtual void copy_piece(StateKind kind, int u, float* host) = 0;
};

class TrainingRun {
 public:
  // Loads `states` from InitialState(cfg, ...) and, with --save-init, writes
  // the initial model (rank 0) before anyone goes on.
  TrainingRun(const TrainConfig& cfg, const ModelLayout& layout, RankContext& ctx, StepLog& log,
              ModelStates& states);

  int first_step() const { return result_.first_step; }

  // AdamW's settings for step `step`: its learning rate on the schedule
  // (lr_schedule.h) and --weight-decay.
  AdamWConfig adamw(int step) const;

  // Whether to train step `step`: below --steps, and the ranks have not
  // agreed to stop after a signal (stop_request.h).
  bool keep_going(int step) const { return step < cfg_.steps && result_.stop_signal == 0; }

  // --val-every and --sample-every, after `done` steps (before the first
  // step this run trains, after every S steps, and after the last): the
  // held-out loss, the mean over --val-batches batches and the ranks; and a
  // text sample (sample.h), generated token by token. forward() runs a
  // forward only over the micro-batch rc holds and returns this rank's
  // loss of it. Recorded and reported; the collectives and copies are
  // counted apart from training's, and the time is in no step's. The ranks
  // vote before each batch and token, as at a step's end: on a stop signal
  // they all stop there, and --save's checkpoint of the `done` steps is
  // written (none before this run's first step); keep_going() then says no.
  void evaluate(int done, RankCompute& rc, const std::function<float()>& forward);

  // A communicator the stage split from ctx.comm (a sub-group, a second
  // queue): its counters are added to the run's, and saving is not counted
  // on it either.
  void also_count(Communicator& comm) { extra_.push_back(&comm); }

  // A step is done: records it (and marks step_end in a recorded run's
  // schedule, comm_recording.h), reports it (rank 0), and after every
  // --save-every steps and the last one writes --save's checkpoint. Saving
  // gathers the states; its collectives are not counted as training's.
  // Then the ranks vote on ctx.control whether any has received a stop
  // signal; if one has, every rank saves (--save) and keep_going() says no.
  // phases: where the step's time went (a stage that times its phases), for the step line and the run log.
  // The harness's hooks may replace both (run_hooks.h: the modeled clock's step).
  void end_step(int step, float loss, float grad_norm, double ms, const StepPhases& phases = {});

  // The end of the run: the memory and communication counters as the
  // training left them, then the hash of the final parameters.
  RankResult finish();

 private:
  void save(int steps_done);
  std::map<std::string, std::string> checkpoint_metadata() const;
  // Runs work (a save) with the collectives it issues left out of the counters.
  void uncounted(const std::function<void()>& work);
  // Runs work, and gives back the collectives it issued, taken out of the
  // training counters as its host<->device copies are.
  CommStats apart(const std::function<void()>& work);
  void validate(int done, RankCompute& rc, const std::function<float()>& forward);
  void generate(int done, RankCompute& rc, const std::function<float()>& forward);
  int vote_to_stop();
  // Inside an evaluation: the ranks vote; whether they stop (result_.stop_signal).
  bool stop_voted();
  void skip_step_time();

  // Before the guard, so freed after it: a rank that fails stops the group
  // first, then waits for its own --save-async write to end.
  std::unique_ptr<ShardedSaver> sharded_;  // --save-format sharded
  RankFailureGuard guard_;  // a failure anywhere in the run stops the group before anything else is freed
  const TrainConfig& cfg_;
  const ModelLayout& layout_;
  RankContext& ctx_;
  StepLog& log_;
  ModelStates& states_;
  std::vector<Communicator*> extra_;
  TransferStats loaded_;  // the device's copies once the states were loaded
  TransferStats evaluated_;  // the evaluations' copies (--val-every), not training's
  bool all_written_ = true;                // the last vote: no rank has a sharded save in flight
  int saved_ = -1;                         // the steps done of the last --save
  RankResult result_;
};

}  // namespace zf
