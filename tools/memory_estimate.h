// memory_estimate.h: what the four files of tools/memory_estimate share:
// the parsed request (memory_estimate.cpp parses the flags), the printers
// (memory_estimate_print.cpp: the tables, --json, --paper, --deepspeed),
// the search of --fit (memory_estimate_fit.cpp) and --hardware's modeled
// time (memory_estimate_time.cpp).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "estimate.h"
#include "run_config.h"

namespace zf::tool {

struct Request {
  RunConfig cfg;              // the run's flags, as a trainer parses them (one N: cfg.ranks)
  std::vector<int> ranks;     // --ranks, a list with --fit
  bool shaped = false;        // --model or a shape: padded, activations counted
  double params = 0;          // P
  std::string model_text;     // how the model was given, for the header
  std::vector<Stage> stages;  // --stage, or all six
  bool json = false;
  double fit_budget = 0;      // --fit: bytes of device memory per rank (0: no --fit)
  int gpus_per_node = 0;      // --deepspeed: GPUs per node (0: all on one node)
  double largest_layer = 0;   // --deepspeed: the largest layer's parameters
  std::string hardware;       // --hardware (or --clock modeled): the time column's machine; empty: no time
  double card_bytes = 0;      // --hardware: its card's memory (the profile's memory_gib), what a peak must fit
};

// One step of a stage on the modeled clock, as its run log says it.
struct StageTime {
  bool ran = false;
  std::string why_not;  // when it did not run
  std::string clock;    // "modeled on H100 SXM x8, 1 node of 8"
  int ranks = 0;        // N, for tokens/s per GPU
  double ms = 0, tokens_per_s = 0, mfu = 0, exposed_comm_ms = 0;
  double compute_ms = 0, comm_ms = 0;  // the step's compute queue and collectives, each on its own
};

// The stage's dry run with the request's flags and `run`'s model and ranks
// on q.hardware (memory_estimate_time.cpp).
StageTime modeled_time(const Request& q, Stage s, const RunConfig& run);

// The estimate of one stage for the request (cfg.ranks ranks).
StageEstimate estimate_for(const Request& q, Stage s);
// docs/SPEC.md's model-state formula of the stage with the request's options.
std::string formula(Stage s, const RunConfig& cfg);

void print_tables(const Request& q);
void print_json(const Request& q);
void print_paper();
void print_deepspeed(const Request& q);
void print_fit(const Request& q);

// The largest --batch (micro-batch per rank) whose device peak for stage s
// is at most `budget` bytes, with the request's other flags; 0 when not
// even 1 fits (memory_estimate_fit.cpp).
int largest_batch(const Request& q, Stage s, double budget);

// --hardware's outputs: the JSON object of a stage's time, the header of
// its table (the clock as the run log says it) and a row's cells.
nlohmann::json time_json(const StageTime& t);
void print_time_header(const Request& q, const std::string& clock);
std::string time_cells(const StageTime& t);

// "16 GB (14.901 GiB)", "500 MB", "0".
std::string decimal(double bytes);
std::string both(double bytes);

}  // namespace zf::tool
