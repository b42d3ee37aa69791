// memory_estimate: what a rank of each stage holds and moves, without
// training: model states per category on the device, the host and disk,
// activations, communication bytes per step by collective and stage 05's
// host<->device transfers (docs/SPEC.md sections 7 and 8; the formulas of
// common/estimate/estimate.h, which the estimate suite holds to measured runs).
//
//   memory_estimate --params 1e9 --ranks 4 --precision bf16
//     -> 16 GB, 7 GB, 5.5 GB, 4 GB of model states for stages 00 .. 03
//   memory_estimate --stage fsdp --model gpt2 --ranks 8 --batch 4 --shard-group 4
//     -> the run `fsdp` would do with the same flags, padded as it pads
//   memory_estimate --fit 80GB --ranks 1,2,4,8 --precision bf16 --recompute full
//     -> the largest model of a GPT-3-like family each stage fits
//   memory_estimate --model gpt2-xl --ranks 64 --precision bf16 --compute bf16 --hardware h100-sxm
//     -> and each stage's step on 64 H100s, modeled by its own dry run
//
// The trainers' flags are accepted with their meanings (common/launch/cli.cpp);
// the ones that change no byte counted here (--steps, --lr, --log-json, ...)
// are accepted and ignored, so that a run's command line can be pasted.
// Exit status: 0 ok, 2 a usage error (the message says which flag and why).
#include "memory_estimate.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "check.h"
#include "cli.h"
#include "hardware.h"
#include "memory.h"
#include "numbers.h"

