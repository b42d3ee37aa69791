// memory_estimate.h: what the three files of tools/memory_estimate share:
// the parsed request (memory_estimate.cpp parses the flags), the printers
// (memory_estimate_print.cpp: the tables, --json, --paper, --deepspeed)
// and the search of --fit (memory_estimate_fit.cpp).
#pragma once

#include <string>
#include <vector>

#include "config.h"
#include "estimate.h"

namespace zf::tool {

struct Request {
  TrainConfig cfg;            // the run's flags, as a trainer parses them (one N: cfg.ranks)
  std::vector<int> ranks;     // --ranks, a list with --fit
  bool shaped = false;        // --model or a shape: padded, activations counted
  double params = 0;          // P
  std::string model_text;     // how the model was given, for the header
  std::vector<Stage> stages;  // --stage, or all six
  bool json = false;
  double fit_budget = 0;      // --fit: bytes of device memory per rank (0: no --fit)
  int gpus_per_node = 0;      // --deepspeed: GPUs per node (0: all on one node)
  double largest_layer = 0;   // --deepspeed: the largest layer's parameters
};

// The estimate of one stage for the request (cfg.ranks ranks).
StageEstimate estimate_for(const Request& q, Stage s);
// docs/SPEC.md's model-state formula of the stage with the request's options.
std::string formula(Stage s, const TrainConfig& cfg);

void print_tables(const Request& q);
void print_json(const Request& q);
void print_paper();
void print_deepspeed(const Request& q);
void print_fit(const Request& q);

// "16 GB (14.901 GiB)", "500 MB", "0".
std::string decimal(double bytes);
std::string both(double bytes);

}  // namespace zf::tool
