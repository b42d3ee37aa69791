// memory_estimate_fit.cpp: --fit SIZE, the largest model each stage trains
// within SIZE of device memory per rank, for each N of --ranks.
//
// The models searched are one family, GPT-3's proportions on this code's
// layout (docs/SPEC.md section 1): L blocks, C = 128 L channels, H = C / 128
// = L heads of 128, V = 50304, T = 1024 (or --seq); P from the layout. A
// model fits when its device peak is at most SIZE: model states (padded as
// the stage pads), activations for --batch, --recompute, --attention and
// --compute, workspace, and the step's transient buffers (gathered units,
// communication buffers) for the stage's schedule, --prefetch and
// --max-gathered included: the tables' exact device peak. The same search
// gives --hardware's largest --batch that fits the card.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>

#include <nlohmann/json.hpp>

#include "memory_estimate.h"

namespace zf::tool {
namespace {

constexpr int kMaxLayers = 4096;  // C = 524288: beyond any model a device of today fits

std::string family_name(int T) {
  return "GPT-3-like: C = 128 L, H = C/128, V = 50304, T = " + std::to_string(T);
}

ModelConfig family(int L, int T) { return ModelConfig{"fit", 50304, T, L, L, 128 * L}; }

// "1.52B", "850M", "96k" parameters.
std::string count(double p) {
  const char* unit = "";
  for (const char* u : {"k", "M", "B", "T"}) {
    if (p < 1000) break;
    p /= 1000, unit = u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g%s", p, unit);
  return buf;
}

// The run of the family's model of L blocks (no more blocks to a unit than it has).
RunConfig with_layers(RunConfig cfg, int L) {
  cfg.model = family(L, cfg.model.T);
  cfg.fsdp.wrap_blocks = std::min(cfg.fsdp.wrap_blocks, L);
  return cfg;
}

double device_bytes(Stage s, const RunConfig& cfg, int L) {
  return estimate_stage(s, with_layers(cfg, L), cfg.offload).device_total();
}

// The largest x in 1 .. most for which fits(x) holds, when a larger x never
// fits where a smaller one does not (the device peak grows with x); 0 when
// not even 1 fits.
int largest_that_fits(int most, const std::function<bool(int)>& fits) {
  if (!fits(1)) return 0;
  int lo = 1, hi = most;
  if (fits(hi)) return hi;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

// The largest L of the family that fits (0: not even L = 1).
int largest_fit(Stage s, const RunConfig& cfg, double budget) {
  return largest_that_fits(kMaxLayers, [&](int L) { return device_bytes(s, cfg, L) <= budget; });
}

}  // namespace

int largest_batch(const Request& q, Stage s, double budget) {
  // A micro-batch's positions stay within the kernels' 2^31 - 1.
  const int most = int(std::min<int64_t>(std::numeric_limits<int>::max() / q.cfg.model.T, 1 << 20));
  return largest_that_fits(most, [&](int B) {
    Request r = q;
    r.cfg.batch = B;
    return estimate_for(r, s).device_total() <= budget;
  });
}

void print_fit(const Request& q) {
  nlohmann::json fits = nlohmann::json::array();
  struct Cell {
    Stage stage;
    int ranks, layers;
    double params;
    StageTime time;  // --hardware: that model's step
  };
  std::vector<Cell> cells;
  for (Stage s : q.stages)
    for (int N : q.ranks) {
      RunConfig cfg = q.cfg;
      cfg.ranks = N;
      const int L = largest_fit(s, cfg, q.fit_budget);
      const double P = L > 0 ? double(build_layout(family(L, cfg.model.T)).numel) : 0;
      const StageTime t = !q.hardware.empty() && L > 0 ? modeled_time(q, s, with_layers(cfg, L)) : StageTime{};
      cells.push_back({s, N, L, P, t});
      fits.push_back({{"stage", stage_name(s)}, {"ranks", N}, {"params", int64_t(P)}, {"layers", L},
                      {"channels", 128 * L}, {"device_bytes", L > 0 ? int64_t(device_bytes(s, cfg, L)) : 0}});
      if (!q.hardware.empty() && L > 0) fits.back()["time"] = time_json(t);
    }
  if (q.json) {
    const RunConfig& c = q.cfg;
    nlohmann::json out = {{"device_mem", int64_t(q.fit_budget)}, {"family", family_name(c.model.T)},
                          {"precision", precision_name(c.precision)}, {"batch", c.batch},
                          {"recompute", recompute_name(c.recompute)}, {"attention", attention_form_name(c.attention)},
                          {"compute", dtype_name(c.compute)}, {"max_layers", kMaxLayers}, {"fits", fits}};
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::printf("The largest model whose device peak fits %s per rank (model states + activations + workspace\n"
              "+ the step's gathered units and communication buffers at their most at once): %s\n",
              both(q.fit_budget).c_str(), family_name(q.cfg.model.T).c_str());
  std::printf("%s, batch %d, recompute %s, attention %s, compute %s; P (layers L)%s\n\n",
              precision_name(q.cfg.precision), q.cfg.batch, recompute_name(q.cfg.recompute),
              attention_form_name(q.cfg.attention), dtype_name(q.cfg.compute),
              "; '-' if not even L = 1 fits");
  // A table of the cells: a row per stage, a column per N.
  auto grid = [&](const std::function<std::string(const Cell&)>& text) {
    std::printf("%-17s", "stage");
    for (int N : q.ranks) std::printf(" %18s", ("N = " + std::to_string(N)).c_str());
    std::printf("\n");
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i % q.ranks.size() == 0) std::printf("%-17s", stage_label(cells[i].stage));
      std::printf(" %18s", text(cells[i]).c_str());
      if (i % q.ranks.size() == q.ranks.size() - 1) std::printf("\n");
    }
  };
  grid([](const Cell& c) {
    char buf[48] = "-";
    if (c.layers > 0)
      std::snprintf(buf, sizeof buf, "%s (%d)%s", count(c.params).c_str(), c.layers, c.layers == kMaxLayers ? "+" : "");
    return std::string(buf);
  });
  if (q.hardware.empty()) return;
  std::string clock;
  for (const Cell& c : cells)
    if (c.time.ran) clock = c.time.clock;
  // The clock line names one N; each column is its own N.
  print_time_header(q, clock.empty() ? "modeled" : clock.substr(0, clock.find(" x")));
  std::printf("ms/step (MFU) of the model above\n");
  grid([](const Cell& c) {
    char buf[48] = "-";
    if (c.time.ran) std::snprintf(buf, sizeof buf, "%.1f (%.1f%%)", c.time.ms, 100 * c.time.mfu);
    return std::string(buf);
  });
  // Why a fitting model has no time, once per stage (the first N's reason).
  for (size_t row = 0; row < cells.size(); row += q.ranks.size()) {
    std::string at, why;
    for (size_t i = row; i < row + q.ranks.size(); ++i)
      if (cells[i].layers > 0 && !cells[i].time.ran) {
        at += (at.empty() ? "" : ", ") + std::to_string(cells[i].ranks);
        if (why.empty()) why = cells[i].time.why_not;
      }
    if (!at.empty())
      std::printf("%s, not modeled at N = %s: %s\n", stage_label(cells[row].stage), at.c_str(), why.c_str());
  }
}

}  // namespace zf::tool