namespace zf::tool {
namespace {

// "1e9", "1.5e9", "124000000" -> a whole, positive number of parameters.
double parse_params(const std::string& text) {
  const std::optional<double> v = decimal_number(text);
  USAGE_REQUIRE(v, "--params wants a number of parameters in decimal, such as 124000000, 1e9 or 1.5e9 (got '"
                       << printable(text) << "')");
  USAGE_REQUIRE(*v >= 1, "--params must be at least 1 (got '" << text << "')");
  USAGE_REQUIRE(*v <= 1e15, "--params above 1e15 is not a model this tool can mean (got '" << text << "')");
  USAGE_REQUIRE(*v == std::floor(*v), "--params must be a whole number of parameters (got '" << text << "')");
  return *v;
}

// "4" or, with --fit, "1,2,4,8".
std::vector<int> parse_ranks(const std::string& text, bool list) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const std::optional<uint64_t> v = decimal_whole(item);
    USAGE_REQUIRE(v && *v >= 1 && *v <= 1048576,
                  "--ranks must be a number of ranks between 1 and 1048576" << (list ? ", or a list such as 1,2,4,8" : "")
                                                                            << " (got '" << printable(text) << "')");
    out.push_back(int(*v));
  }
  USAGE_REQUIRE(!out.empty(), "--ranks must be a number of ranks (got '" << text << "')");
  USAGE_REQUIRE(list || out.size() == 1,
                "--ranks takes one number (a list such as " << text << " only with --fit)");
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"What a rank of each stage holds and moves (model states on device, host and disk; activations; "
               "communication and transfer bytes per step), from docs/SPEC.md's formulas, without training",
               "memory_estimate"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // last one wins, as the trainers
  Request q;
  RunConfig& cfg = q.cfg;
  std::string params_text, model, precision = "fp32", compute = "auto", attention = "simple", recompute = "none",
                           ranks = "1", stage, reshard = "true", reduce_dtype, fit, device = "cpu";
  int L = 0, C = 0, V = 0, T = 0, H = 0;
  bool paper = false, deepspeed = false, ignored_dry_run = false;
  app.add_option("--params", params_text, "model size P: 124000000, 1e9, 1.5e9 (no padding, no activations)");
  app.add_option("--model", model, "model preset: tiny, wide, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt-7b, gpt-70b, or a shape as the trainers take it (L=12,C=768,H=12,T=1024,V=50304; gpt-7b,V=32000); units padded as the stages pad them");
  auto* o_layers = app.add_option("--layers", L, "shape: blocks L (with --channels, --vocab, --seq, --heads)");
  auto* o_channels = app.add_option("--channels", C, "shape: channels C");
  auto* o_vocab = app.add_option("--vocab", V, "shape: vocabulary V");
  auto* o_seq = app.add_option("--seq", T, "shape: sequence length T (with --fit, alone: the family's T, default 1024)");
  auto* o_heads = app.add_option("--heads", H, "shape: attention heads H (C a multiple of H)");
  app.add_option("--ranks", ranks, "ranks N (with --fit a list: 1,2,4,8)")->capture_default_str();
  app.add_option("--stage", stage, "print one stage: dp, zero1, zero2, zero3, fsdp or offload (default: all)");
  app.add_option("--precision", precision, "fp32, or bf16 (bf16 params/grads, fp32 master and moments)")
      ->capture_default_str();
  app.add_option("--compute", compute, "auto, f32 or bf16, as the trainers resolve it for --device")
      ->capture_default_str();
  app.add_option("--device", device, "cpu or cuda: what --compute auto means (bf16 for bf16 on cuda)")
      ->capture_default_str();
  app.add_option("--attention", attention, "simple or flash")->capture_default_str();
  app.add_option("--recompute", recompute,
                 "none, full (keep each block's input, re-run its forward in the backward) or attn (drop the "
                 "attention probabilities: with --attention flash there are none, so it changes nothing)")
      ->capture_default_str();
  app.add_option("--batch", cfg.batch, "micro-batch per rank (sequences)")->capture_default_str();
  app.add_option("--grad-accum", cfg.grad_accum, "micro-steps per optimizer step K")->capture_default_str();
  app.add_flag("--json", q.json, "print one JSON object on stdout instead of the tables");
  app.add_flag("--paper", paper, "print the ZeRO paper's worked example (Rajbhandari et al. 2020, Figure 1)");
  app.add_flag("--deepspeed", deepspeed,
               "print DeepSpeed's published estimator (ZeRO-2, ZeRO-3) for this P and N beside ours");
  int gpus_per_node = 0;
  app.add_option("--gpus-per-node", gpus_per_node, "with --deepspeed: GPUs per node (default: N, one node)");
  app.add_option("--largest-layer", q.largest_layer,
                 "with --deepspeed: the largest layer's parameters (default: from the shape)");
  app.add_option("--fit", fit, "SIZE of device memory per rank (80GB, 40GiB): the largest model each stage fits");
  std::string clock;
  auto* o_hardware = app.add_option(
      "--hardware", q.hardware,
      "a profile of hardware/ (h100-sxm, h200, a100-sxm, l40s) or a profile's path: also each stage's step "
      "time, tokens/s, MFU and exposed communication, modeled on that machine by the stage's own dry run");
  app.add_option("--clock", clock, "wall (no time column), or modeled: as --hardware, default h100-sxm");
  app.add_flag("--dry-run", ignored_dry_run, "a trainer flag, accepted: the time column is a dry run");
  const std::string g4 = "FSDP (stages 04 and 05)", g5 = "Offload (stage 05)";
  std::vector<CLI::Option*> fsdp_opts{
      app.add_option("--wrap-blocks", cfg.fsdp.wrap_blocks, "K consecutive blocks per FSDP unit")->group(g4),
      app.add_option("--reshard-after-forward", reshard, "true or false")->group(g4),
      app.add_option("--reduce-dtype", reduce_dtype, "bf16 or fp32: the reduce-scatter's dtype")->group(g4),
      app.add_option("--shard-group", cfg.fsdp.shard_group, "F: hybrid sharding, 16P/F")->group(g4),
      app.add_flag("--no-sync", cfg.fsdp.no_sync, "reduce-scatter once per step (with --grad-accum K > 1), keeping the unsharded gradient: eP more")
          ->group(g4),
      app.add_option("--prefetch", cfg.fsdp.prefetch, "units all-gathered ahead: changes only the gathered and transient peaks")
          ->group(g4),
      app.add_option("--max-gathered", cfg.fsdp.max_gathered,
                     "the most units gathered at once: changes only the gathered and transient peaks")
          ->group(g4)};
  std::vector<CLI::Option*> offload_opts{
      app.add_flag("--offload-params", cfg.offload.offload_params, "parameter shards on the host too")->group(g5),
      app.add_option("--offload-dir", cfg.offload.offload_dir, "moments (and bf16 master) in files: disk bytes")
          ->group(g5),
      app.add_flag("--delay-update", cfg.offload.delay_update, "second host gradient buffer (4S more)")->group(g5),
      app.add_option("--optimizer-threads", cfg.offload.optimizer_threads, "accepted, changes no byte")->group(g5),
      app.add_flag("--no-pin", cfg.offload.no_pin, "accepted, changes no byte")->group(g5)};
  app.footer(
      "The trainers' other flags (--steps, --lr, --clip, --seed, --data, --log-json, --device-mem, ...) are\n"
      "accepted and change nothing here, so a run's command line can be given as it is. With a shape the\n"
      "device peak is exact: transient buffers and workspace included. tools/README.md has the JSON keys\n"
      "and the --fit family. Exit status 2 for a bad flag.");
  // The trainers' flags that change no byte counted here.
  std::string ignored;
  bool ignored_flag = false;
  for (const char* name : {"--steps", "--lr", "--clip", "--seed", "--data", "--init", "--save-init", "--save",
                           "--save-every", "--resume", "--log-json", "--log-every", "--trace", "--comm-timeout",
                           "--device-mem", "--inject-fault"})
    app.add_option(name, ignored, "a trainer flag, accepted and ignored")->group("");
  app.add_flag("--quiet", ignored_flag, "a trainer flag, accepted and ignored")->group("");
  strict_values(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    throw UsageError(cli_error_text(e) + " (run memory_estimate --help for the flags)");
  }
  USAGE_REQUIRE(!q.json || !(paper || deepspeed),
                "--json prints the tables' numbers and --fit's; --paper and --deepspeed print text only");
  USAGE_REQUIRE(int(paper) + int(deepspeed) + int(!fit.empty()) <= 1, "give one of --paper, --deepspeed and --fit");
  size_t flags_given = 0;
  for (const CLI::Option* o : app.get_options()) flags_given += o->count() > 0;
  USAGE_REQUIRE(!paper || flags_given == 1,
                "--paper prints the paper's own example (its model, ranks and recipe) and takes no other flag; "
                "for your configuration drop --paper");
  if (paper) {
    print_paper();
    return 0;
  }

