// report.h: what a run tells its reader: a line per logged step, the run log
// (JSON lines, docs/SPEC.md "Run log"), and the memory and communication tables.
#pragma once

#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "config.h"
#include "step_log.h"

namespace zf {

class StepReporter final : public StepLog {
 public:
  // Opens the JSON log (UsageError if it cannot be written). `params` is P.
  StepReporter(const TrainConfig& cfg, size_t params);

  // Called by rank 0 after each step with the global-batch mean loss and the
  // global gradient norm before clipping.
  void step(int step, float loss, float grad_norm, double ms, size_t model_state_bytes_per_rank,
            const StepPhases& phases) override;
  // Prints the closing tables and writes the summary object.
  void summary(const RunResult& run);

 private:
  const TrainConfig& cfg_;
  size_t params_;
  std::ofstream json_;
  std::mutex mu_;
};

// The {"summary": ...} object of the run log.
nlohmann::json summary_json(const RunResult& run);

// Human tables, one row per rank.
void print_memory_table(const RunResult& run, std::FILE* out);
void print_comm_table(const RunResult& run, std::FILE* out);

// Hex form of a parameter hash ("0x1234abcd...").
std::string hash_hex(uint64_t h);

}  // namespace zf
