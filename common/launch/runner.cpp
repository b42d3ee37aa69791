// runner.cpp: the shared harness around every stage's training function.
#include "runner.h"

#include <chrono>
#include <csignal>
#include <fstream>
#include <cstdio>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "blas.h"
#include "check.h"
#include "estimate.h"
#include "checkpoint.h"
#include "sharded_checkpoint.h"
#include "gradnorm.h"
#include "hardware.h"
#include "injected_fault.h"
#include "memory_model.h"
#include "modeled_clock.h"
#include "output_paths.h"
#include "stop_request.h"
#include "trace.h"

namespace zf {

namespace {

// What to try for a run whose --clip is `clip` (0: off), after a gradient
// that is not finite.
std::string non_finite_gradient_advice(float clip) {
  std::ostringstream m;
  if (clip > 0.0f)
    m << "; clipping is on (--clip " << clip << "), so lower --lr";
  else
    m << "; clipping is off (--clip 0): turn it on (--clip 1.0) or lower --lr";
  m << " (files given to --init or --resume are refused when read if they hold inf or NaN, so this run's "
       "steps made it)";
  return m.str();
}

// After a stop on a signal: where the run stopped, what was saved, how to go on.
void report_stop(const RunResult& run) {
  const RankResult& r0 = run.ranks[0];
  if (r0.stop_signal == 0) return;
  const RunConfig& cfg = run.cfg;
  if (r0.stopped_after == r0.first_step) {  // in the evaluation or sample before the first step
    std::fprintf(stderr, "%s: %s\n", cfg.stage.c_str(), stopped_before_training(r0.stop_signal, cfg.save).c_str());
    return;
  }
  std::fprintf(stderr, "%s: stopped by %s after step %d of %d (%d steps done)", cfg.stage.c_str(),
               signal_name(r0.stop_signal).c_str(), r0.stopped_after - 1, cfg.steps, r0.stopped_after);
  if (cfg.save.empty())
    std::fprintf(stderr, "; nothing was saved (no --save)\n");
  else
    std::fprintf(stderr, "; saved %s: to go on, run the same command with --resume %s%s%s\n", cfg.save.c_str(),
                 cfg.save.c_str(),
                 cfg.save_sharded ? " (it saves beside the checkpoint it reads)"
                                  : " and another --save (a run never writes the file it reads)",
                 cfg.offload.delay_update
                     ? ". With --delay-update the resumed run starts the delay again (its first step waits for "
                       "its update), so from there its steps differ from an uninterrupted run's"
                     : "");
}

// --trace under the modeled clock: the timelines of the first ranks alone
// (a dry run may have thousands, each with every op of every step).
constexpr int kTracedModeledRanks = 16;

// MemAvailable of /proc/meminfo (what can be had without swapping, page
// cache included); the free pages where it cannot be read.
double available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (f >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024.0;
    f.ignore(256, '\n');
  }
  return double(::sysconf(_SC_AVPHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
}

// What the ranks of this process hold in host memory, refused before any
// rank allocates it when it would not fit in the memory this machine has
// free (a run that did not fit would take all of it, and the kernel's
// out-of-memory killer may then end any process): every run's per-token
// buffers (the sampler's inputs and targets, the losses read back: 12 bytes
// a position), and, in a real run, the model states, with on the CPU device
// the device's activations and buffers too (its memory is the host's). A dry
// run holds no model values: its host states are counted but never backed
// (MemoryTracker::set_unbacked_host), its host computes nothing.
void check_host_memory(const RunConfig& cfg, const World& world) {
  TrainConfig at_world = cfg;
  at_world.ranks = world.size;
  // A stage the memory model does not know (a lab's new rung) is held to
  // data parallel's bytes, the most any rung keeps.
  Stage stage = Stage::dp;
  for (Stage s : all_stages())
    if (cfg.stage == stage_name(s)) stage = s;
  const StageEstimate est = estimate_stage(stage, at_world, cfg.offload);
  const double tokens = 12.0 * cfg.batch * cfg.model.T;
  const double states = cfg.dry_run ? 0 : est.states.host.total();
  const double device = !cfg.dry_run && cfg.device == "cpu" ? est.device_total() : 0;
  const int ranks = world.multi_process() ? 1 : world.size;
  const double need = (tokens + states + device) * ranks;
  const double free_bytes = available_memory_bytes();
  if (need <= 0.8 * free_bytes) return;
  const auto show = [](double bytes) { return bytes < 1e18 ? format_bytes(size_t(bytes)) : "more than 800 PiB"; };
  std::ostringstream m;
  m << (cfg.dry_run ? "--dry-run: " : "") << "this run's " << ranks << (ranks == 1 ? " rank needs " : " ranks need ")
    << show(need) << " of host memory (per rank: ";
  if (device > 0)
    m << show(device) << " of model states, activations and buffers on --device cpu, whose memory is the host's, ";
  if (states > 0) m << show(states) << " of host model states, ";
  m << show(tokens) << " of token buffers for --batch " << cfg.batch << " x T " << cfg.model.T
    << "), and this machine has " << show(free_bytes) << " free: ";
  if (cfg.dry_run)
    m << "use a lower --batch or fewer --ranks";
  else
    m << "use a smaller model, a lower --batch, fewer --ranks, --recompute full or a stage that shards the "
         "model states, or model this run with --clock modeled --dry-run";
  throw UsageError(m.str());
}

}  // namespace

RunResult run_training(const RunConfig& cfg, const StageFn& stage) {
  // Threads, or one rank per process under mpirun/srun or RANK/WORLD_SIZE
  // (launch.h). No output may be an input or another output; only the
  // process of rank 0 prints and writes the outputs (the run log, --trace's
  // file, the checkpoints), so only that one checks they can be created:
  // before anything is read or opened for writing, not after the last step.
  const World world = resolve_world(cfg.ranks, cfg.device);
  validate_for_world(cfg, world.size);
  check_run_sizes(cfg, world.size);
  check_output_paths(cfg, world.prints());
  std::optional<Hardware> hardware;
  if (cfg.clock == "modeled") {
    USAGE_REQUIRE(!world.multi_process(), "--clock modeled runs its ranks as threads of one process (their "
                                          "collectives' modeled start is shared there): run it without "
                                              << world.launcher);
    hardware = load_hardware(cfg.hardware);
  }
  TokenData data = cfg.data.empty() ? builtin_corpus() : load_token_file(cfg.data);
  hold_out_validation(data, cfg.val_data, cfg.model.T, cfg.val_every > 0);
  Sampler::check_tokens(data, cfg.model.T, cfg.model.V);  // refuses short files and foreign vocabularies up front
  if (data.held_out > 0) Sampler::check_tokens(data, cfg.model.T, cfg.model.V, Sampler::Split::val);
  ModelLayout layout = build_layout(cfg.model);
  check_host_memory(cfg, world);  // before a checkpoint's minutes of checks
  // The file the model starts from, checked whole (names and shapes, every
  // value, the checksums) before any rank allocates a model for it: a
  // mismatched --init must not cost the minutes of a large model's set-up.
  // The ranks then skip what was read here (CheckedOnce).
  long first_step = 0;
  if (!cfg.resume.empty()) first_step = open_checkpoint(cfg.resume, layout)->step();
  else if (is_sharded_checkpoint_path(cfg.init)) open_checkpoint(cfg.init, layout);
  else if (!cfg.init.empty()) check_model_file(cfg.init, layout);
  const CheckedOnce checked(cfg.start_from());
  const auto save_lock = cfg.save_sharded && world.prints() ? claim_save_folder(cfg.save, first_step) : nullptr;

  RunResult run;
  run.cfg = cfg;
  run.cfg.ranks = world.size;
  run.params = layout.numel;
  run.blas = blas_description();
  run.ranks.resize(world.size);
  RunConfig report_cfg = run.cfg;
  if (!world.prints()) {
    report_cfg.quiet = true;
    report_cfg.log_json.clear();
  }
  StepReporter reporter(report_cfg, layout.numel);
  const std::string modeled_on = hardware ? modeled_clock_description(*hardware, world.size) : "";
  if (hardware) {
    const double peak = cfg.compute == DType::bf16 ? hardware->peak_tflops_bf16 : hardware->peak_tflops_f32;
    reporter.set_modeled(modeled_on, peak * 1e12 * world.size, hardware->memory_gib * double(size_t(1) << 30));
  }
  if (!report_cfg.quiet) {
    std::printf("zero-to-fsdp %s | model %s (P = %zu, V=%d T=%d L=%d H=%d C=%d) | %s | "
                "B=%d K=%d, %lld tokens/step | %s (compute %s%s%s%s) | data: %s (%zu tokens)\n",
                cfg.stage.c_str(), cfg.model.name.c_str(), layout.numel, cfg.model.V, cfg.model.T,
                cfg.model.L, cfg.model.H, cfg.model.C,
                (cfg.dry_run ? std::to_string(world.size) + " ranks (fibers of one thread: a dry run)"
                             : world.describe()).c_str(), cfg.batch,
                cfg.grad_accum, (long long)(run.cfg.global_batch() * cfg.model.T), precision_name(cfg.precision),
                dtype_name(cfg.compute), cfg.attention == AttentionForm::flash ? ", flash attention" : "",
                cfg.recompute == Recompute::none ? "" : ", recompute ",
                cfg.recompute == Recompute::none ? "" : recompute_name(cfg.recompute), data.source.c_str(),
                data.train_tokens());
    if (data.held_out > 0)
      std::printf("validation: %zu tokens held out of training, %s%s\n", data.held_out, data.val_source.c_str(),
                  cfg.val_every > 0 ? "" : " (--val-every to evaluate on them)");
    std::printf("BLAS: %s\n", run.blas.c_str());
    std::printf("AdamW: lr %s | weight decay %g | ", cfg.schedule().describe().c_str(), cfg.weight_decay);
    if (cfg.clip > 0) std::printf("clip to norm %g\n", cfg.clip);
    else std::printf("no clipping\n");
    if (hardware)
      std::printf("clock: %s (%s): every time below is modeled, not measured\n", modeled_on.c_str(),
                  hardware->profile.c_str());
    std::fflush(stdout);
  }

  LaunchOptions opt;
  opt.ranks = world.size;
  opt.device_budget = cfg.device_mem;
  opt.device = cfg.device;
  opt.comm_timeout_s = cfg.comm_timeout_s;
  opt.hardware = hardware ? &*hardware : nullptr;
  opt.dry_run = cfg.dry_run;
  opt.record_clock = hardware && !cfg.trace.empty() ? kTracedModeledRanks : 0;
  // --trace: every rank's schedule, against one clock for the process (trace.h).
  const auto origin = std::chrono::steady_clock::now();
  std::vector<std::string> trace_events(size_t(world.size));
  // A gradient that is not finite is found inside a sum, which does not know
  // the run's flags: what to try is added here, with the run's --clip.
  try {
    run_ranks(opt, [&](RankContext& launched) {
      RankClock* const clock = static_cast<RankClock*>(launched.hooks);  // --clock modeled: launch.cpp's, else null
      const std::unique_ptr<RunHooks> fault = maybe_inject_fault(run.cfg, launched);
      RankContext ctx = launched;  // with the fault's hooks, which live as long as it
      if (fault) ctx.hooks = fault.get();
      auto body = [&](RankContext& c) { return stage(run.cfg, c, data, reporter); };
      if (hardware && !cfg.trace.empty()) {  // the modeled clock's own timeline
        run.ranks[ctx.rank] = body(ctx);
        if (ctx.rank < kTracedModeledRanks)
          trace_events[ctx.rank] = modeled_trace_events(ctx.rank, *clock);
      } else {
        run.ranks[ctx.rank] = cfg.trace.empty() ? body(ctx)
                                                : run_traced_rank(ctx, origin, layout, body, &trace_events[ctx.rank]);
      }
      if (world.multi_process()) share_rank_results(ctx, run.ranks);  // rank 0's tables list all
      if (world.multi_process() && !cfg.trace.empty())
        trace_events = gather_trace_events(ctx.comm, ctx.dev, trace_events[ctx.rank]);
    });
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find(kNonFiniteGradientMessage) == std::string::npos) throw;
    throw Error(what + non_finite_gradient_advice(cfg.clip));
  }
  if (!cfg.trace.empty() && world.prints()) {
    const std::string problem = write_trace(trace_events, cfg);
    if (!problem.empty()) run.not_written.push_back(problem);
  }
  reporter.summary(run);
  if (!reporter.log_error().empty()) run.not_written.push_back(reporter.log_error());
  if (world.prints()) report_stop(run);
  return run;
}

int exit_status(const RunResult& run) {
  const int signal = run.ranks.empty() ? 0 : run.ranks[0].stop_signal;
  if (signal != 0) return 128 + signal;
  return run.not_written.empty() ? 0 : 4;
}

namespace {

// stage_main around `run`: the stage run with the parsed flags (run_training).
int run_stage_main(int argc, char** argv, const StageInfo& info,
                   const std::function<RunResult(const RunConfig&)>& run_stage) {
  blas_select_kernels(argc, argv);  // first: it may load the program again (blas.h)
  // Under a launcher every process parses the same flags and gets the same
  // signal: what they would all say alike, rank 0 alone says.
  LauncherInfo launcher;
  try {
    launcher = detect_launcher();
  } catch (const Error&) {
    // a bad environment is reported by the run itself
  }
  const bool speaks = launcher.rank == 0;
  // OpenMPI's mpirun answers SIGTERM and Ctrl-C by passing SIGTERM on and
  // sending SIGKILL about a second later (odls_base_sigkill_timeout), which
  // a step and a save may outlast; SIGUSR1 it passes on alone.
  const std::string killed_note =
      launcher.name == "mpirun"
          ? "if this signal came through mpirun, mpirun kills every rank about a second later, and a step or a "
            "save still running is lost: stop a run under mpirun with SIGUSR1 to mpirun (kill -USR1 <its pid>)"
          : "";
  try {
    std::optional<RunConfig> cfg;
    try {
      cfg = parse_flags(argc, argv, info);
    } catch (const UsageError& e) {
      if (speaks) std::fprintf(stderr, "%s: error: %s\n", info.exe.c_str(), e.what());
      return 2;
    }
    if (!cfg) return 0;
    // Signals stop at a step boundary on the CPU device; a GPU run keeps the
    // default (stop at once) until the GPU path has been run (docs/GPU.md).
    // A dry run has nothing to save: a signal stops it at once, even where
    // the shell that started it had the signal ignored.
    if (cfg->device == "cpu" && !cfg->dry_run) install_stop_handlers(info.exe, cfg->save, speaks, killed_note);
    if (cfg->dry_run)
      for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, SIG_DFL);
    const RunResult run = run_stage(*cfg);
    for (const std::string& what : run.not_written)
      std::fprintf(stderr, "%s: error: not written: %s\n", info.exe.c_str(), what.c_str());
    return exit_status(run);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: error: %s\n", info.exe.c_str(), e.what());
    return 2;
  } catch (const OutOfMemory& e) {
    std::fprintf(stderr, "%s: error: %s\n", info.exe.c_str(), e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", info.exe.c_str(), e.what());
    return 1;
  }
}

}  // namespace

int stage_main(int argc, char** argv, const StageInfo& info, const StageFn& stage) {
  return run_stage_main(argc, argv, info, [&](const RunConfig& cfg) { return run_training(cfg, stage); });
}

StageFn with_options(OffloadStageFn stage, OffloadOptions options) {
  return [stage = std::move(stage), options = std::move(options)](const TrainConfig& cfg, RankContext& ctx,
                                                                  const TokenData& data, StepLog& log) {
    return stage(cfg, options, ctx, data, log);
  };
}

int stage_main(int argc, char** argv, const StageInfo& info, const OffloadStageFn& stage) {
  return run_stage_main(argc, argv, info, [&](const RunConfig& cfg) { return run_training(cfg, stage); });
}

RunResult run_training(const RunConfig& cfg, const OffloadStageFn& stage) {
  return run_training(cfg, with_options(stage, cfg.offload));
}

}  // namespace zf