  // The time column: the trainers' --clock and --hardware, with the modeled
  // clock implied by --hardware (the estimator has no wall clock to offer).
  USAGE_REQUIRE(clock.empty() || clock == "wall" || clock == "modeled",
                "--clock must be wall or modeled (got '" << clock << "')");
  USAGE_REQUIRE(clock != "wall" || o_hardware->count() == 0,
                "--hardware " << q.hardware << " is the machine of the modeled clock: drop --clock wall");
  if (clock == "modeled" && q.hardware.empty()) q.hardware = "h100-sxm";
  USAGE_REQUIRE(q.hardware.empty() || !deepspeed,
                "--hardware's time column is printed with the tables, --json and --fit, not with --deepspeed");
  if (!q.hardware.empty())  // UsageError naming the profiles, or the key that is wrong
    q.card_bytes = std::round(load_hardware(q.hardware).memory_gib * double(size_t(1) << 30));  // whole bytes

  // The model: --params, --model, or the five shape flags.
  const std::vector<CLI::Option*> shape_opts{o_layers, o_channels, o_vocab, o_seq, o_heads};
  size_t shape_given = 0;
  for (const CLI::Option* o : shape_opts) shape_given += o->count() > 0;
  const bool fitting = !fit.empty();
  USAGE_REQUIRE(fitting || params_text.size() || model.size() || shape_given,
                "say how large the model is: --params P (e.g. 1e9), --model tiny|small|gpt2, or a shape "
                "--layers L --channels C --vocab V --seq T --heads H");
  USAGE_REQUIRE(int(!params_text.empty()) + int(!model.empty()) + int(shape_given > 0) <= 1,
                "give only one of --params, --model or a shape: each fixes the model's size");
  // --seq alone is the --fit family's sequence length.
  const bool fit_seq = fitting && shape_given == 1 && o_seq->count() > 0;
  USAGE_REQUIRE(!fitting || (params_text.empty() && model.empty() && (!shape_given || fit_seq)),
                "--fit searches its own family of shapes (tools/README.md): drop --params, --model and the shape "
                "(--seq alone sets the family's sequence length)");
  if (fit_seq) {
    USAGE_REQUIRE(T >= 1 && T <= kMostSeq, "--seq must be between 1 and " << kMostSeq << " (got " << T << ")");
    shape_given = 0;
  }
  if (shape_given) {
    for (const CLI::Option* o : shape_opts)
      USAGE_REQUIRE(o->count() > 0, "a shape needs all five of --layers, --channels, --vocab, --seq, --heads: "
                                        << o->get_name() << " is missing");
    USAGE_REQUIRE(L >= 1 && L <= kMostLayers,
                  "--layers must be between 1 and " << kMostLayers << " (got " << L << ")");
    USAGE_REQUIRE(C >= 1 && C <= kMostChannels,
                  "--channels must be between 1 and " << kMostChannels << " (got " << C << ")");
    USAGE_REQUIRE(V >= 1 && V <= kMostVocab, "--vocab must be between 1 and " << kMostVocab << " (got " << V << ")");
    USAGE_REQUIRE(T >= 1 && T <= kMostSeq, "--seq must be between 1 and " << kMostSeq << " (got " << T << ")");
    USAGE_REQUIRE(H >= 1 && C % H == 0, "--heads must divide --channels " << C << " (got " << H << ")");
    cfg.model = ModelConfig{"shape", V, T, L, H, C};
    q.model_text = "L=" + std::to_string(L) + " C=" + std::to_string(C) + " V=" + std::to_string(V) +
                   " T=" + std::to_string(T) + " H=" + std::to_string(H);
  } else if (!model.empty()) {
    cfg.model = parse_model(model);  // UsageError naming the presets, or what is wrong in the shape
    q.model_text = "model " + cfg.model.name;
  }
  q.shaped = !model.empty() || shape_given;
  USAGE_REQUIRE(q.hardware.empty() || q.shaped || fitting,
                "--hardware times each stage's own schedule, which needs the model's shape: give --model or "
                "--layers --channels --vocab --seq --heads instead of --params");
  if (q.shaped) q.params = double(build_layout(cfg.model).numel);
  else if (!params_text.empty()) q.params = parse_params(params_text);

