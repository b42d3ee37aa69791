// cli.cpp: parsing and validating the shared flags.
#include "cli.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <vector>

#include "blas.h"
#include "check.h"
#include "data.h"
#include "device.h"
#include "numbers.h"

namespace zf {

namespace {

// The offload flags. The folder of --offload-dir is checked where the files
// are made, before step 0 (launch/entry/offload_files.h).
void validate_offload_flags(const RunConfig& cfg) {
  const OffloadOptions& o = cfg.offload;
  USAGE_REQUIRE(o.optimizer_threads >= 0 && o.optimizer_threads <= 1024,
                "--optimizer-threads must be 0 (the cores left to each rank) or a number of threads up to 1024 (got "
                    << o.optimizer_threads << ")");
}

// What an option's value must be, said after CLI11's "--flag: ", or "" when
// it is one: never empty (an unset shell variable is not "not given"), and a
// number written in decimal in the range of the option's type. `text` is
// rewritten to the plain number, so that CLI11 reads no leading 0 as octal.
// Each flag's own range is checked after.
std::string strict_value(const std::string& type, std::string& text) {
  if (text.empty())
    return "the value is empty: give one, or leave the flag out (is a shell variable unset?)";
  const std::string got = " (got '" + printable(text) + "')";
  if (type == "INT") {
    const bool minus = text[0] == '-';
    const std::optional<uint64_t> mag = decimal_whole(text.substr(text[0] == '-' || text[0] == '+' ? 1 : 0));
    constexpr uint64_t most = uint64_t(std::numeric_limits<int>::max());
    if (mag && *mag <= most + (minus ? 1 : 0)) {
      text = std::to_string(minus ? -int64_t(*mag) : int64_t(*mag));
      return "";
    }
    return "not a whole number written in decimal, from " + std::to_string(std::numeric_limits<int>::min()) +
           " to " + std::to_string(std::numeric_limits<int>::max()) + got;
  }
  if (type == "UINT") {
    if (const std::optional<uint64_t> v = decimal_whole(text)) {
      text = std::to_string(*v);
      return "";
    }
    return "not a whole number written in decimal, from 0 to " + std::to_string(UINT64_MAX) + got;
  }
  if (type == "FLOAT" && !decimal_number(text))
    return "not a finite number written in decimal, such as 0.5, 3e-4 or 1000" + got;
  return "";
}

}  // namespace

void strict_values(CLI::App& app) {
  for (CLI::Option* o : app.get_options())
    if (o->get_expected_min() > 0) {  // not a flag
      const std::string type = o->get_type_name();
      // CLI11 names no hidden option in its message (": ..."): the message names it then.
      const std::string name = o->get_group().empty() ? "--" + o->get_single_name() + ": " : "";
      o->transform(CLI::Validator(
          [type, name](std::string& text) {
            const std::string problem = strict_value(type, text);
            return problem.empty() ? problem : name + problem;
          },
          ""));
    }
  // Every subcommand, not only the ones parsed (what get_subcommands() alone gives).
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) strict_values(*sub);
}

std::string cli_error_text(const CLI::ParseError& e) {
  const std::string what = e.what();
  return what.rfind(": ", 0) == 0 ? what.substr(2) : what;
}

namespace {

// For a flag this program does not have but would with '-' for '_'
// (--offload_dir), "; did you mean --offload-dir?".
std::string did_you_mean(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (name.rfind("--", 0) != 0 || name.find('_') == std::string::npos) continue;
    name = name.substr(0, name.find('='));
    std::string dashed = name;
    std::replace(dashed.begin() + 2, dashed.end(), '_', '-');
    for (const CLI::Option* o : app.get_options())
      if ("--" + o->get_single_name() == dashed) return "; did you mean " + dashed + " (for " + name + ")?";
  }
  return "";
}

// A number of seconds for the collective timeout, from --comm-timeout or
// ZF_COMM_TIMEOUT_S (`what` names which): positive, finite, at most ten
// million (about four months; beyond that the clocks' arithmetic overflows).
double parse_comm_timeout(const std::string& what, const std::string& text) {
  const std::optional<double> s = decimal_number(text);
  USAGE_REQUIRE(s && *s > 0 && *s <= 1e7,
                what << " must be a number of seconds above 0 and at most 1e7, in decimal (got '" << printable(text)
                     << "'): how long a rank waits for the others in one collective before the "
                        "job is aborted");
  return *s;
}

