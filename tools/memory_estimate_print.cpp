// memory_estimate_print.cpp: memory_estimate's outputs: the memory and
// communication tables, --json (one object, a contract: tools/README.md),
// the ZeRO paper's example (--paper) and DeepSpeed's estimator (--deepspeed).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "memory_estimate.h"
#include "shard.h"

namespace zf::tool {
namespace {

// A number with up to 3 decimals, trailing zeros dropped: 16, 5.5, 14.901.
std::string trimmed(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

// Binary units (GiB = 2^30 bytes).
std::string binary(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (i < 5 && bytes >= 1024.0) bytes /= 1024.0, ++i;
  return trimmed(bytes) + " " + units[i];
}

// A byte count for JSON: an exact integer when it is one (every count of a
// padded model is), else a double.
nlohmann::json number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) return int64_t(v);
  return v;
}

const char* gib(double bytes) {
  static thread_local char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fGB", bytes / double(1 << 30));
  return buf;
}

}  // namespace

std::string decimal(double bytes) {
  static const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int i = 0;
  while (i < 5 && bytes >= 1000.0) bytes /= 1000.0, ++i;
  return trimmed(bytes) + " " + units[i];
}

std::string both(double bytes) { return bytes == 0 ? "0" : decimal(bytes) + " (" + binary(bytes) + ")"; }

nlohmann::json time_json(const StageTime& t) {
  if (!t.ran) return {{"modeled", false}, {"why_not", t.why_not}};
  return {{"modeled", true},
          {"clock", t.clock},
          {"ms_per_step", t.ms},
          {"tokens_per_s", t.tokens_per_s},
          {"tokens_per_s_per_gpu", t.tokens_per_s / t.ranks},
          {"mfu", t.mfu},
          {"compute_ms", t.compute_ms},
          {"comm_ms", t.comm_ms},
          {"exposed_comm_ms", t.exposed_comm_ms}};
}

void print_time_header(const Request& q, const std::string& clock) {
  const bool bf16 = q.cfg.compute == DType::bf16;
  std::printf("\ntime per optimizer step, %s (--hardware %s), modeled, not measured:\n"
              "each stage's own schedule run as a dry run (docs/SPEC.md section 13); tokens/s of all N GPUs and of one;\n"
              "compute %s, MFU of the %s peak%s (model FLOPs: recomputation not counted).\n"
              "The model is optimistic: every published run bench/modeled_vs_published.py sets it beside (A100 and\n"
              "H100; none on L40S) ran slower than modeled (bench/RESULTS.md gives by how much).\n",
              clock.c_str(), q.hardware.c_str(), dtype_name(q.cfg.compute), bf16 ? "bf16 tensor-core" : "FP32",
              bf16 ? "" : " (--compute bf16 for tensor cores)");
}

std::string time_cells(const StageTime& t) {
  char buf[160];
  if (!t.ran)
    std::snprintf(buf, sizeof buf, "%12s  %12s  %12s  %7s  %15s", "-", "-", "-", "-", "-");
  else
    std::snprintf(buf, sizeof buf, "%12.2f  %12.0f  %12.0f  %6.1f%%  %15.2f", t.ms, t.tokens_per_s,
                  t.tokens_per_s / t.ranks, 100 * t.mfu, t.exposed_comm_ms);
  return buf;
}