  q.ranks = parse_ranks(ranks, fitting);
  cfg.ranks = q.ranks.front();
  if (precision == "fp32") cfg.precision = Precision::fp32;
  else if (precision == "bf16") cfg.precision = Precision::bf16;
  else throw UsageError("--precision must be fp32 or bf16 (got '" + precision + "')");
  USAGE_REQUIRE(device == "cpu" || device == "cuda", "--device must be cpu or cuda (got '" << device << "')");
  if (compute == "auto") cfg.compute = cfg.precision == Precision::bf16 && device == "cuda" ? DType::bf16 : DType::f32;
  else if (compute == "f32" || compute == "fp32") cfg.compute = DType::f32;
  else if (compute == "bf16") {
    USAGE_REQUIRE(cfg.precision == Precision::bf16,
                  "--compute bf16 needs --precision bf16 (the fp32 recipe is float32 throughout)");
    cfg.compute = DType::bf16;
  } else throw UsageError("--compute must be auto, f32 or bf16 (got '" + compute + "')");
  if (attention == "simple") cfg.attention = AttentionForm::simple;
  else if (attention == "flash") cfg.attention = AttentionForm::flash;
  else throw UsageError("--attention must be simple or flash (got '" + attention + "')");
  if (recompute == "none") cfg.recompute = Recompute::none;
  else if (recompute == "full") cfg.recompute = Recompute::full;
  else if (recompute == "attn") cfg.recompute = Recompute::attn;
  else throw UsageError("--recompute must be none, full or attn (got '" + recompute + "')");
  USAGE_REQUIRE(cfg.batch >= 1, "--batch must be at least 1 sequence per rank (got " << cfg.batch << ")");
  USAGE_REQUIRE(cfg.grad_accum >= 1, "--grad-accum must be at least 1 (got " << cfg.grad_accum << ")");

