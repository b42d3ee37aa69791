// memory_estimate: model-state bytes per rank for every stage, without
// training (docs/SPEC.md, "Memory bookkeeping"; the formulas of
// common/frame/memory_model.h, the same ones the tests hold the trainers to).
//
//   memory_estimate --params 1e9 --ranks 4 --precision bf16
//     -> 16 GB, 7 GB, 5.5 GB, 4 GB for stages 00, 01, 02, 03/04 (decimal GB,
//        GiB alongside), and stage 05's device and host bytes.
//   memory_estimate --model gpt2 --ranks 8
//     -> the same, with every unit padded to a multiple of N as the stages do.
//
// Exit status: 0 ok, 2 a usage error (the message says which flag and why).
#include <CLI/CLI.hpp>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include "check.h"
#include "memory_model.h"

namespace zf {
namespace {

// "1e9", "1.5e9", "124000000" -> a whole, positive number of parameters.
double parse_params(const std::string& text) {
  double v = 0;
  size_t used = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  USAGE_REQUIRE(used != 0 && used == text.size() && std::isfinite(v),
                "--params wants a number of parameters such as 124000000, 1e9 or 1.5e9 (got '" << text << "')");
  USAGE_REQUIRE(v >= 1, "--params must be at least 1 (got '" << text << "')");
  USAGE_REQUIRE(v <= 1e15, "--params above 1e15 is not a model this tool can mean (got '" << text << "')");
  USAGE_REQUIRE(v == std::floor(v), "--params must be a whole number of parameters (got '" << text << "')");
  return v;
}

// A number with up to 3 decimals, trailing zeros dropped: 16, 5.5, 14.901.
std::string trimmed(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

// Decimal units (GB = 1e9 bytes), the largest that keeps the value >= 1.
std::string decimal(double bytes) {
  static const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int i = 0;
  while (i < 5 && bytes >= 1000.0) bytes /= 1000.0, ++i;
  return trimmed(bytes) + " " + units[i];
}

// Binary units (GiB = 2^30 bytes).
std::string binary(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (i < 5 && bytes >= 1024.0) bytes /= 1024.0, ++i;
  return trimmed(bytes) + " " + units[i];
}

std::string both(double bytes) { return bytes == 0 ? "0" : decimal(bytes) + " (" + binary(bytes) + ")"; }

// docs/SPEC.md's formula of each row, for the reader.
const char* formula(Stage s, Precision p) {
  const bool bf = p == Precision::bf16;
  switch (s) {
    case Stage::dp: return "16P";
    case Stage::zero1: return bf ? "4P + 12P/N" : "8P + 8P/N";
    case Stage::zero2: return bf ? "2P + 14P/N" : "4P + 12P/N";
    case Stage::zero3:
    case Stage::fsdp: return "16P/N";
    case Stage::offload: return bf ? "device 2P/N, host 18P/N" : "device 4P/N, host 16P/N";
  }
  return "";
}

int run(int argc, char** argv) {
  CLI::App app{"Model-state bytes per rank (params + grads + optimizer) of every stage, from docs/SPEC.md's "
               "formulas, without training",
               "memory_estimate"};
  std::string params_text, model, precision = "bf16";
  int ranks = 1;
  bool offload_params = false;
  app.add_option("--params", params_text, "model size P: 124000000, 1e9, 1.5e9 (no padding)");
  app.add_option("--model", model, "model preset tiny, small or gpt2 (units padded to a multiple of N)");
  app.add_option("--ranks", ranks, "number of ranks N")->capture_default_str();
  app.add_option("--precision", precision, "fp32 or bf16 (bf16 params/grads, fp32 master and moments)")
      ->capture_default_str();
  app.add_flag("--offload-params", offload_params, "stage 05 also keeps the parameters on the host");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    throw UsageError(std::string(e.what()) + " (run memory_estimate --help for the flags)");
  }

  USAGE_REQUIRE(!(params_text.empty() && model.empty()),
                "say how large the model is: --params P (e.g. 1e9) or --model tiny|small|gpt2");
  USAGE_REQUIRE(params_text.empty() || model.empty(),
                "give --params or --model, not both (--model already fixes P)");
  USAGE_REQUIRE(ranks >= 1 && ranks <= 1048576, "--ranks must be between 1 and 1048576 (got " << ranks << ")");
  Precision prec;
  if (precision == "fp32") prec = Precision::fp32;
  else if (precision == "bf16") prec = Precision::bf16;
  else throw UsageError("--precision must be fp32 or bf16 (got '" + precision + "')");

  ModelSizes z;
  if (!model.empty()) {
    ModelLayout layout = build_layout(model_preset(model));  // UsageError naming the presets
    z = padded_sizes(layout, ranks);
    std::printf("model %s: P = %.0f parameters; with N = %d every unit is padded to a multiple of N: "
                "full padded %.0f, shard %.0f per rank\n",
                model.c_str(), z.params, ranks, z.padded, z.shard);
  } else {
    z = unpadded_sizes(parse_params(params_text), ranks);
    std::printf("P = %.0f parameters (no padding counted), N = %d ranks\n", z.params, ranks);
  }
  std::printf("%s: %s params and grads, %s bytes of float32 optimizer state per parameter\n",
              precision_name(prec), prec == Precision::fp32 ? "4-byte" : "2-byte",
              prec == Precision::fp32 ? "8 (moments)" : "12 (master + moments)");
  std::printf("model states per rank (params + grads + optimizer); GB = 1e9 bytes, GiB = 2^30\n\n");

  const bool padded = !model.empty();  // every count is then a whole number of bytes
  const int fw = padded ? 26 : 0;  // the formula column is the last one unless exact bytes follow
  std::printf("%-20s %-26s %-12s %-12s %-12s %-26s %-*s%s\n", "stage", "device", "params", "grads", "optimizer",
              "host", fw, "formula", padded ? " device bytes (exact)" : "");
  for (Stage s : all_stages()) {
    if (s == Stage::fsdp) continue;  // the same bytes as ZeRO-3: one row
    ModelStateBytes b = model_state_bytes(s, prec, z, offload_params);
    const StateBytes& part = s == Stage::offload && offload_params ? b.host : b.device;
    std::string label = s == Stage::zero3 ? "03 ZeRO-3 / 04 FSDP" : stage_label(s);
    std::string f = formula(s, prec);
    if (s == Stage::offload && offload_params) f = prec == Precision::bf16 ? "device 0, host 18P/N" : "device 0, host 16P/N";
    // The offload row's split: what stays on the device, what goes to the host.
    const StateBytes shown = s == Stage::offload ? StateBytes{b.device.params + b.host.params, b.host.grads,
                                                              b.host.optimizer}
                                                 : part;
    std::string exact;
    if (padded) {
      char buf[32];
      std::snprintf(buf, sizeof buf, " %.0f", b.device.total());
      exact = buf;
    }
    std::printf("%-20s %-26s %-12s %-12s %-12s %-26s %-*s%s\n", label.c_str(), both(b.device.total()).c_str(),
                decimal(shown.params).c_str(), decimal(shown.grads).c_str(), decimal(shown.optimizer).c_str(),
                both(b.host.total()).c_str(), fw, f.c_str(), exact.c_str());
  }
  std::printf("\nNot counted: activations, communication buffers and workspaces (they depend on the batch "
              "and on how many units are in flight, not on N).\n");
  return 0;
}

}  // namespace
}  // namespace zf

int main(int argc, char** argv) {
  try {
    return zf::run(argc, argv);
  } catch (const zf::UsageError& e) {
    std::fprintf(stderr, "memory_estimate: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memory_estimate: error: %s\n", e.what());
    return 1;
  }
}
