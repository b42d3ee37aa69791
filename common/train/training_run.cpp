// training_run.cpp: loading, saving, recording and hashing for every stage.
#include "training_run.h"

#include <string>

#include "check.h"
#include "checkpoint.h"
#include "rank_compute.h"
#include "sample.h"
#include "run_hooks.h"
#include "comm_recording.h"
#include "host_collectives.h"
#include "stop_request.h"
#include "training.h"

namespace zf {

namespace {

// into += after - before, collective by collective.
void add_difference(CommStats& into, const CommStats& after, const CommStats& before = {}) {
  for (int k = 0; k < kNumCollectives; ++k) {
    into.bytes[k] += after.bytes[k] - before.bytes[k];
    into.calls[k] += after.calls[k] - before.calls[k];
    into.seconds[k] += after.seconds[k] - before.seconds[k];
  }
}

}  // namespace

TrainingRun::TrainingRun(const TrainConfig& cfg, const ModelLayout& layout, RankContext& ctx, StepLog& log,
                         ModelStates& states)
    : guard_(ctx.comm), cfg_(cfg), layout_(layout), ctx_(ctx), log_(log), states_(states) {
  if (ctx.hooks && ctx.hooks->dry()) {  // its states hold no values: nothing to fill them with
    ctx.hooks->start(0);
    return;
  }
  if (cfg.save_sharded) sharded_ = std::make_unique<ShardedSaver>(cfg.save, cfg.save_async, layout, ctx, states, log);
  Timer loading;
  const InitialState init(cfg, layout, ctx);  // lives only while the states are filled
  result_.first_step = init.first_step();
  states.load(init);
  loaded_ = ctx.dev.transfers();
  if (ctx.rank == 0 && !cfg.start_from().empty()) log.loaded(cfg.start_from(), loading.ms());
  if (!cfg.save_init.empty()) {
    if (ctx.rank == 0) {  // the initial model is the same on every rank: rank 0 writes it alone
      std::vector<float> full(layout.numel);
      for (size_t u = 0; u < layout.units.size(); ++u)
        init.read(int(u), StateKind::params, 0, layout.units[u].numel, full.data() + layout.units[u].offset);
      save_model(cfg.save_init, layout, full.data());
    }
    const CommStats training = ctx.comm.stats();
    ctx.comm.barrier();  // the file is complete before anyone goes on
    ctx.comm.restore_counts(training);
  }
  if (ctx.hooks) ctx.hooks->start(result_.first_step);  // loading is not step 0's time
  stop_at_step_boundaries();  // the states are loaded: a signal from now on stops where the ranks vote, and saves
}

AdamWConfig TrainingRun::adamw(int step) const {
  AdamWConfig adam;
  adam.lr = cfg_.schedule().at(step);
  adam.weight_decay = cfg_.weight_decay;
  return adam;
}

void TrainingRun::end_step(int step, float loss, float grad_norm, double ms, const StepPhases& measured) {
  // The schedule's mark that the optimizer is done (a recorded run only).
  if (RecordingCommunicator* rec = find_recorder(ctx_.comm)) rec->step_ended(step);
  StepPhases phases = measured;
  if (ctx_.hooks) ctx_.hooks->end_step(ms, phases);  // a modeled step, in place of the wall's
  result_.losses.push_back(loss);
  result_.grad_norms.push_back(grad_norm);
  result_.step_ms.push_back(ms);
  if (ctx_.rank == 0)
    log_.step(step, loss, grad_norm, cfg_.schedule().at(step), ms, ctx_.mem.counts().model_states(Place::device),
              phases);
  const int done = step + 1;
  result_.stop_signal = vote_to_stop();
  if (sharded_ && all_written_) uncounted([&] { sharded_->commit(); });  // every rank's file of a save in flight
  if (result_.stop_signal != 0) result_.stopped_after = done;
  const bool due = done == cfg_.steps || (cfg_.save_every > 0 && done % cfg_.save_every == 0);
  if (!cfg_.save.empty() && (due || result_.stop_signal != 0)) save(done);
  skip_step_time();
}

void TrainingRun::evaluate(int done, RankCompute& rc, const std::function<float()>& forward) {
  if (result_.stop_signal != 0) return;
  auto due = [&](int every) {
    return every > 0 && (done == result_.first_step || done % every == 0 || done == cfg_.steps);
  };
  const bool val = due(cfg_.val_every), sample = due(cfg_.sample_every);
  if (val || sample) set_current_step(-1);  // a collective's timeout in here names no training step
  if (val) validate(done, rc, forward);
  if (sample && result_.stop_signal == 0) generate(done, rc, forward);
  if (val || sample) skip_step_time();
  if (result_.stop_signal == 0) return;
  // Stopped inside: the states are those after the `done` steps, saved as
  // at a step's end, unless end_step just saved them. Before this run's
  // first step nothing is trained: its start is on disk already.
  result_.stopped_after = done;
  if (!cfg_.save.empty() && done > result_.first_step && saved_ != done) save(done);
}

bool TrainingRun::stop_voted() {
  result_.stop_signal = vote_to_stop();
  return result_.stop_signal != 0;
}

CommStats TrainingRun::apart(const std::function<void()>& work) {
  std::vector<Communicator*> comms{&ctx_.comm};
  comms.insert(comms.end(), extra_.begin(), extra_.end());
  std::vector<CommStats> training;
  for (Communicator* c : comms) training.push_back(c->stats());
  const TransferStats copies = ctx_.dev.transfers();
  work();
  CommStats used;
  for (size_t i = 0; i < comms.size(); ++i) {
    add_difference(used, comms[i]->stats(), training[i]);
    comms[i]->restore_counts(training[i]);
  }
  evaluated_ += ctx_.dev.transfers() - copies;
  return used;
}

void TrainingRun::validate(int done, RankCompute& rc, const std::function<float()>& forward) {
  Timer timer;
  float loss = 0.0f;
  const CommStats used = apart([&] {
    float sum = 0.0f;
    for (int b = 0; b < cfg_.val_batches; ++b) {
      if (stop_voted()) return;  // every rank at the same batch, so no collective is left unmatched
      rc.load_val(b);
      sum += forward();
    }
    loss = global_mean_loss(ctx_.comm, ctx_.dev, sum, cfg_.val_batches);  // over N x batches
  });
  if (result_.stop_signal != 0) return;  // an evaluation cut short has no loss
  const double ms = timer.ms();
  add_difference(result_.val_comm, used);
  result_.val_losses.emplace_back(done, loss);
  if (ctx_.rank == 0) log_.validation(done, loss, long(cfg_.val_batches) * ctx_.world * cfg_.batch, ms, used);
}

// No KV cache: each token is one more forward over the whole window, the
// forward every stage already has, with its gathers; a cache would be a
// second forward path (and, sharded, a cache per rank) for a few samples.
void TrainingRun::generate(int done, RankCompute& rc, const std::function<float()>& forward) {
  const SampleConfig& sc = cfg_.sample;
  const size_t T = size_t(cfg_.model.T);
  std::vector<int32_t> tokens(sc.prompt.begin(), sc.prompt.end()), made;
  for (int32_t& t : tokens) t &= 0xff;  // the prompt's bytes
  const std::string prompt = tokens_to_text(tokens);
  std::vector<float> logits(size_t(cfg_.model.V));
  apart([&] {
    for (int i = 0; i < sc.length; ++i) {
      if (stop_voted()) return;  // every rank at the same token
      const size_t start = tokens.size() > T ? tokens.size() - T : 0;  // the last T tokens
      rc.load_context(std::vector<int32_t>(tokens.begin() + long(start), tokens.end()));
      forward();
      rc.logits(int(tokens.size() - start) - 1, logits.data());
      const int32_t next = sample_token(logits.data(), cfg_.model.V, sc.temperature, sc.top_k,
                                        sample_uniform(sc.seed, uint64_t(i)));
      tokens.push_back(next);
      made.push_back(next);
    }
  });
  if (result_.stop_signal != 0) return;  // a sample cut short is not reported
  result_.samples.emplace_back(done, made);
  if (ctx_.rank == 0) log_.sample(done, prompt, tokens_to_text(made));
}

// The stop vote and saving are not training: the harness's clock (run_hooks.h) starts the next step's time after them.
void TrainingRun::skip_step_time() {
  if (ctx_.hooks) ctx_.hooks->skip();
}

int TrainingRun::vote_to_stop() {
  // With a sharded save in flight, each rank also says whether its file is on disk.
  const int64_t written = sharded_ ? int64_t(sharded_->written()) : 1;
  if (ctx_.control == nullptr) {
    all_written_ = ctx_.world == 1 && written;
    return ctx_.world == 1 ? stop_signal_received() : 0;
  }
  // Each rank's signal (0: none), in rank order on every rank: all pick the
  // same one, the first in rank order, so they stop after the same step.
  const int64_t mine[2] = {stop_signal_received(), written};
  std::vector<int64_t> all(2 * size_t(ctx_.world));
  all_gather_host(*ctx_.control, ctx_.dev, mine, all.data(), 2, DType::i64);
  all_written_ = true;
  int signal = 0;
  for (int r = 0; r < ctx_.world; ++r) {
    if (signal == 0 && all[2 * size_t(r)] != 0) signal = int(all[2 * size_t(r)]);
    all_written_ = all_written_ && all[2 * size_t(r) + 1] != 0;
  }
  return signal;
}

std::map<std::string, std::string> TrainingRun::checkpoint_metadata() const {
  return {{"stage", cfg_.stage},
          {"ranks", std::to_string(ctx_.world)},
          {"precision", precision_name(cfg_.precision)},
          {"global_batch", std::to_string((long long)ctx_.world * cfg_.batch * cfg_.grad_accum)},
          {"data", cfg_.data_name()},
          {"seed", std::to_string(cfg_.seed)},
          {"lr_schedule", lr_schedule_text(cfg_.schedule(), cfg_.weight_decay)}};
}

void TrainingRun::uncounted(const std::function<void()>& work) {
  const CommStats training = ctx_.comm.stats();
  std::vector<CommStats> extra_training;
  for (Communicator* c : extra_) extra_training.push_back(c->stats());
  work();
  ctx_.comm.restore_counts(training);
  for (size_t i = 0; i < extra_.size(); ++i) extra_[i]->restore_counts(extra_training[i]);
}

void TrainingRun::save(int steps_done) {
  saved_ = steps_done;
  uncounted([&] {
    if (sharded_) return sharded_->save(steps_done, checkpoint_metadata());
    Timer timer;
    const std::vector<float> params = states_.full(StateKind::params, false),
                             m = states_.full(StateKind::m, false), v = states_.full(StateKind::v, false);
    if (ctx_.rank == 0) {
      save_checkpoint(cfg_.save, layout_, params.data(), m.data(), v.data(), steps_done, checkpoint_metadata());
      const double ms = timer.ms();
      log_.saved(steps_done, cfg_.save, ms, ms);  // the steps waited for all of it
    }
  });
}

RankResult TrainingRun::finish() {
  if (sharded_) uncounted([&] { sharded_->finish(); });  // a save still in flight
  if (ctx_.hooks) ctx_.hooks->stop();
  result_.memory = ctx_.mem.counts();
  result_.comm = ctx_.comm.stats();
  for (Communicator* c : extra_) add_difference(result_.comm, c->stats());
  // The steps' copies: neither the initial load's nor the evaluations'.
  result_.transfers = ctx_.dev.transfers() - loaded_ - evaluated_;
  if (ctx_.hooks && ctx_.hooks->dry()) return result_;  // no values, no hash
  const std::vector<float> params = states_.full(StateKind::params, true);
  result_.param_hash = hash_params(params.data(), params.size());
  return result_;
}

}  // namespace zf