// Input files must be regular files, checked by stat before anything opens
// them: opening a FIFO with no writer blocks forever, and a device such as
// /dev/zero never ends. A path that does not exist is left to its reader,
// whose message says so.
// A folder is a sharded checkpoint's (io/sharded_checkpoint.h), where the
// flag reads one.
void require_regular_file(const char* flag, const std::string& path, bool folder_ok = false) {
  if (path.empty()) return;
  const std::string kind = special_file_kind(path);
  if (folder_ok && kind == "a directory") return;
  USAGE_REQUIRE(kind.empty(),
                flag << " " << path << " is " << kind << ", not a regular file: give the path of a file");
}

// The most rank threads a run starts without ZF_OVERSUBSCRIBE=1: past 4 per
// core every rank (a thread with its own model, gradients and optimizer)
// mostly waits for a core, and a typo such as --ranks 1000 would try to
// start a thousand threads.
constexpr int kRanksPerCore = 4;

}  // namespace

// The FSDP flags, each checked against the run's other values up front (cli.h).
void validate_fsdp_flags(TrainConfig& cfg, const std::string& reshard, const std::string& reduce_dtype) {
  FsdpOptions& f = cfg.fsdp;
  const int L = cfg.model.L;
  USAGE_REQUIRE(f.wrap_blocks >= 1 && f.wrap_blocks <= L,
                "--wrap-blocks must be between 1 and the model's " << L << " blocks (got " << f.wrap_blocks
                                                                   << ")");
  if (reshard == "true") f.reshard_after_forward = true;
  else if (reshard == "false") f.reshard_after_forward = false;
  else throw UsageError("--reshard-after-forward must be true or false (got '" + reshard + "')");
  USAGE_REQUIRE(f.prefetch >= 0, "--prefetch must be 0 (none) or more units (got " << f.prefetch << ")");
  USAGE_REQUIRE(f.max_gathered >= 0,
                "--max-gathered must be 0 (no limit) or more units (got " << f.max_gathered << ")");
  if (reduce_dtype == "bf16") {
    USAGE_REQUIRE(cfg.precision == Precision::bf16,
                  "--reduce-dtype bf16 needs --precision bf16: the fp32 recipe's gradients are float32, "
                  "and it promises float32 sums");
    f.reduce_dtype = DType::bf16;
  } else if (reduce_dtype == "fp32") {
    f.reduce_dtype = DType::f32;
  } else if (!reduce_dtype.empty()) {
    throw UsageError("--reduce-dtype must be bf16 or fp32 (got '" + reduce_dtype + "')");
  }
  USAGE_REQUIRE(f.shard_group >= 0, "--shard-group must be a number of ranks (got " << f.shard_group << ")");
  USAGE_REQUIRE(!f.no_sync || cfg.grad_accum > 1,
                "--no-sync keeps the unsharded gradients across the --grad-accum micro-steps, and --grad-accum "
                "is " << cfg.grad_accum << ": add --grad-accum K with K > 1, or drop --no-sync");
}