void print_tables(const Request& q) {
  const RunConfig& c = q.cfg;
  const ModelSizes z = q.shaped ? padded_sizes(build_layout(c.model), c.ranks) : unpadded_sizes(q.params, c.ranks);
  if (q.shaped)
    std::printf("%s: P = %.0f parameters; with N = %d every unit is padded to a multiple of N (stages 01-03): "
                "full padded %.0f, shard %.0f per rank\n",
                q.model_text.c_str(), z.params, c.ranks, z.padded, z.shard);
  else
    std::printf("P = %.0f parameters (no padding counted), N = %d ranks\n", z.params, c.ranks);
  std::printf("%s: %s params and grads, %s bytes of float32 optimizer state per parameter; grad-accum %d\n",
              precision_name(c.precision), c.precision == Precision::fp32 ? "4-byte" : "2-byte",
              c.precision == Precision::fp32 ? "8 (moments)" : "12 (master + moments)", c.grad_accum);
  if (q.shaped)
    std::printf("activations: batch %d, compute %s, attention %s, recompute %s\n", c.batch, dtype_name(c.compute),
                attention_form_name(c.attention), recompute_name(c.recompute));
  std::printf("per rank; GB = 1e9 bytes, GiB = 2^30\n\n");

  // One row of cells per stage; a column that is empty in every row (no
  // activations without a shape, no host or disk bytes) is left out.
  std::vector<StageEstimate> all;
  std::vector<std::vector<std::string>> rows{{"stage", "device model states", "params", "grads", "optimizer",
                                              "activations", "gathered", "workspace", "transient", "host",
                                              "disk", "formula", "device peak (exact)"}};
  bool host = false, disk = false, gathered = false, workspace = false;
  for (Stage s : q.stages) {
    const StageEstimate e = estimate_for(q, s);
    all.push_back(e);
    const StateBytes& d = e.states.device;
    char exact[40] = "";
    if (q.shaped) std::snprintf(exact, sizeof exact, "%.0f", e.device_total());
    host |= e.states.host.total() > 0;
    gathered |= e.gathered.has_value();
    workspace |= e.workspace > 0;
    disk |= e.states.disk.total() > 0;
    rows.push_back({stage_label(s), both(d.total()), decimal(d.params), decimal(d.grads), decimal(d.optimizer),
                    e.activations ? both(*e.activations) : "", e.gathered ? both(*e.gathered) : "",
                    decimal(e.workspace), e.transient ? both(*e.transient) : "", both(e.states.host.total()),
                    both(e.states.disk.total()), formula(s, c), exact});
  }
  const bool shown[] = {true, true, true, true, true, q.shaped, gathered, workspace, q.shaped, host, disk, true,
                        q.shaped};
  const int width[] = {17, 24, 11, 11, 11, 24, 24, 11, 24, 24, 22, 0, 0};
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (!shown[i]) continue;
      std::string cell = row[i];
      if (i == 11 && q.shaped) cell.resize(std::max(cell.size(), size_t(40)), ' ');
      if (width[i] > 0) cell.resize(std::max(cell.size(), size_t(width[i])), ' ');
      line += cell + " ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
  std::printf("\ncommunication per rank per optimizer step (ring model, bytes sent; docs/SPEC.md section 8)\n");
  std::printf("%-17s %-14s %-14s %-14s %-14s %-14s %-14s %s\n", "stage", "all_reduce", "reduce_scatter", "all_gather",
              "total", "across groups", "device->host", "host->device");
  for (const StageEstimate& e : all)
    std::printf("%-17s %-14s %-14s %-14s %-14s %-14s %-14s %s\n", stage_label(e.stage),
                decimal(e.comm[int(CollectiveKind::all_reduce)]).c_str(),
                decimal(e.comm[int(CollectiveKind::reduce_scatter)]).c_str(),
                decimal(e.comm[int(CollectiveKind::all_gather)]).c_str(), decimal(e.comm_total()).c_str(),
                decimal(e.comm_cross_group).c_str(), decimal(e.to_host).c_str(), decimal(e.to_device).c_str());
  if (!q.hardware.empty()) {
    std::vector<StageTime> times;
    std::string clock = "modeled";
    for (Stage s : q.stages) {
      times.push_back(modeled_time(q, s, c));
      if (times.back().ran) clock = times.back().clock;
    }
    print_time_header(q, clock);
    // Whether the step fits the card, beside its time: a time that does not
    // fit is one that run would never reach. The CUDA context and NCCL's
    // buffers are not in the peak: the footer says to leave room for them.
    const std::string peak_head = "device peak GiB of " + trimmed(q.card_bytes / double(1 << 30));
    std::printf("%-17s %12s  %12s  %12s  %7s  %15s  %-28s %s\n", "stage", "ms/step", "tokens/s", "tokens/s/GPU",
                "MFU", "exposed comm ms", peak_head.c_str(), "largest --batch that fits");
    for (size_t i = 0; i < times.size(); ++i) {
      const double peak = all[i].device_total();
      const int most = largest_batch(q, q.stages[i], q.card_bytes);
      char fits[64];
      std::snprintf(fits, sizeof fits, "%.2f%s", peak / double(1 << 30), peak <= q.card_bytes ? "" : ", does not fit");
      std::printf("%-17s %s  %-28s %s%s\n", stage_label(q.stages[i]), time_cells(times[i]).c_str(), fits,
                  most > 0 ? std::to_string(most).c_str() : "none",
                  times[i].ran ? "" : ("; not modeled: " + times[i].why_not).c_str());
    }
    std::printf("The card's memory is what its driver reports (hardware/README.md); the CUDA context and NCCL's\n"
                "buffers take some of it and are not in the peak: leave room for them when picking --batch.\n");
    if (std::any_of(q.stages.begin(), q.stages.end(), [](Stage s) { return s == Stage::zero1 || s == Stage::zero2; }))
      std::printf("Exposed comm is the time the compute waits for a collective. ZeRO-1 and -2 all-gather each unit's\n"
                  "parameters after its update: only the later units' updates run beside those all-gathers, and the\n"
                  "step waits for the rest. The other stages' collectives run beside the backward, and stages 03-05\n"
                  "gather each unit ahead of its use.\n");
  }
  if (!q.shaped)
    std::printf("\nActivations are not counted without a shape (give --model or --layers/--channels/--vocab/--seq/"
                "--heads); the kept head of stages 04-05 is counted as 0 in their all-gathers.\n");
  if (q.shaped)
    std::printf("\nThe device peak (exact) is the most a rank holds at once: the model states, the activations, the\n"
                "workspace (bf16 with f32 compute widens a unit into two float32 buffers) and the transient peak:\n"
                "the gathered units and communication buffers (gradients waiting for or in their reduce-scatter,\n"
                "bf16 casts, float32 widenings) at their most at once, from the stage's order of allocations.\n"
                "Gathered is that category's own peak, which may fall at another moment.\n");
}