  // Stage flags: of the stages that have them, as the trainers refuse them.
  if (!stage.empty()) q.stages = {parse_stage(stage, "--stage")};
  else q.stages = all_stages();
  auto refuse = [&](const std::vector<CLI::Option*>& opts, bool has, const char* owner) {
    for (const CLI::Option* o : opts)
      USAGE_REQUIRE(has || o->count() == 0, o->get_name() << " is a flag of " << owner << ", not of --stage " << stage);
  };
  const bool one = q.stages.size() == 1;
  refuse(fsdp_opts, !one || q.stages[0] == Stage::fsdp || q.stages[0] == Stage::offload,
         "stages 04 (fsdp) and 05 (offload)");
  refuse(offload_opts, !one || q.stages[0] == Stage::offload, "stage 05 (offload)");
  USAGE_REQUIRE(q.shaped || fitting || fsdp_opts[0]->count() == 0,
                "--wrap-blocks needs the model's shape (--model or --layers ...): with --params alone nothing "
                "is padded, and wrapping changes only the padding");
  const int shape_L = cfg.model.L;
  if (!q.shaped) cfg.model.L = std::max(1, cfg.fsdp.wrap_blocks);  // --params (or --fit): no shape to check against
  validate_fsdp_flags(cfg, reshard, reduce_dtype);
  cfg.model.L = shape_L;
  for (int n : q.ranks) validate_for_world(cfg, n);
  if (q.shaped) for (int n : q.ranks) check_run_sizes(cfg, n);  // as the trainers refuse them

  if (fitting) {
    try {
      q.fit_budget = double(parse_size(fit));
    } catch (const UsageError& e) {
      throw UsageError("--fit: " + std::string(e.what()));
    }
    USAGE_REQUIRE(q.fit_budget > 0, "--fit must be a size above 0, such as 80GB (got '" << fit << "')");
    cfg.model.T = fit_seq ? T : 1024;  // the family's sequence length
    print_fit(q);
    return 0;
  }
  if (deepspeed) {
    USAGE_REQUIRE(gpus_per_node >= 0 && (gpus_per_node == 0 || cfg.ranks % gpus_per_node == 0),
                  "--gpus-per-node must divide --ranks " << cfg.ranks << " (got " << gpus_per_node << ")");
    q.gpus_per_node = gpus_per_node;
    if (q.largest_layer == 0 && q.shaped) q.largest_layer = largest_layer_params(cfg.model);
    USAGE_REQUIRE(q.largest_layer > 0, "--deepspeed's ZeRO-3 counts the largest layer: give --largest-layer "
                                       "PARAMS with --params, or a shape");
    print_deepspeed(q);
    return 0;
  }
  if (q.json) print_json(q);
  else print_tables(q);
  return 0;
}

}  // namespace

StageEstimate estimate_for(const Request& q, Stage s) {
  return q.shaped ? estimate_stage(s, q.cfg, q.cfg.offload) : estimate_stage_unpadded(s, q.cfg, q.cfg.offload, q.params);
}

std::string formula(Stage s, const RunConfig& cfg) {
  const bool bf = cfg.precision == Precision::bf16;
  const std::string n = cfg.fsdp.shard_group > 0 ? "F" : "N";
  const std::string kept = !cfg.fsdp.no_sync ? "" : bf ? " + 2P (--no-sync)" : " + 4P (--no-sync)";  // its unsharded gradient
  switch (s) {
    case Stage::dp: return "16P";
    case Stage::zero1: return bf ? "4P + 12P/N" : "8P + 8P/N";
    case Stage::zero2: return bf ? "2P + 14P/N" : "4P + 12P/N";
    case Stage::zero3: return "16P/N";
    case Stage::fsdp: return "16P/" + n + kept;
    case Stage::offload: {
      const OffloadOptions& o = cfg.offload;
      std::string dev = (o.offload_params ? "0" : (bf ? "2P/" : "4P/") + n) + kept;
      double host = bf ? 18 : 16;
      if (o.delay_update) host += 4 + (o.offload_params ? (bf ? 2 : 4) : 0);
      std::string f = "device " + dev + ", host " + std::to_string(int(host)) + "P/" + n;
      if (!o.offload_dir.empty()) f += (o.offload_params && bf) ? " (12P/" + n + " of it on disk)" : " (8P/" + n + " of it on disk)";
      return f;
    }
  }
  return "";
}

}  // namespace zf::tool

int main(int argc, char** argv) {
  try {
    return zf::tool::run(argc, argv);
  } catch (const zf::UsageError& e) {
    std::fprintf(stderr, "memory_estimate: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memory_estimate: error: %s\n", e.what());
    return 1;
  }
}