void validate_for_world(const RunConfig& cfg, int world) {
  USAGE_REQUIRE(cfg.fault_rank < world,
                "--inject-fault " << cfg.fault_rank << ":" << cfg.fault_step << " names rank " << cfg.fault_rank
                                  << ", but this run has " << world << (world == 1 ? " rank" : " ranks")
                                  << " (0 .. " << world - 1 << "): the fault would never happen");
  const int F = cfg.fsdp.shard_group;
  if (F == 0) return;
  std::string divisors;
  for (int d = 1; d <= world; ++d)
    if (world % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
  USAGE_REQUIRE(F >= 1 && world % F == 0, "--shard-group " << F << " must divide the " << world
                                              << " ranks into equal groups of consecutive ranks: use one of "
                                              << divisors);
}

std::optional<RunConfig> parse_flags(int argc, char** argv, const StageInfo& stage) {
  RunConfig cfg;
  cfg.stage = stage.exe;
  CLI::App app{"zero-to-fsdp " + stage.title + ": train the GPT of docs/SPEC.md", stage.exe};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // last one wins
  std::string model = "small", precision = "fp32", compute = "auto", attention = "simple", recompute = "none",
              lr_schedule = "constant",
              device_mem, fault, comm_timeout;
  app.add_option("--ranks", cfg.ranks,
                 "ranks, as threads of this process, 1 to 1024 (to " + std::to_string(kMaxDryRanks) +
                     " with --dry-run); more than 4 per core only with "
                 "ZF_OVERSUBSCRIBE=1 in the environment (ignored under mpirun/srun or RANK/WORLD_SIZE, "
                 "which say how many)")
      ->capture_default_str();
  app.add_option("--model", model, "model preset: tiny, wide, small, gpt2; for --dry-run also gpt2-medium, gpt2-large, gpt2-xl, gpt-7b, gpt-70b; or a shape L=12,C=768,H=12,T=1024,V=50304 (blocks, channels, heads, sequence, vocabulary), or a preset with some changed: gpt-7b,V=32000")->capture_default_str();
  app.add_option("--steps", cfg.steps, "optimizer steps")->capture_default_str();
  app.add_option("--batch", cfg.batch, "micro-batch per rank (sequences)")->capture_default_str();
  app.add_option("--grad-accum", cfg.grad_accum, "micro-steps per optimizer step")->capture_default_str();
  app.add_option("--lr", cfg.lr, "AdamW learning rate (the peak, after --warmup)")->capture_default_str();
  app.add_option("--lr-schedule", lr_schedule,
                 "constant, cosine or linear: after --warmup, keep --lr, or decay it to --min-lr at the last step")
      ->capture_default_str();
  app.add_option("--warmup", cfg.warmup, "steps of linear warmup to --lr (step s gets lr * (s + 1) / warmup)")
      ->capture_default_str();
  CLI::Option* min_lr_option =
      app.add_option("--min-lr", cfg.min_lr, "with --lr-schedule cosine or linear: the rate the decay ends at")
          ->capture_default_str();
  app.add_option("--weight-decay", cfg.weight_decay,
                 "AdamW's decoupled weight decay, on the weight matrices and embeddings (not biases or LayerNorm)")
      ->capture_default_str();
  app.add_option("--clip", cfg.clip, "clip the global gradient L2 norm to this (0: off)")->capture_default_str();
  CLI::Option* seed_option = app.add_option("--seed", cfg.seed, "seed of the initial model, 0 to 2^64-1")->capture_default_str();
  app.add_option("--precision", precision, "fp32, or bf16 (bf16 params/grads, fp32 master and moments)")
      ->capture_default_str();
  app.add_option("--compute", compute,
                 "what the kernels compute in: f32, bf16 (bf16 activations and tensor-core matrix products; "
                 "needs --precision bf16), or auto (bf16 for --precision bf16 on cuda, else f32)")
      ->capture_default_str();
  app.add_option("--attention", attention,
                 "simple (keeps the [B,H,T,T] probabilities for the backward) or flash (keeps one number "
                 "per row, recomputes the rest: tensor cores with bf16 compute on a GPU; on the CPU the GPU "
                 "kernels' code one thread at a time, slow)")
      ->capture_default_str();
  app.add_option("--recompute", recompute,
                 "activation recomputation: none (keep every block's activations), full (keep each block's "
                 "input, re-run its forward in the backward), attn (keep all but the attention "
                 "probabilities, recompute those; with --attention flash there are none to drop)")
      ->capture_default_str();
  app.add_option("--data", cfg.data, "token file (raw bytes or llm.c .bin); default: built-in corpus");
  app.add_option(
      "--val-data", cfg.val_data,
      "validation token file (raw bytes or llm.c .bin); default: the last tenth of the data, held out of training");
  app.add_option("--val-every", cfg.val_every,
                 "the held-out loss (a forward only) before the first step, after every this many steps and "
                 "after the last; 0: never")
      ->capture_default_str();
  app.add_option("--val-batches", cfg.val_batches,
                 "held-out batches per evaluation, each N x --batch sequences, the same ones every time")
      ->capture_default_str();
  app.add_option("--sample-every", cfg.sample_every,
                 "print a text sample (the model continuing --sample-prompt) at the same points; 0: never. With "
                 "--steps 0 and --init FILE: generate from that model (a --save checkpoint too)")
      ->capture_default_str();
  app.add_option("--sample-prompt", cfg.sample.prompt, "the text a sample starts from (its bytes are tokens)")
      ->capture_default_str();
  app.add_option("--sample-length", cfg.sample.length, "tokens a sample generates")->capture_default_str();
  app.add_option("--temperature", cfg.sample.temperature, "a sample's softmax temperature; 0: the likeliest token")
      ->capture_default_str();
  app.add_option("--top-k", cfg.sample.top_k, "draw among the k likeliest tokens only; 0: among all")
      ->capture_default_str();
  app.add_option("--sample-seed", cfg.sample.seed, "the seed of a sample's draws: the same text in every stage")
      ->capture_default_str();
  app.add_option("--device", cfg.device, "cpu or cuda")->capture_default_str();
  app.add_option("--device-mem", device_mem, "device memory budget per rank, e.g. 512KiB, 64MiB, 2GiB");
  app.add_option("--init", cfg.init, "start from this model: a safetensors file, or a --save checkpoint of either format (its parameters)");
  app.add_option("--save-init", cfg.save_init, "write the initial model to this safetensors file");
  app.add_option("--save", cfg.save,
                 "write a training checkpoint here (model, AdamW state, step) at the end, and every "
                 "--save-every steps; --resume continues from it");
  app.add_option("--save-every", cfg.save_every, "with --save: also write it after every this many steps")
      ->capture_default_str();
  std::string save_format = "consolidated";
  CLI::Option* save_format_option =
      app.add_option("--save-format", save_format,
                     "consolidated: --save is one file, gathered on rank 0; sharded: a folder in which every rank "
                     "writes what it holds (step-S/ per save, `latest` the newest)")
          ->capture_default_str();
  app.add_flag("--save-async", cfg.save_async,
               "with --save-format sharded: copy the states to host memory and write them in the background "
               "while training goes on");
  app.add_option("--resume", cfg.resume,
                 "continue a run from a --save checkpoint (a file, or a sharded folder): its model, AdamW state "
                 "and step; the run "
                 "trains the steps from there up to --steps");
  app.add_option("--log-json", cfg.log_json, "write the run log (JSON lines) to this file");
  app.add_option("--trace", cfg.trace,
                 "write a timeline of every rank (compute, collectives, device memory) to this file, as "
                 "Chrome trace-event JSON: open it in ui.perfetto.dev, draw it with tools/trace_gantt.py");
  app.add_option("--log-every", cfg.log_every, "print a log line every this many steps")->capture_default_str();
  app.add_flag("--quiet", cfg.quiet,
               "print nothing on stdout (no header, step lines or tables); errors, warnings and notes still go "
               "to stderr, and --log-json still gets every step and the summary");
  CLI::Option* comm_timeout_option = app.add_option(
      "--comm-timeout", comm_timeout,
      "SECONDS a rank waits for the others in one collective (or barrier) before the job is "
      "aborted with a message naming the collective and the ranks that did not arrive; default "
      "ZF_COMM_TIMEOUT_S, else 600. Also bounds NCCL's waits (else ZF_NCCL_TIMEOUT_S). In a dry run "
      "a wait that can never end fails at once, and a rank that runs this long without waiting stops the run");
  app.footer(
      "Several processes, one rank each: under mpirun or srun --mpi=pmix (a build with MPI), or,\n"
      "for --device cuda only, without MPI: set in every process RANK (0..N-1), WORLD_SIZE (N),\n"
      "LOCAL_RANK (its GPU is LOCAL_RANK % GPUs; default RANK) and ZF_RENDEZVOUS=FILE, a path every\n"
      "process sees, used by no other run at once: rank 0 passes NCCL's id through it. srun\n"
      "without an MPI plugin sets these itself (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID): also\n"
      "--device cuda only; CPU ranks started so are refused, as they could not talk.\n"
      "Processes sharing a GPU get an NCCL_HOSTID each (correctness only). --comm-timeout, else\n"
      "ZF_COMM_TIMEOUT_S (default 600 s), bounds every wait for the other ranks (NCCL's too;\n"
      "NCCL alone: ZF_NCCL_TIMEOUT_S when neither is given).");
  app.add_option("--clock", cfg.clock,
                 "wall, or modeled: each step timed as it would run on --hardware's GPUs (every op a roofline "
                 "time, every collective NCCL's ring over NVLink or the network, every copy PCIe), from the "
                 "stage's own order of issues and waits; the same on any machine")
      ->capture_default_str();
  CLI::Option* hardware_option = app.add_option(
      "--hardware", cfg.hardware,
      "with --clock modeled: the modeled machine, a profile of hardware/ (h100-sxm, h200, a100-sxm, l40s; "
      "this-machine once tools/calibrate_machine.py has measured it; default h100-sxm) or the path of a "
      "profile file");
  app.add_flag("--dry-run", cfg.dry_run,
               "with --clock modeled: model the steps without computing them (no arithmetic, no data moved, "
               "memory counted as in a real run; no final hash): any model preset, --ranks up to 4096");
  app.add_option("--inject-fault", fault,
                 "RANK:STEP: that rank throws during that step; RANK:STEP:stall: it stops there for "
                 "good, and the others' collectives time out (tests, demos)")
      ->group("");

  // The FSDP flags: in the --help of the stages that have them; every other stage parses them hidden,
  // only to refuse them below by name.
  const bool fsdp = stage.flags == StageFlags::fsdp || stage.flags == StageFlags::offload;
  const bool offload = stage.flags == StageFlags::offload;
  std::vector<CLI::Option*> fsdp_options, offload_options;
  auto group = [&](CLI::Option* o) {
    o->group(fsdp ? "FSDP (stage 04)" : "");
    fsdp_options.push_back(o);
  };
  auto offload_group = [&](CLI::Option* o) {
    o->group(offload ? "Offload (stage 05)" : "");
    offload_options.push_back(o);
  };
  std::string reshard = "true", reduce_dtype;
  group(app.add_option("--wrap-blocks", cfg.fsdp.wrap_blocks,
                       "consecutive blocks per FSDP unit (one flat parameter each); the embeddings, "
                       "and the final LayerNorm with the head, are units of their own")
            ->capture_default_str());
  group(app.add_option("--reshard-after-forward", reshard,
                       "true: free each unit's gathered parameters after its forward, gather them again for "
                       "its backward; false: keep them to the backward (no backward all-gather, the whole "
                       "model gathered at once)")
            ->capture_default_str());
  group(app.add_option("--prefetch", cfg.fsdp.prefetch,
                       "D: issue the all-gathers of the next D units (the previous D in backward) before this "
                       "unit computes (0: none)")
            ->capture_default_str());
  group(app.add_option("--max-gathered", cfg.fsdp.max_gathered,
                       "M: at most M units gathered or being gathered at once, the units kept for the "
                       "backward not counted, so --prefetch reaches at most M-1 units ahead and the limit "
                       "never binds with --reshard-after-forward false (0: no limit)")
            ->capture_default_str());
  group(app.add_option("--reduce-dtype", reduce_dtype,
                       "dtype of the gradients' reduce-scatter: bf16 or fp32 (default: the --precision "
                       "recipe's; fp32 under bf16 moves twice the bytes and rounds once less)"));
  CLI::Option* shard_group = nullptr;
  group(shard_group = app.add_option("--shard-group", cfg.fsdp.shard_group,
                       "F: shard within groups of F consecutive ranks and replicate across the N/F groups "
                       "(hybrid sharding); default: all N ranks"));
  group(app.add_flag("--no-sync", cfg.fsdp.no_sync,
                     "with --grad-accum K > 1: keep every unit's unsharded gradient across the micro-steps "
                     "and reduce-scatter once, on the last"));
  OffloadOptions& off = cfg.offload;
  offload_group(app.add_flag("--offload-params", off.offload_params,
                             "extension: keep the parameter shards on the host too, copied to the device just "
                             "before their all-gather (device model states ~0)"));
  offload_group(app.add_option("--offload-dir", off.offload_dir,
                               "extension: keep the optimizer state (and with --offload-params the parameter "
                               "shards) in files under DIR, streamed through the host in chunks"));
  offload_group(app.add_option("--optimizer-threads", off.optimizer_threads,
                               "threads of the CPU AdamW per rank (default: the cores left to each rank)"));
  offload_group(app.add_flag("--delay-update", off.delay_update,
                             "extension: from step 2 on, run the CPU update of step s while the device computes "
                             "step s+1 with the parameters of step s-1 (ZeRO-Offload's delayed update)"));
  offload_group(app.add_flag("--no-pin", off.no_pin,
                             "pageable host buffers instead of page-locked ones (pinned memory counts "
                             "against the host's locked-memory limit, ulimit -l)"));

  strict_values(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw UsageError(cli_error_text(e) + did_you_mean(app, argc, argv) + " (run " + stage.exe +
                     " --help for the flags)");
  }

  auto refuse = [&](const std::vector<CLI::Option*>& options, const char* owner, const char* exe) {
    for (const CLI::Option* o : options) {
      const std::string name = "--" + o->get_single_name();
      USAGE_REQUIRE(o->count() == 0, name << " is a flag of " << owner << ", not of " << stage.exe << ": run build/"
                                          << exe << " " << name << " ...");
    }
  };
  if (!fsdp) refuse(fsdp_options, "stage 04 (FSDP) and 05 (offload)", "04_fsdp/fsdp");
  if (!offload) refuse(offload_options, "stage 05 (offload)", "05_offload/offload");
  cfg.model = parse_model(model);
  if (cfg.dry_run) {
    USAGE_REQUIRE(cfg.clock == "modeled", "--dry-run models the steps instead of running them: add --clock modeled");
    USAGE_REQUIRE(cfg.ranks >= 1 && cfg.ranks <= kMaxDryRanks,
                  "--ranks must be between 1 and " << kMaxDryRanks << " in a dry run (got " << cfg.ranks << ")");
    for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--save", &cfg.save},
                                      {"--save-init", &cfg.save_init}, {"--resume", &cfg.resume},
                                      {"--init", &cfg.init}})
      USAGE_REQUIRE(value->empty(), flag << " reads or writes a model's values, and a dry run has none: leave out "
                                         << flag << " or --dry-run");
    USAGE_REQUIRE(cfg.val_every == 0 && cfg.sample_every == 0,
                  (cfg.val_every ? "--val-every" : "--sample-every")
                      << " computes with the model, and a dry run computes nothing: leave it out or --dry-run");
  } else {
    USAGE_REQUIRE(cfg.ranks >= 1 && cfg.ranks <= 1024, "--ranks must be between 1 and 1024 (got " << cfg.ranks << ")");
    const int cores = hardware_cores(), most = kRanksPerCore * cores;
    const char* over = std::getenv("ZF_OVERSUBSCRIBE");
    USAGE_REQUIRE(cfg.ranks <= most || (over && std::string(over) == "1"),
                  "--ranks " << cfg.ranks << " is more than " << kRanksPerCore << " rank threads per core ("
                             << cores << (cores == 1 ? " core" : " cores") << " here: at most " << most
                             << "); each rank is a thread with its own model and optimizer, so most would wait "
                                "for a core. Set ZF_OVERSUBSCRIBE=1 to start them anyway");
  }
  cfg.seed_given = seed_option->count() > 0;
  require_regular_file("--data", cfg.data);
  require_regular_file("--val-data", cfg.val_data);
  USAGE_REQUIRE(cfg.val_every >= 0, "--val-every must be 0 (never) or more steps (got " << cfg.val_every << ")");
  USAGE_REQUIRE(cfg.val_batches >= 1, "--val-batches must be at least 1 (got " << cfg.val_batches << ")");
  USAGE_REQUIRE(cfg.sample_every >= 0, "--sample-every must be 0 (never) or more steps (got " << cfg.sample_every << ")");
  USAGE_REQUIRE(!cfg.sample.prompt.empty(), "--sample-prompt must hold at least one character: a sample "
                                            "continues it");
  USAGE_REQUIRE(cfg.sample.length >= 1, "--sample-length must be at least 1 token (got " << cfg.sample.length << ")");
  USAGE_REQUIRE(cfg.sample.temperature >= 0 && std::isfinite(cfg.sample.temperature),
                "--temperature must be 0 (the likeliest token) or a positive number (got " << cfg.sample.temperature
                                                                                         << ")");
  USAGE_REQUIRE(cfg.sample.top_k >= 0, "--top-k must be 0 (every token) or more (got " << cfg.sample.top_k << ")");
  require_regular_file("--init", cfg.init, true);
  require_regular_file("--resume", cfg.resume, true);
  USAGE_REQUIRE(cfg.steps >= 0, "--steps must be 0 or more (got " << cfg.steps << ")");
  USAGE_REQUIRE(cfg.batch >= 1, "--batch must be at least 1 sequence per rank (got " << cfg.batch << ")");
  USAGE_REQUIRE(cfg.grad_accum >= 1, "--grad-accum must be at least 1 (got " << cfg.grad_accum << ")");
  USAGE_REQUIRE(cfg.lr > 0 && std::isfinite(cfg.lr), "--lr must be a positive number (got " << cfg.lr << ")");
  if (lr_schedule == "constant") cfg.lr_schedule = LrDecay::constant;
  else if (lr_schedule == "cosine") cfg.lr_schedule = LrDecay::cosine;
  else if (lr_schedule == "linear") cfg.lr_schedule = LrDecay::linear;
  else throw UsageError("--lr-schedule must be constant, cosine or linear (got '" + lr_schedule + "')");
  USAGE_REQUIRE(cfg.warmup >= 0, "--warmup must be 0 (none) or more steps (got " << cfg.warmup << ")");
  USAGE_REQUIRE(cfg.min_lr >= 0 && cfg.min_lr <= cfg.lr,
                "--min-lr must be between 0 and --lr (" << cfg.lr << "), where the decay starts (got " << cfg.min_lr
                                                        << ")");
  USAGE_REQUIRE(min_lr_option->count() == 0 || cfg.lr_schedule != LrDecay::constant,
                "--min-lr is where a decay ends, and --lr-schedule is constant: add --lr-schedule cosine or "
                "linear, or drop --min-lr");
  USAGE_REQUIRE(cfg.weight_decay >= 0 && std::isfinite(cfg.weight_decay),
                "--weight-decay must be 0 (none) or a positive number (got " << cfg.weight_decay << ")");
  USAGE_REQUIRE(cfg.clip >= 0 && std::isfinite(cfg.clip),
                "--clip must be 0 (off) or a positive norm (got " << cfg.clip << ")");
  USAGE_REQUIRE(cfg.save_every >= 0, "--save-every must be 0 (only at the end) or more (got " << cfg.save_every << ")");
  USAGE_REQUIRE(cfg.save_every == 0 || !cfg.save.empty(),
                "--save-every " << cfg.save_every << " needs --save FILE (where to write the checkpoint)");
  USAGE_REQUIRE(save_format == "consolidated" || save_format == "sharded",
                "--save-format must be consolidated or sharded (got '" << save_format << "')");
  cfg.save_sharded = save_format == "sharded";
  USAGE_REQUIRE(!cfg.save_async || cfg.save_sharded,
                "--save-async writes a sharded checkpoint in the background: add --save-format sharded (and --save DIR)");
  USAGE_REQUIRE(save_format_option->count() == 0 || !cfg.save.empty(),
                "--save-format " << save_format << " says how --save writes: give --save too");
  USAGE_REQUIRE(cfg.save.empty() || cfg.steps > 0,
                "--save writes the training state after the last step, and --steps 0 trains none: use "
                "--save-init FILE to write the initial model");
  USAGE_REQUIRE(cfg.resume.empty() || cfg.init.empty(),
                "--resume and --init both say where the model comes from: give one (--resume also restores "
                "the optimizer and the step; --init starts a fresh run from a model)");
  USAGE_REQUIRE(cfg.log_every >= 1, "--log-every must be at least 1 (got " << cfg.log_every << ")");
  if (precision == "fp32") cfg.precision = Precision::fp32;
  else if (precision == "bf16") cfg.precision = Precision::bf16;
  else throw UsageError("--precision must be fp32 or bf16 (got '" + precision + "')");
  USAGE_REQUIRE(cfg.device == "cpu" || cfg.device == "cuda",
                "--device must be cpu or cuda (got '" << cfg.device << "')");
  if (cfg.device == "cuda" && !cfg.dry_run) {  // a dry run is refused below with its own reason
    const std::string why = cuda_device_unavailable_reason();
    USAGE_REQUIRE(why.empty(), "--device cuda is not available: " << why
                                   << ". Use --device cpu, where the device is simulated with its memory "
                                      "tracked apart");
  }
  if (compute == "auto") {
    cfg.compute = cfg.precision == Precision::bf16 && cfg.device == "cuda" ? DType::bf16 : DType::f32;
  } else if (compute == "f32" || compute == "fp32") {
    cfg.compute = DType::f32;
  } else if (compute == "bf16") {
    USAGE_REQUIRE(cfg.precision == Precision::bf16,
                  "--compute bf16 needs --precision bf16 (the fp32 recipe is float32 throughout)");
    cfg.compute = DType::bf16;
  } else {
    throw UsageError("--compute must be auto, f32 or bf16 (got '" + compute + "')");
  }
  if (attention == "simple") {
    cfg.attention = AttentionForm::simple;
  } else if (attention == "flash") {
    cfg.attention = AttentionForm::flash;
  } else {
    throw UsageError("--attention must be simple or flash (got '" + attention + "')");
  }
  USAGE_REQUIRE(shard_group->count() == 0 || cfg.fsdp.shard_group >= 1,
                "--shard-group must be a number of ranks, 1 or more (got " << cfg.fsdp.shard_group
                                                                        << "); leave it out to shard over all ranks");
  if (fsdp) validate_fsdp_flags(cfg, reshard, reduce_dtype);
  if (offload) validate_offload_flags(cfg);
  // --recompute attn with --attention flash is accepted and keeps what none
  // keeps, as Megatron-LM's selective recomputation and PyTorch's selective
  // checkpointing of a flash attention do: the flag names a policy (drop
  // what is quadratic in T), and flash has nothing quadratic to drop.
  if (recompute == "none") cfg.recompute = Recompute::none;
  else if (recompute == "full") cfg.recompute = Recompute::full;
  else if (recompute == "attn") cfg.recompute = Recompute::attn;
  else throw UsageError("--recompute must be none, full or attn (got '" + recompute + "')");
  if (!device_mem.empty()) {
    try {
      cfg.device_mem = parse_size(device_mem);
    } catch (const UsageError& e) {
      throw UsageError("--device-mem: " + std::string(e.what()));
    }
  }
  if (comm_timeout_option->count() > 0) {
    cfg.comm_timeout_s = parse_comm_timeout("--comm-timeout", comm_timeout);
  } else if (const char* env = std::getenv("ZF_COMM_TIMEOUT_S"); env && *env) {
    cfg.comm_timeout_s = parse_comm_timeout("ZF_COMM_TIMEOUT_S", env);
  }
  USAGE_REQUIRE(cfg.clock == "wall" || cfg.clock == "modeled",
                "--clock must be wall or modeled (got '" << cfg.clock << "')");
  USAGE_REQUIRE(hardware_option->count() == 0 || cfg.clock == "modeled",
                "--hardware " << cfg.hardware << " is the machine of the modeled clock: add --clock modeled");
  if (cfg.clock == "modeled") {
    if (cfg.hardware.empty()) cfg.hardware = "h100-sxm";
    USAGE_REQUIRE(cfg.device == "cpu" || !cfg.dry_run,
                  "--dry-run models the GPUs of --hardware " << cfg.hardware << " and runs on none: leave out "
                  "--device cuda (--compute bf16 gives the tensor cores' arithmetic)");
    USAGE_REQUIRE(cfg.device == "cpu", "--clock modeled models a GPU from a run on the CPU device; with --device "
                                       "cuda the wall clock is the GPU's own: leave --clock out");
  }
  if (!fault.empty()) {
    const std::string how = "--inject-fault wants RANK:STEP or RANK:STEP:stall (got '" + fault + "')";
    std::string spec = fault;
    const size_t last = spec.rfind(':');
    if (last != std::string::npos && spec.substr(last + 1) == "stall") {
      cfg.fault_stall = true;
      spec = spec.substr(0, last);
    }
    auto colon = spec.find(':');
    USAGE_REQUIRE(colon != std::string::npos, how);
    const std::optional<uint64_t> rank = decimal_whole(spec.substr(0, colon)),
                                  step = decimal_whole(spec.substr(colon + 1));
    USAGE_REQUIRE(rank && step && *rank <= INT_MAX && *step <= INT_MAX,
                  how << ": RANK and STEP are whole numbers, 0 or more");
    cfg.fault_rank = int(*rank);
    cfg.fault_step = int(*step);
  }
  return cfg;
}

}  // namespace zf