void print_json(const Request& q) {
  const RunConfig& c = q.cfg;
  const ModelSizes z = q.shaped ? padded_sizes(build_layout(c.model), c.ranks) : unpadded_sizes(q.params, c.ranks);
  nlohmann::json out = {{"params", number(z.params)}, {"padded", number(z.padded)}, {"shard", number(z.shard)},
                        {"ranks", c.ranks},           {"precision", precision_name(c.precision)},
                        {"batch", c.batch},           {"grad_accum", c.grad_accum},
                        {"compute", dtype_name(c.compute)}, {"attention", attention_form_name(c.attention)},
                        {"recompute", recompute_name(c.recompute)}, {"padded_layout", q.shaped}};
  if (q.shaped) {
    out["model"] = {{"layers", c.model.L}, {"channels", c.model.C}, {"vocab", c.model.V}, {"seq", c.model.T},
                    {"heads", c.model.H}};
    // The cut of stages 01-03 (shard.h): each unit padded to N pieces of S_u.
    const ModelLayout layout = build_layout(c.model);
    const ShardLayout cut = make_shard_layout(layout, c.ranks, 0);
    nlohmann::json units = nlohmann::json::array();
    for (size_t u = 0; u < cut.units.size(); ++u)
      units.push_back({{"name", layout.units[u].name}, {"numel", cut.units[u].numel}, {"piece", cut.units[u].shard}});
    out["units"] = units;
  }
  nlohmann::json stages = nlohmann::json::array();
  for (Stage s : q.stages) {
    const StageEstimate e = estimate_for(q, s);
    const StateBytes &d = e.states.device, &h = e.states.host;
    nlohmann::json by = {{"all_reduce", number(e.comm[int(CollectiveKind::all_reduce)])},
                         {"reduce_scatter", number(e.comm[int(CollectiveKind::reduce_scatter)])},
                         {"all_gather", number(e.comm[int(CollectiveKind::all_gather)])}};
    const nlohmann::json act = e.activations ? number(*e.activations) : nlohmann::json(nullptr);
    const nlohmann::json gathered = e.gathered ? number(*e.gathered) : nlohmann::json(nullptr);
    stages.push_back({
        {"stage", stage_name(s)},
        {"label", stage_label(s)},
        {"formula", formula(s, c)},
        {"padded", number(e.sizes.padded)},
        {"shard", number(e.sizes.shard)},
        {"device",
         {{"params", number(d.params)}, {"grads", number(d.grads)}, {"optimizer", number(d.optimizer)},
          {"model_states", number(d.total())}, {"activations", act}, {"gathered", gathered},
          {"workspace", number(e.workspace)},
          {"transient", e.transient ? number(*e.transient) : nlohmann::json(nullptr)},
          {"total", number(e.device_total())}}},
        {"host",
         {{"params", number(h.params)}, {"grads", number(h.grads)}, {"optimizer", number(h.optimizer)},
          {"model_states", number(h.total())}}},
        {"disk", {{"params", number(e.states.disk.params)}, {"optimizer", number(e.states.disk.optimizer)},
                  {"total", number(e.states.disk.total())}}},
        {"comm_bytes_per_step",
         {{"total", number(e.comm_total())}, {"by_collective", by}, {"across_groups", number(e.comm_cross_group)}}},
        {"transfers_per_step", {{"to_host", number(e.to_host)}, {"to_device", number(e.to_device)}}},
    });
    if (!q.hardware.empty()) {
      stages.back()["time"] = time_json(modeled_time(q, s, c));
      stages.back()["card"] = {{"bytes", number(q.card_bytes)},
                               {"fits", e.device_total() <= q.card_bytes},
                               {"largest_batch", largest_batch(q, s, q.card_bytes)}};
    }
  }
  out["stages"] = stages;
  std::cout << out.dump(2) << "\n";
}

// Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
// Trillion Parameter Models", Figure 1: Psi = 7.5B, K = 12 (mixed-precision
// Adam), Nd = 64. The bf16 recipe has their bytes with bf16 for fp16.
void print_paper() {
  struct Row {
    Stage stage;
    const char* name;
    const char* formula;
    const char* paper;
  };
  const Row rows[] = {{Stage::dp, "baseline", "(2 + 2 + K) Psi", "120 GB"},
                      {Stage::zero1, "P_os", "2Psi + 2Psi + K Psi/Nd", "31.4 GB"},
                      {Stage::zero2, "P_os+g", "2Psi + (2 + K) Psi/Nd", "16.6 GB"},
                      {Stage::zero3, "P_os+g+p", "(2 + 2 + K) Psi/Nd", "1.9 GB"}};
  TrainConfig cfg;
  cfg.precision = Precision::bf16;
  std::printf("ZeRO paper (Rajbhandari et al. 2020), Figure 1: Psi = 7.5e9 parameters, K = 12, Nd = 64 ranks\n");
  std::printf("(mixed precision: 2 + 2 + 12 bytes per parameter; here --precision bf16, no padding)\n\n");
  std::printf("%-10s %-20s %-24s %-14s %s\n", "paper", "stage here", "formula", "this tool", "paper says");
  cfg.ranks = 64;
  for (const Row& r : rows)
    std::printf("%-10s %-20s %-24s %-14s %s\n", r.name, stage_label(r.stage), r.formula,
                decimal(estimate_stage_unpadded(r.stage, cfg, {}, 7.5e9).states.device.total()).c_str(), r.paper);
  std::printf("\nThe same at P = 1e9, N = 4 (memory_estimate --params 1e9 --ranks 4 --precision bf16):\n");
  cfg.ranks = 4;
  for (const Row& r : rows)
    std::printf("%-20s %s\n", stage_label(r.stage),
                both(estimate_stage_unpadded(r.stage, cfg, {}, 1e9).states.device.total()).c_str());
}

// DeepSpeed's estimate_zero{2,3}_model_states_mem_needs_all_cold, as its
// documentation prints them (its "GB" is 2^30 bytes, two decimals), beside
// this codebase's stage with the nearest options (tools/README.md says why
// they differ).
void print_deepspeed(const Request& q) {
  const double P = q.params, layer = q.largest_layer;
  const int N = q.cfg.ranks, per_node = q.gpus_per_node > 0 ? q.gpus_per_node : N, nodes = N / per_node;
  std::printf("DeepSpeed's estimator (docs: deepspeed.readthedocs.io, \"Memory Requirements\"), %d node%s x %d GPUs,\n"
              "%.0fM total params, %.0fM largest layer params; GB = 2^30 bytes, as DeepSpeed prints them\n",
              nodes, nodes == 1 ? "" : "s", per_node, P / 1e6, layer / 1e6);
  RunConfig cfg = q.cfg;
  cfg.precision = Precision::bf16;
  auto ours = [&](Stage s, bool offload_params) {
    cfg.offload.offload_params = offload_params;
    const StageEstimate e = q.shaped ? estimate_stage(s, cfg, cfg.offload) : estimate_stage_unpadded(s, cfg, cfg.offload, P);
    return std::pair{e.states.device.total(), e.states.host.total() * per_node};  // DeepSpeed's CPU is a node's
  };
  struct Near {
    Stage stage;
    bool offload_params;
  };
  auto table = [&](const char* title, const std::vector<DeepSpeedRow>& rows, const std::vector<Near>& near) {
    std::printf("\n%s\n  %-9s | %-9s | %-55s | %s\n", title, "per CPU", "per GPU", "options", "ours, bf16 (per GPU / per node's host)");
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto [dev, host] = ours(near[i].stage, near[i].offload_params);
      char cpu[32];
      std::snprintf(cpu, sizeof cpu, "%s", gib(rows[i].per_cpu));
      std::printf("  %9s | %9s | %-55s | %s %s", cpu, gib(rows[i].per_gpu), rows[i].options.c_str(),
                  stage_label(near[i].stage), near[i].offload_params ? "--offload-params " : "");
      std::printf("%s / ", gib(dev));
      std::printf("%s\n", gib(host));
    }
  };
  table("ZeRO-2 (estimate_zero2_model_states_mem_needs_all_cold)", deepspeed_zero2_estimate(P, per_node, nodes),
        {{Stage::offload, false}, {Stage::zero2, false}});
  table("ZeRO-3 (estimate_zero3_model_states_mem_needs_all_cold)",
        deepspeed_zero3_estimate(P, layer, per_node, nodes),
        {{Stage::offload, true}, {Stage::offload, true}, {Stage::offload, false}, {Stage::offload, false},
         {Stage::zero3, false}, {Stage::zero3, false}});
  std::printf("\nOurs counts the model states a rank holds once training runs (no gathered layer, no loading "
              "copy, no 1.5x buffer): tools/README.md compares the formulas.\n");
}

}  // namespace zf::tool
